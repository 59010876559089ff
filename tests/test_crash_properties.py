"""Crash safety as properties.

First, a hypothesis state machine: random plans over a fault-injecting tool (slow, raising
before or after its effect, definitely-not-applied, hanging past its timeout and then
applying its effect late or never), crashes simulated at any boundary through
``Runtime(crash_hook=...)``, and resumes, approvals and ledger reconciliations in random
order. After every step of the machine it checks, against the journal and the tool's own
ledger (a separate SQLite file the runtime never writes):

* the journal verifies (chain, sequence, transitions) for every run;
* idempotent effects happen exactly once: never two rows for a step, and exactly one for
  every confirmed step, whose receipt names that row;
* effects without an idempotency contract happen at most once;
* unknown outcomes always surface as uncertain: a non-idempotent call that raised or hung
  leaves its attempt requested (only until the next resume), uncertain or reconciled,
  never "not applied"; and "not applied" is recorded only where the ledger has no effect.

Then torn writes with real processes: a worker is SIGKILLed mid-run, the -wal is cut at
random offsets past the last acknowledged commit, and the journal opens, verifies and keeps
every acknowledged step.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from effectlog import events as ev
from effectlog.adapters import EffectStore, Receipt, Request, idempotency_key
from effectlog.errors import ExitStatus, NotApplied
from effectlog.journal import SqliteJournal, load_run
from effectlog.plan import Plan, parse_plan
from effectlog.runtime import RunOutcome, Runtime, SimulatedCrash
from hardening_kit import SAFETY_TIMEOUT_S, cli_env, effectlog, plan_dict

# "ok" is listed thrice so that most calls succeed and runs get somewhere.
FAULTS = ("ok", "ok", "ok", "slow", "raise_before", "raise_after", "not_applied", "hang_then_apply", "hang_no_effect")
UNKNOWN_TO_THE_RUNTIME = frozenset({"raise_before", "raise_after", "hang_then_apply", "hang_no_effect"})
TIMEOUT_S = 0.05  # a hung call is abandoned after this; nothing asserts on time
BOUNDARIES = (
    "after_request",
    "after_effect",
    "after_confirm",
    "after_resend",
    "after_approval",
    "after_reconcile",
    "before_commit:run.started",
    "before_commit:run.resumed",
    "before_commit:step.requested",
    "before_commit:step.effected",
    "before_commit:step.resent",
    "before_commit:step.uncertain",
    "before_commit:step.failed",
    "before_commit:step.denied",
    "before_commit:run.completed",
)


class FaultScript:
    """The faults the next tool calls will meet, in order (then "ok"), and what each call did."""

    def __init__(self) -> None:
        self.queue: list[str] = []
        self.log: list[tuple[str, str, int, str]] = []  # (run, step, attempt, fault)
        self.release = threading.Event()
        self.hung: list[threading.Thread] = []

    def next(self) -> str:
        return self.queue.pop(0) if self.queue else "ok"

    def settle(self) -> None:
        """Let every hung call finish (applying its late effect, or not) before anything else happens."""
        self.release.set()
        for thread in self.hung:
            thread.join(SAFETY_TIMEOUT_S)
            assert not thread.is_alive(), "a hung tool call did not finish"
        self.hung.clear()
        self.release = threading.Event()


class FaultyTool:
    """A tool with its own ledger connection: it outlives every runtime, like a remote service.

    Truthful about what it knows: it says "not applied" only when its key has no effect.
    """

    def __init__(self, ledger: EffectStore, idempotent: bool, script: FaultScript) -> None:
        self.ledger = ledger
        self.idempotent = idempotent
        self.script = script

    def _apply(self, request: Request) -> Receipt:
        if self.idempotent:
            return self.ledger.apply_idempotent(request)
        return self.ledger.apply_control(request)

    def invoke(self, request: Request) -> Receipt:
        fault = self.script.next()
        self.script.log.append((request.run_id, request.step_id, request.attempt, fault))
        if fault == "raise_before":
            raise ConnectionError("connection refused before the effect")
        if fault == "not_applied" and not self.ledger.rows(
            run_id=request.run_id, step_id=request.step_id, attempt=request.attempt
        ):
            raise NotApplied("rejected by the tool before applying anything")
        if fault.startswith("hang"):
            self.script.hung.append(threading.current_thread())
            self.script.release.wait(SAFETY_TIMEOUT_S)
            if fault == "hang_no_effect":
                raise ConnectionError("gave up")
        if fault == "slow":
            threading.Event().wait(0.001)
        receipt = self._apply(request)
        if fault == "raise_after":
            raise ConnectionError("connection reset after the effect")
        return receipt

    def lookup(self, request: Request) -> Any:
        return self.ledger.lookup(request)


class Crasher:
    """A crash hook: raises SimulatedCrash at the ``nth`` boundary whose name starts with ``point``."""

    def __init__(self, point: str, nth: int) -> None:
        self.point, self.nth, self.seen = point, nth, 0
        self.fired: str | None = None

    def __call__(self, where: str, step_id: str) -> None:
        if self.nth and where.startswith(self.point):
            self.seen += 1
            if self.seen == self.nth:
                self.fired = where
                raise SimulatedCrash(f"{where} {step_id}")


async def _no_sleep(_: float) -> None:
    return None


STEP_SPECS = st.lists(
    # (idempotent, approval required, retry policy)
    st.tuples(st.booleans(), st.sampled_from([False, False, False, True]), st.booleans()),
    min_size=1,
    max_size=4,
)
FAULT_LISTS = st.lists(st.sampled_from(FAULTS), max_size=5)
CRASHES = st.tuples(st.sampled_from(("", *BOUNDARIES)), st.integers(min_value=0, max_value=4))


class CrashSafety(RuleBasedStateMachine):
    """Runs, resumes, crashes, approvals and reconciliations over one journal and one ledger."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="effectlog-crash-properties-"))
        self.journal = self.dir / "journal.db"
        self.ledger = EffectStore(self.dir / "ledger.db")
        self.script = FaultScript()
        self.plans: dict[str, Plan] = {}
        self.idempotent: dict[tuple[str, str], bool] = {}
        self.crashed: dict[str, bool] = {}  # did the last runtime that drove this run crash?
        self.outcomes: dict[str, RunOutcome] = {}
        self.adapters = {
            "test.faulty": lambda decl, ctx: FaultyTool(self.ledger, decl.idempotent, self.script),
        }

    def teardown(self) -> None:
        self.script.settle()
        self.ledger.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- driving ---------------------------------------------------------------------------

    def _drive(self, run_id: str, faults: list[str], crash: tuple[str, int]) -> None:
        self.script.queue = list(faults)
        hook = Crasher(*crash)
        runtime = Runtime(self.journal, adapters=self.adapters, crash_hook=hook, sleep=_no_sleep)
        try:
            self.outcomes[run_id] = runtime.run(self.plans[run_id])
            self.crashed[run_id] = False
        except SimulatedCrash:
            self.crashed[run_id] = True
            self.outcomes.pop(run_id, None)
        finally:
            runtime.close()
            self.script.settle()

    def _state(self, run_id: str) -> Any:
        with SqliteJournal(self.journal, writer=False) as journal:
            return load_run(journal, run_id)

    def _open_runs(self) -> list[str]:
        return [r for r in self.plans if not self.journal.exists() or not self._closed(r)]

    def _closed(self, run_id: str) -> bool:
        with SqliteJournal(self.journal, writer=False) as journal:
            return run_id in journal.runs() and load_run(journal, run_id).closed

    @initialize()
    def first_journal(self) -> None:
        """Nothing exists yet; the first rule that runs creates the journal."""

    @precondition(lambda self: len(self.plans) < 3)
    @rule(steps=STEP_SPECS, faults=FAULT_LISTS, crash=CRASHES)
    def start_a_run(self, steps: list[tuple[bool, bool, bool]], faults: list[str], crash: tuple[str, int]) -> None:
        run_id = f"run-{len(self.plans)}"
        decls = []
        for i, (idempotent, approval, retry) in enumerate(steps):
            decl: dict[str, Any] = {
                "id": f"s{i}",
                "adapter": "idem" if idempotent else "ctrl",
                "args": {"i": i},
                "timeout_s": TIMEOUT_S,
            }
            if approval:
                decl["approval"] = "required"
            if retry and idempotent:
                decl["retry"] = {"attempts": 2, "backoff_base_s": 0, "backoff_cap_s": 0, "jitter": 0}
            decls.append(decl)
            self.idempotent[(run_id, f"s{i}")] = idempotent
        adapters = {
            "idem": {"type": "test.faulty", "idempotent": True},
            "ctrl": {"type": "test.faulty", "idempotent": False},
        }
        self.plans[run_id] = parse_plan(msgspec.json.encode(plan_dict(run_id, decls, adapters)))
        self._drive(run_id, faults, crash)

    @precondition(lambda self: bool(self.plans))
    @rule(data=st.data(), faults=FAULT_LISTS, crash=CRASHES)
    def resume(self, data: st.DataObject, faults: list[str], crash: tuple[str, int]) -> None:
        run_id = data.draw(st.sampled_from(sorted(self.plans)))
        self._drive(run_id, faults, crash)

    @precondition(lambda self: bool(self.plans))
    @rule(data=st.data())
    def reconcile_from_the_ledger(self, data: st.DataObject) -> None:
        """An operator resolves an uncertain step (if there is one) with the evidence of the step's
        own adapter: its ``lookup`` over the tool's ledger (the tool keeps its own, so it is not a
        store the run pinned: ``--from-ledger`` would refuse it)."""
        run_id = data.draw(st.sampled_from(sorted(self.plans)))
        if not self.journal.exists():
            return
        state = self._state(run_id)
        uncertain = [s.step_id for s in state.ordered_steps() if s.state == "uncertain"]
        if not uncertain:
            return
        with Runtime(self.journal, adapters=self.adapters) as runtime:
            runtime.reconcile_by_lookup(run_id, uncertain[0])
        self.outcomes.pop(run_id, None)  # the last runtime's outcome no longer describes the run

    @precondition(lambda self: bool(self.plans))
    @rule(data=st.data())
    def approve_a_held_step(self, data: st.DataObject) -> None:
        run_id = data.draw(st.sampled_from(sorted(self.plans)))
        if not self.journal.exists():
            return
        held = [s.step_id for s in self._state(run_id).ordered_steps() if s.state == "awaiting_approval"]
        if held:
            with Runtime(self.journal, adapters=self.adapters) as runtime:
                runtime.approve(run_id, held[0], by="ana")
            self.outcomes.pop(run_id, None)

    # -- invariants ------------------------------------------------------------------------

    def _history(self) -> dict[str, tuple[Any, list[ev.Event]]]:
        if not self.journal.exists():
            return {}
        with SqliteJournal(self.journal, writer=False) as journal:
            return {r: (load_run(journal, r), [ev.decode(x.body) for x in journal.read(r)]) for r in journal.runs()}

    @invariant()
    def the_journal_verifies_and_effects_match_it(self) -> None:
        """Chain and fold hold for every run; ledger and journal agree as the module docstring says."""
        history = self._history()  # load_run raises on a broken chain, a gap or an illegal transition
        for run_id, (state, events) in history.items():
            rows = self.ledger.rows(run_id=run_id)
            per_step: dict[str, list[Any]] = {}
            for row in rows:
                per_step.setdefault(row.step_id, []).append(row)
            for step_id, found in per_step.items():
                assert len(found) <= 1, f"{run_id}/{step_id}: {len(found)} effects"
            for step in state.ordered_steps():
                found = per_step.get(step.step_id, [])
                if step.state == "confirmed":
                    assert 1 == len(found), f"{run_id}/{step.step_id} confirmed with {len(found)} effects"
                    assert idempotency_key(run_id, step.step_id, step.attempt) == found[0].idempotency_key
                    assert found[0].effect_id == step.receipt["effect_id"]
                if step.state == "reconciled":
                    assert (1 if step.outcome == "applied" else 0) == len(found)
            for event in events:
                if isinstance(event, ev.StepFailed) and event.applied is False:
                    assert [] == [r for r in per_step.get(event.step_id, []) if r.attempt == event.attempt]
                if isinstance(event, ev.StepReconciled) and event.outcome == "not_applied":
                    assert [] == [r for r in per_step.get(event.step_id, []) if r.attempt == event.attempt]
            if state.state == "completed":
                assert {s.step_id: 1 for s in state.ordered_steps()} == {k: len(v) for k, v in per_step.items()}

    @invariant()
    def unknown_outcomes_surface_as_uncertain(self) -> None:
        """A run a runtime returned from has no step in flight, and a stopped run names an uncertain
        step (exit 3); a non-idempotent call that raised or hung is never recorded as not applied."""
        history = self._history()
        for run_id, outcome in self.outcomes.items():
            state, _ = history[run_id]
            in_flight = [s.step_id for s in state.ordered_steps() if s.state in ("requested", "effected")]
            assert [] == in_flight, f"{run_id}: returned with {in_flight} in flight"
            if state.state == "stopped":
                assert int(ExitStatus.STOPPED_UNCERTAIN) == outcome.exit_status
                blocked = state.step(state.blocked_step or "")
                assert blocked is not None
                assert "uncertain" == blocked.state
        for run_id, step_id, attempt, fault in self.script.log:
            if fault not in UNKNOWN_TO_THE_RUNTIME or self.idempotent[(run_id, step_id)]:
                continue
            state, events = history[run_id]
            step = state.step(step_id)
            assert step is not None
            failed_not_applied = [
                e
                for e in events
                if isinstance(e, ev.StepFailed) and e.step_id == step_id and e.attempt == attempt and e.applied is False
            ]
            assert [] == failed_not_applied, f"{run_id}/{step_id} attempt {attempt}: {fault} recorded as not applied"
            if step.attempt == attempt:
                allowed = {"uncertain", "reconciled"} | ({"requested"} if self.crashed.get(run_id) else set())
                assert step.state in allowed, f"{run_id}/{step_id}: {fault} left the step {step.state}"


CrashSafety.TestCase.settings = settings(stateful_step_count=12, deadline=None)
TestCrashSafety = CrashSafety.TestCase
TestCrashSafety.__doc__ = "The state machine above: its invariants hold after every rule, for every example."


def test_every_boundary_the_machine_crashes_at_is_one_the_runtime_reaches() -> None:
    """BOUNDARIES is exactly the set of crash points a scripted tour reaches (approval, a raise
    and a resend, an uncertain step, a reconciliation, a not-applied failure, a completion):
    the machine draws no crash point the runtime never calls, and misses none it calls there."""
    reached: set[str] = set()
    with tempfile.TemporaryDirectory() as where:
        root = Path(where)
        ledger = EffectStore(root / "ledger.db")
        script = FaultScript()
        adapters = {"test.faulty": lambda decl, ctx: FaultyTool(ledger, decl.idempotent, script)}
        steps = [
            {"id": "held", "adapter": "idem", "approval": "required"},
            {
                "id": "retried",
                "adapter": "idem",
                "retry": {"attempts": 2, "backoff_base_s": 0, "backoff_cap_s": 0, "jitter": 0},
            },
            {"id": "lost", "adapter": "ctrl"},
            {"id": "refused", "adapter": "ctrl"},
        ]
        adapters_decl = {
            "idem": {"type": "test.faulty", "idempotent": True},
            "ctrl": {"type": "test.faulty", "idempotent": False},
        }
        plan = parse_plan(msgspec.json.encode(plan_dict("tour", steps, adapters_decl)))

        def record(where: str, step_id: str) -> None:
            reached.add(where)

        done = parse_plan(msgspec.json.encode(plan_dict("tour-2", [{"id": "one", "adapter": "idem"}], adapters_decl)))

        def drive(faults: list[str], which: Plan = plan) -> RunOutcome:
            script.queue = faults
            with Runtime(root / "journal.db", adapters=adapters, crash_hook=record, sleep=_no_sleep) as runtime:
                return runtime.run(which)

        assert "suspended" == drive([]).state
        with Runtime(root / "journal.db", adapters=adapters) as runtime:
            runtime.approve("tour", "held", by="ana")
        assert "stopped" == drive(["ok", "raise_before", "ok", "raise_before"]).state
        with Runtime(root / "journal.db", adapters=adapters) as runtime:
            runtime.reconcile_by_lookup("tour", "lost")
        assert "failed" == drive(["ok", "not_applied"]).state
        assert "completed" == drive([], done).state
        script.settle()
        ledger.close()

    assert sorted(BOUNDARIES) == sorted(reached)


# -- torn writes with real processes --------------------------------------------------------------

WORKER = r"""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hold_tools import ADAPTERS
from effectlog.plan import load_plan
from effectlog.runtime import Runtime

journal, plan = sys.argv[1], sys.argv[2]
wal = journal + "-wal"


def acknowledge(point, step_id):
    if point == "after_confirm":  # the step's result is committed (synchronous=FULL): say so, with the WAL size
        print(f"ack {step_id} {os.path.getsize(wal)}", flush=True)


with Runtime(journal, adapters=ADAPTERS, crash_hook=acknowledge) as runtime:
    # Keep the whole history in the WAL (no automatic checkpoint), so all of it can be torn.
    runtime.journal._db.execute("PRAGMA wal_autocheckpoint = 0")
    runtime.run(load_plan(plan))
"""
HOLD_TOOLS = """
import os, time
from pathlib import Path


class Hold:
    \"\"\"The plan's last step: it waits while the file named by EL_HOLD exists, so the worker never finishes.\"\"\"

    def invoke(self, request):
        while Path(os.environ["EL_HOLD"]).exists():
            time.sleep(0.01)
        return {"released": True}


ADAPTERS = {"test.hold": lambda decl, ctx: Hold()}
"""
STEPS = 300


def _kill_mid_run(root: Path, rng: random.Random) -> tuple[list[str], int, set[str]]:
    """Start the worker, SIGKILL it after a random number of acknowledgements; return the steps it
    acknowledged, the WAL size at its last acknowledgement and the steps the parent itself saw
    committed just before the kill. The plan ends in a step that holds, so the kill always
    lands before the run could finish."""
    steps = [
        *({"id": f"s{i:03d}", "adapter": "n", "args": {"i": i}} for i in range(STEPS)),
        {"id": "end", "adapter": "hold"},
    ]
    adapters = {"n": {"type": "noop", "idempotent": True}, "hold": {"type": "test.hold", "idempotent": True}}
    (root / "plan.json").write_bytes(msgspec.json.encode(plan_dict("torn", steps, adapters)))
    (root / "worker.py").write_text(WORKER)
    (root / "hold_tools.py").write_text(HOLD_TOOLS)
    (root / "hold").touch()
    argv = [sys.executable, str(root / "worker.py"), str(root / "journal.db"), str(root / "plan.json")]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env({"EL_HOLD": str(root / "hold")})
    )
    assert proc.stdout is not None
    kill_after = rng.randint(1, STEPS // 2)
    acked: list[str] = []
    sizes: list[int] = []
    seen: set[str] = set()
    try:
        for line in proc.stdout:
            _, step_id, size = line.split()
            acked.append(step_id)
            sizes.append(int(size))
            if len(acked) == kill_after:
                with SqliteJournal(root / "journal.db", writer=False) as journal:
                    state = load_run(journal, "torn")
                seen = {s.step_id for s in state.ordered_steps() if s.state == "confirmed"}
                proc.send_signal(signal.SIGKILL)
                break
        out, _ = proc.communicate(timeout=SAFETY_TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    for line in out.splitlines():  # acknowledgements printed before the kill landed
        _, step_id, size = line.split()
        acked.append(step_id)
        sizes.append(int(size))
    assert -signal.SIGKILL == proc.returncode
    assert sorted(sizes) == sizes  # one WAL generation: sizes only grow
    return acked, sizes[-1], seen


def _commit_ends(wal: bytes) -> list[int]:
    """The offsets just past each commit frame of a WAL (a frame whose header carries the database size)."""
    frame = 24 + int.from_bytes(wal[8:12], "big")  # frame header + page size (from the WAL header)
    return [at + frame for at in range(32, len(wal) - frame + 1, frame) if int.from_bytes(wal[at + 4 : at + 8], "big")]


def _resume(where: Path) -> subprocess.CompletedProcess[str]:
    (where / "hold").unlink(missing_ok=True)
    return effectlog(
        "run",
        "plan.json",
        "--journal",
        "journal.db",
        "--adapters",
        "hold_tools:ADAPTERS",
        cwd=where,
        env={"PYTHONPATH": str(where), "EL_HOLD": str(where / "hold")},
    )


ALL_STEPS = [*(f"s{i:03d}" for i in range(STEPS)), "end"]


@pytest.mark.crash
@pytest.mark.parametrize("seed", range(6))
def test_a_wal_torn_after_the_last_acknowledged_commit_loses_no_acknowledged_step(tmp_path: Path, seed: int) -> None:
    """SIGKILL the writer after a random number of steps; then, on three copies, cut its -wal
    past the end of the last commit anyone saw acknowledged (the worker printed it, or the
    parent read it): exactly there, at a random offset up to the end of the file, and inside
    the next frame (a torn frame). Each copy opens, ``effectlog verify`` exits 0, every
    acknowledged step is still confirmed, and the same plan resumed completes with every step
    confirmed exactly once."""
    rng = random.Random(seed)
    origin = tmp_path / "killed"
    origin.mkdir()
    acked, durable, seen = _kill_mid_run(origin, rng)
    wal = (origin / "journal.db-wal").read_bytes()
    ends = _commit_ends(wal)
    floor = durable
    if seen - set(acked):  # the parent read a confirmation the worker was killed before printing:
        assert [ALL_STEPS[len(acked)]] == sorted(seen - set(acked))
        floor = ends[ends.index(durable) + 2]  # that step's request commit, then its result commit
    frame = 24 + int.from_bytes(wal[8:12], "big")
    offsets = [floor, rng.randint(floor, len(wal)), min(len(wal), floor + rng.randint(1, frame - 1))]

    assert durable in ends  # each acknowledgement was printed right after a commit
    for copy_no, offset in enumerate(offsets):
        where = tmp_path / f"torn-{copy_no}"
        shutil.copytree(origin, where)
        os.truncate(where / "journal.db-wal", offset)
        verified = effectlog("verify", "--journal", "journal.db", cwd=where)
        with SqliteJournal(where / "journal.db", writer=False) as journal:
            state = load_run(journal, "torn")
        confirmed = {s.step_id for s in state.ordered_steps() if s.state == "confirmed"}
        resumed = _resume(where)
        with SqliteJournal(where / "journal.db", writer=False) as journal:
            tags = [ev.decode(r.body) for r in journal.read("torn")]

        assert (0, "") == (verified.returncode, verified.stderr), f"seed {seed}, offset {offset}"
        assert set() == (set(acked) | seen) - confirmed, f"seed {seed}, offset {offset} of {len(wal)}"
        assert 0 == resumed.returncode, resumed.stderr
        assert ALL_STEPS == [e.step_id for e in tags if isinstance(e, ev.StepConfirmed)]


@pytest.mark.crash
@pytest.mark.parametrize("seed", range(4))
def test_a_wal_cut_anywhere_still_opens_verifies_and_resumes(tmp_path: Path, seed: int) -> None:
    """The same kill, then the -wal cut at ANY offset, into acknowledged commits too (what a
    disk that lied about fsync could do; outside the guarantee, which needs a disk that keeps
    what it acknowledged). The journal still opens and verifies, holds a prefix of the run
    (steps confirmed in plan order), and a resume completes every step exactly once."""
    rng = random.Random(1000 + seed)
    origin = tmp_path / "killed"
    origin.mkdir()
    _kill_mid_run(origin, rng)
    offset = rng.randint(0, (origin / "journal.db-wal").stat().st_size)
    os.truncate(origin / "journal.db-wal", offset)

    verified = effectlog("verify", "--journal", "journal.db", cwd=origin)
    with SqliteJournal(origin / "journal.db", writer=False) as journal:
        steps = load_run(journal, "torn").ordered_steps()
    confirmed = [s.step_id for s in steps if s.state == "confirmed"]
    resumed = _resume(origin)
    with SqliteJournal(origin / "journal.db", writer=False) as journal:
        decoded = [ev.decode(r.body) for r in journal.read("torn")]
    final = [e.step_id for e in decoded if isinstance(e, ev.StepConfirmed)]

    assert 0 == verified.returncode, f"seed {seed}, offset {offset}: {verified.stderr}"
    assert ALL_STEPS[: len(confirmed)] == confirmed
    assert 0 == resumed.returncode, resumed.stderr
    assert ALL_STEPS == final
