"""The run actor: owns one run's state and drives its steps in order.

Per step: ``step.requested`` is durable before the adapter is invoked (commit 1);
the receipt and confirmation are durable before the run advances (commit 2). The
actor decides with ``recovery.decide`` from recorded state alone, builds events
as ``recorder.prepare`` does (inline in ``_record``: the fold checks them before
anything is written) and hands batches to the shared journal-writer actor.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, cast

import immutables
import msgspec

from effectlog import events as ev
from effectlog import loopfork, toolguard
from effectlog.adapters.protocol import Receipt, Request, idempotency_key
from effectlog.canonical import digest
from effectlog.errors import (
    DescriptorsClosed,
    IdempotencyConflict,
    LedgerMismatch,
    NotApplied,
    PlanMismatch,
    StoreWalLost,
    ToolAborted,
    UnusableResult,
    describe,
    printable,
    tool_ending,
)
from effectlog.fold import CLOSED_STATES, DONE_STATES, StepState, apply, apply_receipt
from effectlog.journal import checkpoint, load_closed, resume_point
from effectlog.journal.frontier import Tracker, is_done
from effectlog.observe import run_observer
from effectlog.outcome import (
    Decision,
    PolicyRequest,
    RunOutcome,
    SimulatedCrash,
    StepSummary,
    outcome_of,
    reconcile_hint,
)
from effectlog.plan import Plan, StepDecl, args_digest, own_copy, redact
from effectlog.recordable import as_recorded
from effectlog.recorder import EventSpec
from effectlog.recovery import Action, decide, still_blocked
from effectlog.seal import seal_row
from effectlog.stake import approve_command

if TYPE_CHECKING:
    from effectlog.runtime import Runtime


# A ``_segment_seq`` no run reaches: no batch is due a checkpoint segment after it (``_record``).
_NO_MORE_SEGMENTS = sys.maxsize


class RunActor:
    """Owns one run: its state, its adapters, the order of its steps."""

    def __init__(self, runtime: Runtime, plan: Plan) -> None:
        self.rt = runtime
        self.plan = plan
        self.adapters, self.identities, self.store_users = runtime.registry.build(plan, runtime.context)
        # A closed run is reported from its seal (no step states built); an open one resumes.
        closed = load_closed(runtime.journal, plan.run_id)
        self._closed_steps: Sequence[StepSummary] | None = None
        self._segment_seq, self._changed = 0, set[str]()  # the run's last checkpoint segment, steps changed since
        self._tracker: Tracker | None = None  # the frontier its segments carry (journal/frontier.py)
        self._skip = 0  # the plan's first steps known done: the walk starts after them
        if closed is not None:
            self.state, self._closed_steps = closed
        else:
            # An open run: its last checkpoint segment plus the events after it (journal/frontier.py).
            point = resume_point(runtime.journal, plan.run_id, plan)
            self.state, self._segment_seq, self._changed = point.state, point.segment_seq, point.touched
            self._tracker, self._skip = point.tracker, point.skip
        # Why a step requested before this process sends its key again, when not a crash (a fork's
        # step of unknown outcome in its parent: lifecycle/fork.py); read once.
        self.first_sends: dict[str, str] = {}
        self.events_written = 0
        self.adapter_calls = 0
        # Spans, metrics, log records (docs/observability.md): None unless an OpenTelemetry SDK is
        # configured or the effectlog.run logger is enabled for INFO; decided once per drive.
        # step_of reads self.state when called: the state is replaced at every batch.
        self.obs = run_observer(plan.run_id, step_of=lambda sid: self.state.step(sid))  # noqa: PLW0108

    # -- recording --------------------------------------------------------------------

    async def _record(self, *specs: EventSpec) -> None:
        """Record the events ``specs`` describe (``recorder.prepare``'s shape: each event's class and fields
        but its run id, seq and time), built here and checked by the fold before anything is written."""
        state, ts = self.state, self.rt.clock()
        run_id, seq = state.run_id, state.seq
        await self._append(
            tuple(cls(run_id=run_id, seq=seq + i, ts=ts, **fields) for i, (cls, fields) in enumerate(specs, 1))
        )

    async def _append(self, events: tuple[ev.Event, ...]) -> None:
        """Check ``events`` (the run's next ones, built by the caller) with the fold, then write them as one batch.

        The per-step path builds its events itself with keyword arguments (``_drive_step``, ``_invoke``):
        ``cls(**fields)`` from a spec's dict cost ~4k instructions an event more (the dict built, merged
        into the call's keywords and unpacked again), three events per step."""
        rt = self.rt
        writer = rt.writer
        new_state, changed = self.state, self._changed
        if len(events) == 2 and type(events[0]) is ev.StepEffected and type(events[1]) is ev.StepConfirmed:
            # A step's receipt and confirmation (its happy path): the fold's checks of both, one new run state.
            effected, confirmed = cast("tuple[ev.StepEffected, ev.StepConfirmed]", events)
            new_state = apply_receipt(new_state, effected, confirmed)
            changed.add(effected.step_id)
            changed.add(confirmed.step_id)
        else:
            for event in events:
                new_state = apply(new_state, event)
                if isinstance(event, ev.StepEvent):
                    changed.add(event.step_id)
        # The batch that closes a run carries its seal, in the same transaction.
        closed = new_state.state in CLOSED_STATES  # (``RunState.closed``, without its frame: twice per step)
        seal = seal_row(new_state) if writer.sealing and closed else None
        # Every checkpoint.EVERY_EVENTS events an open run's batch carries a checkpoint segment.
        segment, tracker = None, self._tracker
        every = checkpoint.EVERY_EVENTS  # (``checkpoint.due``, inline, its cheapest test first)
        if writer.checkpointing and every > 0 and new_state.seq - self._segment_seq >= every and not closed:
            front = None
            if tracker is not None and new_state.kind == "plan":
                tracker, front = tracker.advance(new_state, changed)
            try:
                segment = checkpoint.segment_row(new_state, changed, front)
            except OverflowError:
                # A step changed since the last segment holds an int msgpack cannot (past 64 bits: canonical
                # JSON, so the events, hold it, as 10**21 wei): no segment can carry it, and raising here lost
                # the receipt of a tool that had run. A segment is derived data: the batch is recorded without
                # one, and this drive writes no more (each would carry that step); a resume replays the events
                # after the last segment written.
                self._segment_seq = _NO_MORE_SEGMENTS
        began = time.perf_counter() if self.obs is not None else 0.0
        # A group's batch (other runs active: ``enqueue`` then always queues it): its future, awaited here, without
        # first asking ``append_alone``, which would decline it; else a lone run's commit without a coroutine.
        queued = writer.enqueue(events, seal, segment) if writer.active_runs > 1 else None
        if queued is not None:
            await queued
        elif writer.append_alone(events, seal, segment) is None:
            queued = writer.enqueue(events, seal, segment)
            if queued is not None:
                await queued
            else:
                await writer.append(events, seal, segment)
        if segment is not None:
            self._segment_seq, self._changed, self._tracker = new_state.seq, set(), tracker
        self.state = new_state
        self.events_written += len(events)
        if self.obs is not None:
            self.obs.recorded(events, began)
        trace = rt.trace
        if trace is not None:
            for event in events:
                trace.record(event)
            trace.flush()

    def _crash_point(self, point: str, step_id: str) -> None:
        if self.rt.crash_hook is not None:
            self.rt.crash_hook(point, step_id)

    def _outcome(self, message: str = "") -> RunOutcome:
        return outcome_of(
            self.state,
            message,
            events_written=self.events_written,
            adapter_calls=self.adapter_calls,
            steps=self._closed_steps,
        )

    # -- the run ----------------------------------------------------------------------

    def drive(self) -> Coroutine[Any, Any, RunOutcome]:
        """The run, to await: ``_drive`` itself when nothing observes it (no frame of this method's
        to resume each time a commit wakes the run), else within the observer's span."""
        if self.obs is None:
            return self._drive()
        return self._observed()

    async def _observed(self) -> RunOutcome:
        assert self.obs is not None
        outcome: RunOutcome = await self.obs.drive(
            self._drive, recorded_seq=self.state.seq, resumed_from=self.state.traceparent
        )
        return outcome

    async def _drive(self) -> RunOutcome:
        plan = self.plan
        if self.state.seq == 0:
            await self._record(
                (
                    ev.RunStarted,
                    {
                        "plan": plan.pinned(),
                        "plan_digest": plan.digest,
                        "adapters": self.identities,
                        "effect_store": self.rt.context.store_to_pin(),
                        "store_adapters": self.store_users,
                        **(self.obs.fields() if self.obs is not None else {}),
                    },
                )
            )
        else:
            self._check_pinned()
            if self.state.closed:
                return self._outcome()  # a closed run never reopens: nothing runs, nothing is written
            blocked = still_blocked(self.state)
            if blocked is not None:
                return self._blocked_outcome(blocked, self.state.blocked_step or "")
            # A run that pinned no store (it started without one) pins the one this resume was given:
            # a later resume with another store is refused as for any pinned run.
            pin = self.rt.context.store_to_pin() if self.state.effect_store is None else None
            await self._record(
                (
                    ev.RunResumed,
                    {
                        "pid": os.getpid(),
                        **({"effect_store": pin} if pin is not None else {}),
                        **(self.obs.fields() if self.obs else {}),
                    },
                )
            )
        decls = plan.steps
        # The plan's first ``_skip`` steps are done (confirmed or reconciled, terminal): skipped unread.
        for i in range(self._skip, len(decls)):
            decl = decls[i]
            if self.rt.stop_signal is not None:
                return self._interrupted(self.rt.stop_signal)
            steps = self.state.steps
            if type(steps) is immutables.Map:  # (``is_done``, inline for a loaded map: once per step)
                done = steps.get(decl.id)
                if done is not None and done.state in DONE_STATES:
                    continue
            elif is_done(steps, decl.id):
                continue  # decide() would SKIP it: what _drive_step would do, without a coroutine per finished step
            stop = await self._drive_step(decl)
            if stop is not None:
                return stop
        await self._record((ev.RunCompleted, {}))
        return self._outcome()

    def _interrupted(self, signum: int) -> RunOutcome:
        """Stopped on request between steps: nothing is in flight, the run stays open and resumable."""
        name = _signal_name(signum)
        message = (
            f"run {self.plan.run_id} interrupted by {name} after its last durable commit; "
            "run the same plan again to resume it"
        )
        return msgspec.structs.replace(self._outcome(message), exit_status=128 + signum)

    def _check_pinned(self) -> None:
        recorded, plan = self.state, self.plan
        if recorded.plan_digest != plan.digest:
            raise PlanMismatch(
                f"run id reused with a different plan (journal has plan {recorded.plan_digest[:12]}, "
                f"given {plan.digest[:12]}); use a new run id",
                run_id=plan.run_id,
            )
        for name in sorted(set(recorded.adapters) | set(self.identities)):
            old, new = recorded.adapters.get(name), self.identities.get(name)
            if old != new:
                diffs = (
                    [
                        f"{f}: {getattr(old, f)!r} -> {getattr(new, f)!r}"
                        for f in old.__struct_fields__
                        if getattr(old, f) != getattr(new, f)
                    ]
                    if old is not None and new is not None
                    else ["added or removed"]
                )
                upgrade = (
                    old is not None
                    and new is not None
                    and (old.type, old.version, old.idempotent) == (new.type, new.version, new.idempotent)
                )
                hint = (
                    "; if its implementation was upgraded on purpose, accept it for this run: effectlog repin "
                    f"--journal {self.rt.journal.location} --run-id {plan.run_id} --by NAME --reason TEXT"
                    if upgrade
                    else ""
                )
                raise PlanMismatch(
                    f"adapter {name!r} differs from the one pinned by the run ({'; '.join(diffs)}){hint}",
                    run_id=plan.run_id,
                )
        refuse_other_store(recorded.effect_store, self.rt.context.store_to_pin(), run_id=plan.run_id)

    def _blocked_outcome(self, action: Action, step_id: str, why: str = "") -> RunOutcome:
        if action is Action.STOP_UNCERTAIN:
            step = self.state.step(step_id)
            attempt = step.attempt if step is not None else None
            return self._outcome(
                f"run {self.plan.run_id} stopped: step {step_id!r} was requested and its outcome is unknown"
                + (f" ({why})" if why else "")
                + "; "
                "its tool is not idempotent, so effectlog will not guess. Reconcile it with evidence: "
                + reconcile_hint(self.rt.journal.location, self.plan.run_id, step_id, attempt)
            )
        held = self.state.step(step_id)
        command = approve_command(
            self.rt.journal.location,
            self.plan.run_id,
            step_id,
            attempt=held.attempt if held else None,
            verb="approve|deny",
        )
        return self._outcome(f"run {self.plan.run_id} suspended: step {step_id!r} waits for approval ({command})")

    async def _drive_step(self, decl: StepDecl) -> RunOutcome | None:
        sid = decl.id
        while True:
            step = self.state.steps.get(sid)  # (``RunState.step``, without its frame: once per step)
            action = Action.EXECUTE if step is None else decide(step)  # (decide's first answer, inline)
            if action is Action.SKIP:
                return None
            if action is Action.EXECUTE:
                # (``_gate_may_hold``, inline for a step never requested: no policy, no approval asked for)
                if step is not None or self.rt.policy is not None or decl.approval == "required":
                    may_hold = self._gate_may_hold(decl, step)
                else:
                    may_hold = False
                if may_hold:
                    held = await self._policy_gate(decl)
                    if held is not None:
                        return held
                if step is not None and step.state == "approved":
                    self._crash_point("after_approval", sid)
                attempt = step.attempt if step is not None else 1
                if step is not None and step.outcome == "not_applied":
                    self._crash_point("after_reconcile", sid)
                state, run_id = self.state, self.plan.run_id
                await self._append(
                    (
                        ev.StepRequested(
                            run_id=state.run_id,
                            seq=state.seq + 1,
                            ts=self.rt.clock(),
                            step_id=sid,
                            attempt=attempt,
                            adapter=decl.adapter,
                            idempotency_key=idempotency_key(run_id, sid, attempt),
                            args_digest=digest(decl.args),  # (``args_digest``, without its frame)
                            idempotent=self.plan.adapters[decl.adapter].idempotent,
                        ),
                    )
                )
                if self.rt.crash_hook is not None:  # (``_crash_point``, inline on the per-step path)
                    self._crash_point("after_request", sid)
                return await self._invoke(decl)
            if action is Action.RESEND:
                assert step is not None
                await self._record(
                    (
                        ev.StepResent,
                        {
                            "step_id": sid,
                            "attempt": step.attempt,
                            "resend": step.resends + 1,
                            "reason": self.first_sends.pop(sid, "resumed after a crash: same key"),
                        },
                    )
                )
                self._crash_point("after_resend", sid)
                return await self._invoke(decl)
            if action is Action.CONFIRM_RECORDED:
                assert step is not None
                if step.ok is False:
                    return await self._fail(sid, step.attempt, "the tool reported failure", applied=None)
                await self._record((ev.StepConfirmed, {"step_id": sid, "attempt": step.attempt, "rebuilt": True}))
                continue
            if action is Action.STOP_UNCERTAIN:
                assert step is not None
                if step.state == "requested":
                    await self._record(
                        (
                            ev.StepUncertain,
                            {
                                "step_id": sid,
                                "attempt": step.attempt,
                                "reason": "requested before a crash; no result recorded",
                            },
                        ),
                        (ev.RunStopped, {"step_id": sid, "reason": "uncertain effect"}),
                    )
                return self._blocked_outcome(action, sid)
            if action is Action.WAIT_APPROVAL:
                await self._record((ev.RunSuspended, {"step_id": sid, "reason": "waiting for approval"}))
                return self._blocked_outcome(action, sid)
            # FAIL: denied or failed before; close the run if a crash left it open
            assert step is not None
            if not self.state.closed:
                await self._record((ev.RunFailed, {"step_id": sid, "reason": step.reason or step.state}))
            return self._outcome()

    def _gate_may_hold(self, decl: StepDecl, step: StepState | None) -> bool:
        """Whether ``_policy_gate`` can decide anything but allow: a policy, an approval the plan asks for,
        or one given (which may have expired). Otherwise the hot path skips the gate's coroutine."""
        approved = step is not None and step.state == "approved"
        return self.rt.policy is not None or decl.approval == "required" or approved

    async def _policy_gate(self, decl: StepDecl) -> RunOutcome | None:
        step = self.state.step(decl.id)
        attempt = step.attempt if step is not None else 1
        if step is not None and step.state == "approved":
            expires = step.approval_expires_at
            if expires is None or self.rt.clock() <= expires:
                return None
            return await self._hold(decl, attempt, "the approval expired before use", "effectlog")
        decision: Decision = "require_approval" if decl.approval == "required" else "allow"
        if self.rt.policy is not None:
            verdict = self.rt.policy(
                PolicyRequest(
                    run_id=self.plan.run_id,
                    step_id=decl.id,
                    adapter=decl.adapter,
                    args=own_copy(decl.args),
                    idempotent=self.plan.adapters[decl.adapter].idempotent,
                )
            )
            if verdict == "deny" or (verdict == "require_approval" and decision == "allow"):
                decision = verdict
        if decision == "allow":
            return None
        if decision == "deny":
            await self._record(
                (
                    ev.StepDenied,
                    {
                        "step_id": decl.id,
                        "attempt": attempt,
                        "decision": "deny",
                        "by": "policy",
                        "reason": "denied by policy",
                        "args_digest": args_digest(decl),
                    },
                ),
                (ev.RunFailed, {"step_id": decl.id, "reason": "denied by policy"}),
            )
            return self._outcome(f"run {self.plan.run_id} failed: step {decl.id!r} denied by policy")
        return await self._hold(decl, attempt, "approval required", "policy")

    async def _hold(self, decl: StepDecl, attempt: int, reason: str, by: str) -> RunOutcome:
        await self._record(
            (
                ev.StepDenied,
                {
                    "step_id": decl.id,
                    "attempt": attempt,
                    "decision": "require_approval",
                    "by": by,
                    "reason": reason,
                    "args_digest": args_digest(decl),
                },
            ),
            (ev.RunSuspended, {"step_id": decl.id, "reason": reason}),
        )
        return self._blocked_outcome(Action.WAIT_APPROVAL, decl.id)

    async def _call(self, adapter: Any, request: Request, timeout: float | None) -> Receipt:
        """One send to the tool; what it answers is checked recordable before anything is recorded.

        Raises ``ToolAborted`` if the tool ended with a ``BaseException`` (``sys.exit``,
        ``KeyboardInterrupt``) and ``UnusableResult`` if its answer cannot be encoded: both
        mean "outcome unknown" to ``_invoke``, like any exception the tool raises.
        """
        if not getattr(adapter, "blocking", True) and timeout is None:
            return self._call_inline(adapter, request)
        self.adapter_calls += 1
        # An adapter that enforces the timeout itself (the shell kills its process group)
        # gets a grace period to finish that cleanup before the outcome is declared unknown.
        grace = float(getattr(adapter, "timeout_grace_s", 0.0))
        result = await _in_thread(
            adapter.invoke, request, timeout + grace if timeout is not None else None, self.rt.calls.linger
        )
        return _checked(result)

    def _call_inline(self, adapter: Any, request: Request) -> Receipt:
        """``_call`` for an adapter that answers at once (``blocking = False``) and no timeout: called in
        this thread, as a plain call (no coroutine per step); the same checks of its answer."""
        self.adapter_calls += 1
        return _checked(_guarded(adapter.invoke, request, own=getattr(adapter, "keeps_descriptors", False)))

    async def _invoke(self, decl: StepDecl) -> RunOutcome | None:
        sid = decl.id
        adapter = self.adapters[decl.adapter]
        idempotent = self.plan.adapters[decl.adapter].idempotent
        max_sends = decl.retry.attempts if decl.retry is not None else 1
        sends = 1
        entry = self.state.steps.get(sid)
        # "Not applied" is definite only if no send of this attempt had an unknown outcome: a send
        # lost to a crash (a resume resends) or to a timeout may still land after a later refusal.
        every_send_refused = entry is not None and entry.resends == 0
        inline = not getattr(adapter, "blocking", True) and decl.timeout_s is None  # answers at once, in this thread
        # effectlog's own adapters close no descriptor they did not open: their calls are not checked (see
        # toolguard; an fstat per open file, ~1.5 µs a call, 3% of a no-op step).
        look = not getattr(adapter, "keeps_descriptors", False)
        while True:
            step = self.state.steps.get(sid)
            assert step is not None
            request = Request(
                run_id=self.plan.run_id,
                step_id=sid,
                attempt=step.attempt,
                idempotency_key=step.idempotency_key,
                args=own_copy(decl.args),
                timeout_s=decl.timeout_s,
            )
            try:
                try:
                    if inline and self.obs is None:
                        receipt = self._call_inline(adapter, request)
                    else:
                        sent = self._call(adapter, request, decl.timeout_s)
                        receipt = await (
                            sent
                            if self.obs is None
                            else self.obs.tool(
                                sent, step_id=sid, attempt=step.attempt, adapter=decl.adapter, key=step.idempotency_key
                            )
                        )
                finally:
                    if look:  # whatever the tool answered: see toolguard
                        toolguard.refuse_closed(self.plan.run_id, sid)
            except DescriptorsClosed:
                raise
            except StoreWalLost:
                # effectlog's own effect store refused the commit (rolled back): no outcome of the tool's.
                # The run stops as on a journal fault (exit 6), open: a resume sends the same key again.
                raise
            except IdempotencyConflict as exc:
                # The tool holds this key for another body: not applied, and no re-send can change that.
                reason = redact(decl, f"idempotency conflict: {printable(exc.message)}")
                outcome = await self._fail(sid, step.attempt, reason, applied=False)
                return msgspec.structs.replace(outcome, exit_status=int(exc.exit_status))
            except NotApplied as exc:
                reason = redact(decl, f"not applied: {printable(exc.reason)}")
                if idempotent and sends < max_sends:
                    resent = await self._backoff_resend(decl, step.attempt, sends, reason)
                    if resent is None:
                        return self._stopped_in_backoff(decl, reason)
                    sends = resent
                    continue
                if not every_send_refused:
                    reason += " (an earlier send of this attempt has an unknown outcome)"
                return await self._fail(sid, step.attempt, reason, applied=False if every_send_refused else None)
            except Exception as exc:
                every_send_refused = False
                said = exc.reason if isinstance(exc, ToolAborted | UnusableResult) else describe(exc)
                reason = redact(decl, f"outcome unknown: {' '.join(said.split())}")  # a tool may echo its args
                if isinstance(exc, ToolAborted) and exc.interrupted:
                    return await self._interrupted_in_tool(decl, step.attempt, reason, idempotent=idempotent)
                if idempotent and sends < max_sends:
                    resent = await self._backoff_resend(decl, step.attempt, sends, reason)
                    if resent is None:
                        return self._stopped_in_backoff(decl, reason)
                    sends = resent
                    continue
                if idempotent:
                    return await self._fail(
                        sid, step.attempt, f"{reason} (after {sends} send(s) of the same key)", applied=None
                    )
                await self._record(
                    (ev.StepUncertain, {"step_id": sid, "attempt": step.attempt, "reason": reason}),
                    (ev.RunStopped, {"step_id": sid, "reason": "uncertain effect"}),
                )
                return self._blocked_outcome(Action.STOP_UNCERTAIN, sid, why=reason)
            if self.rt.crash_hook is not None:
                self._crash_point("after_effect", sid)
            if not receipt.ok:
                await self._record(
                    (ev.StepEffected, {"step_id": sid, "attempt": step.attempt, "receipt": receipt.data, "ok": False}),
                )
                return await self._fail(sid, step.attempt, "the tool reported failure", applied=None)
            state, ts, attempt = self.state, self.rt.clock(), step.attempt
            run_id, seq = state.run_id, state.seq
            await self._append(
                (
                    ev.StepEffected(
                        run_id=run_id, seq=seq + 1, ts=ts, step_id=sid, attempt=attempt, receipt=receipt.data
                    ),
                    ev.StepConfirmed(run_id=run_id, seq=seq + 2, ts=ts, step_id=sid, attempt=attempt),
                )
            )
            if self.rt.crash_hook is not None:
                self._crash_point("after_confirm", sid)
            return None

    async def _interrupted_in_tool(self, decl: StepDecl, attempt: int, reason: str, *, idempotent: bool) -> RunOutcome:
        """A ``KeyboardInterrupt`` inside the tool: its outcome is unknown and nothing more is sent.

        Not idempotent: uncertain and stopped, as any unknown outcome (exit 3). Idempotent: the
        step stays requested and the run open, so running the plan again re-sends the same key
        (exit 130). Every other run of this runtime stops before its next step.
        """
        self.rt.request_stop(signal.SIGINT)
        if not idempotent:
            await self._record(
                (ev.StepUncertain, {"step_id": decl.id, "attempt": attempt, "reason": reason}),
                (ev.RunStopped, {"step_id": decl.id, "reason": "uncertain effect"}),
            )
            return self._blocked_outcome(Action.STOP_UNCERTAIN, decl.id, why=reason)
        message = (
            f"run {self.plan.run_id} interrupted inside step {decl.id!r} ({reason}); its tool is idempotent: "
            "run the same plan again to re-send it with the same key"
        )
        return msgspec.structs.replace(self._outcome(message), exit_status=128 + signal.SIGINT)

    async def _backoff_resend(self, decl: StepDecl, attempt: int, sends: int, reason: str) -> int | None:
        """Wait the retry's backoff, then record the re-send of the same key: the sends so far, or
        ``None`` if a stop was requested during the wait (nothing sent, nothing recorded)."""
        retry = decl.retry
        assert retry is not None
        delay = min(retry.backoff_cap_s, retry.backoff_base_s * 2 ** (sends - 1))
        delay *= 1 - retry.jitter * self.rt.rng.random()
        if await self.rt.wait_or_stop(delay):
            return None
        step = self.state.step(decl.id)
        assert step is not None
        await self._record(
            (ev.StepResent, {"step_id": decl.id, "attempt": attempt, "resend": step.resends + 1, "reason": reason})
        )
        self._crash_point("after_resend", decl.id)
        return sends + 1

    def _stopped_in_backoff(self, decl: StepDecl, reason: str) -> RunOutcome:
        """SIGINT/SIGTERM while waiting to re-send an idempotent step's key: nothing is in flight, the
        step stays requested and the run open, so running the plan again sends the same key (exit 128 + signal)."""
        signum = self.rt.stop_signal
        assert signum is not None
        name = _signal_name(signum)
        message = (
            f"run {self.plan.run_id} interrupted by {name} while waiting to re-send step {decl.id!r} ({reason}); "
            "its tool is idempotent: run the same plan again to re-send it with the same key"
        )
        return msgspec.structs.replace(self._outcome(message), exit_status=128 + signum)

    async def _fail(self, sid: str, attempt: int, reason: str, *, applied: bool | None) -> RunOutcome:
        await self._record(
            (ev.StepFailed, {"step_id": sid, "attempt": attempt, "reason": reason, "applied": applied}),
            (ev.RunFailed, {"step_id": sid, "reason": reason}),
        )
        return self._outcome(f"run {self.plan.run_id} failed at step {sid!r}: {reason}")


def refuse_other_store(
    pinned: ev.EffectStoreIdentity | None, given: ev.EffectStoreIdentity | None, *, run_id: str
) -> None:
    """``LedgerMismatch`` if the adapters opened an effect store other than the one the run pinned.

    A resume, and a fork of the run (whose carried receipts and keys live in that store), run
    against the pinned store or not at all.
    """
    if pinned is not None and given is not None and pinned.store_id != given.store_id:
        raise LedgerMismatch(
            f"effect store {given.path} (id {given.store_id or 'none'}) is not the one the run pinned "
            f"({pinned.path}, id {pinned.store_id}); give --effects {pinned.path}",
            run_id=run_id,
        )


def _checked(result: Any) -> Receipt:
    """The tool's answer as the receipt to record, read once (the event, segments and state all hold
    this reading); ``UnusableResult`` (outcome unknown) if it cannot be recorded."""
    receipt = result if isinstance(result, Receipt) else Receipt(data=result)
    if not isinstance(receipt.ok, bool):
        raise UnusableResult(f"the tool's result cannot be recorded: Receipt.ok is a {type(receipt.ok).__name__}")
    data, problem = as_recorded(receipt.data)
    if problem is not None:
        raise UnusableResult(f"the tool's result cannot be recorded: {problem}")
    return Receipt(data=data, ok=receipt.ok)


async def _in_thread(
    fn: Callable[[Request], Any],
    request: Request,
    timeout: float | None,
    linger: Callable[[Request, threading.Thread], None] | None = None,
) -> Any:
    """Call a blocking adapter on a daemon thread; a timeout means "outcome unknown".

    A daemon thread (not the default executor) so that a hung tool cannot keep the
    process from exiting; the shell adapter kills its own process group on timeout.
    A call that times out still runs, and may still make its effect: ``linger`` is told
    (``latecalls.LateCalls``), so nothing decides the run until it has ended; so is a call
    whose caller was cancelled before it answered.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    answered: list[bool] = []

    def target() -> None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = _guarded(fn, request)
        except BaseException as exc:  # an Exception, or our own control flow (SimulatedCrash)
            error = exc
        answered.append(True)
        # After a timeout the loop may be closed: nobody waits for this answer any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, future, result, error)

    thread = threading.Thread(target=target, name=f"effectlog-{request.step_id}", daemon=True)
    thread.start()
    unwatch = loopfork.watch_closed(loop)  # a tool that closes the loop's descriptors must not hang it
    try:
        if timeout is None:
            return await future
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            if not future.cancelled():  # the adapter's own TimeoutError (e.g. ShellTimeout): keep its message
                raise
            raise TimeoutError(f"no answer within {timeout}s") from None
    except BaseException:
        # Timed out, or cancelled by the caller (its own timeout, a task group) before the tool
        # answered: either way the call goes on in its thread and may still make its effect.
        if linger is not None and not answered and thread.is_alive():
            linger(request, thread)
        raise
    finally:
        unwatch()


_SIGINT, _SIGTERM = int(signal.SIGINT), int(signal.SIGTERM)
# ``threading.main_thread().ident`` without its two frames per tool call: the main thread's ident, taken
# again in a forked child, where the thread that forked is the main thread (``threading``'s own at-fork
# hook, registered before this one, made it so: the hooks after a fork run in registration order).
_main = [threading.main_thread().ident]


def _forked() -> None:
    _main[0] = threading.main_thread().ident


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
# The C function under signal.getsignal: the same handler, without the wrapper's conversion to an enum,
# which for a handler that is a function formats its repr into a ValueError it then swallows (for asyncio's
# handler, the repr of its loop's tasks): two calls per tool call were a quarter of a no-op step's CPU.
_getsignal: Callable[[int], Any] = getattr(importlib.import_module("_signal"), "getsignal", signal.getsignal)


def _guarded(fn: Callable[[Request], Any], request: Request, *, own: bool = False) -> Any:
    """Call the tool; a ``BaseException`` it ends with becomes ``ToolAborted`` (outcome unknown).

    ``sys.exit()`` in a tool must not end ``effectlog run`` with status 0 and the run open,
    nor may a ``KeyboardInterrupt`` it raises pass for a clean stop after a commit. Our own
    deliberate control flow (``SimulatedCrash``, raised by crash hooks) passes through.

    A tool may change process state effectlog relies on right after the call, and never put it
    back. A recursion limit the tool lowered (a library's recursion guard) is raised again to what it
    was, or effectlog's own commit of the tool's result would raise ``RecursionError`` (a raised limit
    is left: it breaks nothing, and the tool may count on it at its next call). In the main thread, the
    stop signals the tool blocked are unblocked again (``_unblock_stop_signals``).
    A tool called in the main thread may install SIGINT/SIGTERM handlers of its own (a library's
    "graceful shutdown"): the process's handlers from before the call are put back after it, or a
    later signal would go to the tool's handler and the run would never stop (README: exit 130/143).
    """
    limit = sys.getrecursionlimit()
    if threading.get_ident() != _main[0]:  # only the main thread can set handlers
        try:
            return _call_tool(fn, request)
        finally:
            if sys.getrecursionlimit() < limit:
                sys.setrecursionlimit(limit)
    getsignal = _getsignal  # (both signals unrolled: this runs around every inline tool call)
    before_int, before_term = getsignal(_SIGINT), getsignal(_SIGTERM)
    # effectlog's own adapters change no signal mask: only a user's tool is asked about it (a system call).
    blocked = None if own else signal.pthread_sigmask(signal.SIG_BLOCK, ())
    try:
        return _call_tool(fn, request)
    finally:
        if sys.getrecursionlimit() < limit:
            sys.setrecursionlimit(limit)
        now = getsignal(_SIGINT)
        if now is not before_int:
            _put_back(_SIGINT, before_int, now)
        now = getsignal(_SIGTERM)
        if now is not before_term:
            _put_back(_SIGTERM, before_term, now)
        if blocked is not None:
            _unblock_stop_signals(blocked)


def _unblock_stop_signals(before: set[int | signal.Signals]) -> None:
    """SIGINT and SIGTERM unblocked again if the tool blocked them in the main thread's signal mask (and
    left them so): a blocked stop signal waits for ever, and the run would send every remaining step and
    exit 0. Done after the handlers are put back, so a signal that came during the call goes to effectlog's."""
    now = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    newly = {s for s in (signal.SIGINT, signal.SIGTERM) if s in now and s not in before}
    if newly:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, newly)


def _put_back(signum: int, handler: Any, now: Any) -> None:
    """The handler from before a tool call, again, unless effectlog's own one-shot stop handler fired
    during the call (now ``SIG_DFL``: a second signal ends the process at once)."""
    if handler is not None and now != signal.SIG_DFL:
        signal.signal(signum, handler)


def _call_tool(fn: Callable[[Request], Any], request: Request) -> Any:
    try:
        return fn(request)
    except (StopIteration, StopAsyncIteration) as exc:
        # Neither may cross a coroutine or be set on a future (a thread's answer would be lost
        # and the run would wait for ever): carried as an unknown outcome like any other.
        raise ToolAborted(tool_ending(exc)) from None
    except Exception:
        raise
    except SimulatedCrash:
        raise
    except BaseException as exc:
        raise ToolAborted(tool_ending(exc), interrupted=isinstance(exc, KeyboardInterrupt)) from None


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
