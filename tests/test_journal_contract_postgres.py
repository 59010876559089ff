"""The journal contract suite, and PostgreSQL-only guarantees, against a real throwaway server."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from effectlog import events as ev
from effectlog.chain import GENESIS, Chain
from effectlog.errors import (
    BadInput,
    Conflict,
    EventConflict,
    IntegrityError,
    JournalLocked,
    JournalUnreadable,
    StorageError,
)
from effectlog.journal import SCHEMA_VERSION, open_journal
from effectlog.journal.postgres import PostgresJournal
from effectlog.journal.postgres_schema import RUN_LOCK_CLASS, SCHEMA
from effectlog.journal.sidecars import masked
from effectlog.testing import JournalContract, sample_run

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.postgres

T0 = 1_700_000_000_000_000_000


class PostgresBackend:
    """Opens journals on one database; ``raw_sql`` talks to the server directly."""

    def __init__(self, url: str) -> None:
        self.url = url

    def open(self) -> PostgresJournal:
        return PostgresJournal(self.url)

    def raw_sql(self, sql: str) -> Any:
        with psycopg.connect(self.url, autocommit=True, options=f"-c search_path={SCHEMA}") as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else cur.rowcount


class TestPostgresJournal(JournalContract):
    @pytest.fixture
    def backend(self, pg_url: str) -> PostgresBackend:
        return PostgresBackend(pg_url)


@pytest.fixture
def backend(pg_url: str) -> PostgresBackend:
    return PostgresBackend(pg_url)


@pytest.fixture
def journal(pg_url: str) -> Iterator[PostgresJournal]:
    j = PostgresJournal(pg_url)
    yield j
    j.close()


def resumed(seq: int, pid: int, run_id: str = "run-1") -> ev.Event:
    """A repeatable event, so two writers can offer different bytes for the same seq."""
    return ev.RunResumed(run_id=run_id, seq=seq, ts=T0 + seq, pid=pid)


def assert_one_unforked_chain(journal: PostgresJournal, run_id: str) -> list[int]:
    """Seqs run 1..n without holes and every hash links to the one before; returns the seqs."""
    records = list(journal.read(run_id))
    prev = GENESIS
    for rec in records:
        assert journal.chain.link(prev, rec.body) == rec.hash
        prev = rec.hash
    seqs = [r.seq for r in records]
    assert list(range(1, len(records) + 1)) == seqs
    assert (len(records), prev) == journal.head(run_id)
    return seqs


def race(*actions: Callable[[], object]) -> list[object]:
    """Run the actions on threads released at the same instant; each result or exception, in order."""
    barrier = threading.Barrier(len(actions))
    results: list[object] = [None] * len(actions)

    def go(i: int, action: Callable[[], object]) -> None:
        barrier.wait()
        try:
            results[i] = action()
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=go, args=(i, a)) for i, a in enumerate(actions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


# -- two writers, one run ---------------------------------------------------------


def test_racing_writers_on_two_hosts_cannot_fork_a_run(pg_url: str) -> None:
    """Two journals (separate pools, as on two hosts) race for each next seq: one wins, one is refused."""
    a, b = PostgresJournal(pg_url), PostgresJournal(pg_url)
    try:
        a.append(sample_run()[:1])
        for seq in range(2, 32):
            results = race(lambda s=seq: a.append([resumed(s, pid=1)]), lambda s=seq: b.append([resumed(s, pid=2)]))
            failures = [r for r in results if isinstance(r, Exception)]
            assert 1 == len(failures), results
            assert isinstance(failures[0], Conflict | IntegrityError), failures[0]
        assert list(range(1, 32)) == assert_one_unforked_chain(a, "run-1")
    finally:
        a.close()
        b.close()


def test_the_same_event_from_two_writers_is_stored_once(pg_url: str) -> None:
    """A batch re-sent concurrently by two writers is recorded once; both get the same record back."""
    a, b = PostgresJournal(pg_url), PostgresJournal(pg_url)
    try:
        a.append(sample_run()[:1])
        for seq in range(2, 12):
            event = resumed(seq, pid=7)
            first, second = race(lambda e=event: a.append([e]), lambda e=event: b.append([e]))
            assert first == second
        assert 11 == len(assert_one_unforked_chain(b, "run-1"))
    finally:
        a.close()
        b.close()


def test_a_writer_waiting_for_the_run_lock_reads_the_head_after_it(pg_url: str, journal: PostgresJournal) -> None:
    """The head is read under the run lock: a writer blocked behind another sees its commit, not a stale head."""
    journal.append(sample_run()[:1])
    _, head_hash = journal.head("run-1")
    other = ev.encode(resumed(2, pid=1))
    with psycopg.connect(pg_url) as holder:  # another host, mid-append, holding the run's lock
        holder.execute(_LOCK_SQL, (RUN_LOCK_CLASS, "run-1"))
        holder.execute(
            f"INSERT INTO {SCHEMA}.events (run_id, seq, step_id, phase, attempt, body, hash)"
            " VALUES ('run-1', 2, '', 'run.resumed#2', 0, %s, %s)",
            (other, journal.chain.link(head_hash, other)),
        )
        outcome: list[object] = []
        waiter = threading.Thread(target=lambda: outcome.append(_try(journal.append, [resumed(2, pid=2)])))
        waiter.start()
        wait_until_a_session_waits_for_an_advisory_lock(pg_url, waiter)
        holder.commit()
    waiter.join()
    assert isinstance(outcome[0], EventConflict), outcome
    assert "a different event is already recorded" in str(outcome[0])  # found by the head read, not the PK
    assert other == next(iter(journal.read("run-1", after_seq=1))).body
    assert_one_unforked_chain(journal, "run-1")


def test_batches_over_several_runs_in_opposite_orders_do_not_deadlock(pg_url: str) -> None:
    """Run locks are taken in sorted order, so batches touching runs (a, b) and (b, a) never deadlock."""
    a, b = PostgresJournal(pg_url), PostgresJournal(pg_url)
    try:
        a.append([*sample_run("a")[:1], *sample_run("b")[:1]])
        for seq in range(2, 22):
            results = race(
                lambda s=seq: a.append([resumed(s, 1, "a"), resumed(s, 1, "b")]),
                lambda s=seq: b.append([resumed(s, 2, "b"), resumed(s, 2, "a")]),
            )
            assert 1 == sum(isinstance(r, Exception) for r in results), results
            assert all(isinstance(r, list | Conflict) for r in results), results
        for run_id in ("a", "b"):
            assert 21 == len(assert_one_unforked_chain(a, run_id))
    finally:
        a.close()
        b.close()


def test_a_writer_stuck_behind_a_held_run_lock_gets_journal_locked(pg_url: str) -> None:
    """A run lock held past lock_timeout surfaces as JournalLocked, not an endless wait."""
    journal = PostgresJournal(pg_url, lock_timeout_s=0.2)
    try:
        journal.append(sample_run()[:1])
        with psycopg.connect(pg_url) as holder:
            holder.execute(_LOCK_SQL, (RUN_LOCK_CLASS, "run-1"))
            with pytest.raises(JournalLocked):
                journal.append([resumed(2, pid=1)])
        journal.append([resumed(2, pid=1)])  # and once the lock is gone, the append goes through
    finally:
        journal.close()


def test_first_opens_racing_on_an_empty_database_migrate_once(pg_url: str) -> None:
    """Several writers opening a fresh database at the same moment all succeed, and the schema is made once."""
    opened = race(*[lambda: PostgresJournal(pg_url) for _ in range(4)])
    for j in opened:
        assert isinstance(j, PostgresJournal), j
        j.close()
    rows = PostgresBackend(pg_url).raw_sql("SELECT key, value FROM meta ORDER BY key")
    assert [("chain", "sha256"), ("schema_version", str(SCHEMA_VERSION))] == rows


# -- schema, chain and access ------------------------------------------------------


def test_a_newer_schema_is_refused(backend: PostgresBackend) -> None:
    """A journal written by a newer effectlog is JournalUnreadable, for writers and readers alike."""
    backend.open().close()
    backend.raw_sql(f"UPDATE meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema_version'")
    for writer in (True, False):
        with pytest.raises(JournalUnreadable, match="newer"):
            PostgresJournal(backend.url, writer=writer)


def test_a_database_with_foreign_tables_in_our_schema_is_refused(backend: PostgresBackend) -> None:
    """A schema that holds only some of our tables is not taken for a journal."""
    backend.raw_sql(f"CREATE SCHEMA {SCHEMA}; CREATE TABLE {SCHEMA}.events (x int)")
    with pytest.raises(JournalUnreadable, match="not an effectlog journal"):
        PostgresJournal(backend.url)


def test_a_reader_does_not_create_a_journal(pg_url: str) -> None:
    """writer=False on an empty database is JournalUnreadable and leaves the database untouched."""
    with pytest.raises(JournalUnreadable, match="needs a writer"):
        PostgresJournal(pg_url, writer=False)
    with psycopg.connect(pg_url) as conn:
        assert (None,) == conn.execute("SELECT to_regnamespace(%s)", (SCHEMA,)).fetchone()


def test_a_reader_reads_but_cannot_write(pg_url: str, journal: PostgresJournal) -> None:
    """A reader sees the events; append refuses, and its sessions are read-only at the server too."""
    journal.append(sample_run())
    reader = PostgresJournal(pg_url, writer=False)
    try:
        assert [r.body for r in journal.read("run-1")] == [r.body for r in reader.read("run-1")]
        with pytest.raises(StorageError, match="read-only"):
            reader.append([resumed(9, pid=1)])
        with reader._pool.connection() as conn, pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute(f"INSERT INTO {SCHEMA}.meta VALUES ('x', 'y')")
    finally:
        reader.close()


@pytest.mark.parametrize(
    ("created", "opened"),
    [(None, b"secret"), (b"secret", None), (b"secret", b"other")],
    ids=["plain-opened-keyed", "keyed-opened-plain", "keyed-opened-other-key"],
)
def test_a_journal_opened_with_another_chain_is_refused(
    pg_url: str, created: bytes | None, opened: bytes | None
) -> None:
    """The chain recorded in meta must match the one the journal is opened with, and a keyed journal's key
    fingerprint the key it is opened with (``wrong_key``, at open: tests/test_journal_key.py)."""
    PostgresJournal(pg_url, chain=Chain(created)).close()
    match = "the key given is not this journal's key" if created and opened else "journal chain is"
    with pytest.raises(JournalUnreadable, match=match):
        PostgresJournal(pg_url, chain=Chain(opened))


@pytest.mark.parametrize("sql", ["TRUNCATE events", "DELETE FROM events WHERE false"])
def test_truncate_and_empty_deletes_are_refused_too(backend: PostgresBackend, sql: str) -> None:
    """The append-only trigger is per statement: it covers TRUNCATE and deletes that match no row."""
    with backend.open() as journal:
        journal.append(sample_run())
        with pytest.raises(psycopg.errors.RaiseException, match="append-only"):
            backend.raw_sql(sql)
        assert 8 == len(list(journal.read("run-1")))


def test_runs_sort_by_code_point_whatever_the_database_collation(pg_cluster: Any) -> None:
    """runs() is sorted like Python's sorted(), even in a database whose collation puts 'a' before 'B'."""
    url = pg_cluster.create_database(options="TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'und'")
    with PostgresJournal(url) as journal:
        for run_id in ("b", "B", "a", "A", "é"):
            journal.append(sample_run(run_id, steps=0))
        assert sorted(["b", "B", "a", "A", "é"]) == journal.runs()


# -- errors at the boundary -----------------------------------------------------


def test_an_unreachable_server_is_a_storage_error_without_the_password(pg_url: str) -> None:
    """A refused connection is StorageError, and neither it nor location shows the password."""
    from effectlog.pgcluster import free_port

    url = f"postgresql://someone:hunter2@127.0.0.1:{free_port()}/nowhere"
    with pytest.raises(StorageError) as caught:
        PostgresJournal(url)
    assert "hunter2" not in str(caught.value)
    assert "postgresql://someone:***@127.0.0.1" in str(caught.value)


def test_a_malformed_url_is_bad_input() -> None:
    """A URL libpq cannot parse is BadInput, before any connection is tried."""
    with pytest.raises(BadInput):
        PostgresJournal("postgresql://host/db?no_such_option=1")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pw@h:5/d", "postgresql://u:***@h:5/d"),
        ("postgresql://u@h/d", "postgresql://u@h/d"),
        ("postgres://:pw@h/d", "postgres://:***@h/d"),
    ],
)
def test_redact_masks_only_the_password(url: str, shown: str) -> None:
    """Locations and messages carry the URL with its password replaced by ***."""
    assert shown == masked(url)


def test_open_journal_dispatches_postgres_urls(pg_url: str) -> None:
    """open_journal() returns a PostgresJournal for a postgresql:// URL."""
    journal = open_journal(pg_url)
    try:
        assert isinstance(journal, PostgresJournal)
    finally:
        journal.close()


def test_a_dedup_conflict_names_the_seq_already_holding_it(journal: PostgresJournal) -> None:
    """The same (step, phase, attempt) at another seq is EventConflict naming the stored seq."""
    history = sample_run()
    journal.append(history[:4])
    dup = ev.StepEffected(run_id="run-1", seq=5, ts=2, step_id="s0", receipt={"n": 0})
    with pytest.raises(EventConflict, match="at seq 3") as caught:
        journal.append([dup])
    assert ("run-1", 5, "s0") == (caught.value.run_id, caught.value.seq, caught.value.step_id)


def test_a_dedup_conflict_inside_one_batch_is_refused_whole(journal: PostgresJournal) -> None:
    """Two events with the same (step, phase, attempt) in one batch: the batch is refused and nothing is kept."""
    history = sample_run()
    journal.append(history[:2])
    again = ev.StepEffected(run_id="run-1", seq=4, ts=2, step_id="s0", receipt={"n": 1})
    with pytest.raises(EventConflict, match="at seq 3"):
        journal.append([history[2], again])
    assert 2 == journal.head("run-1")[0]


_LOCK_SQL = "SELECT pg_advisory_xact_lock(%s, hashtext(%s))"


def wait_until_a_session_waits_for_an_advisory_lock(url: str, waiter: threading.Thread) -> None:
    """Poll pg_locks until some session is queued on an advisory lock; fail if the waiter finished instead."""
    with psycopg.connect(url, autocommit=True) as watcher:
        while waiter.is_alive():
            row = watcher.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND classid = %s",
                (RUN_LOCK_CLASS,),
            ).fetchone()
            if row and row[0] == 1:
                return
            time.sleep(0.01)
    pytest.fail("the append finished without waiting for the run lock")


def _try(fn: Callable[..., object], *args: object) -> object:
    try:
        return fn(*args)
    except Exception as exc:
        return exc
