"""``Session``: one pass of an agent run, each model and tool step journaled.

A pass walks the run from its first step. A step the journal already holds returns
its recorded outcome without calling anything; the first step it does not hold runs
live. Which of the four write-ahead cases a step is in decides what happens:

- intent and result: skip, return the recorded result;
- neither: run it;
- intent only, tool not idempotent: record the doubt, stop, raise ``UncertainEffect``;
- intent only, idempotent tool or model call: run it again with the same key.

Step ids come from position (``step-0``, ``step-1``, ...) or from a key the caller
gives; a step whose kind, name or args differ from what the journal holds at that id
raises ``ReplayDivergence`` and nothing runs.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from effectlog import events as ev
from effectlog import spelling
from effectlog.errors import (
    ApprovalRequired,
    BadInput,
    DeadlinePassed,
    EventConflict,
    IdempotencyConflict,
    ModelRefused,
    ModelUnavailable,
    NotApplied,
    PlanMismatch,
    ReplayDivergence,
    RunClosed,
    RunFailed,
    RunIdAmbiguous,
    RunUnfinished,
    ToolDenied,
    UncertainEffect,
)
from effectlog.fold import RunState, StepState
from effectlog.journal.ownership import Claim
from effectlog.notify import Kind, Notification, Notifier, deliver, hooks_of, opened_location, shown_location
from effectlog.observe import provider_of, session_spans
from effectlog.recorder import Clock, EventSpec, prepare
from effectlog.recovery import Action, decide
from effectlog.session import identity as ids
from effectlog.session import timing
from effectlog.session.gateway import Gateway
from effectlog.session.steps import (
    ApprovalStep,
    ModelStep,
    Policy,
    ToolStep,
    allow_all,
)
from effectlog.session.store import Checkpointer
from effectlog.session.timing import Sleeper
from effectlog.session.tool_driver import CALLING, ToolDriver
from effectlog.stake import approve_command, reconcile_command

if TYPE_CHECKING:
    from effectlog.observe._telemetry import RunObserver

CrashHook = Callable[[str, str], None]  # (point, step_id): a test seam, like the runtime's


class Session:
    """One pass over the run ``run_id``: create a new ``Session`` to resume in another pass."""

    def __init__(
        self,
        run_id: str,
        gateway: Gateway,
        store: Checkpointer,
        *,
        policy: Policy | None = None,
        clock: Clock | None = None,
        crash_hook: CrashHook | None = None,
        replay_closed: bool = False,
        deadline: float | None = None,
        sleeper: Sleeper | None = None,
        notify: Notifier | Sequence[Notifier] | None = None,
    ) -> None:
        if not run_id:
            raise BadInput("a session needs a run id")
        self.run_id = run_id
        self.gateway = gateway
        self.store = store
        self.policy: Policy = policy or allow_all
        self.clock: Clock = clock or time.time_ns
        self.crash_hook = crash_hook
        # A completed run answers the tool steps it recorded (no call, no write) instead of refusing them:
        # a plain-Python block that runs again after its run completed gets the same values back.
        self.replay_closed = replay_closed
        # The run's deadline (a POSIX time): pinned by run.started when this pass starts the run; the
        # earlier of it and the pinned one applies. ``sleeper`` waits durable sleeps (a test injects one).
        self.deadline_ns = timing.to_ns(deadline)
        self.sleeper: Sleeper = sleeper or asyncio.sleep
        self.notify = hooks_of(notify)  # called once when this pass suspends or stops the run
        self._state: RunState = store.state(run_id)
        if self._state.seq and self._state.kind != "session":
            raise PlanMismatch(
                f"run {run_id!r} is a {self._state.kind} run, not a session; use another run id", run_id=run_id
            )
        if not self._state.seq:  # a new run: under an id nobody can tell from another's, it would run apart
            journal = getattr(store, "journal", None)
            refusal = spelling.new_id_refusal(run_id, "run id", journal.runs if journal is not None else tuple)
            if refusal is not None:
                raise RunIdAmbiguous(refusal, run_id=run_id)
        self._opened = False  # has this pass recorded run.started / run.resumed yet
        self._claim: Claim | None = None  # held from this pass's first write until the run waits or ends
        self._spans: RunObserver | None = None  # this pass's effectlog.run span when OpenTelemetry is configured
        self._spans_asked = False  # is telemetry on? asked once per pass (again after the run span ended)
        self._position = 0
        self._visited: set[str] = set()
        # Positional steps recorded before this pass, by fingerprint: a new step that is one of them under
        # another id (the code gave it a key) is that call again, not a new one.
        self._earlier: dict[str, list[str]] = {}
        for recorded in () if self._state.closed else self._state.steps.values():  # a closed run runs nothing new
            if ids.is_positional(recorded.step_id) and recorded.fingerprint:
                self._earlier.setdefault(recorded.fingerprint, []).append(recorded.step_id)
        # This pass's tool steps by fingerprint: the same call again while one of them has no outcome (its
        # call raised, its intent kept for a re-send with its key) would send it under a new key.
        self._in_pass: dict[str, list[str]] = {}
        self.model_calls = 0  # calls made in this pass, not replayed ones
        self.tool_calls = 0

    # -- the run as recorded ---------------------------------------------------------------

    @property
    def state(self) -> RunState:
        return self._state

    @property
    def closed(self) -> bool:
        return self._state.closed

    @property
    def completed(self) -> bool:
        return self._state.state == "completed"

    @property
    def result(self) -> Any:
        """The recorded result of a completed run (``None`` otherwise)."""
        return self._state.result

    # -- recording -------------------------------------------------------------------------

    def _record(self, *specs: EventSpec, ts: int | None = None) -> None:
        """Prepare (legality first, nothing written on error), then append one durable batch."""
        batch = list(specs)
        if not self._spans_asked:  # its traceparent goes in run.started/resumed: the next pass links to it
            self._spans_asked = True
            self._spans = session_spans(
                self.run_id,
                recorded_seq=self._state.seq,
                resumed_from=self._state.traceparent,
                step_of=lambda sid: self._state.step(sid),  # noqa: PLW0108 - read when called: _state is replaced
            )
        if not self._opened:  # every pass that writes records itself: the timeline shows each resume
            traced = self._spans.fields() if self._spans is not None else {}
            if self._state.seq == 0:
                batch.insert(0, (ev.RunStarted, {"kind": "session", "deadline": self.deadline_ns, **traced}))
            else:
                batch.insert(0, (ev.RunResumed, {"pid": os.getpid(), **traced}))
        events, new_state = prepare(self._state, batch, ts if ts is not None else self.clock())
        self._own()
        began = time.perf_counter()
        try:
            self.store.append(events)
        except BaseException as exc:
            if self._spans is not None:
                self._spans.failed(exc)
                self._spans, self._spans_asked = None, False
            self.release()
            raise
        self._state = new_state
        self._opened = True
        if self._spans is not None:
            self._spans.recorded(events, began)  # step spans open and close from what is now durable
        if new_state.closed or new_state.state in ("suspended", "stopped"):
            self.release()  # waits for a person (or is done): the pass drives it no more
        if self.notify:
            for event in events:
                if isinstance(event, ev.RunSuspended | ev.RunStopped):
                    deliver(self.notify, self._notification(event))

    def _notification(self, event: ev.RunSuspended | ev.RunStopped) -> Notification:
        # Sent to someone elsewhere: the journal by its absolute path (and no URL's password).
        opened = opened_location(getattr(self.store, "journal", None), self.store.location)
        location, sid = shown_location(opened), event.step_id
        if isinstance(event, ev.RunSuspended):
            step = self._state.step(sid)
            command = approve_command(
                location, self.run_id, sid, step.args_digest if step is not None else "", step.attempt if step else None
            )
        else:
            step = self._state.step(sid)
            command = reconcile_command(location, self.run_id, sid, step.attempt if step is not None else None)
        kind: Kind = "suspended" if isinstance(event, ev.RunSuspended) else "stopped"
        return Notification(
            kind=kind,
            run_id=self.run_id,
            step_id=sid,
            reason=event.reason,
            command=command,
            journal=location,
            seq=event.seq,
        )

    def _own(self) -> None:
        """Claim the run for this pass before its first write, and check nobody wrote it since it was read."""
        if self._claim is not None:
            return
        claim = self.store.claim(self.run_id)
        fresh = self.store.state(self.run_id)
        if fresh.seq != self._state.seq:
            self.store.release(claim)
            raise EventConflict(
                f"the run was written elsewhere since this pass read it (seq {self._state.seq} -> {fresh.seq}); "
                "start a new Session to resume it",
                run_id=self.run_id,
            )
        self._claim = claim

    def release(self) -> None:
        """Give the run up (after a pass that stopped early); a later write claims it again."""
        if self._claim is not None:
            self.store.release(self._claim)
            self._claim = None
        if self._spans is not None:  # the pass drives the run no more: its run span ends
            self._spans.ended(self._state.state, message=self._state.reason, step_id=self._state.blocked_step)
            self._spans, self._spans_asked = None, False

    def _crash_point(self, point: str, step_id: str) -> None:
        if self.crash_hook is not None:
            self.crash_hook(point, step_id)

    # -- step identity ---------------------------------------------------------------------

    def _check_not_inside_a_call(self, what: str) -> None:
        """A step asked for from inside one of this session's tool calls would be recorded after that call's
        intent and skipped with it by a resume, so a later step could take its id and its result."""
        if CALLING.get() is self:
            raise BadInput(
                f"{what} was asked of run {self.run_id!r} from inside one of its own tool calls: steps of a "
                "session never nest (make the call from the loop, before or after the tool)",
                run_id=self.run_id,
            )

    def _check_open(self, what: str) -> None:
        self._check_not_inside_a_call(what)
        state = self._state
        if state.state == "completed":
            raise RunClosed(
                f"{what} asked of a completed run; a closed run never reopens (its result is in the journal)",
                run_id=self.run_id,
            )
        if state.closed:
            blocked = state.step(state.blocked_step) if state.blocked_step else None
            failure = DeadlinePassed if blocked is not None and blocked.expired else RunFailed
            raise failure(
                f"the run is {state.state}" + (f": {state.reason}" if state.reason else ""),
                run_id=self.run_id,
                step_id=state.blocked_step,
            )
        if self._opened and state.state in ("suspended", "stopped"):
            # This pass held or stopped the run itself: nothing may run past the blocked step.
            error = ApprovalRequired if state.state == "suspended" else UncertainEffect
            raise error(
                f"{what} after this pass {state.state} the run on step {state.blocked_step!r}; "
                "a new pass resumes once a person has decided",
                run_id=self.run_id,
                step_id=state.blocked_step,
            )

    def _next_id(self, key: str | None, what: str) -> str:
        sid = ids.positional_id(self._position) if key is None else ids.keyed_id(key)
        # A new keyed step spelled as a recorded one would make that step's call again.
        if key is not None and self._state.step(sid) is None:
            refusal = spelling.new_id_refusal(sid, "step key", lambda: self._state.steps, must_be_nameable=False)
            if refusal is not None:
                raise BadInput(refusal, run_id=self.run_id, step_id=sid)
        if sid in self._visited:
            raise BadInput(f"step {sid!r} is used twice in one pass; step keys must be unique", run_id=self.run_id)
        if self._state.step(sid) is None:
            self._check_not_blocked(what)  # refused, the call takes no step id (a resume lines up)
        if key is None:
            self._position += 1
        self._visited.add(sid)
        return sid

    def _check_not_blocked(self, what: str) -> None:
        """A new step (or ``finish``) while the journal holds the run stopped on an uncertain step or held on
        one awaiting approval, nobody having decided it: nothing may run past that step, in any pass.

        The pass that stopped or held the run refuses what comes after (``_check_open``); a later pass reaches
        the blocked step, gets its ``UncertainEffect`` or ``ApprovalRequired``, and an application that
        catches it (any ``except Exception``) calls on: its next call would record ``run.resumed`` and run
        while the first effect is in doubt or was never approved (and leaving the block then completed the
        run without it). Steps the journal holds are still answered, so a pass can reach the blocked step."""
        state = self._state
        if state.state not in ("suspended", "stopped") or state.blocked_step is None:
            return
        blocked = state.step(state.blocked_step)
        if blocked is None or blocked.state not in ("uncertain", "awaiting_approval"):
            return  # decided since (reconciled, approved): this pass resumes the run
        location, sid = self.store.location, blocked.step_id
        if blocked.state == "uncertain":
            command = reconcile_command(location, self.run_id, sid, blocked.attempt)
            raise UncertainEffect(
                f"{what} while the run is stopped on step {sid!r}, whose outcome is unknown; nothing runs past "
                f"it until it is reconciled with evidence: {command}",
                run_id=self.run_id,
                step_id=sid,
                tool=blocked.adapter,
                command=command,
            )
        command = approve_command(location, self.run_id, sid, blocked.args_digest, blocked.attempt)
        raise ApprovalRequired(
            f"{what} while the run waits for approval of step {sid!r}; nothing runs past it until a person "
            f"decides: {command}",
            run_id=self.run_id,
            step_id=sid,
            tool_call_hash=blocked.args_digest,
            command=command,
        )

    def _check_not_moved(self, sid: str, kind: str, name: str, fp: str) -> None:
        """A step the journal does not hold, whose call a positional step recorded earlier made (same kind,
        name and args) and this pass has not reached yet: the code moved that call to another id (gave it a
        key), and running it would make its effect twice before ``finish`` noticed the unreached step."""
        if self._state.closed:
            return
        moved = [other for other in self._earlier.get(fp, ()) if other not in self._visited]
        if moved:
            raise ReplayDivergence(
                f"this pass asks for {kind} {name!r} as new step {sid!r}, and the journal recorded the same call "
                f"at {moved[0]!r}, which this pass has not reached: the call moved to another step id (a key "
                "given after it was recorded?); effectlog will not make it twice (keep its step id, or use a "
                "new run id)",
                run_id=self.run_id,
                step_id=moved[0],
                recorded=moved[0],
                requested=sid,
            )

    def _check_not_in_flight(self, sid: str, name: str, fp: str) -> None:
        """A new step making the same call (tool and args) as a step of this pass whose outcome is unknown:
        an idempotent call that raised keeps its intent, and the next pass sends it again with its key; the
        application retrying it here would send it under this step's new key, and a tool deduplicating by
        key would make the effect twice. Refused (``RunUnfinished``): the next pass settles the first."""
        for other in self._in_pass.get(fp, ()):
            step = self._state.step(other)
            if step is not None and step.state in ("requested", "effected"):
                raise RunUnfinished(
                    f"tool {name!r} with these args is step {other!r} of this pass, whose outcome is unknown (its "
                    f"call raised; its key is sent again when the run resumes); calling it again as new step "
                    f"{sid!r} would send it under another key and could make it twice: end this pass and run "
                    "it again (effectlog retries an idempotent call itself with retry=)",
                    run_id=self.run_id,
                    step_id=other,
                )

    def _check_same(self, step: StepState, kind: str, name: str, fp: str) -> None:
        if step.fingerprint == fp:
            return
        recorded = f"{step.kind} {step.adapter!r} (fingerprint {step.fingerprint[:12] or 'none'})"
        asked = f"{kind} {name!r} (fingerprint {fp[:12]})"
        raise ReplayDivergence(
            f"the journal recorded {recorded} at this step, this run asks for {asked}; "
            "effectlog will neither skip nor re-run a different step (use a new run id, or give steps keys)",
            run_id=self.run_id,
            step_id=step.step_id,
            recorded=recorded,
            requested=asked,
        )

    # -- model steps -----------------------------------------------------------------------

    async def model(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        key: str | None = None,
        deadline: float | None = None,
        **params: Any,
    ) -> dict[str, Any]:
        """One model call: the provider's answer (recorded, or fetched once with an idempotency key).

        ``deadline`` (a POSIX time): a call not begun by then fails (``DeadlinePassed``).
        """
        return (await self.model_step(messages, model=model, key=key, deadline=deadline, **params)).response

    async def model_step(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        key: str | None = None,
        deadline: float | None = None,
        **params: Any,
    ) -> ModelStep:
        self._check_open("a model call")
        name = model or self.gateway.model
        body: dict[str, Any] = {**params, "model": name, "messages": list(messages)}
        body = ids.normalized(body, "the model request body")
        body_digest = ids.body_digest(body)
        sid = self._next_id(key, "a model call")
        fp = ids.fingerprint("model", name, None)
        pkey = ids.provider_key(self.run_id, sid, body)
        step = self._state.step(sid)
        if step is not None:
            self._check_same(step, "model", name, fp)
            timing.raise_if_expired(self, step)
            self._check_body(step, body_digest)
        else:
            self._check_not_moved(sid, "model", name, fp)
        while True:
            step = self._state.step(sid)
            action = decide(step)
            if action is Action.SKIP:
                assert step is not None
                return ModelStep(step_id=sid, model=name, response=step.receipt, replayed=True)
            if action is Action.CONFIRM_RECORDED:
                assert step is not None
                self._record((ev.StepConfirmed, {"step_id": sid, "attempt": step.attempt, "rebuilt": True}))
                continue
            if action is Action.EXECUTE:
                timing.expire_if_late(self, sid, kind="model", name=name, fp=fp, deadline=timing.to_ns(deadline))
                self._crash_point("before_intent", sid)
                self._record(
                    (
                        ev.StepRequested,
                        {
                            "step_id": sid,
                            "adapter": name,
                            "kind": "model",
                            "idempotency_key": pkey,
                            "args_digest": body_digest,
                            "idempotent": True,
                            "fingerprint": fp,
                        },
                    )
                )
                self._crash_point("after_intent", sid)
            elif action is Action.RESEND:
                assert step is not None
                self._resend(step)
            else:
                assert step is not None
                raise RunFailed(f"the model step is {step.state}", run_id=self.run_id, step_id=sid)
            break
        self.model_calls += 1
        call = self.gateway.complete(body, idempotency_key=pkey)
        if self._spans is not None:  # a `chat {model}` span under the step's span, with the GenAI attributes
            call = self._spans.model(call, step_id=sid, model=name, key=pkey, provider=provider_of(self.gateway))
        try:
            response = await call
        except (ModelUnavailable, ModelRefused) as exc:  # the intent stays: the run is open, a new pass resends
            exc.run_id, exc.step_id = exc.run_id or self.run_id, exc.step_id or sid
            raise
        response = ids.normalized(response, f"the answer of model {name!r}")
        self._crash_point("after_call", sid)
        self._record(
            (ev.StepEffected, {"step_id": sid, "receipt": response}),
            (ev.StepConfirmed, {"step_id": sid}),
        )
        self._crash_point("after_result", sid)
        return ModelStep(step_id=sid, model=name, response=response)

    def _check_body(self, step: StepState, body_digest: str) -> None:
        if step.args_digest == body_digest:
            return
        raise IdempotencyConflict(
            f"the journal recorded this model call with body {step.args_digest[:16]} (key "
            f"{step.idempotency_key}); this pass sends body {body_digest[:16]}: a key names one request, "
            "so a changed task, changed instructions or another tool set need a new run id",
            run_id=self.run_id,
            step_id=step.step_id,
            recorded_body=step.args_digest,
            body=body_digest,
        )

    def check_first_request(
        self, messages: Sequence[Mapping[str, Any]], *, model: str | None = None, **params: Any
    ) -> None:
        """A completed run asked again: its first model call must be the one this pass would send.

        An open run compares each model call as it walks them; a completed run answers from
        its result without walking, so this compares the one request that carries the task,
        the instructions and the tool set. Raises ``IdempotencyConflict`` (another body) or
        ``ReplayDivergence`` (no such model call); nothing is written either way.
        """
        name = model or self.gateway.model
        body = ids.normalized({**params, "model": name, "messages": list(messages)}, "the model request body")
        sid = ids.positional_id(0)
        step = self._state.step(sid)
        if step is None:
            raise ReplayDivergence(
                f"the completed run recorded no model call at {sid}; this pass would start with one",
                run_id=self.run_id,
                step_id=sid,
            )
        self._check_same(step, "model", name, ids.fingerprint("model", name, None))
        self._check_body(step, ids.body_digest(body))

    def _resend(self, step: StepState) -> None:
        self._record(
            (
                ev.StepResent,
                {
                    "step_id": step.step_id,
                    "attempt": step.attempt,
                    "resend": step.resends + 1,
                    "reason": "resumed: intent without result; same key",
                },
            )
        )
        self._crash_point("after_resend", step.step_id)

    # -- tool steps ------------------------------------------------------------------------

    async def tool(
        self, name: str, args: Mapping[str, Any] | None = None, *, key: str | None = None, deadline: float | None = None
    ) -> Any:
        """One tool call: its result, recorded or produced now.

        Raises ``ToolDenied`` (a policy said no), ``ApprovalRequired`` (suspended until a
        person decides), ``NotApplied`` (the tool said it did nothing) and
        ``UncertainEffect`` (a non-idempotent call whose outcome is unknown) and
        ``DeadlinePassed`` (``deadline``, a POSIX time, or the run's passed before it began).
        """
        step = await self.tool_step(name, args, key=key, deadline=deadline)
        if step.status in ("ok", "reconciled"):
            return step.result
        if step.status == "failed":
            raise NotApplied(step.reason)
        if step.decision == "require_approval":
            approval = self.approval_for(step)
            raise ApprovalRequired(
                f"tool {name!r} waits for approval: {approval.command}",
                run_id=self.run_id,
                step_id=step.step_id,
                tool_call_hash=step.tool_call_hash,
                command=approval.command,
            )
        raise ToolDenied(f"tool {name!r} denied: {step.reason}", run_id=self.run_id, step_id=step.step_id)

    def _attempt_of(self, step_id: str) -> int | None:
        held = self._state.step(step_id)
        return held.attempt if held is not None else None

    def approval_for(self, step: ToolStep) -> ApprovalStep:
        """What a person is asked to approve for a held tool step."""
        return ApprovalStep(
            run_id=self.run_id,
            step_id=step.step_id,
            tool=step.tool,
            args=step.args,
            tool_call_hash=step.tool_call_hash,
            reason=step.reason,
            command=approve_command(
                self.store.location, self.run_id, step.step_id, step.tool_call_hash, self._attempt_of(step.step_id)
            ),
        )

    async def tool_step(
        self, name: str, args: Mapping[str, Any] | None = None, *, key: str | None = None, deadline: float | None = None
    ) -> ToolStep:
        """One tool call as a ``ToolStep`` (denied, held and failed calls are outcomes, not errors)."""
        replaying = self.replay_closed and self.completed
        if not replaying:
            self._check_open("a tool call")
        info = self.gateway.tool(name)
        what = f"tool {name!r} args"
        call_args: dict[str, Any] = ids.normalized(ids.finite(dict(args or {}), what), what)
        sid = self._next_id(key, "a tool call")
        fp = ids.fingerprint("tool", name, call_args)
        call_hash = ids.tool_call_hash(sid, name, call_args)
        step = self._state.step(sid)
        if step is not None:
            self._check_same(step, "tool", name, fp)
            timing.raise_if_expired(self, step)
        else:
            self._check_not_moved(sid, "tool", name, fp)
            try:
                self._check_not_in_flight(sid, name, fp)
            except RunUnfinished:
                # Refused, nothing recorded: the call takes no step id. An application that swallows the
                # refusal goes on to its next call, which must get the id a resume (no retry made) gives it.
                self._visited.discard(sid)
                if key is None:
                    self._position -= 1
                raise
        self._in_pass.setdefault(fp, []).append(sid)
        if replaying and decide(step) not in (Action.SKIP, Action.FAIL):
            self._check_open("a tool call")  # a step the completed run never finished: RunClosed
        step_deadline = timing.to_ns(deadline)
        driver = ToolDriver(self, info, sid, args=call_args, fp=fp, call_hash=call_hash, deadline=step_deadline)
        return await driver.drive()

    # -- durable sleep -----------------------------------------------------------------------

    async def sleep(self, seconds: float, *, key: str | None = None, sleeper: Sleeper | None = None) -> None:
        """Sleep ``seconds`` durably: the wake-up time is journaled; a resumed pass waits only the remainder."""
        delta = timing.seconds_ns(seconds, "sleep: seconds")
        await timing.sleep_step(self, lambda: self.clock() + delta, key, sleeper or self.sleeper)

    async def sleep_until(self, t: float, *, key: str | None = None, sleeper: Sleeper | None = None) -> None:
        """Sleep until the POSIX time ``t`` durably (a step, like ``sleep``)."""
        wake_at = timing.seconds_ns(t, "sleep_until: time")
        await timing.sleep_step(self, lambda: wake_at, key, sleeper or self.sleeper)

    # -- closing ---------------------------------------------------------------------------

    def finish(self, result: Any = None) -> Any:
        """Complete the run with ``result`` (a ``FinalStep``); a closed run is never reopened."""
        result = ids.normalized(result, "the run's result")
        state = self._state
        if state.state == "completed":
            if ids.canonical(state.result, "the recorded result") == ids.canonical(result, "the result"):
                return state.result
            raise RunClosed("the run is already completed with another result", run_id=self.run_id)
        self._check_open("finish")
        self._check_not_blocked("finish")
        self._check_all_visited()
        if self.unsettled:
            raise RunUnfinished(
                f"step(s) {', '.join(self.unsettled)} have no recorded outcome (a call that raised was caught?); "
                "completing would leave an effect unaccounted for: resume the run to settle them",
                run_id=self.run_id,
                step_id=self.unsettled[0],
            )
        self._record((ev.RunCompleted, {"result": result}))
        return result

    @property
    def unsettled(self) -> list[str]:
        """Steps requested whose outcome the journal does not hold yet (sent again, or reconciled, on resume)."""
        unsettled = ("requested", "effected", "uncertain", "sleeping")
        return [s.step_id for s in self._state.ordered_steps() if s.state in unsettled]

    def fail(self, reason: str) -> None:
        """Close the run as failed (for example: the agent gave up)."""
        if self._state.closed:
            self._check_open("fail")
        self._record((ev.RunFailed, {"reason": reason}))

    def _check_all_visited(self) -> None:
        unvisited = [s.step_id for s in self._state.ordered_steps() if s.step_id not in self._visited]
        if unvisited:
            raise ReplayDivergence(
                f"the journal recorded step(s) {', '.join(unvisited)} that this pass never reached; "
                "finishing would drop effects that happened",
                run_id=self.run_id,
                step_id=unvisited[0],
            )
