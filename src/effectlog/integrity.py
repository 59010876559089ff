"""``verify``: every stored byte of a journal is either hashed or re-derived and compared.

Events: the chain covers each body; the replay compares the row's ``run_id``, ``seq``,
``step_id``, ``phase`` and ``attempt`` columns with what the body says
(``fold.replay_records``). Seals (SQLite): each seals row must name its run's last event,
link to it, decode, and agree with the full replay (``seal.check_seal``); a seal of a
run that has no events left is a cut run. Both backends share this one path.
"""

from __future__ import annotations

from effectlog.errors import Truncated
from effectlog.fold import RunState
from effectlog.journal import Journal, load_run
from effectlog.seal import SealingJournal, check_seal


def verify_run(journal: Journal, run_id: str) -> RunState:
    """Replay and check one run and its seal; raises an ``IntegrityError`` naming run, seq and column."""
    state = load_run(journal, run_id)
    if isinstance(journal, SealingJournal):
        for stored in journal.stored_seals(run_id):
            check_seal(stored, state, journal.chain)
    return state


def check_orphan_seals(journal: Journal, run_ids: list[str], only: str | None = None) -> None:
    """A seal whose run has no event left (of all runs, or of ``only``): the whole run was cut."""
    if not isinstance(journal, SealingJournal):
        return
    known = set(run_ids)
    for run_id, seq, _, _ in journal.stored_seals(only):
        if run_id not in known:
            raise Truncated(
                f"the run is sealed at seq {seq} but the journal holds none of its events", run_id=run_id, seq=0
            )
