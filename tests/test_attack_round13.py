"""Attack round 13: the run's life cycle under real crashes, and the integrations' "paid once".

Retry, fork and recover each killed with a real SIGKILL (a child process that kills itself
at a crash point the crash matrix uses), chains of them (a retry of a fork of a retry, a
fork of a parent whose key a retry already sent again), the agent integrations killed
between a recorded model answer and its tools, and the hash-chained trace across a kill and
a resume. Effects are counted in the effect store itself and model calls on the local
stand-in provider; every journal is checked with ``effectlog verify``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from effectlog.errors import ExitStatus, ForkRefused
from effectlog.plan import parse_plan
from effectlog.runtime import Runtime
from hardening_kit import SAFETY_TIMEOUT_S, cli_env
from lifecycle_adapters import ADAPTERS
from test_fork_stores_and_keys import lossy
from test_lifecycle import effect_counts

HERE = Path(__file__).parent

# A child that does one life-cycle operation and SIGKILLs itself when the runtime reaches a crash
# point (the crash matrix's names: ``after_effect``, ``before_commit:<event tag>``, ...).
CHILD = """
import json, os, signal, sys
from effectlog.plan import parse_plan
from effectlog.runtime import Runtime
from lifecycle_adapters import ADAPTERS

journal, effects, op, kill, arg = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5])
point, _, step = kill.partition("@")


def hook(where, sid):
    if point and where == point and (not step or sid == step):
        os.kill(os.getpid(), signal.SIGKILL)


with Runtime(journal, effects=effects, adapters=ADAPTERS, crash_hook=hook) as rt:
    if op == "run":
        out = rt.run(parse_plan(json.dumps(arg).encode()))
    elif op == "retry":
        out = rt.retry(arg, by="ops", reason="again")
    else:
        print(json.dumps([[r.run_id, r.state] for r in rt.recover()]))
        sys.exit(0)
    print(json.dumps([out.run_id, out.state]))
"""


def child(journal: Path, effects: Path, op: str, arg: Any = None, kill: str = "") -> subprocess.CompletedProcess[str]:
    """One life-cycle operation in a real child process, killed (SIGKILL) at ``kill`` if it gets there."""
    env = {**cli_env(), "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), str(HERE)])}
    return subprocess.run(
        [sys.executable, "-c", CHILD, str(journal), str(effects), op, kill, json.dumps(arg)],
        env=env, capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S,
    )  # fmt: skip


def verify(journal: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", "verify", "--journal", str(journal)],
        env=cli_env(), capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S,
    )  # fmt: skip


# -- retry / fork: the parent's key ---------------------------------------------------------------------


def test_a_fork_does_not_take_a_reservation_its_parents_retry_already_holds_as_its_own(tmp_path: Path) -> None:
    """The parent's `reserve` (idempotent) lost its answers; `retry` re-sent its key and completed.

    Then ``effectlog fork`` of the parent from `reserve` (on purpose: run it again) re-sent the
    same key a third time, got the reservation the retry already holds back as a replay, and
    completed claiming it as its own: two completed runs, one reservation, each run's receipt
    saying it is its own (cancel one and the other's is gone). Proves: a fork refuses (exit 5,
    nothing written) to send a parent's key that another run of the journal already sent again,
    naming that run; what it may do instead is fork that run.
    """
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        assert "failed" == rt.run(lossy(tmp_path)).state
        (tmp_path / "answers").touch()
        assert "completed" == rt.retry("book-1", by="ops", reason="answers back").state
        with pytest.raises(ForkRefused, match="book-1.retry1") as info:
            rt.fork("book-1", "book-1.again", by="ops", reason="book it again")
        assert (ExitStatus.CONFLICT, ["book-1", "book-1.retry1"]) == (info.value.exit_status, sorted(rt.journal.runs()))
    assert Counter({("book-1", "reserve"): 1, ("book-1.retry1", "log"): 1}) == effect_counts(effects)
