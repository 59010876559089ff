"""Run summaries for ``status``: a closed run from its seal, an open run from its full replay.

A summary is a ``RunState`` with the run-level fields and each step's id, state and
attempt (``seal.sealed_view`` of the full replay). A closed run's seal is exactly that,
bound to the run's chain head, so reading it costs one row instead of a replay; a run
without a seal (open, or in a backend that keeps none) is replayed in full, and so is a
sealed run with a step still waiting for a person, so what is at stake shows in full.
A seal no longer bound to its run's last event raises (``Truncated``/``ChainBroken``),
as a re-run would. ``status`` does not verify closed runs' chains: ``verify`` does.

Newest first means by the time of ``run.started``, then by run id.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from effectlog.fold import RunState
from effectlog.journal import Journal, load_run, load_sealed
from effectlog.spec import compiled
from effectlog.stake import BLOCKED_STATES

RUN_STATES: tuple[str, ...] = compiled("run").spec.states


def summary(journal: Journal, run_id: str) -> RunState:
    """One run's summary (see the module docstring); never a state the full replay would not give."""
    sealed = load_sealed(journal, run_id)
    if sealed is None or any(s.state in BLOCKED_STATES for s in sealed.steps.values()):
        return load_run(journal, run_id)  # open, or a person must see in full what is at stake
    return sealed


def summaries(
    journal: Journal,
    run_ids: Iterable[str],
    *,
    states: Sequence[str] = (),
    limit: int | None = None,
) -> list[RunState]:
    """The runs' summaries, newest first, keeping those in ``states`` (all when empty), at most ``limit``."""
    found = [summary(journal, run_id) for run_id in run_ids]
    if states:
        found = [s for s in found if s.state in states]
    found.sort(key=lambda s: (-s.started_ts, s.run_id))
    return found if limit is None else found[:limit]
