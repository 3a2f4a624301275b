"""The JSON API under /api/: what the pages poll, and what scripts may read (docs/dashboard.md).

GET only; each answer is a `data` function's dict (or `analyse`, exactly what `apg-farm report
--format json` prints). Without the right to read, 401 and nothing else.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from apg_farm.dashboard import data
from apg_farm.dashboard.context import dashboard_of, may_read
from apg_farm.errors import BadInput, FarmError, NotFound
from apg_farm.results import MAX_ID, analyse, find_sweep


class _JSON(JSONResponse):
    # The store's values include datetimes; the report JSON prints them with str() as the CLI does.
    def render(self, content: Any) -> bytes:
        return json.dumps(content, default=str, ensure_ascii=False).encode("utf-8")


def error_json(error: FarmError) -> Response:
    return _JSON({"error": error.render()}, status_code=404 if isinstance(error, NotFound) else 400)


def query_int(request: Request, name: str) -> int | None:
    """A whole-number query parameter, None when absent; BadInput (400) for anything else,
    a number beyond what the store holds included (`?before=99999999999999999999`)."""
    value = request.query_params.get(name)
    if value is None or value == "":
        return None
    if not (value.isascii() and value.isdigit()):
        raise BadInput(f"{name} must be a whole number", field=name)
    if len(value) > len(str(MAX_ID)) or int(value) > MAX_ID:
        raise BadInput(f"{name} must be at most {MAX_ID}", field=name)
    return int(value)


_int = query_int


def known_ids(request: Request) -> None:
    """NotFound (404) for an id in the path beyond what a store holds (`/api/sweeps/<huge>`):
    the database is never asked, so it cannot overflow."""
    for name, value in request.path_params.items():
        if isinstance(value, int):
            data.known_id(value, name.removesuffix("_id"))


def _guarded(request: Request, read: Any) -> Response:
    if not may_read(request):
        return _JSON({"error": "log in, or send Authorization: Bearer <token>"}, status_code=401)
    try:
        known_ids(request)
        return _JSON(read())
    except FarmError as error:
        return error_json(error)


def api_sweeps(request: Request) -> Response:
    store = dashboard_of(request).store
    return _guarded(
        request,
        lambda: data.sweeps_overview(
            store,
            before=_int(request, "before"),
            limit=_int(request, "limit") or data.SWEEPS_PAGE,
            state=request.query_params.get("state") or None,
        ),
    )


def api_sweep(request: Request) -> Response:
    store = dashboard_of(request).store
    return _guarded(request, lambda: data.sweep_live(store, request.path_params["sweep_id"]))


def api_report(request: Request) -> Response:
    store = dashboard_of(request).store

    def read() -> dict[str, Any]:
        k = _int(request, "k")
        if k is not None and k < 1:
            raise BadInput("k must be at least 1", field="k")
        return analyse(store, find_sweep(store, str(request.path_params["sweep_id"])), k=k)

    return _guarded(request, read)


def attempt_filters(request: Request) -> dict[str, str]:
    return {
        key: request.query_params.get(key, "")
        for key in ("task", "model", "state", "outcome")
        if request.query_params.get(key)
    }


def api_attempts(request: Request) -> Response:
    store = dashboard_of(request).store
    return _guarded(
        request,
        lambda: data.attempts_page(
            store,
            request.path_params["sweep_id"],
            after=_int(request, "after"),
            before=_int(request, "before"),
            limit=_int(request, "limit") or data.ATTEMPTS_PAGE,
            filters=attempt_filters(request),
        ),
    )


def api_beds(request: Request) -> Response:
    store = dashboard_of(request).store
    return _guarded(request, lambda: data.beds_overview(store))


def api_attempt(request: Request) -> Response:
    store = dashboard_of(request).store
    return _guarded(request, lambda: data.attempt_detail(store, request.path_params["attempt_id"]))


ROUTES = [
    Route("/api/sweeps", api_sweeps),
    Route("/api/sweeps/{sweep_id:int}", api_sweep),
    Route("/api/sweeps/{sweep_id:int}/report", api_report),
    Route("/api/sweeps/{sweep_id:int}/attempts", api_attempts),
    Route("/api/beds", api_beds),
    Route("/api/attempts/{attempt_id:int}", api_attempt),
]
