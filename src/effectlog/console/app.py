"""The console's web application: pages, login, and the decisions, under one authenticated name.

Starlette with Jinja2 templates (autoescape on for every page), sessions in a signed
cookie (Starlette's ``SessionMiddleware``, itsdangerous), a CSRF token per session
checked on every POST, and little JavaScript (``static/live.js``: live updates from
``/events``, ``effectlog.console.changes``). Each decision calls the very function the
CLI calls (``approvals.approve``/``deny``, ``reconcile.reconcile``) with the logged-in
user's name; the journal is opened for each request and closed after it, so the
console never holds a run: a process that drives one is never blocked by it.
"""

from __future__ import annotations

import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.sessions import SessionMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from effectlog.cli.run_views import when
from effectlog.console import api, changes, decisions, diagram, views
from effectlog.console.decisions import Config
from effectlog.console.paths import decision_path, segment
from effectlog.console.users import User, check_password
from effectlog.errors import Conflict, EffectlogError, JournalLocked
from effectlog.fleet.protocol import FleetStore
from effectlog.journal import Journal
from effectlog.notify import shown_location
from effectlog.spec import compiled
from effectlog.summary import RUN_STATES

ATTEMPT_STATES: tuple[str, ...] = compiled("attempt").spec.states

T = TypeVar("T")
MAX_BODY_BYTES = 1 << 20  # a decision's form or JSON is a few fields of text; no request needs more
LOGIN_FAILURES = 5  # failed logins per user name (and per client address) within LOGIN_WINDOW_S
LOGIN_WINDOW_S = 60.0
SESSION_MAX_AGE_S = 8 * 3600


@dataclass
class _Throttle:
    """Failed logins per key, forgotten after the window: a brute force gets 429s."""

    failures: dict[str, list[float]] = field(default_factory=dict)

    def blocked(self, *keys: str) -> bool:
        now = time.monotonic()
        for key in keys:
            recent = [t for t in self.failures.get(key, []) if now - t < LOGIN_WINDOW_S]
            self.failures[key] = recent
            if len(recent) >= LOGIN_FAILURES:
                return True
        return False

    def failed(self, *keys: str) -> None:
        now = time.monotonic()
        if len(self.failures) > 10_000:  # many made-up user names: forget those outside the window
            self.failures = {k: v for k, v in self.failures.items() if v and now - v[-1] < LOGIN_WINDOW_S}
        for key in keys:
            self.failures.setdefault(key, []).append(now)


def create_app(config: Config) -> Starlette:
    env = Environment(
        loader=PackageLoader("effectlog.console", "templates"), autoescape=select_autoescape(default=True)
    )
    env.globals["when"] = when
    env.filters["segment"] = segment
    env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    templates = Jinja2Templates(env=env)
    throttle = _Throttle()
    # The signed cookie alone cannot be revoked: a copy taken before logout stayed a logged-in session
    # for its whole max age. Each login's session id lives here until logout (or its age runs out).
    live: dict[str, float] = {}
    env.globals["step_svg"] = lambda state, ident: diagram.svg(
        "step", state, ident=ident, title=f"step {ident}: {state} (the step machine, from specs/step.toml)"
    )

    # Every page shows where it reads from: a PostgreSQL URL's password is not shown (viewers see pages too).
    shown_journal = shown_location(config.journal)
    shown_store = shown_location(config.store) if config.store is not None else None

    def page(request: Request, name: str, status: int = 200, **context: Any) -> Response:
        context.update(
            request=request, user=_user(request), csrf=_csrf(request), location=shown_journal, store=shown_store
        )
        return templates.TemplateResponse(request, name, context, status_code=status)

    def _user(request: Request) -> User | None:
        name, sid = request.session.get("user"), request.session.get("sid")
        if not isinstance(name, str) or not isinstance(sid, str) or live.get(sid, 0.0) < time.monotonic():
            return None
        return config.users.get(name)

    def reading(fn: Callable[[Journal], T]) -> Callable[[], T]:
        return lambda: decisions.reading(config, fn)

    def with_store(fn: Callable[[FleetStore], T]) -> Callable[[], T]:
        if config.store is None:
            raise HTTPException(404, "no fleet store: start the console with --store S")
        return lambda: decisions.with_store(config, fn)

    async def live_version(run_id: str | None = None) -> str:
        # Read before the page's data: a write in between makes the feed announce a change at once.
        return await run_in_threadpool(changes.version, config, run_id)

    def need_user(request: Request) -> User:
        user = _user(request)
        if user is None:
            raise HTTPException(401, "log in first")
        return user

    async def login_form(request: Request) -> Response:
        return page(request, "login.html")

    async def login(request: Request) -> Response:
        form = await request.form()
        _check_csrf(request, form.get("csrf"))
        name, password = str(form.get("user", "")), str(form.get("password", ""))
        client = f"client:{request.client.host if request.client else ''}"
        if throttle.blocked(f"user:{name}", client):
            return page(request, "login.html", 429, error="too many failed logins: wait a minute")
        user = config.users.get(name)
        ok = await run_in_threadpool(check_password, password, user.password_hash if user else _DUMMY_HASH)
        if user is None or not ok:
            throttle.failed(f"user:{name}", client)
            return page(request, "login.html", 401, error="wrong user name or password")
        request.session.clear()
        now = time.monotonic()
        for old in [k for k, until in live.items() if until < now]:
            del live[old]
        sid = secrets.token_urlsafe(32)
        live[sid] = now + SESSION_MAX_AGE_S
        request.session.update(user=user.name, csrf=secrets.token_urlsafe(32), sid=sid)
        return RedirectResponse("/", status_code=303)

    async def logout(request: Request) -> Response:
        form = await request.form()
        _check_csrf(request, form.get("csrf"))
        sid = request.session.get("sid")
        if isinstance(sid, str):
            live.pop(sid, None)
        request.session.clear()
        return RedirectResponse("/login", status_code=303)

    async def home(request: Request) -> Response:
        if _user(request) is None:
            return RedirectResponse("/login", status_code=303)

        def read(journal: Journal) -> list[views.Attention]:
            if config.store is None:
                return views.attention(journal)
            return decisions.with_store(config, lambda store: views.attention(journal, store))

        ver = await live_version()
        items = await run_in_threadpool(reading(read))
        return page(request, "attention.html", items=items, counts=views.counts(items), version=ver)

    async def runs(request: Request) -> Response:
        if _user(request) is None:
            return RedirectResponse("/login", status_code=303)
        state = request.query_params.get("state", "")
        try:
            number = max(1, int(request.query_params.get("page", "1")))
        except ValueError:
            raise HTTPException(400, "page must be a number") from None
        ver = await live_version()
        rows, more = await run_in_threadpool(reading(lambda j: views.runs(j, state=state, page=number)))
        return page(
            request, "runs.html", rows=rows, more=more, page_no=number, state=state, states=RUN_STATES, version=ver
        )

    async def run(request: Request, error: str = "", status: int = 200) -> Response:
        if _user(request) is None:
            return RedirectResponse("/login", status_code=303)
        run_id = request.path_params["run_id"]
        ver = await live_version(run_id)
        data = await run_in_threadpool(reading(lambda j: views.run_page(j, run_id)))
        return page(
            request,
            "run.html",
            status,
            run=data,
            steps_by_id={s.id: s for s in data.steps},
            version=ver,
            live_run=run_id,
            error=error,
            effects=config.effects,
            lookup=bool(config.adapters),
        )

    async def decide(request: Request) -> Response:
        user = need_user(request)
        form = await request.form()
        _check_csrf(request, form.get("csrf"))
        if not user.may_decide:
            raise HTTPException(403, f"{user.name} is a viewer: only an operator decides")
        run_id, step_id, action = decision_path(request)
        fields = {k: str(v) for k, v in form.items() if k != "csrf"}
        try:
            await run_in_threadpool(
                lambda: decisions.decide(config, action, run_id, step_id, by=user.name, form=fields)
            )
        except (Conflict, JournalLocked) as exc:
            return await run(request, error=str(exc), status=409)
        except EffectlogError as exc:
            return await run(request, error=str(exc), status=400)
        # Encoded whole: a raw ? # or % in a run id made the browser show another run under "decided".
        return RedirectResponse(f"/runs/{quote(run_id, safe='')}?decided={action}", status_code=303)

    async def fleet_requests(request: Request) -> Response:
        if _user(request) is None:
            return RedirectResponse("/login", status_code=303)
        state = request.query_params.get("state", "")
        ver = await live_version()
        rows = await run_in_threadpool(with_store(lambda st: views.requests(st, state=state)))
        return page(request, "requests.html", rows=rows, state=state, states=ATTEMPT_STATES, version=ver)

    async def fleet_request(request: Request, error: str = "", status: int = 200) -> Response:
        if _user(request) is None:
            return RedirectResponse("/login", status_code=303)
        request_id: int = request.path_params["request_id"]
        ver = await live_version()
        data = await run_in_threadpool(with_store(lambda st: views.request_page(st, request_id)))
        return page(request, "request.html", status, req=data, error=error, version=ver)

    async def fleet_decide(request: Request) -> Response:
        user = need_user(request)
        form = await request.form()
        _check_csrf(request, form.get("csrf"))
        if not user.may_decide:
            raise HTTPException(403, f"{user.name} is a viewer: only an operator decides")
        request_id: int = request.path_params["request_id"]
        action, reason = request.path_params["action"], str(form.get("reason", "")).strip()
        try:
            attempt = decisions.attempt_of(form)  # the attempt the page showed
            await run_in_threadpool(
                with_store(
                    lambda st: decisions.operate(st, request_id, action, by=user.name, reason=reason, attempt=attempt)
                )
            )
        except (Conflict, JournalLocked) as exc:
            return await fleet_request(request, error=str(exc), status=409)
        except EffectlogError as exc:
            return await fleet_request(request, error=str(exc), status=400)
        return RedirectResponse(f"/requests/{request_id}?decided={action}", status_code=303)

    async def events(request: Request) -> Response:
        if _user(request) is None:
            raise HTTPException(401, "log in first")
        since, run_id = request.query_params.get("since", ""), request.query_params.get("run")
        return StreamingResponse(
            changes.stream(config, since, request.is_disconnected, run_id),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 401 and request.method == "GET":
            return RedirectResponse("/login", status_code=303)
        return page(request, "error.html", exc.status_code, message=exc.detail)

    async def effectlog_error(request: Request, exc: Exception) -> Response:
        return page(request, "error.html", 404 if "no run" in str(exc) else 400, message=str(exc))

    async def server_error(request: Request, exc: Exception) -> Response:
        # No stack trace reaches the browser; the server's log has it.
        return PlainTextResponse("internal error: see the console's log", status_code=500)

    import effectlog.console as package

    static_dir = f"{package.__path__[0]}/static"
    return Starlette(
        routes=[
            *api.routes(config),
            Route("/", home),
            Route("/login", login_form, methods=["GET"]),
            Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"]),
            Route("/runs", runs),
            Route("/runs/{run_id:path}", run),  # a run id may hold '/' (a session's may): see decision_path
            Route("/runs/{run_id:path}/steps/{step_id}/{action:str}", decide, methods=["POST"]),
            Route("/events", events),
            Route("/requests", fleet_requests),
            Route("/requests/{request_id:int}", fleet_request),
            Route("/requests/{request_id:int}/{action:str}", fleet_decide, methods=["POST"]),
            Mount("/static", app=StaticFiles(directory=static_dir), name="static"),
        ],
        middleware=[
            Middleware(_BodyLimit),
            Middleware(
                SessionMiddleware,
                secret_key=config.secret_key,
                session_cookie="effectlog_console",
                same_site="strict",
                https_only=config.https_only,
                max_age=SESSION_MAX_AGE_S,
            ),
        ],
        exception_handlers={HTTPException: http_error, EffectlogError: effectlog_error, Exception: server_error},
    )


class _BodyLimit:
    """Refuses a request body above ``MAX_BODY_BYTES`` with 413, before it is read.

    Starlette reads a urlencoded form (``POST /login`` too, which needs no session) and a JSON body
    whole into memory: without a limit, anyone who reached the console could make it buffer any size.
    A body announced larger is refused at once; one that streams past the limit (chunked, or longer
    than announced) is cut off as it arrives."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        announced = dict(scope["headers"]).get(b"content-length", b"0")
        if not announced.isdigit() or int(announced) > MAX_BODY_BYTES:
            await PlainTextResponse(f"request body larger than {MAX_BODY_BYTES} bytes: refused", status_code=413)(
                scope, receive, send
            )
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > MAX_BODY_BYTES:
                raise HTTPException(413, f"request body larger than {MAX_BODY_BYTES} bytes: refused")
            return message

        await self.app(scope, limited, send)


_DUMMY_HASH = "scrypt$16384$8$1$AAAAAAAAAAAAAAAAAAAAAA==$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="


def _csrf(request: Request) -> str:
    token = request.session.get("csrf")
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        request.session["csrf"] = token
    return token


def _check_csrf(request: Request, given: Any) -> None:
    expected = request.session.get("csrf")
    if not isinstance(expected, str) or not isinstance(given, str) or not hmac.compare_digest(expected, given):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
