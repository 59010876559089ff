"""Attack round 22: a tool, or the machine, hostile to the process that runs it.

A tool that removes files beside the journal, replaces the journal, or fills the disk; signals and a
closed pipe; an approval whose expiry passes while its call is in flight. Each test drives real
``effectlog`` processes (SIGKILL where a crash is the point) against real SQLite files; a race is
steered by a file the paused tool makes, never by a sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effectlog.journal import SqliteJournal
from hardening_kit import SAFETY_TIMEOUT_S, cli_env, last_line

# The tools' module: each call notes its step (and key) in the file ``log`` names before it does what
# the file ``mode`` says (read per call, so that a later pass of the same plan can be tame).
TOOLS = """
import os
import shutil
import stat
import time


class Hostile:
    def __init__(self, options):
        self.o = options

    def invoke(self, request):
        o = self.o
        with open(o["log"], "a") as fh:
            fh.write(f"{request.step_id} {request.idempotency_key}\\n")
            fh.flush()
            os.fsync(fh.fileno())
        mode = open(o["mode"]).read().strip()
        journal = o.get("journal", "")
        if mode == "remove-shm":  # a clean-up script's "rm -f *.db-shm", or a backup tool's
            os.unlink(journal + "-shm")
        elif mode == "remove":  # a clean-up of "stale" files, or a test harness resetting its state
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(journal + suffix):
                    os.unlink(journal + suffix)
        elif mode == "remove-store":  # the same clean-up, of the effect store
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(o["store"] + suffix):
                    os.unlink(o["store"] + suffix)
        elif mode == "replace":  # a "compaction" that copies the file and renames the copy into place
            shutil.copy(journal, journal + ".tmp")
            os.replace(journal + ".tmp", journal)
        elif mode == "fill":  # a tool that writes a large file on the journal's disk until it is full
            with open(o["filler"], "wb") as fh:
                try:
                    while True:
                        fh.write(b"x" * 65536)
                        fh.flush()
                except OSError:
                    pass
        elif mode == "fork-then-die":  # a daemon (or a fork-started worker) left running, then a crash
            if os.fork() == 0:
                null = os.open(os.devnull, os.O_RDWR)  # a daemon's standard streams, off the caller's pipes
                for std in (0, 1, 2):
                    os.dup2(null, std)
                for fd in map(int, os.listdir("/proc/self/fd")):  # and any copy effectlog keeps of them
                    try:
                        if stat.S_ISFIFO(os.fstat(fd).st_mode):
                            os.close(fd)
                    except OSError:
                        pass
                with open(o["child"] + ".tmp", "w") as fh:
                    fh.write(str(os.getpid()))
                os.rename(o["child"] + ".tmp", o["child"])
                deadline = time.monotonic() + 120
                while not os.path.exists(o["gate"]) and time.monotonic() < deadline:
                    time.sleep(0.01)
                os._exit(0)
            while not os.path.exists(o["child"]):
                time.sleep(0.01)
            os.kill(os.getpid(), 9)
        if "gate" in o and mode not in ("tame", "fork-then-die"):
            open(o["reached"], "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(o["gate"]) and time.monotonic() < deadline:
                time.sleep(0.01)
        return {"ok": True}


ADAPTERS = {"hostile": lambda decl, ctx: Hostile(decl.options)}
"""


class World:
    """A directory (``where``) with the tools module, a journal ``j.db`` and plans of the hostile tool."""

    def __init__(self, where: Path, tools_dir: Path | None = None) -> None:
        self.dir = where
        self.tools = tools_dir or where
        (self.tools / "hostile_tools.py").write_text(TOOLS)
        self.journal = where / "j.db"

    def plan(self, name: str, run_id: str, steps: int, *, idempotent: bool, gate: bool = False, mode: str) -> Path:
        """A plan ``name`` of ``steps`` steps of the hostile tool, noting calls in ``name.log``, in mode
        ``mode`` (its file ``name.mode``: ``set_mode`` changes it); with ``gate``, each call then waits
        for ``name.gate`` (having made ``name.reached``)."""
        options: dict[str, Any] = {
            "log": str(self.tools / f"{name}.log"), "mode": str(self.tools / f"{name}.mode"),
            "journal": str(self.journal), "filler": str(self.dir / "filler"),
            "child": str(self.tools / f"{name}.child"), "store": str(self.dir / "e.db"),
        }  # fmt: skip
        if gate:
            options |= {"gate": str(self.tools / f"{name}.gate"), "reached": str(self.tools / f"{name}.reached")}
        self.set_mode(name, mode)
        plan = {
            "run_id": run_id,
            "adapters": {"t": {"type": "hostile", "idempotent": idempotent, "options": options}},
            "steps": [{"id": f"s{i}", "adapter": "t"} for i in range(1, steps + 1)],
        }
        path = self.tools / f"{name}.json"
        path.write_text(json.dumps(plan))
        return path

    def set_mode(self, name: str, mode: str) -> None:
        (self.tools / f"{name}.mode").write_text(mode)

    def calls(self, name: str) -> list[str]:
        log = self.tools / f"{name}.log"
        return [line.split(" ")[0] for line in log.read_text().splitlines()] if log.exists() else []

    def argv(self, plan: Path, journal: Path | None = None, effects: Path | None = None) -> list[str]:
        return [sys.executable, "-m", "effectlog", "run", str(plan), "--journal", str(journal or self.journal),
                "--adapters", "hostile_tools:ADAPTERS", *(["--effects", str(effects)] if effects else [])]  # fmt: skip

    def run(
        self, plan: Path, journal: Path | None = None, effects: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(plan, journal, effects), cwd=self.dir, env=cli_env({"PYTHONPATH": str(self.tools)}),
            capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S, check=False,
        )  # fmt: skip

    def start(self, plan: Path) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(plan), cwd=self.dir, env=cli_env({"PYTHONPATH": str(self.tools)}),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def effectlog(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "effectlog", *argv], cwd=self.dir, env=cli_env(),
            capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S, check=False,
        )  # fmt: skip

    def runs(self, journal: Path | None = None) -> list[str]:
        with SqliteJournal(journal or self.journal, writer=False) as opened:
            return sorted(opened.runs())


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    """Poll for ``path``; fail (never hang) if ``proc`` ends first or the safety deadline passes."""
    deadline = time.monotonic() + SAFETY_TIMEOUT_S
    while not path.exists():
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"the run ended (exit {proc.returncode}) before its tool was reached: {err}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{path} never appeared")
        time.sleep(0.01)


# -- 1. a tool that removes the journal's shared-memory index while another process commits ---------------


def test_a_tool_removing_the_journals_shm_loses_no_other_processes_run(tmp_path: Path) -> None:
    """Process A's tool removes ``j.db-shm`` (a clean-up script's ``rm -f *.db-shm``) and is still in its
    call when process B, ``effectlog run`` of another run of the same journal, opens it: SQLite in B makes
    a new shared-memory index, rebuilt from the WAL, while A goes on with the old one it has mapped. A's
    next commit then wrote its frame where its own index said the WAL ended, over B's commits: B's whole
    run, its 5 non-idempotent steps made and acknowledged (exit 0), was gone from the journal, ``verify``
    said ok for the run left, and B's plan run again sent all 5 again. Proves: B's run stays in the
    journal and sends nothing more when run again; A writes nothing more once its index is not the
    journal's (exit 6, one line, ``journal_wal_lost``), its step is found uncertain at the next pass and
    was sent once; ``verify`` says ok."""
    world = World(tmp_path)
    a = world.plan("a", "ra", 2, idempotent=False, gate=True, mode="remove-shm")
    b = world.plan("b", "rb", 5, idempotent=False, mode="tame")
    first = world.start(a)
    try:
        _wait_for(tmp_path / "a.reached", first)
        assert not Path(f"{world.journal}-shm").exists()
        other = world.run(b)
    finally:
        (tmp_path / "a.gate").touch()
        _, first_err = first.communicate(timeout=SAFETY_TIMEOUT_S)
    assert 0 == other.returncode, other.stderr
    assert (6, "journal_wal_lost") == (first.returncode, last_line(first_err).split(":")[1].strip()), first_err
    assert ["ra", "rb"] == world.runs()
    again = world.run(b)
    assert (0, ["s1", "s2", "s3", "s4", "s5"]) == (again.returncode, world.calls("b")), again.stderr
    world.set_mode("a", "tame")
    resumed = world.run(a)
    assert (3, ["s1"]) == (resumed.returncode, world.calls("a")), resumed.stderr
    assert 0 == world.effectlog("verify", "--journal", "j.db").returncode


# -- 2. a tool that removes or replaces the journal file itself ----------------------------------------


@pytest.mark.parametrize("idempotent", [False, True], ids=["unkeyed", "keyed"])
def test_a_journal_removed_by_its_tool_is_put_back_with_its_history(tmp_path: Path, idempotent: bool) -> None:
    """A step's tool removes the journal and its sidecars (``rm -f j.db*``) during its call. The runtime
    noticed at its next commit and said "what was written is kept in the file (checkpointed) ... open it
    by its new name", but there was no new name: the history, the step's request with it, lived only in
    the file this process still had open, lost when it ended, and the next ``effectlog run`` made a new
    journal and sent the step again (an unkeyed step twice, ``verify`` ok). Proves: the run ends with exit
    6 in one line saying the history was put back; the journal at its name holds the run, the next pass
    finds the step uncertain (unkeyed: exit 3, nothing sent) or resends it under its key (keyed), never
    as a new attempt; ``verify`` says ok."""
    world = World(tmp_path)
    plan = world.plan("p", "r", 2, idempotent=idempotent, mode="remove")
    first = world.run(plan)
    line = last_line(first.stderr)
    assert (6, True) == (first.returncode, "put back" in line), first.stderr
    assert ["r"] == world.runs()
    world.set_mode("p", "tame")
    again = world.run(plan)
    if idempotent:
        assert (0, ["s1", "s1", "s2"]) == (again.returncode, world.calls("p")), again.stderr
        keys = [line.split(" ")[1] for line in (tmp_path / "p.log").read_text().splitlines()]
        assert keys[0] == keys[1]
    else:
        assert (3, ["s1"]) == (again.returncode, world.calls("p")), again.stderr
    assert 0 == world.effectlog("verify", "--journal", "j.db").returncode


def test_a_journal_replaced_by_its_tool_has_its_history_saved_beside_it(tmp_path: Path) -> None:
    """A step's tool copies the journal file and renames the copy over it (a "compaction"): the copy
    lacks what was in the WAL, the step's request among it. The runtime said the history was "kept in
    the file ... open it by its new name", of a file no name leads to any more. Proves: the run ends
    with exit 6 in one line naming a file beside the journal where its history was saved; the file at
    the journal's name is left as the tool made it; the saved file holds the run, whose step a pass on
    it finds uncertain (exit 3, nothing sent again); ``verify`` says ok for it."""
    world = World(tmp_path)
    plan = world.plan("p", "r", 2, idempotent=False, mode="replace")
    first = world.run(plan)
    line = last_line(first.stderr)
    saved = sorted(tmp_path.glob("j.db.rescued-*"))
    assert (6, 1) == (first.returncode, len(saved)), first.stderr
    assert saved[0].name in line
    assert saved[0].stat().st_mode & 0o777 == 0o600
    world.set_mode("p", "tame")
    again = world.run(plan, journal=saved[0])
    assert (3, ["s1"]) == (again.returncode, world.calls("p")), again.stderr
    assert 0 == world.effectlog("verify", "--journal", str(saved[0])).returncode


_DURABLE = """
import json, os, sys
from effectlog import durable

journal, mode = sys.argv[1], sys.argv[2]


@durable.tool(idempotent=False)
def send(to: str) -> str:
    with open("calls.log", "a") as fh:
        fh.write(f"send {to}\\n")
    if mode == "remove":
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(journal + suffix):
                os.unlink(journal + suffix)
    return "sent"


try:
    with durable.run("order-1", journal=journal):
        send("a")
        send("b")
    print(json.dumps({"error": None}))
except Exception as exc:
    print(json.dumps({"error": getattr(exc, "code", type(exc).__name__)}))
"""


def test_a_durable_tool_removing_its_journal_finds_its_call_uncertain_on_the_next_pass(tmp_path: Path) -> None:
    """The same removal from inside a ``@durable.tool`` (the program's own code, in the process that
    holds the journal). Proves: the block ends with ``journal_removed``; the program run again finds the
    unkeyed call uncertain (``uncertain_effect``) instead of making it again in a new journal, and it was
    made once."""
    (tmp_path / "prog.py").write_text(_DURABLE)

    def once(mode: str) -> str | None:
        done = subprocess.run(
            [sys.executable, "prog.py", str(tmp_path / "j.db"), mode], cwd=tmp_path, env=cli_env(),
            capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S, check=False,
        )  # fmt: skip
        assert "Traceback" not in done.stderr, done.stderr
        error: str | None = json.loads(done.stdout.splitlines()[-1])["error"]
        return error

    assert "journal_removed" == once("remove")
    assert "uncertain_effect" == once("tame")
    assert ["send a"] == (tmp_path / "calls.log").read_text().splitlines()


def test_a_run_held_by_a_process_its_crashed_owner_forked_names_that_process(tmp_path: Path) -> None:
    """A step's tool forks without exec (a daemon it starts, a ``multiprocessing`` worker under the fork
    start method) and its process is then killed. The child shares the journal's open file description,
    and with it the OFD lock that makes the run's owner: the run stays owned while the child lives (so
    nothing resends the step meanwhile), but every command said only "driven by another process" and
    ``status`` "running", naming nobody, while the recorded owner was dead. Proves: a resume and a
    reconcile are refused (exit 6, one line) naming the child's pid; once the child ends the next pass
    finds the unkeyed step uncertain (exit 3) and it was sent once; ``verify`` says ok."""
    world = World(tmp_path)
    plan = world.plan("p", "r", 2, idempotent=False, gate=True, mode="fork-then-die")
    try:
        first = world.run(plan)
        assert -signal.SIGKILL == first.returncode, first.stderr
        child = (tmp_path / "p.child").read_text()
        world.set_mode("p", "tame")
        held = world.run(plan)
        reconcile = world.effectlog(
            "reconcile", "--journal", "j.db", "--run-id", "r", "--step", "s1", "--outcome", "applied",
            "--evidence", "x", "--operator", "ann",
        )  # fmt: skip
        assert (6, 6) == (held.returncode, reconcile.returncode), (held.stderr, reconcile.stderr)
        assert f"pid {child} " in last_line(held.stderr), held.stderr
        assert f"pid {child} " in last_line(reconcile.stderr), reconcile.stderr
    finally:
        (tmp_path / "p.gate").touch()
    deadline = time.monotonic() + SAFETY_TIMEOUT_S
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:  # (a zombie until init reaps it)
        with contextlib.suppress(OSError):
            if Path(f"/proc/{child}/stat").read_text().split(") ")[-1].startswith("Z"):
                break
        time.sleep(0.01)
    again = world.run(plan)
    assert (3, ["s1"]) == (again.returncode, world.calls("p")), again.stderr
    assert 0 == world.effectlog("verify", "--journal", "j.db").returncode


def test_an_effect_store_removed_by_a_tool_keeps_its_committed_effects(tmp_path: Path) -> None:
    """The same removal, of the effect store: ``s1`` committed its effect into ``e.db``, ``s2``'s tool
    removes ``e.db*``, and ``s3``'s ledger commit is refused with "kept in the file (checkpointed) ...
    open it by its new name", of a file no name leads to: ``s1``'s effect, the store's only record of it,
    went with the process. Proves: ``s3``'s effect is not committed and the message says the store was put
    back; the store at its name holds ``s1``'s effect, under the identity the run pinned (a resume is not
    refused as another store)."""
    world = World(tmp_path)
    plan = world.plan("p", "r", 1, idempotent=False, mode="remove-store")
    data = json.loads(plan.read_text())
    data["adapters"]["l"] = {"type": "effects.idempotent", "version": "1", "idempotent": True}
    data["steps"] = [
        {"id": "s1", "adapter": "l", "args": {"n": 1}},
        {"id": "s2", "adapter": "t"},
        {"id": "s3", "adapter": "l", "args": {"n": 3}},
    ]
    plan.write_text(json.dumps(data))
    first = world.run(plan, effects=tmp_path / "e.db")
    assert "put back" in first.stderr, first.stderr
    listed = world.effectlog("effects", "--effects", "e.db", "--json")
    assert (0, ["s1"]) == (listed.returncode, [row["step_id"] for row in json.loads(listed.stdout)]), listed.stderr
    world.set_mode("p", "tame")
    again = world.run(plan, effects=tmp_path / "e.db")
    assert "ledger_mismatch" not in again.stderr, again.stderr


# -- 3. the disk fills: a real tmpfs, ENOSPC ----------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A directory on a real 2 MiB tmpfs of its own (ENOSPC, not RLIMIT_FSIZE's EFBIG), unmounted after.
    Mounting needs root; elsewhere the test is skipped (under ``CI=true``, failed)."""
    where = tmp_path / "small"
    where.mkdir()
    mounted = os.geteuid() == 0 and shutil.which("mount") is not None
    if mounted:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(where)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        mounted = done.returncode == 0
    if not mounted:
        if os.environ.get("CI") == "true":
            pytest.fail("a small tmpfs is required when CI=true (run as root)", pytrace=False)
        pytest.skip("cannot mount a tmpfs here (not root, or no mount(8))")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def _fill(where: Path) -> None:
    """Fill the file system of ``where`` to its last byte."""
    with (where / "filler").open("wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"x" * 65536)
            fh.flush()


@pytest.mark.parametrize("idempotent", [False, True], ids=["unkeyed", "keyed"])
def test_a_full_disk_before_the_request_runs_no_tool_and_the_next_run_sends_each_step_once(
    small_disk: Path, tmp_path: Path, idempotent: bool
) -> None:
    """The journal holds an earlier run; the disk is then full (ENOSPC on a real tmpfs) when the next
    run starts, so its ``run.started`` and the first step's request cannot be written. Proves: no tool
    is called (the request was not recorded), the run ends in one line (exit 2, ``storage``), nothing of
    the run is in the journal, and once there is room the run sends each step exactly once; ``verify``
    says ok."""
    world = World(small_disk, tools_dir=tmp_path)
    earlier = world.plan("e", "earlier", 1, idempotent=idempotent, mode="tame")
    assert 0 == world.run(earlier).returncode
    plan = world.plan("p", "r", 2, idempotent=idempotent, mode="tame")
    _fill(small_disk)
    full = world.run(plan)
    assert (2, "storage", []) == (
        full.returncode, last_line(full.stderr).split(":")[1].strip(), world.calls("p")
    ), full.stderr  # fmt: skip
    (small_disk / "filler").unlink()
    assert ["earlier"] == world.runs()
    again = world.run(plan)
    assert (0, ["s1", "s2"]) == (again.returncode, world.calls("p")), again.stderr
    assert 0 == world.effectlog("verify", "--journal", str(world.journal)).returncode


@pytest.mark.parametrize("idempotent", [False, True], ids=["unkeyed", "keyed"])
def test_a_tool_that_fills_the_disk_leaves_its_step_uncertain_never_completed_or_run_anew(
    small_disk: Path, tmp_path: Path, idempotent: bool
) -> None:
    """The first step's tool writes a file on the journal's disk until it is full: its request was
    recorded, its result cannot be. Proves: the run ends in one line (exit 2, ``storage``, no traceback);
    once there is room the next pass finds the step uncertain, an unkeyed one stopping for a person (exit
    3, nothing sent again) and a keyed one resent under the same key (exit 0), never completed from
    nothing and never a new attempt; ``verify`` says ok."""
    world = World(small_disk, tools_dir=tmp_path)
    plan = world.plan("p", "r", 2, idempotent=idempotent, mode="fill")
    full = world.run(plan)
    assert (2, "storage", ["s1"]) == (
        full.returncode, last_line(full.stderr).split(":")[1].strip(), world.calls("p")
    ), full.stderr  # fmt: skip
    (small_disk / "filler").unlink()
    world.set_mode("p", "tame")
    again = world.run(plan)
    if idempotent:
        keys = [line.split(" ")[1] for line in (tmp_path / "p.log").read_text().splitlines()]
        assert (0, ["s1", "s1", "s2"], keys[0]) == (again.returncode, world.calls("p"), keys[1]), again.stderr
    else:
        assert (3, ["s1"]) == (again.returncode, world.calls("p")), again.stderr
    assert 0 == world.effectlog("verify", "--journal", str(world.journal)).returncode


# -- 4. a reader that goes away while a step's call is in flight ---------------------------------------


def test_stderr_closed_by_its_reader_during_a_call_still_records_every_step_once(tmp_path: Path) -> None:
    """``effectlog run ... 2>&1 | head -1``: the reader takes the first progress line and goes away
    while the first step's call is in flight, so every later progress line meets a closed pipe (EPIPE;
    SIGPIPE is ignored by Python). Were a progress write allowed to fail the step, the result already
    made would go unrecorded (uncertain) or the next step never run. Proves: exit 0, both steps sent
    once, both confirmed in the journal; ``verify`` says ok."""
    world = World(tmp_path)
    plan = world.plan("p", "r", 2, idempotent=False, gate=True, mode="slow")
    proc = subprocess.Popen(
        world.argv(plan), cwd=tmp_path, env=cli_env({"PYTHONPATH": str(tmp_path)}),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        assert proc.stderr.readline().startswith("effectlog: run r started")
        _wait_for(tmp_path / "p.reached", proc)
        proc.stderr.close()  # the reader is gone while s1's call is in flight
    finally:
        (tmp_path / "p.gate").touch()
        proc.wait(timeout=SAFETY_TIMEOUT_S)
    assert (0, ["s1", "s2"]) == (proc.returncode, world.calls("p"))
    status = json.loads(world.effectlog("status", "--journal", "j.db", "--run-id", "r", "--json").stdout)
    assert ["confirmed", "confirmed"] == [step["state"] for step in status["steps"]]
    assert 0 == world.effectlog("verify", "--journal", "j.db").returncode


# -- 5. an approval that expires while its call is in flight --------------------------------------------


def test_an_approval_that_expires_while_its_call_is_in_flight_leaves_the_step_uncertain_after_a_kill(
    tmp_path: Path,
) -> None:
    """``approve --expires-in 600``; the run sends the approved non-idempotent step and is killed
    (SIGKILL) inside its call; the next pass runs an hour later (libfaketime), past the approval's
    expiry. An expired approval must not send the step again after a fresh approval as if it had never
    been sent: the call happened under a valid approval. Proves: the late pass finds the step uncertain
    (exit 3, not held for approval again, exit 4), and the step was sent once; ``verify`` says ok."""
    faketime = shutil.which("faketime")
    if faketime is None:
        if os.environ.get("CI") == "true":
            pytest.fail("faketime is required when CI=true (.ci/ensure-faketime)", pytrace=False)
        pytest.skip("no faketime(1): bash .ci/ensure-faketime")
    world = World(tmp_path)
    plan = world.plan("p", "r", 1, idempotent=False, gate=True, mode="slow")
    data = json.loads(plan.read_text())
    data["steps"][0]["approval"] = "required"
    plan.write_text(json.dumps(data))
    assert 4 == world.run(plan).returncode
    approve = ("approve", "--journal", "j.db", "--run-id", "r", "--step", "s1", "--attempt", "1", "--by", "ann")
    assert 0 == world.effectlog(*approve, "--expires-in", "600").returncode
    proc = world.start(plan)
    _wait_for(tmp_path / "p.reached", proc)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=SAFETY_TIMEOUT_S)
    late = subprocess.run(
        [faketime, "-f", "+1h", *world.argv(plan)], cwd=tmp_path, env=cli_env({"PYTHONPATH": str(tmp_path)}),
        capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert (3, ["s1"]) == (late.returncode, world.calls("p")), late.stderr
    assert 0 == world.effectlog("verify", "--journal", "j.db").returncode
