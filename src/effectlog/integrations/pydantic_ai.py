"""pydantic-ai: each model request and each tool call of an ``Agent`` run is a journaled step.

``DurableAgent(agent, journal=..., idempotent={...}, needs_approval={...})`` wraps any
pydantic-ai ``Agent`` the way pydantic-ai's own ``durable_exec`` integrations do: the
model behind a ``WrapperModel``, each toolset behind a ``WrapperToolset``, both put in
place with ``Agent.override`` for the length of one ``run``, tool calls run one after
another. Each ``run(..., run_id=...)`` is one pass of an effectlog session
(``effectlog.session.Session``), so the journal, the CLI (``approve``, ``reconcile``,
``show``) and recovery treat it like any session:

- a model request is a model step keyed by its place in the conversation (``model-N``,
  N = the responses before it). Its body (the messages without timestamps and per-run
  ids, the tool definitions, the settings) gives the provider idempotency key
  ``(run, step, body digest)``, sent as the ``Idempotency-Key`` header through
  ``extra_headers``; every later pass gets the recorded response without a call;
- a tool call is a tool step keyed ``tool-N-<tool_call_id>``: the id comes from the
  recorded response, so a resumed pass computes the same step ids. Whether a tool may be
  repeated after a crash is declared per tool (default: not).

A non-idempotent tool whose outcome is unknown raises ``UncertainEffect`` (unwrapped,
with the reconcile command); a tool that needs approval holds the run and surfaces as
pydantic-ai's own ``DeferredToolRequests`` (its ``metadata`` carries effectlog's approve
command), or as ``ApprovalRequired`` when the agent's output type has no room for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator, Collection, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

try:
    import pydantic_ai
except ImportError as exc:  # pragma: no cover - the dev extra installs it
    raise ImportError(
        "effectlog.integrations.pydantic_ai needs pydantic-ai: pip install 'effectlog[pydantic-ai]'"
    ) from exc

from pydantic_ai import Agent, AgentRunResult, DeferredToolRequests, DeferredToolResults
from pydantic_ai.exceptions import ApprovalRequired as DeferForApproval
from pydantic_ai.exceptions import CallDeferred, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import CompletedStreamedResponse, Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext
from pydantic_ai.toolsets import AbstractToolset, FunctionToolset
from pydantic_ai.toolsets.abstract import ToolsetTool
from pydantic_ai.toolsets.wrapper import WrapperToolset
from pydantic_core import to_jsonable_python

from effectlog.errors import (
    ApprovalRequired,
    BadInput,
    EffectlogError,
    IdempotencyConflict,
    NotApplied,
)
from effectlog.integrations.framework_steps import (
    IDEMPOTENCY_HEADER,
    PENDING,
    TOOL_KEY,
    PendingGateway,
    Send,
    check_names,
    effectlog_error,
    fixed_location,
    idempotency_key,
    jsonable_answer,
    open_store,
    reconciled_value,
    recorded_step,
    replayed_tool,
)
from effectlog.integrations.pydantic_ai_decisions import record_decisions
from effectlog.integrations.pydantic_ai_retry import retried
from effectlog.session import (
    ApprovalStep,
    Checkpointer,
    Decision,
    Policy,
    Reconciled,
    Session,
    ToolCall,
    ToolStep,
    allow_all,
)
from effectlog.session import identity as ids
from effectlog.session.durable import CrashHook

OutputT = TypeVar("OutputT")
DepsT = TypeVar("DepsT")

# Fields pydantic-ai sets afresh in every process (clock, per-run ids, accounting): left
# out of a model step's body, so a resumed pass asks for the same request with the same key.
VOLATILE_FIELDS = frozenset(
    {"timestamp", "run_id", "conversation_id", "history_digest", "usage", "model_id", "workspace_ref"}
)

MODEL_RETRY = "ModelRetry: "  # how a tool's ModelRetry is recorded (a failed step: nothing applied)
_PYDANTIC_AI = os.path.dirname(os.path.abspath(pydantic_ai.__file__)) + os.sep


def _timed_out(exc: ModelRetry) -> bool:
    """Whether ``exc`` is pydantic-ai's own ``timeout=`` ending the call (a tool's or a toolset's): raised in
    pydantic-ai while it handled the ``TimeoutError``. The tool ran and may have made its effect (a sync
    function keeps running on its thread), so that is an unknown outcome, not the tool refusing its args."""
    if not isinstance(exc.__context__, TimeoutError):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next  # the frame that raised it
    return tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(_PYDANTIC_AI)


def stable(value: Any) -> Any:
    """``value`` (JSON types) without the fields pydantic-ai sets afresh in each process."""
    if isinstance(value, dict):
        return {k: stable(v) for k, v in value.items() if k not in VOLATILE_FIELDS}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def _dump_response(response: ModelResponse) -> dict[str, Any]:
    return cast(dict[str, Any], ModelMessagesTypeAdapter.dump_python([response], mode="json")[0])


def _load_response(recorded: Any) -> ModelResponse:
    message = ModelMessagesTypeAdapter.validate_python([recorded["response"]])[0]
    assert isinstance(message, ModelResponse)
    return message


def _turn(messages: Sequence[ModelMessage]) -> int:
    """How many model responses the conversation holds: the place of the next request."""
    return sum(isinstance(m, ModelResponse) for m in messages)


class _Pass:
    """One ``DurableAgent.run``: its session, and what the wrappers learned during it."""

    def __init__(
        self, session: Session, *, needs_approval: frozenset[str], declared: frozenset[str], known: set[str]
    ) -> None:
        self.session = session
        self.needs_approval = set(needs_approval)  # grows with tools pydantic-ai marks requires_approval
        self.declared = declared  # every tool name the user declared idempotent or needing approval
        self.known: set[str] | None = known  # tool names the agent's function toolsets register
        self.error: EffectlogError | None = None
        self.held: ApprovalStep | None = None

    def check_declared(self, params: ModelRequestParameters) -> None:
        """A declared name no tool has is a typo, and a typo in needs_approval would run a call unheld."""
        if self.known is None:
            return
        offered = self.known | {t.name for t in params.function_tools}
        unknown = sorted(self.declared - offered)
        self.known = None  # checked once a pass, at its first model request
        if unknown:
            raise BadInput(
                f"DurableAgent declares tool(s) {', '.join(map(repr, unknown))} that the agent does not have "
                f"(it has: {', '.join(sorted(offered)) or 'none'}); nothing was run",
                run_id=self.session.run_id,
            )

    def policy(self, user: Policy) -> Policy:
        def decide(call: ToolCall) -> Decision:
            verdict = user(call)
            if verdict == "allow" and call.tool in self.needs_approval:
                return "require_approval"
            return verdict

        return decide

    async def model_step(
        self,
        messages: list[ModelMessage],
        settings: ModelSettings | None,
        params: ModelRequestParameters,
        model_name: str,
        send: Send,
    ) -> ModelResponse:
        self.check_declared(params)
        step_id = f"model-{_turn(messages)}"
        fields: dict[str, Any] = {
            "tools": stable(to_jsonable_python(params)),
            "settings": to_jsonable_python({k: v for k, v in (settings or {}).items() if k != "extra_headers"}),
        }
        history = stable(ModelMessagesTypeAdapter.dump_python(messages, mode="json"))
        if self.session.completed:
            step = recorded_step(self.session, step_id, "model", model_name, ids.fingerprint("model", model_name, None))
            body = ids.normalized({**fields, "model": model_name, "messages": history}, "the model request body")
            if step.args_digest != ids.body_digest(body):
                raise IdempotencyConflict(
                    "the completed run recorded another request at this step: a changed prompt, instructions "
                    "or tool list needs a new run id",
                    run_id=self.session.run_id,
                    step_id=step_id,
                )
            return _load_response(step.receipt)
        token = PENDING.set(send)
        try:
            recorded = await self.session.model_step(history, model=model_name, key=step_id, **fields)
        except EffectlogError as exc:
            self.error = exc
            raise
        finally:
            PENDING.reset(token)
        return _load_response(recorded.response)

    async def tool_step(
        self, name: str, args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any], send: Send
    ) -> Any:
        step_id = f"tool-{_turn(ctx.messages)}-{ctx.tool_call_id}"
        try:
            call_args = ids.normalized(to_jsonable_python(args), f"tool {name!r} args")
        except BadInput as exc:
            # The model's arguments have no journal form (a NaN, an infinity): nothing runs, the model is
            # told, on every pass alike (a function of the recorded response only).
            raise ModelRetry(exc.message) from None
        if self.session.completed:
            recorded = recorded_step(self.session, step_id, "tool", name, ids.fingerprint("tool", name, call_args))
            return self._outcome(replayed_tool(recorded, name, call_args))
        if self.held is not None:
            # The run waits on disk for an earlier call of this response: nothing runs past it in this
            # pass. The call is left to the pass that resumes after the decision (same step id then).
            raise CallDeferred(metadata={"effectlog": {"waits_for": self.held.step_id, "command": self.held.command}})
        token = PENDING.set(send)
        try:
            step = await self.session.tool_step(name, call_args, key=step_id)
        except EffectlogError as exc:
            self.error = exc
            raise
        finally:
            PENDING.reset(token)
        return self._outcome(step)

    def _outcome(self, step: ToolStep) -> Any:
        """What the model is told about a tool step: a function of the recorded outcome only."""
        if step.status == "ok":
            return step.result
        if step.status == "reconciled" and isinstance(step.result, Reconciled):
            return reconciled_value(step.result)
        if step.status == "failed":
            if step.reason.startswith(MODEL_RETRY):  # replayed too: the same retry prompt on every pass
                raise ModelRetry(step.reason.removeprefix(MODEL_RETRY))
            return f"failed, not applied: {step.reason}"
        if step.decision == "require_approval":
            self.held = approval = self.session.approval_for(step)
            raise DeferForApproval(
                metadata={
                    "effectlog": {
                        "run_id": approval.run_id,
                        "step_id": approval.step_id,
                        "tool_call_hash": approval.tool_call_hash,
                        "reason": approval.reason,
                        "command": approval.command,
                    }
                }
            )
        return f"denied: {step.reason}"


class DurableModel(WrapperModel):
    """The agent's model, each request a journaled model step (streamed requests too, delivered whole)."""

    def __init__(self, wrapped: Model | str, durable: _Pass) -> None:
        super().__init__(wrapped)
        self._durable = durable

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        async def send(key: str) -> dict[str, Any]:
            settings: dict[str, Any] = dict(model_settings or {})
            headers: dict[str, str] = dict(settings.get("extra_headers") or {})
            settings["extra_headers"] = {**headers, IDEMPOTENCY_HEADER: key}
            response = await retried(
                lambda: self.wrapped.request(messages, cast(ModelSettings, settings), model_request_parameters),
                f"model request to {self.wrapped.model_name!r}",
            )
            return {"response": _dump_response(response)}

        return await self._durable.model_step(
            messages, model_settings, model_request_parameters, self.wrapped.model_name, send
        )

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncIterator[StreamedResponse]:
        # A half-streamed answer cannot be recorded: the step is the whole response, then replayed as events.
        response = await self.request(messages, model_settings, model_request_parameters)
        yield CompletedStreamedResponse(response, model_request_parameters=model_request_parameters, replay_events=True)


@dataclasses.dataclass
class DurableToolset(WrapperToolset[Any]):
    """A toolset of the agent, each call a journaled tool step."""

    durable: _Pass = dataclasses.field(kw_only=True)

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        tools = await super().get_tools(ctx)
        for name, tool in tools.items():
            if tool.tool_def.kind == "unapproved":
                # pydantic-ai's requires_approval becomes effectlog's: held in the journal, bound to the
                # exact args, approved from the CLI while the app is not running.
                self.durable.needs_approval.add(name)
                tools[name] = dataclasses.replace(tool, tool_def=dataclasses.replace(tool.tool_def, kind="function"))
        return tools

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        async def send(key: str) -> Any:
            # Reached for a call needing approval only once the journal holds the approval.
            run_ctx = dataclasses.replace(ctx, tool_call_approved=True) if name in self.durable.needs_approval else ctx
            token = TOOL_KEY.set(key)
            try:
                result = await self.wrapped.call_tool(name, tool_args, run_ctx, tool)
            except ModelRetry as exc:  # the tool refused the args: nothing applied, the model is asked again
                if _timed_out(exc):  # not the tool's answer: pydantic-ai gave up waiting for it
                    raise TimeoutError(f"pydantic-ai ended the call: {exc.message}") from exc
                raise NotApplied(MODEL_RETRY + exc.message) from exc
            except (CallDeferred, DeferForApproval) as exc:
                raise NotApplied(
                    f"the tool raised pydantic-ai's {type(exc).__name__} itself; a durable call that needs a "
                    "person is declared with needs_approval= (or requires_approval=True)"
                ) from exc
            finally:
                TOOL_KEY.reset(token)
            return jsonable_answer(result, name)

        return await self.durable.tool_step(name, tool_args, ctx, tool, send)


def _check_history(store: Checkpointer, run_id: str, history: Sequence[ModelMessage]) -> None:
    """Refuse a history that holds answers this run recorded: pydantic-ai's continuation is not a resume.

    ``message_history=result.all_messages()`` would skip the recorded steps (and the journal
    would then refuse to finish); a durable run resumes from its journal instead.
    """
    turns = _turn(history)
    recorded = [
        s.step_id
        for s in store.state(run_id).ordered_steps()
        if s.step_id.startswith("model-") and s.step_id[6:].isdigit() and int(s.step_id[6:]) < turns
    ]
    if recorded:
        raise BadInput(
            f"message_history holds model responses this run recorded ({', '.join(recorded)}): a durable run "
            "resumes from its journal, so call run() again with the first pass's prompt and history "
            "(and deferred_tool_results to answer held calls); nothing was run",
            run_id=run_id,
        )


def _registered_names(toolsets: Sequence[AbstractToolset[Any]]) -> set[str]:
    """The names function toolsets register, offered to the model or not (a ``prepare`` may hide one)."""
    names: set[str] = set()

    def visit(toolset: AbstractToolset[Any]) -> None:
        if isinstance(toolset, FunctionToolset):
            names.update(toolset.tools)

    for toolset in toolsets:
        toolset.apply(visit)
    return names


class DurableAgent(Generic[DepsT, OutputT]):
    """A pydantic-ai ``Agent`` whose runs are effectlog sessions: ``await DurableAgent(agent, ...).run(p, run_id=...)``.

    ``idempotent``: the tools that may be called again with the same key after a crash
    (every other tool is not). ``needs_approval``: the tools held for a person's approval
    (tools pydantic-ai marks ``requires_approval`` are held too). ``journal``: a SQLite file
    path, a ``postgresql://`` URL, or any ``Checkpointer``. ``policy``: effectlog's policy hook.
    """

    def __init__(
        self,
        agent: Agent[DepsT, OutputT],
        *,
        journal: str | Path | Checkpointer,
        idempotent: Collection[str] = (),
        needs_approval: Collection[str] = (),
        policy: Policy | None = None,
        crash_hook: CrashHook | None = None,
    ) -> None:
        check_names("idempotent", idempotent)
        check_names("needs_approval", needs_approval)
        self.agent = agent
        self.journal = fixed_location(journal)  # a relative path is where it was when given
        self.idempotent = frozenset(idempotent)
        self.needs_approval = frozenset(needs_approval)
        self.policy = policy or allow_all
        self.crash_hook = crash_hook

    async def run(
        self,
        user_prompt: str | None = None,
        *,
        run_id: str,
        deps: DepsT = None,  # type: ignore[assignment]  # pydantic-ai's own default
        model: Model | str | None = None,
        message_history: Sequence[ModelMessage] | None = None,
        deferred_tool_results: DeferredToolResults | None = None,
        **kwargs: Any,
    ) -> AgentRunResult[Any]:
        """One pass of run ``run_id``: run it, or resume it from its journal, or replay it if completed.

        Returns pydantic-ai's result (its output is ``DeferredToolRequests`` when a tool call
        waits for approval and the output type allows it). Raises ``UncertainEffect``,
        ``ApprovalRequired`` and the other effectlog errors unwrapped.

        Resume by calling ``run`` again with the same prompt (and the same ``message_history``,
        if any): the journal replays what happened. ``deferred_tool_results`` answers held
        calls from the app: its approvals are written to the journal (see
        ``record_decisions``), then the run resumes from its prompt.
        """
        chosen = model if model is not None else self.agent.model
        if chosen is None:
            raise BadInput("the agent has no model: give one to Agent(...) or to run(model=...)")
        store, owned = open_store(self.journal)
        try:
            _check_history(store, run_id, message_history or ())
            if deferred_tool_results is not None:
                record_decisions(store, run_id, deferred_tool_results)
            inner = WrapperModel(chosen).wrapped
            gateway = PendingGateway(inner.model_name, self.idempotent)
            session = Session(run_id, gateway, store, crash_hook=self.crash_hook)
            given: list[AbstractToolset[Any]] = [*self.agent.toolsets, *(kwargs.pop("toolsets", None) or ())]
            durable = _Pass(
                session,
                needs_approval=self.needs_approval,
                declared=self.idempotent | self.needs_approval,
                known=_registered_names(given),
            )
            session.policy = durable.policy(self.policy)
            toolsets: list[AbstractToolset[Any]] = [DurableToolset(t, durable=durable) for t in given]
            try:
                with (
                    self.agent.override(model=DurableModel(inner, durable), toolsets=toolsets, tools=[]),
                    self.agent.parallel_tool_call_execution_mode("sequential"),
                ):
                    result: AgentRunResult[Any] = await self.agent.run(
                        user_prompt, deps=deps, message_history=message_history, **kwargs
                    )
            except Exception as exc:
                unwrapped = self._unwrapped(durable, exc)
                if unwrapped is None:
                    raise
                raise unwrapped from None
            finally:
                session.release()  # a pass that stopped early leaves the run to the next one
            if isinstance(result.output, DeferredToolRequests):
                return result  # held on disk: a person decides, a later pass resumes
            session.finish(to_jsonable_python(result.output))
            return result
        finally:
            if owned:
                store.close()

    def _unwrapped(self, durable: _Pass, exc: Exception) -> EffectlogError | None:
        found = durable.error or effectlog_error(exc)
        if found is not None:
            return found
        if durable.held is not None:  # the output type had no room for DeferredToolRequests
            held = durable.held
            return ApprovalRequired(
                f"tool {held.tool!r} waits for approval: {held.command}",
                run_id=held.run_id,
                step_id=held.step_id,
                tool_call_hash=held.tool_call_hash,
                command=held.command,
            )
        return None

    def run_sync(self, user_prompt: str | None = None, *, run_id: str, **kwargs: Any) -> AgentRunResult[Any]:
        """``run`` in a fresh event loop."""
        return asyncio.run(self.run(user_prompt, run_id=run_id, **kwargs))


__all__ = [
    "IDEMPOTENCY_HEADER",
    "DurableAgent",
    "DurableModel",
    "DurableToolset",
    "idempotency_key",
    "reconciled_value",
    "record_decisions",
]
