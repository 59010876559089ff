"""pydantic-ai's answers to held calls (``DeferredToolResults.approvals``), written to a run's journal.

A held call of a ``DurableAgent`` run waits in the journal, bound to its exact args; a
person may decide from the CLI, or the app with pydantic-ai's own ``DeferredToolResults``.
Both end as the same events: an approval (used once) or a person's final denial.
"""

from __future__ import annotations

from pydantic_ai import DeferredToolResults, ToolApproved, ToolDenied

from effectlog.errors import BadInput
from effectlog.fold import StepState
from effectlog.session import Checkpointer
from effectlog.session.store import JournalCheckpointer


def record_decisions(store: Checkpointer, run_id: str, results: DeferredToolResults) -> list[str]:
    """Write the app's answers to held calls (pydantic-ai's ``DeferredToolResults.approvals``) into the journal.

    An approval is bound to the call's recorded args, as one from the CLI; a denial is a
    person's "no", final: the run fails. Returns the step ids decided. Answers to calls
    effectlog only deferred (``DeferredToolResults.calls``) are not needed: the resumed
    pass runs them.
    """
    state = store.state(run_id)
    held: dict[str, StepState] = {}  # by tool_call_id; a call waiting now wins over an earlier one of the same id
    for s in state.ordered_steps():
        if s.kind == "tool" and s.step_id.startswith("tool-") and s.step_id.count("-") >= 2:
            call_id = s.step_id.split("-", 2)[2]
            if call_id not in held or held[call_id].state != "awaiting_approval":
                held[call_id] = s
    if results.approvals and not isinstance(store, JournalCheckpointer):
        raise BadInput("deferred_tool_results needs a journal store (a path or a JournalCheckpointer)", run_id=run_id)
    decided: list[str] = []
    for call_id, answer in results.approvals.items():
        step = held.get(call_id)
        if step is None:
            raise BadInput(f"no held tool call {call_id!r} in run {run_id!r}", run_id=run_id)
        if step.state != "awaiting_approval":
            continue  # decided before (an earlier pass gave the same answers): nothing to write
        by = results.answered_by.get(call_id) or "application"
        assert isinstance(store, JournalCheckpointer)
        if answer is True or isinstance(answer, ToolApproved):
            if isinstance(answer, ToolApproved) and answer.override_args is not None:
                raise BadInput(
                    f"an approval is bound to the exact args held at {step.step_id!r}; "
                    "approving other args (override_args) would run a call nobody was shown",
                    run_id=run_id,
                    step_id=step.step_id,
                )
            store.approve(run_id, step.step_id, by=by, reason="approved through pydantic-ai DeferredToolResults")
        else:
            message = answer.message if isinstance(answer, ToolDenied) else "denied through DeferredToolResults"
            store.deny(run_id, step.step_id, by=by, reason=message)
        decided.append(step.step_id)
    return decided
