"""Turning decisions into events: assign seq and timestamp, check legality with the
fold *before* anything is written, then append. Used by the runtime's actors and by
the operator commands (approve, deny, reconcile) alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from effectlog.events import Event
from effectlog.fold import RunState, apply
from effectlog.journal.protocol import Journal
from effectlog.seal import SealingJournal, seal_row
from effectlog.trace import Trace

Clock = Callable[[], int]
EventSpec = tuple[type[Event], dict[str, Any]]


def prepare(state: RunState, specs: Sequence[EventSpec], ts: int) -> tuple[list[Event], RunState]:
    """Build the events and the state after them; raises (writing nothing) if any is illegal."""
    events: list[Event] = []
    for cls, fields in specs:
        event = cls(run_id=state.run_id, seq=state.seq + 1, ts=ts, **fields)
        state = apply(state, event)
        events.append(event)
    return events, state


def record_now(
    journal: Journal,
    state: RunState,
    specs: Sequence[EventSpec],
    clock: Clock,
    trace: Trace | None = None,
) -> RunState:
    """Prepare, append durably (one atomic batch), trace; returns the new state."""
    events, new_state = prepare(state, specs, clock())
    if new_state.closed and isinstance(journal, SealingJournal):  # closed for good: seal it with its last event
        journal.append_sealed(events, [seal_row(new_state)])
    else:
        journal.append(events)
    if trace is not None:
        for event in events:
            trace.record(event)
        trace.flush()
    return new_state
