"""The fleet's records: frozen msgspec Structs, shared by the store, the runner and the CLI."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from effectlog.canonical import digest


class Lease(msgspec.Struct, frozen=True, kw_only=True):
    """What a claim hands a runner. Every write it makes carries ``(attempt_id, runner_id, token)``.

    Two numbers name an attempt: ``attempt_id`` is unique in the store (JSON output and
    the database carry it), ``attempt_no`` counts the request's attempts from 1. Every
    message says "request R attempt N" with N the ``attempt_no``, as ``requests`` lists it.
    """

    request_id: int
    attempt_id: int
    attempt_no: int
    runner_id: str
    token: int
    expires_at: float  # seconds since the epoch, by the store's clock
    run_id: str
    plan: str  # the plan's JSON as submitted, secret args as their digests (``Plan.pinned``)
    cancel_requested: bool = False
    base_seq: int | None = None  # the run's head when leased (None: not told, as from older callers)


class RequestView(msgspec.Struct, frozen=True, kw_only=True):
    """An execution request; its ``state`` is the state of its latest attempt."""

    request_id: int
    scope: str
    key: str
    run_id: str
    fingerprint: str
    requires: tuple[str, ...]
    state: str
    attempt_id: int
    attempt_no: int
    created_at: float
    cancel_requested: bool = False
    finished_at: float | None = None
    requeues: int = 0  # automatic requeues since an operator last sent it round
    max_requeues: int = 3  # past this many, a lost attempt goes to needs_operator instead
    not_before: float | None = None  # a queued attempt backing off: not claimed before this time


class AttemptView(msgspec.Struct, frozen=True, kw_only=True):
    attempt_id: int
    request_id: int
    attempt_no: int
    state: str
    runner_id: str | None
    token: int | None
    lease_expires_at: float | None
    base_seq: int | None
    created_at: float


class HistoryRow(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt transition, append-only: who (actor and name) moved it, from where, why."""

    id: int
    attempt_id: int
    request_id: int
    transition: str
    event: str
    actor: str
    actor_name: str
    from_state: str
    to_state: str
    reason: str
    at: float
    detail: dict[str, Any] = {}


class Submitted(msgspec.Struct, frozen=True, kw_only=True):
    request: RequestView
    created: bool  # False: the same scope, key and fingerprint were already submitted


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """A queued request as the scheduler sees it."""

    request_id: int
    requires: tuple[str, ...]
    due: bool = True  # False: backing off after an automatic requeue, not to be claimed yet


class Offer(msgspec.Struct, frozen=True, kw_only=True):
    """What a runner declares when it asks for work."""

    runner_id: str
    capabilities: frozenset[str]
    free: int


class Heartbeat(msgspec.Struct, frozen=True, kw_only=True):
    expires_at: float
    cancel_requested: bool


class Expired(msgspec.Struct, frozen=True, kw_only=True):
    """A live attempt whose lease ran out: the recovery service's input."""

    attempt_id: int
    request_id: int
    token: int
    run_id: str


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """The recovery service's decision for an expired lease, and the evidence it read."""

    trigger: Literal["lose", "expire"]
    reason: str
    detail: dict[str, Any] = {}


class Recovered(msgspec.Struct, frozen=True, kw_only=True):
    attempt_id: int  # the store-wide id
    request_id: int
    state: str
    reason: str
    requeued_attempt: int | None = None  # the store-wide id of the new, queued attempt
    attempt_no: int = 0  # the request's own attempt number: what messages call "attempt N"


class Move(msgspec.Struct, frozen=True, kw_only=True):
    """A lease owner's transition as reported: trigger, operation key (its idempotency key), reason, detail."""

    trigger: str
    op_key: str
    reason: str = ""
    detail: dict[str, Any] = {}

    def digest(self) -> str:
        """The body an operation key is bound to (a retry with another body is ``IdempotencyConflict``)."""
        return digest({"transition": self.trigger, "reason": self.reason, "detail": self.detail})
