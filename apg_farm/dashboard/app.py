"""The dashboard's pages and actions, and the Starlette application that serves them with the API.

Pages are Jinja2 templates with autoescape on: every string a bed printed (stdout, stderr, the
envelope, reasons) reaches the browser escaped. The only markup inserted as is are the report's
SVG figures, which `apg_farm.results` builds with every string escaped. Scripts come from
/static/ only, under a Content-Security-Policy without 'unsafe-inline'.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from apg_farm.dashboard import actions, api, data, evidence
from apg_farm.dashboard.api import known_ids
from apg_farm.dashboard.auth import (
    CSRF_COOKIE,
    CSRF_FIELD,
    SESSION_COOKIE,
    SESSION_SECONDS,
    Guard,
)
from apg_farm.dashboard.context import Dashboard, Options, dashboard_of, logged_in, may_read
from apg_farm.errors import BadInput, FarmError, NotFound
from apg_farm.results import (
    STATES,
    analyse,
    cost_section,
    find_sweep,
    forest_plot,
    second_chance_section,
    stop_section,
    timeline_for,
    timeline_svg,
    usd,
)
from apg_farm.store import Store

HERE = Path(__file__).resolve().parent
#: No inline script or style, nothing from another origin, no framing, forms post here only.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
#: A form body larger than this is refused unread (the largest real one is a few hundred bytes).
MAX_FORM_BYTES = 16 * 1024


class SecurityHeaders:
    """Adds the CSP and its companions to every response (pages, API, static files, errors)."""

    HEADERS = (
        (b"content-security-policy", CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
        # same-origin, not no-referrer: under no-referrer Chrome sends `Origin: null` on our own
        # form posts, which the Origin check must then refuse.
        (b"referrer-policy", b"same-origin"),
        (b"x-frame-options", b"DENY"),
        (b"cross-origin-opener-policy", b"same-origin"),
        (b"cache-control", b"no-store"),
    )

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name for name, _ in message.get("headers", [])}
                message["headers"] = [
                    *message.get("headers", []),
                    *(h for h in self.HEADERS if h[0] not in present),
                ]
            await send(message)

        await self.app(scope, receive, with_headers)


class WrongBearer:
    """A request whose `Authorization: Bearer` token is wrong pays the failed-login delay before
    its 401, like a wrong token in the login form: the API is no faster way to guess."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = Headers(scope=scope).get("authorization")
            board: Dashboard = scope["app"].state.dashboard
            if header is not None and not board.guard.bearer_valid(header):
                await board.failed_logins.penalize()
        await self.app(scope, receive, send)


def _pct(value: float | None, digits: int = 1) -> str:
    """As the HTML report writes rates: 41.7%, or — when there is none."""
    return "—" if value is None else f"{value * 100:.{digits}f}%"


def _clock(seconds: float | None) -> str:
    """As `sweep status --watch` writes durations: 1h02m03s, 4m05s."""
    if seconds is None:
        return "unknown"
    hours, rest = divmod(round(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _p(value: float | None) -> str:
    if value is None:
        return "—"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        # Every {{ }} is escaped; nothing in the templates uses |safe.
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update({"pct": _pct, "clock": _clock, "usd": usd, "p": _p})
    env.filters.update({"collapsed": evidence.collapsed, "first_line": evidence.first_line})
    return Jinja2Templates(env=env)


TEMPLATES = _templates()


def _nonce(request: Request) -> tuple[str, bool]:
    """This browser's CSRF nonce, and whether it is new (then the response sets its cookie)."""
    current = request.cookies.get(CSRF_COOKIE)
    if current and 16 <= len(current) <= 64:
        return current, False
    return Guard.new_nonce(), True


def _cookie(response: Response, request: Request, name: str, value: str, max_age: int) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def render(
    request: Request, name: str, context: dict[str, Any], *, status_code: int = 200
) -> Response:
    """A page, with what every page needs: who is asking, the CSRF token, the poll interval."""
    board = dashboard_of(request)
    nonce, fresh = _nonce(request)
    response = TEMPLATES.TemplateResponse(
        request,
        name,
        {
            "logged_in": logged_in(request),
            "public": board.options.read_only_public,
            "csrf": board.guard.csrf_token(nonce),
            "csrf_field": CSRF_FIELD,
            "poll_ms": int(board.options.poll_seconds * 1000),
            "distributed": board.options.distributed,
            "path": request.url.path,
            **context,
        },
        status_code=status_code,
    )
    if fresh:
        _cookie(response, request, CSRF_COOKIE, nonce, SESSION_SECONDS)
    return response


def error_page(request: Request, error: FarmError) -> Response:
    status = 404 if isinstance(error, NotFound) else 400
    return render(request, "error.html", {"message": error.render()}, status_code=status)


def _to_login(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?{urlencode({'next': target})}", status_code=303)


def _local(target: str | None) -> str:
    """Only a path of this site after login: never another host (`//evil`, `/\\evil`)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/sweeps"
    return target


def page(read: Any) -> Any:
    """A GET page: refused (to the login form) without the right to read; FarmError as a page."""

    def endpoint(request: Request) -> Response:
        if not may_read(request):
            return _to_login(request)
        try:
            known_ids(request)
            result: Response = read(request)
            return result
        except FarmError as error:
            return error_page(request, error)

    return endpoint


def _int_param(request: Request, name: str) -> int | None:
    return api.query_int(request, name)


def sweeps_page(request: Request) -> Response:
    store = dashboard_of(request).store
    overview = data.sweeps_overview(
        store,
        before=_int_param(request, "before"),
        state=request.query_params.get("state") or None,
    )
    return render(request, "sweeps.html", {"overview": overview, "states": STATES})


def sweep_page(request: Request) -> Response:
    store = dashboard_of(request).store
    sweep_id: int = request.path_params["sweep_id"]
    live = data.sweep_live(store, sweep_id)
    sweep = find_sweep(store, str(sweep_id))
    report = analyse(store, sweep)
    timeline = timeline_for(store, sweep)
    return render(
        request,
        "sweep.html",
        {
            "live": live,
            "report": report,
            # Built by apg_farm.results with every string escaped (html.escape): markup as is.
            "forest_svg": Markup(forest_plot(report)),
            "timeline": timeline,
            "timeline_svg": Markup(timeline_svg(timeline)),
            "cost_html": Markup(cost_section(report)),
            "second_chance_html": Markup(second_chance_section(report)),
            # The sweep's question (`stop:`): stopped or not, the anytime-valid figures.
            "stop_html": Markup(stop_section(report)),
            "done": request.query_params.get("done", ""),
            "count": _int_param(request, "n"),
        },
    )


def attempts_list_page(request: Request) -> Response:
    store = dashboard_of(request).store
    sweep_id: int = request.path_params["sweep_id"]
    filters = api.attempt_filters(request)
    result = data.attempts_page(
        store,
        sweep_id,
        after=_int_param(request, "after"),
        before=_int_param(request, "before"),
        filters=filters,
    )
    live = data.sweep_live(store, sweep_id)

    def link(**extra: int) -> str:
        return f"/sweeps/{sweep_id}/attempts?{urlencode({**filters, **extra})}"

    return render(
        request,
        "attempts.html",
        {
            "sweep": live["sweep"],
            "page": result,
            "next_link": link(after=result["next_after"]) if result["next_after"] else None,
            "prev_link": link(before=result["prev_before"]) if result["prev_before"] else None,
        },
    )


def beds_page(request: Request) -> Response:
    store = dashboard_of(request).store
    overview = data.beds_overview(store)
    return render(
        request,
        "beds.html",
        {
            "overview": overview,
            "by_name": {b["name"]: b for group in overview["hosts"] for b in group["beds"]},
            "done": request.query_params.get("done", ""),
            "bed": request.query_params.get("bed", ""),
        },
    )


def attempt_page(request: Request) -> Response:
    store = dashboard_of(request).store
    detail = data.attempt_detail(store, request.path_params["attempt_id"])
    for e in detail["executions"]:
        # Read back from the evidence host (sha256 checked), bounded; the API keeps to the store.
        e["evidence"] = evidence.execution_evidence(store, e["id"], e["run_id"])
        e["assertions"] = evidence.assertions(e["envelope"])
        e["diffs"] = evidence.diff_reports(e["phases"])
        e["timeline"] = evidence.timeline(e["phases"])
    return render(request, "attempt.html", {"attempt": detail})


async def _form(request: Request) -> dict[str, list[str]]:
    """An urlencoded form body (bounded), without python-multipart."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise BadInput("form too large")
    return parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)


def _same_origin(request: Request) -> bool:
    """A browser's Origin, when it sends one, must be this site (belt to the CSRF token's braces)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("host", "")
    return origin in (f"http://{host}", f"https://{host}")


def _csrf_ok(request: Request, form: dict[str, list[str]]) -> bool:
    submitted = (form.get(CSRF_FIELD) or [""])[0]
    return _same_origin(request) and dashboard_of(request).guard.csrf_valid(
        request.cookies.get(CSRF_COOKIE), submitted
    )


def _refused(request: Request, status: int, message: str) -> Response:
    return render(request, "error.html", {"message": message}, status_code=status)


def login_page(request: Request) -> Response:
    return render(
        request, "login.html", {"next": _local(request.query_params.get("next")), "failed": False}
    )


async def login(request: Request) -> Response:
    form = await _form(request)
    if not _csrf_ok(request, form):
        return _refused(request, 403, "the form expired or came from another site: log in again")
    target = _local((form.get("next") or [""])[0])
    if not dashboard_of(request).guard.token_matches((form.get("token") or [""])[0]):
        # A guess costs time, one guess at a time; the token itself is 256 random bits.
        await dashboard_of(request).failed_logins.penalize()
        return render(request, "login.html", {"next": target, "failed": True}, status_code=401)
    response = RedirectResponse(target, status_code=303)
    _cookie(
        response,
        request,
        SESSION_COOKIE,
        dashboard_of(request).guard.new_session(),
        SESSION_SECONDS,
    )
    return response


async def logout(request: Request) -> Response:
    form = await _form(request)
    if not _csrf_ok(request, form):
        return _refused(request, 403, "missing or wrong CSRF token")
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


async def _act(request: Request, work: Any, done: str) -> Response:
    """An action: logged in (a session, never the public read-only mode), the CSRF token right,
    then `work(form)` in a thread; the answer redirects to `done` with its result."""
    try:
        form = await _form(request)
    except BadInput as error:
        return _refused(request, 400, error.render())
    if not logged_in(request):
        return _refused(request, 401, "log in with the dashboard token to do this")
    if not _csrf_ok(request, form):
        return _refused(request, 403, "missing or wrong CSRF token: reload the page and try again")
    try:
        known_ids(request)
        result = await run_in_threadpool(work, form)
    except FarmError as error:
        return error_page(request, error)
    query = urlencode({"done": result[0], **({"n": result[1]} if result[1] is not None else {})})
    return RedirectResponse(f"{done}?{query}", status_code=303)


async def cancel_action(request: Request) -> Response:
    board, sweep_id = dashboard_of(request), request.path_params["sweep_id"]
    return await _act(
        request,
        lambda form: ("cancelled", actions.cancel(board.store, sweep_id)),
        f"/sweeps/{sweep_id}",
    )


async def retry_action(request: Request) -> Response:
    board, sweep_id = dashboard_of(request), request.path_params["sweep_id"]
    return await _act(
        request,
        lambda form: ("retried", actions.retry(board.store, sweep_id, form.get("outcome", []))),
        f"/sweeps/{sweep_id}",
    )


async def release_action(request: Request) -> Response:
    board, name = dashboard_of(request), request.path_params["name"]

    def work(form: dict[str, list[str]]) -> tuple[str, None]:
        actions.release(board.store, name)
        return "released", None

    return await _act(request, work, "/beds")


def home(request: Request) -> Response:
    return RedirectResponse("/sweeps", status_code=303)


def create_app(store: Store, token: str, options: Options | None = None) -> Starlette:
    """The dashboard as an ASGI application on `store`, guarded by `token`."""
    options = options or Options()
    routes = [
        Route("/", home),
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/sweeps", page(sweeps_page)),
        Route("/sweeps/{sweep_id:int}", page(sweep_page)),
        Route("/sweeps/{sweep_id:int}/attempts", page(attempts_list_page)),
        Route("/sweeps/{sweep_id:int}/cancel", cancel_action, methods=["POST"]),
        Route("/sweeps/{sweep_id:int}/retry", retry_action, methods=["POST"]),
        Route("/beds", page(beds_page)),
        Route("/beds/{name}/release", release_action, methods=["POST"]),
        Route("/attempts/{attempt_id:int}", page(attempt_page)),
        *api.ROUTES,
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    middleware = [Middleware(SecurityHeaders), Middleware(WrongBearer)]
    if "*" not in options.allowed_hosts:
        middleware.append(
            Middleware(TrustedHostMiddleware, allowed_hosts=list(options.allowed_hosts))
        )
    app = Starlette(routes=routes, middleware=middleware)
    app.state.dashboard = Dashboard(store=store, guard=Guard(token), options=options)
    return app
