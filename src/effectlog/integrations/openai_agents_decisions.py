"""The app's answers to held calls, given with the SDK's ``RunState.approve``/``reject``, written to a journal.

A held call of a ``DurableRunner`` run waits in the journal, bound to its exact args; a
person may decide from the CLI, or the app through the SDK's own interruption flow
(``state = result.to_state(); state.approve(item)``). Both end as the same events: an
approval (used once) or a person's final denial.
"""

from __future__ import annotations

from typing import Any

from agents.run_state import RunState

from effectlog.errors import BadInput
from effectlog.session import Checkpointer
from effectlog.session.store import JournalCheckpointer


def record_sdk_decisions(store: Checkpointer, run_id: str, state: RunState[Any]) -> list[str]:
    """Write the decisions ``state`` holds for the run's held calls into the journal; returns the steps decided.

    A call the state neither approved nor rejected stays held. An approval is bound to the
    call's recorded args, exactly as one from the CLI.
    """
    context = state._context  # the SDK keeps approvals on the run context; RunState has no public reader
    if context is None:
        return []
    decided: list[str] = []
    for step in store.state(run_id).ordered_steps():
        if step.kind != "tool" or step.state != "awaiting_approval" or step.step_id.count("-") < 2:
            continue
        call_id = step.step_id.split("-", 2)[2]
        answer = context.is_tool_approved(step.adapter, call_id)
        if answer is None:
            continue
        if not isinstance(store, JournalCheckpointer):
            raise BadInput("approving through a RunState needs a journal store (a path or a JournalCheckpointer)")
        if answer:
            store.approve(run_id, step.step_id, by="application", reason="approved through the SDK's RunState")
        else:
            store.deny(run_id, step.step_id, by="application", reason="rejected through the SDK's RunState")
        decided.append(step.step_id)
    return decided
