"""The dashboard's shared state (the store, the guard, the operator's options) and who is asking:
a logged-in browser, a script with the bearer token, or (with --read-only-public) anyone."""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request

from apg_farm.dashboard.auth import SESSION_COOKIE, FailedLogins, Guard
from apg_farm.store import Store

#: Hosts a loopback-bound dashboard answers to: a page elsewhere that re-points its own name at
#: 127.0.0.1 (DNS rebinding) is refused by its Host header.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class Options:
    """How `apg-farm serve` was started."""

    #: Pages and GET /api/ without the token; actions still need it.
    read_only_public: bool = False
    #: Host header values accepted ("*" for any).
    allowed_hosts: tuple[str, ...] = LOOPBACK_HOSTS
    #: Seconds between the pages' polls of the JSON API.
    poll_seconds: float = 2.0
    #: A broker is configured (distributed mode): what a retry's message says.
    distributed: bool = False


@dataclass
class Dashboard:
    store: Store
    guard: Guard
    options: Options = field(default_factory=Options)
    failed_logins: FailedLogins = field(default_factory=FailedLogins)


def dashboard_of(request: Request) -> Dashboard:
    board: Dashboard = request.app.state.dashboard
    return board


def logged_in(request: Request) -> bool:
    """A browser whose session cookie the guard signed."""
    return dashboard_of(request).guard.session_valid(request.cookies.get(SESSION_COOKIE))


def may_read(request: Request) -> bool:
    """Pages and GET /api/: logged in, the bearer token, or a public read-only dashboard."""
    board = dashboard_of(request)
    return (
        board.options.read_only_public
        or logged_in(request)
        or board.guard.bearer_valid(request.headers.get("authorization"))
    )
