"""What a fleet attempt no longer redoes, and that skipping it changes nothing it answers.

A fleet attempt redid per attempt work whose answer it already had, and wrote its carried
transitions one statement at a time (issue 18). These tests pin what the shortcuts must
still give: the same owner for this process (a forked child its own) with a fresh claim
time, and the same rows as transitions written one by one.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

from effectlog.events import RunCompleted
from effectlog.fleet.contract import noop_plan, requested, started
from effectlog.fleet.sqlite_store import SqliteFleetStore
from effectlog.journal.ownership import new_owner


def test_a_leased_journal_names_this_process_as_owner_with_the_time_of_each_claim(tmp_path: Path) -> None:
    """Two attempts' claims name what ``new_owner`` names (pid, host, node, start ticks, runner), each with
    its own claim time; a child forked after them names itself, not its parent."""
    with SqliteFleetStore(tmp_path / "fleet.db") as store:
        for i in range(2):
            store.submit("c", f"k{i}", noop_plan(f"run-{i}"))
        leases = [store.claim_next("r1", [], 60.0, 1)[0] for _ in range(2)]
        fresh = new_owner("runner", "r1")
        first = store.leased_journal(leases[0]).claim(leases[0].run_id).owner
        second = store.leased_journal(leases[1]).claim(leases[1].run_id).owner
        for owner in (first, second):
            assert (fresh.pid, fresh.host, fresh.node, fresh.started, "r1", "runner") == (
                owner.pid, owner.host, owner.node, owner.started, owner.runner, owner.kind,
            )  # fmt: skip
        assert fresh.since <= first.since <= second.since

        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its claim must name its own pid and start
            try:
                owner = store.leased_journal(leases[0]).claim(leases[0].run_id).owner
                mine = new_owner("runner", "r1")
                os.write(write_fd, json.dumps([owner.pid, owner.started, mine.pid, mine.started]).encode())
            finally:
                os._exit(0)
        os.close(write_fd)
        with os.fdopen(read_fd, "rb") as pipe:
            child = json.loads(pipe.read())
        os.waitpid(pid, 0)
        assert child[0] == child[2] != first.pid
        assert child[1] == child[3]


def _rows_after_a_run(path: Path, together: bool) -> list[list[tuple[object, ...]]]:
    """A run's attempt driven as a runner drives it (prepare and start ride in its first batch, its success
    in run.completed's), then every fleet row but the clock's; ``together``: the store's choice to write
    consecutive transitions in one statement each."""
    with SqliteFleetStore(path) as store:
        store.owner_moves_together = together  # the store's own switch, on a real store
        request = store.submit("c", "k", noop_plan("run-0")).request
        lease = store.claim(request.request_id, "r1", 60.0)
        assert lease is not None
        journal = store.leased_journal(lease)
        journal.succeed_on_completion = True
        journal.defer("prepare", "prepare")
        journal.defer("start", "start")
        journal.append([started(lease.run_id), requested(lease.run_id, 2, idempotent=True)])
        journal.append([RunCompleted(run_id=lease.run_id, seq=3, ts=0)])
        assert "succeeded" == journal.finished
    with sqlite3.connect(path) as db:
        return [
            db.execute(
                "SELECT id, attempt_id, request_id, transition, event, actor, actor_name, from_state, to_state,"
                " reason, detail FROM fleet_history ORDER BY id"
            ).fetchall(),
            db.execute(
                "SELECT attempt_id, op_key, digest, result FROM fleet_operations ORDER BY attempt_id, op_key"
            ).fetchall(),
            db.execute("SELECT attempt_id, state, runner_id, fencing_token FROM fleet_attempts").fetchall(),
            db.execute("SELECT request_id, finished_at IS NOT NULL FROM fleet_requests").fetchall(),
        ]


def test_transitions_written_together_leave_the_rows_written_one_by_one_leave(tmp_path: Path) -> None:
    """prepare and start carried in one batch, written in three statements instead of six, leave the same
    history (order, ids, states from and to), operation records and attempt row as one at a time."""
    one_by_one = _rows_after_a_run(tmp_path / "a.db", together=False)
    together = _rows_after_a_run(tmp_path / "b.db", together=True)
    assert one_by_one == together
    transitions = [(row[3], row[7], row[8]) for row in together[0]]
    assert [
        ("lease", "queued", "leased"), ("prepare", "leased", "preparing"),
        ("start", "preparing", "running"), ("succeed", "running", "succeeded"),
    ] == transitions  # fmt: skip
