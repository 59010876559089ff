"""Runs that belong to a fleet request: the fleet's tables, as the journal must respect them.

A fleet store keeps its requests beside the runs' journal, in the same database. A
run that belongs to a request is written only under that request's lease (the
fleet's fencing), so the journal refuses to let a plain ``run`` or a session claim
it (``RunBound``, exit 5), and lets an operator's one-shot decision through only
while no runner drives it under a live lease (``RunOwned``, exit 6); a runner that
waits for a person's decision drives nothing. A request that has ended (its current
attempt in a terminal state) takes no decision at all (``RunBound``): no runner will
ever drive its run again, so an approval there would promise an effect that cannot happen. The states come from
``specs/attempt.toml``, as everywhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from effectlog.errors import RunBound, RunOwned
from effectlog.journal.ownership import Owner
from effectlog.spec import compiled

_ATTEMPT = compiled("attempt").spec
_LIVE = {s for t in _ATTEMPT.transitions if t.actor == "recovery_service" for s in t.source}
# A lease owner that waits for a person's decision (``await_decision``) holds the lease but
# drives nothing: an operator's approve, deny or reconcile is exactly what it waits for.
_WAITING = {t.dest for t in _ATTEMPT.transitions if t.trigger == "await_decision"}
_ENDED: tuple[str, ...] = tuple(sorted(_ATTEMPT.terminal))
DRIVING: tuple[str, ...] = tuple(sorted(_LIVE - _WAITING))

Query = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]


def check_binding(
    query: Query, *, requests: str, attempts: str, placeholder: str, run_id: str, kind: str, now: float
) -> None:
    """Raise if ``kind`` may not write ``run_id`` because a fleet request owns it."""
    p = placeholder
    rows = query(f"SELECT request_id, scope FROM {requests} WHERE run_id = {p}", (run_id,))
    if not rows:
        return
    request_id, scope = rows[0]

    def bound(why: str) -> RunBound:
        return RunBound(
            f"the run belongs to fleet request {request_id} in scope {scope!r}{why}",
            run_id=run_id,
            request_id=int(request_id),
            scope=str(scope),
        )

    if kind != "operator":
        raise bound(
            ": it is written only under that request's lease (effectlog runner), and decided with effectlog operator"
        )
    ended = ", ".join(p for _ in _ENDED)
    last = query(
        f"SELECT attempt_no, state FROM {attempts} WHERE request_id = {p} AND state IN ({ended})"
        f" AND attempt_no = (SELECT MAX(attempt_no) FROM {attempts} WHERE request_id = {p})",
        (request_id, *_ENDED, request_id),
    )
    if last:
        attempt_no, state = last[0]
        raise bound(
            f", which has ended ({state}, attempt {attempt_no}): no runner will drive it again, so it takes no "
            "decision; nothing was written"
        )
    states = ", ".join(p for _ in DRIVING)
    live = query(
        f"SELECT runner_id, attempt_no FROM {attempts} WHERE request_id = {p} AND state IN ({states})"
        f" AND lease_expires_at > {p}",
        (request_id, *DRIVING, now),
    )
    if live:
        runner, attempt_no = live[0]
        raise RunOwned(
            f"runner {runner} holds a live lease on this run (fleet request {request_id}, attempt {attempt_no}); "
            "nothing was written",
            run_id=run_id,
            runner=str(runner),
        )


def lease_holder(
    query: Query, *, requests: str, attempts: str, placeholder: str, run_id: str, now: float
) -> tuple[Owner, bool] | None:
    """The runner holding a live lease on a fleet request's run, and whether it waits for a person."""
    p = placeholder
    live = sorted(_LIVE)
    states = ", ".join(p for _ in live)
    rows = query(
        f"SELECT a.runner_id, a.state FROM {attempts} a JOIN {requests} r ON r.request_id = a.request_id"
        f" WHERE r.run_id = {p} AND a.state IN ({states}) AND a.lease_expires_at > {p}",
        (run_id, *live, now),
    )
    if not rows:
        return None
    return Owner(pid=0, host="", kind="runner", runner=str(rows[0][0])), str(rows[0][1]) in _WAITING
