"""Attacks on issue 18's changes (checkpoint segments, the owner's append path, the writers' gate,
the fleet's claim and fenced appends): each test is a reproduction of one suspicion, kept as a
regression test. Real SQLite files, real processes and SIGKILL where a crash is the point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import msgspec
import pytest

import journal_tamper
from effectlog.adapters import EffectStore
from effectlog.crashmatrix.processes import run_process
from effectlog.errors import ExitStatus
from effectlog.integrity import verify_run
from effectlog.journal import SqliteJournal, checkpoint, load_for_resume, load_run
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime, SimulatedCrash

pytest_plugins = ["pg_fixture"]


def plan_of(run_id: str, steps: int, adapter: str = "noop") -> Plan:
    idempotent = adapter != "effects.control"
    return Plan(
        run_id=run_id,
        adapters={"tool": AdapterDecl(type=adapter, idempotent=idempotent)},
        steps=tuple(StepDecl(id=f"s{i}", adapter="tool", args={"i": i}) for i in range(steps)),
    )


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_the_owners_appends_carry_their_checkpoint_segments(tmp_path: Path) -> None:
    """A run driven by ``effectlog run`` (the runtime holds the run's claim, so every batch takes the
    owner's append path) with a segment due in every batch stores those segments, each bound to the
    chain: a resume then starts from the last one. The hot-path merge had made the owner's path drop
    them, so on SQLite no runtime ever wrote a segment (resume replayed in full, and a cut tail under
    a segment went unseen)."""
    journal, plan_file = tmp_path / "j.db", tmp_path / "plan.json"
    plan = plan_of("own", 6)
    plan_file.write_bytes(msgspec.json.encode(plan))
    done = cli("run", str(plan_file), "--journal", str(journal), "--quiet",
               env={**os.environ, "EFFECTLOG_CHECKPOINT_EVERY": "1"})  # fmt: skip
    assert 0 == done.returncode, done.stderr
    with SqliteJournal(journal, writer=False) as reader:
        stored = reader.stored_checkpoints("own")
        closed = load_run(reader, "own")
    # Every batch of an open run carries one (the closing batch carries the seal instead): at
    # least one per step, none at or past the closing event.
    seqs = [seq for _, seq, _, _, _ in stored]
    assert (True, True) == (len(seqs) >= len(plan.steps), 0 < seqs[-1] < closed.seq)
    assert 0 == cli("verify", "--journal", str(journal)).returncode


@pytest.mark.parametrize("point", ["after_effect", "after_confirm"])
def test_a_cut_tail_of_a_killed_cli_run_is_refused_not_sent_again(tmp_path: Path, point: str) -> None:
    """A real ``effectlog`` worker SIGKILLed after a non-idempotent step's effect (segments every
    batch); then the run's last events, from that step's request on, are cut from the file. The next
    ``effectlog run`` must refuse (exit 7, one line) instead of sending the step again: the segment
    written with the cut event is the evidence. Without segments on the owner's path the step was
    sent a second time."""
    journal, effects, plan_file = tmp_path / "j.db", tmp_path / "effects.db", tmp_path / "plan.json"
    plan_file.write_bytes(msgspec.json.encode(plan_of("cut", 4, adapter="effects.control")))
    env = {**os.environ, "EFFECTLOG_CHECKPOINT_EVERY": "1"}
    worker = [sys.executable, "-m", "effectlog", "crash-matrix", "worker", "--plan", str(plan_file)]
    killed = run_process("crash", [*worker, "--journal", str(journal), "--effects", str(effects)], point, env=env)
    assert (point, 9) == (killed.reached, killed.signal)
    with journal_tamper.connect(journal) as db:
        first = db.execute(
            "SELECT min(seq) FROM ev WHERE run_id = 'cut' AND step_id = ("
            "SELECT step_id FROM ev WHERE run_id = 'cut' AND step_id != '' ORDER BY seq DESC LIMIT 1)"
        ).fetchone()[0]
        db.execute("DROP TRIGGER events_append_only_delete")
        db.execute("DELETE FROM ev WHERE run_id = 'cut' AND seq >= ?", (first,))
    store = EffectStore(str(effects))
    try:
        before = [store.count(run_id="cut", step_id=f"s{i}") for i in range(4)]
    finally:
        store.close()
    done = cli("run", str(plan_file), "--journal", str(journal), "--effects", str(effects), "--quiet", env=env)
    assert (int(ExitStatus.INTEGRITY), 1) == (done.returncode, len(done.stderr.strip().splitlines())), done.stderr
    store = EffectStore(str(effects))
    try:
        assert before == [store.count(run_id="cut", step_id=f"s{i}") for i in range(4)]
    finally:
        store.close()


@pytest.fixture
def every_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment with every batch that brings a run 2 events past its last one."""
    monkeypatch.setattr(checkpoint, "EVERY_EVENTS", 2)


def _stop_at(step_id: str, point: str = "after_confirm"):  # type: ignore[no-untyped-def]
    def hook(where: str, sid: str) -> None:
        if where == point and sid == step_id:
            raise SimulatedCrash(where)

    return hook


def _cut_after(path: Path, run_id: str, step_id: str, phase: str) -> int:
    """Cut the run's events after ``step_id``'s last ``phase`` event (a tail lost, its segments kept); the new head."""
    with journal_tamper.connect(path) as db:
        last = db.execute(
            "SELECT max(seq) FROM ev WHERE run_id = ? AND step_id = ? AND phase = ?", (run_id, step_id, phase)
        ).fetchone()[0]
        db.execute("DROP TRIGGER IF EXISTS events_append_only_delete")
        db.execute("DELETE FROM ev WHERE run_id = ? AND seq > ?", (run_id, last))
    return int(last)


@pytest.mark.usefixtures("every_2")
@pytest.mark.parametrize("outcome", ["applied", "not-applied"])
def test_an_operator_decision_on_an_open_run_cut_under_a_segment_is_refused(tmp_path: Path, outcome: str) -> None:
    """An open run whose tail was cut past a segment (back to s1 ``uncertain``: the operator's
    reconcile of s1, s1's outcome and s2's request and effect gone): ``effectlog reconcile`` must
    refuse as ``run`` does (exit 7, one line, nothing written), as it already does for a sealed
    run. Otherwise the decision is appended over the cut, and once operator events reach the last
    segment's seq the segment no longer looks cut (its event exists, only different): ``run``
    then replays in full and sends the cut step again."""
    path, effects = tmp_path / "j.db", tmp_path / "effects.db"
    plan = plan_of("op", 4, adapter="effects.control")
    with Runtime(path, effects=effects, crash_hook=_stop_at("s1", "after_effect")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with Runtime(path, effects=effects) as rt:
        assert "s1" == rt.run(plan).step_id
    done = cli("reconcile", "--journal", str(path), "--run-id", "op", "--step", "s1", "--outcome", "applied",
               "--evidence", "ledger row 6", "--operator", "ops")  # fmt: skip
    assert 0 == done.returncode, done.stderr
    with Runtime(path, effects=effects, crash_hook=_stop_at("s2", "after_effect")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    head = _cut_after(path, "op", "s1", "step.uncertain")
    with SqliteJournal(path, writer=False) as reader:
        assert reader.stored_checkpoints("op")[-1][1] > head
    done = cli("reconcile", "--journal", str(path), "--run-id", "op", "--step", "s1", "--outcome", outcome,
               "--evidence", "ledger row 7", "--operator", "ops")  # fmt: skip
    assert (int(ExitStatus.INTEGRITY), 1) == (done.returncode, len(done.stderr.strip().splitlines())), done.stderr
    assert "cut from the end" in done.stderr
    with SqliteJournal(path, writer=False) as reader:
        assert head == reader.head("op")[0]


def test_cadence_changes_operator_decisions_and_a_kill_between_segments_keep_each_effect_once(
    tmp_path: Path,
) -> None:
    """One run driven by four processes with EFFECTLOG_CHECKPOINT_EVERY 1, 0, 3 and 2, two approvals
    appended between them by ``effectlog approve`` (one-shot writers: no segment, so the decisions
    are in the tail after the last segment) and a SIGKILL after a step's confirmation: each resume
    from the segments equals the full replay, each effect is applied exactly once, and ``verify``
    (every column of every segment against the replay) passes."""
    journal, effects, plan_file = tmp_path / "j.db", tmp_path / "effects.db", tmp_path / "plan.json"
    steps = tuple(
        StepDecl(id=f"s{i}", adapter="tool", args={"i": i}, approval="required" if i in (2, 4) else None)
        for i in range(6)
    )
    plan = Plan(run_id="mix", adapters={"tool": AdapterDecl(type="effects.control", idempotent=False)}, steps=steps)
    plan_file.write_bytes(msgspec.json.encode(plan))
    run = ["run", str(plan_file), "--journal", str(journal), "--effects", str(effects), "--quiet"]

    def every(n: str) -> dict[str, str]:
        return {**os.environ, "EFFECTLOG_CHECKPOINT_EVERY": n}

    def resumed_equals_replayed() -> None:
        with SqliteJournal(journal, writer=False) as reader:
            state, _, _ = load_for_resume(reader, "mix", plan)
            assert load_run(reader, "mix") == state

    assert int(ExitStatus.SUSPENDED) == cli(*run, env=every("1")).returncode
    assert 0 == cli("approve", "--journal", str(journal), "--run-id", "mix", "--step", "s2", "--by", "ops").returncode
    resumed_equals_replayed()
    assert int(ExitStatus.SUSPENDED) == cli(*run, env=every("0")).returncode
    assert 0 == cli("approve", "--journal", str(journal), "--run-id", "mix", "--step", "s4", "--by", "ops").returncode
    resumed_equals_replayed()
    worker = [sys.executable, "-m", "effectlog", "crash-matrix", "worker", "--plan", str(plan_file)]
    killed = run_process(
        "crash", [*worker, "--journal", str(journal), "--effects", str(effects)], "after_confirm", env=every("3")
    )
    assert ("after_confirm", 9) == (killed.reached, killed.signal)
    resumed_equals_replayed()
    done = cli(*run, env=every("2"))
    assert 0 == done.returncode, done.stderr
    store = EffectStore(str(effects))
    try:
        assert [1] * 6 == [store.count(run_id="mix", step_id=f"s{i}") for i in range(6)]
    finally:
        store.close()
    assert 0 == cli("verify", "--journal", str(journal)).returncode
    with SqliteJournal(journal, writer=False) as reader:
        assert len(reader.stored_checkpoints("mix")) >= 4


@pytest.mark.usefixtures("every_2")
@pytest.mark.parametrize("one_run", [False, True])
def test_verify_refuses_an_open_run_deleted_whole_with_its_segments_left(tmp_path: Path, one_run: bool) -> None:
    """Every event of an open run deleted, its checkpoint segments left (written each in the
    transaction of its event, they are evidence the run existed): ``verify`` must say truncated
    (exit 7, one line naming the run), as it does for a seal left without its run, and as ``run``
    of that plan does. It said "ok" for the journal."""
    path = tmp_path / "j.db"
    with Runtime(path, crash_hook=_stop_at("s2")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan_of("gone", 4))
    with Runtime(path) as rt:
        assert "completed" == rt.run(plan_of("kept", 2)).state
    with journal_tamper.connect(path) as db:
        db.execute("DROP TRIGGER events_append_only_delete")
        db.execute("DELETE FROM ev WHERE run_id = 'gone'")
        assert db.execute("SELECT count(*) FROM checkpoints WHERE run_id = 'gone'").fetchone()[0] > 0
    done = cli("verify", "--journal", str(path), *(["--run-id", "gone"] if one_run else []))
    assert (int(ExitStatus.INTEGRITY), 1) == (done.returncode, len(done.stderr.strip().splitlines())), done.stderr
    assert "'gone'" in done.stderr


@pytest.mark.postgres
@pytest.mark.usefixtures("every_2")
def test_on_postgresql_verify_refuses_an_open_run_deleted_whole_with_its_segments_left(pg_url: str) -> None:
    """The same on PostgreSQL (its own listing of the runs that have segments): an open run's events
    deleted (the append-only trigger dropped first), its segments left: ``verify`` exits 7 naming it."""
    import psycopg

    from effectlog.journal.postgres import PostgresJournal

    with Runtime(PostgresJournal(pg_url), crash_hook=_stop_at("s2")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan_of("gone", 4))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE effectlog.events DISABLE TRIGGER events_append_only")
        conn.execute("DELETE FROM effectlog.events WHERE run_id = 'gone'")
    with PostgresJournal(pg_url, writer=False) as reader:
        assert [("gone", reader.checkpointed_runs()[0][1])] == reader.checkpointed_runs()
    done = cli("verify", "--journal", pg_url)
    assert (int(ExitStatus.INTEGRITY), 1) == (done.returncode, len(done.stderr.strip().splitlines())), done.stderr
    assert "'gone'" in done.stderr


class _BytesTool:
    """A tool whose answer holds bytes (recordable: the journal stores them as base64 text)."""

    blocking = False

    def invoke(self, request: object) -> object:
        from effectlog.adapters.protocol import Receipt

        return Receipt(data={"blob": b"\x00\x01\xfe", "n": 1})


@pytest.mark.usefixtures("every_2")
def test_a_segment_holds_what_the_journal_replays_not_the_live_receipt(tmp_path: Path) -> None:
    """A tool answers with bytes, which the journal records as base64 text (JSON). The actor's live
    state still holds the bytes; a segment built from it stored bytes, so a resume from the segments
    gave a state that is not the journal's (bytes where the replay has text) and ``verify`` called a
    sound journal corrupt (exit 7). The segment must hold what the replay of its events gives."""
    path = tmp_path / "j.db"
    plan = plan_of("b", 4, adapter="bytes")
    tools = {"bytes": lambda decl, ctx: _BytesTool()}
    with Runtime(path, adapters=tools, crash_hook=_stop_at("s2")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with SqliteJournal(path, writer=False) as reader:
        state, segment_seq, _ = load_for_resume(reader, "b", plan)
        assert (True, load_run(reader, "b")) == (segment_seq > 0, state)
        assert load_run(reader, "b") == verify_run(reader, "b")
    with Runtime(path, adapters=tools) as rt:
        assert "completed" == rt.run(plan).state
    assert 0 == cli("verify", "--journal", str(path)).returncode


@pytest.mark.parametrize("error", [RuntimeError("boom"), SimulatedCrash("before_commit")])
def test_an_error_inside_the_writers_gate_gives_the_turn_back(tmp_path: Path, error: BaseException) -> None:
    """A commit that raises inside the writers' gate (an Exception, or a BaseException such as a
    simulated crash) rolls back and leaves the gate: the same journal object's next append and
    another journal object's append on the same file, from another thread, go through at once
    (within a 2 s lock timeout, instead of timing out on a turn never given back)."""
    from effectlog.testing import sample_run

    path = tmp_path / "j.db"
    first, second = sample_run("a", steps=1), sample_run("b", steps=1)
    with SqliteJournal(path, busy_timeout_s=2.0) as one, SqliteJournal(path, busy_timeout_s=2.0) as other:
        claim = one.claim("a")

        def fail(events: object) -> None:
            raise error

        one.before_commit = fail
        with pytest.raises(type(error)):
            one.append(first[:1])
        one.before_commit = None
        outcome: list[object] = []
        worker = threading.Thread(target=lambda: outcome.append(len(other.append(second))))
        worker.start()
        worker.join(timeout=60)  # the other append, at once unless the machine is loaded
        assert [len(second)] == outcome
        assert len(first) == len(one.append(first))
        one.release(claim)
        assert [len(first), len(second)] == [verify_run(one, run_id).seq for run_id in ("a", "b")]


# Holds twenty leases; appends each run's run.started at once (carrying prepare and start: the
# attempt row is locked for update), then step.requested ALONE (no transition carried: on
# PostgreSQL no row lock at all, only the run's advisory lock) from 30 ms before its lease runs out
# to 3 ms after, while another process runs recovery passes.
PLAIN_APPENDER = """
import json, sys
from effectlog.errors import StaleLease
from effectlog.fleet import open_store
from effectlog.fleet.contract import requested, started
from effectlog.fleet.model import Lease
import msgspec
store = open_store(sys.argv[1])
print("ready", flush=True)
leases = [msgspec.convert(x, Lease) for x in json.loads(sys.stdin.readline())]
journals = {}
for lease in leases:
    journal = journals[lease.request_id] = store.leased_journal(lease)
    journal.defer("prepare", "prepare")
    journal.defer("start", "start")
    journal.append([started(lease.run_id)])
print("started", flush=True)
sys.stdin.readline()
out = {}
for i, lease in enumerate(sorted(leases, key=lambda l: l.expires_at)):
    while store.now() < lease.expires_at - 0.03 + 0.003 * (i % 12):
        pass
    try:
        journals[lease.request_id].append([requested(lease.run_id, 2, idempotent=True)])
        out[lease.request_id] = "appended"
    except StaleLease:
        out[lease.request_id] = "refused"
store.close()
print(json.dumps(out), flush=True)
"""

RECOVERER = """
import sys, time
from effectlog.fleet import open_store
from effectlog.fleet.recovery import recover_once
store = open_store(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    recover_once(store)
store.close()
print("{}", flush=True)
"""


def _started(code: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert "ready" == proc.stdout.readline().strip()
    return proc


def _say(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_plain_fenced_append_and_a_recovery_racing_never_both_win(
    tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    """The fenced append that carries no transition (on PostgreSQL it locks no attempt row, relying on
    the run's advisory lock, which recovery takes first) against recovery, in two processes, for 20
    leases: either the step.requested append won (recovery then saw a step requested and sent the
    attempt to an operator), or recovery won (the attempt lost and re-queued, the append refused and
    nothing written). Never both: a re-queue after a committed request would send the step again."""
    from effectlog.fleet import open_store
    from effectlog.fleet.contract import noop_plan

    url = str(tmp_path / "fleet.db") if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    store = open_store(url)
    try:
        appender, recoverer = _started(PLAIN_APPENDER, url), _started(RECOVERER, url, "4.0")
        leases = []
        for i in range(20):
            submitted = store.submit("race", f"k{i}", noop_plan(f"run-{i}"), requeue_backoff_s=0.0).request
            lease = store.claim(submitted.request_id, "appender", 1.0 + 0.05 * i)
            assert lease is not None
            leases.append(lease)
        _say(appender, json.dumps([{f: getattr(x, f) for f in x.__struct_fields__} for x in leases]))
        assert appender.stdout is not None
        assert "started" == appender.stdout.readline().strip()
        _say(recoverer, "go")
        _say(appender, "go")
        lines = appender.communicate(timeout=120)[0].strip().splitlines()
        outcome = {int(k): v for k, v in json.loads(lines[-1]).items()}
        recoverer.communicate(timeout=120)
        assert (0, 0, 20) == (appender.returncode, recoverer.returncode, len(outcome))
        for lease in leases:
            first = next(a for a in store.attempts(lease.request_id) if a.attempt_no == 1)
            moved = [h.transition for h in store.history(lease.request_id) if h.attempt_id == first.attempt_id]
            head = store.journal().head(lease.run_id)[0]
            if outcome[lease.request_id] == "appended":
                assert (2, ["lease", "prepare", "start", "expire"], "needs_operator") == (head, moved, first.state)
            else:
                assert (1, ["lease", "prepare", "start", "lose"], "lost") == (head, moved, first.state)
    finally:
        store.close()


@pytest.mark.usefixtures("every_2")
def test_a_fork_stopped_midway_resumes_from_its_own_segments_into_the_replay_state(tmp_path: Path) -> None:
    """A fork carries a closed run's first steps in one batch (``step.carried``, with a segment) and
    runs the rest; stopped midway and resumed under its pinned plan, the fork's segments plus the tail
    give the state a full replay gives, it finishes, and the journal verifies (parent, fork, segments)."""
    path = tmp_path / "j.db"
    plan = plan_of("p", 6)
    with Runtime(path) as rt:
        assert "completed" == rt.run(plan).state
    with Runtime(path, crash_hook=_stop_at("s4")) as rt, pytest.raises(SimulatedCrash):
        rt.fork("p", "p2", by="ops", reason="again from s2", from_step="s2")
    with SqliteJournal(path, writer=False) as reader:
        child = load_run(reader, "p2")
        child_plan = Plan(run_id="p2", adapters=plan.adapters, steps=plan.steps)
        state, segment_seq, _ = load_for_resume(reader, "p2", child_plan)
        segments = [seq for _, seq, _, _, _ in reader.stored_checkpoints("p2")]
    assert (True, child) == (segment_seq > 0, state)
    assert segments[0] <= 3  # the segment of run.started (seq 1) and the carried batch (s0 and s1)
    done = cli("recover", "--journal", str(path))
    assert 0 == done.returncode, done.stderr
    with SqliteJournal(path, writer=False) as reader:
        assert ("completed", "completed") == (verify_run(reader, "p").state, verify_run(reader, "p2").state)


@pytest.mark.usefixtures("every_2")
def test_with_a_key_a_forged_segment_relinked_without_it_is_ignored_by_resume_and_named_by_verify(
    tmp_path: Path,
) -> None:
    """A keyed journal (HMAC chain). Someone without the key rewrites the last segment so that the
    last confirmed step looks never started (a resume from it would send that step again) and
    re-links it the only way they can, with plain SHA-256: the resume does not use it (its state is
    the full replay's, the step stays confirmed) and ``verify`` names ``checkpoints.hash`` (exit 7)."""
    import hashlib
    import zlib

    from effectlog.chain import Chain
    from effectlog.errors import ChainBroken

    path, key = tmp_path / "j.db", b"the-operators-key"
    plan = plan_of("k", 6)
    keyed = SqliteJournal(path, chain=Chain(key))
    with Runtime(keyed, crash_hook=_stop_at("s3")) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with journal_tamper.connect(path) as db:
        seq, prev, body = db.execute(
            "SELECT seq, prev, body FROM checkpoints WHERE run_id = 'k' ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        event_hash = db.execute("SELECT hash FROM ev WHERE run_id = 'k' AND seq = ?", (seq,)).fetchone()[0]
        segment = msgspec.msgpack.decode(zlib.decompress(body))  # segments are zlib over msgpack
        segment["steps"] = [s for s in segment["steps"] if s["step_id"] != "s3"]
        forged = zlib.compress(msgspec.msgpack.encode(segment))
        relinked = hashlib.sha256(bytes(event_hash) + bytes(prev) + forged).digest()
        db.execute("DROP TRIGGER checkpoints_append_only_update")
        db.execute("UPDATE checkpoints SET body = ?, hash = ? WHERE run_id = 'k' AND seq = ?", (forged, relinked, seq))
    with SqliteJournal(path, writer=False, chain=Chain(key)) as reader:
        state, segment_seq, _ = load_for_resume(reader, "k", plan)
        full = load_run(reader, "k")
        assert (0, full, "confirmed") == (segment_seq, state, state.steps["s3"].state)
        with pytest.raises(ChainBroken) as broken:
            verify_run(reader, "k")
    assert "checkpoints.hash" == broken.value.fields["column"]
