"""A SQLite runner claims its next request in the transaction that makes its attempt succeed
(``LeasedJournal.claim_after``, ``SqliteFleetStore.claim_within``): one commit per run fewer.

These tests prove the claim stays exclusive when it rides in another transaction: runner
processes whose claims ride in their runs' last appends, racing a plain claimer process over
one queue, lease every request exactly once; and a carried claim commits or rolls back with
the append it rides in.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from effectlog.errors import StaleLease
from effectlog.events import RunCompleted
from effectlog.fleet import open_store
from effectlog.fleet.contract import noop_plan, requested, started, wait_past
from effectlog.fleet.sqlite_store import SqliteFleetStore
from fleet_kit import together

RUNNER = """
import json, sys
from effectlog.fleet import open_store
from effectlog.fleet.runner import Runner, RunnerConfig
store = open_store(sys.argv[1])
carried = [0]
claim_after = Runner._claim_after

def counted(self, store, tx):
    leases = claim_after(self, store, tx)
    carried[0] += len(leases)
    return leases

Runner._claim_after = counted
runner = Runner(RunnerConfig(store=sys.argv[1], runner_id=sys.argv[2], exit_when_idle=True, recover=False), store,
                log=open("/dev/null", "w"))
print("ready", flush=True)
sys.stdin.readline()
runner.serve()
store.close()
print(json.dumps({"ended": runner.ended, "carried": carried[0]}), flush=True)
"""

CLAIMER = """
import json, sys, time
from effectlog.fleet import open_store
store = open_store(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
got = []
while batch := store.claim_next(sys.argv[2], [], 300.0, 1):
    got += [lease.request_id for lease in batch]
    time.sleep(0.01)  # pace: a claim as often as a runner's, so most requests are left to the runners
store.close()
print(json.dumps({"got": got}), flush=True)
"""


def test_runners_claiming_in_their_runs_last_appends_and_a_plain_claimer_lease_each_request_once(
    tmp_path: Path,
) -> None:
    """Three runner processes and one claimer process drain 150 two-step requests at once. Every request
    is leased exactly once, with token 1; each one the claimer did not take succeeded; and runners did
    claim in their runs' last transactions (each counts the leases it claimed so), so the race included
    carried claims."""
    path = str(tmp_path / "fleet.db")
    with open_store(path) as store:
        for i in range(150):
            store.submit("carry", f"k{i}", noop_plan(f"run-{i}", steps=2))
    out = together([[RUNNER, path, f"runner-{i}"] for i in range(3)] + [[CLAIMER, path, "claimer"]])

    everyone = list(range(1, 151))
    with open_store(path) as store:
        history = store.history()
        states = {v.request_id: v.state for v in store.requests()}
    leases = [h for h in history if h.transition == "lease"]
    assert dict.fromkeys(everyone, 1) == dict(sorted(Counter(h.request_id for h in leases).items()))
    assert {1} == {h.detail["token"] for h in leases}
    claimed = set(out[-1]["got"])
    assert {r: "succeeded" for r in everyone if r not in claimed} == {
        r: s for r, s in states.items() if r not in claimed
    }
    assert 150 - len(claimed) == sum(o["ended"] for o in out[:-1])
    assert sum(o["carried"] for o in out[:-1]) > 0


def test_a_carried_claim_commits_with_the_append_it_rides_in_and_not_without_it(tmp_path: Path) -> None:
    """The claim rides in the batch that records ``run.completed``: when the batch is refused (its lease
    was taken back), nothing is claimed; when it commits, the next request is leased in that commit."""
    with SqliteFleetStore(tmp_path / "fleet.db") as store:
        first, second = (store.submit("c", f"k{i}", noop_plan(f"run-{i}")).request for i in range(2))
        lease = store.claim(first.request_id, "r", 60.0)
        assert lease is not None
        journal = store.leased_journal(lease)
        journal.succeed_on_completion = True
        journal.claim_after = lambda tx: store.claim_within(tx, "r", [], 60.0)
        journal.defer("prepare", "prepare")
        journal.defer("start", "start")
        journal.append([started(lease.run_id), requested(lease.run_id, 2, idempotent=True)])
        done = RunCompleted(run_id=lease.run_id, seq=3, ts=0)

        other = store.leased_journal(lease)  # the same lease, once the store made it stale
        store.advance(lease, "escalate", op_key="final", reason="taken back for this test")
        other.succeed_on_completion = True
        other.claim_after = journal.claim_after
        with pytest.raises(StaleLease):
            other.append([done])
        assert ([], "queued") == (other.claimed, store.request(second.request_id).state)

    with SqliteFleetStore(tmp_path / "fleet2.db") as store:
        first, second = (store.submit("c", f"k{i}", noop_plan(f"run-{i}")).request for i in range(2))
        lease = store.claim(first.request_id, "r", 60.0)
        assert lease is not None
        journal = store.leased_journal(lease)
        journal.succeed_on_completion = True
        journal.claim_after = lambda tx: store.claim_within(tx, "r", [], 60.0)
        journal.defer("prepare", "prepare")
        journal.defer("start", "start")
        journal.append([started(lease.run_id)])
        journal.append([RunCompleted(run_id=lease.run_id, seq=2, ts=0)])
        assert "succeeded" == journal.finished
        assert [second.request_id] == [x.request_id for x in journal.claimed]
        assert "leased" == store.request(second.request_id).state


KILLED_AFTER_CARRY = """
import sys, time
from effectlog.fleet import open_store
from effectlog.fleet.leased_journal import LeasedJournal
from effectlog.fleet.runner import Runner, RunnerConfig
append = LeasedJournal.append

def append_then_stop(self, events):
    records = append(self, events)
    if self.claimed:  # committed: the next request is this runner's now
        print("claimed", self.claimed[0].request_id, flush=True)
        while True:  # the test's SIGKILL ends this
            time.sleep(3600)
    return records

LeasedJournal.append = append_then_stop
store = open_store(sys.argv[1])
config = RunnerConfig(store=sys.argv[1], runner_id="doomed", lease_s=1.0, heartbeat_s=0.3, recover=False)
Runner(config, store, log=open("/dev/null", "w")).serve()
"""


def test_a_runner_killed_right_after_a_carried_claim_leaves_the_request_to_be_recovered_and_run_once(
    tmp_path: Path,
) -> None:
    """A runner SIGKILLed just after the commit that ended one run and claimed the next: the claimed request
    is in the state a plain claim followed by a death leaves (leased, nothing in its journal), so when the
    lease runs out the recovery service re-queues it (lost: no step was requested) and another runner runs
    it once; the first request's success stands."""
    path = str(tmp_path / "fleet.db")
    with open_store(path) as store:
        first, second = (
            store.submit("kill", f"k{i}", noop_plan(f"run-{i}", steps=2), requeue_backoff_s=0.0).request
            for i in range(2)
        )
    doomed = subprocess.Popen([sys.executable, "-c", KILLED_AFTER_CARRY, path], stdout=subprocess.PIPE, text=True)
    assert doomed.stdout is not None
    assert f"claimed {second.request_id}" == doomed.stdout.readline().strip()
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=60)
    with open_store(path) as store:
        assert ("succeeded", "leased") == (
            store.request(first.request_id).state,
            store.request(second.request_id).state,
        )
        assert 0 == store.journal().head(second.run_id)[0]
        wait_past(store, store.now() + 1.0)  # the lease (1 s, no heartbeat since the kill) has run out
    survivor = subprocess.run(
        [sys.executable, "-m", "effectlog", "runner", "--store", path, "--exit-when-idle", "--lease-s", "5"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 0 == survivor.returncode, survivor.stderr
    with open_store(path) as store:
        attempts = [(a.attempt_no, a.state, a.token) for a in store.attempts(second.request_id)]
        assert [(1, "lost", 1), (2, "succeeded", 2)] == attempts
        assert "succeeded" == store.request(first.request_id).state
        assert 8 == store.journal().head(second.run_id)[0]  # one whole two-step run: seq 1 to 8
