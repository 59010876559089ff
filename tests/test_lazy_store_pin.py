"""An adapter that opens the effect store when it is first called, not in its factory (a common way
to open a resource: on first use). The run pinned a store only when a factory opened one, so such a
run pinned none: SIGKILLed after its idempotent effect, resumed with ``--effects`` naming ANOTHER
store, it sent the step's key again into a store that had never seen it, and the effect happened
twice (once per store), with ``verify`` ok. A run now pins the store it is given whether or not a
factory opened it, so the resume against another store is refused as any other store is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from effectlog.adapters.effects import EffectStore
from effectlog.errors import ExitStatus
from test_lifecycle import effect_counts

# An idempotent tool over the built-in effect store, opened on its first call. It logs each call and
# SIGKILLs its own process after the effect when EL_KILL is set (effect committed, result not written).
_LAZY_MODULE = """
import os, signal


class LazyKiller:
    def __init__(self, ctx):
        self.ctx = ctx

    def invoke(self, request):
        receipt = self.ctx.effect_store().apply_idempotent(request)
        with open(os.environ["EL_LOG"], "a") as log:
            log.write("replayed\\n" if receipt.data.get("replayed") else "applied\\n")
        if os.environ.get("EL_KILL"):
            os.kill(os.getpid(), signal.SIGKILL)
        return receipt


ADAPTERS = {"test.lazy-killer": lambda decl, ctx: LazyKiller(ctx)}
"""


def _runner(tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "el_lazy.py").write_text(_LAZY_MODULE)
    path = ":".join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "EL_LOG": str(tmp_path / "calls.log")}
    plan = {
        "run_id": "pay-1",
        "adapters": {"psp": {"type": "test.lazy-killer", "idempotent": True}},
        "steps": [{"id": "charge", "adapter": "psp", "args": {"cents": 500}}],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))

    def run(effects: str, **extra: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "effectlog", "run", str(tmp_path / "plan.json"), "--journal"]
        argv += [str(tmp_path / "j.db"), "--effects", str(tmp_path / effects), "--adapters", "el_lazy:ADAPTERS"]
        return subprocess.run(argv, env={**env, **extra}, capture_output=True, text=True, timeout=120)

    return run


def test_a_resume_against_another_store_is_refused_when_the_adapter_opens_its_store_lazily(tmp_path: Path) -> None:
    """Proves: the run pinned ``fx.db`` though no factory opened it; the resume given ``other.db`` is
    refused (exit 5, one line naming the pinned store), nothing sent there; resumed with ``fx.db`` the
    key is answered from the store: one effect in all."""
    run = _runner(tmp_path)
    EffectStore(tmp_path / "other.db").close()
    assert -9 == run("fx.db", EL_KILL="1").returncode
    other = run("other.db")
    own = run("fx.db")
    assert (ExitStatus.CONFLICT, 1) == (other.returncode, len(other.stderr.strip().splitlines())), other.stderr
    assert "fx.db" in other.stderr
    assert (0, ["applied", "replayed"]) == (own.returncode, (tmp_path / "calls.log").read_text().split())
    assert ({("pay-1", "charge"): 1}, {}) == (effect_counts(tmp_path / "fx.db"), effect_counts(tmp_path / "other.db"))
