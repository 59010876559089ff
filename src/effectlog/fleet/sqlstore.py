"""The fleet store's operations, written once over a small SQL dialect.

``SqliteFleetStore`` and ``PostgresFleetStore`` differ only in how they open a
transaction, how they lock rows, whose clock is "now" and their DDL; what a claim, a
heartbeat or a recovery *means* is here, once. Every write runs in one transaction:

* a claim leases the request's queued attempt with ``MAX(fencing_token) + 1``;
* a lease-owner write is accepted only while ``(attempt, runner, token)`` is the
  current, unexpired lease (``check_lease``), else ``StaleLease``;
* a lease-owner report carries an operation key: the same key with the same body is
  a no-op, with another body ``IdempotencyConflict``;
* every attempt transition is checked against ``specs/attempt.toml`` (actor
  included) and appended to the history table, which the database keeps append-only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import msgspec

from effectlog import spelling
from effectlog.canonical import canonical_json, digest_bytes, trusted_json
from effectlog.errors import (
    BadInput,
    DecisionStale,
    IdempotencyConflict,
    IntegrityError,
    NotReconcilable,
    PlanMismatch,
)
from effectlog.fleet import attempts as am
from effectlog.fleet import limits
from effectlog.fleet.fencing import Dialect, Tx, check_lease, check_op, record_operation, replayed
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

Decide = Callable[[Sequence[bytes]], Verdict]
_MAX_TEXT = 200
_LIVE = am.sql_list(am.LIVE)
# A live attempt whose lease is over: run out, or not a lease this version grants (NULL; NaN and
# infinity, which SQLite stores as NULL and Inf and PostgreSQL orders above every number).
_LEASE_OVER = "(a.lease_expires_at IS NULL OR a.lease_expires_at <= ? OR a.lease_expires_at > ?)"
# Automatic requeues (``lose``) of a request since an operator last sent it round again.
_REQUEUES = (
    "SELECT COUNT(*) FROM {history} h WHERE h.request_id = r.request_id AND h.transition = 'lose'"
    " AND h.id > COALESCE((SELECT MAX(o.id) FROM {history} o WHERE o.request_id = r.request_id"
    " AND o.transition = 'requeue'), 0)"
)
_REQUEST = (
    "SELECT r.request_id, r.scope, r.idem_key, r.run_id, r.fingerprint, r.requires, a.state, a.attempt_id,"
    " a.attempt_no, r.created_at, r.cancel_requested_at, r.finished_at, r.max_requeues, a.not_before,"
    f" ({_REQUEUES})"
    " FROM {requests} r JOIN {attempts} a ON a.attempt_id = r.current_attempt"
)
# The queued attempts a runner may lease now, oldest request first, with the token and base each
# lease gets. Parameters: now, the capabilities offered (a JSON array), how many. A request fits
# when every capability it requires is offered (``scheduler.fits``); a queued attempt is always
# its request's current one (one open attempt per request).
_PICK = (
    "SELECT a.attempt_id, a.request_id, a.attempt_no, r.run_id, r.plan, r.cancel_requested_at,"
    " (SELECT COALESCE(MAX(b.fencing_token), 0) + 1 FROM {attempts} b WHERE b.request_id = a.request_id),"
    " {run_head_r}"
    " FROM {attempts} a JOIN {requests} r ON r.request_id = a.request_id"
    f" WHERE a.state = '{am.QUEUED}' AND (a.not_before IS NULL OR a.not_before <= ?) AND {{fits}}"
    " ORDER BY a.request_id LIMIT ?"
)
# How the fleet reads a run's journal rows: keyed ``(run_id, seq)`` (the PostgreSQL journal) unless the
# dialect names its own statements (the SQLite journal's schema v2, rowids ``run << 32 | seq``:
# ``sqlite_journal.SQLITE``). ``run_head_r``: the last seq of request ``r``'s run; ``run_head``: of the
# run ``?``; ``bodies_after``: the run ``?``'s bodies after seq ``?``, in order.
EVENT_READS = {
    "run_head_r": "(SELECT COALESCE(MAX(e.seq), 0) FROM {events} e WHERE e.run_id = r.run_id)",
    "run_head": "SELECT COALESCE(MAX(seq), 0) FROM {events} WHERE run_id = ?",
    "bodies_after": "SELECT body FROM {events} WHERE run_id = ? AND seq > ? ORDER BY seq",
}


def _event_sql(d: Dialect, template: str) -> str:
    """``d.sql`` of ``template`` with its event reads (``EVENT_READS``) as the dialect's journal keeps them."""
    for name, default in EVENT_READS.items():
        template = template.replace("{" + name + "}", d.values.get(name) or default)
    return d.sql(template)


_ATTEMPT = (
    "SELECT attempt_id, request_id, attempt_no, state, runner_id, fencing_token, lease_expires_at, base_seq,"
    " created_at FROM {attempts}"
)
_HISTORY = (
    "SELECT id, attempt_id, request_id, transition, event, actor, actor_name, from_state, to_state, reason, at,"
    " detail FROM {history}"
)


def _over(now: float) -> tuple[float, float]:
    """The parameters of ``_LEASE_OVER`` at ``now``."""
    return now, now + limits.MAX_LEASE_S


def _request_view(row: tuple[Any, ...]) -> RequestView:
    return RequestView(
        request_id=int(row[0]),
        scope=row[1],
        key=row[2],
        run_id=row[3],
        fingerprint=row[4],
        requires=tuple(msgspec.json.decode(row[5])),
        state=row[6],
        attempt_id=int(row[7]),
        attempt_no=int(row[8]),
        created_at=float(row[9]),
        cancel_requested=row[10] is not None,
        finished_at=None if row[11] is None else float(row[11]),
        max_requeues=int(row[12]),
        not_before=None if row[13] is None else float(row[13]),
        requeues=int(row[14]),
    )


def _attempt_view(row: tuple[Any, ...]) -> AttemptView:
    return AttemptView(
        attempt_id=int(row[0]),
        request_id=int(row[1]),
        attempt_no=int(row[2]),
        state=row[3],
        runner_id=row[4],
        token=None if row[5] is None else int(row[5]),
        lease_expires_at=None if row[6] is None else float(row[6]),
        base_seq=None if row[7] is None else int(row[7]),
        created_at=float(row[8]),
    )


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """One attempt transition about to be written: who makes it, from where to where, and why."""

    attempt_id: int
    request_id: int
    trigger: str
    actor: str
    actor_name: str
    state: str
    new: str
    now: float
    reason: str = ""
    detail: dict[str, Any] = {}
    not_before: float | None = None  # a requeue's new attempt: not claimable before this time (backoff)


# -- the store ----------------------------------------------------------------------


def _check_text(name: str, value: str) -> None:
    # isprintable, not "no character below 32": U+2028/U+2029/NEL end a line for str.splitlines and many
    # viewers, C1 controls and DEL are terminal escapes, format characters (RTL override, zero width)
    # make one key look like another; all were stored and printed raw (attack14).
    if not value.strip() or len(value) > _MAX_TEXT or not value.replace(" ", "x").isprintable():
        raise BadInput(f"{name}: give a non-empty single line of at most {_MAX_TEXT} characters")


def _offer(runner_id: str, capabilities: Sequence[str], lease_s: float, limit: int) -> str:
    """A claim's arguments checked, and what the runner offers as the pick compares it (canonical JSON)."""
    _check_text("runner id", runner_id)
    limits.seconds("lease_s", lease_s, high=limits.MAX_LEASE_S)
    limits.count("claim limit", limit, low=1, high=limits.MAX_CAPACITY)
    return canonical_json(sorted(set(capabilities))).decode()


def _bound(request_id: int, attempt: int | None, current: int) -> None:
    """``DecisionStale`` unless the operator's decision is about the request's current attempt (None: not bound).

    A page (or a notification) shows one attempt; by the time the decision is posted another
    operator may have requeued it and the next attempt may wait for a person for another reason.
    """
    if attempt is not None and attempt != current:
        raise DecisionStale(
            f"request {request_id}: the decision is about attempt {attempt}, but the request is at attempt "
            f"{current} now; look at it again before deciding; nothing was written",
            request_id=request_id,
        )


def request_fingerprint(
    plan: Plan,
    requires: Sequence[str],
    max_requeues: int = limits.DEFAULT_MAX_REQUEUES,
    requeue_backoff_s: float = limits.DEFAULT_REQUEUE_BACKOFF_S,
) -> str:
    """What makes two submissions the same request: the plan (secret args as digests), its needs, its requeue policy.

    The policy counts only when it is not the default, so requests submitted before it
    existed keep their fingerprint.
    """
    body: dict[str, Any] = {"plan": plan.pinned(), "requires": sorted(set(requires))}
    if (max_requeues, requeue_backoff_s) != (limits.DEFAULT_MAX_REQUEUES, limits.DEFAULT_REQUEUE_BACKOFF_S):
        body["requeue"] = {"max": max_requeues, "backoff_s": requeue_backoff_s}
    return digest_bytes(trusted_json(body))  # pinned() checked the plan's values; the policy is checked numbers


_INSERT_HISTORY = (
    "INSERT INTO {history} (attempt_id, request_id, transition, event, actor, actor_name, from_state,"
    " to_state, reason, at, detail) VALUES "
)


def _history_row(c: Change) -> tuple[Any, ...]:
    return (
        c.attempt_id,
        c.request_id,
        c.trigger,
        am.event_of(c.trigger),
        c.actor,
        c.actor_name,
        c.state,
        c.new,
        c.reason,
        c.now,
        canonical_json(c.detail).decode(),
    )


# A lease still current: its attempt live, its runner and token, unexpired by the database's clock (PostgreSQL)
# or, where the dialect has none (SQLite's is NULL), the process's (as ``SqliteTx.now``).
_HELD = (
    "SELECT 1 FROM {attempts} WHERE attempt_id = ? AND runner_id = ? AND fencing_token = ?"
    f" AND state IN {am.sql_list(am.LIVE)} AND lease_expires_at > COALESCE({{clock}}, ?)"
)


class SqlFleetStore:
    """The operations of ``effectlog.fleet.protocol.FleetStore``; subclasses supply ``_tx`` and the dialect."""

    dialect: Dialect
    location: str
    # Whether a batch's consecutive lease-owner transitions are written together (``_owner_moves``).
    owner_moves_together = False

    def _tx(self, *, write: bool = True) -> AbstractContextManager[Tx]:
        """A transaction; ``write=False`` promises no writes (SQLite then takes no write lock)."""
        raise NotImplementedError

    # -- requests -------------------------------------------------------------------

    def submit(
        self,
        scope: str,
        key: str,
        plan: Plan,
        requires: Sequence[str] = (),
        *,
        max_requeues: int = limits.DEFAULT_MAX_REQUEUES,
        requeue_backoff_s: float = limits.DEFAULT_REQUEUE_BACKOFF_S,
    ) -> Submitted:
        _check_text("--scope", scope)
        _check_text("--key", key)
        for cap in requires:
            _check_text("--requires", cap)
        limits.count("--max-requeues", max_requeues, low=0, high=limits.MAX_REQUEUES)
        backoff = limits.seconds("--requeue-backoff-s", requeue_backoff_s, high=limits.MAX_BACKOFF_S, zero=True)
        needs = sorted(set(requires))
        policy = (max_requeues, backoff)
        fingerprint = request_fingerprint(plan, needs, *policy)
        plan_json = trusted_json(plan.pinned()).decode()  # secret values never enter the store
        d = self.dialect
        with self._tx() as tx:
            if not (scope + key).isascii() or scope.strip() != scope or key.strip() != key:
                self._refuse_look_alike(tx, scope, key)
            now = tx.now()
            row = tx.one(
                d.sql(
                    "INSERT INTO {requests} (scope, idem_key, fingerprint, run_id, plan, requires, created_at,"
                    " max_requeues, requeue_backoff_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT DO NOTHING RETURNING request_id"
                ),
                (scope, key, fingerprint, plan.run_id, plan_json, canonical_json(needs).decode(), now, *policy),
            )
            if row is None:
                return self._existing(tx, scope, key, fingerprint, plan.run_id)
            request_id = int(row[0])
            self._new_attempt(tx, request_id, 1, now)
            return Submitted(request=self._request(tx, request_id), created=True)

    def _refuse_look_alike(self, tx: Tx, scope: str, key: str) -> None:
        """``BadInput`` for a new request whose scope or key an operator (or a client's retry) could not tell
        from another: an edge of whitespace, or another Unicode spelling of a scope there or of a key in its
        scope (``effectlog.spelling``); a retry under it would be a second request, so a second run. A
        request already there under such a scope and key is found as before."""
        d = self.dialect
        if tx.one(d.sql("SELECT 1 FROM {requests} WHERE scope = ? AND idem_key = ?"), (scope, key)) is not None:
            return

        def scopes() -> list[str]:
            return [str(row[0]) for row in tx.all(d.sql("SELECT DISTINCT scope FROM {requests}"))]

        def keys() -> list[str]:
            return [str(row[0]) for row in tx.all(d.sql("SELECT idem_key FROM {requests} WHERE scope = ?"), (scope,))]

        refusal = spelling.new_id_refusal(scope, "--scope", scopes) or spelling.new_id_refusal(key, "--key", keys)
        if refusal is not None:
            raise BadInput(refusal)

    def _existing(self, tx: Tx, scope: str, key: str, fingerprint: str, run_id: str) -> Submitted:
        d = self.dialect
        found = tx.one(d.sql(_REQUEST + " WHERE r.scope = ? AND r.idem_key = ?"), (scope, key))
        if found is not None:
            view = _request_view(found)
            if view.fingerprint != fingerprint:
                raise IdempotencyConflict(
                    f"scope {scope!r} key {key!r} is request {view.request_id}, submitted with another plan, "
                    f"requirements or requeue policy (fingerprint {view.fingerprint[:12]}, given {fingerprint[:12]}); "
                    "use a new key",
                    request_id=view.request_id,
                )
            return Submitted(request=view, created=False)
        other = tx.one(d.sql("SELECT request_id, scope, idem_key FROM {requests} WHERE run_id = ?"), (run_id,))
        if other is None:  # the conflicting row was there a moment ago; the database says it is gone
            raise IntegrityError(f"submit: a conflicting request vanished (scope {scope!r}, key {key!r})")
        raise PlanMismatch(
            f"run id {run_id!r} already belongs to request {other[0]} (scope {other[1]!r}, key {other[2]!r}); "
            "give the plan its own run_id",
            run_id=run_id,
        )

    def _new_attempt(
        self, tx: Tx, request_id: int, attempt_no: int, now: float, not_before: float | None = None
    ) -> int:
        d = self.dialect
        row = tx.one(
            d.sql(
                "INSERT INTO {attempts} (request_id, attempt_no, state, created_at, not_before) VALUES (?, ?, ?, ?, ?)"
                " RETURNING attempt_id"
            ),
            (request_id, attempt_no, am.QUEUED, now, not_before),
        )
        assert row is not None
        tx.run(d.sql("UPDATE {requests} SET current_attempt = ? WHERE request_id = ?"), (row[0], request_id))
        self._queued(tx)
        return int(row[0])

    def _queued(self, tx: Tx) -> None:
        """Signal idle runners' watchers (``effectlog.fleet.wakeups``) that an attempt is queued, on commit."""

    def watch(self, wake: Callable[[], None], wanted: Callable[[], bool] | None = None) -> None:
        """Call ``wake`` (from a thread of the store's) whenever an attempt may have been queued, until ``close``.

        A hint, never a promise: callers still look for work on a timeout of their own, and look
        again whenever ``wanted`` turns true (a runner whose slots free up claims at once).
        """

    def _request(self, tx: Tx, request_id: int) -> RequestView:
        row = tx.one(self.dialect.sql(_REQUEST + " WHERE r.request_id = ?"), (request_id,))
        if row is None:
            raise BadInput(f"no request {request_id} in {self.location}")
        return _request_view(row)

    # -- scheduling and leases --------------------------------------------------------

    def candidates(self, limit: int) -> list[Candidate]:
        """Queued requests, those due first, oldest first: what the (pure) scheduler chooses from.

        A request backing off after an automatic requeue is listed as not ``due``: no
        runner claims it yet, and a runner told to exit when idle still waits for it.
        """
        with self._tx(write=False) as tx:
            now = tx.now()
            due = "(a.not_before IS NULL OR a.not_before <= ?)"
            rows = tx.all(
                self.dialect.sql(
                    f"SELECT r.request_id, r.requires, CASE WHEN {due} THEN 1 ELSE 0 END AS due FROM {{requests}} r"
                    " JOIN {attempts} a ON a.attempt_id = r.current_attempt"
                    " WHERE a.state = ? ORDER BY due DESC, r.request_id LIMIT ?"
                ),
                (now, am.QUEUED, limit),
            )
        return [
            Candidate(request_id=int(r[0]), requires=tuple(msgspec.json.decode(r[1])), due=bool(r[2])) for r in rows
        ]

    def claim(self, request_id: int, runner_id: str, lease_s: float) -> Lease | None:
        """Lease the request's queued attempt to ``runner_id``; ``None`` if it is not queued (any more)."""
        _check_text("runner id", runner_id)
        limits.seconds("lease_s", lease_s, high=limits.MAX_LEASE_S)
        d = self.dialect
        with self._tx() as tx:
            now = tx.now()
            row = tx.one(
                d.sql(
                    "SELECT a.attempt_id, a.state, a.attempt_no, r.run_id, r.plan, r.cancel_requested_at, a.not_before"
                    " FROM {requests} r JOIN {attempts} a ON a.attempt_id = r.current_attempt"
                    " WHERE r.request_id = ? {claim}"
                ),
                (request_id,),
            )
            if row is None or row[1] != am.QUEUED or (row[6] is not None and float(row[6]) > now):
                return None  # not queued, or backing off after an automatic requeue
            attempt_id, attempt_no, run_id, plan = int(row[0]), int(row[2]), row[3], row[4]
            token_row = tx.one(
                d.sql("SELECT COALESCE(MAX(fencing_token), 0) + 1 FROM {attempts} WHERE request_id = ?"),
                (request_id,),
            )
            base_row = tx.one(_event_sql(d, "{run_head}"), (run_id,))
            assert token_row is not None
            assert base_row is not None
            token, base_seq = int(token_row[0]), int(base_row[0])
            return self._lease(
                tx,
                (attempt_id, request_id, attempt_no, str(run_id), str(plan), row[5] is not None),
                runner_id,
                (token, base_seq),
                (now, lease_s),
            )

    def _lease(
        self,
        tx: Tx,
        attempt: tuple[int, int, int, str, str, bool],
        runner_id: str,
        fence: tuple[int, int],
        when: tuple[float, float],
    ) -> Lease | None:
        """Lease a queued attempt (``attempt``: its id, request id, number, run id, plan, whether a
        cancel was asked) with ``fence`` (token, base seq) at ``when`` (now, lease seconds), and record
        it; ``None`` if it is not queued any more (the UPDATE's own state check: one of two racing
        claimers wins)."""
        attempt_id, request_id, attempt_no, run_id, plan, cancel_requested = attempt
        token, base_seq = fence
        now, lease_s = when
        new = am.move(am.QUEUED, "lease", "scheduler")
        expires = now + lease_s
        moved = tx.run(
            self.dialect.sql(
                "UPDATE {attempts} SET state = ?, runner_id = ?, fencing_token = ?, lease_expires_at = ?,"
                " base_seq = ? WHERE attempt_id = ? AND state = ?"
            ),
            (new, runner_id, token, expires, base_seq, attempt_id, am.QUEUED),
        )
        if moved != 1:
            return None
        self._history(
            tx,
            Change(
                attempt_id=attempt_id,
                request_id=request_id,
                trigger="lease",
                actor="scheduler",
                actor_name=runner_id,
                state=am.QUEUED,
                new=new,
                now=now,
                detail={"token": token},
            ),
        )
        return Lease(
            request_id=request_id,
            attempt_id=attempt_id,
            attempt_no=attempt_no,
            runner_id=runner_id,
            token=token,
            expires_at=expires,
            run_id=run_id,
            plan=plan,
            cancel_requested=cancel_requested,
            base_seq=base_seq,
        )

    def claim_next(self, runner_id: str, capabilities: Sequence[str], lease_s: float, limit: int = 1) -> list[Lease]:
        """Lease up to ``limit`` due queued requests this runner's capabilities cover, oldest first.

        The pick and the lease are one transaction (on PostgreSQL one statement): the
        store, not the runner, chooses among the queued requests, and rows another
        claimer holds are skipped, so every call makes exactly one attempt and runners
        racing for the same queue take different requests instead of losing on the
        oldest one. Compatibility is the scheduler's (``fits``): every capability the
        request requires is one the runner offers. Tokens and leases are those of ``claim``.
        """
        return self._claim_next(runner_id, _offer(runner_id, capabilities, lease_s, limit), lease_s, limit)

    def _claim_next(self, runner_id: str, offered: str, lease_s: float, limit: int) -> list[Lease]:
        """``claim_next`` in one write transaction: pick (skipping rows other claimers lock), lease, record."""
        with self._tx() as tx:
            return self._lease_next(tx, runner_id, offered, lease_s, limit)

    def _lease_next(self, tx: Tx, runner_id: str, offered: str, lease_s: float, limit: int) -> list[Lease]:
        """``_claim_next`` in an open write transaction (also ``SqliteFleetStore.claim_within``'s)."""
        d = self.dialect
        leases: list[Lease] = []
        now = tx.now()
        rows = tx.all(_event_sql(d, _PICK + " {claim}"), (now, offered, limit))
        for row in rows:
            attempt = (int(row[0]), int(row[1]), int(row[2]), str(row[3]), str(row[4]), row[5] is not None)
            lease = self._lease(tx, attempt, runner_id, (int(row[6]), int(row[7])), (now, lease_s))
            if lease is not None:
                leases.append(lease)
        return leases

    def heartbeat(self, lease: Lease, lease_s: float) -> Heartbeat:
        """Renew the lease; tells the owner whether an operator asked to cancel."""
        limits.seconds("lease_s", lease_s, high=limits.MAX_LEASE_S)
        d = self.dialect
        with self._tx() as tx:
            now = tx.now()
            _, cancel = check_lease(tx, d, lease, now, lock="update")
            tx.run(
                d.sql("UPDATE {attempts} SET lease_expires_at = ? WHERE attempt_id = ?"),
                (now + lease_s, lease.attempt_id),
            )
        return Heartbeat(expires_at=now + lease_s, cancel_requested=cancel)

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
        """A lease owner's transition, fenced and idempotent by ``op_key``; returns the attempt's new state.

        ``before``: transitions deferred until now (``LeasedJournal.defer``), made first in
        the same transaction.
        """
        d = self.dialect
        move = Move(trigger=trigger, op_key=op_key, reason=reason, detail=detail or {})
        with self._tx() as tx:
            checked = check_op(tx, d, lease, op_key, move.digest(), lock="update")
            if checked.replayed is not None:
                return checked.replayed
            return self.carry(tx, lease, checked.state, checked.now, [*before, move])

    def carry(self, tx: Tx, lease: Lease, state: str, now: float, moves: Sequence[Move]) -> str:
        """Lease-owner transitions in an open transaction whose lease check found the attempt in ``state``.

        Each is checked against the spec and recorded with its operation key; one the spec
        does not allow from ``state`` but recorded already with the same body (a retry whose
        commit was not acknowledged) is passed over. Returns the attempt's state after them.
        """
        d = self.dialect
        # Written together after the loop only when no operation key repeats: a repeated one is looked up
        # (``replayed``) and must find what the moves before it wrote.
        made: list[tuple[Change, Move]] | None = [] if len({m.op_key for m in moves}) == len(moves) else None
        for move in moves:
            if not am.allowed(state, move.trigger) and replayed(tx, d, lease, move.op_key, move.digest()) is not None:
                continue
            new = am.move(state, move.trigger, "lease_owner")
            change = Change(
                attempt_id=lease.attempt_id,
                request_id=lease.request_id,
                trigger=move.trigger,
                actor="lease_owner",
                actor_name=lease.runner_id,
                state=state,
                new=new,
                now=now,
                reason=move.reason,
                detail=move.detail,
            )
            if made is None:
                self._owner_move(tx, lease, change, move)
            else:
                made.append((change, move))
            state = new
        if made:
            self._owner_moves(tx, lease, made)
        return state

    def _owner_moves(self, tx: Tx, lease: Lease, made: Sequence[tuple[Change, Move]]) -> None:
        """Consecutive lease-owner transitions, in order, with their operation records.

        With ``owner_moves_together`` (SQLite), two or more are written as the rows one by one
        would leave them, in three statements instead of three each: the attempt moved from the
        first's state to the last's, their history rows and their operation records, in order.
        No requeue among them (a lease owner makes none): it inserts an attempt in between.
        """
        if not self.owner_moves_together or len(made) < 2 or any(c.trigger in am.REQUEUES for c, _ in made):
            for c, move in made:
                self._owner_move(tx, lease, c, move)
            return
        d, first, last = self.dialect, made[0][0], made[-1][0]
        moved = tx.run(
            d.sql("UPDATE {attempts} SET state = ? WHERE attempt_id = ? AND state = ?"),
            (last.new, first.attempt_id, first.state),
        )
        if moved != 1:
            raise IntegrityError(
                f"request {first.request_id}: attempt id {first.attempt_id} changed under a locked transition "
                f"({first.state} -> {last.new})"
            )
        rows = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"] * len(made))
        tx.run(d.sql(_INSERT_HISTORY + rows), [v for c, _ in made for v in _history_row(c)])
        if last.new in am.FINAL:  # (only the last can be: nothing moves on from a final state)
            self._finish_request(tx, last)
        ops = ", ".join(["(?, ?, ?, ?, ?)"] * len(made))
        tx.run(
            d.sql("INSERT INTO {operations} (attempt_id, op_key, digest, result, at) VALUES " + ops),
            [v for c, m in made for v in (lease.attempt_id, m.op_key, m.digest(), c.new, c.now)],
        )

    def _owner_move(self, tx: Tx, lease: Lease, c: Change, move: Move) -> None:
        """A lease owner's transition and its operation record (PostgreSQL: one statement)."""
        self._transition(tx, c)
        record_operation(tx, self.dialect, lease, move.op_key, body_digest=move.digest(), result=c.new, now=c.now)

    # -- recovery -------------------------------------------------------------------

    def expired(self, limit: int = 100) -> list[Expired]:
        """Live attempts whose lease has run out, oldest first."""
        with self._tx(write=False) as tx:
            rows = tx.all(
                self.dialect.sql(
                    "SELECT a.attempt_id, a.request_id, a.fencing_token, r.run_id FROM {attempts} a"
                    " JOIN {requests} r ON r.request_id = a.request_id"
                    f" WHERE a.state IN {_LIVE} AND {_LEASE_OVER} ORDER BY a.attempt_id LIMIT ?"
                ),
                (*_over(tx.now()), limit),
            )
        return [Expired(attempt_id=int(r[0]), request_id=int(r[1]), token=int(r[2]), run_id=r[3]) for r in rows]

    def recover(self, attempt_id: int, token: int, decide: Decide) -> Recovered | None:
        """Apply the recovery service's verdict to an expired lease, reading the run's journal in the same transaction.

        ``None`` when the lease is no longer live and expired (renewed, or recovered by someone else).
        """
        d = self.dialect
        with self._tx() as tx:
            self._lock_run_of(tx, attempt_id)
            now = tx.now()
            row = tx.one(
                d.sql(
                    "SELECT a.state, a.request_id, a.base_seq, r.run_id, a.lease_expires_at, a.attempt_no"
                    " FROM {attempts} a"
                    " JOIN {requests} r ON r.request_id = a.request_id WHERE a.attempt_id = ? AND a.fencing_token = ?"
                    f" AND a.state IN {_LIVE} AND {_LEASE_OVER} {{update}}"
                ),
                (attempt_id, token, *_over(now)),
            )
            if row is None:
                return None
            state, request_id, base_seq, run_id = str(row[0]), int(row[1]), int(row[2]), row[3]
            bodies = [bytes(r[0]) for r in tx.all(_event_sql(d, "{bodies_after}"), (run_id, base_seq))]
            verdict, not_before = decide(bodies), None
            if verdict.trigger == "lose":
                verdict, not_before = self._requeue_policy(tx, request_id, verdict, now)
            new = am.move(state, verdict.trigger, "recovery_service")
            detail = {**verdict.detail, "token": token, "base_seq": base_seq}
            if row[4] is None or not float(row[4]) <= now + limits.MAX_LEASE_S:  # NULL, NaN, inf
                detail["lease_expires_at"] = f"not a valid lease ({row[4]!r}): taken back as expired"
            requeued = self._transition(
                tx,
                Change(
                    attempt_id=attempt_id,
                    request_id=request_id,
                    trigger=verdict.trigger,
                    actor="recovery_service",
                    actor_name="recovery-service",
                    state=state,
                    new=new,
                    now=now,
                    reason=verdict.reason,
                    detail=detail,
                    not_before=not_before,
                ),
            )
        return Recovered(
            attempt_id=attempt_id,
            request_id=request_id,
            state=new,
            reason=verdict.reason,
            requeued_attempt=requeued,
            attempt_no=int(row[5]),
        )

    def _lock_run_of(self, tx: Tx, attempt_id: int) -> None:
        """Before recovery reads a run's journal: the lock its fenced appends hold (none needed on SQLite,
        whose ``BEGIN IMMEDIATE`` already excludes every other writer)."""

    def _requeue_policy(self, tx: Tx, request_id: int, lost: Verdict, now: float) -> tuple[Verdict, float | None]:
        """A ``lose`` verdict within the request's requeue limit, with its backoff; past the limit, ``expire``.

        A request whose runners die before any step (a poison request) would otherwise be
        re-queued for ever. Automatic requeues are counted since an operator last sent the
        request round; the n-th waits ``backoff * 2**(n-1)`` seconds before it can be claimed.
        """
        d = self.dialect
        row = tx.one(
            d.sql(
                f"SELECT r.max_requeues, r.requeue_backoff_s, ({_REQUEUES}) FROM {{requests}} r WHERE r.request_id = ?"
            ),
            (request_id,),
        )
        assert row is not None
        limit, base, done = int(row[0]), float(row[1]), int(row[2])
        if done >= limit:
            attempts = tx.all(
                d.sql("SELECT attempt_no, runner_id, state FROM {attempts} WHERE request_id = ? ORDER BY attempt_no"),
                (request_id,),
            )
            return (
                Verdict(
                    trigger="expire",
                    reason=f"lease expired with no step requested, after {done} automatic requeue(s) of this request "
                    f"(its limit, --max-requeues {limit}): its runners keep dying before any step, so an operator "
                    "decides instead of another runner trying",
                    detail={
                        **lost.detail,
                        "requeues": done,
                        "max_requeues": limit,
                        "attempts": [{"attempt": int(a[0]), "runner": a[1], "state": a[2]} for a in attempts],
                    },
                ),
                None,
            )
        delay = limits.requeue_delay(base, done + 1)
        return (
            Verdict(
                trigger="lose",
                reason=f"{lost.reason} (automatic requeue {done + 1} of {limit}, claimable after {delay:g}s)",
                detail={**lost.detail, "requeue": done + 1, "max_requeues": limit, "backoff_s": delay},
            ),
            now + delay if delay > 0 else None,
        )

    # -- operators ------------------------------------------------------------------

    def operate(
        self, request_id: int, trigger: str, *, by: str, reason: str, attempt: int | None = None
    ) -> RequestView:
        """An operator's transition of the request's current attempt (``requeue``, ``give_up``, ``withdraw``);
        with ``attempt``, only while that is the current one (``_bound``)."""
        _check_text("--by", by)
        _check_text("--reason", reason)
        with self._tx() as tx:
            now = tx.now()
            attempt_id, state, attempt_no = self._current(tx, request_id)
            _bound(request_id, attempt, attempt_no)
            if not am.allowed(state, trigger):
                sources = sorted(am.BY_TRIGGER[trigger].source) if trigger in am.BY_TRIGGER else []
                raise NotReconcilable(
                    f"request {request_id}: {trigger} is allowed only from {' or '.join(sources) or 'nowhere'}, "
                    f"and its attempt {attempt_no} is {state}; nothing was written",
                    request_id=request_id,
                )
            self._operator_move(tx, request_id, attempt_id, state, trigger, by=by, reason=reason, now=now)
            return self._request(tx, request_id)

    def cancel(self, request_id: int, *, by: str, reason: str, attempt: int | None = None) -> RequestView:
        """Record an operator's cancellation.

        A queued request is withdrawn at once; a leased one's owner sees it at its next heartbeat.
        """
        _check_text("--by", by)
        _check_text("--reason", reason)
        d = self.dialect
        with self._tx() as tx:
            now = tx.now()
            attempt_id, state, attempt_no = self._current(tx, request_id)
            _bound(request_id, attempt, attempt_no)
            if state in am.FINAL:
                raise NotReconcilable(f"request {request_id} has already ended ({state}); nothing was written")
            if state in am.AWAITING_OPERATOR:
                raise NotReconcilable(
                    f"request {request_id} is {state}: decide with `effectlog operator requeue|fail`; "
                    "nothing was written"
                )
            tx.run(
                d.sql(
                    "UPDATE {requests} SET cancel_requested_at = ?, cancel_by = ?, cancel_reason = ?"
                    " WHERE request_id = ? AND cancel_requested_at IS NULL"
                ),
                (now, by, reason, request_id),
            )
            if state == am.QUEUED:
                self._operator_move(tx, request_id, attempt_id, state, "withdraw", by=by, reason=reason, now=now)
            return self._request(tx, request_id)

    def _operator_move(
        self, tx: Tx, request_id: int, attempt_id: int, state: str, trigger: str, *, by: str, reason: str, now: float
    ) -> None:
        """An operator's transition, checked against the attempt spec, recorded with who and why."""
        change = Change(
            attempt_id=attempt_id,
            request_id=request_id,
            trigger=trigger,
            actor="operator",
            actor_name=by,
            state=state,
            new=am.move(state, trigger, "operator"),
            now=now,
            reason=reason,
        )
        self._transition(tx, change)

    def _current(self, tx: Tx, request_id: int) -> tuple[int, str, int]:
        row = tx.one(
            self.dialect.sql(
                "SELECT a.attempt_id, a.state, a.attempt_no FROM {requests} r"
                " JOIN {attempts} a ON a.attempt_id = r.current_attempt WHERE r.request_id = ? {update}"
            ),
            (request_id,),
        )
        if row is None:
            raise BadInput(f"no request {request_id} in {self.location}")
        return int(row[0]), str(row[1]), int(row[2])

    # -- transitions ----------------------------------------------------------------

    def _transition(self, tx: Tx, c: Change) -> int | None:
        """Move the attempt (guarded by its current state), record history, then requeue or finish the request."""
        d = self.dialect
        moved = tx.run(
            d.sql("UPDATE {attempts} SET state = ? WHERE attempt_id = ? AND state = ?"), (c.new, c.attempt_id, c.state)
        )
        if moved != 1:
            raise IntegrityError(
                f"request {c.request_id}: attempt id {c.attempt_id} changed under a locked transition "
                f"({c.state} -> {c.new})"
            )
        self._history(tx, c)
        if c.trigger in am.REQUEUES:
            row = tx.one(d.sql("SELECT attempt_no FROM {attempts} WHERE attempt_id = ?"), (c.attempt_id,))
            assert row is not None
            return self._new_attempt(tx, c.request_id, int(row[0]) + 1, c.now, c.not_before)
        if c.new in am.FINAL:
            self._finish_request(tx, c)
        return None

    def _finish_request(self, tx: Tx, c: Change) -> None:
        ended = tx.run(
            self.dialect.sql("UPDATE {requests} SET finished_at = ? WHERE request_id = ? AND finished_at IS NULL"),
            (c.now, c.request_id),
        )
        if ended != 1:
            raise IntegrityError(f"request {c.request_id} would end twice (attempt id {c.attempt_id} -> {c.new})")

    def _history(self, tx: Tx, c: Change) -> None:
        tx.run(self.dialect.sql(_INSERT_HISTORY + "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"), _history_row(c))

    # -- reading --------------------------------------------------------------------

    def now(self) -> float:
        with self._tx(write=False) as tx:
            return tx.now()

    def request(self, request_id: int) -> RequestView:
        with self._tx(write=False) as tx:
            return self._request(tx, request_id)

    def requests(self, states: Sequence[str] | None = None) -> list[RequestView]:
        """Every request, or those whose current attempt is in one of ``states``, oldest first."""
        with self._tx(write=False) as tx:
            if states is None:
                rows = tx.all(self.dialect.sql(_REQUEST + " ORDER BY r.request_id"))
            elif not states:
                rows = []
            else:
                marks = ", ".join("?" * len(states))
                rows = tx.all(
                    self.dialect.sql(_REQUEST + f" WHERE a.state IN ({marks}) ORDER BY r.request_id"), tuple(states)
                )
        return [_request_view(r) for r in rows]

    def lease_held(self, lease: Lease) -> bool:
        """Whether ``lease`` is still current now, by the store's clock: one read, no commit (a runner's
        look before it sends a step's call, ``Runner._confirm_lease``)."""
        with self._tx(write=False) as tx:
            row = tx.one(self.dialect.sql(_HELD), (lease.attempt_id, lease.runner_id, lease.token, time.time()))
        return row is not None

    def attempts(self, request_id: int | None = None) -> list[AttemptView]:
        with self._tx(write=False) as tx:
            if request_id is None:
                rows = tx.all(self.dialect.sql(_ATTEMPT + " ORDER BY attempt_id"))
            else:
                rows = tx.all(self.dialect.sql(_ATTEMPT + " WHERE request_id = ? ORDER BY attempt_id"), (request_id,))
        return [_attempt_view(r) for r in rows]

    def history(self, request_id: int | None = None) -> list[HistoryRow]:
        with self._tx(write=False) as tx:
            if request_id is None:
                rows = tx.all(self.dialect.sql(_HISTORY + " ORDER BY id"))
            else:
                rows = tx.all(self.dialect.sql(_HISTORY + " WHERE request_id = ? ORDER BY id"), (request_id,))
        return [
            HistoryRow(
                id=int(r[0]),
                attempt_id=int(r[1]),
                request_id=int(r[2]),
                transition=r[3],
                event=r[4],
                actor=r[5],
                actor_name=r[6],
                from_state=r[7],
                to_state=r[8],
                reason=r[9],
                at=float(r[10]),
                detail=msgspec.json.decode(r[11]),
            )
            for r in rows
        ]
