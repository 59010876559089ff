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
from pathlib import Path

import pytest

from hardening_kit import effectlog


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
def test_a_forked_child_leaving_its_inherited_journal_loses_no_other_process_commits(
    tmp_path: Path, how: str
) -> None:
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
