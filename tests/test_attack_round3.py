"""Attacks on this session's changes (the lazy resume from the last checkpoint segment's frontier, the
PostgreSQL fenced append on a cached head, SQLite idle runners on inotify, the recursive ``runs()``
skip-scan and ``read()`` without the run id, the fleet claim's queue index): each test is one
suspicion, kept as a regression test. Real SQLite files, real PostgreSQL, real processes."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

import journal_tamper
from effectlog.adapters import EffectStore
from effectlog.errors import ExitStatus
from effectlog.journal import Journal, SqliteJournal, checkpoint, load_run, resume_point
from effectlog.journal import frontier as fr
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime, SimulatedCrash
from test_checkpoints import crash_after

pytest_plugins = ["pg_fixture"]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", *args], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def every_1(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint segment with every batch of an open run."""
    monkeypatch.setattr(checkpoint, "EVERY_EVENTS", 1)


def _mixed_plan(run_id: str) -> Plan:
    steps = tuple(
        StepDecl(id=f"s{i}", adapter="tool", args={"i": i}, approval="required" if i in (2, 5) else None)
        for i in range(7)
    )
    return Plan(run_id=run_id, adapters={"tool": AdapterDecl(type="effects.control", idempotent=False)}, steps=steps)


def _lazy_equals_replay(open_journal: Callable[[], Journal], plan: Plan) -> None:
    """The resume point from the last segment answers every step as the full replay does: first
    whether it is done (which loads nothing), then its state, then the whole loaded state."""
    with open_journal() as reader:  # type: ignore[attr-defined]
        point = resume_point(reader, plan.run_id, plan)
        full = load_run(reader, plan.run_id)
        done = [s.id for s in plan.steps if full.steps.get(s.id) is not None and full.steps[s.id].done]
        assert done == [s.id for s in plan.steps if fr.is_done(point.state.steps, s.id)]
        assert [full.steps.get(s.id) for s in plan.steps] == [point.state.steps.get(s.id) for s in plan.steps]
        assert full == fr.loaded(point.state)


def _drive_mixed(
    journal: Callable[[], Journal], open_reader: Callable[[], Journal], where: str, effects: Path
) -> list[int]:
    """One run through approvals, crashes before an effect, after one and after a confirmation, an
    operator's reconcile (both outcomes), each operator decision by the CLI (in the tail after the last
    segment), and a resume from the segments after each; the effect count per step at the end."""
    plan = _mixed_plan("mix")
    ops = ("--journal", where, "--run-id", "mix")
    evidence = ("--evidence", "ledger", "--operator", "ops")

    def run(hook: Any = None) -> Any:
        with Runtime(journal(), effects=effects, crash_hook=hook) as rt:
            return rt.run(plan)

    assert "suspended" == run().state  # s2 waits
    assert 0 == cli("approve", *ops, "--step", "s2", "--by", "ops").returncode
    _lazy_equals_replay(open_reader, plan)
    with pytest.raises(SimulatedCrash):
        run(crash_after("s3", "after_request"))  # requested, never sent: uncertain on resume
    _lazy_equals_replay(open_reader, plan)
    assert "stopped" == run().state
    _lazy_equals_replay(open_reader, plan)
    done = cli("reconcile", *ops, "--step", "s3", "--outcome", "not-applied", *evidence)
    assert 0 == done.returncode, done.stderr
    _lazy_equals_replay(open_reader, plan)
    with pytest.raises(SimulatedCrash):
        run(crash_after("s3", "after_effect"))  # attempt 2 applied, its receipt not durable: uncertain again
    _lazy_equals_replay(open_reader, plan)
    assert "stopped" == run().state
    done = cli("reconcile", *ops, "--step", "s3", "--outcome", "applied", *evidence)
    assert 0 == done.returncode, done.stderr
    _lazy_equals_replay(open_reader, plan)
    with pytest.raises(SimulatedCrash):
        run(crash_after("s4", "after_confirm"))
    _lazy_equals_replay(open_reader, plan)
    assert "suspended" == run().state  # s5 waits
    assert 0 == cli("approve", *ops, "--step", "s5", "--by", "ops").returncode
    with pytest.raises(SimulatedCrash):
        run(crash_after("s6", "after_request"))
    _lazy_equals_replay(open_reader, plan)
    assert "stopped" == run().state
    done = cli("reconcile", *ops, "--step", "s6", "--outcome", "not-applied", *evidence)
    assert 0 == done.returncode, done.stderr
    _lazy_equals_replay(open_reader, plan)
    outcome = run()
    assert "completed" == outcome.state, outcome.message
    store = EffectStore(str(effects))
    try:
        return [store.count(run_id="mix", step_id=f"s{i}") for i in range(7)]
    finally:
        store.close()


@pytest.mark.usefixtures("every_1")
def test_sqlite_lazy_resume_through_operator_decisions_and_crashes_equals_the_replay(tmp_path: Path) -> None:
    """SQLite, a segment with every batch: after each stop (approval, crash before and after an
    effect, uncertain, reconcile not-applied twice) the lazy resume point answers every step as the
    full replay does, each effect is applied exactly once, and ``verify`` passes."""
    path = tmp_path / "j.db"
    counts = _drive_mixed(
        lambda: SqliteJournal(path), lambda: SqliteJournal(path, writer=False), str(path), tmp_path / "e.db"
    )
    assert [1] * 7 == counts
    assert 0 == cli("verify", "--journal", str(path)).returncode


@pytest.mark.postgres
@pytest.mark.usefixtures("every_1")
def test_postgresql_lazy_resume_through_operator_decisions_and_crashes_equals_the_replay(
    pg_url: str, tmp_path: Path
) -> None:
    """The same on PostgreSQL (its own ``last_checkpoint_row``): every resume point equals the full
    replay, each effect exactly once, ``verify`` passes."""
    from effectlog.journal.postgres import PostgresJournal

    counts = _drive_mixed(
        lambda: PostgresJournal(pg_url), lambda: PostgresJournal(pg_url, writer=False), pg_url, tmp_path / "e.db"
    )
    assert [1] * 7 == counts
    done = cli("verify", "--journal", pg_url)
    assert 0 == done.returncode, done.stderr


# -- 2. PostgreSQL fenced append on a cached head --------------------------------------------------

_REFUSE_AT_COMMIT = """
CREATE FUNCTION effectlog.attack_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.step_id LIKE 'refused%' THEN RAISE EXCEPTION 'refused at commit'; END IF;
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER attack_refuse AFTER INSERT ON effectlog.events
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION effectlog.attack_refuse();
"""


@pytest.mark.postgres
@pytest.mark.parametrize("batch", [1, 3])
def test_a_fenced_append_whose_commit_fails_leaves_the_cached_head_where_it_was(pg_url: str, batch: int) -> None:
    """A fenced batch on the one-statement path passes its statement and fails at COMMIT (a deferred
    trigger refuses it there, as a server would on a lost connection or a failed WAL write): nothing is
    written, and the same journal's next batches - other bytes at the same seqs, then more - chain
    onto the head that is stored, not onto the refused batch (else seq n+1 would link a hash nobody
    stored: a forked chain that ``verify`` calls broken)."""
    import psycopg

    from effectlog.chain import GENESIS, Chain
    from effectlog.errors import EffectlogError
    from effectlog.fleet import open_store
    from effectlog.fleet.contract import noop_plan, requested, started
    from effectlog.fleet.postgres_journal import FleetPostgresJournal

    store = open_store(pg_url)
    journal = FleetPostgresJournal(pg_url)
    try:
        request = store.submit("cache", "run-c", noop_plan("run-c")).request
        lease = store.claim(request.request_id, "cacher", 60.0)
        assert lease is not None
        journal.append_fenced([started("run-c")], lease)
        journal.append_fenced([requested("run-c", 2, step="a2")], lease)  # the cached head is seq 2 now
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(_REFUSE_AT_COMMIT)
        refused = [requested("run-c", 3 + i, step=f"refused{i}") for i in range(batch)]
        with pytest.raises(EffectlogError):
            journal.append_fenced(refused, lease)
        assert 2 == store.journal().head("run-c")[0]
        journal.append_fenced([requested("run-c", 3 + i, step=f"b{i}") for i in range(batch)], lease)
        journal.append_fenced([requested("run-c", 3 + batch, step="c")], lease)
        chain, prev, seqs = Chain(), GENESIS, []
        for record in store.journal().read("run-c"):
            assert chain.link(prev, record.body) == record.hash, record.seq
            prev, seqs = record.hash, [*seqs, record.seq]
        assert list(range(1, 4 + batch)) == seqs
    finally:
        journal.close()
        store.close()


# -- 3. SQLite idle runners on inotify ----------------------------------------------------------------


def _descriptors() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify and /proc are Linux's")
def test_more_watchers_than_the_inotify_limit_fall_back_to_the_poll_and_close_every_descriptor(
    tmp_path: Path,
) -> None:
    """One process watches more SQLite stores than the per-user inotify instance limit (often 128):
    the watchers past it cannot get one and must poll instead, not fail. Every watcher - on inotify or
    on the poll - wakes for a queued request written by another connection, and once all are stopped
    no descriptor (inotify, stop pipe, SQLite file) is left open."""
    from effectlog.fleet import open_store, wakeups

    try:
        limit = int(Path("/proc/sys/fs/inotify/max_user_instances").read_text())
    except OSError:
        limit = 128
    count = min(limit, 1024) + 4
    paths = []
    for i in range(count):
        (tmp_path / str(i)).mkdir()
        paths.append(str(tmp_path / str(i) / "fleet.db"))
        open_store(paths[-1]).close()
    before = _descriptors()
    woken = [threading.Event() for _ in paths]
    watchers = [wakeups.watch_sqlite(p, e.set) for p, e in zip(paths, woken, strict=True)]
    try:
        for path in paths:
            db = sqlite3.connect(path, isolation_level=None)
            try:
                db.execute(wakeups.SQLITE_BUMP)
            finally:
                db.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(e.is_set() for e in woken):
            time.sleep(0.05)
        assert [True] * count == [e.is_set() for e in woken]
    finally:
        for watcher in watchers:
            watcher.stop()
    deadline = time.monotonic() + 60  # SQLite closes its descriptors as each watcher thread ends
    while _descriptors() - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set() == _descriptors() - before


# -- 5. SQLite fleet claims on the queue index ---------------------------------------------------------

_OPEN_AND_CLAIM = """
import os, sys, time
from effectlog.fleet import open_store
path, go, name = sys.argv[1], sys.argv[2], sys.argv[3]
open(f"{go}.{name}", "w").close()  # imported: waiting for the go
while not os.path.exists(go):
    time.sleep(0.001)
with open_store(path) as store:
    got = store.claim_next(name, ["gpu"] if name.endswith("gpu") else [], 60.0, 1)
    print(",".join(str(lease.request_id) for lease in got))
"""


def test_an_old_store_without_the_queue_index_opened_by_many_processes_at_once(tmp_path: Path) -> None:
    """A store made before the queue index (dropped here) opened by six processes at the same instant,
    each making the index if missing and claiming one request: none fails (no "database is locked",
    no "index already exists"), no request is claimed twice, the requests needing a capability go
    only to the runners offering it, and every plain request is claimed."""
    from effectlog.fleet import open_store
    from effectlog.fleet.contract import noop_plan

    path, go = tmp_path / "fleet.db", tmp_path / "go"
    with open_store(str(path)) as store:
        for i in range(6):
            store.submit("s", f"k{i}", noop_plan(f"run-{i}"), requires=["gpu"] if i in (1, 4) else [])
    with sqlite3.connect(path) as db:
        db.execute("DROP INDEX fleet_attempts_queue")
    names = ["a", "b", "c", "d", "e-gpu", "f-gpu"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_AND_CLAIM, str(path), str(go), name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    deadline = time.monotonic() + 120  # six Python start-ups on a loaded machine: no fixed guess
    while not all(Path(f"{go}.{name}").exists() for name in names):
        assert all(proc.poll() is None for proc in procs), [proc.communicate() for proc in procs]
        assert time.monotonic() < deadline, "the six processes were not all imported and waiting in 120 s"
        time.sleep(0.02)
    go.touch()  # every process imported and waiting: they open the store at the same instant
    outs = [proc.communicate(timeout=120) for proc in procs]
    assert [0] * 6 == [proc.returncode for proc in procs], [err for _, err in outs]
    got = {name: out.strip() for name, (out, _) in zip(names, outs, strict=True)}
    plain = sorted(int(got[n]) for n in names[:4] if got[n])
    gpu = sorted(int(got[n]) for n in names[4:] if got[n])
    # Plain runners never take a gpu request; between them the six requests are each claimed once.
    assert [] == [r for r in plain if r in (2, 5)]  # request ids 2 and 5 need gpu
    assert sorted(plain + gpu) == sorted(set(plain + gpu))
    # A plain runner finds nothing only when every request left needs the capability.
    assert set() == {1, 3, 4, 6} - set(plain + gpu)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT 1 FROM sqlite_master WHERE name = 'fleet_attempts_queue'").fetchone()


# -- 1. the lazy resume on a cut tail (PostgreSQL) ------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.usefixtures("every_1")
@pytest.mark.parametrize("keep", ["before_request", "request_only"])
def test_on_postgresql_a_tail_cut_under_the_last_segment_is_refused_not_sent_again(
    pg_url: str, tmp_path: Path, keep: str
) -> None:
    """PostgreSQL, a segment with every batch, a non-idempotent step whose effect was applied while the
    process died before its receipt was recorded. The run's last events are then cut: back to before
    that step's request (the segment of the request batch is left past the head), or to its request
    alone when that batch carried no later event. The next resume must refuse (exit 7 from ``effectlog
    run``, one line) or stop on the uncertain step - never send the step a second time."""
    import psycopg

    from effectlog.journal.postgres import PostgresJournal

    effects, plan_file = tmp_path / "e.db", tmp_path / "plan.json"
    plan = Plan(
        run_id="cut",
        adapters={"tool": AdapterDecl(type="effects.control", idempotent=False)},
        steps=tuple(StepDecl(id=f"s{i}", adapter="tool", args={"i": i}) for i in range(4)),
    )
    plan_file.write_bytes(msgspec.json.encode(plan))
    with (
        Runtime(PostgresJournal(pg_url), effects=effects, crash_hook=crash_after("s2", "after_effect")) as rt,
        pytest.raises(SimulatedCrash),
    ):
        rt.run(plan)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        request = conn.execute(
            "SELECT seq FROM effectlog.events WHERE run_id = 'cut' AND step_id = 's2' AND phase = 'step.requested'"
        ).fetchone()[0]
        conn.execute("ALTER TABLE effectlog.events DISABLE TRIGGER events_append_only")
        cut_from = request if keep == "before_request" else request + 1
        conn.execute("DELETE FROM effectlog.events WHERE run_id = 'cut' AND seq >= %s", (cut_from,))
        conn.execute("ALTER TABLE effectlog.events ENABLE ALWAYS TRIGGER events_append_only")
    done = cli("run", str(plan_file), "--journal", pg_url, "--effects", str(effects), "--quiet")
    store = EffectStore(str(effects))
    try:
        assert [1, 1, 1, 0] == [store.count(run_id="cut", step_id=f"s{i}") for i in range(4)], done.stderr
    finally:
        store.close()
    if keep == "before_request":
        assert (int(ExitStatus.INTEGRITY), 1) == (done.returncode, len(done.stderr.strip().splitlines())), done.stderr
    else:
        assert int(ExitStatus.STOPPED_UNCERTAIN) == done.returncode, done.stderr


def _many_open_runs(journal: Callable[[], Journal], effects: Path, runs: int, steps: int) -> None:
    """``runs`` runs of ``steps`` idempotent steps, each stopped after its middle step's confirmation."""
    stop = f"s{steps // 2}"
    for r in range(runs):
        plan = Plan(
            run_id=f"r{r}",
            adapters={"tool": AdapterDecl(type="effects.idempotent", idempotent=True)},
            steps=tuple(StepDecl(id=f"s{i}", adapter="tool", args={"i": i}) for i in range(steps)),
        )
        hook = crash_after(stop, "after_confirm")
        with Runtime(journal(), effects=effects, crash_hook=hook) as rt, pytest.raises(SimulatedCrash):
            rt.run(plan)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_many_runs_recovered_at_once_load_their_done_steps_while_others_commit(
    request: pytest.FixtureRequest, tmp_path: Path, backend: str
) -> None:
    """Many open runs, each resumed lazily from its last segment, driven together by one ``effectlog
    recover`` (their batches group-committed): each run loads its done steps (for its seal or report)
    while the others' commits are in flight on the same journal. Every run completes, every step's
    effect is applied exactly once, and ``verify`` passes."""
    from effectlog.journal.postgres import PostgresJournal

    runs, steps = 12, 10
    where = str(tmp_path / "j.db") if backend == "sqlite" else request.getfixturevalue("pg_url")
    effects = tmp_path / "e.db"
    env = {**os.environ, "EFFECTLOG_CHECKPOINT_EVERY": "2"}
    opener: Callable[[], Journal] = (
        (lambda: SqliteJournal(where)) if backend == "sqlite" else (lambda: PostgresJournal(where))
    )
    original = checkpoint.EVERY_EVENTS
    checkpoint.EVERY_EVENTS = 2
    try:
        _many_open_runs(opener, effects, runs, steps)
    finally:
        checkpoint.EVERY_EVENTS = original
    done = cli("recover", "--journal", where, "--effects", str(effects), "--json", env=env)
    assert 0 == done.returncode, done.stderr
    assert ["completed"] * runs == [r["state"] for r in json.loads(done.stdout)]
    with sqlite3.connect(effects) as db:
        counts = db.execute("SELECT count(*), count(DISTINCT run_id || '/' || step_id) FROM effects").fetchone()
    assert (runs * steps, runs * steps) == counts
    verified = cli("verify", "--journal", where)
    assert 0 == verified.returncode, verified.stderr


# -- 4. SQLite runs() as a recursive skip-scan, read() without the run id ------------------------------

ODD_RUN_IDS = [
    "a", "a\x00b", "ab", "a b", "A", "é", "e\u0301", "\U0001f600", "z" * 5000, "a-", "a.", "0", "00", "1e3",
    " ", "\t", "ﬀ", "a" * 4999 + "b", "",
]  # fmt: skip


def test_runs_lists_odd_run_ids_as_distinct_did_and_read_gives_each_its_own_events(tmp_path: Path) -> None:
    """Run ids that sort oddly (an embedded NUL, one a prefix of another, combining characters, an
    emoji, 5,000 characters, digits, whitespace, the empty string): ``runs()`` lists exactly what
    ``SELECT DISTINCT run_id ... ORDER BY run_id`` lists, in its order, and ``read()`` of each gives
    that run's one event with its own run id (the column is no longer read back)."""
    from effectlog import events as ev

    path = tmp_path / "j.db"
    with SqliteJournal(path) as journal:
        for rid in ODD_RUN_IDS:
            journal.append([ev.RunStarted(run_id=rid, seq=1, ts=1, plan={"steps": []}, plan_digest="x")])
        listed = journal.runs()
    with journal_tamper.connect(path) as db:
        expected = [r[0] for r in db.execute("SELECT DISTINCT run_id FROM ev ORDER BY run_id")]
    assert expected == listed
    assert sorted(ODD_RUN_IDS) == sorted(listed)
    with SqliteJournal(path, writer=False) as reader:
        for rid in listed:
            records = list(reader.read(rid))
            assert [(rid, rid)] == [(r.run_id, ev.decode(r.body).run_id) for r in records]
