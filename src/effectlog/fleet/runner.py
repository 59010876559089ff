"""A runner: pulls work from a fleet store, runs plans with the runtime, reports what happened.

The store never calls a runner; credentials (adapters, effect stores) stay on the
runner's machine. The main thread asks for work (the store picks and leases what fits
this runner's capabilities and free capacity, by the scheduler's rule, in one
transaction), sleeps until queued work wakes it, and runs a recovery pass each round; one
thread per attempt drives the run; one heartbeat thread renews the leases and carries
back an operator's cancellation, which the attempt's thread acts on after the current
step's commit.

Every write an attempt makes, journal events included, carries its lease. When the
store refuses one (``StaleLease``: the lease expired and the request moved on) the
attempt stops writing at once: its record is no longer its own.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any, TextIO, cast

import msgspec

from effectlog import events as ev
from effectlog.adapters.registry import Registry, load_object
from effectlog.errors import BadInput, EffectlogError, ExitStatus, StaleLease, StorageError
from effectlog.fleet import limits
from effectlog.fleet.fencing import Tx
from effectlog.fleet.leased_journal import LeasedJournal
from effectlog.fleet.model import Heartbeat, Lease, Offer
from effectlog.fleet.protocol import FleetStore
from effectlog.fleet.recovery import recover_once
from effectlog.fleet.scheduler import waiting
from effectlog.fleet.secrets import Provider, redact_all, resolve
from effectlog.fleet.sqlite_store import SqliteFleetStore
from effectlog.fold import StepState
from effectlog.journal import Journal, load_run
from effectlog.journal.ownership import describe
from effectlog.journal.sidecars import not_a_path
from effectlog.notify import Kind, Notification, cli_hooks, deliver, opened_location, shown_location
from effectlog.observe import requests_gauge, telemetry
from effectlog.plan import Plan, parse_plan
from effectlog.recorder import record_now
from effectlog.recovery import still_blocked
from effectlog.runtime import ReusedLoop, Runtime
from effectlog.stake import approve_command, shell_option

# The pause between a heartbeat's tries while the store fails (``Runner._beat``).
_BEAT_PAUSE_S = 0.02


class RunnerConfig(msgspec.Struct, kw_only=True):
    store: str
    capabilities: frozenset[str] = frozenset()
    capacity: int = 1
    runner_id: str = ""  # default: host:pid
    lease_s: float = 30.0
    heartbeat_s: float | None = None  # default: a third of the lease
    poll_s: float = 0.5
    effects: str | None = None
    adapters: tuple[str, ...] = ()
    secrets: str | None = None  # MODULE:ATTR of a secrets provider (effectlog.fleet.secrets); else the environment
    max_attempts: int | None = None  # exit after this many attempts have ended
    exit_when_idle: bool = False  # exit when nothing this runner can take is queued and nothing runs
    recover: bool = True  # run the recovery service's pass each round
    # Test hooks (hidden in the CLI): reach ``arm`` once, say so on ``notify_fd``, then block
    # for good, or until a byte arrives on ``resume_fd``.
    arm: str | None = None
    notify_fd: int | None = None
    resume_fd: int | None = None
    # Notifications (effectlog.notify): a shell command and/or a URL told when a request waits for a person.
    notify_command: str | None = None
    notify_url: str | None = None


def checked(config: RunnerConfig) -> RunnerConfig:
    """``config`` with every number checked (finite, in range) and the heartbeat filled in; else ``BadInput``."""
    limits.count("--capacity", config.capacity, low=1, high=limits.MAX_CAPACITY)
    if config.max_attempts is not None:
        limits.count("--max-attempts", config.max_attempts, low=1, high=2**31)
    lease_s, heartbeat_s, poll_s = limits.runner_timing(config.lease_s, config.heartbeat_s, config.poll_s)
    # Each attempt opens the effect store anew: a relative path is made absolute once, here, or it would
    # follow a tool that changed the working directory, and the next keys would go to another store there.
    effects = config.effects
    if effects and not not_a_path(effects):  # (a connection string or a URL is refused when the store is opened)
        effects = os.path.abspath(effects)
    return msgspec.structs.replace(config, lease_s=lease_s, heartbeat_s=heartbeat_s, poll_s=poll_s, effects=effects)


def secrets_provider(config: RunnerConfig) -> Provider | None:
    """The ``--secrets MODULE:ATTR`` callable, or ``None`` (the environment then supplies secret args)."""
    if config.secrets is None:
        return None
    provider = load_object(config.secrets)
    if not callable(provider):
        raise BadInput(f"--secrets {config.secrets}: expected a callable taking a SecretWanted")
    return cast(Provider, provider)


def spread(picks: list[int], runner_id: str) -> list[int]:
    """The scheduler's picks, tried from a place that depends on the runner.

    Runners polling together see the same oldest requests; starting each at its own
    offset means they mostly claim different ones instead of queueing on the first.
    The set of picks (and the scheduler's choice) is unchanged. The runner itself no
    longer needs this (``claim_next`` lets the store pick, skipping rows other claimers
    hold); it remains for callers that claim requests by id from ``candidates``.
    """
    if len(picks) < 2:
        return picks
    start = zlib.crc32(runner_id.encode()) % len(picks)
    return picks[start:] + picks[:start]


class CancelObserved(BaseException):
    """Deliberate control flow: an operator's cancellation, acted on after a step's commit."""


class LeaseLost(BaseException):
    """Deliberate control flow: a heartbeat was refused, so no further tool is invoked."""


class Slot:
    """One attempt in progress."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.cancel = threading.Event()
        self.lost = threading.Event()
        self.thread: threading.Thread | None = None
        self.outcome = ""
        self.following: list[Lease] = []  # claimed in the transaction that ended this attempt (_claim_after)
        self.carried = 0  # claims _claim_after counted in ``started`` (committed or not: see _work_one)


class Runner:
    def __init__(self, config: RunnerConfig, store: FleetStore, *, log: TextIO | None = None) -> None:
        self.config = config = checked(config)
        assert config.heartbeat_s is not None
        self.heartbeat_s = config.heartbeat_s
        self.store = store
        # Named in notifications as resolved now: a tool may change the working directory later.
        self.shown_store = shown_location(opened_location(store, config.store))
        self.runner_id = config.runner_id or f"{socket.gethostname()}:{os.getpid()}"
        self.registry = Registry()
        for spec in config.adapters:
            self.registry.add_module(spec)
        self.secrets = secrets_provider(config)
        self.log_stream = log or sys.stderr
        self.slots: dict[int, Slot] = {}
        self.ended = 0
        self.started = 0
        self._mutex = threading.Lock()
        self._claiming = threading.Lock()  # one claim decision (check ``started``, claim, count) at a time
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._done = threading.Event()
        self._armed = config.arm
        self.notifiers = cli_hooks(config.notify_command, config.notify_url)
        # Built once, not per attempt (seeding one costs ~20 µs): retries' jitter; its methods are thread-safe.
        self.rng = random.Random()

    # -- the main loop ------------------------------------------------------------------

    def serve(self) -> int:
        """Pull and run work until stopped (SIGTERM/SIGINT), idle (``exit_when_idle``) or ``max_attempts``."""
        restore_signals = self._install_signals()
        beat = threading.Thread(target=self._heartbeats, name="effectlog-heartbeat", daemon=True)
        beat.start()
        # Queued work wakes the loop at once (--poll-s is the fallback); with every slot busy the store need
        # not look: a slot that frees up wakes the loop, which claims.
        self.store.watch(self._wake.set, lambda: len(self.slots) < self.config.capacity)
        self.log(f"ready: capabilities {sorted(self.config.capabilities)}, capacity {self.config.capacity}")
        next_recovery = 0.0  # a pass per heartbeat interval: often enough for leases, cheap when idle
        try:
            while not self._should_exit():
                self._wake.clear()
                if self.config.recover and not self._stopping.is_set() and time.monotonic() >= next_recovery:
                    self._recovery_pass()
                    next_recovery = time.monotonic() + self.heartbeat_s
                claimed, fitting = self._claim_round()
                if self.config.exit_when_idle and not self.slots and not claimed and not fitting:
                    break
                if not claimed or len(self.slots) >= self.config.capacity:
                    self._wake.wait(self.config.poll_s)
        finally:
            self._stopping.set()
            for slot in list(self.slots.values()):
                if slot.thread is not None:
                    slot.thread.join()
            self._done.set()
            beat.join()
            restore_signals()
        self.log(f"exiting: {self.ended} attempt(s) ended")
        return 0

    def _should_exit(self) -> bool:
        with self._mutex:
            busy = bool(self.slots)
        if self._stopping.is_set() and not busy:
            return True
        limit = self.config.max_attempts
        return limit is not None and self.ended >= limit and not busy

    def _install_signals(self) -> Callable[[], None]:
        """SIGTERM/SIGINT ask the runner to stop; returns what puts the previous handlers back.

        CPython runs a handler in the main thread between two bytecodes, wherever that thread is, so the
        handler takes no lock: ``Event.set`` would wait for the event's lock, which the main loop's own
        ``Event.clear``/``wait`` may hold at that moment (the runner hung there for good). The handler writes
        the signal's number to a pipe; a thread of its own reads it and does the logging and the setting."""
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)

        def relay() -> None:
            while got := os.read(read_fd, 1):
                self.log(f"signal {got[0]}: finishing running attempts, claiming nothing more")
                self._stopping.set()
                self._wake.set()
            os.close(read_fd)

        def stop(signum: int, frame: object) -> None:
            del frame
            with contextlib.suppress(OSError):  # (a full pipe: a stop is already on its way)
                os.write(write_fd, bytes([signum]))

        thread = threading.Thread(target=relay, name="effectlog-signals", daemon=True)
        thread.start()
        previous = [(signum, signal.signal(signum, stop)) for signum in (signal.SIGTERM, signal.SIGINT)]

        def restore() -> None:
            for signum, handler in previous:
                signal.signal(signum, handler)
            os.close(write_fd)  # the relay reads the end of the pipe and exits
            thread.join()

        return restore

    def _recovery_pass(self) -> None:
        try:
            for done in recover_once(self.store):
                self.log(
                    f"recovery: request {done.request_id} attempt {done.attempt_no} -> {done.state}: {done.reason}"
                )
                if done.state == "needs_operator":
                    self._notify("operator_needed", done.request_id, done.attempt_no, "", None, done.reason)
        except EffectlogError as exc:
            self.log(f"recovery pass failed: {exc.code}: {exc}")

    def _claim_round(self) -> tuple[int, bool]:
        """Claim what fits; returns (claimed, whether anything queued fits this runner).

        The store picks and leases in one transaction (``claim_next``), so runners racing
        for one queue take different requests. Only an empty-handed round of a runner
        told to exit when idle lists the queue, to see whether work it fits is backing off.
        """
        if self._stopping.is_set():
            return 0, False
        with self._claiming:
            free = self.config.capacity - len(self.slots)
            if self.config.max_attempts is not None:
                free = min(free, self.config.max_attempts - self.started)
            if free <= 0:
                return 0, True
            try:
                leases = self.store.claim_next(
                    self.runner_id, sorted(self.config.capabilities), self.config.lease_s, free
                )
            except EffectlogError as exc:
                self.log(f"claim failed: {exc.code}: {exc}")
                return 0, True
            for lease in leases:
                self._start(lease)
        if leases or not self.config.exit_when_idle:
            return len(leases), True
        offer = Offer(runner_id=self.runner_id, capabilities=self.config.capabilities, free=free)
        try:
            candidates = self.store.candidates(max(16, 4 * self.config.capacity))
        except EffectlogError as exc:
            self.log(f"cannot list work: {exc.code}: {exc}")
            return 0, True
        return 0, waiting(candidates, offer)

    def _start(self, lease: Lease) -> None:
        slot = self._slot(lease)
        slot.thread = threading.Thread(target=self._work, args=(slot,), name=f"effectlog-attempt-{lease.attempt_id}")
        with self._mutex:
            self.slots[lease.attempt_id] = slot
            self.started += 1
        slot.thread.start()

    def _slot(self, lease: Lease) -> Slot:
        found = telemetry()  # an effectlog.fleet.claim span and count when OpenTelemetry is configured
        if found is not None:
            found.claimed(lease.request_id, self.runner_id, lease.run_id, lease.attempt_no)
        self.log(f"request {lease.request_id} attempt {lease.attempt_no}: leased with token {lease.token}")
        return Slot(lease)

    def _heartbeats(self) -> None:
        while not self._done.wait(self.heartbeat_s):
            with self._mutex:
                slots = list(self.slots.values())
            # A failed heartbeat is tried again at once, for up to half an interval a round: a failover (a
            # restart, a sweep of idle sessions) ends every pooled connection, the pool finds each broken only
            # when it is used and drops it, and one failed try per interval let the lease run out under a
            # runner still inside its step's call (recovery then moved the attempt on).
            deadline = time.monotonic() + self.heartbeat_s / 2
            for slot in slots:
                if slot.lost.is_set():
                    continue
                beat = self._beat(slot, deadline)
                if beat is None:
                    continue
                found = telemetry()
                if found is not None:
                    found.renewals.add(1, {"effectlog.fleet.runner_id": self.runner_id})
                if beat.cancel_requested and not slot.cancel.is_set():
                    self.log(f"request {slot.lease.request_id}: cancellation observed at a heartbeat")
                    slot.cancel.set()

    def _beat(self, slot: Slot, deadline: float) -> Heartbeat | None:
        """One heartbeat of ``slot``'s lease, tried until ``deadline`` while the store fails; ``None`` if none
        landed (refused: the slot is lost; failed: the next round tries again, until the lease runs out)."""
        while True:
            try:
                return self.store.heartbeat(slot.lease, self.config.lease_s)
            except StaleLease as exc:
                slot.lost.set()
                self.log(f"heartbeat refused: {exc.code}: {exc}")
                return None
            except EffectlogError as exc:  # the store is unreachable, or this connection was
                if time.monotonic() >= deadline or self._done.wait(_BEAT_PAUSE_S):
                    self.log(f"heartbeat failed: {exc.code}: {exc}")
                    return None

    # -- one attempt --------------------------------------------------------------------

    def _work(self, slot: Slot) -> None:
        """Run the slot's attempt, then, on this thread, each one claimed in the transaction that ended the last."""
        loop = ReusedLoop()  # one event loop for this thread's attempts, not one per attempt
        following: Slot | None = slot
        try:
            while following is not None:
                following = self._work_one(following, loop)
        finally:
            loop.close()

    def _work_one(self, slot: Slot, loop: ReusedLoop) -> Slot | None:
        lease = slot.lease
        found = telemetry()
        try:
            if found is None:
                slot.outcome = self._attempt(slot, loop)
            else:  # an effectlog.fleet.attempt span, the run's spans inside it
                slot.outcome = found.attempt(
                    lease.request_id, self.runner_id, lease.run_id, lease.attempt_no, lambda: self._attempt(slot, loop)
                )
        except StaleLease as exc:
            slot.outcome = "fenced"
            self.log(
                f"request {lease.request_id} attempt {lease.attempt_no}: write refused, stopping: {exc.code}: {exc}"
            )
        except LeaseLost:
            slot.outcome = "lease lost"
            self.log(f"request {lease.request_id} attempt {lease.attempt_no}: lease lost, no further tool is invoked")
        except Exception as exc:
            slot.outcome = "error"
            self.log(f"request {lease.request_id} attempt {lease.attempt_no}: {type(exc).__name__}: {exc}")
        finally:
            if found is not None and slot.outcome in ("fenced", "lease lost"):
                found.leases_lost.add(1, {"effectlog.fleet.runner_id": self.runner_id})
            self.log(f"request {lease.request_id} attempt {lease.attempt_no}: {slot.outcome}")
            # Whatever the outcome, a lease claimed with this attempt's end is run (committed, it is this
            # runner's), by this thread; it takes this slot's place at once, so the loop never sees the
            # runner idle between, and need not wake: no slot freed.
            nxt = self._slot(slot.following[0]) if slot.following else None
            with self._mutex:
                self.slots.pop(lease.attempt_id, None)
                self.ended += 1
                self.started -= slot.carried - len(slot.following)  # counted when claimed; a rollback took it back
                if nxt is not None:
                    nxt.thread = slot.thread
                    self.slots[nxt.lease.attempt_id] = nxt
            if nxt is None:
                self._wake.set()
        return nxt

    def _attempt(self, slot: Slot, loop: ReusedLoop) -> str:
        lease = slot.lease
        store = self.store
        journal = store.leased_journal(lease, before_append=lambda events: self._before_append(slot, events))
        if lease.cancel_requested:
            self._record_cancel(journal, lease)
            return store.advance(lease, "cancel", op_key="final", reason="cancelled before it started")
        # prepare and start ride in the run's first append (or the attempt's next report), and the
        # run's completion makes the attempt succeed in the same transaction: no commit of their own.
        journal.defer("prepare", "prepare")
        journal.succeed_on_completion = True
        journal.hold_start = True  # run.started rides in the run's next commit (LeasedJournal): one commit fewer
        if isinstance(store, SqliteFleetStore):

            def claim_after(tx: Tx) -> list[Lease]:
                leases = self._claim_after(store, tx)
                slot.carried += len(leases)  # counted in ``started``: see _work_one
                return leases

            journal.claim_after = claim_after
        self._point(slot, "prepared", "")
        try:
            plan = resolve(parse_plan(lease.plan.encode(), f"request {lease.request_id}"), self.secrets)
            runtime = Runtime(
                journal, adapters=self.registry, effects=self.config.effects, crash_hook=self._hook(slot), rng=self.rng
            )
        except (BadInput, StorageError) as exc:
            reason = f"cannot prepare: {exc}"
            return journal.reporting(
                lambda before: store.advance(lease, "fail", op_key="final", reason=reason, before=before)
            )
        try:
            journal.defer("start", "start")
            driven = self._driven_outside(lease, journal)
            if driven:  # a person looks once that process is done: nothing is written into its run
                return journal.reporting(
                    lambda before: store.advance(lease, "escalate", op_key="final", reason=driven, before=before)
                )
            return self._drive(slot, runtime, plan, journal, loop)
        finally:
            slot.following = journal.claimed
            runtime.close()

    @staticmethod
    def _driven_outside(lease: Lease, journal: LeasedJournal) -> str:
        """Why the lease's run must not be resumed: a live process outside the fleet drives it ("" if none).

        A run with events when leased may have been started by a plain ``effectlog run`` before it was
        submitted (a finished one is adopted). A lease's appends are fenced by the lease, not by a run's
        owner, so the runner would resume a run that process is driving, call its step in flight crashed
        and refuse that process's outcome (attack14). Once the request exists no new plain run of it
        starts (``run_bound``), so one look when the attempt starts is enough. A fresh run (no event) needs
        none: a process that claimed it but wrote nothing is refused at seq 1 before any tool is invoked.
        """
        if not lease.base_seq:
            return ""
        found = journal.base.owner(lease.run_id, leases=False)
        if not found.live:
            return ""
        return (
            f"run_owned: run {lease.run_id!r} is driven by {describe(found.owner)} outside the fleet; nothing "
            "was written: requeue the request once that process has ended"
        )

    def _claim_after(self, store: SqliteFleetStore, tx: Tx) -> list[Lease]:
        """The next lease, claimed in the transaction that makes this runner's attempt succeed (its slot frees).

        One commit per run fewer: on SQLite the claim and the run's last append share the
        file's write lock anyway. Nothing is claimed while stopping or at ``max_attempts``.
        The claim is counted in ``started`` here, under ``_claiming``: counted later, on the
        attempt's thread after the commit, two attempts ending together each found room
        for one more and the runner went past ``max_attempts``. This runs holding the
        file's turn, which the main loop's claim waits for while it holds ``_claiming``: so
        never wait here; when the loop is claiming, it fills this slot once it is free.
        """
        if self._stopping.is_set() or not self._claiming.acquire(blocking=False):
            return []
        try:
            limit = self.config.max_attempts
            if limit is not None and self.started >= limit:
                return []
            leases = store.claim_within(tx, self.runner_id, sorted(self.config.capabilities), self.config.lease_s, 1)
            with self._mutex:
                self.started += len(leases)
            return leases
        finally:
            self._claiming.release()

    def _drive(self, slot: Slot, runtime: Runtime, plan: Plan, journal: LeasedJournal, loop: ReusedLoop) -> str:
        lease = slot.lease
        waits = 0

        def advance(trigger: str, *, op_key: str, reason: str = "", detail: dict[str, Any] | None = None) -> str:
            # A reason may quote a tool's error, which may quote its args: no secret value enters the store.
            shown = redact_all(plan, reason)
            return journal.reporting(
                lambda before: self.store.advance(
                    lease, trigger, op_key=op_key, reason=shown, detail=detail, before=before
                )
            )

        def escalate(reason: str, step_id: str | None) -> str:
            state = advance("escalate", op_key="final", reason=reason)
            self._notify(
                "operator_needed", lease.request_id, lease.attempt_no, plan.run_id, step_id, redact_all(plan, reason)
            )
            return state

        while True:
            try:
                outcome = runtime.run(plan, on=loop)
            except CancelObserved:
                self._record_cancel(journal, lease)
                return advance("cancel", op_key="final", reason="cancelled by an operator")
            except (StaleLease, LeaseLost):
                raise
            except BadInput as exc:  # plan pinned differently, adapter missing: nothing was invoked
                return advance("fail", op_key="final", reason=str(exc))
            except EffectlogError as exc:  # the record may be half-way: a person looks, nobody guesses
                return escalate(f"{exc.code}: {exc}", None)
            except Exception as exc:  # an adapter's bug: re-queueing it on every runner would loop for ever
                return escalate(f"unexpected error: {type(exc).__name__}: {exc}", None)
            status = outcome.exit_status
            if status != ExitStatus.DONE:
                self._await_late_calls(slot, runtime)
            if status == ExitStatus.DONE:
                if journal.finished is not None:  # run.completed's batch made the attempt succeed
                    return journal.finished
                return advance("succeed", op_key="final", detail={"events": outcome.events_written})
            if status == ExitStatus.STOPPED_UNCERTAIN:
                return escalate(outcome.message, outcome.step_id)
            if status != ExitStatus.SUSPENDED:
                return advance("fail", op_key="final", reason=outcome.message)
            waits += 1
            advance("await_decision", op_key=f"wait#{waits}", reason=outcome.message)
            held = load_run(journal, plan.run_id).step(outcome.step_id) if outcome.step_id and self.notifiers else None
            self._notify(
                "suspended", lease.request_id, lease.attempt_no, plan.run_id, outcome.step_id, outcome.message, held
            )
            if not self._wait_for_decision(slot, journal, plan.run_id):
                self._record_cancel(journal, lease)
                return advance("cancel", op_key="final", reason="cancelled while waiting for a decision")
            advance("resume", op_key=f"resume#{waits}")

    def _await_late_calls(self, slot: Slot, runtime: Runtime) -> None:
        """A call of this attempt that timed out may still make its effect (``effectlog.latecalls``): the
        lease is kept (the heartbeats go on) until it has ended, so that nobody decides the run on
        evidence it can still change. A runner that is stopping (or whose lease was lost) stops waiting
        without reporting the attempt: its exit ends the call, and the lease, left to expire, goes to
        the recovery pass, which finds the step uncertain."""
        for thread in runtime.calls.threads():
            while thread.is_alive():
                if slot.lost.is_set() or self._stopping.is_set():
                    raise LeaseLost  # not reported: the lease expires once this process (and the call) ended
                thread.join(0.2)

    def _notify(  # noqa: PLR0917 - one call site per occasion, each with all of them
        self,
        kind: Kind,
        request_id: int,
        attempt_no: int,
        run_id: str,
        step_id: str | None,
        reason: str,
        held: StepState | None = None,
    ) -> None:
        """Tell a person a request waits for them (a failing hook is logged to stderr, the request goes on).
        A held step's approve command is bound to its attempt and call (``held``), as ``status`` lists it."""
        if not self.notifiers:
            return
        store = self.shown_store
        if kind == "suspended" and step_id is not None:
            bound = (held.args_digest, held.attempt) if held is not None else ("", None)
            command = approve_command(store, run_id, step_id, *bound)
        else:
            command = (
                f"effectlog operator requeue|fail|cancel {shell_option('--store', store)} --request {request_id} "
                "--by NAME --reason TEXT"
            )
        note = Notification(
            kind=kind,
            run_id=run_id,
            step_id=step_id,
            reason=reason,
            command=command,
            journal=store,
            request_id=request_id,
            seq=attempt_no,
        )
        deliver(self.notifiers, note)

    def _wait_for_decision(self, slot: Slot, journal: Journal, run_id: str) -> bool:
        """Hold the lease (heartbeats go on) until a person approves or denies; False if cancelled."""
        while True:
            if slot.cancel.is_set():
                return False
            if slot.lost.is_set():
                raise LeaseLost
            if still_blocked(load_run(journal, run_id)) is None:
                return True
            slot.cancel.wait(self.config.poll_s)

    def _record_cancel(self, journal: Journal, lease: Lease) -> None:
        """Close the run in the journal (fenced like every write) if it was started and is open."""
        if journal.head(lease.run_id)[0] == 0:
            return
        state = load_run(journal, lease.run_id)
        if not state.closed:
            fields = {"by": "operator", "reason": f"request {lease.request_id} cancelled"}
            record_now(journal, state, [(ev.RunCancelled, fields)], time.time_ns)

    # -- hooks ----------------------------------------------------------------------------

    def _hook(self, slot: Slot) -> Callable[[str, str], None]:
        def hook(point: str, step_id: str) -> None:
            self._point(slot, point, step_id)

        return hook

    def _before_append(self, slot: Slot, events: Sequence[ev.Event]) -> None:
        if self._armed is None:  # only an armed test hook stops before an append: no point named per append
            return
        self._point(slot, f"before_append:{ev.tag_of(events[0])}", getattr(events[0], "step_id", "") or "")

    def _point(self, slot: Slot, point: str, step_id: str) -> None:
        if self._armed is not None and point == self._armed:
            self._armed = None  # once per process
            self._reached(point, step_id)
        if point == "after_request":
            self._confirm_lease(slot)
        if point == "after_confirm" and slot.cancel.is_set():
            raise CancelObserved

    def _confirm_lease(self, slot: Slot) -> None:
        """Before a step's call is sent: ``LeaseLost`` unless the store shows the lease still held now.

        The heartbeat thread alone is not enough: a process paused (SIGSTOP, a VM freeze, a long GC)
        between ``step.requested`` and the send wakes with its main thread first, and the lease may have
        expired and the request moved on (to an operator reading an empty ledger) meanwhile. One read
        of the attempt (no commit) narrows the window to the send itself. A store that cannot be read
        leaves the heartbeat thread's verdict standing (the lease is not known to be gone)."""
        lease = slot.lease
        if not slot.lost.is_set():
            try:
                held: bool | None = self.store.lease_held(lease)
            except EffectlogError:
                held = None
            if held is False:
                slot.lost.set()
                self.log(
                    f"request {lease.request_id} attempt {lease.attempt_no}: lease gone before sending the call "
                    "(expired or moved on): not sent"
                )
        if slot.lost.is_set():
            raise LeaseLost  # the lease is gone: do not invoke the tool

    def _reached(self, point: str, step_id: str) -> None:
        if self.config.notify_fd is not None:
            os.write(self.config.notify_fd, f"{point} {step_id or '-'}\n".encode())
        if self.config.resume_fd is not None:
            os.read(self.config.resume_fd, 1)
            return
        while True:  # the test's SIGKILL ends this
            time.sleep(3600)

    def log(self, message: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.log_stream.write(f"effectlog runner {self.runner_id}: {message}\n")
            self.log_stream.flush()


def run_runner(config: RunnerConfig, open_store: Callable[[str], FleetStore], log: TextIO | None = None) -> int:
    config = checked(config)  # before the store is opened (or created)
    secrets_provider(config)
    store = open_store(config.store)
    try:
        with requests_gauge(store):  # effectlog.fleet.requests, when OpenTelemetry is configured
            return Runner(config, store, log=log).serve()
    finally:
        store.close()
