"""The fleet contract: one test suite every fleet store must pass, shipped for your backends too.

Subclass ``FleetContract`` in a pytest module and provide a ``fleet_backend`` fixture
returning a ``FleetBackend``: how to open a store on a fresh database (the same
database on every call), and a raw SQL hook so the suite can prove the *database*
refuses what the fleet promises never happens::

    class TestMyFleet(FleetContract):
        @pytest.fixture
        def fleet_backend(self, tmp_path): ...

Leases in here are short and the suite waits until the store's own clock is past
them; nothing asserts on wall time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

import msgspec
import pytest

from effectlog import events as ev
from effectlog.errors import (
    BadInput,
    EffectlogError,
    EventConflict,
    IdempotencyConflict,
    IllegalTransition,
    NotReconcilable,
    PlanMismatch,
    SequenceGap,
    StaleLease,
)
from effectlog.fleet import attempts as am
from effectlog.fleet.model import Lease, Verdict
from effectlog.fleet.protocol import FleetStore
from effectlog.fleet.recovery import decide_expired, recover_once
from effectlog.journal import load_run
from effectlog.plan import Plan, parse_plan
from effectlog.runtime import Runtime

LONG = 300.0  # seconds: a lease that does not expire during a test
SHORT = 0.3  # seconds: a lease the suite waits out (by the store's clock); longer than a loaded disk's fsync
T0 = 1_700_000_000_000_000_000


class FleetBackend(Protocol):
    def open(self) -> FleetStore:
        """A store on a fresh, empty database: the same database on every call."""
        ...

    def raw_sql(self, sql: str) -> Any:
        """Execute SQL directly on the store's database, bypassing effectlog.

        ``{requests}``, ``{attempts}``, ``{history}`` and ``{operations}`` name the fleet tables.
        """
        ...


def noop_plan(run_id: str, steps: int = 1, adapter: str = "noop", idempotent: bool = True) -> Plan:
    """A plan of ``steps`` steps on one adapter type."""
    raw = {
        "run_id": run_id,
        "adapters": {"a": {"type": adapter, "idempotent": idempotent}},
        "steps": [{"id": f"s{i}", "adapter": "a"} for i in range(steps)],
    }
    return parse_plan(msgspec.json.encode(raw), "contract plan")


def wait_past(store: FleetStore, moment: float) -> None:
    """Wait until the store's clock is past ``moment`` (a lease's expiry)."""
    while store.now() <= moment:
        time.sleep(0.01)


def started(run_id: str, seq: int = 1) -> ev.Event:
    """A run.started whose plan has steps s0 and s1."""
    plan = {"run_id": run_id, "steps": [{"id": "s0"}, {"id": "s1"}]}
    return ev.RunStarted(run_id=run_id, seq=seq, ts=T0, plan=plan, plan_digest="d")


def requested(run_id: str, seq: int, step: str = "s0", idempotent: bool = False) -> ev.Event:
    return ev.StepRequested(
        run_id=run_id, seq=seq, ts=T0 + seq, step_id=step, adapter="a", idempotency_key=f"k-{step}",
        args_digest="x", idempotent=idempotent,
    )  # fmt: skip


def counts(store: FleetStore, run_id: str) -> tuple[int, int, int]:
    """(attempts, history rows, journal head seq): what a refused write must leave unchanged."""
    return len(store.attempts()), len(store.history()), store.journal().head(run_id)[0]


class FleetContract:
    """Every fleet store must pass these; each test names the guarantee it checks."""

    @pytest.fixture
    def store(self, fleet_backend: FleetBackend) -> Iterator[FleetStore]:
        s = fleet_backend.open()
        yield s
        s.close()

    def _leased(self, store: FleetStore, run_id: str = "run-1", lease_s: float = LONG, runner: str = "r1") -> Lease:
        # No backoff: these tests claim a request again as soon as recovery re-queues it.
        request = store.submit("contract", run_id, noop_plan(run_id), requeue_backoff_s=0.0).request
        lease = store.claim(request.request_id, runner, lease_s)
        assert lease is not None
        return lease

    def _expire_and_lose(self, store: FleetStore, lease: Lease) -> None:
        wait_past(store, lease.expires_at)
        done = store.recover(lease.attempt_id, lease.token, decide_expired)
        assert done is not None
        assert "lost" == done.state

    # -- execution requests -------------------------------------------------------------

    def test_submit_creates_one_queued_request(self, store: FleetStore) -> None:
        """A new (scope, key) is a new request whose first attempt is queued (the spec's initial state)."""
        done = store.submit("s", "k", noop_plan("run-1"), ["gpu", "py", "gpu"])
        assert done.created
        assert (am.QUEUED, 1, ("gpu", "py")) == (done.request.state, done.request.attempt_no, done.request.requires)
        assert [done.request] == store.requests()

    def test_same_key_and_fingerprint_returns_the_existing_request(self, store: FleetStore) -> None:
        """Submitting the same request twice gives back the first one and creates nothing."""
        first = store.submit("s", "k", noop_plan("run-1"), ["py"])
        again = store.submit("s", "k", noop_plan("run-1"), ["py"])
        assert (first.request, False) == (again.request, again.created)
        assert 1 == len(store.attempts())

    @pytest.mark.parametrize("change", ["plan", "requires"])
    def test_same_key_with_another_fingerprint_is_an_idempotency_conflict(self, store: FleetStore, change: str) -> None:
        """The same (scope, key) with another plan or other requirements is refused (exit 5); nothing changes."""
        store.submit("s", "k", noop_plan("run-1"), ["py"])
        plan, needs = (noop_plan("run-1", steps=2), ["py"]) if change == "plan" else (noop_plan("run-1"), ["gpu"])
        with pytest.raises(IdempotencyConflict) as caught:
            store.submit("s", "k", plan, needs)
        assert 5 == caught.value.exit_status
        assert 1 == len(store.requests())

    def test_a_run_id_belongs_to_one_request(self, store: FleetStore) -> None:
        """Another key for the same run id would share a journal: refused as a plan mismatch."""
        store.submit("s", "k1", noop_plan("run-1"))
        with pytest.raises(PlanMismatch):
            store.submit("s", "k2", noop_plan("run-1"))
        assert 1 == len(store.requests())

    def test_candidates_are_queued_requests_oldest_first(self, store: FleetStore) -> None:
        """The scheduler's input lists only queued requests, in submission order."""
        ids = [store.submit("s", f"k{i}", noop_plan(f"run-{i}"), [f"c{i}"]).request.request_id for i in range(3)]
        assert store.claim(ids[1], "r1", LONG) is not None
        assert [(ids[0], ("c0",)), (ids[2], ("c2",))] == [(c.request_id, c.requires) for c in store.candidates(10)]

    # -- claims and leases ------------------------------------------------------------

    def test_a_claim_gives_token_one_and_happens_once(self, store: FleetStore) -> None:
        """The first lease of a request carries fencing token 1; a second claim finds nothing queued."""
        lease = self._leased(store)
        assert (1, "r1", "run-1") == (lease.token, lease.runner_id, lease.run_id)
        assert store.claim(lease.request_id, "r2", LONG) is None
        assert ["leased"] == [a.state for a in store.attempts()]

    def test_lease_held_is_true_only_for_the_current_unexpired_lease(self, store: FleetStore) -> None:
        """``lease_held`` (a runner's look before it sends a call): true for the lease as claimed; false for
        another token or runner, once it expired by the store's clock, and once recovery moved it on; it
        renews nothing (the expiry it reads stays where the claim put it)."""
        lease = self._leased(store, lease_s=0.3)
        other = msgspec.structs.replace
        others = [other(lease, token=lease.token + 1), other(lease, runner_id="other")]
        held = (store.lease_held(lease), [store.lease_held(o) for o in others])
        wait_past(store, lease.expires_at)
        expired = store.lease_held(lease)
        done = store.recover(lease.attempt_id, lease.token, decide_expired)
        assert (True, [False, False], False, True) == (*held, expired, done is not None)
        assert store.lease_held(lease) is False

    def test_tokens_are_max_plus_one_per_request(self, store: FleetStore) -> None:
        """Each new lease of a request gets MAX(fencing_token) + 1, across its attempts."""
        first = self._leased(store, lease_s=SHORT)
        other = self._leased(store, "run-2")
        self._expire_and_lose(store, first)
        second = store.claim(first.request_id, "r2", SHORT)
        assert second is not None
        self._expire_and_lose(store, second)
        third = store.claim(first.request_id, "r3", LONG)
        assert third is not None
        assert [1, 2, 3, 1] == [first.token, second.token, third.token, other.token]
        assert [1, 2, 3] == [a.attempt_no for a in store.attempts(first.request_id)]

    def test_claim_next_leases_what_fits_and_is_due_oldest_first(self, store: FleetStore) -> None:
        """The store's pick: only due queued requests whose requirements the offer covers, oldest first, at
        most ``limit``; each lease is recorded in the history with its token, as ``claim`` records it."""
        needs = [[], ["gpu"], ["gpu", "py"], ["gpu"], ["gpu"]]
        ids = [
            store.submit("s", f"k{i}", noop_plan(f"run-{i}"), need).request.request_id for i, need in enumerate(needs)
        ]
        assert store.claim(ids[3], "r0", LONG) is not None  # leased already: not queued
        self._backing_off(store, ids[4])
        got = store.claim_next("r1", ["gpu", "tpu"], LONG, limit=8)
        assert [(ids[0], 1, "run-0"), (ids[1], 1, "run-1")] == [(g.request_id, g.token, g.run_id) for g in got]
        assert [("lease", "scheduler", "r1", {"token": 1})] * 2 == [
            (h.transition, h.actor, h.actor_name, h.detail) for h in store.history() if h.actor_name == "r1"
        ]
        assert [] == store.claim_next("r1", ["gpu"], LONG)
        one = store.claim_next("r2", ["py", "gpu"], LONG, limit=1)
        assert [ids[2]] == [g.request_id for g in one]
        leased = {a.request_id: (a.state, a.runner_id, a.token) for a in store.attempts()}
        assert ("leased", "r1", 1) == leased[ids[0]]
        assert ("queued", None, None) == leased[ids[4]]

    def _backing_off(self, store: FleetStore, request_id: int) -> None:
        """Make the request's queued attempt back off (as after an automatic requeue) for a long while."""
        lease = store.claim(request_id, "gone", SHORT)
        assert lease is not None
        wait_past(store, lease.expires_at)
        assert store.recover(lease.attempt_id, lease.token, decide_expired) is not None
        assert store.request(request_id).not_before is not None

    def test_claim_next_gives_max_plus_one_tokens_and_the_runs_head_as_base(self, store: FleetStore) -> None:
        """A requeued request claimed through ``claim_next`` gets token MAX + 1 and its run's head as the base."""
        first = self._leased(store, lease_s=SHORT)
        store.leased_journal(first).append([started("run-1")])
        self._expire_and_lose(store, first)
        got = store.claim_next("r2", [], LONG)
        assert [(first.request_id, 2, 2)] == [(g.request_id, g.token, g.attempt_no) for g in got]
        assert [1] == [a.base_seq for a in store.attempts(first.request_id) if a.attempt_no == 2]
        store.leased_journal(got[0]).append([requested("run-1", 2, idempotent=True)])
        assert 2 == store.journal().head("run-1")[0]

    def test_claim_next_refuses_bad_numbers_and_leases_nothing(self, store: FleetStore) -> None:
        """A lease that is not a time or a limit out of range is bad input; nothing is leased."""
        store.submit("s", "k", noop_plan("run-1"))
        for lease_s, limit in ((float("nan"), 1), (0.0, 1), (LONG, 0)):
            with pytest.raises(BadInput):
                store.claim_next("r1", [], lease_s, limit)
        assert ["queued"] == [a.state for a in store.attempts()]

    def test_a_heartbeat_renews_the_lease(self, store: FleetStore) -> None:
        """After a heartbeat, writes are accepted past the original expiry."""
        lease = self._leased(store, lease_s=0.3)
        beat = store.heartbeat(lease, LONG)
        assert beat.expires_at > lease.expires_at
        wait_past(store, lease.expires_at)
        assert "preparing" == store.advance(lease, "prepare", op_key="prepare")

    @pytest.mark.parametrize("write", ["heartbeat", "advance", "journal", "final"])
    def test_writes_after_expiry_are_refused_even_before_recovery(self, store: FleetStore, write: str) -> None:
        """An expired lease is stale at once: the store refuses its writes before anyone recovers it."""
        lease = self._leased(store, lease_s=SHORT)
        wait_past(store, lease.expires_at)
        before = counts(store, "run-1")
        with pytest.raises(StaleLease):
            _write(store, lease, write)
        assert before == counts(store, "run-1")

    @pytest.mark.parametrize("write", ["heartbeat", "advance", "journal", "final"])
    def test_a_zombie_cannot_write_after_another_runner_took_the_request(self, store: FleetStore, write: str) -> None:
        """Token 1's writes are refused once token 2 holds the request; the record stays exactly as it was."""
        zombie = self._leased(store, lease_s=SHORT)
        self._expire_and_lose(store, zombie)
        current = store.claim(zombie.request_id, "r2", LONG)
        assert current is not None
        store.leased_journal(current).append([started("run-1")])
        before = counts(store, "run-1"), [r.body for r in store.journal().read("run-1")]
        with pytest.raises(StaleLease, match="newest fencing token is 2"):
            _write(store, zombie, write, seq=2)
        assert before == (counts(store, "run-1"), [r.body for r in store.journal().read("run-1")])
        assert "leased" == store.request(zombie.request_id).state

    def test_a_lease_with_another_runner_id_is_refused(self, store: FleetStore) -> None:
        """The check is on (attempt, runner, token) together: the right token under another name is stale."""
        lease = self._leased(store)
        forged = Lease(**{**_fields(lease), "runner_id": "intruder"})
        with pytest.raises(StaleLease):
            store.heartbeat(forged, LONG)
        with pytest.raises(StaleLease):
            store.leased_journal(forged).append([started("run-1")])
        assert 0 == store.journal().head("run-1")[0]

    def test_a_lease_covers_its_own_run_only(self, store: FleetStore) -> None:
        """A lease on one run cannot append events of another."""
        lease = self._leased(store)
        with pytest.raises(StaleLease):
            store.leased_journal(lease).append([started("run-2")])
        assert [] == store.journal().runs()

    # -- idempotent reports -------------------------------------------------------------

    def test_a_repeated_report_is_a_no_op_and_another_body_a_conflict(self, store: FleetStore) -> None:
        """The same operation key and body returns the first answer; another body is idempotency_conflict."""
        lease = self._leased(store)
        store.advance(lease, "prepare", op_key="prepare")
        store.advance(lease, "start", op_key="start")
        assert "succeeded" == store.advance(lease, "succeed", op_key="final", detail={"n": 1})
        history = store.history()
        assert "succeeded" == store.advance(lease, "succeed", op_key="final", detail={"n": 1})
        with pytest.raises(IdempotencyConflict):
            store.advance(lease, "fail", op_key="final", reason="changed my mind")
        assert history == store.history()
        assert "succeeded" == store.request(lease.request_id).state

    def test_a_repeated_event_batch_is_a_no_op_and_another_body_a_conflict(self, store: FleetStore) -> None:
        """Re-sending a batch returns the stored records; the same batch key with other bytes is refused."""
        lease = self._leased(store)
        journal = store.leased_journal(lease)
        batch = [started("run-1"), requested("run-1", 2)]
        first = journal.append(batch)
        assert first == journal.append(batch)
        changed = [started("run-1"), requested("run-1", 2, step="s1")]
        with pytest.raises(IdempotencyConflict):
            journal.append(changed)
        assert [r.body for r in first] == [r.body for r in store.journal().read("run-1")]

    def test_a_fenced_batch_keeps_the_journals_guarantees(self, store: FleetStore) -> None:
        """Under a valid lease the journal still refuses gaps and other bytes at a seq, atomically."""
        lease = self._leased(store)
        journal = store.leased_journal(lease)
        journal.append([started("run-1")])
        with pytest.raises(SequenceGap):
            journal.append([requested("run-1", 3)])
        with pytest.raises(EventConflict):  # another batch key, other bytes at seq 1: the journal refuses it
            journal.append(
                [ev.RunStarted(run_id="run-1", seq=1, ts=T0 + 1, plan_digest="other"), requested("run-1", 2)]
            )
        assert 1 == store.journal().head("run-1")[0]
        journal.append([requested("run-1", 2)])
        assert 2 == store.journal().head("run-1")[0]

    # -- the attempt machine --------------------------------------------------------------

    def test_a_transition_the_spec_forbids_is_refused(self, store: FleetStore) -> None:
        """succeed from leased is not in specs/attempt.toml: refused, nothing written."""
        lease = self._leased(store)
        before = store.history()
        with pytest.raises(IllegalTransition):
            store.advance(lease, "succeed", op_key="final")
        assert before == store.history()

    def test_a_lease_owner_cannot_make_another_actors_transition(self, store: FleetStore) -> None:
        """The spec names an actor per transition: a lease owner cannot `requeue` its own attempt."""
        lease = self._leased(store)
        with pytest.raises(IllegalTransition, match="operator"):
            store.advance(lease, "requeue", op_key="x")

    def test_every_transition_is_history_with_its_actor(self, store: FleetStore) -> None:
        """Claim, owner steps and recovery each append a history row naming the actor the spec gives."""
        lease = self._leased(store, lease_s=SHORT)
        store.advance(lease, "prepare", op_key="prepare")
        self._expire_and_lose(store, lease)
        rows = [(h.transition, h.actor, h.from_state, h.to_state) for h in store.history()]
        assert [
            ("lease", "scheduler", "queued", "leased"),
            ("prepare", "lease_owner", "leased", "preparing"),
            ("lose", "recovery_service", "preparing", "lost"),
        ] == rows
        assert [am.BY_TRIGGER[t].actor for t, *_ in rows] == [a for _, a, *_ in rows]

    # -- recovery ---------------------------------------------------------------------

    def test_recovery_requeues_an_attempt_that_requested_no_step(self, store: FleetStore) -> None:
        """Journal shows no step requested during the lease: attempt lost, request queued with a new attempt."""
        lease = self._leased(store, lease_s=SHORT)
        store.leased_journal(lease).append([started("run-1")])
        wait_past(store, lease.expires_at)
        done = recover_once(store)
        assert [("lost", 2)] == [(d.state, store.request(d.request_id).attempt_no) for d in done]
        assert ["lost", am.QUEUED] == [a.state for a in store.attempts(lease.request_id)]

    @pytest.mark.parametrize("idempotent", [False, True])
    def test_recovery_sends_an_attempt_that_requested_a_step_to_needs_operator(
        self, store: FleetStore, idempotent: bool
    ) -> None:
        """Any step requested during the lease: attempt and request need an operator, with an audit record."""
        lease = self._leased(store, lease_s=SHORT)
        store.leased_journal(lease).append([started("run-1"), requested("run-1", 2, idempotent=idempotent)])
        wait_past(store, lease.expires_at)
        recover_once(store)
        assert ["needs_operator"] == [a.state for a in store.attempts(lease.request_id)]
        assert "needs_operator" == store.request(lease.request_id).state
        audit = store.history()[-1]
        assert ("expire", "recovery_service") == (audit.transition, audit.actor)
        assert ["s0"] == audit.detail["requested"]

    def test_recovery_marks_an_unanswered_non_idempotent_step_uncertain(self, store: FleetStore) -> None:
        """So the operator can reconcile at once: step.uncertain + run.stopped are appended, nothing else."""
        lease = self._leased(store, lease_s=SHORT)
        store.leased_journal(lease).append([started("run-1"), requested("run-1", 2)])
        wait_past(store, lease.expires_at)
        recover_once(store)
        recover_once(store)  # a second pass finds nothing more to mark
        state = load_run(store.journal(), "run-1")
        assert ("stopped", "uncertain", 4) == (state.state, state.steps["s0"].state, state.seq)

    def test_recovery_leaves_live_leases_alone(self, store: FleetStore) -> None:
        """A lease that has not expired is not the recovery service's business."""
        lease = self._leased(store)
        assert [] == recover_once(store)
        assert store.recover(lease.attempt_id, lease.token, decide_expired) is None
        assert ["leased"] == [a.state for a in store.attempts()]

    def test_an_expired_lease_is_recovered_once(self, store: FleetStore) -> None:
        """Two recovery services racing on one lease: one decides, the other finds nothing to do."""
        lease = self._leased(store, lease_s=SHORT)
        wait_past(store, lease.expires_at)
        calls: list[int] = []

        def decide(bodies: Any) -> Verdict:
            calls.append(1)
            return decide_expired(bodies)

        results = [store.recover(lease.attempt_id, lease.token, decide) for _ in range(2)]
        assert [True, False] == [r is not None for r in results]
        assert [1] == calls
        assert 2 == len(store.attempts())

    # -- poison requests ------------------------------------------------------------------

    def _lose_once(self, store: FleetStore, request_id: int, runner: str) -> str:
        """Claim the request, let the lease run out with nothing requested, recover: the attempt's new state."""
        lease = store.claim(request_id, runner, SHORT)
        assert lease is not None
        wait_past(store, lease.expires_at)
        done = store.recover(lease.attempt_id, lease.token, decide_expired)
        assert done is not None
        return done.state

    def test_automatic_requeues_stop_at_the_requests_limit(self, store: FleetStore) -> None:
        """Attempts lost before any step are re-queued ``max_requeues`` times; the next loss needs an operator.

        The audit record lists every attempt; an operator's requeue starts the count again.
        """
        request = store.submit("s", "poison", noop_plan("run-p"), max_requeues=2, requeue_backoff_s=0.0).request
        states = [self._lose_once(store, request.request_id, f"r{i}") for i in range(3)]
        assert ["lost", "lost", "needs_operator"] == states
        view = store.request(request.request_id)
        assert ("needs_operator", 3, 2, 2) == (view.state, view.attempt_no, view.requeues, view.max_requeues)
        audit = store.history(request.request_id)[-1]
        assert ("expire", "recovery_service") == (audit.transition, audit.actor)
        assert [(1, "r0", "lost"), (2, "r1", "lost"), (3, "r2", "leased")] == [
            (a["attempt"], a["runner"], a["state"]) for a in audit.detail["attempts"]
        ]
        assert "--max-requeues 2" in audit.reason
        again = store.operate(request.request_id, "requeue", by="alice", reason="fixed the adapter")
        assert (am.QUEUED, 0) == (again.state, again.requeues)
        assert "lost" == self._lose_once(store, request.request_id, "r3")

    def test_max_requeues_zero_sends_the_first_loss_to_an_operator(self, store: FleetStore) -> None:
        """With no automatic requeue allowed, a lost attempt waits for a person at once."""
        request = store.submit("s", "k", noop_plan("run-1"), max_requeues=0).request
        assert "needs_operator" == self._lose_once(store, request.request_id, "r1")

    def test_an_automatic_requeue_backs_off_exponentially(self, store: FleetStore) -> None:
        """The n-th automatic requeue is claimable ``backoff * 2**(n-1)`` seconds after the loss (the store's clock).

        Until then it is listed as a candidate that is not due, and a claim finds nothing.
        """
        request = store.submit("s", "k", noop_plan("run-1"), requeue_backoff_s=0.2).request
        delays = []
        for i in range(2):
            assert "lost" == self._lose_once(store, request.request_id, f"r{i}")
            view = store.request(request.request_id)
            assert view.not_before is not None
            delays.append(store.history(request.request_id)[-1].detail["backoff_s"])
            assert [(request.request_id, False)] == [(c.request_id, c.due) for c in store.candidates(10)]
            assert store.claim(request.request_id, "eager", LONG) is None
            wait_past(store, view.not_before)
            assert [True] == [c.due for c in store.candidates(10)]
        assert [0.2, 0.4] == delays
        assert store.claim(request.request_id, "patient", LONG) is not None

    def test_the_requeue_policy_is_part_of_the_request(self, store: FleetStore) -> None:
        """Submitting the same key with another requeue policy is a conflict; out-of-range values are bad input."""
        store.submit("s", "k", noop_plan("run-1"), max_requeues=5)
        with pytest.raises(IdempotencyConflict):
            store.submit("s", "k", noop_plan("run-1"))
        for bad in ({"max_requeues": -1}, {"requeue_backoff_s": float("nan")}, {"requeue_backoff_s": -1.0}):
            with pytest.raises(BadInput):
                store.submit("s", "other", noop_plan("run-2"), **bad)
        assert 1 == len(store.requests())

    # -- operators ----------------------------------------------------------------------

    @pytest.mark.parametrize("trigger", ["requeue", "give_up"])
    def test_operator_decisions_need_needs_operator(self, store: FleetStore, trigger: str) -> None:
        """requeue and fail are refused from queued and from a live lease; nothing is written."""
        queued = store.submit("s", "q", noop_plan("run-q")).request
        leased = self._leased(store)
        for request_id in (queued.request_id, leased.request_id):
            before = store.history()
            with pytest.raises(NotReconcilable):
                store.operate(request_id, trigger, by="alice", reason="try")
            assert before == store.history()

    def _needing_operator(self, store: FleetStore) -> Lease:
        lease = self._leased(store, lease_s=SHORT)
        store.leased_journal(lease).append([started("run-1"), requested("run-1", 2)])
        wait_past(store, lease.expires_at)
        recover_once(store)
        return lease

    def test_operator_requeue_makes_a_new_attempt_and_is_audited(self, store: FleetStore) -> None:
        """From needs_operator, requeue ends the attempt (lost) and queues attempt 2; history names who and why."""
        lease = self._needing_operator(store)
        view = store.operate(lease.request_id, "requeue", by="alice", reason="ledger shows no charge")
        assert (am.QUEUED, 2) == (view.state, view.attempt_no)
        audit = store.history()[-1]
        assert ("requeue", "operator", "alice", "ledger shows no charge", "needs_operator", "lost") == (
            audit.transition, audit.actor, audit.actor_name, audit.reason, audit.from_state, audit.to_state,
        )  # fmt: skip
        again = store.claim(lease.request_id, "r2", LONG)
        assert again is not None
        assert 2 == again.token

    def test_operator_fail_ends_the_request(self, store: FleetStore) -> None:
        """From needs_operator, fail ends the attempt and the request for good."""
        lease = self._needing_operator(store)
        view = store.operate(lease.request_id, "give_up", by="bob", reason="charged twice upstream")
        assert ("failed", 1) == (view.state, view.attempt_no)
        assert view.finished_at is not None
        assert ("give_up", "bob") == (store.history()[-1].transition, store.history()[-1].actor_name)

    def test_cancelling_a_queued_request_withdraws_it(self, store: FleetStore) -> None:
        """No runner holds it: the operator's cancellation ends it at once."""
        request = store.submit("s", "k", noop_plan("run-1")).request
        view = store.cancel(request.request_id, by="alice", reason="not needed")
        assert ("cancelled", True) == (view.state, view.cancel_requested)
        assert [] == store.candidates(10)

    def test_cancelling_a_leased_request_is_seen_at_the_next_heartbeat(self, store: FleetStore) -> None:
        """The owner learns of the cancellation from its heartbeat and cancels its attempt itself."""
        lease = self._leased(store)
        assert not store.heartbeat(lease, LONG).cancel_requested
        assert "leased" == store.cancel(lease.request_id, by="alice", reason="stop").state
        assert store.heartbeat(lease, LONG).cancel_requested
        assert "cancelled" == store.advance(lease, "cancel", op_key="final")
        assert store.request(lease.request_id).finished_at is not None

    def test_an_unknown_request_is_bad_input(self, store: FleetStore) -> None:
        """Operators naming a request that does not exist get exit status 2."""
        with pytest.raises(BadInput):
            store.operate(999, "requeue", by="alice", reason="x")

    # -- what the database itself refuses ------------------------------------------------

    @pytest.mark.parametrize(
        "sql",
        [
            "UPDATE {history} SET reason = 'rewritten'",
            "DELETE FROM {history}",
            "UPDATE {operations} SET digest = 'x'",
            "DELETE FROM {operations}",
            "DELETE FROM {attempts}",
            "DELETE FROM {requests}",
            "UPDATE {attempts} SET fencing_token = 7",
            "UPDATE {attempts} SET request_id = request_id + 1",
            "UPDATE {requests} SET plan = 'other'",
            "UPDATE {attempts} SET state = 'queued' WHERE state = 'succeeded'",
            "UPDATE {requests} SET finished_at = finished_at + 1",
        ],
    )
    def test_the_database_keeps_history_immutable(
        self, fleet_backend: FleetBackend, store: FleetStore, sql: str
    ) -> None:
        """History, operation records, attempts' identity, finished attempts and ended requests cannot be rewritten."""
        lease = self._leased(store)
        store.advance(lease, "prepare", op_key="prepare")
        store.advance(lease, "start", op_key="start")
        store.advance(lease, "succeed", op_key="final")
        before = (store.requests(), store.attempts(), store.history())
        with pytest.raises(Exception, match="effectlog"):
            fleet_backend.raw_sql(sql)
        assert before == (store.requests(), store.attempts(), store.history())

    def test_the_database_allows_one_open_attempt_per_request(
        self, fleet_backend: FleetBackend, store: FleetStore
    ) -> None:
        """A second open attempt for a request is refused by a unique index, whoever writes it."""
        request = store.submit("s", "k", noop_plan("run-1")).request
        with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
            fleet_backend.raw_sql(
                f"INSERT INTO {{attempts}} (request_id, attempt_no, state, created_at)"
                f" VALUES ({request.request_id}, 2, '{am.QUEUED}', 0)"
            )
        assert 1 == len(store.attempts())

    # -- concurrency and the runtime ------------------------------------------------------

    def test_concurrent_claims_of_one_request_have_one_winner(self, fleet_backend: FleetBackend) -> None:
        """Eight stores (as eight processes or hosts) claim the same request at once: exactly one lease."""
        stores = [fleet_backend.open() for _ in range(8)]
        try:
            request = stores[0].submit("s", "k", noop_plan("run-1")).request
            barrier = threading.Barrier(len(stores))
            results: list[object] = [None] * len(stores)

            def claim(i: int) -> None:
                barrier.wait()
                try:
                    results[i] = stores[i].claim(request.request_id, f"r{i}", LONG)
                except EffectlogError as exc:
                    results[i] = exc

            threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(stores))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert 1 == sum(isinstance(r, Lease) for r in results), results
            assert [1] == [a.token for a in stores[0].attempts()]
        finally:
            for s in stores:
                s.close()

    def test_deferred_transitions_ride_in_the_first_append_and_completion_succeeds(self, store: FleetStore) -> None:
        """A runner's way: prepare and start are made in the transaction of the run's first append, and the
        batch recording run.completed also makes the attempt succeed; the history is the same as when each
        is reported on its own, and a later report of the same operation is a no-op."""
        plan = noop_plan("run-1", steps=2)
        lease = store.claim(store.submit("s", "k", plan).request.request_id, "r1", LONG)
        assert lease is not None
        journal = store.leased_journal(lease)
        journal.defer("prepare", "prepare")
        journal.defer("start", "start")
        journal.succeed_on_completion = True
        assert "leased" == store.request(lease.request_id).state  # nothing written yet
        with Runtime(journal) as runtime:
            assert "completed" == runtime.run(plan).state
        assert "succeeded" == journal.finished
        assert ["lease", "prepare", "start", "succeed"] == [h.transition for h in store.history()]
        events = len(list(store.journal().read("run-1")))
        assert {"events": events} == store.history()[-1].detail
        assert "succeeded" == store.advance(lease, "succeed", op_key="final", detail={"events": events})
        assert "preparing" == store.advance(lease, "prepare", op_key="prepare")  # replayed: its first answer

    def test_a_stale_lease_carries_no_transition(self, store: FleetStore) -> None:
        """Deferred transitions are fenced with the batch: an expired lease writes neither, and keeps them."""
        lease = self._leased(store, lease_s=SHORT)
        journal = store.leased_journal(lease)
        journal.defer("prepare", "prepare")
        wait_past(store, lease.expires_at)
        before = counts(store, "run-1")
        with pytest.raises(StaleLease):
            journal.append([started("run-1")])
        assert before == counts(store, "run-1")
        assert ["prepare"] == [m.trigger for m in journal.pending]

    def test_a_report_makes_the_deferred_transitions_first(self, store: FleetStore) -> None:
        """A runner that fails before any append reports prepare (deferred) and fail in one transaction."""
        lease = self._leased(store)
        journal = store.leased_journal(lease)
        journal.defer("prepare", "prepare")
        assert "failed" == journal.reporting(
            lambda before: store.advance(lease, "fail", op_key="final", reason="bad plan", before=before)
        )
        assert ["lease", "prepare", "fail"] == [h.transition for h in store.history()]
        assert [] == journal.pending

    def test_a_refused_report_keeps_its_deferred_transitions_and_writes_nothing(self, store: FleetStore) -> None:
        """A report the spec refuses takes the deferred transitions' writes back with it, and they stay deferred."""
        lease = self._leased(store)
        journal = store.leased_journal(lease)
        journal.defer("prepare", "prepare")
        before = counts(store, "run-1")
        with pytest.raises(IllegalTransition):
            journal.reporting(lambda moves: store.advance(lease, "succeed", op_key="final", before=moves))
        assert (before, ["prepare"]) == (counts(store, "run-1"), [m.trigger for m in journal.pending])
        assert "leased" == store.request(lease.request_id).state

    def test_concurrent_claim_next_leases_each_request_once(self, fleet_backend: FleetBackend) -> None:
        """Eight stores (as eight runners) drain one queue with ``claim_next`` at once: every request is leased
        exactly once, with token 1, and recorded once in the history."""
        stores = [fleet_backend.open() for _ in range(8)]
        try:
            for i in range(40):
                stores[0].submit("s", f"k{i}", noop_plan(f"run-{i}"))
            barrier = threading.Barrier(len(stores))
            got: list[list[Lease]] = [[] for _ in stores]
            errors: list[BaseException] = []

            def drain(i: int) -> None:
                barrier.wait()
                try:
                    while batch := stores[i].claim_next(f"r{i}", [], LONG, limit=2):
                        got[i].extend(batch)
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=drain, args=(i,)) for i in range(len(stores))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert [] == errors
            leases = [lease for batch in got for lease in batch]
            assert list(range(1, 41)) == sorted(lease.request_id for lease in leases)
            assert {1} == {a.token for a in stores[0].attempts()}
            assert 40 == sum(h.transition == "lease" for h in stores[0].history())
        finally:
            for s in stores:
                s.close()

    def test_the_runtime_runs_a_plan_through_a_leased_journal(self, store: FleetStore) -> None:
        """End to end in one process: claim, run the plan with the runtime, report; the journal replays clean."""
        plan = noop_plan("run-1", steps=3)
        request = store.submit("s", "k", plan).request
        lease = store.claim(request.request_id, "r1", LONG)
        assert lease is not None
        store.advance(lease, "prepare", op_key="prepare")
        store.advance(lease, "start", op_key="start")
        with Runtime(store.leased_journal(lease)) as runtime:
            outcome = runtime.run(plan)
        assert "completed" == outcome.state
        assert "succeeded" == store.advance(lease, "succeed", op_key="final")
        assert "completed" == load_run(store.journal(), "run-1").state


def _fields(lease: Lease) -> dict[str, Any]:
    return {f: getattr(lease, f) for f in lease.__struct_fields__}


def _write(store: FleetStore, lease: Lease, write: str, seq: int = 1) -> None:
    if write == "heartbeat":
        store.heartbeat(lease, LONG)
    elif write == "advance":
        store.advance(lease, "prepare", op_key="prepare")
    elif write == "final":
        store.advance(lease, "cancel", op_key="final")
    else:
        store.leased_journal(lease).append([started(lease.run_id, seq) if seq == 1 else requested(lease.run_id, seq)])
