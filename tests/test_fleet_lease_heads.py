"""A SQLite lease's batches that carry no transition chain onto the head its last committed batch left
(``FleetSqliteJournal``) instead of reading the run's head, and only when the lease check in their own
transaction found no event after that head: an old token with a remembered head is still refused (in
another process too), and a row another writer added is read and chained onto, never forked from.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import journal_tamper
from effectlog.chain import GENESIS
from effectlog.errors import EventConflict, StaleLease
from effectlog.fleet import open_store
from effectlog.fleet.contract import noop_plan, requested, started
from effectlog.fleet.model import Lease
from effectlog.fleet.recovery import recover_once
from effectlog.fleet.sqlite_store import SqliteFleetStore
from effectlog.journal.sqlite_schema import LAYOUTS

HEAD_READ = LAYOUTS[2].head.split("?")[0]  # the journal's head read (schema v2), up to its parameter


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteFleetStore]:
    s = open_store(str(tmp_path / "fleet.db"))
    assert isinstance(s, SqliteFleetStore)
    yield s
    s.close()


def chained(store: SqliteFleetStore, run_id: str) -> list[int]:
    """The run's seqs, after checking each record's hash links it to the one before (else AssertionError)."""
    journal = store.journal()
    head, seqs = GENESIS, []
    for record in journal.read(run_id):
        assert journal.chain.link(head, record.body) == record.hash, (run_id, record.seq)
        head = record.hash
        seqs.append(record.seq)
    return seqs


def lease_of(store: SqliteFleetStore, key: str, run_id: str, lease_s: float = 60.0, runner: str = "r1") -> Lease:
    request = store.submit("heads", key, noop_plan(run_id), requeue_backoff_s=0.0).request
    lease = store.claim(request.request_id, runner, lease_s)
    assert lease is not None
    return lease


def test_a_leases_later_batches_read_no_head_and_chain_onto_the_last(store: SqliteFleetStore) -> None:
    """Three batches under one lease: the first reads the run's head, the other two do not (one statement
    each fewer), and the run's chain links every record to the one before."""
    lease = lease_of(store, "k", "run-1")
    journal = store.leased_journal(lease)
    db: sqlite3.Connection = store.journal().connection
    reads: list[str] = []
    db.set_trace_callback(lambda sql: reads.append(sql) if sql.startswith(HEAD_READ) else None)
    try:
        journal.append([started("run-1")])
        journal.append([requested("run-1", 2, idempotent=True)])
        journal.append([requested("run-1", 3, "s1", idempotent=True)])
    finally:
        db.set_trace_callback(None)
    assert (1, [1, 2, 3]) == (len(reads), chained(store, "run-1"))


def test_a_remembered_head_is_not_used_by_another_lease_of_the_run(store: SqliteFleetStore) -> None:
    """Token 1 wrote seq 1 and remembers its head; it expired, and token 2 of the same run (same process,
    same journal) wrote seq 2. Token 1's next batch is refused by its lease check (nothing written), and
    token 2's next batch reads no stale head: it chains onto its own seq 2."""
    old = lease_of(store, "k", "run-1", lease_s=0.2, runner="old")
    store.leased_journal(old).append([started("run-1")])
    while store.now() <= old.expires_at:
        pass
    recover_once(store)
    new = store.claim(old.request_id, "new", 60.0)
    assert new is not None
    assert (2, 1) == (new.token, new.base_seq)
    new_journal = store.leased_journal(new)
    new_journal.append([requested("run-1", 2, idempotent=True)])
    with pytest.raises(StaleLease):
        store.leased_journal(old).append([requested("run-1", 2, "s1", idempotent=True)])
    new_journal.append([requested("run-1", 3, "s1", idempotent=True)])
    assert [1, 2, 3] == chained(store, "run-1")


def test_a_head_moved_by_another_writer_refuses_the_batch_and_forks_nothing(store: SqliteFleetStore) -> None:
    """Were a remembered head stale while the lease is current (a writer that went around the lease; here
    a row put in by hand), the run's primary key refuses the batch's first row: ``EventConflict``, as with
    the head read, nothing of the batch is written, and seq 3 is the row that was there."""
    lease = lease_of(store, "k", "run-1")
    journal = store.leased_journal(lease)
    journal.append([started("run-1")])
    journal.append([requested("run-1", 2, idempotent=True)])  # remembered: seq 2
    db = journal_tamper.rows(store.journal().connection)  # (a temp view on this connection)
    db.execute(
        "INSERT INTO ev (run_id, seq, step_id, phase, attempt, body, hash)"
        " SELECT run_id, 3, 'other', phase, 9, body, ? FROM ev WHERE run_id = 'run-1' AND seq = 2",
        (b"x" * 32,),
    )
    with pytest.raises(EventConflict):
        journal.append([requested("run-1", 3, "s1", idempotent=True), requested("run-1", 4, "s2", idempotent=True)])
    rows = db.execute("SELECT seq, step_id FROM ev WHERE run_id = 'run-1' ORDER BY seq").fetchall()
    assert [(1, ""), (2, "s0"), (3, "other")] == rows


def test_a_row_another_writer_chained_on_is_read_and_chained_onto(store: SqliteFleetStore) -> None:
    """A lease is not its run's only writer: a person's approval is written while the attempt waits. After
    the lease's batch (seq 2, remembered) another writer chained seq 3 onto it; the lease's next batch finds
    an event after the remembered head in its lease check, reads the head, and chains seq 4 onto seq 3."""
    lease = lease_of(store, "k", "run-1")
    journal = store.leased_journal(lease)
    journal.append([started("run-1")])
    journal.append([requested("run-1", 2, idempotent=True)])  # remembered: seq 2
    db, chain = journal_tamper.rows(store.journal().connection), store.journal().chain
    body, head = db.execute("SELECT body, hash FROM ev WHERE run_id = 'run-1' AND seq = 2").fetchone()
    db.execute(  # the other writer's row: a copy of seq 2's body, chained onto seq 2 as the journal does
        "INSERT INTO ev (run_id, seq, step_id, phase, attempt, body, hash) VALUES ('run-1', 3, 'other', 'x', 9, ?, ?)",
        (bytes(body), chain.link(bytes(head), bytes(body))),
    )
    journal.append([requested("run-1", 4, "s1", idempotent=True)])
    assert [1, 2, 3, 4] == chained(store, "run-1")


RIVAL = """
import json, sys
import msgspec
from effectlog.errors import StaleLease
from effectlog.fleet import open_store
from effectlog.fleet.contract import requested, started
from effectlog.fleet.model import Lease
store = open_store(sys.argv[1])
raw = json.loads(sys.stdin.readline())
journals = [store.leased_journal(msgspec.convert(x, Lease)) for x in raw]
if sys.argv[2] == "old":  # each old lease writes seq 1 while current, so it remembers that head
    for journal in journals:
        journal.append([started(journal.lease.run_id)])
print("ready", flush=True)
moment = json.loads(sys.stdin.readline())
out = {}
for i, journal in enumerate(journals):
    run_id = journal.lease.run_id
    while store.now() < moment + 0.02 * i:  # both processes append seq 2 of the same run at the same moment
        pass
    try:
        journal.append([requested(run_id, 2, sys.argv[2], idempotent=True)])
        if sys.argv[2] == "new":
            journal.append([requested(run_id, 3, "more", idempotent=True)])  # on the head seq 2 left
        out[journal.lease.request_id] = "appended"
    except StaleLease:
        out[journal.lease.request_id] = "refused"
store.close()
print(json.dumps(out), flush=True)
"""


def rival(url: str, which: str, leases: list[dict[str, object]]) -> subprocess.Popen[str]:
    """A RIVAL process holding ``leases``, once it said ready (the old one: after writing seq 1 of each run)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", RIVAL, url, which], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(json.dumps(leases) + "\n")
    proc.stdin.flush()
    assert "ready" == proc.stdout.readline().strip()
    return proc


def test_two_processes_an_old_token_with_a_remembered_head_and_a_new_one_only_the_new_one_wins(
    store: SqliteFleetStore, tmp_path: Path
) -> None:
    """For each of 20 requests, process A holds token 1 and wrote seq 1 under it (so it remembers that
    head); token 1 expired, was taken back, and process B holds token 2. Both append seq 2 at the same
    moment. A is refused every time, whichever commits first; B writes seq 2 and 3, and each run's
    chain links every record to the one before."""
    url = str(tmp_path / "fleet.db")
    old = [lease_of(store, f"k{i}", f"run-{i}", lease_s=2.0, runner="old") for i in range(20)]

    def fields(lease: Lease) -> dict[str, object]:
        return {f: getattr(lease, f) for f in lease.__struct_fields__}

    a = rival(url, "old", [fields(x) for x in old])
    while store.now() <= max(x.expires_at for x in old):
        pass
    recover_once(store)
    new = [store.claim(x.request_id, "new", 60.0) for x in old]
    assert [(2, 1)] * 20 == [(x.token, x.base_seq) for x in new if x is not None]
    b = rival(url, "new", [fields(x) for x in new if x is not None])
    moment = store.now() + 0.5
    for proc in (a, b):
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(moment) + "\n")
        proc.stdin.flush()
    outcomes = [json.loads(proc.communicate(timeout=120)[0].strip().splitlines()[-1]) for proc in (a, b)]
    assert [0, 0] == [a.returncode, b.returncode]

    expected = ({str(x.request_id): "refused" for x in old}, {str(x.request_id): "appended" for x in old})
    assert expected == tuple(outcomes)
    assert [[1, 2, 3]] * 20 == [chained(store, x.run_id) for x in old]
