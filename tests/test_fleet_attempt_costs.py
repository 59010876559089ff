"""What a fleet attempt no longer redoes, and that skipping it changes nothing it answers.

A fleet attempt redid per attempt work whose answer it already had (issue 18). These tests
pin what the shortcuts must still give: the same owner for this process (a forked child its
own) with a fresh claim time.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from effectlog.fleet.contract import noop_plan
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
