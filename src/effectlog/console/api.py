"""The console's JSON API under ``/api/``: the pages' data and the decisions, for scripts.

Authenticated with ``Authorization: Bearer TOKEN`` only (a token from the users file,
``token_sha256``); no cookie is read here, so a page of another site cannot make a
browser send an API decision (no CSRF), and no CORS header is ever sent. A viewer's
token reads; an operator's also decides. Decisions are ``decisions.decide``/``operate``,
the pages' own code path, under the token's user name. Errors are JSON with the
project's error code: 401 without a valid token, 403 for a viewer's decision, 404 for an
unknown run, 409 for a conflict (a changed digest), 400 for the rest.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from effectlog.cli.run_views import when
from effectlog.console import changes, decisions, views
from effectlog.console.decisions import Config
from effectlog.console.paths import decision_path
from effectlog.console.users import User, by_token
from effectlog.errors import Conflict, EffectlogError, JournalLocked, UnknownRun
from effectlog.fold import RunState

MAX_WAIT_S = 60.0  # the longest a long poll of /api/changes waits
Endpoint = Callable[[Request, User], Awaitable[Any]]


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


def routes(config: Config) -> list[Route]:
    def api(fn: Endpoint, *, decides: bool = False) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                user = _bearer(config, request)
                if decides and not user.may_decide:
                    raise _Refused(403, "forbidden", f"{user.name} is a viewer: only an operator decides")
                return JSONResponse(await fn(request, user))
            except _Refused as exc:
                headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
                return JSONResponse({"error": str(exc), "code": exc.code}, exc.status, headers=headers)
            except EffectlogError as exc:
                status = (
                    404 if isinstance(exc, UnknownRun) else 409 if isinstance(exc, Conflict | JournalLocked) else 400
                )
                return JSONResponse({"error": str(exc), "code": exc.code}, status)

        return endpoint

    async def attention(request: Request, user: User) -> Any:
        def read(journal: Any) -> list[views.Attention]:
            if config.store is None:
                return views.attention(journal)
            return decisions.with_store(config, lambda store: views.attention(journal, store))

        items = await run_in_threadpool(lambda: decisions.reading(config, read))
        return {"counts": views.counts(items), "items": msgspec.to_builtins(items)}

    async def runs(request: Request, user: User) -> Any:
        state = request.query_params.get("state", "")
        try:
            page = max(1, int(request.query_params.get("page", "1")))
        except ValueError:
            raise _Refused(400, "bad_input", "page must be a number") from None
        rows, more = await run_in_threadpool(
            lambda: decisions.reading(config, lambda j: views.runs(j, state=state, page=page))
        )
        return {"page": page, "more": more, "runs": [_run_row(s, cond) for s, cond in rows]}

    async def run(request: Request, user: User) -> Any:
        run_id = request.path_params["run_id"]
        data = await run_in_threadpool(lambda: decisions.reading(config, lambda j: views.run_page(j, run_id)))
        return {
            **_run_row(data.state, data.condition),
            "reason": data.state.reason,
            "steps": msgspec.to_builtins(data.steps),
            "at_stake": msgspec.to_builtins(data.stakes),
            "timeline": msgspec.to_builtins(data.timeline),
        }

    async def decide(request: Request, user: User) -> Any:
        try:
            run_id, step_id, action = decision_path(request)
        except HTTPException as exc:
            raise _Refused(404, "not_found", str(exc.detail)) from None
        body = await _body(request)
        await run_in_threadpool(lambda: decisions.decide(config, action, run_id, step_id, by=user.name, form=body))
        data = await run_in_threadpool(lambda: decisions.reading(config, lambda j: views.run_page(j, run_id)))
        step = next((msgspec.to_builtins(s) for s in data.steps if s.id == step_id), None)
        return {"run_id": run_id, "run_state": data.state.state, "step": step, "by": user.name, "decision": action}

    async def fleet_requests(request: Request, user: User) -> Any:
        state = request.query_params.get("state", "")
        rows = await run_in_threadpool(lambda: decisions.with_store(config, lambda st: views.requests(st, state=state)))
        return {"requests": msgspec.to_builtins(rows)}

    async def fleet_request(request: Request, user: User) -> Any:
        request_id: int = request.path_params["request_id"]
        data = await run_in_threadpool(
            lambda: decisions.with_store(config, lambda st: views.request_page(st, request_id))
        )
        return msgspec.to_builtins(data)

    async def fleet_decide(request: Request, user: User) -> Any:
        request_id: int = request.path_params["request_id"]
        action = request.path_params["action"]
        body = await _body(request)
        reason, attempt = body.get("reason", ""), decisions.attempt_of(body)  # the attempt the caller looked at
        await run_in_threadpool(
            lambda: decisions.with_store(
                config,
                lambda st: decisions.operate(st, request_id, action, by=user.name, reason=reason, attempt=attempt),
            )
        )
        return await fleet_request(request, user)

    async def changed(request: Request, user: User) -> Any:
        since = request.query_params.get("since", "")
        try:
            given = float(request.query_params.get("wait", "25"))
        except ValueError:
            given = math.nan
        if math.isnan(given):  # NaN passes every clamp: a deadline never reached, a request polling forever
            raise _Refused(400, "bad_input", "wait must be a number of seconds")
        wait = min(max(given, 0.0), MAX_WAIT_S)
        run_id = request.query_params.get("run")  # only this run's writes count
        now = await changes.wait_for_change(config, since, wait if since else 0.0, run_id)
        return {"version": now, "changed": bool(since) and now != since}

    return [
        Route("/api/changes", api(changed)),
        Route("/api/attention", api(attention)),
        Route("/api/runs", api(runs)),
        Route("/api/runs/{run_id:path}", api(run)),  # a run id may hold '/': see app.decision_path
        Route("/api/runs/{run_id:path}/steps/{step_id}/{action:str}", api(decide, decides=True), methods=["POST"]),
        Route("/api/requests", api(fleet_requests)),
        Route("/api/requests/{request_id:int}", api(fleet_request)),
        Route("/api/requests/{request_id:int}/{action:str}", api(fleet_decide, decides=True), methods=["POST"]),
    ]


def _bearer(config: Config, request: Request) -> User:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    user = by_token(config.users, token.strip()) if scheme.lower() == "bearer" and token.strip() else None
    if user is None:
        raise _Refused(401, "unauthorized", "give Authorization: Bearer TOKEN (a token from the users file)")
    return user


async def _body(request: Request) -> dict[str, str]:
    """The decision's fields: a JSON object of strings."""
    try:
        data = json.loads(await request.body() or b"{}")
    except (ValueError, RecursionError):  # nested deeper than the parser goes is no JSON object either
        raise _Refused(400, "bad_input", "the body must be a JSON object") from None
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise _Refused(400, "bad_input", "the body must be a JSON object of strings")
    return {str(k): v for k, v in data.items()}


def _run_row(state: RunState, condition: str) -> dict[str, Any]:
    return {
        "run_id": state.run_id,
        "kind": state.kind,
        "state": state.state,
        "condition": condition,
        "started": when(state.started_ts),
        "updated": when(state.updated_ts),
        "blocked_step": state.blocked_step,
    }
