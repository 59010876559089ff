"""``reconcile --from-ledger`` reads the run's effect store as evidence: a row's absence there means "not
applied", and the next run makes the effect again. So the store it reads must be the run's own store as it
is now, not a copy of it that is older than the effect: a backup beside it (same store id, since it is a
copy), or a store rolled back under the run (it lacks effects the journal recorded as done). Each test
makes the effect for real in ``effects.db`` through a tool whose reply is lost, offers the stale file as
evidence, and counts the effects in the store after the next run. Real ``python -m effectlog`` processes,
real SQLite files (copies made with SQLite's own backup, so they are consistent databases).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from console_kit import LOST_REPLY
from effectlog.errors import ExitStatus
from hardening_kit import effectlog, last_line


class World:
    """A directory with the tools module (``test.lost-reply``: the effect made in the store, then the reply
    lost), a journal ``j.db`` and the effect store ``fx.db``."""

    def __init__(self, root: Path) -> None:
        self.dir = root
        (root / "fresh_tools.py").write_text(LOST_REPLY)

    def el(self, *argv: str) -> tuple[int, str]:
        done = effectlog(*argv, cwd=self.dir, env={"PYTHONPATH": str(self.dir)})
        assert "Traceback" not in done.stderr, done.stderr
        return done.returncode, done.stderr

    def run(self, plan: str) -> int:
        return self.el("run", plan, "--journal", "j.db", "--effects", "fx.db", "--adapters", "fresh_tools:ADAPTERS")[0]

    def plan(self, name: str, run_id: str, steps: list[tuple[str, str]]) -> str:
        import json

        adapters = {kind.replace(".", "-"): {"type": kind, "version": "1", "idempotent": False} for _, kind in steps}
        plan_steps = [{"id": step, "adapter": kind.replace(".", "-")} for step, kind in steps]
        body = {"run_id": run_id, "adapters": adapters, "steps": plan_steps}
        (self.dir / name).write_text(json.dumps(body))
        return name

    def copy(self, source: str, target: str) -> None:
        """A consistent copy of an effect store, as an operator's backup is (SQLite's backup API)."""
        src, dst = sqlite3.connect(self.dir / source), sqlite3.connect(self.dir / target)
        try:
            src.backup(dst)
        finally:
            src.close()
            dst.close()

    def effects(self, run_id: str, step_id: str) -> int:
        db = sqlite3.connect(f"file:{self.dir / 'fx.db'}?mode=ro", uri=True)
        try:
            row = db.execute("SELECT count(*) FROM effects WHERE run_id = ? AND step_id = ?", (run_id, step_id))
            return int(row.fetchone()[0])
        finally:
            db.close()

    def journal_bytes(self) -> bytes:
        return b"".join((self.dir / f"j.db{s}").read_bytes() for s in ("", "-wal") if (self.dir / f"j.db{s}").exists())


def test_a_backup_of_the_run_s_store_made_before_the_effect_is_no_evidence_that_it_is_absent(tmp_path: Path) -> None:
    """An earlier run made ``fx.db`` and an operator backed it up (``fx-backup.db``, the same store id). Then
    ``pay`` charged in ``fx.db`` and its reply was lost (uncertain, exit 3). ``reconcile --from-ledger
    fx-backup.db`` found no row for the charge: "not applied", and the next run charged again. Proves: a
    store file that is not the one at the run's pinned location is refused as evidence (exit 5, one line
    naming the file and the pinned one, the journal unchanged, the step still uncertain), and the charge
    happens once."""
    world = World(tmp_path)
    assert 0 == world.run(world.plan("first.json", "first", [("note", "effects.control")]))
    world.copy("fx.db", "fx-backup.db")
    pay = world.plan("pay.json", "pay-1", [("pay", "test.lost-reply")])
    assert 3 == world.run(pay)
    before = world.journal_bytes()

    status, stderr = world.el(
        "reconcile", "--journal", "j.db", "--run-id", "pay-1", "--step", "pay", "--from-ledger", "fx-backup.db"
    )
    again = world.run(pay)

    line = last_line(stderr)
    assert (ExitStatus.CONFLICT, True, True) == (status, "fx-backup.db" in line, "fx.db" in line), stderr
    assert (before, 3, 1) == (world.journal_bytes(), again, world.effects("pay-1", "pay"))


def test_a_store_that_lacks_an_effect_the_journal_recorded_as_done_is_no_evidence(tmp_path: Path) -> None:
    """``note`` charged and was confirmed; a backup was taken before it; ``pay`` then charged and its reply
    was lost. The backup is copied over ``fx.db`` (a restore in place: the same file, the same store id) and
    ``reconcile --from-ledger fx.db`` asked: the charge's row is gone, "not applied". Proves: a store that
    lacks the row of a step the journal recorded as applied through it is older than the journal and refused
    as evidence (exit 5, one line naming the step whose row is missing), nothing written, the step still
    uncertain."""
    world = World(tmp_path)
    assert 0 == world.run(world.plan("first.json", "first", [("warm", "effects.control")]))
    world.copy("fx.db", "fx-before.db")
    pay = world.plan("pay.json", "pay-2", [("note", "effects.control"), ("pay", "test.lost-reply")])
    assert 3 == world.run(pay)
    world.copy("fx-before.db", "fx.db")  # in place: the same file and name, its rows rolled back
    before = world.journal_bytes()

    status, stderr = world.el(
        "reconcile", "--journal", "j.db", "--run-id", "pay-2", "--step", "pay", "--from-ledger", "fx.db"
    )

    line = last_line(stderr)
    assert (ExitStatus.CONFLICT, True) == (status, "'note'" in line), stderr
    assert before == world.journal_bytes()
