"""The effect store's WAL removed under it: something in the store's own process opens and closes the
store file (dropping SQLite's POSIX locks of the process on it), another process's close of the store
then checkpoints and deletes the ``-wal``, and the store went on committing effects into the deleted
WAL: effects it reported applied were lost, so an idempotent key was applied again on resume. Real
SQLite files, real processes, real SIGKILL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from effectlog.adapters import EffectStore
from effectlog.errors import ExitStatus

# An idempotent tool over the run's effect store. On its first call it reads the store file (a
# backup or checksum step might) and closes it, says so, and waits for EL_GO; then it applies its
# effect, logs whether the key was applied or answered from the store, and (EL_KILL) SIGKILLs its
# own process: the effect committed, the journal's result not written, so a resume sends the key again.
_TOOL_MODULE = """
import os, signal, time


class ReadsTheStore:
    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        if not os.path.exists(os.environ["EL_ASKED"]):
            with open(os.environ["EL_STORE"], "rb") as f:
                f.read(100)
            open(os.environ["EL_ASKED"], "w").close()
            while not os.path.exists(os.environ["EL_GO"]):
                time.sleep(0.02)
        receipt = self.store.apply_idempotent(request)
        with open(os.environ["EL_LOG"], "a") as log:
            log.write("replayed\\n" if receipt.data.get("replayed") else "applied\\n")
        if os.environ.get("EL_KILL"):
            os.kill(os.getpid(), signal.SIGKILL)
        return receipt


ADAPTERS = {"test.reads-store": lambda decl, ctx: ReadsTheStore(ctx.effect_store())}
"""

# Another process using the store (an `effects` listing, a reconcile from the ledger): its close is
# the last one SQLite sees once the run's process lost its locks, so it checkpoints and deletes the WAL.
_VISITOR = """
import sys
from effectlog.adapters import EffectStore
EffectStore(sys.argv[1]).close()
"""


def test_an_effect_store_whose_wal_was_deleted_under_it_never_applies_a_key_twice(tmp_path: Path) -> None:
    """Run r's tool reads the effect store file in the run's own process and closes it; another process
    then opens and closes the store (deleting its WAL), the tool applies its idempotent effect and the
    run's process is SIGKILLed before the journal records the result. The effect had gone into the
    deleted WAL: lost, and the resume applied the key again (two "applied" for one key). Proves: the
    store refuses the commit instead (rolled back; the run stops open, exit 6, one line naming
    ``store_wal_lost``), the resume sends the key and applies it once, and every effect the tool saw
    applied is in the store, once."""
    (tmp_path / "el_reads_store.py").write_text(_TOOL_MODULE)
    journal, fx, log = str(tmp_path / "j.db"), str(tmp_path / "fx.db"), tmp_path / "calls.log"
    path = ":".join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "EL_STORE": fx, "EL_LOG": str(log)}
    env |= {"EL_ASKED": str(tmp_path / "asked"), "EL_GO": str(tmp_path / "go")}
    plan = {
        "run_id": "r",
        "adapters": {"psp": {"type": "test.reads-store", "idempotent": True}},
        "steps": [{"id": "charge", "adapter": "psp", "args": {"cents": 500}}],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    run = [sys.executable, "-m", "effectlog", "run", str(tmp_path / "plan.json"), "--journal", journal]
    run += ["--effects", fx, "--adapters", "el_reads_store:ADAPTERS"]

    first = subprocess.Popen(
        run, env={**env, "EL_KILL": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "asked").exists():
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    visitor = subprocess.run([sys.executable, "-c", _VISITOR, fx], env=env, capture_output=True, text=True, timeout=60)
    assert 0 == visitor.returncode, visitor.stderr
    (tmp_path / "go").touch()
    _, first_err = first.communicate(timeout=120)
    again = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
    calls = log.read_text().split() if log.exists() else []
    store = EffectStore(fx, read_only=True)
    effects = [row.idempotency_key for row in store.rows(run_id="r")]
    store.close()

    assert calls.count("applied") == len(effects) == len(set(effects)), (calls, effects, again.stderr)
    assert ExitStatus.LOCKED == first.returncode, first_err
    assert "Traceback" not in first_err
    assert first_err.strip().splitlines()[-1].startswith("effectlog: store_wal_lost: "), first_err
    assert (0, ["applied"]) == (again.returncode, calls), again.stderr
