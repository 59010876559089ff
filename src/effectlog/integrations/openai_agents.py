"""OpenAI Agents SDK: each model response and each ``function_tool`` call of a run is a journaled step.

``await DurableRunner(journal=..., idempotent={...}, needs_approval={...}).run(agent, input, run_id=...)``
is ``Runner.run`` with an effectlog session under it. Like Temporal's and DBOS's contribs,
it works at the SDK's public seams: each agent of the run (the starting agent and the
``Agent`` handoffs) is cloned with its model behind ``DurableModel`` and each
``FunctionTool`` behind a wrapped ``on_invoke_tool``; models named by string go through
``RunConfig.model_provider``, wrapped the same way. Each ``run`` is one pass of the run
``run_id``; calling it again with the same input resumes from the journal:

- a model response is a model step ``model-N`` (N = the responses before it in this run).
  Its body (instructions, input items, settings, tools, handoffs, output schema) gives the
  provider idempotency key ``(run, step, body digest)``, sent as the ``Idempotency-Key``
  header through ``ModelSettings.extra_headers``; a later pass gets the recorded response;
- a tool call is a tool step ``tool-N-<call_id>`` (the call id comes from the recorded
  response). Whether a tool may be repeated after a crash is declared per tool (default: not).

A non-idempotent tool whose outcome is unknown raises ``UncertainEffect`` (unwrapped, not
in the SDK's ``UserError``). A tool that needs approval (``needs_approval=`` here, or the
SDK's own ``needs_approval`` on the tool) is held in the journal, bound to its exact args,
and surfaces as the SDK's interruption (``result.interruptions``): approve it from the CLI
(``DurableRunner.last_held`` has the command) or with ``RunState.approve`` and pass the
state back to ``run``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Collection
from pathlib import Path
from typing import Any

try:
    import agents  # noqa: F401 -- only to say what to install when it is missing
except ImportError as exc:  # pragma: no cover - the dev extra installs it
    raise ImportError(
        "effectlog.integrations.openai_agents needs the OpenAI Agents SDK: pip install 'effectlog[openai-agents]'"
    ) from exc

from agents import Agent, FunctionTool, Handoff, Model, ModelProvider, ModelSettings, RunConfig, Runner, RunResult
from agents import tool as agents_tool
from agents.exceptions import ModelBehaviorError
from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
from agents.run_context import RunContextWrapper
from agents.run_state import RunState
from agents.tool import resolve_function_tool_failure_error_function, set_function_tool_failure_error_function
from agents.tool_context import ToolContext
from agents.usage import Usage
from openai.types.responses import ResponseOutputItem
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from effectlog.canonical import canonical_json
from effectlog.errors import ApprovalRequired, BadInput, EffectlogError, IdempotencyConflict, NotApplied
from effectlog.integrations.framework_steps import (
    IDEMPOTENCY_HEADER,
    NESTED_RUN,
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
from effectlog.integrations.openai_agents_decisions import record_sdk_decisions
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

_OUTPUT_ITEMS: TypeAdapter[list[ResponseOutputItem]] = TypeAdapter(list[ResponseOutputItem])
_USAGE_FIELDS = ("requests", "input_tokens", "output_tokens", "total_tokens")


def _model_name(model: Model) -> str:
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else type(model).__name__


def _dump_response(response: ModelResponse) -> dict[str, Any]:
    return {
        "output": to_jsonable_python([item.model_dump(mode="json") for item in response.output]),
        "usage": {f: getattr(response.usage, f) for f in _USAGE_FIELDS},
        "response_id": response.response_id,
    }


def _load_response(recorded: Any) -> ModelResponse:
    """The response as recorded: live and resumed passes build the next request from the same items."""
    counts = {f: int(recorded.get("usage", {}).get(f, 0)) for f in _USAGE_FIELDS}
    usage = Usage(
        requests=counts["requests"],
        input_tokens=counts["input_tokens"],
        output_tokens=counts["output_tokens"],
        total_tokens=counts["total_tokens"],
    )
    return ModelResponse(
        output=_OUTPUT_ITEMS.validate_python(recorded["output"]),
        usage=usage,
        response_id=recorded.get("response_id"),
    )


def _tool_shape(tool: Any) -> dict[str, Any]:
    if isinstance(tool, FunctionTool):
        return {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.params_json_schema,
            "strict": tool.strict_json_schema,
        }
    return {"name": getattr(tool, "name", type(tool).__name__), "type": type(tool).__name__}


class _Pass:
    """One ``DurableRunner.run``: its session, and what the wrappers learned during it."""

    def __init__(self, session: Session, *, needs_approval: frozenset[str]) -> None:
        self.session = session
        self.needs_approval = needs_approval  # declared here; the SDK's own are held through record_holds
        self.responses = 0  # model responses so far in this pass: the place of the next request
        self.error: EffectlogError | None = None
        self.holds: list[tuple[str, str, dict[str, Any]]] = []  # (step id, tool, args) the SDK interrupted on
        self.holding = False
        self.lock = asyncio.Lock()  # the SDK runs a response's tool calls concurrently; the journal takes one at a time

    def policy(self, user: Policy) -> Policy:
        def decide(call: ToolCall) -> Decision:
            if self.holding:
                return "require_approval"
            verdict = user(call)
            if verdict == "allow" and call.tool in self.needs_approval:
                return "require_approval"
            return verdict

        return decide

    def tool_step_id(self, call_id: str) -> str:
        return f"tool-{self.responses}-{call_id}"

    async def model_step(self, name: str, fields: dict[str, Any], send: Send) -> ModelResponse:
        step_id = f"model-{self.responses}"
        self.responses += 1
        if self.session.completed:
            step = recorded_step(self.session, step_id, "model", name, ids.fingerprint("model", name, None))
            body = ids.normalized({**fields, "model": name, "messages": fields["input"]}, "the model request body")
            if step.args_digest != ids.body_digest(body):
                raise IdempotencyConflict(
                    "the completed run recorded another request at this step: a changed input, instructions "
                    "or tool list needs a new run id",
                    run_id=self.session.run_id,
                    step_id=step_id,
                )
            return _load_response(step.receipt)
        token = PENDING.set(send)
        try:
            recorded = await self.session.model_step(fields["input"], model=name, key=step_id, **fields)
        except EffectlogError as exc:
            self.error = exc
            raise
        finally:
            PENDING.reset(token)
        return _load_response(recorded.response)

    async def needs_hold(self, name: str, call_id: str, args: dict[str, Any]) -> bool:
        """Whether the SDK should interrupt on this call: only while the journal holds no decision for it."""
        if self.session.completed:
            return False
        sid = self.tool_step_id(call_id)
        step = self.session.state.step(sid)
        if step is not None and step.state != "awaiting_approval":
            return False  # approved (runs now), denied, or done: the tool step answers from the journal
        if all(sid != held for held, _, _ in self.holds):  # the SDK may ask more than once per call
            self.holds.append((sid, name, args))
        return True

    async def record_holds(self) -> list[ApprovalStep]:
        """Write the calls the SDK interrupted on into the journal, held for a person (one per pass)."""
        held: list[ApprovalStep] = []
        self.holding = True
        try:
            for sid, name, args in self.holds:
                try:
                    step = await self.session.tool_step(name, args, key=sid)
                except ApprovalRequired:
                    break  # the run already waits on an earlier call: the next pass holds this one
                if step.decision == "require_approval":
                    held.append(self.session.approval_for(step))
        finally:
            self.holding = False
        return held

    async def tool_step(self, name: str, call_id: str, args: dict[str, Any], send: Send) -> Any:
        sid = self.tool_step_id(call_id)
        call_args = ids.normalized(args, f"tool {name!r} args")
        async with self.lock:
            if self.session.completed:
                step = recorded_step(self.session, sid, "tool", name, ids.fingerprint("tool", name, call_args))
                return self._outcome(replayed_tool(step, name, call_args))
            token = PENDING.set(send)
            try:
                outcome = await self.session.tool_step(name, call_args, key=sid)
            except EffectlogError as exc:
                self.error = exc
                raise
            finally:
                PENDING.reset(token)
            return self._outcome(outcome)

    def _outcome(self, step: ToolStep) -> Any:
        """What the model is told about a tool step: a function of the recorded outcome only."""
        if step.status == "ok":
            return step.result
        if step.status == "reconciled" and isinstance(step.result, Reconciled):
            return reconciled_value(step.result)
        if step.status == "failed":
            return f"failed, not applied: {step.reason}"
        if step.decision == "require_approval":
            # Held by effectlog's policy hook (not a declared approval): no SDK interruption can be
            # raised from inside a tool, so the run stops with effectlog's own error.
            approval = self.session.approval_for(step)
            self.error = ApprovalRequired(
                f"tool {step.tool!r} waits for approval: {approval.command}",
                run_id=approval.run_id,
                step_id=approval.step_id,
                tool_call_hash=approval.tool_call_hash,
                command=approval.command,
            )
            raise self.error
        return f"denied: {step.reason}"


class DurableModel(Model):
    """The agent's model, each response a journaled model step (``stream_response`` is refused)."""

    def __init__(self, wrapped: Model, durable: _Pass) -> None:
        self.wrapped = wrapped
        self._durable = durable

    async def get_response(  # noqa: PLR0917 -- the SDK's Model signature
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        if model_settings.retry is not None:
            raise BadInput(
                "ModelSettings.retry re-asks a model step within one pass under the next step's number; "
                "a durable run retries by resuming (the same step, the same Idempotency-Key): leave it unset",
                run_id=self._durable.session.run_id,
            )

        async def respond(settings: ModelSettings) -> ModelResponse:
            return await self.wrapped.get_response(
                system_instructions,
                input,
                settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )

        if TOOL_KEY.get() is not None:
            # Made from inside a durable tool's call: an agent used as a tool (``Agent.as_tool`` runs it with
            # the outer run's RunConfig, so with this provider). Its calls are part of that tool step, which
            # a resume skips when recorded; as steps of their own they would shift the outer run's count.
            return await respond(model_settings)
        schema: Any = None
        if output_schema is not None and not output_schema.is_plain_text():
            schema = output_schema.json_schema()
        settings = {k: v for k, v in model_settings.to_json_dict().items() if k != "extra_headers" and v is not None}
        fields: dict[str, Any] = {
            "instructions": system_instructions,
            "input": to_jsonable_python([{"role": "user", "content": input}] if isinstance(input, str) else input),
            "settings": to_jsonable_python(settings),
            "tools": [_tool_shape(t) for t in tools],
            "handoffs": [{"name": h.tool_name, "parameters": h.input_json_schema} for h in handoffs],
            "output_schema": schema,
            "previous_response_id": previous_response_id,
            "conversation_id": conversation_id,
        }

        async def send(key: str) -> dict[str, Any]:
            headers = dict(model_settings.extra_headers or {})
            keyed = dataclasses.replace(model_settings, extra_headers={**headers, IDEMPOTENCY_HEADER: key})
            return _dump_response(await respond(keyed))

        return await self._durable.model_step(_model_name(self.wrapped), fields, send)

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise BadInput(
            "a durable run does not stream: a half-streamed response cannot be recorded as one step; "
            "use DurableRunner.run (Runner.run_streamed is not wrapped)",
            run_id=self._durable.session.run_id,
        )
        yield  # pragma: no cover - makes this an async generator, as the SDK expects

    async def close(self) -> None:
        await self.wrapped.close()


class DurableModelProvider(ModelProvider):
    """``RunConfig.model_provider``, its models wrapped: agents that name their model by string."""

    def __init__(self, wrapped: ModelProvider, durable: _Pass) -> None:
        self.wrapped = wrapped
        self._durable = durable

    def get_model(self, model_name: str | None) -> Model:
        return DurableModel(self.wrapped.get_model(model_name), self._durable)

    async def aclose(self) -> None:
        await self.wrapped.aclose()


_ARGS_REFUSED = "Invalid JSON input for tool"  # the SDK's ModelBehaviorError for arguments its schema refuses
_SDK_TOOL_FILE = agents_tool.__file__  # where the SDK parses and checks a call's arguments


def _refused_before_the_call(exc: ModelBehaviorError) -> bool:
    """Whether ``exc`` is the SDK's own argument check, raised before the tool's function ran: its text, and
    every frame it passed through below the invoker's call in the SDK's tool module. The same text from
    inside the function (another SDK tool or agent it drives, with no failure function) comes after its
    effect may have been made: that is an unknown outcome, not "not applied". Should the SDK move its
    check elsewhere, this says no: the call is uncertain (a stop and a reconcile), never sent twice."""
    if not str(exc).startswith(_ARGS_REFUSED):
        return False
    tb = exc.__traceback__
    tb = tb.tb_next if tb is not None else None  # (the first frame is durable_tool's own)
    if tb is None:
        return False
    while tb is not None:
        if tb.tb_frame.f_code.co_filename != _SDK_TOOL_FILE:
            return False
        tb = tb.tb_next
    return True


def durable_tool(tool: FunctionTool, durable: _Pass) -> FunctionTool:
    """``tool`` with each call a journaled step, and its approvals held in the journal.

    The call goes through a copy of ``tool`` without the SDK's ``failure_error_function`` (and the tool
    returned has none either: the SDK's runner uses it for a cancelled call), which turns
    the tool's exception into a message for the model inside the SDK's invoker: recorded as the call's
    result, a lost reply was a confirmed step, and the model's retry under a new call id made the effect
    twice. The exception reaches the step instead: an unknown outcome (uncertain; idempotent: sent again
    with its key), or ``NotApplied`` (the model is told "failed, not applied"), as are the SDK's own
    argument checks, which fail before the function runs."""
    raising = dataclasses.replace(tool)  # the SDK binds the copy's invoker to the copy
    set_function_tool_failure_error_function(raising, None)
    original_invoke = raising.on_invoke_tool
    original_approval = tool.needs_approval
    name = tool.name
    # The tool's timeout= applies inside its step: the SDK cancels the tool it holds from outside the step
    # and, by default, tells the model "timed out" while the step's outcome is unknown, so a resume (the
    # real result now) asked the next model step with another body, IdempotencyConflict on every pass.
    timeout = tool.timeout_seconds
    runs_an_agent = bool(getattr(tool, "_is_agent_tool", False))  # Agent.as_tool: its tools get no key

    async def invoke(ctx: ToolContext[Any], input_json: str) -> Any:
        args = _call_args(name, input_json)
        if isinstance(args, str):
            return args  # what the model is told: a function of its own answer, so every pass tells it alike

        async def send(key: str) -> Any:
            token = TOOL_KEY.set(NESTED_RUN if runs_an_agent else key)
            try:
                call = original_invoke(ctx, input_json)
                result = await (call if timeout is None else asyncio.wait_for(call, timeout))
            except TimeoutError as exc:
                raise TimeoutError(f"tool {name!r} did not answer within its timeout of {timeout} s") from exc
            except ModelBehaviorError as exc:
                if _refused_before_the_call(exc):  # the SDK's argument check: the function never ran
                    raise NotApplied(str(exc)) from exc
                raise
            finally:
                TOOL_KEY.reset(token)
            return jsonable_answer(result, name)

        return await durable.tool_step(name, ctx.tool_call_id, args, send)

    async def needs_approval(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
        if callable(original_approval):
            if not await original_approval(ctx, params, call_id):
                return False
        elif not original_approval and name not in durable.needs_approval:
            return False
        return await durable.needs_hold(name, call_id, ids.normalized(params, f"tool {name!r} args"))

    if original_approval is False and name not in durable.needs_approval:
        # Never held: leave the SDK's False. A function here makes the SDK hold any call whose arguments
        # it cannot parse (it fails closed) for an approval the journal would never hear of.
        wrapped = dataclasses.replace(tool, on_invoke_tool=invoke, timeout_seconds=None)
    else:
        wrapped = dataclasses.replace(tool, on_invoke_tool=invoke, needs_approval=needs_approval, timeout_seconds=None)
    # The SDK's runner asks the tool it holds for its failure function too, for a CancelledError out of
    # the invoker: the model was told "An error occurred" while the step's outcome was unknown, that
    # answer was recorded as the next model step, and a resume (the real result now) asked it with
    # another body, IdempotencyConflict on every pass. Without one the cancellation ends the pass.
    return set_function_tool_failure_error_function(wrapped, None)


def _call_args(name: str, input_json: str) -> dict[str, Any] | str:
    """The call's arguments, or what the model is told when they have no journal form: not JSON, not an
    object, or holding NaN or an infinity (``json.loads`` takes them; the journal would record null)."""
    try:
        args = json.loads(input_json or "{}")
    except ValueError as exc:
        return f"error: tool {name!r} was not run: its arguments are not JSON ({exc})"
    if not isinstance(args, dict):
        return f"error: tool {name!r} was not run: its arguments are not a JSON object"
    try:  # NaN or an infinity (json.loads takes them; the journal would record null), or a lone surrogate
        canonical_json(args, "arguments")
    except BadInput as exc:
        return f"error: tool {name!r} was not run: {exc.message}"
    return args


# The pass's clones by their original's id, each with its original: held, that id is not another agent's
# while the pass lasts (a handoff that builds its target anew let the next one take a freed target's id
# and be handed that target's clone).
Clones = dict[int, tuple[Agent[Any], Agent[Any]]]


def _durable_agent(agent: Agent[Any], durable: _Pass, done: Clones) -> Agent[Any]:
    """A clone of ``agent`` (and of its ``Agent`` handoffs) with a durable model and durable function tools."""
    found = done.get(id(agent))
    if found is not None and found[0] is agent:
        return found[1]
    clone = agent.clone()
    done[id(agent)] = (agent, clone)
    changes: dict[str, Any] = {
        "tools": [durable_tool(t, durable) if isinstance(t, FunctionTool) else t for t in agent.tools],
        "handoffs": [_durable_handoff(h, durable, done) for h in agent.handoffs],
    }
    if isinstance(agent.model, Model):
        changes["model"] = DurableModel(agent.model, durable)
    for key, value in changes.items():
        setattr(clone, key, value)
    return clone


def _durable_handoff(given: Any, durable: _Pass, done: Clones) -> Any:
    """A handoff whose target agent is durable: an ``Agent`` cloned as ``_durable_agent`` does, and a
    ``handoff(...)`` object (a description, an input filter, a callback) copied with its invocation's agent
    replaced by that clone. Its target is cloned now when the object names it (``handoff(agent)`` does), so
    the pass's checks see its tools; an agent only its invocation returns is cloned when it is returned."""
    if isinstance(given, Agent):
        return _durable_agent(given, durable, done)
    if not isinstance(given, Handoff):
        return given
    target = _handoff_target(given)
    if target is not None:
        _durable_agent(target, durable, done)
    invoke = given.on_invoke_handoff

    async def on_invoke(ctx: RunContextWrapper[Any], arguments: str) -> Any:
        found = await invoke(ctx, arguments)
        return _durable_agent(found, durable, done) if isinstance(found, Agent) else found

    copy = dataclasses.replace(given, on_invoke_handoff=on_invoke)
    copy._agent_ref = given._agent_ref  # not an init field: replace() leaves it unset
    return copy


def _handoff_target(given: Any) -> Agent[Any] | None:
    """The agent a handoff hands to, when it is known before it is invoked."""
    if isinstance(given, Agent):
        return given
    ref = given._agent_ref if isinstance(given, Handoff) else None
    target = ref() if ref is not None else None
    return target if isinstance(target, Agent) else None


def _converts_errors(tool: FunctionTool) -> bool:
    """Whether the SDK turns ``tool``'s exception into a message for the model (its failure function)."""
    invoker = tool.on_invoke_tool
    return callable(getattr(invoker, "__agents_bind_function_tool__", None)) and (
        resolve_function_tool_failure_error_function(tool, None) is not None
    )


def _inner_agents(agent: Agent[Any]) -> list[tuple[str, Agent[Any]]]:
    """The agents ``agent`` runs as tools (``Agent.as_tool``), by tool name."""
    found: list[tuple[str, Agent[Any]]] = []
    for tool in agent.tools:
        inner = getattr(tool, "_agent_instance", None)
        if isinstance(tool, FunctionTool) and getattr(tool, "_is_agent_tool", False) and isinstance(inner, Agent):
            found.append((tool.name, inner))
    return found


def _check_agent_tools(run_id: str, agents: Collection[Agent[Any]]) -> None:
    """An agent used as a tool runs, as given, inside one tool step: its own tools are not journaled, and
    the SDK's failure function turns their exceptions into a message for its model, which retries a call
    whose outcome is unknown (a charge whose reply was lost made twice, the run completed). Such a tool
    must let its exception out (``failure_error_function=None``): the outer step's outcome is then unknown."""
    todo = [(name, inner) for agent in agents for name, inner in _inner_agents(agent)]
    seen: set[int] = set()
    while todo:
        outer, inner = todo.pop()
        if id(inner) in seen:
            continue
        seen.add(id(inner))
        for tool in inner.tools:
            if isinstance(tool, FunctionTool) and _converts_errors(tool):
                raise BadInput(
                    f"tool {outer!r} runs agent {inner.name!r}, whose tool {tool.name!r} turns its exceptions into "
                    "a message for that agent's model (the SDK's failure_error_function): inside the one step of "
                    f"{outer!r} the model would retry a call whose outcome is unknown, unjournaled; build "
                    f"{tool.name!r} with failure_error_function=None (its exception then makes {outer!r}'s outcome "
                    "unknown); nothing was run",
                    run_id=run_id,
                )
        todo.extend((outer, agent) for _, agent in _inner_agents(inner))
        todo.extend((outer, h) for h in map(_handoff_target, inner.handoffs) if h is not None)


class DurableRunner:
    """``Runner.run`` whose runs are effectlog sessions: ``await DurableRunner(...).run(agent, input, run_id=...)``.

    ``idempotent``: the tools that may be called again with the same key after a crash
    (every other tool is not). ``needs_approval``: the tools held for a person's approval
    (tools with the SDK's ``needs_approval`` are held too). ``journal``: a SQLite file path,
    a ``postgresql://`` URL, or any ``Checkpointer``. ``policy``: effectlog's policy hook.
    """

    def __init__(
        self,
        *,
        journal: str | Path | Checkpointer,
        idempotent: Collection[str] = (),
        needs_approval: Collection[str] = (),
        policy: Policy | None = None,
        crash_hook: CrashHook | None = None,
    ) -> None:
        check_names("idempotent", idempotent)
        check_names("needs_approval", needs_approval)
        self.journal = fixed_location(journal)  # a relative path is where it was when given
        self.idempotent = frozenset(idempotent)
        self.needs_approval = frozenset(needs_approval)
        self.policy = policy or allow_all
        self.crash_hook = crash_hook
        self.last_held: list[ApprovalStep] = []  # what the last pass left waiting for a person

    async def run(
        self,
        starting_agent: Agent[Any],
        input: str | list[TResponseInputItem] | RunState[Any],
        *,
        run_id: str,
        run_config: RunConfig | None = None,
        **kwargs: Any,
    ) -> RunResult:
        """One pass of run ``run_id``: run it, resume it from its journal, or replay it if completed.

        Returns the SDK's ``RunResult`` (its ``interruptions`` list the calls held for approval;
        ``last_held`` has effectlog's approve commands for them). Raises ``UncertainEffect``,
        ``ApprovalRequired`` and the other effectlog errors unwrapped. Resume by calling ``run``
        again with the same input, or with the ``RunState`` of an interrupted result after
        ``state.approve(...)``/``state.reject(...)``: its decisions are written to the journal,
        then the run resumes from its original input.
        """
        for name in ("previous_response_id", "conversation_id", "session"):
            if kwargs.get(name) is not None:
                raise BadInput(
                    f"{name}= keeps the conversation outside the journal; a durable run resumes from its journal",
                    run_id=run_id,
                )
        store, owned = open_store(self.journal)
        self.last_held = []
        try:
            if isinstance(input, RunState):
                record_sdk_decisions(store, run_id, input)
                input = input._original_input
            session = Session(
                run_id, PendingGateway("openai-agents", self.idempotent), store, crash_hook=self.crash_hook
            )
            durable = _Pass(session, needs_approval=self.needs_approval)
            session.policy = durable.policy(self.policy)
            config = run_config or RunConfig()
            model = DurableModel(config.model, durable) if isinstance(config.model, Model) else config.model
            config = dataclasses.replace(
                config, model=model, model_provider=DurableModelProvider(config.model_provider, durable)
            )
            cloned: Clones = {}
            agent = _durable_agent(starting_agent, durable, cloned)
            clones = [clone for _, clone in cloned.values()]
            self._check_declared(run_id, clones)
            _check_agent_tools(run_id, clones)
            try:
                result = await Runner.run(agent, input, run_config=config, **kwargs)
                if result.interruptions:
                    self.last_held = await durable.record_holds()
            except Exception as exc:
                found = durable.error or effectlog_error(exc)
                if found is None:
                    raise
                raise found from None
            finally:
                session.release()  # a pass that stopped early leaves the run to the next one
            if result.interruptions:
                return result  # held on disk: a person decides, a later pass resumes
            session.finish(to_jsonable_python(result.final_output))
            return result
        finally:
            if owned:
                store.close()

    def _check_declared(self, run_id: str, agents: Collection[Agent[Any]]) -> None:
        """A declared name no tool has is a typo, and a typo in needs_approval would run a call unheld."""
        known = {t.name for a in agents for t in a.tools if isinstance(t, FunctionTool)}
        unknown = sorted((self.idempotent | self.needs_approval) - known)
        if unknown:
            raise BadInput(
                f"DurableRunner declares tool(s) {', '.join(map(repr, unknown))} that the agents do not have "
                f"(they have: {', '.join(sorted(known)) or 'none'}); nothing was run",
                run_id=run_id,
            )

    def run_sync(
        self,
        starting_agent: Agent[Any],
        input: str | list[TResponseInputItem] | RunState[Any],
        *,
        run_id: str,
        **kwargs: Any,
    ) -> RunResult:
        """``run`` in a fresh event loop."""
        return asyncio.run(self.run(starting_agent, input, run_id=run_id, **kwargs))


__all__ = [
    "IDEMPOTENCY_HEADER",
    "DurableModel",
    "DurableModelProvider",
    "DurableRunner",
    "durable_tool",
    "idempotency_key",
    "reconciled_value",
    "record_sdk_decisions",
]
