"""Racing PROCESSES on the claim path: the one-transaction pick-and-lease (``claim_next``) never leases a
request twice, on SQLite and on PostgreSQL.

Real child processes (each its own store, connections and pool), started together behind a
barrier on their pipes, drain one queue; the proof is read back from the store's history.
"""

from __future__ import annotations

from collections import Counter

from effectlog.fleet import FleetStore
from effectlog.fleet.contract import noop_plan
from fleet_kit import together

pytest_plugins = ["pg_fixture", "fleet_kit"]

CLAIMER = """
import json, sys
from effectlog.fleet import open_store
store = open_store(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
calls, got = 0, []
while True:
    calls += 1
    batch = store.claim_next(sys.argv[2], ["gpu"], 300.0, limit=int(sys.argv[3]))
    if not batch:
        break
    got += [(lease.request_id, lease.token) for lease in batch]
store.close()
print(json.dumps({"calls": calls, "got": got}), flush=True)
"""


def race(store_url: str, processes: int, limit: int) -> list[dict[str, list[list[int]] | int]]:
    out: list[dict[str, list[list[int]] | int]] = together(
        [[CLAIMER, store_url, f"claimer-{i}", str(limit)] for i in range(processes)]
    )
    return out


def test_racing_claimer_processes_lease_each_request_exactly_once(store_url: str, store: FleetStore) -> None:
    """Four processes claim 60 requests (a third of them needing a capability nobody offers) at once.

    Proves: every request the claimers can run is leased exactly once, with token 1, by
    one process (the leases the processes report, the attempts and the history agree);
    the others stay queued; no claim that came back with a lease was a retry of another.
    """
    needs = [["gpu"], [], ["gpu", "cuda"]]
    for i in range(60):
        store.submit("race", f"k{i}", noop_plan(f"run-{i}"), needs[i % 3])
    fit = {i + 1 for i in range(60) if i % 3 != 2}

    results = race(store_url, processes=4, limit=3)

    won = Counter(int(rid) for r in results for rid, _ in r["got"])  # type: ignore[union-attr]
    assert dict.fromkeys(sorted(fit), 1) == dict(sorted(won.items()))
    assert {1} == {int(token) for r in results for _, token in r["got"]}  # type: ignore[union-attr]
    leases = Counter(h.request_id for h in store.history() if h.transition == "lease")
    assert dict.fromkeys(sorted(fit), 1) == dict(sorted(leases.items()))
    states = {v.request_id: v.state for v in store.requests()}
    assert {"leased"} == {states[rid] for rid in fit}
    assert {"queued"} == {state for rid, state in states.items() if rid not in fit}


def test_many_capacity_one_claims_by_six_processes_lease_each_request_once(store_url: str, store: FleetStore) -> None:
    """Six processes drain 300 requests one lease per call (as capacity-1 runners and the bench claim),
    a fifth of them needing a capability nobody offers, on a store whose tables have no statistics
    yet (PostgreSQL: the claim's planner settings and its queued-attempts index, schema v3).

    Proves: each request that fits is leased exactly once, by one process, with token 1, and its
    history has one lease; the ones that do not fit stay queued.
    """
    for i in range(300):
        store.submit("many", f"k{i}", noop_plan(f"run-{i}"), ["cuda"] if i % 5 == 4 else [])
    fit = {i + 1 for i in range(300) if i % 5 != 4}

    results = race(store_url, processes=6, limit=1)

    won = Counter(int(rid) for r in results for rid, _ in r["got"])  # type: ignore[union-attr]
    assert dict.fromkeys(sorted(fit), 1) == dict(sorted(won.items()))
    assert {1} == {int(token) for r in results for _, token in r["got"]}  # type: ignore[union-attr]
    leases = Counter(h.request_id for h in store.history() if h.transition == "lease")
    assert dict.fromkeys(sorted(fit), 1) == dict(sorted(leases.items()))
    states = {v.request_id: v.state for v in store.requests()}
    assert {"queued"} == {state for rid, state in states.items() if rid not in fit}
