"""Faults of the machine, with real processes: a full disk, a read-only journal, SIGINT and
SIGTERM (once, and twice), and readers running while a writer writes.

Synchronisation is by files and by the kernel's view of a process (its caught-signal
mask), never by sleeping for a while; the deadlines below only stop a hung child from
hanging the suite. No assertion is about time.
"""

from __future__ import annotations

import json
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from effectlog import events as ev
from effectlog.adapters import EffectStore
from effectlog.fold import replay_records
from effectlog.journal import SqliteJournal
from hardening_kit import (
    GOOD_PLAN,
    SAFETY_TIMEOUT_S,
    build_journal,
    cli_env,
    effectlog,
    last_line,
    make_read_only,
    make_writable,
    one_line,
    plan_dict,
    respect_file_modes,
    snapshot,
)

pytestmark = pytest.mark.crash

GATED_TOOLS = '''
import os, time
from pathlib import Path

GATES = Path(os.environ["EL_GATES"])


class Gated:
    """A tool without an idempotency contract that waits, inside the call, for its gate to open.

    It says where it is by creating ``in-STEP-ATTEMPT``; it applies its effect (a row in the
    effect store) only once ``go-STEP`` exists.
    """

    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        (GATES / f"in-{request.step_id}-{request.attempt}").touch()
        deadline = time.monotonic() + 300
        while not (GATES / f"go-{request.step_id}").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the gate never opened")
            time.sleep(0.005)
        return self.store.apply_control(request)

    def lookup(self, request):
        return self.store.lookup(request)


ADAPTERS = {"test.gated": lambda decl, ctx: Gated(ctx.effect_store())}
'''


class Workdir:
    """A directory with a journal, an effect store, the gated tool and a plan, driven by the CLI."""

    def __init__(self, root: Path, steps: list[dict[str, Any]], adapters: dict[str, Any], run_id: str = "r") -> None:
        self.root = root
        self.run_id = run_id
        self.gates = root / "gates"
        self.gates.mkdir()
        (root / "gated_tools.py").write_text(GATED_TOOLS)
        (root / "plan.json").write_text(json.dumps(plan_dict(run_id, steps, adapters)))
        self.env = cli_env({"PYTHONPATH": str(root), "EL_GATES": str(self.gates)})

    @property
    def run_argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "effectlog",
            "run",
            "plan.json",
            "--journal",
            "journal.db",
            "--effects",
            "effects.db",
            "--adapters",
            "gated_tools:ADAPTERS",
        ]

    def start(self, preexec: Callable[[], None] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.run_argv,
            cwd=self.root,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=preexec,
        )

    def run(self, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.run_argv, *extra],
            cwd=self.root,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=SAFETY_TIMEOUT_S,
            check=False,
        )

    def open_gate(self, step_id: str) -> None:
        (self.gates / f"go-{step_id}").touch()

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return effectlog(*argv, cwd=self.root, env=self.env)

    def status(self) -> dict[str, Any]:
        done = self.cli("status", "--journal", "journal.db", "--run-id", self.run_id, "--json")
        assert (0, "") == (done.returncode, done.stderr)
        result: dict[str, Any] = json.loads(done.stdout)
        return result

    def steps(self) -> list[tuple[str, str, int]]:
        return [(s["id"], s["state"], s["attempt"]) for s in self.status()["steps"]]

    def effects(self) -> Counter[str]:
        store = EffectStore(self.root / "effects.db")
        try:
            return Counter(row.step_id for row in store.rows(run_id=self.run_id))
        finally:
            store.close()

    def tags(self) -> list[tuple[str, str]]:
        with SqliteJournal(self.root / "journal.db", writer=False) as journal:
            decoded = [ev.decode(r.body) for r in journal.read(self.run_id)]
        return [(ev.tag_of(e), getattr(e, "step_id", "")) for e in decoded]

    def verify(self) -> tuple[int, str]:
        done = self.cli("verify", "--journal", "journal.db")
        return done.returncode, done.stdout


def wait_until(what: str, ready: Callable[[], bool], proc: subprocess.Popen[str] | None = None) -> None:
    """Poll ``ready``; fail (never hang) if the child exits first or the safety deadline passes."""
    deadline = time.monotonic() + SAFETY_TIMEOUT_S
    while not ready():
        if proc is not None and proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"the child exited ({proc.returncode}) before {what}: {err}")
        if time.monotonic() > deadline:
            raise AssertionError(f"safety deadline passed waiting for {what}")
        time.sleep(0.005)


def catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler installed for ``signum`` (the kernel's SigCgt mask)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    raise AssertionError("no SigCgt line in /proc/PID/status")


GATED = {"gate": {"type": "test.gated", "idempotent": False}}
THREE_GATED_STEPS = [{"id": s, "adapter": "gate", "args": {"n": i}} for i, s in enumerate(("a", "b", "c"))]


# -- SIGINT and SIGTERM -------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_the_run_after_the_current_steps_commit_with_its_exit_status(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """The signal arrives while step b's tool is running. The tool finishes, b's result is
    committed, and the run stops before c: exit 130 (SIGINT) or 143 (SIGTERM), the last line on
    stderr (after the progress lines) saying so. a and b are confirmed with one effect each, c was never requested. The
    same command then resumes and completes: c applied once, a and b not again."""
    work = Workdir(tmp_path, THREE_GATED_STEPS, GATED)
    work.open_gate("a")
    proc = work.start()
    wait_until("b's tool is called", (work.gates / "in-b-1").exists, proc)
    proc.send_signal(signum)
    wait_until("the handler has run", lambda: not catches(proc.pid, signum), proc)
    work.open_gate("b")
    work.open_gate("c")  # were the run to go on regardless, c would now apply its effect
    _, err = proc.communicate(timeout=SAFETY_TIMEOUT_S)

    stopped = (proc.returncode, last_line(err))
    after_stop = (work.steps(), work.effects(), work.verify()[0])
    resumed = work.run()

    assert 128 + signum == stopped[0]
    assert f"run r interrupted by {signum.name} after its last durable commit" in stopped[1]
    assert ([("a", "confirmed", 1), ("b", "confirmed", 1)], Counter(a=1, b=1), 0) == after_stop
    assert (0, "completed") == (resumed.returncode, work.status()["state"])
    assert Counter(a=1, b=1, c=1) == work.effects()


def test_a_second_signal_ends_the_process_at_once_and_the_journal_still_holds_together(tmp_path: Path) -> None:
    """The first SIGTERM asks for a stop; b's tool hangs, so a second SIGTERM ends the process
    by the signal's default action. The journal verifies, with b requested and no effect. As
    the contract says for a tool that is not idempotent, the resume stops on b as uncertain
    (exit 3); the ledger shows no effect, so reconciliation says not applied, and the next
    resume completes: every step applied exactly once."""
    work = Workdir(tmp_path, THREE_GATED_STEPS, GATED)
    work.open_gate("a")
    proc = work.start()
    wait_until("b's tool is called", (work.gates / "in-b-1").exists, proc)
    proc.send_signal(signal.SIGTERM)
    wait_until("the handler has run", lambda: not catches(proc.pid, signal.SIGTERM), proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=SAFETY_TIMEOUT_S)

    killed = (proc.returncode, work.verify()[0], work.steps(), work.effects())
    uncertain = work.run()
    uncertain_state = (uncertain.returncode, work.status()["state"], work.steps()[1])
    work.open_gate("b")
    work.open_gate("c")
    reconciled = work.cli(
        "reconcile", "--journal", "journal.db", "--run-id", "r", "--step", "b", "--from-ledger", "effects.db"
    )
    done = work.run()

    assert (-signal.SIGTERM, 0, [("a", "confirmed", 1), ("b", "requested", 1)], Counter(a=1)) == killed
    assert (3, "stopped", ("b", "uncertain", 1)) == uncertain_state
    assert 0 == reconciled.returncode, reconciled.stderr
    assert (0, Counter(a=1, b=1, c=1), 0) == (done.returncode, work.effects(), work.verify()[0])


def test_signal_storms_during_commits_never_break_the_journal(tmp_path: Path) -> None:
    """Eight times, a run of 1500 idempotent steps is resumed and, once it has made progress,
    gets one signal (SIGINT or SIGTERM) and, the moment its handler has run, the other one:
    the process either reaches the step boundary and exits 130/143 first, or dies by the
    second signal wherever it is (finishing a commit, closing the journal). After every round
    the journal verifies; at the end a resume completes with every step confirmed exactly
    once, on its first attempt."""
    steps = [{"id": f"s{i}", "adapter": "n", "args": {"i": i}} for i in range(1500)]
    work = Workdir(tmp_path, steps, {"n": {"type": "noop", "idempotent": True}})
    endings: list[int] = []
    verified: list[int] = []
    for round_no in range(8):
        first, second = (signal.SIGINT, signal.SIGTERM) if round_no % 2 else (signal.SIGTERM, signal.SIGINT)
        start_seq = _seq(work)
        proc = work.start()
        wait_until("the run makes progress", lambda start=start_seq: _seq(work) > start + 20, proc)
        proc.send_signal(first)
        wait_until("the handler has run", lambda p=proc, f=first: p.poll() is not None or not catches(p.pid, f))
        if proc.poll() is None:
            proc.send_signal(second)
        proc.communicate(timeout=SAFETY_TIMEOUT_S)
        endings.append(proc.returncode)
        verified.append(work.verify()[0])
    done = work.run()
    confirmed = Counter(step for tag, step in work.tags() if tag == "step.confirmed")

    assert set(endings) <= {130, 143, -signal.SIGINT, -signal.SIGTERM}, endings
    assert [0] * 8 == verified
    assert (0, "completed") == (done.returncode, work.status()["state"])
    assert {f"s{i}": 1 for i in range(1500)} == dict(confirmed)
    assert {1} == {attempt for _, _, attempt in work.steps()}


def _seq(work: Workdir) -> int:
    if not (work.root / "journal.db").exists():
        return 0
    try:
        with SqliteJournal(work.root / "journal.db", writer=False) as journal:
            return journal.head(work.run_id)[0]
    except Exception:  # the writer is creating the file: not a journal yet
        return 0


# -- a full disk and a read-only journal -------------------------------------------------------------


def _file_size_limit(limit: int) -> Callable[[], None]:
    def preexec() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so a write past the limit fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return preexec


@pytest.mark.parametrize("limit_kib", [64, 200, 480, 900])
def test_a_full_disk_is_one_line_no_partial_state_and_the_next_run_resumes(tmp_path: Path, limit_kib: int) -> None:
    """The writer runs with RLIMIT_FSIZE (no file may grow past the limit: a disk that fills up
    at a different point for each limit). It exits 2 with one error line, the last on stderr
    after the progress lines, naming the journal and the failed write. The journal verifies and
    holds a prefix of the run: steps confirmed in plan order and at most one in flight. Without the
    limit the same command resumes and completes, every step confirmed exactly once and at most
    the one in-flight step sent again."""
    steps = [{"id": f"s{i:02d}", "adapter": "n", "args": {"i": i, "pad": "p" * 900}} for i in range(60)]
    work = Workdir(tmp_path, steps, {"n": {"type": "noop", "idempotent": True}})
    proc = work.start(preexec=_file_size_limit(limit_kib * 1024))
    _, err = proc.communicate(timeout=SAFETY_TIMEOUT_S)

    failed = (proc.returncode, last_line(err))
    prefix = work.steps() if (tmp_path / "journal.db").exists() and _seq(work) else []
    prefix_ok = work.verify()[0] if prefix else 0
    done = work.run()
    tags = work.tags()

    assert 2 == failed[0]
    assert "journal.db: " in failed[1]
    assert "could not be written" in failed[1] or "disk full" in failed[1]
    assert 0 == prefix_ok
    assert [s["id"] for s in steps][: len(prefix)] == [step_id for step_id, _, _ in prefix]
    assert all(state == "confirmed" for _, state, _ in prefix[:-1])
    assert (0, "completed") == (done.returncode, work.status()["state"])
    assert {s["id"]: 1 for s in steps} == dict(Counter(step for tag, step in tags if tag == "step.confirmed"))
    assert sum(1 for tag, _ in tags if tag == "step.resent") <= 1


def test_a_read_only_journal_is_one_line_changes_nothing_and_the_run_resumes_once_writable(tmp_path: Path) -> None:
    """An interrupted run's journal made read-only (mode 0444; for root, without the override
    capability): resuming exits 2 with one line saying the journal is read-only and leaves the
    journal byte-identical. Once writable again, the same command completes the run: charge
    (confirmed before) is not run again, email runs once."""
    build_journal("interrupted", tmp_path / "journal.db")
    shutil.copyfile(GOOD_PLAN, tmp_path / "good.json")
    make_read_only(tmp_path / "journal.db")
    before = snapshot(tmp_path)
    try:
        refused = effectlog("run", "good.json", "--journal", "journal.db", cwd=tmp_path, preexec=respect_file_modes)
    finally:
        make_writable(tmp_path)
    after = snapshot(tmp_path)
    (tmp_path / "journal.db").chmod(0o600)
    done = effectlog("run", "good.json", "--journal", "journal.db", cwd=tmp_path)
    with SqliteJournal(tmp_path / "journal.db", writer=False) as journal:
        decoded = [ev.decode(r.body) for r in journal.read("good-run")]
    tags = [(ev.tag_of(e), getattr(e, "step_id", "")) for e in decoded]

    assert (2, True) == (refused.returncode, "journal.db: journal is read-only" in one_line(refused.stderr))
    assert before["journal.db"] == after["journal.db"]
    assert 0 == done.returncode, done.stderr
    assert [("step.requested", "charge"), ("step.requested", "email")] == [t for t in tags if t[0] == "step.requested"]


# -- readers during a write -------------------------------------------------------------------


def test_readers_during_a_write_always_see_a_consistent_prefix(tmp_path: Path) -> None:
    """While a writer process runs a plan (a gated first step, then 500 steps), three reader
    processes loop on ``status --json``, ``timeline --json`` and ``verify --json``. The writer
    is held in its first step until each reader has read once, so reads overlap the write.
    Every read succeeds and shows a prefix of the final history: the timeline's events are the
    first n events of the final timeline, verify's head is the chain head after n events, and
    status equals the state replayed from those n events."""
    steps = [{"id": "gate", "adapter": "gate"}, *({"id": f"s{i}", "adapter": "n"} for i in range(500))]
    work = Workdir(tmp_path, steps, {**GATED, "n": {"type": "noop", "idempotent": True}})
    writer = work.start()
    wait_until("the writer is inside its first step", (work.gates / "in-gate-1").exists, writer)
    commands = {
        "status": ("status", "--journal", "journal.db", "--run-id", "r", "--json"),
        "timeline": ("timeline", "--journal", "journal.db", "--run-id", "r", "--json"),
        "verify": ("verify", "--journal", "journal.db", "--run-id", "r", "--json"),
    }
    reads: dict[str, list[subprocess.CompletedProcess[str]]] = {name: [] for name in commands}

    def reader(name: str) -> None:
        while True:
            writing = writer.poll() is None
            reads[name].append(work.cli(*commands[name]))
            if not writing:
                return

    threads = [threading.Thread(target=reader, args=(name,)) for name in commands]
    for thread in threads:
        thread.start()
    wait_until("every reader has read once", lambda: all(reads[n] for n in commands), writer)
    work.open_gate("gate")
    writer.communicate(timeout=SAFETY_TIMEOUT_S)
    for thread in threads:
        thread.join(timeout=SAFETY_TIMEOUT_S)

    with SqliteJournal(tmp_path / "journal.db", writer=False) as journal:
        records = list(journal.read("r"))
    final = [json.loads(json.dumps(ev.decode(r.body), default=_builtins)) for r in records]
    problems: list[str] = []
    for done in (d for name in commands for d in reads[name]):
        if (done.returncode, done.stderr) != (0, ""):
            problems.append(f"{done.args[3:5]} exited {done.returncode}: {done.stderr}")
    for done in reads["timeline"]:
        events = json.loads(done.stdout)
        if events != final[: len(events)]:
            problems.append(f"timeline of {len(events)} events is not a prefix")
    for done in reads["verify"]:
        run = json.loads(done.stdout)["runs"][0]
        if run["head"] != records[run["events"] - 1].hash.hex():
            problems.append(f"verify head after {run['events']} events is not the chain head there")
    for done in reads["status"]:
        status = json.loads(done.stdout)
        state = replay_records(records[: status["events"]], journal.chain, run_id="r")
        expected = [{"id": s.step_id, "state": s.state, "attempt": s.attempt} for s in state.ordered_steps()]
        if (status["state"], status["steps"]) != (state.state, expected):
            problems.append(f"status after {status['events']} events differs from the replayed prefix")

    first_read = len(json.loads(reads["timeline"][0].stdout))

    assert 0 == writer.returncode
    assert [] == problems
    assert first_read < len(final)  # the reads overlapped the write


def _builtins(value: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(value)
