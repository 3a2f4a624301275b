"""Who may use the dashboard: the operator's token, a session cookie, and CSRF tokens.

The token comes from APG_FARM_DASHBOARD_TOKEN, or from the file APG_FARM_DASHBOARD_TOKEN_FILE names
(0600), or from `$APG_FARM_HOME/dashboard-token` (0600),
generated on first start and never printed (only its path is). The browser never holds the token itself after logging in: the session
cookie is a random id signed with a key derived from the token (so changing the token ends every
session), and each form carries a CSRF token derived from a second, per-browser cookie. Every
comparison of secrets is `hmac.compare_digest`; nothing here logs or returns the token. A wrong
token (in the login form or a Bearer header) costs FAILED_LOGIN_DELAY, one wrong token at a time.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from apg_farm.errors import BadInput
from apg_farm.settings import read_secret_file

#: The environment variable that sets the token (wins over the file).
TOKEN_ENV = "APG_FARM_DASHBOARD_TOKEN"
#: The environment variable naming a file that holds the token (private to its owner).
TOKEN_FILE_ENV = "APG_FARM_DASHBOARD_TOKEN_FILE"
#: The token file under APG_FARM_HOME.
TOKEN_FILE = "dashboard-token"
#: Cookie of a logged-in browser: `<session id>.<signature>`.
SESSION_COOKIE = "apg_farm_session"
#: Cookie every browser gets on its first page: the nonce its CSRF token is derived from.
CSRF_COOKIE = "apg_farm_csrf"
#: Form field carrying the CSRF token on every POST.
CSRF_FIELD = "csrf"
#: A token shorter than this is refused: the dashboard can cancel sweeps.
MIN_TOKEN_LENGTH = 16
#: A login lasts this long (seconds), then the operator logs in again.
SESSION_SECONDS = 12 * 3600
#: Seconds a wrong token costs; wrong tokens pay one after another, never at once.
FAILED_LOGIN_DELAY = 0.5


@dataclass(frozen=True)
class LoadedToken:
    """The token and where it came from; `generated` is true only on the start that made it."""

    value: str
    source: str
    generated: bool = False


def load_token(home: Path, environ: dict[str, str] | None = None) -> LoadedToken:
    """The token from the environment (or the file it names), else the token file under `home`,
    else a new one written 0600."""
    env = os.environ if environ is None else environ
    given = env.get(TOKEN_ENV, "").strip()
    named = env.get(TOKEN_FILE_ENV, "").strip()
    if given and named:
        raise BadInput(
            f"{TOKEN_ENV} and {TOKEN_FILE_ENV} are both set",
            field=TOKEN_FILE_ENV,
            fix="keep one of them",
        )
    if named:
        try:
            given = read_secret_file(Path(named))
        except ValueError as error:
            raise BadInput(str(error), field=TOKEN_FILE_ENV, fix=f"chmod 600 {named}") from None
    if given:
        if len(given) < MIN_TOKEN_LENGTH:
            raise BadInput(
                f"the token is shorter than {MIN_TOKEN_LENGTH} characters",
                field=TOKEN_ENV,
                fix="use e.g. `python3 -c 'import secrets; print(secrets.token_urlsafe(32))'`",
            )
        return LoadedToken(given, named or f"${TOKEN_ENV}")
    path = home / TOKEN_FILE
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            # Like ssh with a private key: a token others can read is not a secret any more.
            raise BadInput(
                f"{path} is readable by others (mode {mode:o})",
                field=TOKEN_ENV,
                fix=f"chmod 600 {path}, or delete it to have a new token made",
            )
        value = path.read_text(encoding="utf-8").strip()
        if len(value) < MIN_TOKEN_LENGTH:
            raise BadInput(f"{path} holds no usable token", fix=f"delete {path} to make a new one")
        return LoadedToken(value, str(path))
    home.mkdir(parents=True, exist_ok=True)
    value = secrets.token_urlsafe(32)
    # O_EXCL with the mode given at creation: never a moment where the file is world-readable.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(value + "\n")
    return LoadedToken(value, str(path), generated=True)


class Guard:
    """Checks tokens, signs sessions and derives CSRF tokens; holds only a key derived from the
    token (the token itself is compared, never kept in a cookie or a page)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode("utf-8")
        self._key = hashlib.sha256(b"apg-farm dashboard v1\0" + self._token).digest()

    def token_matches(self, candidate: str) -> bool:
        return hmac.compare_digest(candidate.strip().encode("utf-8"), self._token)

    def _sign(self, purpose: str, value: str) -> str:
        return hmac.new(self._key, f"{purpose}\0{value}".encode(), hashlib.sha256).hexdigest()

    def new_session(self, now: float | None = None) -> str:
        # The issue time is signed with the id: an old cookie stops working on the server too.
        sid = f"{int(time.time() if now is None else now)}-{secrets.token_urlsafe(24)}"
        return f"{sid}.{self._sign('session', sid)}"

    def session_valid(self, cookie: str | None, now: float | None = None) -> bool:
        if not cookie or "." not in cookie:
            return False
        sid, _, signature = cookie.rpartition(".")
        if not hmac.compare_digest(signature, self._sign("session", sid)):
            return False
        issued = sid.partition("-")[0]
        age = (time.time() if now is None else now) - int(issued) if issued.isdigit() else -1
        return 0 <= age <= SESSION_SECONDS

    @staticmethod
    def new_nonce() -> str:
        return secrets.token_urlsafe(24)

    def csrf_token(self, nonce: str) -> str:
        """The token a form carries: bound to this browser's nonce cookie, unforgeable without
        the key, so another site can neither read nor guess it."""
        return self._sign("csrf", nonce)

    def csrf_valid(self, nonce: str | None, submitted: str | None) -> bool:
        if not nonce or not submitted:
            return False
        return hmac.compare_digest(submitted, self.csrf_token(nonce))

    def bearer_valid(self, header: str | None) -> bool:
        """`Authorization: Bearer <token>`, for scripts reading the JSON API."""
        if not header or not header.startswith("Bearer "):
            return False
        return self.token_matches(header[len("Bearer ") :])


class FailedLogins:
    """Makes each wrong token wait its turn, then FAILED_LOGIN_DELAY: N guesses cost N times
    the delay however many connections send them at once. A right token never waits in line."""

    def __init__(self, delay: float = FAILED_LOGIN_DELAY) -> None:
        self.delay = delay
        # Made on first use, inside the server's event loop.
        self._lock: asyncio.Lock | None = None

    async def penalize(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            await asyncio.sleep(self.delay)
