"""A fenced PostgreSQL append chains onto the head its journal last saw, without reading the head
(``PostgresJournal._fenced_in_one``): BEGIN, the run's lock, ONE statement (lease check, operation
record, insert), COMMIT. These tests prove a stale cached head can never fork the chain, lose an
event or let two writers both win a seq: the primary key ``(run_id, seq)`` refuses the row, the
whole transaction rolls back, and the head is then read under the lock as for any append.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from effectlog.chain import GENESIS, Chain
from effectlog.errors import EventConflict, StaleLease
from effectlog.fleet import FleetStore, open_store
from effectlog.fleet.contract import noop_plan, requested, started, wait_past
from effectlog.fleet.model import Lease
from effectlog.fleet.postgres_journal import FleetPostgresJournal

pytest_plugins = ["pg_fixture"]

RACER = """
import json, random, sys
import msgspec
from effectlog.errors import EffectlogError
from effectlog.fleet import open_store
from effectlog.fleet.contract import requested
from effectlog.fleet.model import Lease
url, name, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
store = open_store(url)
journal = store.journal()
print("ready", flush=True)
lease = msgspec.convert(json.loads(sys.stdin.readline()), Lease)
rng = random.Random(name)
won, refused, believed = [], 0, 2
while believed <= total:
    n = min(rng.randint(1, 3), total - believed + 1)
    batch = [requested(lease.run_id, s, step=f"{name}-{s}") for s in range(believed, believed + n)]
    try:
        records = journal.append_fenced(batch, lease)
    except EffectlogError:
        refused += 1
        believed = journal.head(lease.run_id)[0] + 1  # the head now; this journal's cached one stays stale
        continue
    won += [[r.seq, r.body.hex()] for r in records]
    believed += n
store.close()
print(json.dumps({"won": won, "refused": refused}), flush=True)
"""


@pytest.fixture
def store(pg_url: str) -> Iterator[FleetStore]:
    opened = open_store(pg_url)
    try:
        yield opened
    finally:
        opened.close()


def _lease(store: FleetStore, run_id: str, lease_s: float = 60.0) -> Lease:
    request = store.submit("cache", run_id, noop_plan(run_id)).request
    lease = store.claim(request.request_id, "cacher", lease_s)
    assert lease is not None
    return lease


def _chain_ok(store: FleetStore, run_id: str) -> list[tuple[int, bytes]]:
    """The run's stored (seq, body) rows, after checking seqs are 1..n and every hash links to the one before."""
    chain, prev, rows = Chain(), GENESIS, []
    for record in store.journal().read(run_id):
        assert len(rows) + 1 == record.seq
        assert chain.link(prev, record.body) == record.hash, record.seq
        prev = record.hash
        rows.append((record.seq, record.body))
    return rows


def test_two_processes_appending_the_same_run_under_one_lease_never_both_win_a_seq(
    pg_url: str, store: FleetStore
) -> None:
    """Two processes, each with its own journal (its own cached head), append 1-3 event batches to one run
    under the same lease as fast as they can, each taking the head again after a refusal. Every seq of the
    run is won by exactly one of them, with the bytes it reports; the chain links end to end; nothing
    reported as written is missing; and refusals happened (a cached head went stale)."""
    lease = _lease(store, "run-race")
    store.journal().append_fenced([started("run-race")], lease)
    total = 150
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, pg_url, name, str(total)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert "ready" == proc.stdout.readline().strip()
    payload = json.dumps({f: getattr(lease, f) for f in lease.__struct_fields__})
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(payload + "\n")
        proc.stdin.flush()
    outs = [json.loads(proc.communicate(timeout=300)[0].strip().splitlines()[-1]) for proc in procs]
    assert [0, 0] == [proc.returncode for proc in procs]

    stored = _chain_ok(store, "run-race")
    won = sorted((int(seq), bytes.fromhex(body)) for out in outs for seq, body in out["won"])
    assert total == len(stored)
    assert stored[1:] == won  # each seq after run.started won once, by whoever reports it, with its bytes
    # The race happened: some cached head went stale and was refused. Which process wins how many seqs is
    # up to the scheduler (on a loaded machine one may win them all while the other is refused each time).
    assert sum(out["refused"] for out in outs) > 0, outs


def test_a_stale_cached_head_is_refused_by_the_key_and_the_append_then_reads_the_head(
    pg_url: str, store: FleetStore
) -> None:
    """Journal A appends seq 1 (its cached head), journal B appends seq 2-3; A's different seq 2 is then
    refused (EventConflict, nothing written, no operation recorded), A's copy of B's batch is the same
    bytes (a no-op returning the stored records), and A's seq 4 chains onto B's seq 3."""
    lease = _lease(store, "run-stale")
    a = FleetPostgresJournal(pg_url)
    b = FleetPostgresJournal(pg_url)
    try:
        a.append_fenced([started("run-stale")], lease)
        theirs = [requested("run-stale", 2, step="b2"), requested("run-stale", 3, step="b3")]
        b.append_fenced(theirs, lease)
        with pytest.raises(EventConflict):
            a.append_fenced([requested("run-stale", 2, step="a2")], lease)
        assert 3 == len(_chain_ok(store, "run-stale"))
        assert [r.hash for r in b.read("run-stale", 1)] == [r.hash for r in a.append_fenced(theirs, lease)]
        a.append_fenced([requested("run-stale", 4, step="a4")], lease)
        assert [1, 2, 3, 4] == [seq for seq, _ in _chain_ok(store, "run-stale")]
    finally:
        a.close()
        b.close()


def test_an_expired_lease_cannot_append_on_the_cached_path(pg_url: str, store: FleetStore) -> None:
    """A journal that appended under a lease (so its next append takes the one-statement path) is refused
    with StaleLease once the lease has run out, and the run's head does not move."""
    lease = _lease(store, "run-fenced", lease_s=1.0)
    journal = FleetPostgresJournal(pg_url)
    try:
        journal.append_fenced([started("run-fenced")], lease)
        wait_past(store, lease.expires_at)
        with pytest.raises(StaleLease):
            journal.append_fenced([requested("run-fenced", 2)], lease)
        assert 1 == store.journal().head("run-fenced")[0]
    finally:
        journal.close()
