"""`apg-farm serve`: the token, the bind address, and uvicorn."""

from __future__ import annotations

import ipaddress
import logging
import sys
from collections.abc import Callable

import uvicorn

from apg_farm.dashboard.app import create_app
from apg_farm.dashboard.auth import TOKEN_ENV, load_token
from apg_farm.dashboard.context import LOOPBACK_HOSTS, Options
from apg_farm.settings import load_settings
from apg_farm.store import Store

#: uvicorn's access logger: one line per request, `client - "METHOD path HTTP/v" status`.
ACCESS_LOGGER = "uvicorn.access"


class PathOnly(logging.Filter):
    """Cuts the query string off uvicorn's access lines: a query carries what a user typed
    (filters, searches, a `next` page) and the docs promise paths only. uvicorn logs its access
    line with the args (client, method, path with query, http version, status), the shape its
    own AccessFormatter reads; a line of any other shape is dropped rather than logged whole."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not (isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str)):
            return False
        record.args = (args[0], args[1], args[2].partition("?")[0], args[3], args[4])
        return True


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def serve(
    store: Store,
    *,
    host: str = "127.0.0.1",
    port: int = 8750,
    read_only_public: bool = False,
    allowed_hosts: tuple[str, ...] = (),
    poll_seconds: float = 2.0,
    say: Callable[[str], None] = _say,
) -> None:
    """Serve the dashboard until interrupted. The token is never printed (a service's output
    ends up in `docker compose logs` and journals): a generated one is in its 0600 file, and
    this says where. The access log shows paths, never query strings."""
    settings = load_settings()
    token = load_token(settings.home)
    if token.generated:
        say(
            f"dashboard token: made in {token.source} (mode 0600); read it with: cat {token.source}"
        )
    elif token.source.startswith("$"):
        say(f"dashboard token: from {TOKEN_ENV}")
    else:
        say(f"dashboard token: in {token.source}")
    if allowed_hosts:
        hosts = allowed_hosts
    elif is_loopback(host):
        hosts = LOOPBACK_HOSTS
    else:
        # Bound to a routable address: any Host header, unless the operator names them.
        hosts = ("*",)
    options = Options(
        read_only_public=read_only_public,
        allowed_hosts=hosts,
        poll_seconds=poll_seconds,
        distributed=bool(settings.broker_url),
    )
    shown = f"[{host}]" if ":" in host else host
    access = "read-only browsing open to anyone who reaches it" if read_only_public else "token"
    say(f"dashboard at http://{shown}:{port}/ (access: {access}; store {store.safe_url()})")
    config = uvicorn.Config(
        create_app(store, token.value, options),
        host=host,
        port=port,
        log_level="info",
        server_header=False,
        proxy_headers=False,
    )
    # After Config, which (re)configures uvicorn's loggers.
    logging.getLogger(ACCESS_LOGGER).addFilter(PathOnly())
    uvicorn.Server(config).run()
