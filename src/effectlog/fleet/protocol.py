"""The fleet store Protocol: what runners, the recovery service and operators need from storage.

Two small halves. Writes: submit a request, list what is queued, claim, heartbeat,
advance (a lease owner's fenced, idempotent transition), find and recover expired
leases, operator actions. Reads: requests, attempts, history, the store's clock.
SQLite and PostgreSQL implement it; ``effectlog.fleet.contract.FleetContract`` is the
test suite every implementation must pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from effectlog.events import Event
from effectlog.fleet.leased_journal import FencedJournal, LeasedJournal
from effectlog.fleet.model import (
    AttemptView,
    Candidate,
    Expired,
    Heartbeat,
    HistoryRow,
    Lease,
    Move,
    Recovered,
    RequestView,
    Submitted,
    Verdict,
)
from effectlog.plan import Plan


@runtime_checkable
class FleetStore(Protocol):
    location: str

    # -- writes -----------------------------------------------------------------------

    def submit(
        self,
        scope: str,
        key: str,
        plan: Plan,
        requires: Sequence[str] = (),
        *,
        max_requeues: int = ...,
        requeue_backoff_s: float = ...,
    ) -> Submitted:
        """Create a request (and its first, queued attempt) unless ``(scope, key)`` exists.

        Same fingerprint: the existing request. Another fingerprint: ``IdempotencyConflict``.
        ``max_requeues`` bounds the automatic requeues of attempts lost before any step
        (each one ``requeue_backoff_s * 2**(n-1)`` seconds later); past it, ``needs_operator``.
        The plan is stored with its secret args as digests (``Plan.pinned``).
        """
        ...

    def candidates(self, limit: int) -> list[Candidate]:
        """Queued requests (due ones first, then those backing off), oldest first, for the scheduler."""
        ...

    def claim(self, request_id: int, runner_id: str, lease_s: float) -> Lease | None:
        """Lease the request's queued attempt with token ``MAX(token) + 1``; ``None`` if not queued."""
        ...

    def claim_next(self, runner_id: str, capabilities: Sequence[str], lease_s: float, limit: int = 1) -> list[Lease]:
        """Pick and lease up to ``limit`` due queued requests that fit ``capabilities``, oldest first, in one
        transaction that skips rows other claimers hold: one attempt per claim, however many runners race."""
        ...

    def watch(self, wake: Callable[[], None], wanted: Callable[[], bool] | None = None) -> None:
        """Call ``wake`` whenever an attempt may have been queued (a hint; poll on a timeout as well);
        ``wanted``: whether the caller could take work now (a store may skip looking while it cannot)."""
        ...

    def lease_held(self, lease: Lease) -> bool:
        """Whether ``lease`` is still current now, by the store's clock (a read: nothing is renewed)."""
        ...

    def heartbeat(self, lease: Lease, lease_s: float) -> Heartbeat:
        """Renew a current lease (else ``StaleLease``); reports a requested cancellation."""
        ...

    def advance(
        self,
        lease: Lease,
        trigger: str,
        *,
        op_key: str,
        reason: str = "",
        detail: dict[str, Any] | None = None,
        before: Sequence[Move] = (),
    ) -> str:
        """A lease owner's transition: fenced, checked against the attempt spec, idempotent by ``op_key``.

        ``before``: deferred transitions (``LeasedJournal.take``) made first, in the same transaction.
        """
        ...

    def expired(self, limit: int = 100) -> list[Expired]:
        """Live attempts whose lease has run out."""
        ...

    def recover(self, attempt_id: int, token: int, decide: Callable[[Sequence[bytes]], Verdict]) -> Recovered | None:
        """Apply ``decide`` (given the run's journal since the lease began) to an expired lease."""
        ...

    def operate(
        self, request_id: int, trigger: str, *, by: str, reason: str, attempt: int | None = None
    ) -> RequestView:
        """An operator's transition (``requeue``, ``give_up``), audited in the history; with ``attempt``,
        only while the request is at that attempt (the one the operator looked at), else ``DecisionStale``."""
        ...

    def cancel(self, request_id: int, *, by: str, reason: str, attempt: int | None = None) -> RequestView:
        """Ask for a request's cancellation (a queued one is withdrawn at once); ``attempt`` as in ``operate``."""
        ...

    # -- the runs' journal ------------------------------------------------------------

    def journal(self) -> FencedJournal:
        """The runs' journal in this store (unfenced appends: recovery and operators)."""
        ...

    def leased_journal(
        self, lease: Lease, before_append: Callable[[Sequence[Event]], None] | None = None
    ) -> LeasedJournal:
        """The journal as ``lease``'s holder writes it: every append fenced by the lease."""
        ...

    # -- reads ------------------------------------------------------------------------

    def now(self) -> float: ...

    def request(self, request_id: int) -> RequestView: ...

    def requests(self, states: Sequence[str] | None = None) -> list[RequestView]: ...

    def attempts(self, request_id: int | None = None) -> list[AttemptView]: ...

    def history(self, request_id: int | None = None) -> list[HistoryRow]: ...

    def close(self) -> None: ...

    def __enter__(self) -> FleetStore: ...

    def __exit__(self, *exc: object) -> None: ...
