"""A run's journal as one lease holder sees it: every append is fenced by the lease.

``LeasedJournal`` implements the journal Protocol for the runtime. Its appends go to
the store's journal with the lease, and the store accepts them only in the same
transaction that finds ``(attempt, runner, token)`` still the current, unexpired
lease. Reads are not fenced: reading changes nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import msgspec

from effectlog.chain import GENESIS, Chain
from effectlog.errors import StaleLease, StorageError
from effectlog.events import Event, RunCompleted, RunStarted, encode
from effectlog.fleet.fencing import Carry, Tx
from effectlog.fleet.model import Lease, Move
from effectlog.fold import Record
from effectlog.journal.ownership import Claim, Owner, OwnerStatus, new_owner


class FencedJournal(Protocol):
    """A journal that can check a lease inside the transaction of an append."""

    chain: Chain
    location: str

    def append(self, events: Sequence[Event]) -> list[Record]: ...

    def append_fenced(self, events: Sequence[Event], lease: Lease | None, carry: Carry | None = None) -> list[Record]:
        """``append``, accepted only while ``lease`` is current (no check when ``None``).

        A batch this attempt already wrote with the same bytes is a no-op; the same
        batch key with other bytes is ``IdempotencyConflict``. ``carry``: lease-owner
        transitions made in the same transaction.
        """
        ...

    def read(self, run_id: str, after_seq: int = 0) -> Iterator[Record]: ...

    def head(self, run_id: str) -> tuple[int, bytes]: ...

    def claim(self, run_id: str, kind: str = "run", *, runner: str | None = None) -> Claim: ...

    def release(self, claim: Claim) -> None: ...

    def owner(self, run_id: str, *, leases: bool = True) -> OwnerStatus:
        """``leases=False``: whether a claim (a process outside the fleet) drives the run, leases aside."""
        ...

    def runs(self) -> list[str]: ...

    def close(self) -> None: ...


Mover = Callable[[Tx, Lease, str, float, Sequence[Move]], str]

# This process as a lease's owner, by (pid, runner id): what ``new_owner`` reads from ``/proc`` (the
# process's start, its node) does not change while the process lives, and reading ``/proc/<pid>/stat``
# again for every attempt was ~30k of a fleet run's ~4.6M instructions (callgrind). Keyed by pid too:
# a forked child is another process and reads its own. Only ``since`` (the claim's time) is new each time.
_owner: tuple[int, str, Owner] | None = None


def _runner_owner(runner_id: str) -> Owner:
    global _owner  # noqa: PLW0603 - one process-wide record, replaced whole (no lock needed)
    pid, known = os.getpid(), _owner
    if known is None or known[:2] != (pid, runner_id):
        owner = new_owner("runner", runner_id)
        _owner = (pid, runner_id, owner)
        return owner
    return msgspec.structs.replace(known[2], since=time.time_ns())


class LeasedJournal:
    """The journal Protocol over a ``FencedJournal``, for one lease. ``close`` leaves the shared journal open.

    With a ``mover`` (the store's ``carry``) the lease owner's transitions ride in the
    appends' transactions instead of taking one each: ``defer`` keeps one (``prepare``,
    ``start``) for the next append (or the next report, ``reporting``), and with
    ``succeed_on_completion`` set the batch that records ``run.completed`` also makes the
    attempt ``succeed`` (op key ``final``), which ``finished`` then tells. The lease check
    guards them as it guards the batch. With ``claim_after`` set too, that batch's
    transaction also claims the runner's next request (``claimed`` once it committed).

    With ``hold_start`` set, a fresh run's first batch, ``run.started`` alone, is held and
    written with the run's next batch (a step's request, or whatever comes first) instead of
    in a commit of its own: one commit per run fewer. Nothing outside the process can tell:
    no tool is invoked before that next batch is durable (a step's request is written
    ahead of its call), and a run killed meanwhile is, to the recovery service, one killed
    before ``run.started`` (no step requested: the attempt is lost and the request
    requeued; were ``run.started`` durable, the next attempt would resume it instead, with
    no step done either). Anything else that looks at the run or reports on the attempt
    (``read``, ``head``, ``reporting``, ``flush``) writes the held batch first.

    The ``run.started`` a lease writes names the request it serves (``RunStarted.request``,
    stamped here: the lease is what knows it). The fleet tables are outside the chain, so
    this is what lets ``verify`` name a request served by two runs (a request re-pointed
    at a new run id by hand, whose steps would otherwise run again unseen).
    """

    def __init__(
        self,
        base: FencedJournal,
        lease: Lease,
        before_append: Callable[[Sequence[Event]], None] | None = None,
        mover: Mover | None = None,
    ) -> None:
        self.base = base
        self.lease = lease
        self.chain = base.chain
        self.location = base.location
        # Called before each append, outside any transaction (a runner's test hook).
        self.before_append = before_append
        self.mover = mover
        self.pending: list[Move] = []
        self.finished: str | None = None  # the attempt's state once a batch's carry ended it
        self.appended = 0  # events this attempt appended
        self.succeed_on_completion = False  # the runner's choice: its run's end is its attempt's success
        # The runner's choice too: what to claim in the transaction that makes the attempt succeed (its
        # slot frees then), instead of a claim transaction of its own; ``claimed`` once that committed.
        self.claim_after: Callable[[Tx], list[Lease]] | None = None
        self.claimed: list[Lease] = []
        self._fresh = lease.base_seq == 0  # until the first read or append: the run has no event
        self.hold_start = False  # the runner's choice: hold a fresh run's run.started for its next batch
        self._held: list[Event] = []

    def defer(self, trigger: str, op_key: str) -> None:
        """Make this transition with the next append or report (needs a ``mover``)."""
        self.pending.append(Move(trigger=trigger, op_key=op_key))

    def reporting(self, report: Callable[[Sequence[Move]], str]) -> str:
        """Make a report that makes the deferred transitions first (``FleetStore.advance(before=...)``).

        They stay deferred when the report fails, so the next write makes them (one already
        made, its acknowledgement lost, is recognised by its operation key and passed over).
        """
        self.flush()
        try:
            state = report(list(self.pending))
        except StorageError:  # its commit's outcome is unknown: once more (an operation key makes it idempotent)
            state = report(list(self.pending))
        self.pending = []
        return state

    def append(self, events: Sequence[Event]) -> list[Record]:
        if self.before_append is not None and events:
            self.before_append(events)
        first = self.lease.base_seq == 0 and self.appended == 0 and not self._held  # the run has no event yet
        if events and isinstance(events[0], RunStarted) and events[0].request != self.lease.request_id:
            # Every time, not only on the first append: a batch re-sent after a lost acknowledgement must
            # have the bytes it had (the store's batch key finds it).
            events = [msgspec.structs.replace(events[0], request=self.lease.request_id), *events[1:]]
        if self.hold_start and first and len(events) == 1 and isinstance(events[0], RunStarted):
            self._fresh = False
            self._held = [events[0]]
            body = encode(events[0])  # the record the batch will have: the run's first, chained from genesis
            return [Record(events[0].run_id, events[0].seq, body, self.chain.link(GENESIS, body))]
        self._fresh = False
        held, self._held = self._held, []  # written with this batch, or not at all (a refused batch ends the attempt)
        batch = [*held, *events] if held else events
        carry = _Carry(self) if self.mover is not None and batch else None
        try:
            records = self.base.append_fenced(batch, self.lease, carry)
        except StorageError:
            # The commit's outcome is unknown (the connection dropped during COMMIT, a failover): the same
            # batch once more, on another connection. Its batch key makes it idempotent: landed, it is
            # found and handed back; lost, it is written now. No tool was called on it yet either way, so
            # the runtime goes on as if the first try had answered (attack14: it escalated instead, and the
            # step it had not called became "uncertain" for a person to settle).
            carry = _Carry(self) if carry is not None else None
            records = self.base.append_fenced(batch, self.lease, carry)
        if carry is not None and carry.state is not None:  # committed with the batch
            self.pending = []
            if carry.completes:
                self.finished = carry.state
                self.claimed = carry.claimed
        self.appended += len(batch)
        return records[len(held) :]

    def flush(self) -> None:
        """Write a held ``run.started`` now (with the deferred transitions), if one is held."""
        if self._held:
            self.append([])

    def read(self, run_id: str, after_seq: int = 0) -> Iterator[Record]:
        self.flush()
        if self._fresh and run_id == self.lease.run_id:
            # The first look at a run leased with no event: it is empty (only this lease may
            # write it; were anyone else to, the first append's head check refuses the batch).
            self._fresh = False
            return iter(())
        return self.base.read(run_id, after_seq)

    def head(self, run_id: str) -> tuple[int, bytes]:
        self.flush()
        return self.base.head(run_id)

    def claim(self, run_id: str, kind: str = "run", *, runner: str | None = None) -> Claim:
        """The lease is this attempt's ownership of its one run (fenced in every append): nothing more to take."""
        if run_id != self.lease.run_id:
            raise StaleLease(
                f"lease of attempt {self.lease.attempt_id} covers run {self.lease.run_id!r}, not {run_id!r}",
                run_id=run_id,
            )
        return Claim(run_id=run_id, owner=_runner_owner(self.lease.runner_id), token=self.lease.token)

    def release(self, claim: Claim) -> None:
        """The lease ends with the attempt, not with the run actor."""

    def owner(self, run_id: str) -> OwnerStatus:
        return self.base.owner(run_id)

    def runs(self) -> list[str]:
        self.flush()
        return self.base.runs()

    def close(self) -> None:
        """The base journal belongs to the store; this view has nothing of its own to close."""


class _Carry:
    """One batch's share of a ``LeasedJournal``'s transitions (``effectlog.fleet.fencing.Carry``)."""

    def __init__(self, journal: LeasedJournal) -> None:
        self.journal = journal
        self.completes = False
        self.state: str | None = None  # set once made, inside the batch's transaction
        self.claimed: list[Lease] = []  # leased in the same transaction (``LeasedJournal.claim_after``)

    def wants(self, events: Sequence[Event]) -> bool:
        self.completes = self.journal.succeed_on_completion and any(isinstance(e, RunCompleted) for e in events)
        return bool(self.journal.pending) or self.completes

    def __call__(self, tx: Tx, events: Sequence[Event], state: str, now: float) -> None:
        journal = self.journal
        assert journal.mover is not None
        moves = list(journal.pending)
        if self.completes:
            moves.append(Move(trigger="succeed", op_key="final", detail={"events": journal.appended + len(events)}))
        self.state = journal.mover(tx, journal.lease, state, now, moves)
        if self.completes and journal.claim_after is not None:
            self.claimed = journal.claim_after(tx)
