"""Round-5 attacks on this session's new code (lazy seal rows and two-stream seals, replay over rows,
the writers' gate lobby, fork handling, reconcile bound to attempts, the alias check by name ranges):
each test is one suspicion, a failing reproduction first where it found a defect, kept as a regression
test where it found none. Real SQLite files, real processes and SIGKILL (``os.fork`` only in a child
interpreter, never in pytest's own)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import journal_tamper
from hardening_kit import effectlog, one_line


def python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by a fresh interpreter (this tree's sources through the inherited PYTHONPATH)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, timeout=120
    )


# -- 4. fork: the SQLite connection a child inherits -----------------------------------------------

_INHERITED_CLOSE_SCRIPT = """
    import os, subprocess, sys
    from effectlog.plan import AdapterDecl, Plan, StepDecl
    from effectlog.runtime import Runtime

    where, how = sys.argv[1], sys.argv[2]

    def plan(run_id):
        return Plan(
            run_id=run_id,
            adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
            steps=tuple(StepDecl(id=f"s{i}", adapter="noop") for i in range(3)),
        )

    rt = Runtime(where)
    rt.__enter__()
    rt.run(plan("p"))
    go, said = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker forked from a process with an open Runtime: it does nothing with it
        os.read(go, 1)
        if how == "close":
            rt.close()  # what a `with Runtime(...)` around the fork does when the child leaves it
            os._exit(0)
        sys.exit(0)  # the interpreter's own exit finalises the inherited runtime
    rt.close()
    # Another process completes run q and is killed before it closes: q's commits are in the WAL.
    third = '''
    import os, signal, sys
    from effectlog.plan import AdapterDecl, Plan, StepDecl
    from effectlog.runtime import Runtime
    plan = Plan(run_id="q", adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
                steps=tuple(StepDecl(id=f"s{i}", adapter="noop") for i in range(3)))
    rt = Runtime(sys.argv[1])
    rt.__enter__()
    print(rt.run(plan).state, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    '''
    import textwrap
    q = subprocess.run([sys.executable, "-c", textwrap.dedent(third), where], capture_output=True, text=True)
    print(q.stdout.strip(), flush=True)
    os.write(said, b"x")
    os.waitpid(pid, 0)
"""


@pytest.mark.parametrize("how", ["close", "exit"])
def test_a_forked_child_leaving_its_inherited_journal_loses_no_other_process_commits(tmp_path: Path, how: str) -> None:
    """A worker forked from a process with an open Runtime closes the inherited runtime (leaving a
    ``with`` block) or just exits. SQLite's close of the inherited connection believed it was the last
    one on the file (its lock table is the parent's, copied; the child holds no real lock), so it
    "checkpointed" through its stale WAL index and deleted the WAL by name: the WAL another process
    had committed run q into (completed, acknowledged, then SIGKILLed before its close). Run q was
    gone and ``verify`` said ok over one run. Proves: after the child leaves, run q is in the journal,
    completed, and verify counts both runs."""
    path = tmp_path / "j.db"
    proc = python(_INHERITED_CLOSE_SCRIPT, str(path), how)
    assert ("completed", "") == (proc.stdout.strip(), proc.stderr)
    status = effectlog("status", "--journal", str(path), "--run-id", "q", "--json", cwd=tmp_path)
    assert (0, "completed") == (status.returncode, json.loads(status.stdout or "{}").get("state"))
    verify = effectlog("verify", "--journal", str(path), cwd=tmp_path)
    assert (0, "ok: 2 run(s)") == (verify.returncode, verify.stdout[: len("ok: 2 run(s)")])


_CHILD_OWN_SCRIPT = """
    import os, subprocess, sys
    from effectlog.errors import EffectlogError
    from effectlog.plan import AdapterDecl, Plan, StepDecl
    from effectlog.runtime import Runtime

    where = sys.argv[1]

    def plan(run_id):
        return Plan(
            run_id=run_id,
            adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
            steps=tuple(StepDecl(id=f"s{i}", adapter="noop") for i in range(3)),
        )

    rt = Runtime(where)
    rt.__enter__()
    rt.run(plan("p"))
    go, said = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child opens the journal itself
        os.read(go, 1)
        try:
            with Runtime(where) as own:
                print(own.run(plan("c1")).state, flush=True)
        except EffectlogError as exc:
            print(exc.code, flush=True)
        os._exit(0)
    rt.close()  # the parent is done with the journal
    third = '''
    import sys
    from effectlog.plan import AdapterDecl, Plan, StepDecl
    from effectlog.runtime import Runtime
    def plan(run_id):
        return Plan(run_id=run_id, adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
                    steps=tuple(StepDecl(id=f"s{i}", adapter="noop") for i in range(3)))
    with Runtime(sys.argv[1]) as rt:
        print(rt.run(plan("q1")).state, flush=True)
        sys.stdin.readline()
        print(rt.run(plan("q2")).state, flush=True)
    '''
    import textwrap
    q = subprocess.Popen([sys.executable, "-c", textwrap.dedent(third), where],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    print(q.stdout.readline().strip(), flush=True)
    os.write(said, b"x")
    os.waitpid(pid, 0)
    q.stdin.write("\\n")
    q.stdin.flush()
    print(q.stdout.read().strip(), flush=True)
    q.wait()
"""


def test_a_forked_child_cannot_open_a_journal_its_parent_had_open(tmp_path: Path) -> None:
    """A child of a process with an open Runtime opens the journal itself, after the parent has closed
    its own, while another process has the journal open and commits before and after. SQLite in the
    child would still believe the parent's connection holds the file (its lock records and its mapping
    of the since-deleted -shm came with the fork): its commits were indexed where nobody else reads,
    and the other process wrote over them, so the child was told run c1 completed and c1 was gone,
    verify ok. Proves: the child's open is refused (`journal_inherited`, exit 6, saying to use a
    process that did not inherit the file) before SQLite opens anything, c1 never starts, and every
    run any process was told completed is in the journal, which verifies."""
    path = tmp_path / "j.db"
    proc = python(_CHILD_OWN_SCRIPT, str(path))
    assert (["completed", "journal_inherited", "completed"], "") == (proc.stdout.split(), proc.stderr)
    states = {}
    for run_id in ("p", "c1", "q1", "q2"):
        status = effectlog("status", "--journal", str(path), "--run-id", run_id, "--json", cwd=tmp_path)
        states[run_id] = json.loads(status.stdout).get("state") if status.returncode == 0 else status.returncode
    verified = effectlog("verify", "--journal", str(path), cwd=tmp_path)
    assert {"p": "completed", "c1": 2, "q1": "completed", "q2": "completed"} == states  # c1: no such run (exit 2)
    assert 0 == verified.returncode, verified.stderr


_FLEET_FORK_SCRIPT = """
    import os, sys
    from effectlog.errors import EffectlogError
    from effectlog.fleet import open_store
    from effectlog.fleet.contract import noop_plan

    where = sys.argv[1]
    store = open_store(where)  # a runner's store, open when it forks a worker
    store.submit("t", "k1", noop_plan("run-1"))
    pid = os.fork()
    if pid == 0:
        try:
            open_store(where).close()
            said = "opened"
        except EffectlogError as exc:
            said = exc.code
        store.close()  # the inherited store: its SQLite connection must be left alone here
        print(said, flush=True)
        os._exit(0)
    os.waitpid(pid, 0)
    store.submit("t", "k2", noop_plan("run-2"))
    store.close()
    with open_store(where) as again:
        print(len(again.requests()), flush=True)
"""


def test_a_forked_child_cannot_open_a_fleet_store_its_parent_had_open(tmp_path: Path) -> None:
    """The fleet store twin of the journal case: a worker forked from a process with an open fleet store
    opens the store itself and is refused (`journal_inherited`) before SQLite opens it, and closing the
    inherited store in the child leaves the parent's connection working (the parent submits again and
    the store opens cleanly afterwards)."""
    proc = python(_FLEET_FORK_SCRIPT, str(tmp_path / "fleet.db"))
    assert (["journal_inherited", "2"], "", 0) == (proc.stdout.split(), proc.stderr, proc.returncode)


_STORE_INHERITED_SCRIPT = """
    import os, subprocess, sys, textwrap
    from effectlog.adapters import EffectStore

    where = sys.argv[1]
    store = EffectStore(where)  # a process with an open effect store (a Runtime's --effects) forks a worker
    go, said = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(go, 1)
        sys.exit(0)  # the worker ends normally: the interpreter finalises the inherited store
    store.close()
    third = '''
    import os, signal, sys
    from effectlog.adapters import EffectStore
    from effectlog.adapters.protocol import Request
    store = EffectStore(sys.argv[1])
    store.apply_idempotent(Request(run_id="q", step_id="pay", attempt=1, idempotency_key="q/pay", args={}))
    print(store.count(run_id="q"), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    '''
    q = subprocess.run([sys.executable, "-c", textwrap.dedent(third), where], capture_output=True, text=True)
    os.write(said, b"x")
    os.waitpid(pid, 0)
    print(q.stdout.strip(), EffectStore(where).count(run_id="q"), flush=True)
"""


def test_a_forked_child_leaving_its_inherited_effect_store_loses_no_idempotency_key(tmp_path: Path) -> None:
    """The effect store twin of the journal case: a worker forked from a process with an open effect
    store ends normally; SQLite's close of the inherited connection, believing itself the file's last,
    deletes the WAL into which another process (SIGKILLed before its close) had committed the effect
    and key of q/pay. Proves (when fixed): the effect row is still there after the child ended, so a
    resume of q finds the key instead of applying the effect a second time."""
    proc = python(_STORE_INHERITED_SCRIPT, str(tmp_path / "effects.db"))
    assert ("1 1", "") == (proc.stdout.strip(), proc.stderr)


# -- 2. replay over rows: a stored value of another SQLite type ------------------------------------


@pytest.mark.parametrize("value", ["CAST(body AS TEXT)", "7"], ids=["text", "integer"])
@pytest.mark.parametrize("command", ["verify", "status"])
def test_an_event_body_stored_as_another_sqlite_type_is_refused_in_one_line(
    tmp_path: Path, value: str, command: str
) -> None:
    """A body column rewritten as TEXT or INTEGER (SQLite keeps any type in a BLOB column) came back as
    ``str``/``int``, and the chain check ``head + body`` raised TypeError: ``verify`` and ``status``
    ended with a traceback and exit 1 over a damaged journal. Proves: both refuse it in one line as
    corrupt_event (exit 7, the integrity status) naming run r, seq 2 and the body column."""
    path = tmp_path / "j.db"
    proc = python(
        """
        import sys
        from effectlog.plan import AdapterDecl, Plan, StepDecl
        from effectlog.runtime import Runtime
        with Runtime(sys.argv[1]) as rt:
            rt.run(Plan(run_id="r", adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
                        steps=(StepDecl(id="s0", adapter="noop"),)))
        """,
        str(path),
    )
    assert "" == proc.stderr
    db = journal_tamper.connect(path)
    db.execute("DROP TRIGGER events_append_only_update")
    db.execute(f"UPDATE ev SET body = {value} WHERE run_id = 'r' AND seq = 2")
    db.commit()
    db.close()
    args = ["--run-id", "r"] if command == "status" else []
    result = effectlog(command, "--journal", str(path), *args, cwd=tmp_path)
    line = one_line(result.stderr)
    assert (7, True, True) == (result.returncode, "corrupt_event" in line, "seq 2" in line and "body" in line)


# -- 3. the writers' gate lobby --------------------------------------------------------------------


# Prefixed to test_writers_gate.APPENDER: says "waiting" once its append has found the gate held and
# begins to wait for it, so the test knows, on however slow a machine, that it came while the gate was held.
_SAYS_WHEN_WAITING = """
from effectlog.journal import filelocks
_wait_gate = filelocks.SharedFile._wait_gate
def _says_waiting(self, where, timeout_s):
    print("waiting", flush=True)
    return _wait_gate(self, where, timeout_s)
filelocks.SharedFile._wait_gate = _says_waiting
"""


def test_a_stopped_lobby_head_does_not_keep_others_from_a_free_gate(tmp_path: Path) -> None:
    """A process waiting for the gate holds the lobby (it alone polls the gate) and is then stopped
    (Ctrl-Z of an ``effectlog run``, a debugger, a frozen container). The gate's holder leaves: the
    gate is free, but a third process waiting since before polls only the lobby, which the stopped
    process keeps, and so waited out its whole timeout and failed with JournalLocked (exit 6) over a
    free journal. Before the lobby it took the gate. Proves: the third process's append lands within
    its 5 s timeout once the gate is free, while the stopped waiter still holds the lobby."""
    import signal

    from effectlog.journal import SqliteJournal
    from test_writers_gate import APPENDER, GATE_HOLDER, appenders, leave, lobby_held, reports

    journal = tmp_path / "j.db"
    SqliteJournal(journal).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", GATE_HOLDER, str(journal)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert "held\n" == holder.stdout.readline()
    (stopped,) = appenders(journal, ["r1"], 60.0)
    try:
        deadline = time.monotonic() + 30
        while not lobby_held(journal):
            assert time.monotonic() < deadline, "the waiter never took the lobby"
            time.sleep(0.01)
        stopped.send_signal(signal.SIGSTOP)
        third = subprocess.Popen(
            [sys.executable, "-c", _SAYS_WHEN_WAITING + APPENDER, str(journal), "r2", "5.0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert third.stdout is not None
        assert ("ready\n", "waiting\n") == (third.stdout.readline(), third.stdout.readline())
        leave(holder)  # the third process is waiting now (the gate was held when it came)
        (said,) = reports([third])
        assert (True, True) == (said["ok"], lobby_held(journal))
    finally:
        stopped.send_signal(signal.SIGCONT)
        reports([stopped])


# -- 6. the alias check by name ranges -------------------------------------------------------------

_HOLD_THEN_RENAME = """
    import os, sys
    from effectlog.journal import SqliteJournal
    journal = SqliteJournal(sys.argv[1])
    os.rename(sys.argv[1], sys.argv[2])  # the file keeps its WAL beside the old name in this process
    print("renamed", flush=True)
    sys.stdin.read()
    journal.close()
"""


def test_a_journal_renamed_while_open_is_refused_under_its_new_name(tmp_path: Path) -> None:
    """One process opens j.db and renames the file to k.db while it has it open (its WAL stays beside
    the old name). Another process opening k.db would be a second journal over the same file; the name
    range probe must still see the first process's name byte. Proves: the open of k.db is refused as
    journal_aliased (exit 6), and after the first process closes, k.db opens (found nothing: kept as
    a regression test of the one-probe check)."""
    from effectlog.errors import JournalAliased
    from effectlog.journal import SqliteJournal

    old, new = tmp_path / "j.db", tmp_path / "k.db"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(_HOLD_THEN_RENAME), str(old), str(new)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert "renamed\n" == holder.stdout.readline()
    try:
        with pytest.raises(JournalAliased) as refused:
            SqliteJournal(new)
        assert 6 == int(refused.value.exit_status)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    SqliteJournal(new).close()
