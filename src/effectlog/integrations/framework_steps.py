"""What every framework integration shares: the pass's gateway, the tool key, replayed outcomes, unwrapping.

An integration wraps a framework's model and tools so that each call goes through an
effectlog ``Session`` step. The session calls its gateway only when the journal says the
call must run; here the gateway runs whatever the integration's wrapper put in
``PENDING`` (the real call, given the step's idempotency key). A completed run answers
from the journal alone (``recorded_step``, ``replayed_tool``). Frameworks wrap the
errors their tools and models raise; ``effectlog_error`` finds effectlog's own inside.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any, cast

from pydantic_core import to_jsonable_python

from effectlog.errors import BadInput, EffectlogError, ReplayDivergence, RunClosed, UnusableResult, describe
from effectlog.fold import StepState
from effectlog.journal import chain_from_env, open_journal
from effectlog.journal.sidecars import not_a_path
from effectlog.session import Checkpointer, Reconciled, Session, SqliteCheckpointer, ToolInfo, ToolStep
from effectlog.session.store import JournalCheckpointer

IDEMPOTENCY_HEADER = "Idempotency-Key"

Send = Callable[[str], Awaitable[Any]]  # runs the real call with the step's idempotency key
PENDING: ContextVar[Send | None] = ContextVar("effectlog_integration_pending", default=None)
TOOL_KEY: ContextVar[str | None] = ContextVar("effectlog_integration_tool_key", default=None)
# TOOL_KEY's value while a step runs a whole agent (an agent used as a tool): the inner agent's tool calls
# are part of that step, not steps of their own, and the step's one key would name each of them.
NESTED_RUN = "\x00an agent used as a tool"


def idempotency_key() -> str:
    """The idempotency key of the tool step running now, stable across crashes: pass it to your API."""
    key = TOOL_KEY.get()
    if key is None:
        raise BadInput("idempotency_key() is only available inside a tool called by a durable agent run")
    if key == NESTED_RUN:
        raise BadInput(
            "idempotency_key() was asked inside an agent used as a tool: its tools' calls are part of the outer "
            "tool step, not steps with keys of their own, and the step's one key would name every one of them "
            "(a provider deduplicating by key would drop all but the first); give the call a key of its own"
        )
    return key


def jsonable_answer(result: Any, name: str) -> Any:
    """A framework tool's answer as pydantic turns it into JSON types (models, dataclasses), read after the
    tool answered: a value pydantic cannot turn (bytes that are not UTF-8, a function, a cycle) is an answer
    that cannot be recorded (``UnusableResult``, outcome unknown), not an exception of the tool's. Raised as
    the tool's own, it was recorded as ``outcome unknown: UnicodeDecodeError: ...``, which reads as a tool
    that failed (perhaps before its effect) to the operator deciding the step."""
    try:
        return to_jsonable_python(result)
    except (Exception, RecursionError) as exc:
        raise UnusableResult(
            f"the tool's result cannot be recorded: the result of tool {name!r}: {' '.join(describe(exc).split())}"
        ) from None


class PendingGateway:
    """The session's gateway for one pass: the real call is whatever the wrapper put in ``PENDING``."""

    def __init__(self, model: str, idempotent: frozenset[str]) -> None:
        self.model = model
        self.idempotent = idempotent

    def tool(self, name: str) -> ToolInfo:
        return ToolInfo(name=name, idempotent=name in self.idempotent)

    def tools(self) -> Sequence[ToolInfo]:
        return []

    async def _send(self, key: str) -> Any:
        send = PENDING.get()
        if send is None:  # pragma: no cover - the wrappers always set it
            raise BadInput("a framework step ran outside its wrapper")
        return await send(key)

    async def complete(self, body: Any, *, idempotency_key: str) -> dict[str, Any]:
        return cast(dict[str, Any], await self._send(idempotency_key))

    async def call_tool(self, name: str, args: Any, *, idempotency_key: str) -> Any:
        return await self._send(idempotency_key)


def fixed_location(journal: str | Path | Checkpointer) -> str | Path | Checkpointer:
    """``journal`` as every later pass must find it: a relative file path made absolute now. A durable
    agent opens its journal at each pass, and a tool that changed the working directory in between moved
    a relative one: the next pass opened a new, empty journal there and made every call again."""
    if not isinstance(journal, Path | str) or not_a_path(os.fspath(journal)):
        return journal  # a store, a postgresql:// or other URL, a connection string: used or refused as given
    return Path(os.path.abspath(journal)) if isinstance(journal, Path) else os.path.abspath(journal)


def open_store(journal: str | Path | Checkpointer) -> tuple[Checkpointer, bool]:
    """The store of one pass, and whether the pass opened it (then it closes it after)."""
    if isinstance(journal, Path):
        return SqliteCheckpointer(journal), True
    if isinstance(journal, str):
        return JournalCheckpointer(open_journal(journal, chain=chain_from_env())), True
    return journal, False


def check_names(what: str, names: Any) -> None:
    """A bare string would be read as a set of one-letter tool names."""
    if isinstance(names, str):
        raise BadInput(f"{what} takes a collection of tool names, not the string {names!r}")


def reconciled_value(result: Reconciled) -> dict[str, Any]:
    """What a tool call reconciled by a person returns to the model (its real answer was never recorded)."""
    return {
        "reconciled": True,
        "outcome": result.outcome,
        "evidence": result.evidence,
        "operator": result.operator,
    }


def recorded_step(session: Session, step_id: str, kind: str, name: str, fp: str) -> StepState:
    """A completed run answers from the journal alone: the same step, or an error, never a call."""
    step = session.state.step(step_id)
    if step is None:
        raise RunClosed(
            f"step {step_id!r} asked of a completed run; a closed run never reopens (use a new run id)",
            run_id=session.run_id,
            step_id=step_id,
        )
    if step.fingerprint != fp:
        recorded, asked = f"{step.kind} {step.adapter!r}", f"{kind} {name!r}"
        raise ReplayDivergence(
            f"the journal recorded {recorded} at this step, this run asks for {asked}",
            run_id=session.run_id,
            step_id=step_id,
            recorded=recorded,
            requested=asked,
        )
    return step


def replayed_tool(step: StepState, name: str, args: dict[str, Any]) -> ToolStep:
    """The outcome a completed run recorded for a tool step (it was closed with every step decided)."""
    common: dict[str, Any] = {"step_id": step.step_id, "tool": name, "args": args, "replayed": True}
    if step.state == "reconciled":
        result = Reconciled(
            outcome=step.outcome or "applied",
            evidence=step.evidence or "",
            operator=step.operator or "",
            automated=step.automated,
        )
        return ToolStep(status="reconciled", result=result, **common)
    if step.state == "denied":
        return ToolStep(status="denied", decision="deny", reason=step.reason, **common)
    if step.state == "failed":
        return ToolStep(status="failed", reason=step.reason, **common)
    return ToolStep(status="ok", result=step.receipt, **common)


def effectlog_error(exc: BaseException) -> EffectlogError | None:
    """The effectlog error inside whatever the framework wrapped it in (cause, context, exception group)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, EffectlogError):
            return current
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        todo.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return None
