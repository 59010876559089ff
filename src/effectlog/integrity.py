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
    # The seal first, then the events: a seal is written in the transaction of its run's closing
    # event, so events read after it reach that event. Read the other way round, a run closed by a
    # writer between the two reads would look cut (verify runs beside writers: G6).
    seals = journal.stored_seals(run_id) if isinstance(journal, SealingJournal) else []
    state = load_run(journal, run_id)
    for stored in seals:
        check_seal(stored, state, journal.chain)
    return state


def check_orphan_seals(journal: Journal, run_ids: list[str], only: str | None = None) -> None:
    """A seal whose run has no event left (of all runs, or of ``only``): the whole run was cut."""
    if not isinstance(journal, SealingJournal):
        return
    seals = journal.stored_seals(only)
    # Runs listed after the seals were read (see verify_run): a run started and sealed by a writer
    # after ``run_ids`` was listed is no orphan.
    known = set(run_ids) | (set(journal.runs()) if seals else set())
    for run_id, seq, _, _ in seals:
        if run_id not in known:
            raise Truncated(
                f"the run is sealed at seq {seq} but the journal holds none of its events", run_id=run_id, seq=0
            )
