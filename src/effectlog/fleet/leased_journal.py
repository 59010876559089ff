"""A run's journal as one lease holder sees it: every append is fenced by the lease.

``LeasedJournal`` implements the journal Protocol for the runtime. Its appends go to
the store's journal with the lease, and the store accepts them only in the same
transaction that finds ``(attempt, runner, token)`` still the current, unexpired
lease. Reads are not fenced: reading changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from effectlog.chain import Chain
from effectlog.errors import StaleLease
from effectlog.events import Event
from effectlog.fleet.model import Lease
from effectlog.fold import Record
from effectlog.journal.ownership import Claim, OwnerStatus, new_owner


class FencedJournal(Protocol):
    """A journal that can check a lease inside the transaction of an append."""

    chain: Chain
    location: str

    def append(self, events: Sequence[Event]) -> list[Record]: ...

    def append_fenced(self, events: Sequence[Event], lease: Lease | None) -> list[Record]:
        """``append``, accepted only while ``lease`` is current (no check when ``None``).

        A batch this attempt already wrote with the same bytes is a no-op; the same
        batch key with other bytes is ``IdempotencyConflict``.
        """
        ...

    def read(self, run_id: str, after_seq: int = 0) -> Iterator[Record]: ...

    def head(self, run_id: str) -> tuple[int, bytes]: ...

    def claim(self, run_id: str, kind: str = "run", *, runner: str | None = None) -> Claim: ...

    def release(self, claim: Claim) -> None: ...

    def owner(self, run_id: str) -> OwnerStatus: ...

    def runs(self) -> list[str]: ...

    def close(self) -> None: ...


class LeasedJournal:
    """The journal Protocol over a ``FencedJournal``, for one lease. ``close`` leaves the shared journal open."""

    def __init__(
        self,
        base: FencedJournal,
        lease: Lease,
        before_append: Callable[[Sequence[Event]], None] | None = None,
    ) -> None:
        self.base = base
        self.lease = lease
        self.chain = base.chain
        self.location = base.location
        # Called before each append, outside any transaction (a runner's test hook).
        self.before_append = before_append

    def append(self, events: Sequence[Event]) -> list[Record]:
        if self.before_append is not None and events:
            self.before_append(events)
        return self.base.append_fenced(events, self.lease)

    def read(self, run_id: str, after_seq: int = 0) -> Iterator[Record]:
        return self.base.read(run_id, after_seq)

    def head(self, run_id: str) -> tuple[int, bytes]:
        return self.base.head(run_id)

    def claim(self, run_id: str, kind: str = "run", *, runner: str | None = None) -> Claim:
        """The lease is this attempt's ownership of its one run (fenced in every append): nothing more to take."""
        if run_id != self.lease.run_id:
            raise StaleLease(
                f"lease of attempt {self.lease.attempt_id} covers run {self.lease.run_id!r}, not {run_id!r}",
                run_id=run_id,
            )
        return Claim(run_id=run_id, owner=new_owner("runner", self.lease.runner_id), token=self.lease.token)

    def release(self, claim: Claim) -> None:
        """The lease ends with the attempt, not with the run actor."""

    def owner(self, run_id: str) -> OwnerStatus:
        return self.base.owner(run_id)

    def runs(self) -> list[str]:
        return self.base.runs()

    def close(self) -> None:
        """The base journal belongs to the store; this view has nothing of its own to close."""
