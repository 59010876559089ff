"""Racing PROCESSES on the append path: a fenced append (with the transitions it carries) against the
recovery service taking the same lease back, on SQLite and on PostgreSQL.

One process holds twenty leases that run out a few milliseconds apart and appends each run's
``run.started`` + ``step.requested`` (carrying the attempt's deferred ``prepare`` and ``start``)
from 30 ms before its lease runs out to 3 ms after; another runs recovery passes all the while. The lease check and the
recovery's read of the journal are each in the transaction of their write, so for every request
exactly one of them wins, and the loser changes nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from effectlog.fleet import FleetStore
from effectlog.fleet.contract import noop_plan

pytest_plugins = ["pg_fixture", "fleet_kit"]

APPENDER = """
import json, sys, time
from effectlog.errors import StaleLease
from effectlog.fleet import open_store
from effectlog.fleet.contract import requested, started
from effectlog.fleet.model import Lease
import msgspec
store = open_store(sys.argv[1])
print("ready", flush=True)
leases = [msgspec.convert(x, Lease) for x in json.loads(sys.stdin.readline())]
out = {}
for i, lease in enumerate(sorted(leases, key=lambda l: l.expires_at)):
    journal = store.leased_journal(lease)
    if sys.argv[2] == "carry":
        journal.defer("prepare", "prepare")
        journal.defer("start", "start")
    while store.now() < lease.expires_at - 0.03 + 0.003 * (i % 12):  # from 30 ms before to 3 ms after
        pass
    try:
        journal.append([started(lease.run_id), requested(lease.run_id, 2, idempotent=True)])
        out[lease.request_id] = "appended"
    except StaleLease:
        out[lease.request_id] = "refused"
store.close()
print(json.dumps(out), flush=True)
"""

RECOVERER = """
import sys, time
from effectlog.fleet import open_store
from effectlog.fleet.recovery import recover_once
store = open_store(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    recover_once(store)
store.close()
print("{}", flush=True)
"""


def start(code: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert "ready" == proc.stdout.readline().strip()
    return proc


@pytest.mark.parametrize("batch", ["carry", "plain"])
def test_a_fenced_append_and_a_recovery_racing_in_two_processes_never_both_win(
    store_url: str, store: FleetStore, batch: str
) -> None:
    """For each of 20 leases: either the append won (events, prepare and start recorded; the recovery then
    found a step requested and sent the attempt to an operator, never re-queued it), or the recovery won
    (the attempt lost and re-queued; no event, no prepare, no start from that lease). ``plain``: the batch
    carries no transition, so on SQLite the lease check is the WHERE of the operation record's INSERT
    (``SqliteLeaseFence``) instead of a SELECT of its own."""
    appender = start(APPENDER, store_url, batch)
    recoverer = start(RECOVERER, store_url, "3.0")
    leases = []
    for i in range(20):
        request = store.submit("race", f"k{i}", noop_plan(f"run-{i}"), requeue_backoff_s=0.0).request
        lease = store.claim(request.request_id, "appender", 0.5 + 0.05 * i)
        assert lease is not None
        leases.append(lease)
    payload = json.dumps([{f: getattr(x, f) for f in x.__struct_fields__} for x in leases])
    for proc, line in ((appender, payload), (recoverer, "go")):
        assert proc.stdin is not None
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
    outcome = {int(k): v for k, v in json.loads(appender.communicate(timeout=120)[0].strip().splitlines()[-1]).items()}
    recoverer.communicate(timeout=120)
    assert (0, 0) == (appender.returncode, recoverer.returncode)

    for lease in leases:
        first = next(a for a in store.attempts(lease.request_id) if a.attempt_no == 1)
        moved = [h.transition for h in store.history(lease.request_id) if h.attempt_id == first.attempt_id]
        head = store.journal().head(lease.run_id)[0]
        if outcome[lease.request_id] == "appended":
            carried = ["prepare", "start"] if batch == "carry" else []
            assert (2, ["lease", *carried, "expire"]) == (head, moved), lease.request_id
            assert "needs_operator" == first.state
        else:
            assert (0, ["lease", "lose"]) == (head, moved), lease.request_id
            assert "lost" == first.state
    assert 20 == len(outcome)


RIVAL = """
import json, sys
import msgspec
from effectlog.errors import StaleLease
from effectlog.fleet import open_store
from effectlog.fleet.contract import started
from effectlog.fleet.model import Lease
store = open_store(sys.argv[1])
print("ready", flush=True)
moment, raw = json.loads(sys.stdin.readline())
out = {}
for i, lease in enumerate(msgspec.convert(x, Lease) for x in raw):
    while store.now() < moment + 0.02 * i:  # both processes append the same run at the same moment
        pass
    try:
        store.leased_journal(lease).append([started(lease.run_id)])
        out[lease.request_id] = "appended"
    except StaleLease:
        out[lease.request_id] = "refused"
store.close()
print(json.dumps(out), flush=True)
"""


def test_two_processes_appending_a_run_at_once_under_an_old_and_a_new_token_only_the_new_one_wins(
    store_url: str, store: FleetStore
) -> None:
    """For each of 20 requests, the first lease (token 1) expired and was taken back, the second (token 2) is
    current; two processes append the same ``run.started`` (the same bytes) at the same moment, one under
    each. The old token is refused every time, whichever commits first (on SQLite through the lease check
    in the operation record's INSERT, ``SqliteLeaseFence``, then the full check), and the run holds one event."""
    from effectlog.fleet.recovery import recover_once

    old, new = [], []
    for i in range(20):
        request = store.submit("rival", f"k{i}", noop_plan(f"rival-{i}"), requeue_backoff_s=0.0).request
        first = store.claim(request.request_id, "old", 0.05)
        assert first is not None
        old.append(first)
    wait_past_all = max(lease.expires_at for lease in old)
    while store.now() <= wait_past_all:
        pass
    recover_once(store)
    for lease in old:
        second = store.claim(lease.request_id, "new", 60.0)
        assert second is not None
        assert 2 == second.token
        new.append(second)
    procs = [start(RIVAL, store_url), start(RIVAL, store_url)]
    moment = store.now() + 0.5
    for proc, leases in zip(procs, (old, new), strict=True):
        assert proc.stdin is not None
        proc.stdin.write(json.dumps([moment, [{f: getattr(x, f) for f in x.__struct_fields__} for x in leases]]) + "\n")
        proc.stdin.flush()
    outcomes = [json.loads(proc.communicate(timeout=120)[0].strip().splitlines()[-1]) for proc in procs]
    assert [0, 0] == [proc.returncode for proc in procs]

    expected = ({str(x.request_id): "refused" for x in old}, {str(x.request_id): "appended" for x in new})
    assert expected == tuple(outcomes)
    assert [1] * 20 == [store.journal().head(x.run_id)[0] for x in new]
