"""The SQLite claim picks the oldest fitting queued request through an index, not by sorting every queued row
inside the file's one write transaction (the cost that grew with runner processes: each one's page cache is
stale after another's commit, so every claim re-read every queued row)."""

from __future__ import annotations

import sqlite3
from collections import Counter
from pathlib import Path

from effectlog.fleet import open_store
from effectlog.fleet.contract import noop_plan
from effectlog.fleet.sqlite_journal import SQLITE
from effectlog.fleet.sqlstore import _PICK
from fleet_kit import together


def _plan(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        rows = db.execute("EXPLAIN QUERY PLAN " + SQLITE.sql(_PICK + " {claim}"), (0.0, "[]", 1)).fetchall()
    return [str(r[3]) for r in rows]


def test_the_claims_pick_walks_the_queue_index_without_sorting(tmp_path: Path) -> None:
    """SQLite's plan for the pick searches the (state, request_id) index and uses no temporary sort."""
    path = tmp_path / "fleet.db"
    open_store(str(path)).close()
    plan = _plan(path)
    assert "SEARCH a USING INDEX fleet_attempts_queue (state=?)" == plan[0], plan
    assert [] == [step for step in plan if "TEMP B-TREE" in step]


def test_a_store_without_the_queue_index_gets_it_when_opened_and_claims_oldest_first(tmp_path: Path) -> None:
    """A store made before the index (dropped here) gets it back at the next open, and claims still take the
    oldest queued request first."""
    path = tmp_path / "fleet.db"
    with open_store(str(path)) as store:
        for i in range(3):
            store.submit("s", f"k{i}", noop_plan(f"run-{i}"))
    with sqlite3.connect(path) as db:
        db.execute("DROP INDEX fleet_attempts_queue")
    assert "TEMP B-TREE" in " ".join(_plan(path))
    with open_store(str(path)) as store:
        assert [1, 2, 3] == [store.claim_next(f"r{i}", [], 60.0, 1)[0].request_id for i in range(3)]
    assert [] == [step for step in _plan(path) if "TEMP B-TREE" in step]


# A claimer as a capacity-1 runner claims, until the queue is empty; it counts how often it had to wait for
# the writers' gate and how often it was the lobby's head (the waiter that polls the gate).
CLAIMER = """
import json, sys
from effectlog.fleet import open_store
from effectlog.journal import filelocks

waits, heads = [0], [0]
take, wait = filelocks._take, filelocks.SharedFile._wait_gate

def counted_take(fd, packed):
    got = take(fd, packed)
    heads[0] += got and packed == filelocks._LOBBY_WRLCK
    return got

def counted_wait(self, where, timeout_s):
    waits[0] += 1
    return wait(self, where, timeout_s)

filelocks._take, filelocks.SharedFile._wait_gate = counted_take, counted_wait
store = open_store(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
got = []
while batch := store.claim_next(sys.argv[2], [], 300.0, 1):
    got += [(lease.request_id, lease.token) for lease in batch]
store.close()
print(json.dumps({"got": got, "waits": waits[0], "heads": heads[0]}), flush=True)
"""


def test_four_processes_racing_through_the_gates_lobby_lease_each_of_400_requests_once(tmp_path: Path) -> None:
    """Four claimer processes drain 400 queued requests one claim at a time, as capacity-1 runners do, all
    at once, waiting at the writers' gate and its lobby.

    Proves: every request is leased exactly once, with token 1 (what the claimers report, the
    attempts and the history agree), and the race was real: the claimers waited at the gate and
    went through the lobby.
    """
    path = str(tmp_path / "fleet.db")
    with open_store(path) as store:
        for i in range(400):
            store.submit("race", f"k{i}", noop_plan(f"run-{i}"))
    out = together([[CLAIMER, path, f"claimer-{i}"] for i in range(4)])

    everyone = list(range(1, 401))
    won = Counter(int(rid) for r in out for rid, _ in r["got"])
    assert dict.fromkeys(everyone, 1) == dict(sorted(won.items()))
    assert {1} == {int(token) for r in out for _, token in r["got"]}
    with open_store(path) as store:
        leases = Counter(h.request_id for h in store.history() if h.transition == "lease")
        states = {v.request_id: v.state for v in store.requests()}
    assert dict.fromkeys(everyone, 1) == dict(sorted(leases.items()))
    assert {"leased"} == set(states.values())
    assert (True, True) == (sum(r["waits"] for r in out) > 0, sum(r["heads"] for r in out) > 0), out
