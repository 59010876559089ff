"""A PostgreSQL fleet store opened for existing requests (``create=False``: ``requests``, ``operator``, the
console) on a database that is not one is refused and left exactly as it was: no schema, no table, no
function appears in it (a mistyped ``--store`` URL naming another application's database).

Real PostgreSQL server (tests/pg_fixture.py), real psycopg connections; the CLI as a real process.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from effectlog.errors import ExitStatus, JournalUnreadable
from hardening_kit import effectlog

pytest_plugins = ["pg_fixture"]


def _objects(url: str) -> list[tuple[Any, ...]]:
    """Every schema, relation and function outside the server's own catalogs."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(
            "SELECT 'schema', nspname FROM pg_namespace"
            " WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'"
            " UNION ALL SELECT 'relation', n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'"
            " UNION ALL SELECT 'function', n.nspname || '.' || p.proname FROM pg_proc p JOIN pg_namespace n"
            " ON n.oid = p.pronamespace WHERE n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'"
            " ORDER BY 1, 2"
        ).fetchall()


def test_opening_a_postgres_database_without_the_fleet_for_its_requests_changes_nothing(pg_url: str) -> None:
    """``PostgresFleetStore(url, create=False)`` on an empty database: ``JournalUnreadable`` naming it, and
    the database holds the same objects as before (before, the journal's schema was made first)."""
    from effectlog.fleet.postgres_store import PostgresFleetStore

    before = _objects(pg_url)
    with pytest.raises(JournalUnreadable, match="not a fleet store"):
        PostgresFleetStore(pg_url, create=False)
    assert before == _objects(pg_url)


@pytest.mark.parametrize("argv", [["requests"], ["operator", "fail", "--request", "1", "--reason", "r", "--by", "a"]])
def test_a_fleet_command_on_a_postgres_url_that_is_no_fleet_store_refuses_and_creates_nothing(
    pg_url: str, tmp_path: Any, argv: list[str]
) -> None:
    """The CLI, a real process: exit 2, one line naming the store, and the database unchanged."""
    before = _objects(pg_url)
    done = effectlog(*argv, "--store", pg_url, cwd=tmp_path)
    assert (ExitStatus.BAD_INPUT, "") == (done.returncode, done.stdout), done.stderr
    assert 1 == len(done.stderr.splitlines()), done.stderr
    assert "not a fleet store" in done.stderr
    assert before == _objects(pg_url)


def test_a_fleet_store_whose_journal_schema_was_dropped_is_refused_not_given_a_new_journal(pg_url: str) -> None:
    """A fleet store whose journal schema is gone (``DROP SCHEMA effectlog CASCADE``, a partial restore),
    opened for its requests: refused naming the loss, and no new, empty journal schema is made beside
    requests whose runs' history it would not hold."""
    from effectlog.fleet.postgres_store import PostgresFleetStore

    PostgresFleetStore(pg_url).close()  # a real fleet store: both schemas
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP SCHEMA effectlog CASCADE")
    before = _objects(pg_url)
    with pytest.raises(JournalUnreadable, match="without its journal"):
        PostgresFleetStore(pg_url, create=False)
    assert before == _objects(pg_url)
