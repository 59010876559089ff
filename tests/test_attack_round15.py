"""Attack round 15: the lead's late calls, lazily opened stores pinned, forked children's loops and
the WAL switch, fresh; and the PostgreSQL journal outside the fleet when a connection is lost.

Real processes, real SQLite files, a real (throwaway) PostgreSQL server via ``pg_url``; the
effects are counted in the effect store itself. The late-call tests reuse round 13's ``_Late``
tool (its first call answers only when the test releases it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

from effectlog import events as ev
from effectlog.adapters.effects import EffectStore
from effectlog.errors import EffectlogError, ExitStatus, RunOwned
from effectlog.journal import open_journal
from effectlog.plan import Plan, parse_plan
from effectlog.runtime import Runtime
from hardening_kit import SAFETY_TIMEOUT_S, cli_env
from test_attack_round13 import LATE_CALLS, RELEASE, _Late, late_released  # noqa: F401 (a fixture)
from test_lifecycle import effect_counts

pytest_plugins = ["pg_fixture"]

HERE = Path(__file__).parent


def _wait_for(path: Path, child: subprocess.Popen[str] | None = None) -> None:
    deadline = time.monotonic() + SAFETY_TIMEOUT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        if child is not None and child.poll() is not None:
            raise AssertionError(f"the child ended first: {child.communicate()}")
        time.sleep(0.02)


class Gated:
    """A non-idempotent tool whose first attempt says it started, then makes its effect only when the test
    creates ``<dir>/go`` (a slow remote service); later attempts answer at once. ``lookup`` reads the
    effect store, as a truthful service's would: what has landed so far."""

    def __init__(self, options: dict[str, Any], ctx: Any) -> None:
        self.dir, self.store = Path(options["dir"]), ctx.effect_store()

    def invoke(self, request: Any) -> Any:
        if request.attempt == 1:
            (self.dir / "started").touch()
            _wait_for(self.dir / "go")
        return self.store.apply_control(request)

    def lookup(self, request: Any) -> Any:
        return self.store.lookup(request)


ADAPTERS = {"test.gated": lambda decl, ctx: Gated(decl.options, ctx)}


def gated_plan(directory: str) -> Plan:
    return parse_plan(
        json.dumps(
            {
                "run_id": "pay-1",
                "adapters": {"bank": {"type": "test.gated", "options": {"dir": directory}}},
                "steps": [{"id": "pay", "adapter": "bank", "args": {"n": 1}}],
            }
        ).encode()
    )


# P1: drives the run; its tool blocks until the test lets it land.
DRIVER = """
import sys
from effectlog.runtime import Runtime
from test_attack_round15 import ADAPTERS, gated_plan

url, effects, directory = sys.argv[1:4]
try:
    with Runtime(url, effects=effects, adapters=ADAPTERS) as rt:
        print(rt.run(gated_plan(directory)).state)
except Exception as exc:
    print(type(exc).__name__, exc)
    sys.exit(9)
"""


def _terminate(url: str, application_name: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = %s AND pid <> pg_backend_pid()",
            (application_name,),
        ).fetchall()
    return len(rows)


def _drive(url: str, effects: Path, where: Path) -> subprocess.Popen[str]:
    """``DRIVER`` in a child process: P1 driving the gated non-idempotent step on the journal at ``url``."""
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, url, str(effects), str(where)],
        env=cli_env({"PYTHONPATH": str(HERE)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_pg_a_lost_claim_connection_lets_another_process_decide_a_run_whose_call_is_still_in_flight(
    tmp_path: Path, pg_url: str
) -> None:
    """Process P1 drives a non-idempotent step on a PostgreSQL journal; while its tool call is in flight
    the server ends P1's claim connection (``pg_terminate_backend``: a failover, an idle-session
    timeout, a firewall dropping the idle socket during a long call). P1 does not notice: it is in
    the tool. Another process then resumes the run (no live owner: the step is uncertain), asks the
    tool's lookup (nothing landed yet: not applied) and resumes again (attempt 2's effect); then P1's
    call lands. Proves (when fixed): while the first owner's process still lives and may still make
    the effect, nobody else decides the run: one effect."""
    effects = tmp_path / "e.db"
    child = _drive(pg_url, effects, tmp_path)
    try:
        _wait_for(tmp_path / "started", child)
        assert 1 == _terminate(pg_url, "effectlog-owner")
        with Runtime(pg_url, effects=effects, adapters=ADAPTERS) as rt:
            with contextlib.suppress(EffectlogError):  # refused while P1 lives: the fix
                rt.run(gated_plan(str(tmp_path)))
            with contextlib.suppress(EffectlogError):
                rt.reconcile_by_lookup("pay-1", "pay")
            with contextlib.suppress(EffectlogError):
                rt.run(gated_plan(str(tmp_path)))
    finally:
        (tmp_path / "go").touch()
        out, err = child.communicate(timeout=SAFETY_TIMEOUT_S)
    assert Counter({("pay-1", "pay"): 1}) == effect_counts(effects), (out, err)


def _idempotent_plan(run_id: str) -> Plan:
    return parse_plan(
        json.dumps(
            {
                "run_id": run_id,
                "adapters": {"fx": {"type": "effects.idempotent", "idempotent": True}},
                "steps": [{"id": "pay", "adapter": "fx", "args": {"n": 1}}, {"id": "ship", "adapter": "fx"}],
            }
        ).encode()
    )


@pytest.mark.parametrize("at", ["before_commit:step.effected", "before_commit:step.requested"])
def test_pg_a_journal_connection_ended_inside_an_append_is_never_taken_as_landed(
    tmp_path: Path, pg_url: str, at: str
) -> None:
    """The server ends the journal's connection inside an append (after its inserts, before COMMIT).
    Proves: the run stops with ``storage`` (the batch is never taken as landed, and nothing of it is
    recorded), and running the plan again in the same runtime (a new pooled connection) finishes it
    with one effect per step (a lost ``step.effected`` re-sends the same key, deduplicated by the
    store), no phase of a step recorded twice for one attempt, and the journal verifies."""
    effects = tmp_path / "e.db"
    fired: list[str] = []

    def hook(where: str, step_id: str) -> None:
        if where == at and step_id == "pay" and not fired:
            fired.append(where)
            # Every backend of this database but the claim's: the pool's, in its transaction. Waits
            # (up to 5 s) until the backend is gone, so the COMMIT cannot outrun the signal.
            with psycopg.connect(pg_url, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND application_name <> 'effectlog-owner'"
                    " AND backend_type = 'client backend'"
                )

    states = []
    with Runtime(pg_url, effects=effects, crash_hook=hook) as rt:
        for _ in range(2):
            try:
                states.append(rt.run(_idempotent_plan("pay-1")).state)
            except EffectlogError as exc:
                states.append(exc.code)
    j = open_journal(pg_url, writer=False)
    try:
        phases = Counter(
            (e.step_id, e.attempt, ev.tag_of(e))
            for e in (ev.decode(r.body) for r in j.read("pay-1"))
            if hasattr(e, "attempt") and hasattr(e, "step_id")
        )
    finally:
        j.close()
    verify = subprocess.run(
        [sys.executable, "-m", "effectlog", "verify", "--journal", pg_url],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=SAFETY_TIMEOUT_S,
    )
    assert ([at], ["storage", "completed"]) == (fired, states)
    assert Counter({("pay-1", "pay"): 1, ("pay-1", "ship"): 1}) == effect_counts(effects)
    assert 1 == max(phases.values()), phases
    assert 0 == verify.returncode, verify.stderr


LATE = {"test.late": lambda decl, ctx: _Late(ctx)}


def _pay_plan(adapter: dict[str, Any], **step: Any) -> Plan:
    """Run ``pay-1``: one step ``pay`` (args ``{"n": 1}`` unless given) on adapter ``bank``, declared as
    ``adapter``; ``step`` adds to or replaces the step's fields."""
    pay = {"id": "pay", "adapter": "bank", "args": {"n": 1}, **step}
    return parse_plan(json.dumps({"run_id": "pay-1", "adapters": {"bank": adapter}, "steps": [pay]}).encode())


def _late_plan() -> Plan:
    return _pay_plan({"type": "test.late"}, timeout_s=0.2)


@pytest.mark.usefixtures("late_released")
def test_a_second_runtime_in_this_process_cannot_decide_a_run_whose_timed_out_call_still_runs(tmp_path: Path) -> None:
    """Two runtimes on one journal in one process (a web app opening one per request), the first's call
    timed out and still runs (and the first was even closed). Proves: the second runtime's lookup and
    resume are refused (exit 6), nothing written, and after the call ends it finds the effect: one."""
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    first = Runtime(str(journal), effects=effects, adapters=LATE)
    assert "stopped" == first.run(_late_plan()).state
    first.close()
    refused = []
    with Runtime(str(journal), effects=effects, adapters=LATE) as second:
        for decide in (lambda: second.reconcile_by_lookup("pay-1", "pay"), lambda: second.run(_late_plan())):
            with pytest.raises(RunOwned) as info:
                decide()
            refused.append(info.value.exit_status)
        RELEASE.set()
        LATE_CALLS[0].join(SAFETY_TIMEOUT_S)
        for thread in [t for t in threading.enumerate() if t.name == "effectlog-late-close"]:
            thread.join(SAFETY_TIMEOUT_S)
        step = second.reconcile_by_lookup("pay-1", "pay").step("pay")
        assert step is not None
        assert ("applied", "completed") == (step.outcome, second.run(_late_plan()).state)
    assert [ExitStatus.LOCKED] * 2 == refused
    assert Counter({("pay-1", "pay"): 1}) == effect_counts(effects)


@pytest.mark.usefixtures("late_released")
def test_pg_a_timed_out_call_keeps_the_claim_after_close_and_the_close_thread_ends_the_journal(
    pg_url: str, tmp_path: Path
) -> None:
    """On a PostgreSQL journal: the runtime closed while a timed-out call still runs keeps the claim's
    connection (another process's decision: exit 6); once the call ends, the close thread releases
    the claim and closes the pool (no owner connection left on the server) and the decision goes through."""
    effects = tmp_path / "e.db"
    rt = Runtime(pg_url, effects=effects, adapters=LATE)
    assert "stopped" == rt.run(_late_plan()).state
    rt.close()
    argv = [sys.executable, "-m", "effectlog", "reconcile", "--journal", pg_url, "--run-id", "pay-1", "--step", "pay"]
    argv += ["--outcome", "applied", "--evidence", "bank statement", "--operator", "ops"]
    held = subprocess.run(argv, capture_output=True, text=True, env=cli_env(), timeout=SAFETY_TIMEOUT_S)
    RELEASE.set()
    LATE_CALLS[0].join(SAFETY_TIMEOUT_S)
    for thread in [t for t in threading.enumerate() if t.name == "effectlog-late-close"]:
        thread.join(SAFETY_TIMEOUT_S)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    after = subprocess.run(argv, capture_output=True, text=True, env=cli_env(), timeout=SAFETY_TIMEOUT_S)
    assert (ExitStatus.LOCKED, (0,), 0) == (held.returncode, tuple(left or ()), after.returncode), (
        held.stderr,
        after.stderr,
    )


def _untimed_late_plan() -> Plan:
    return _pay_plan({"type": "test.late"})


@pytest.mark.usefixtures("late_released")
def test_a_run_cancelled_while_its_call_still_runs_is_not_decided_until_the_call_ends(tmp_path: Path) -> None:
    """The caller cancels ``arun`` while a non-idempotent tool call is in flight (``asyncio.wait_for`` around
    it, a task group, a web request's deadline): the call goes on in its thread, exactly as a timed-out
    one does. Proves (when fixed): until it ends, a resume, the lookup and a resume after it are refused
    in this runtime (nothing decided from a ledger the call may still write), and the effect is made once."""
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    with Runtime(str(journal), effects=effects, adapters=LATE) as rt:

        async def cancelled() -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rt.arun(_untimed_late_plan()), 0.3)

        asyncio.run(cancelled())
        assert [True] == [t.is_alive() for t in LATE_CALLS]
        for decide in (
            lambda: rt.run(_untimed_late_plan()),
            lambda: rt.reconcile_by_lookup("pay-1", "pay"),
            lambda: rt.run(_untimed_late_plan()),
        ):
            with contextlib.suppress(EffectlogError):  # refused while the call runs: the fix
                decide()
        RELEASE.set()
        LATE_CALLS[0].join(SAFETY_TIMEOUT_S)
    assert Counter({("pay-1", "pay"): 1}) == effect_counts(effects)


class Forking:
    """A tool that forks; the child drives a durable run of its own (its own journal and store, its own
    ``asyncio`` loop through the runtime) and leaves with ``os._exit``; the parent waits for it."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.dir = Path(options["dir"])

    def invoke(self, request: Any) -> Any:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with Runtime(str(self.dir / "child.db"), effects=self.dir / "child-e.db") as rt:
                    code = 0 if "completed" == rt.run(_idempotent_plan("child-1")).state else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        return {"child": os.waitstatus_to_exitcode(status)}


FORKING = {"test.forking": lambda decl, ctx: Forking(decl.options)}

FORK_DRIVER = """
import json, sys
from effectlog.plan import parse_plan
from effectlog.runtime import Runtime
from test_attack_round15 import FORKING

directory = sys.argv[1]
plan = parse_plan(json.dumps({
    "run_id": "parent-1",
    "adapters": {"f": {"type": "test.forking", "idempotent": True, "options": {"dir": directory}}},
    "steps": [{"id": "spawn", "adapter": "f"}, {"id": "again", "adapter": "f"}],
}).encode())
with Runtime(directory + "/parent.db", adapters=FORKING) as rt:
    out = rt.run(plan)
    print(json.dumps([out.state, [s.state for s in out.steps]]))
"""


def test_a_tool_whose_forked_child_drives_a_run_of_its_own_leaves_both_runs_completed(tmp_path: Path) -> None:
    """A tool forks twice (two steps); each child drives a second durable run on its own journal with the
    runtime's event loop, completes it and ``os._exit``s. Proves: the parent's run does not hang after
    either fork (its loop is its own), both steps are confirmed with the child's exit 0, the child's
    run completed once (the second child resumes the completed run: one effect per step), and both
    journals verify."""
    done = subprocess.run(
        [sys.executable, "-c", FORK_DRIVER, str(tmp_path)],
        env=cli_env({"PYTHONPATH": str(HERE)}),
        capture_output=True,
        text=True,
        timeout=SAFETY_TIMEOUT_S,
    )
    verify = [
        subprocess.run(
            [sys.executable, "-m", "effectlog", "verify", "--journal", str(tmp_path / name)],
            capture_output=True,
            text=True,
            env=cli_env(),
            timeout=SAFETY_TIMEOUT_S,
        ).returncode
        for name in ("parent.db", "child.db")
    ]
    assert (0, '["completed", ["confirmed", "confirmed"]]') == (done.returncode, done.stdout.strip()), done.stderr
    assert Counter({("child-1", "pay"): 1, ("child-1", "ship"): 1}) == effect_counts(tmp_path / "child-e.db")
    assert [0, 0] == verify


class LazyLost:
    """A non-idempotent tool over the effect store, opened on first use (in ``invoke`` and in ``lookup``, not
    in the factory): attempt 1 makes its effect and loses the answer; later attempts answer."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def invoke(self, request: Any) -> Any:
        receipt = self.ctx.effect_store().apply_control(request)
        if request.attempt == 1:
            raise ConnectionError("the answer was lost on the way back")
        return receipt

    def lookup(self, request: Any) -> Any:
        return self.ctx.effect_store().lookup(request)


LAZY = {"test.lazy-lost": lambda decl, ctx: LazyLost(ctx)}


def _lazy_plan() -> Plan:
    return _pay_plan({"type": "test.lazy-lost"})


def test_a_lookup_through_a_lazily_opened_store_is_checked_against_the_store_the_run_pinned(tmp_path: Path) -> None:
    """The run pins store A (given, opened on first use by its adapter); its non-idempotent step made its
    effect in A and lost the answer (uncertain). ``reconcile_by_lookup`` is asked with store B: the
    check of the given store looked only at a store the factory opened (none), so B's silence was
    recorded as "not applied" and the resume against A made attempt 2's effect there too: two effects.
    Proves: the lookup is refused (``ledger_mismatch``), nothing written, and the effect is made once."""
    journal, a, b = str(tmp_path / "j.db"), tmp_path / "a.db", tmp_path / "b.db"
    EffectStore(str(b)).close()  # another store, in use elsewhere (a staging ledger)
    with Runtime(journal, effects=a, adapters=LAZY) as rt:
        assert "stopped" == rt.run(_lazy_plan()).state
    answer = "recorded"
    with Runtime(journal, effects=b, adapters=LAZY) as rt:
        try:
            rt.reconcile_by_lookup("pay-1", "pay")
        except EffectlogError as exc:
            answer = exc.code
    with Runtime(journal, effects=a, adapters=LAZY) as rt, contextlib.suppress(EffectlogError):
        rt.run(_lazy_plan())
    assert ("ledger_mismatch", Counter({("pay-1", "pay"): 1})) == (answer, effect_counts(a))


class Endless:
    """A tool that never answers (its thread sleeps for ever; a hung remote call)."""

    def invoke(self, request: Any) -> Any:
        threading.Event().wait()


ENDLESS = {"test.endless": lambda decl, ctx: Endless()}

ENDLESS_DRIVER = """
import sys
from effectlog.plan import parse_plan
from effectlog.runtime import Runtime
from test_attack_round15 import ENDLESS

plan = parse_plan(
    b'{"run_id": "pay-1", "adapters": {"bank": {"type": "test.endless"}},'
    b' "steps": [{"id": "pay", "adapter": "bank", "timeout_s": 0.2}]}'
)
with Runtime(sys.argv[1], effects=sys.argv[2], adapters=ENDLESS) as rt:
    print(rt.run(plan).state)
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_process_whose_timed_out_call_never_ends_still_exits_and_gives_the_run_up(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """A tool call times out and never ends; the runtime is closed (a background thread waits for the call).
    Proves: the process still exits at the end of its script (nothing it left joins the call), and
    with it the claim is gone: another process can decide the run (exit 0)."""
    journal = request.getfixturevalue("pg_url") if backend == "postgresql" else str(tmp_path / "j.db")
    try:  # a hang detector, not a timing assertion: the script takes well under a second
        done = subprocess.run(
            [sys.executable, "-c", ENDLESS_DRIVER, journal, str(tmp_path / "e.db")],
            env=cli_env({"PYTHONPATH": str(HERE)}),
            capture_output=True,
            text=True,
            timeout=30,
        )
        ended: tuple[int, str] | None = (done.returncode, done.stdout.strip())
    except subprocess.TimeoutExpired:
        ended = None
    argv = [sys.executable, "-m", "effectlog", "reconcile", "--journal", journal, "--run-id", "pay-1", "--step", "pay"]
    argv += ["--outcome", "not-applied", "--evidence", "bank: no such payment", "--operator", "ops"]
    decided = subprocess.run(argv, capture_output=True, text=True, env=cli_env(), timeout=SAFETY_TIMEOUT_S)
    assert ((0, "stopped"), 0) == (ended, decided.returncode), decided.stderr


def test_the_wal_switch_gives_up_on_a_lock_held_past_its_timeout_and_never_retries_other_errors(
    tmp_path: Path,
) -> None:
    """``walwatch.switch_to_wal`` on a real file: a read-only connection's refusal (``SQLITE_READONLY``) is
    raised as it is, not retried as a busy lock; while another connection holds the write lock past the
    timeout it raises ``SQLITE_BUSY`` (it does not spin for ever); once the lock is gone it switches,
    and switching again is a no-op answering ``wal``."""
    import sqlite3

    from effectlog.journal.walwatch import switch_to_wal

    path = tmp_path / "w.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    read_only = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None)
    other = sqlite3.connect(path, isolation_level=None, timeout=0.05)
    errors = []
    try:
        with pytest.raises(sqlite3.OperationalError) as refused:
            switch_to_wal(read_only, SAFETY_TIMEOUT_S)
        errors.append(refused.value.sqlite_errorname)
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(sqlite3.OperationalError) as busy:
            switch_to_wal(other, 0.3)
        errors.append(busy.value.sqlite_errorname)
        holder.execute("COMMIT")
        modes = [switch_to_wal(other, 0.3), switch_to_wal(other, 0.3)]
    finally:
        for db in (holder, read_only, other):
            db.close()
    assert (["SQLITE_READONLY", "SQLITE_BUSY"], ["wal", "wal"]) == (errors, modes)


class LazyKeys:
    """An idempotent tool over the effect store, opened on its first call (not in the factory)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx

    def invoke(self, request: Any) -> Any:
        return self.ctx.effect_store().apply_idempotent(request)


LAZY_KEYS = {"test.lazy-keys": lambda decl, ctx: LazyKeys(ctx)}


def _approved_plan() -> Plan:
    return _pay_plan({"type": "test.lazy-keys", "idempotent": True}, args={"cents": 500}, approval="required")


def test_a_run_that_started_without_a_store_is_held_to_the_first_store_a_resume_sent_into(tmp_path: Path) -> None:
    """The run starts with no ``--effects`` and waits for an approval before its only step (so it pins no
    store); approved, it is resumed with store A, whose lazily opening adapter sends the step's key
    there, and the process dies before the result is written. Resumed with store B, the step's key is
    sent again into a store that never saw it: the effect twice (once per store). Proves (when fixed):
    the resume with B is refused (the run's effects are in A), one effect in all."""
    from effectlog.outcome import SimulatedCrash

    journal, a, b = str(tmp_path / "j.db"), tmp_path / "a.db", tmp_path / "b.db"
    EffectStore(str(b)).close()

    def crash(where: str, step_id: str) -> None:
        if where == "after_effect":
            raise SimulatedCrash(where)

    with Runtime(journal, adapters=LAZY_KEYS) as rt:
        waiting = rt.run(_approved_plan()).state
        rt.approve("pay-1", "pay", by="ops")
    with Runtime(journal, effects=a, adapters=LAZY_KEYS, crash_hook=crash) as rt, pytest.raises(SimulatedCrash):
        rt.run(_approved_plan())
    with Runtime(journal, effects=b, adapters=LAZY_KEYS) as rt, contextlib.suppress(EffectlogError):
        rt.run(_approved_plan())
    made = effect_counts(a) + effect_counts(b)
    assert ("suspended", Counter({("pay-1", "pay"): 1})) == (waiting, made)


class OwnLedger:
    """A non-idempotent tool that keeps no rows in the effect store: its service is asked for the truth
    (a file standing in for the provider's API); attempt 1 lands and loses its answer."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.ledger = Path(options["ledger"])

    def invoke(self, request: Any) -> Any:
        with self.ledger.open("a") as fh:
            fh.write(f"{request.idempotency_key}\n")
        if request.attempt == 1:
            raise ConnectionError("the answer was lost on the way back")
        return {"ok": True}

    def lookup(self, request: Any) -> Any:
        from effectlog.adapters import Evidence

        keys = self.ledger.read_text().split() if self.ledger.exists() else []
        return Evidence(applied=request.idempotency_key in keys, detail="provider's ledger")


OWN_LEDGER = {"test.own-ledger": lambda decl, ctx: OwnLedger(decl.options)}


def test_a_lookup_that_needs_no_store_still_answers_when_the_pinned_store_file_is_gone(tmp_path: Path) -> None:
    """The run was given ``--effects`` (so it pins that store) but its tool keeps no rows there and asks its
    own service; the store file was removed since. Proves: ``reconcile_by_lookup`` with no ``effects``
    still asks the tool's lookup and records its answer (applied), as before stores given were opened
    for the check; the effect is made once."""
    journal, store, ledger = str(tmp_path / "j.db"), tmp_path / "e.db", tmp_path / "provider.txt"
    plan = parse_plan(
        json.dumps(
            {
                "run_id": "pay-1",
                "adapters": {"psp": {"type": "test.own-ledger", "options": {"ledger": str(ledger)}}},
                "steps": [{"id": "pay", "adapter": "psp", "args": {"n": 1}}],
            }
        ).encode()
    )
    with Runtime(journal, effects=store, adapters=OWN_LEDGER) as rt:
        assert "stopped" == rt.run(plan).state
    for leftover in tmp_path.glob("e.db*"):
        leftover.unlink()
    with Runtime(journal, adapters=OWN_LEDGER) as rt:
        step = rt.reconcile_by_lookup("pay-1", "pay").step("pay")
    assert step is not None
    assert (("reconciled", "applied"), 1) == ((step.state, step.outcome), len(ledger.read_text().split()))


def _square(n: int) -> int:
    return n * n


class PoolUser:
    """A tool that hands work to a ``multiprocessing`` pool started with the fork method (from its thread)."""

    def invoke(self, request: Any) -> Any:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(2) as pool:
            return {"squares": pool.map(_square, range(4))}


POOL = {"test.pool": lambda decl, ctx: PoolUser()}

POOL_DRIVER = """
import sys
from effectlog.plan import parse_plan
from effectlog.runtime import Runtime
from test_attack_round15 import POOL

plan = parse_plan(
    b'{"run_id": "p", "adapters": {"pool": {"type": "test.pool", "idempotent": true}},'
    b' "steps": [{"id": "one", "adapter": "pool"}, {"id": "two", "adapter": "pool"}]}'
)
with Runtime(sys.argv[1], adapters=POOL) as rt:
    out = rt.run(plan)
    print(out.state, rt.load("p").step("two").receipt)
"""


def test_a_tool_using_a_fork_started_multiprocessing_pool_completes_the_run(tmp_path: Path) -> None:
    """Two steps each hand work to a fork-started ``multiprocessing`` pool from the tool's thread (the
    forked workers hold copies of the runtime's loop, journal and locks). Proves: the run completes
    (no hang, no worker refused or writing), with the pool's answer recorded, and the journal verifies."""
    try:  # a hang detector, not a timing assertion
        done = subprocess.run(
            [sys.executable, "-c", POOL_DRIVER, str(tmp_path / "j.db")],
            env=cli_env({"PYTHONPATH": str(HERE)}),
            capture_output=True,
            text=True,
            timeout=60,
        )
        ended: tuple[int, str] | None = (done.returncode, done.stdout.strip())
    except subprocess.TimeoutExpired:
        ended = None
    verify = subprocess.run(
        [sys.executable, "-m", "effectlog", "verify", "--journal", str(tmp_path / "j.db")],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=SAFETY_TIMEOUT_S,
    )
    assert ((0, "completed {'squares': [0, 1, 4, 9]}"), 0) == (ended, verify.returncode)


def test_pg_a_server_stopped_immediately_during_a_call_leaves_the_effect_made_once(tmp_path: Path) -> None:
    """The journal's database defaults to ``synchronous_commit = off`` (a common tuning, made for other
    applications of the server): the server acknowledges a commit before its WAL is written, and a
    crash loses the last ones. Process P1's non-idempotent call is in flight when its own throwaway
    server is stopped with ``pg_ctl stop -m immediate`` (a crash to the clients) and started again;
    then the call lands. ``run.started`` and ``step.requested`` were lost: the resume started the
    run anew and sent attempt 1 again (two effects, the journal saying one). Proves (fixed): an
    append effectlog was told is durable survives the crash; P1 records what it can (an append on
    a new pooled connection lands, one on a connection the restart broke ends P1 with ``storage``);
    the resume never sends the step again (confirmed: the run completes; still requested:
    uncertain, not guessed); one effect; the journal verifies. (P1 wrote on after the restart
    although its claim's lock was gone: the class of the strict xfail above.)"""
    from pg_fixture import started_cluster

    cluster = started_cluster()
    try:
        url = cluster.create_database()
        # A database whose default is asynchronous commit (a common tuning, made for other applications
        # of the same server), and a WAL writer that flushes such commits only every 10 s.
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {urlsplit(url).path.lstrip('/')} SET synchronous_commit = off")
            conn.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
            conn.execute("SELECT pg_reload_conf()")
        effects = tmp_path / "e.db"
        child = _drive(url, effects, tmp_path)
        try:
            _wait_for(tmp_path / "started", child)
            pg_ctl = str(cluster._bindir / "pg_ctl")
            cluster._run([pg_ctl, "-D", str(cluster.data), "-m", "immediate", "-w", "-t", "30", "stop"], "stop")
            options = f"-c listen_addresses=127.0.0.1 -p {cluster.port} -k {cluster.tmp} -c fsync=off"
            cluster._run(
                [pg_ctl, "-D", str(cluster.data), "-l", str(cluster.log), "-o", options, "-w", "start"], "start"
            )
        finally:
            (tmp_path / "go").touch()
            out, err = child.communicate(timeout=SAFETY_TIMEOUT_S)
        with Runtime(url, effects=effects, adapters=ADAPTERS) as rt:
            resumed = rt.run(gated_plan(str(tmp_path))).state
            step = rt.load("pay-1").step("pay")
        verify = subprocess.run(
            [sys.executable, "-m", "effectlog", "verify", "--journal", url],
            capture_output=True,
            text=True,
            env=cli_env(),
            timeout=SAFETY_TIMEOUT_S,
        )
    finally:
        cluster.stop()
    assert step is not None
    first = out.strip()
    assert first == "completed" or first.startswith("StorageError"), (out, err)
    # Which pooled connection each append got decides how far P1 wrote; never a second attempt.
    expected = ("completed", "confirmed") if step.state == "confirmed" else ("stopped", "uncertain")
    assert (expected, 1) == ((resumed, step.state), step.attempt), (out, err)
    assert Counter({("pay-1", "pay"): 1}) == effect_counts(effects)
    assert 0 == verify.returncode, verify.stderr


@pytest.mark.usefixtures("late_released")
def test_a_run_kept_for_a_late_call_is_given_up_when_the_call_ends_even_if_the_runtime_is_idle(
    tmp_path: Path,
) -> None:
    """A long-lived runtime (an application's) made a call that timed out; the call then ended, and the
    runtime is not used again for a while (no run, no decision, no close). Proves: another process's
    decision is no longer refused once the call has ended (exit 0), without waiting for this runtime
    to be used again (a thread that saw the call end gave the run up)."""
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    with Runtime(str(journal), effects=effects, adapters=LATE) as rt:
        assert "stopped" == rt.run(_late_plan()).state
        RELEASE.set()
        LATE_CALLS[0].join(SAFETY_TIMEOUT_S)
        with open_journal(str(journal), writer=False) as reader:  # given up by a thread of its own, shortly
            deadline = time.monotonic() + SAFETY_TIMEOUT_S
            while reader.owner("pay-1").live and time.monotonic() < deadline:
                time.sleep(0.01)
        argv = [sys.executable, "-m", "effectlog", "reconcile", "--journal", str(journal), "--run-id", "pay-1"]
        argv += ["--step", "pay", "--outcome", "applied", "--evidence", "bank statement", "--operator", "ops"]
        decided = subprocess.run(argv, capture_output=True, text=True, env=cli_env(), timeout=SAFETY_TIMEOUT_S)
    assert 0 == decided.returncode, decided.stderr


def test_every_pooled_session_of_the_journal_and_the_fleet_store_commits_synchronously(pg_url: str) -> None:
    """The database defaults to ``synchronous_commit = off``. Proves: the journal's sessions and the fleet
    store's own sessions (its claims and transitions) both run with it ``on`` (one ``configure_session``
    for both), while a stronger default is kept (``remote_apply`` stays)."""
    from effectlog.fleet import open_store
    from effectlog.journal import open_journal

    database = urlsplit(pg_url).path.lstrip("/")

    def seen(default: str) -> tuple[str, str]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {database} SET synchronous_commit = {default}")
        journal, store = open_journal(pg_url), open_store(pg_url)
        try:
            with journal._connection() as a, store._connection() as b:  # type: ignore[attr-defined]
                return (
                    str(a.execute("SHOW synchronous_commit").fetchone()[0]),
                    str(b.execute("SHOW synchronous_commit").fetchone()[0]),
                )
        finally:
            store.close()
            journal.close()

    assert (("on", "on"), ("remote_apply", "remote_apply")) == (seen("off"), seen("remote_apply"))
