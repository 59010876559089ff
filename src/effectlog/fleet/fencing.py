"""Fencing and idempotency checks, run inside the transaction of the write they guard.

Shared by the store's own writes (heartbeat, transitions) and by the journals'
fenced appends, so "is this lease current?" has one answer, in one place.
``Tx`` and ``Dialect`` are the small SQL surface both backends provide.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, Protocol

from effectlog.errors import IdempotencyConflict, StaleLease
from effectlog.events import Event
from effectlog.fleet import attempts as am
from effectlog.fleet import limits
from effectlog.fleet.model import Lease

Lock = Literal["share", "update", "none"]
_TOKEN = re.compile(r"\{(\w+)\}")
_LIVE = am.sql_list(am.LIVE)


class Tx(Protocol):
    """One open transaction, as the operations below need it."""

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None: ...

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    def run(self, sql: str, params: Sequence[Any] = ()) -> int: ...

    def now(self) -> float:
        """Seconds since the epoch by the store's clock (the database's, on PostgreSQL)."""
        ...


class Dialect:
    """Table names, placeholder and row-lock clauses of one backend; SQL templates are formatted once."""

    def __init__(
        self, tables: dict[str, str], *, placeholder: str, locks: dict[str, str], writable_cte: bool = False
    ) -> None:
        self.values = {**tables, **locks}
        self.placeholder = placeholder
        self.writable_cte = writable_cte  # INSERT inside WITH (PostgreSQL): a check and its record in one statement
        self._cache: dict[str, str] = {}

    def sql(self, template: str) -> str:
        done = self._cache.get(template)
        if done is None:
            done = _TOKEN.sub(lambda m: self.values[m.group(1)], template)
            if self.placeholder != "?":
                done = done.replace("?", self.placeholder)
            self._cache[template] = done
        return done


class Checked(NamedTuple):
    """What ``check_op`` found: the attempt's state, a requested cancellation, the store's clock, and the
    stored result when this attempt already made the operation with the same body (else ``None``)."""

    state: str
    cancel: bool
    now: float
    replayed: str | None
    recorded: bool = False  # the operation record was written by the check itself (``record``)


_CHECK = (
    "SELECT a.state, r.cancel_requested_at, a.runner_id, a.fencing_token, a.lease_expires_at, o.digest,"
    " o.result, {clock} AS t FROM {attempts} a JOIN {requests} r ON r.request_id = a.request_id"
    " LEFT JOIN {operations} o ON o.attempt_id = a.attempt_id AND o.op_key = ?"
    " WHERE a.attempt_id = ?"
)
# The lease is current (unexpired, no further than MAX_LEASE_S ahead) and the operation was not made before.
_ADMITTED = (
    "c.digest IS NULL AND c.runner_id = ? AND c.fencing_token = ?"
    f" AND c.state IN {_LIVE} AND c.lease_expires_at > c.t AND c.lease_expires_at <= c.t + ?"
)
# The same check that also records the operation when it passes (and was not made before); a
# check that then fails in Python raises, and the transaction takes the record back with it.
_CHECK_AND_RECORD = (
    "WITH c AS (" + _CHECK + "{lock}),"
    " r AS (INSERT INTO {operations} (attempt_id, op_key, digest, result, at)"
    " SELECT ?, ?, ?, ?, c.t FROM c WHERE " + _ADMITTED + ")"
)


def check_op(
    tx: Tx,
    d: Dialect,
    lease: Lease,
    op_key: str,
    body_digest: str,
    *,
    lock: Lock,
    record: str | None = None,
    insert: tuple[str, Sequence[Any]] | None = None,
) -> Checked:
    """``replayed`` and ``check_lease`` in ONE statement (with the database's clock on PostgreSQL).

    The operation already made with this body: its stored result, live lease or not (the
    same key with another body is ``IdempotencyConflict``, under another lease ``StaleLease``).
    Otherwise the lease must be current and unexpired (else ``StaleLease``), and ``lock``
    holds the attempt row until the transaction ends, as in ``check_lease``. ``record``: on
    a dialect with writable CTEs, also record the operation with this result in the same
    statement (``Checked.recorded``); the caller records it otherwise. ``insert``: with
    ``record``, an ``INSERT ... SELECT ... FROM (VALUES ...) v`` (and its parameters) that
    the same statement runs only when it records the operation, i.e. only for a current
    lease and a batch not written before (a fenced append in one statement).
    """
    clause = {"share": " {share}", "update": " {update}", "none": ""}[lock]
    if record is not None and d.writable_cte:
        params: list[Any] = [
            op_key, lease.attempt_id,
            lease.attempt_id, op_key, body_digest, record, lease.runner_id, lease.token, limits.MAX_LEASE_S,
        ]  # fmt: skip
        sql = d.sql(_CHECK_AND_RECORD.replace("{lock}", clause))
        if insert is not None:
            # The batch's rows, inserted by the same statement only when the same check admits them.
            sql += f", w AS ({insert[0]}, c WHERE {d.sql(_ADMITTED)})"
            params += [*insert[1], lease.runner_id, lease.token, limits.MAX_LEASE_S]
        row = tx.one(sql + " SELECT * FROM c", params)
    else:
        assert insert is None, "rows ride in the check only on a dialect with writable CTEs"
        row = tx.one(d.sql(_CHECK + clause), (op_key, lease.attempt_id))
    now = tx.now() if row is None or row[7] is None else float(row[7])
    if row is None:
        raise stale(tx, d, lease, now)
    state, cancel, runner, token, expires = str(row[0]), row[1] is not None, row[2], row[3], row[4]
    mine = (runner, None if token is None else int(token)) == (lease.runner_id, lease.token)
    if row[5] is not None:
        if not mine:
            raise stale(tx, d, lease, now)
        if row[5] != body_digest:
            raise IdempotencyConflict(
                f"operation {op_key!r} of request {lease.request_id} attempt {lease.attempt_no} was already "
                "reported with another body",
                run_id=lease.run_id,
                attempt_id=lease.attempt_id,
                op_key=op_key,
            )
        return Checked(state, cancel, now, str(row[6]))
    live = expires is not None and now < float(expires) <= now + limits.MAX_LEASE_S  # NaN compares False
    if not (mine and live and state in am.LIVE):
        raise stale(tx, d, lease, now)
    return Checked(state, cancel, now, None, recorded=record is not None and d.writable_cte)


def check_lease(tx: Tx, d: Dialect, lease: Lease, now: float, *, lock: Lock) -> tuple[str, bool]:
    """``(attempt state, cancel requested)`` while ``lease`` is the current unexpired lease; else ``StaleLease``.

    ``lock`` holds the attempt row until the transaction ends (PostgreSQL; SQLite's
    ``BEGIN IMMEDIATE`` already holds the whole database), so the recovery service
    cannot expire the lease between this check and the write it guards.
    """
    clause = {"share": " {share}", "update": " {update}", "none": ""}[lock]
    row = tx.one(
        d.sql(
            "SELECT a.state, r.cancel_requested_at FROM {attempts} a JOIN {requests} r ON r.request_id = a.request_id"
            " WHERE a.attempt_id = ? AND a.runner_id = ? AND a.fencing_token = ? AND a.lease_expires_at > ?"
            f" AND a.lease_expires_at <= ? AND a.state IN {_LIVE}" + clause
        ),
        (lease.attempt_id, lease.runner_id, lease.token, now, now + limits.MAX_LEASE_S),
    )
    if row is None:
        raise stale(tx, d, lease, now)
    return str(row[0]), row[1] is not None


def stale(tx: Tx, d: Dialect, lease: Lease, now: float) -> StaleLease:
    """Why ``lease`` is not current, in words (the attempt's state, the newest token)."""
    row = tx.one(
        d.sql("SELECT state, runner_id, fencing_token, lease_expires_at FROM {attempts} WHERE attempt_id = ?"),
        (lease.attempt_id,),
    )
    newest = tx.one(d.sql("SELECT MAX(fencing_token) FROM {attempts} WHERE request_id = ?"), (lease.request_id,))
    fields: dict[str, Any] = {
        "attempt_id": lease.attempt_id,
        "attempt_no": lease.attempt_no,
        "request_id": lease.request_id,
        "runner": lease.runner_id,
        "token": lease.token,
    }
    if row is None:
        why = "no such attempt"
    elif (row[1], row[2]) != (lease.runner_id, lease.token):
        why = f"request {lease.request_id} attempt {lease.attempt_no} is leased to {row[1]!r} with token {row[2]}"
    elif row[0] not in am.LIVE:
        why = f"request {lease.request_id} attempt {lease.attempt_no} is {row[0]}"
    elif row[3] is None or not float(row[3]) <= now + limits.MAX_LEASE_S:  # NULL, NaN, inf: no lease we grant
        why = f"its lease expiry {row[3]!r} is not a valid time: taken back as expired"
    else:
        why = f"the lease expired {now - float(row[3]):.3f}s ago"
    if newest is not None and newest[0] is not None and int(newest[0]) > lease.token:
        why += f"; the request's newest fencing token is {int(newest[0])}"
    return StaleLease(
        f"write refused: token {lease.token} of runner {lease.runner_id!r} is not the current lease ({why})",
        run_id=lease.run_id,
        **fields,
    )


def replayed(tx: Tx, d: Dialect, lease: Lease, op_key: str, body_digest: str) -> str | None:
    """The stored result when this attempt already made operation ``op_key`` with the same body."""
    row = tx.one(
        d.sql(
            "SELECT o.digest, o.result, a.runner_id, a.fencing_token FROM {operations} o"
            " JOIN {attempts} a ON a.attempt_id = o.attempt_id WHERE o.attempt_id = ? AND o.op_key = ?"
        ),
        (lease.attempt_id, op_key),
    )
    if row is None:
        return None
    if (row[2], row[3]) != (lease.runner_id, lease.token):
        raise stale(tx, d, lease, tx.now())
    if row[0] != body_digest:
        raise IdempotencyConflict(
            f"operation {op_key!r} of request {lease.request_id} attempt {lease.attempt_no} was already reported "
            "with another body",
            run_id=lease.run_id,
            attempt_id=lease.attempt_id,
            op_key=op_key,
        )
    return str(row[1])


def record_operation(
    tx: Tx, d: Dialect, lease: Lease, op_key: str, *, body_digest: str, result: str, now: float
) -> None:
    tx.run(
        d.sql("INSERT INTO {operations} (attempt_id, op_key, digest, result, at) VALUES (?, ?, ?, ?, ?)"),
        (lease.attempt_id, op_key, body_digest, result, now),
    )


def batch_identity(events: Sequence[Event], encoded: Sequence[bytes]) -> tuple[str, str]:
    """The operation key and body digest of a batch of journal events (one run)."""
    run_ids = {e.run_id for e in events}
    key = f"events:{','.join(sorted(run_ids))}:{events[0].seq}-{events[-1].seq}"
    h = hashlib.sha256()
    for body in encoded:
        h.update(len(body).to_bytes(8, "big"))
        h.update(body)
    return key, h.hexdigest()


def check_batch_runs(events: Sequence[Event], lease: Lease) -> None:
    """A lease covers its own run only."""
    for event in events:
        if event.run_id != lease.run_id:
            raise StaleLease(
                f"a lease on run {lease.run_id!r} cannot write run {event.run_id!r}",
                run_id=event.run_id,
                attempt_id=lease.attempt_id,
            )


class Carry(Protocol):
    """Lease-owner transitions that ride in an append's transaction instead of one of their own."""

    def wants(self, events: Sequence[Event]) -> bool:
        """Whether this batch carries any (the fence then locks the attempt row for update)."""
        ...

    def __call__(self, tx: Tx, events: Sequence[Event], state: str, now: float) -> None:
        """Make them, after the batch's inserts, in its transaction, from the attempt's ``state``."""
        ...


class LeaseFence:
    """A lease as the journal's ``Fence``: the batch is admitted only while the lease is current.

    In the append's transaction, in one statement (``check_op``): a batch this attempt
    already wrote with the same bytes is admitted as "already written" (the journal
    returns its records); else the lease is checked (row lock ``share`` on PostgreSQL,
    ``update`` when the batch carries transitions). After the inserts the operation is
    recorded, so a retried batch is known, and the carried transitions are made.
    """

    def __init__(self, lease: Lease, dialect: Dialect, tx_of: Callable[[Any], Tx], carry: Carry | None = None) -> None:
        self.lease = lease
        self.dialect = dialect
        self.tx_of = tx_of
        self.carry = carry
        self._op: tuple[str, str] = ("", "")
        self._checked = Checked("", False, 0.0, None)

    def admit(self, conn: Any, events: Sequence[Event], encoded: Sequence[bytes]) -> bool:
        return self.admit_inserting(conn, events, encoded, None)

    def admit_inserting(
        self, conn: Any, events: Sequence[Event], encoded: Sequence[bytes], insert: tuple[str, Sequence[Any]] | None
    ) -> bool:
        """``admit``; with ``insert`` (writable CTEs only), the batch's rows go in with the same statement.

        True: admitted, and the rows of ``insert`` were written. False: this very batch was
        already written under this lease (nothing inserted). Else it raises, and the
        transaction takes back whatever the statement wrote.
        """
        check_batch_runs(events, self.lease)
        tx = self.tx_of(conn)
        self._op = op_key, body = batch_identity(events, encoded)
        lock: Lock = "update" if self.carry is not None and self.carry.wants(events) else "share"
        self._checked = check_op(tx, self.dialect, self.lease, op_key, body, lock=lock, record="", insert=insert)
        return self._checked.replayed is None

    @property
    def inserts(self) -> bool:
        """Whether ``admit_inserting`` can take the batch's rows (a dialect with writable CTEs)."""
        return self.dialect.writable_cte

    def written(self, conn: Any, events: Sequence[Event], encoded: Sequence[bytes]) -> None:
        op_key, body = self._op
        tx, now = self.tx_of(conn), self._checked.now
        if not self._checked.recorded:
            record_operation(tx, self.dialect, self.lease, op_key, body_digest=body, result="", now=now)
        if self.carry is not None and self.carry.wants(events):
            self.carry(tx, events, self._checked.state, now)
