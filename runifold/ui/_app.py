"""The ASGI application behind ``runifold ui``: read-only pages and their JSON, served by Starlette.

Every route answers GET (and HEAD) only: the view changes nothing, actions
stay in the CLI. Pages link to each other with relative URLs (``run?ref=``,
``audit?ref=``), so a proxy may serve the whole view under any prefix.
Text from the store is HTML-escaped, and its control characters are shown
escaped (``\\x1b``), never interpreted; pages carry no script, and their
Content-Security-Policy forbids any.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Collection
from typing import Any
from urllib.parse import unquote_to_bytes, urlencode

import msgspec
from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runifold._log import get_logger
from runifold.cli._runs import duration
from runifold.cli._text import clip, iso, printable
from runifold.errors import RunifoldError, RunNotFoundError, SerializationError, StoreError, describe
from runifold.history import MAX_VERSION
from runifold.stores import RunStatus, WorkflowStore
from runifold.stores._protocol import check_text, ref_column
from runifold.ui import _data
from runifold.ui._timeline import value
from runifold.worker import WorkflowRegistry

log = get_logger("runifold.ui")

#: what every response says about itself: no script, no framing, no referrer
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; "
     b"frame-ancestors 'none'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]
VERDICTS = ("accepted", "duplicate", "rejected")


class BadRequest(Exception):
    """A query parameter the view cannot use: 400, with the message."""


class _SecurityHeaders:
    """Adds :data:`SECURITY_HEADERS` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers if scope["type"] == "http" else send)


#: the names of this machine a request may give as its Host when the view listens on a loopback address
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})


def host_name(header: str) -> str:
    """The name a Host header gives, without its port (``[::1]:8233`` -> ``::1``), lowercased."""
    name = header.partition("]")[0].removeprefix("[") if header.startswith("[") else header.partition(":")[0]
    return name.lower()


class _HostCheck:
    """Answers only requests whose Host header names one of ``hosts``, so a page of another site that has its
    name resolve to this machine (DNS rebinding) cannot read the view: 400 otherwise."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str]) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
            if host_name(header) not in self.hosts:
                refusal = Response(
                    f"runifold ui answers requests for {', '.join(sorted(self.hosts))} only, not Host {header!r}; "
                    "open it by one of those names\n", status_code=400, media_type="text/plain")
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def show(text: object) -> Markup:
    """``text`` HTML-escaped, each control or other non-printable character shown as its escape (``\\x1b``)."""
    s = "" if text is None else str(text)
    if s.isprintable():
        return escape(s)
    return Markup("").join(
        escape(c) if c.isprintable() else Markup('<span class="ctl" title="a control character, shown escaped">{}'
                                                 '</span>').format(repr(c)[1:-1])
        for c in s)


def show_lines(text: object) -> Markup:
    """Like :func:`show`, keeping line breaks (tracebacks, reasons written over several lines)."""
    return Markup("\n").join(show(line) for line in ("" if text is None else str(text)).split("\n"))


def dur(seconds: float | None) -> str:
    return duration(seconds) if seconds is not None and math.isfinite(seconds) and seconds >= 0 else "-"


def url(path: str, **params: Any) -> str:
    """A relative URL with the given query parameters (None and empty ones left out)."""
    query = urlencode({k: v for k, v in params.items() if v is not None and v != ""})
    return f"{path}?{query}" if query else path


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("runifold.ui", "templates"), autoescape=select_autoescape(default=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(show=show, show_lines=show_lines, printable=printable, iso=iso, dur=dur, clip=clip,
                       json=value)
    env.globals.update(url=url, statuses=[s.value for s in RunStatus], verdicts=VERDICTS)
    return env


def _json(data: Any, status_code: int = 200) -> Response:
    return Response(msgspec.json.encode(data), status_code=status_code, media_type="application/json")


def _int(request: Request, name: str, *, default: int | None = None, low: int = 0, high: int = 10**9) -> int | None:
    raw = request.query_params.get(name, "").strip()
    if not raw:
        return default
    try:
        number = int(raw)
    except ValueError:
        raise BadRequest(f"{name} must be a whole number, got {raw!r}") from None
    if not low <= number <= high:
        raise BadRequest(f"{name} must be from {low:,} to {high:,}, got {number:,}")
    return number


def _text(request: Request, name: str) -> str | None:
    value = request.query_params.get(name, "").strip() or None
    if value is not None:
        try:
            check_text(value, what=name)
        except SerializationError as exc:  # NUL or invalid Unicode: no run, name or id holds it
            raise BadRequest(str(exc)) from None
    return value


def _check_query(request: Request) -> None:
    """Refuse a query string whose escapes are not UTF-8: decoded, they would become U+FFFD, and a filter or a
    reference of it would quietly match nothing (as the command line and the stores refuse invalid Unicode)."""
    try:
        unquote_to_bytes(request.scope.get("query_string", b"").replace(b"+", b" ")).decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the query string is not valid UTF-8 (percent-escape UTF-8 bytes only)") from None


def _after(request: Request) -> str | None:
    """The ``after`` of a page: the last run id of the page before."""
    after = _text(request, "after")
    if after is not None and ref_column(after) != "run_id":
        raise BadRequest(f"after must be a run id (the last run id of the page before), got {after!r}")
    return after


def _ref(request: Request) -> str:
    ref = _text(request, "ref")
    if ref is None:
        raise BadRequest("name a run: ?ref=RUN_ID or ?ref=CHECKPOINT_ID")
    return ref


def _filter(request: Request) -> _data.RunFilter:
    status = _text(request, "status")
    if status is not None and status not in {s.value for s in RunStatus}:
        raise BadRequest(f"status must be one of {', '.join(s.value for s in RunStatus)}, got {status!r}")
    after = _after(request)
    return _data.RunFilter(status=None if status is None else RunStatus(status), name=_text(request, "name"),
                           version=_int(request, "version", low=1, high=MAX_VERSION), ref=_text(request, "ref"),
                           limit=_int(request, "limit", default=50, low=1, high=_data.MAX_PAGE) or 50,
                           after=after)


def _verdict(request: Request) -> str | None:
    verdict = _text(request, "verdict")
    if verdict is not None and verdict not in VERDICTS and not verdict.startswith("rejected:"):
        raise BadRequest(f"verdict must be one of {', '.join(VERDICTS)} (or rejected:WHY), got {verdict!r}")
    return verdict


Handler = Callable[[Request], Awaitable[Response]]


class View:
    """The routes over one open store and, optionally, the application's registry (for replay and budgets)."""

    def __init__(self, store: WorkflowStore, registry: WorkflowRegistry | None, *, store_label: str,
                 refresh: int) -> None:
        self.store = store
        self.registry = registry
        self.store_label = store_label
        self.refresh = refresh
        self.env = _environment()

    def page(self, template: str, status_code: int = 200, **context: Any) -> Response:
        html = self.env.get_template(template).render(store_label=self.store_label, registry=self.registry,
                                                      **context)
        return HTMLResponse(html, status_code=status_code)

    def guarded(self, handler: Handler, *, api: bool) -> Handler:
        """``handler`` with the view's errors turned into pages (or JSON): 400, 404, 503, 500."""
        async def guarded(request: Request) -> Response:
            try:
                _check_query(request)
                return await handler(request)
            except BadRequest as exc:
                code, message = 400, str(exc)
            except RunNotFoundError as exc:
                code, message = 404, str(exc)
            except StoreError as exc:
                log.warning("ui_store_error", path=request.url.path, error=describe(exc))
                code, message = 503, f"the store did not answer: {exc}"
            except RunifoldError as exc:
                log.error("ui_request_failed", path=request.url.path, error=describe(exc), exc_info=exc)
                code, message = 500, str(exc)
            except Exception as exc:  # noqa: BLE001 - a bug: logged with its traceback, the page says so
                log.error("ui_unexpected_error", path=request.url.path, error=repr(exc), exc_info=exc)
                code, message = 500, f"unexpected error (a bug; the server's log has the traceback): {exc!r}"
            if api:
                return _json({"error": message}, code)
            return self.page("error.html", code, code=code, message=message)
        return guarded

    # pages

    async def home(self, request: Request) -> Response:
        query = request.url.query  # the filters a link to the root carries go along
        return RedirectResponse(f"runs?{query}" if query else "runs", status_code=302)

    async def runs(self, request: Request) -> Response:
        where = _filter(request)
        refresh = _int(request, "refresh", default=self.refresh, low=0, high=3_600)
        data = await _data.runs_page(self.store, where)
        return self.page("runs.html", where=where, data=data, refresh=refresh, page=_int(request, "page", default=1,
                                                                                         low=1))

    async def run(self, request: Request) -> Response:
        ref = _ref(request)
        data = await _data.run_page(self.store, self.registry, ref)
        return self.page("run.html", ref=ref, data=data)

    async def audit(self, request: Request) -> Response:
        verdict = _verdict(request)
        ref = _text(request, "ref")
        if ref is not None:
            data = await _data.run_audit(self.store, ref, verdict)
            return self.page("audit.html", ref=ref, verdict=verdict, data=data, overall=False)
        after = _after(request)
        data = await _data.overall_audit(self.store, verdict=verdict, after=after)
        return self.page("audit.html", ref=None, verdict=verdict, data=data, overall=True, after=after,
                         runs_per_page=_data.AUDIT_RUNS_PER_PAGE)

    # JSON

    async def api_runs(self, request: Request) -> Response:
        return _json(await _data.runs_page(self.store, _filter(request)))

    async def api_run(self, request: Request) -> Response:
        return _json(await _data.run_page(self.store, self.registry, _ref(request), with_replay=False))

    async def api_history(self, request: Request) -> Response:
        return _json(await _data.history_json(self.store, _ref(request)))

    async def api_replay(self, request: Request) -> Response:
        report = await _data.replay_page(self.store, self.registry, _ref(request))
        return _json(report, 409 if "error" in report else 200)

    async def api_audit(self, request: Request) -> Response:
        verdict, ref = _verdict(request), _text(request, "ref")
        if ref is not None:
            return _json(await _data.run_audit(self.store, ref, verdict))
        return _json(await _data.overall_audit(self.store, verdict=verdict, after=_after(request)))

    def routes(self) -> list[Route]:
        pages: list[tuple[str, Handler]] = [("/", self.home), ("/runs", self.runs), ("/run", self.run),
                                            ("/audit", self.audit)]
        apis: list[tuple[str, Handler]] = [("/api/runs", self.api_runs), ("/api/run", self.api_run),
                                           ("/api/history", self.api_history), ("/api/replay", self.api_replay),
                                           ("/api/audit", self.api_audit)]
        return ([Route(path, self.guarded(h, api=False), methods=["GET"]) for path, h in pages]
                + [Route(path, self.guarded(h, api=True), methods=["GET"]) for path, h in apis]
                # no icon: an empty answer, so a browser does not log a 404 for every page
                + [Route("/favicon.ico", _no_icon, methods=["GET"])])


async def _no_icon(request: Request) -> Response:
    return Response(status_code=204)


def create_app(store: WorkflowStore, registry: WorkflowRegistry | None = None, *, store_label: str = "",
               refresh: int = 5, hosts: Collection[str] | None = None) -> Starlette:
    """Return the read-only web view of ``store`` as an ASGI application.

    Args:
        store: an open store; the application only reads it and never closes it.
        registry: the application's workflows, for replay verdicts and budgets (optional).
        store_label: how pages name the store (keep passwords out of it).
        refresh: seconds between reloads of the runs page (0: never); ``?refresh=`` overrides it.
        hosts: the names a request's Host header may give (without a port); others get 400. None: any
            (``runifold ui`` listening on a loopback address gives :data:`LOOPBACK_HOSTS`).
    """
    view = View(store, registry, store_label=store_label, refresh=refresh)
    app = Starlette(routes=view.routes())
    if hosts is not None:
        app.add_middleware(_HostCheck, hosts=frozenset(h.lower() for h in hosts))
    app.add_middleware(_SecurityHeaders)  # (added last: outermost, so a refusal carries the headers too)
    return app
