"""A farm for the dashboard tests, and `apg-farm serve` run on it as a real process.

The farm: three simulated beds in an APG_FARM_HOME and three sweeps —
`finished` (2 tasks x 2 models x 3 trials, run to the end), `failing` (run, then one attempt
made ERROR and one INVALID, as a retry finds them) and `waiting` (submitted, never run: what a
cancel cancels). A phase of `finished` printed hostile markup on stderr, and bed2 is quarantined
with a hostile reason: what a tampering agent could make a bed print.
"""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlsplit

from sqlalchemy import select, update

from apg_farm.scheduler import submit
from apg_farm.store import Attempt, Bed, BedEvent, BedState, Execution, Phase, Store
from apg_farm.workers import EmbeddedExecutor
from tests.support.simbeds import make_beds, spec

TOKEN = "test-dashboard-token-0123456789abcdef"
SCRIPT = "<script>window.__xss=1</script>"
IMG = '<img src=x onerror="window.__xss=2">'
HOSTILE = f"agent says {SCRIPT} and {IMG}"


@dataclass(frozen=True)
class DashFarm:
    home: Path
    store: Store
    sweeps: dict[str, int]
    #: The attempt whose run phase printed HOSTILE on stderr.
    hostile_attempt: int

    def env(self, token: str | None = TOKEN) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("APG_FARM_")}
        env["APG_FARM_HOME"] = str(self.home)
        if token is not None:
            env["APG_FARM_DASHBOARD_TOKEN"] = token
        return env


def run_sweep(store: Store, name: str, **kwargs: object) -> int:
    sweep_id = submit(store, spec(name, **kwargs)).sweep_id  # type: ignore[arg-type]
    result = EmbeddedExecutor(store, sweep_id).run()
    assert not result.errors and not result.stranded, result
    return sweep_id


def build_farm(home: Path) -> DashFarm:
    store = Store(f"sqlite:///{home / 'farm.db'}")
    make_beds(store, home / "sim", 3)
    finished = run_sweep(store, "finished", tasks=2, models=2, trials=3)
    failing = run_sweep(store, "failing", tasks=1, models=2, trials=2, diff=False)
    waiting = submit(store, spec("waiting", tasks=1, models=1, trials=3)).sweep_id
    with store.session() as session:
        first, second = session.scalars(
            select(Attempt.id).where(Attempt.sweep_id == failing).order_by(Attempt.id).limit(2)
        ).all()
        session.execute(update(Attempt).where(Attempt.id == first).values(outcome="ERROR"))
        session.execute(update(Attempt).where(Attempt.id == second).values(outcome="INVALID"))
        hostile = session.scalars(
            select(Attempt.id).where(Attempt.sweep_id == finished).order_by(Attempt.id)
        ).first()
        assert hostile is not None
        execution = session.scalars(
            select(Execution.id).where(Execution.attempt_id == hostile)
        ).one()
        session.execute(
            update(Phase)
            .where(Phase.execution_id == execution, Phase.name == "run")
            .values(stderr=HOSTILE, stdout=f"stdout too: {SCRIPT}")
        )
        bed2 = session.scalars(select(Bed).where(Bed.name == "bed2")).one()
        bed2.state = BedState.QUARANTINED
        bed2.state_reason = f"reset failed: {HOSTILE}"
        session.add(BedEvent(bed_id=bed2.id, kind="quarantined", detail=HOSTILE))
    return DashFarm(
        home,
        store,
        {"finished": finished, "failing": failing, "waiting": waiting},
        hostile,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


@contextmanager
def serving(farm: DashFarm, log: Path, *args: str, token: str | None = TOKEN) -> Iterator[Server]:
    """`python -m apg_farm serve` on a free port, until the block ends; its output in `log`."""
    port = free_port()
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "-m", "apg_farm", "serve", "--port", str(port), *args],
            env=farm.env(token),
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    server = Server(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if Client(server.url).get("/login").status == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None, server.output()
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    body: str


@dataclass
class Client:
    """An HTTP client that keeps cookies and never follows redirects: each step is visible."""

    base: str
    cookies: dict[str, str] = field(default_factory=dict)

    def request(
        self,
        method: str,
        path: str,
        *,
        form: dict[str, str | list[str]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        parts = urlsplit(self.base)
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
        sent = dict(headers or {})
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urlencode(form, doseq=True)
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            connection.request(method, path, body=body, headers=sent)
            response = connection.getresponse()
            text = response.read().decode("utf-8", errors="replace")
        finally:
            connection.close()
        for header in response.headers.get_all("set-cookie") or []:
            name, _, rest = header.partition("=")
            value = rest.split(";", 1)[0].strip('"')
            if "max-age=0" in header.lower() or not value:
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = value
        return Reply(response.status, response.headers, text)

    def get(self, path: str, **kwargs: object) -> Reply:
        return self.request("GET", path, **kwargs)  # type: ignore[arg-type]

    def post(self, path: str, form: dict[str, str | list[str]], **kwargs: object) -> Reply:
        return self.request("POST", path, form=form, **kwargs)  # type: ignore[arg-type]

    def csrf(self, path: str = "/login") -> str:
        """The CSRF token a page's forms carry (and its nonce cookie, kept)."""
        page = self.get(path).body
        marker = 'name="csrf" value="'
        start = page.index(marker) + len(marker)
        return page[start : page.index('"', start)]

    def login(self, token: str = TOKEN) -> Reply:
        return self.post("/login", {"csrf": self.csrf(), "token": token, "next": "/sweeps"})
