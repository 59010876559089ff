"""An operator's decision on a fleet request: requeue, fail or cancel.

The one function ``effectlog operator`` and the console both call, so each decision is made,
and observed (an ``effectlog.fleet.<action>`` span and a count, docs/observability.md), the
same way whichever door it came in by. The store checks and records it (audited).
"""

from __future__ import annotations

from effectlog.fleet.model import RequestView
from effectlog.fleet.protocol import FleetStore
from effectlog.observe import telemetry

# CLI verbs for operator decisions -> the attempt spec's operator triggers (cancel is its own call).
OPERATOR_TRIGGERS = {"requeue": "requeue", "fail": "give_up"}
FLEET_DECISIONS = ("requeue", "fail", "cancel")


def operate(
    store: FleetStore, request_id: int, action: str, *, by: str, reason: str, attempt: int | None = None
) -> RequestView:
    """Record ``action`` on request ``request_id`` by ``by``; the request after it. ``attempt``: only
    while the request is at that attempt (the one the operator looked at), else ``DecisionStale``."""

    def decide() -> RequestView:
        if action == "cancel":
            return store.cancel(request_id, by=by, reason=reason, attempt=attempt)
        return store.operate(request_id, OPERATOR_TRIGGERS[action], by=by, reason=reason, attempt=attempt)

    found = telemetry()
    return decide() if found is None else found.fleet_decision(action, request_id, by, decide)
