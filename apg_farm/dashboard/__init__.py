"""The live web dashboard, `apg-farm serve`: sweeps, beds and attempts read from the store, and
the actions cancel, retry and release behind the operator's token.

`app` has the pages and actions and builds the Starlette application, `api` the JSON API, `data`
what both read from the store, `actions` what they may change, `auth` the token, sessions and
CSRF, `context` the shared state and who is asking, `server` the command. Imports scheduler
(cancel, retry), workers (only to wake a released bed's worker), results, beds and store; only the
`serve` command imports this package (starlette, jinja2, uvicorn load with it).
"""

from __future__ import annotations

from apg_farm.dashboard.app import CSP, create_app
from apg_farm.dashboard.auth import (
    CSRF_COOKIE,
    CSRF_FIELD,
    FAILED_LOGIN_DELAY,
    SESSION_COOKIE,
    TOKEN_ENV,
    TOKEN_FILE,
    Guard,
    LoadedToken,
    load_token,
)
from apg_farm.dashboard.context import LOOPBACK_HOSTS, Options
from apg_farm.dashboard.data import (
    attempt_detail,
    attempts_page,
    beds_overview,
    sweep_live,
    sweeps_overview,
)
from apg_farm.dashboard.server import serve

__all__ = [
    "CSP",
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "FAILED_LOGIN_DELAY",
    "LOOPBACK_HOSTS",
    "SESSION_COOKIE",
    "TOKEN_ENV",
    "TOKEN_FILE",
    "Guard",
    "LoadedToken",
    "Options",
    "attempt_detail",
    "attempts_page",
    "beds_overview",
    "create_app",
    "load_token",
    "serve",
    "sweep_live",
    "sweeps_overview",
]
