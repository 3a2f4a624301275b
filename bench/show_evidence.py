"""What showing an execution's evidence costs: parsing a transcript, rendering the attempt page,
and `export --inspect` per sample, on a simulated bed's sweep (no bed time is added: this is read
side only). Prints seconds.

    PYTHONPATH=. .venv/bin/python bench/show_evidence.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import select

from apg_farm.results import parse_transcript
from apg_farm.store import Execution, Store


def big_transcript(turns: int) -> bytes:
    """A transcript of `turns` tool calls, each with a 40-line output: ~2 MiB at 400 turns."""
    lines = [json.dumps({"type": "system", "subtype": "init", "model": "m", "tools": ["Bash"]})]
    output = "\n".join(f"line {i} of some command output, a little long" for i in range(40))
    for n in range(turns):
        lines.append(
            json.dumps(
                {
                    "type": "assistant",
                    "message": {
                        "content": [
                            {"type": "text", "text": f"step {n}"},
                            {
                                "type": "tool_use",
                                "id": f"t{n}",
                                "name": "Bash",
                                "input": {"command": "ls"},
                            },
                        ]
                    },
                }
            )
        )
        lines.append(
            json.dumps(
                {
                    "type": "user",
                    "message": {
                        "content": [
                            {"type": "tool_result", "tool_use_id": f"t{n}", "content": output}
                        ]
                    },
                }
            )
        )
    return ("\n".join(lines) + "\n").encode()


def main() -> None:
    data = big_transcript(400)
    started = time.perf_counter()
    for _ in range(5):
        parse_transcript(data)
    print(
        f"parse a {len(data) / 1e6:.1f} MB transcript (800 messages): {(time.perf_counter() - started) / 5:.3f} s"
    )

    from starlette.testclient import TestClient

    from apg_farm.dashboard import Options, create_app
    from tests.cli.test_cli import farm
    from tests.support.dashboard_farm import run_sweep
    from tests.support.evidence_files import keep, run_folder
    from tests.support.simbeds import make_beds

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        os.environ["APG_FARM_EVIDENCE_DIR"] = str(home / "evidence")
        store = Store(f"sqlite:///{home / 'farm.db'}")
        make_beds(store, home / "sim", 2)
        run_sweep(store, "bench", tasks=2, models=2, trials=5)
        with store.read() as session:
            rows = session.execute(
                select(Execution.id, Execution.attempt_id, Execution.run_id)
            ).all()
        big_id, big_attempt, big_run = rows[0]
        folder = run_folder(big_run)
        folder[f"runs/{big_run}/transcript.jsonl"] = data
        keep(store, big_id, home / "kept" / str(big_id), folder)
        app = create_app(store, "bench-token-0123456789abcdef", Options(read_only_public=True))
        with TestClient(app, base_url="http://127.0.0.1") as client:
            for attempt, label in (
                (rows[1][1], "the simulator's transcript"),
                (big_attempt, "a 2 MB one"),
            ):
                client.get(f"/attempts/{attempt}")
                started = time.perf_counter()
                for _ in range(5):
                    page = client.get(f"/attempts/{attempt}")
                assert page.status_code == 200, page.status_code
                took = (time.perf_counter() - started) / 5
                print(
                    f"attempt page with {label}: {took:.3f} s, {len(page.content) / 1e6:.2f} MB of HTML"
                )
        from apg_farm.inspect import write_inspect_logs
        from apg_farm.store import Sweep

        with store.read() as session:
            sweep = session.scalars(select(Sweep)).one()
            session.expunge(sweep)
        started = time.perf_counter()
        write_inspect_logs(store, sweep, home / "logs")
        took = time.perf_counter() - started
        print(
            f"export --inspect of {len(rows)} samples (in process): {took:.2f} s, {took / len(rows):.3f} s a sample"
        )
        started = time.perf_counter()
        farm(home, "export", "bench", "--inspect", str(home / "logs-cli"))
        took = time.perf_counter() - started
        print(f"the same by the CLI (start-up and inspect_ai's import included): {took:.2f} s")


if __name__ == "__main__":
    sys.exit(main())
