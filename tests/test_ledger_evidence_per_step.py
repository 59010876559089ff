"""The run's effect store is evidence only for the steps whose adapter writes it.

A run pins its effect store, and since this change also which of its adapters asked for
that store when built (``run.started.store_adapters``). ``reconcile --from-ledger`` for a
step of another adapter (a user's tool that keeps its own records) is refused, nothing
written: the store's lack of a row says nothing about an effect made elsewhere, and a
"not applied" read there would start a new attempt and make the effect twice. Real SQLite
files; the CLI is run as a process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from effectlog import events as ev
from effectlog.errors import BadInput, ExitStatus
from effectlog.journal import open_journal
from effectlog.plan import Plan, parse_plan
from effectlog.runtime import Runtime
from lifecycle_adapters import ADAPTERS


def plan() -> Plan:
    """pay: a user's tool that never answers (its effect, if any, is in its own records); log: the store's."""
    return parse_plan(
        json.dumps(
            {
                "run_id": "pay-1",
                "adapters": {
                    "api": {"type": "test.unsure", "idempotent": False},
                    "ledger": {"type": "effects.control", "version": "1", "idempotent": False},
                },
                "steps": [
                    {"id": "pay", "adapter": "api", "args": {"cents": 500}},
                    {"id": "log", "adapter": "ledger", "args": {"n": 1}},
                ],
            }
        ).encode()
    )


def first_event(journal: Path) -> ev.RunStarted:
    j = open_journal(str(journal), writer=False)
    try:
        started = ev.decode(next(iter(j.read("pay-1"))).body)
    finally:
        j.close()
    assert isinstance(started, ev.RunStarted)
    return started


def test_a_run_records_which_adapters_write_its_effect_store(tmp_path: Path) -> None:
    """run.started names `ledger` (effects.control asked for the store when built), not `api`."""
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        assert "stopped" == rt.run(plan()).state
    assert ("ledger",) == first_event(journal).store_adapters


def test_the_store_is_no_evidence_for_a_step_whose_adapter_never_writes_it(tmp_path: Path) -> None:
    """`pay` is uncertain; its reconcile from the run's own store is refused (exit 2), nothing written.

    Both through the API (BadInput) and the CLI (one line naming --from-ledger and the
    adapter). The step stays uncertain and the journal is unchanged.
    """
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        assert "stopped" == rt.run(plan()).state
        before = rt.load("pay-1")
        with pytest.raises(BadInput, match="'api' does not write the effect store"):
            rt.reconcile_from_ledger("pay-1", "pay")
        assert before == rt.load("pay-1")
    done = subprocess.run(
        [sys.executable, "-m", "effectlog", "reconcile", "--journal", str(journal), "--run-id", "pay-1",
         "--step", "pay", "--from-ledger", str(effects)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert (ExitStatus.BAD_INPUT, 1) == (done.returncode, len(done.stderr.strip().splitlines())), done.stderr
    assert "--from-ledger" in done.stderr
    with Runtime(str(journal), effects=effects, adapters=ADAPTERS) as rt:
        assert (before, "uncertain") == (rt.load("pay-1"), rt.load("pay-1").step("pay").state)  # type: ignore[union-attr]
