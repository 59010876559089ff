"""The storage Protocol every journal backend implements (SQLite, PostgreSQL).

Deliberately small: append a batch atomically, read a run from a sequence number,
know a run's head, list runs, and own a run (``effectlog.journal.ownership``).
Backend errors are translated into effectlog errors at this boundary.
``effectlog.testing.journal_contract`` is the one test suite every backend must pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

from effectlog.chain import Chain
from effectlog.events import Event
from effectlog.fold import Record
from effectlog.journal.ownership import Claim, OwnerStatus

SCHEMA_VERSION = 1


@runtime_checkable
class Journal(Protocol):
    """An append-only, hash-chained event log, one chain per run."""

    chain: Chain
    location: str

    def append(self, events: Sequence[Event]) -> list[Record]:
        """Append ``events`` atomically (all or none).

        Each event's ``seq`` must continue its run. An event already stored with the
        same bytes is a no-op (its record is returned); the same identity (run and
        seq, or run, step, phase and attempt) with other bytes raises ``EventConflict``.
        """
        ...

    def read(self, run_id: str, after_seq: int = 0) -> Iterator[Record]:
        """The run's records with ``seq > after_seq``, in order, from one consistent snapshot."""
        ...

    def head(self, run_id: str) -> tuple[int, bytes]:
        """``(last seq, last hash)`` of a run; ``(0, GENESIS)`` when it has no events."""
        ...

    def claim(self, run_id: str, kind: str = "run", *, runner: str | None = None) -> Claim:
        """Own ``run_id`` until ``release``: appends to it are this object's alone.

        Raises ``RunOwned`` (exit 6, naming the owner) while another live claim holds the
        run, in this process or any other; ``RunBound`` (exit 5) for a fleet request's run.
        Appends to runs this object has not claimed are one-shot claims for their own
        transaction, refused the same way.
        """
        ...

    def release(self, claim: Claim) -> None:
        """Give the run up; the owner row stays, naming the last owner."""
        ...

    def owner(self, run_id: str) -> OwnerStatus:
        """The run's last recorded owner, and whether a live claim holds it now."""
        ...

    def runs(self) -> list[str]:
        """Every run id with at least one event, sorted."""
        ...

    def close(self) -> None: ...
