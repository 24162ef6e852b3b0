"""The console's Starlette app: login, the pages (whole, or only their main part for live refreshes), and the
server-sent-event stream that tells open pages what changed. Every page but the login asks for a session."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route

from services import http_serving
from services.client import LedgerClient, LedgerError, NotFound, RetryPolicy
from services.printable import printable

from . import pages
from .auth import COOKIE, SESSION_TTL_S, LoginThrottle, Sessions
from .config import ConsoleConfig
from .ledger_check import LedgerCheck
from .mirror import Mirror

log = logging.getLogger(__name__)

FRAGMENT_HEADER = "x-console-fragment"
HEARTBEAT_S = 15.0
SECURITY_HEADERS = {
    # Everything the pages use comes from this server: no CDN, no inline script.
    "content-security-policy": "default-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if value == int(value) and abs(value) < 1e15 else f"{value:.4g}"


_templates.filters["num"] = _number


def create_app(config: ConsoleConfig, client: LedgerClient | None = None) -> Starlette:
    client = client or LedgerClient(config.ledger, config.key, retry=RetryPolicy(attempts=3))
    mirror = Mirror(client)
    mirror.check = LedgerCheck(config.ledger, config.key, config.ledger_check_s, mirror.ledger_changed)
    sessions = Sessions(config.key, config.console_key)
    throttle = LoginThrottle()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        mirror.start()
        log.info("console serving on http://%s:%d (ledger %s)", config.host, config.port, config.ledger)
        try:
            yield
        finally:
            await mirror.stop()
            await client.close()

    def render(name: str, request: Request, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("fragment", request.headers.get(FRAGMENT_HEADER) == "1")
        context.setdefault("counts", mirror.count_by_state())
        context.setdefault("watch_error", mirror.error)
        context.setdefault("ledger_problem", mirror.ledger_problem())
        context.setdefault("path", request.url.path)
        html = _templates.get_template(name).render(**context)
        return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)

    def signed_in(request: Request) -> bool:
        if sessions.role(request.cookies.get(COOKIE)) is None:
            return False
        http_serving.trust_connection(request.scope)  # a signed-in browser's connections outlast anonymous ones
        return True

    def to_login(request: Request) -> Response:
        if request.headers.get(FRAGMENT_HEADER) == "1":
            return PlainTextResponse("sign in again", status_code=401, headers=SECURITY_HEADERS)
        target = urllib.parse.quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        return RedirectResponse(f"/login?next={target}", status_code=303)

    async def login_page(request: Request) -> Response:
        return render("login.html.j2", request, next=_safe_next(request.query_params.get("next", "/")), error="")

    async def login(request: Request) -> Response:
        body = (await request.body())[:8192].decode("utf-8", "replace")
        form = urllib.parse.parse_qs(body)
        key = form.get("key", [""])[0]
        target = _safe_next(form.get("next", ["/"])[0])
        address = request.client.host if request.client else "?"
        wait_s = throttle.wait_s(address)
        if wait_s:
            error = f"Too many wrong keys from this address: try again in {wait_s} s."
            response = render("login.html.j2", request, status=429, next=target, error=error)
            response.headers["retry-after"] = str(wait_s)
            return response
        cookie = sessions.login(key) if key else None
        if cookie is None:
            throttle.failed(address)
            log.info("console login refused (wrong key) from %s", address)
            return render("login.html.j2", request, status=401, next=target, error="That key is not accepted.")
        throttle.succeeded(address)
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, cookie, max_age=int(SESSION_TTL_S), httponly=True, samesite="strict", path="/")
        return response

    async def logout(request: Request) -> Response:
        sessions.logout(request.cookies.get(COOKIE))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/")
        return response

    async def overview(request: Request) -> Response:
        if not signed_in(request):
            return to_login(request)
        return render("overview.html.j2", request, watch="rollouts models proxy runs", **pages.overview(mirror))

    async def runs(request: Request) -> Response:
        if not signed_in(request):
            return to_login(request)
        return render("runs.html.j2", request, watch="runs", **pages.runs(mirror))

    async def run(request: Request) -> Response:
        if not signed_in(request):
            return to_login(request)
        run_id = request.path_params["run_id"]
        try:
            data = await pages.run_detail(mirror, run_id, request.query_params.getlist("chart"))
        except LedgerError as err:
            return ledger_error(request, err)
        return render("run.html.j2", request, watch=f"run:{run_id}", **data)

    async def run_health(request: Request) -> Response:
        if not signed_in(request):
            return to_login(request)
        run_id = request.path_params["run_id"]
        try:
            step = int(request.query_params.get("step", ""))
        except ValueError:
            return render("error.html.j2", request, status=400, watch="", message="step must be a number")
        metric = request.query_params.get("metric", "")
        try:
            data = await pages.health_rollouts(mirror, run_id, step, metric)
        except LedgerError as err:
            return ledger_error(request, err)
        return render("health.html.j2", request, watch=f"run:{run_id}", **data)

    async def rollouts(request: Request) -> Response:
        if not signed_in(request):
            return to_login(request)
        data = pages.rollout_rows(mirror, request.query_params, config.page_size)
        return render("rollouts.html.j2", request, watch="rollouts", **data)

    async def rollout(request: Request) -> Response:
        if not signed_in(request):
            return to_login(request)
        rollout_id = request.path_params["rollout_id"]
        try:
            data = await pages.rollout_detail(mirror, rollout_id, request.query_params.get("tokens") == "1")
        except LedgerError as err:
            return ledger_error(request, err)
        return render("rollout.html.j2", request, watch=f"rollout:{rollout_id}", **data)

    def ledger_error(request: Request, err: LedgerError) -> Response:
        status = 404 if isinstance(err, NotFound) else 502
        if status == 502:
            log.warning("console: ledger call failed: %s: %s", err.code_name, err.details())
        return render("error.html.j2", request, status=status, watch="", message=err.message)

    async def events(request: Request) -> Response:
        if not signed_in(request):
            return PlainTextResponse("sign in first", status_code=401)

        async def stream() -> AsyncIterator[bytes]:
            async with mirror.listen() as queue:
                yield b"retry: 1000\n\n"
                while True:
                    try:
                        notice = await asyncio.wait_for(queue.get(), HEARTBEAT_S)
                    except asyncio.TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    if notice is None:
                        return
                    yield f"data: {json.dumps(notice)}\n\n".encode()

        headers = {"cache-control": "no-store", "x-accel-buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        kinds = {"console.js": "text/javascript", "console.css": "text/css"}
        if name not in kinds:
            return PlainTextResponse("not found", status_code=404)
        text = _templates.get_template(f"{name}.j2").render()
        return Response(text, media_type=kinds[name], headers={"cache-control": "max-age=300"})

    async def health(request: Request) -> Response:
        """Alive (the process serves HTTP), whether or not the ledger is reachable."""
        return PlainTextResponse("ok")

    async def ready(request: Request) -> Response:
        """Ready once the first rollout snapshot arrived, so the pages show the ledger and not an empty mirror."""
        synced = mirror.synced["rollouts"].is_set()
        return PlainTextResponse("ok" if synced else "syncing", status_code=200 if synced else 503)

    routes = [
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST", "GET"]),
        Route("/", _timed(overview)),
        Route("/runs", _timed(runs)),
        Route("/runs/{run_id}", _timed(run)),
        Route("/runs/{run_id}/health", _timed(run_health)),
        Route("/rollouts", _timed(rollouts)),
        Route("/rollouts/{rollout_id}", _timed(rollout)),
        Route("/events", events),
        Route("/static/{name}", asset),
        Route("/healthz", health),
        Route("/readyz", ready),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={ClientDisconnect: client_left})
    app.state.mirror = mirror
    return app


async def client_left(request: Request, exc: Exception) -> Response:
    """The client went away (or its body deadline passed, answered 408 by the server) before its request was in:
    nobody to answer, and no bug, so one line instead of a traceback."""
    address = request.client.host if request.client else "?"
    log.info(
        "console: %s %s from %s: the client left before its request arrived (or its body deadline passed)",
        request.method,
        printable(request.url.path),
        address,
    )
    return Response(status_code=400)


def _timed(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Report the handler's whole server time (data and rendering) as a Server-Timing header."""

    @functools.wraps(handler)
    async def timed(request: Request) -> Response:
        started = time.perf_counter()
        response = await handler(request)
        response.headers["server-timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.2f}"
        return response

    return timed


def _safe_next(target: str) -> str:
    """Only a path on this site (no scheme, no host, no //evil) is a place to go after login."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target
