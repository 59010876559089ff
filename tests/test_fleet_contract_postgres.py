"""The fleet contract suite on PostgreSQL, against a real throwaway server."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from effectlog.fleet.contract import FleetContract, started
from effectlog.fleet.postgres_journal import POSTGRES, FleetPostgresJournal
from effectlog.fleet.postgres_store import PostgresFleetStore
from effectlog.journal.postgres_schema import SCHEMA
from effectlog.testing import JournalContract

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.postgres


class PostgresFleetBackend:
    """Stores on one database (each with its own pool, as on separate hosts); ``raw_sql`` talks to the server."""

    def __init__(self, url: str) -> None:
        self.url = url

    def open(self) -> PostgresFleetStore:
        return PostgresFleetStore(self.url, pool_size=2)

    def raw_sql(self, sql: str) -> Any:
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(POSTGRES.sql(sql))
            return cur.fetchall() if cur.description else cur.rowcount


class TestPostgresFleet(FleetContract):
    @pytest.fixture
    def fleet_backend(self, pg_url: str) -> PostgresFleetBackend:
        return PostgresFleetBackend(pg_url)


class JournalBackend:
    def __init__(self, url: str) -> None:
        self.url = url

    def open(self) -> FleetPostgresJournal:
        return FleetPostgresJournal(self.url)

    def raw_sql(self, sql: str) -> Any:
        with psycopg.connect(self.url, autocommit=True, options=f"-c search_path={SCHEMA}") as conn:
            cur = conn.execute(sql)
            return cur.fetchall() if cur.description else cur.rowcount


class TestFleetPostgresJournal(JournalContract):
    """The journal class the PostgreSQL fleet writes through keeps every journal guarantee."""

    @pytest.fixture
    def backend(self, pg_url: str) -> JournalBackend:
        return JournalBackend(pg_url)


def test_the_fleet_tables_share_the_journals_database(pg_url: str) -> None:
    """One database: schema effectlog holds the runs, their checkpoint segments and their owners;
    schema effectlog_fleet the requests."""
    with PostgresFleetStore(pg_url) as store:
        store.journal().append([started("run-1")])
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT schemaname, tablename FROM pg_tables WHERE schemaname LIKE 'effectlog%' ORDER BY 1, 2"
        ).fetchall()
    assert [
        ("effectlog", "checkpoints"),
        ("effectlog", "events"),
        ("effectlog", "meta"),
        ("effectlog", "owners"),
        ("effectlog_fleet", "attempts"),
        ("effectlog_fleet", "history"),
        ("effectlog_fleet", "meta"),
        ("effectlog_fleet", "operations"),
        ("effectlog_fleet", "requests"),
    ] == rows


def test_many_stores_opening_a_fresh_database_at_once_create_the_schema_once(pg_url: str) -> None:
    """Runners on several hosts starting together: every open succeeds."""
    import threading

    opened: list[object] = []

    def go() -> None:
        try:
            opened.append(PostgresFleetStore(pg_url, pool_size=1))
        except Exception as exc:
            opened.append(exc)

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [True] * 4 == [isinstance(s, PostgresFleetStore) for s in opened], opened
    for s in opened:
        assert isinstance(s, PostgresFleetStore)
        s.close()


def test_a_v1_store_is_migrated_and_its_requests_get_the_default_requeue_policy(pg_url: str) -> None:
    """A PostgreSQL store written before requeue limits (fleet schema v1, a queued request) opens, is migrated,
    and its request gets the default limit and no backoff; the migrated store's claim (schema v3's
    ``claim_next`` function over the queued-attempts index) leases the request written before either existed."""
    from effectlog.fleet import limits
    from effectlog.fleet.postgres_journal import FleetPostgresJournal
    from effectlog.fleet.postgres_store import DDL, FLEET_SCHEMA_VERSION

    FleetPostgresJournal(pg_url).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for sql in DDL:
            conn.execute(sql)
        conn.execute("INSERT INTO effectlog_fleet.meta (key, value) VALUES ('schema_version', '1')")
        conn.execute(
            "INSERT INTO effectlog_fleet.requests (scope, idem_key, fingerprint, run_id, plan, requires, created_at,"
            " current_attempt) VALUES ('s', 'k', 'f', 'run-old', '{}', '[]', 1.0, 1)"
        )
        conn.execute(
            "INSERT INTO effectlog_fleet.attempts (request_id, attempt_no, state, created_at)"
            " VALUES (1, 1, 'queued', 1)"
        )
    with PostgresFleetStore(pg_url) as store:
        view = store.request(1)
        assert (limits.DEFAULT_MAX_REQUEUES, 0, None) == (view.max_requeues, view.requeues, view.not_before)
        assert [(1, True)] == [(c.request_id, c.due) for c in store.candidates(10)]
        assert [(1, 1)] == [(lease.request_id, lease.token) for lease in store.claim_next("runner", [], 30.0)]
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT value FROM effectlog_fleet.meta WHERE key = 'schema_version'").fetchone()
    assert (str(FLEET_SCHEMA_VERSION),) == row


def _plan_nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", []) for n in _plan_nodes(child))]


def test_a_claim_reads_the_head_of_a_long_queue_not_all_of_it(pg_url: str) -> None:
    """With 400 requests queued on tables without statistics (as after a burst of submissions), a claim's
    statement reads one queued attempt, not the queue.

    Proves, from the server's own executed plan of the claim (auto_explain of the statement inside
    ``claim_next``, as run): no plan node on the attempts table returns more than a few rows (the
    plan before schema v3 read all 400 queued attempts and sorted them to lease one), and the lease
    is the oldest request's.
    """
    from effectlog.fleet.contract import noop_plan
    from effectlog.fleet.postgres_store import CLAIM_NEXT

    with PostgresFleetStore(pg_url) as store:
        for i in range(400):
            store.submit("long", f"k{i}", noop_plan(f"run-{i}"))
        first = store.claim_next("warm", [], 30.0)
    plans: list[dict[str, Any]] = []
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("LOAD 'auto_explain'")
        for setting in (
            "log_min_duration = 0",
            "log_nested_statements = on",
            "log_analyze = on",
            "log_format = json",
            "log_level = notice",
        ):
            conn.execute(f"SET auto_explain.{setting}")
        conn.add_notice_handler(
            lambda d: (
                plans.append(json.loads((d.message_primary or "").split("plan:", 1)[1]))
                if "plan:" in (d.message_primary or "")
                else None
            )
        )
        rows = conn.execute(CLAIM_NEXT, ("[]", 1, "runner", 30.0)).fetchall()
    inner = [p for p in plans if "pick AS" in p["Query Text"]]
    assert 1 == len(inner)
    on_attempts = [n for n in _plan_nodes(inner[0]["Plan"]) if n.get("Relation Name") == "attempts"]
    assert on_attempts
    assert max(int(n["Actual Rows"]) for n in on_attempts) <= 2, on_attempts
    assert ([1], [2]) == ([lease.request_id for lease in first], [int(r[1]) for r in rows])
