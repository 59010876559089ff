"""Driving one tool step, from whatever the journal says about it to an outcome.

The order of writes is the whole point: a policy's verdict, and for a call that runs,
``step.requested`` (the intent, with the step's idempotency key) durable before the
gateway is called; the result and its confirmation durable in one batch after.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import TYPE_CHECKING, Any

from effectlog import events as ev
from effectlog import loopfork, toolguard
from effectlog.adapters.protocol import idempotency_key
from effectlog.errors import (
    BadInput,
    DescriptorsClosed,
    NotApplied,
    UncertainEffect,
    UnusableResult,
    describe,
    printable,
    tool_ending,
)
from effectlog.fold import StepState
from effectlog.outcome import SimulatedCrash
from effectlog.plan import own_copy
from effectlog.recordable import as_recorded
from effectlog.recovery import Action, decide
from effectlog.session.steps import Reconciled, ToolCall, ToolStep
from effectlog.session.timing import expire_if_late
from effectlog.session.tools import ToolInfo
from effectlog.stake import reconcile_command, redact_args, redact_text

if TYPE_CHECKING:
    from effectlog.session.durable import Session

# The session whose tool call is running in this context (new tasks and loops copy it): a step that
# session is asked for from here would be made inside the call, and a resume skips it with the call.
CALLING: contextvars.ContextVar[Session | None] = contextvars.ContextVar("effectlog_session_calling", default=None)


class ToolDriver:
    """Drives one tool step from whatever the journal says about it to an outcome."""

    def __init__(
        self,
        session: Session,
        info: ToolInfo,
        sid: str,
        *,
        args: dict[str, Any],
        fp: str,
        call_hash: str,
        deadline: int | None = None,
    ) -> None:
        self.s = session
        self.info = info
        self.sid = sid
        self.args = args
        self.fp = fp
        self.call_hash = call_hash
        self.deadline = deadline  # ns since the epoch: a step not begun by then fails

    def _step(self, status: Any, *, replayed: bool, **fields: Any) -> ToolStep:
        return ToolStep(
            step_id=self.sid,
            tool=self.info.name,
            args=self.args,
            status=status,
            tool_call_hash=self.call_hash,
            replayed=replayed,
            **fields,
        )

    def _recorded(self) -> StepState | None:
        return self.s.state.step(self.sid)

    async def drive(self) -> ToolStep:
        s, sid = self.s, self.sid
        while True:
            step = self._recorded()
            action = decide(step)
            if action is Action.SKIP:
                assert step is not None
                if step.state == "reconciled":
                    result = Reconciled(
                        outcome=step.outcome or "applied",
                        evidence=step.evidence or "",
                        operator=step.operator or "",
                        automated=step.automated,
                    )
                    return self._step("reconciled", replayed=True, result=result, reason=step.evidence or "")
                return self._step("ok", replayed=True, result=step.receipt)
            if action is Action.CONFIRM_RECORDED:
                assert step is not None
                s._record((ev.StepConfirmed, {"step_id": sid, "attempt": step.attempt, "rebuilt": True}))
                continue
            if action is Action.FAIL:
                assert step is not None
                if step.state == "denied":
                    return self._step("denied", replayed=True, decision="deny", reason=step.reason)
                return self._step("failed", replayed=True, reason=step.reason)
            if action is Action.WAIT_APPROVAL:
                assert step is not None
                if s.state.state == "running":
                    s._record((ev.RunSuspended, {"step_id": sid, "reason": "waiting for approval"}))
                return self._step("denied", replayed=True, decision="require_approval", reason=step.reason)
            if action is Action.STOP_UNCERTAIN:
                assert step is not None
                if step.state == "requested":
                    self._doubt(step, "requested before the process ended; no result recorded")
                elif s.state.state == "running":
                    s._record((ev.RunStopped, {"step_id": sid, "reason": "uncertain effect"}))
                raise self._uncertain()
            if action is Action.RESEND:
                assert step is not None
                if not self.info.idempotent:
                    # Recorded as idempotent, declared not idempotent now (the code changed between passes):
                    # the stricter declaration wins, so the same key is not sent again to a tool said to ignore it.
                    self._doubt(
                        step,
                        "requested before the process ended; no result recorded (the tool is no "
                        "longer declared idempotent, so it is not sent again)",
                    )
                    raise self._uncertain()
                s._resend(step)
                return await self._invoke()
            return await self._execute(step)

    async def _execute(self, step: StepState | None) -> ToolStep:
        s, sid = self.s, self.sid
        expire_if_late(s, sid, kind="tool", name=self.info.name, fp=self.fp, deadline=self.deadline)
        attempt = step.attempt if step is not None else 1
        now = s.clock()
        if step is not None and step.state == "approved":
            expires = step.approval_expires_at
            if expires is not None and now > expires:
                return self._hold(attempt, "the approval expired before use", by="effectlog", ts=now)
        else:
            verdict = s.policy(
                ToolCall(
                    run_id=s.run_id, step_id=sid, tool=self.info.name, args=self.args, idempotent=self.info.idempotent
                )
            )
            if verdict == "deny":
                s._record((ev.StepDenied, self._denial(attempt, "deny", "denied by policy", by="policy")), ts=now)
                return self._step("denied", replayed=False, decision="deny", reason="denied by policy")
            if verdict == "require_approval":
                return self._hold(attempt, "approval required by policy", by="policy", ts=now)
            if verdict != "allow":
                raise BadInput(
                    f"a policy must answer allow, deny or require_approval, not {verdict!r}",
                    run_id=s.run_id,
                    step_id=sid,
                )
        s._crash_point("before_intent", sid)
        s._record(
            (
                ev.StepRequested,
                {
                    "step_id": sid,
                    "attempt": attempt,
                    "adapter": self.info.name,
                    "kind": "tool",
                    "idempotency_key": idempotency_key(s.run_id, sid, attempt),
                    "args_digest": self.call_hash,
                    "idempotent": self.info.idempotent,
                    "fingerprint": self.fp,
                    "args": redact_args(self.args, self.info.secret),
                },
            ),
            ts=now,
        )
        s._crash_point("after_intent", sid)
        return await self._invoke()

    def _denial(self, attempt: int, decision: str, reason: str, *, by: str) -> dict[str, Any]:
        return {
            "step_id": self.sid,
            "attempt": attempt,
            "decision": decision,
            "by": by,
            "reason": reason,
            "args_digest": self.call_hash,
            "adapter": self.info.name,
            "fingerprint": self.fp,
            "args": redact_args(self.args, self.info.secret),
        }

    def _hold(self, attempt: int, reason: str, *, by: str, ts: int) -> ToolStep:
        self.s._record(
            (ev.StepDenied, self._denial(attempt, "require_approval", reason, by=by)),
            (ev.RunSuspended, {"step_id": self.sid, "reason": reason}),
            ts=ts,
        )
        return self._step("denied", replayed=False, decision="require_approval", reason=reason)

    async def _invoke(self) -> ToolStep:
        s, sid = self.s, self.sid
        step = self._recorded()
        assert step is not None
        try:
            s.tool_calls += 1
            call = s.gateway.call_tool(self.info.name, own_copy(self.args), idempotency_key=step.idempotency_key)
            if s._spans is not None:  # an `effectlog.tool` span under the step's span (OpenTelemetry configured)
                call = s._spans.tool(
                    call, step_id=sid, attempt=step.attempt, adapter=self.info.name, key=step.idempotency_key
                )
            token = CALLING.set(s)
            unwatch = loopfork.watch_closed(asyncio._get_running_loop())  # a sync tool runs on a thread
            try:
                value = await call
            finally:
                unwatch()
                CALLING.reset(token)
                toolguard.refuse_closed(s.run_id, sid)  # whatever the tool answered (see toolguard)
            value, problem = as_recorded(value, f"the result of tool {self.info.name!r}")  # read once
            if problem is not None:
                # The effect may have happened and its answer cannot be kept: an unknown outcome.
                raise UnusableResult(f"the tool's result cannot be recorded: {problem}")
        except DescriptorsClosed:
            raise  # nothing of the step may be recorded through this process's files
        except NotApplied as exc:
            reason = self._redact(printable(exc.reason))
            s._record((ev.StepFailed, {"step_id": sid, "attempt": step.attempt, "reason": reason, "applied": False}))
            return self._step("failed", replayed=False, reason=reason)
        except Exception as exc:
            if step.idempotent:
                raise  # the intent stays: the next pass sends the same key again
            said = exc.reason if isinstance(exc, UnusableResult) else describe(exc)
            self._doubt(step, self._redact(f"outcome unknown: {said}"))
            raise self._uncertain() from exc
        except SimulatedCrash:
            raise  # a crash hook's deliberate stop: a crash records nothing
        except BaseException as exc:
            # Cancelled (a caller's timeout, a task group), interrupted, or ended with ``sys.exit()``,
            # ``GeneratorExit`` or a library's own ``BaseException`` while the tool ran: the effect may be
            # out. Recorded as the next pass would find it (uncertain, the run stopped), so that a later
            # call in this same process (the application caught it) stops on it too instead of running on
            # past it. The exception itself goes on to the caller.
            if not step.idempotent:
                self._doubt(step, self._redact(f"outcome unknown: {tool_ending(exc)}"))
            raise
        s._crash_point("after_call", sid)
        try:
            s._record(
                (ev.StepEffected, {"step_id": sid, "attempt": step.attempt, "receipt": value}),
                (ev.StepConfirmed, {"step_id": sid, "attempt": step.attempt}),
            )
        except RecursionError:
            # ``as_recorded`` read the answer here; the journal encodes it inside its event, some frames deeper,
            # where an answer nested nearly as deep as the stack allows no longer fits. Nothing was written
            # (the batch is encoded before it is stored): the answer cannot be recorded, like any other.
            problem = "the tool's result cannot be recorded: nested too deep for the journal to encode it here"
            if step.idempotent:
                raise UnusableResult(problem) from None  # the intent stays: the next pass sends the same key
            self._doubt(step, f"outcome unknown: {problem}")
            raise self._uncertain() from None
        s._crash_point("after_result", sid)
        return self._step("ok", replayed=False, result=value)

    def _redact(self, text: str) -> str:
        """A tool's message may echo its args: the secret ones are recorded as ``<secret NAME>``."""
        return redact_text(text, self.args, self.info.secret)

    def _doubt(self, step: StepState, reason: str) -> None:
        self.s._record(
            (ev.StepUncertain, {"step_id": self.sid, "attempt": step.attempt, "reason": reason}),
            (ev.RunStopped, {"step_id": self.sid, "reason": "uncertain effect"}),
        )

    def _uncertain(self) -> UncertainEffect:
        s = self.s
        step = s.state.step(self.sid)
        command = reconcile_command(s.store.location, s.run_id, self.sid, step.attempt if step is not None else None)
        return UncertainEffect(
            f"tool {self.info.name!r} was requested and its outcome is unknown; it is not idempotent, so "
            f"effectlog will not guess. Reconcile it with evidence: {command}",
            run_id=s.run_id,
            step_id=self.sid,
            tool=self.info.name,
            command=command,
        )
