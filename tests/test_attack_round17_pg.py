"""Attack round 17 against PostgreSQL ownership: what the owner renewal does when the server ends every
session of the owner's process at once (a failover, a server restart, an operator's sweep of idle
sessions), while the owner is inside a long tool call.

Real server (``pg_url``), real journals, real ``pg_terminate_backend``.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from effectlog.errors import RunOwned
from effectlog.journal.postgres import PostgresJournal

pytest_plugins = ["pg_fixture"]

pytestmark = pytest.mark.postgres


def _end_sessions(url: str, names: tuple[str, ...]) -> int:
    """End every session of this database whose application_name is one of ``names``, as a failover or
    an operator's ``pg_terminate_backend`` sweep does; how many were ended."""
    with psycopg.connect(url, autocommit=True, application_name="attack17-admin") as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name = ANY(%s) AND pid <> pg_backend_pid()",
            (list(names),),
        ).fetchall()
    return len(rows)


def test_a_claim_outlives_the_end_of_every_session_of_its_process_during_a_long_call(pg_url: str) -> None:
    """The renewal is what keeps a run its owner's once the claim connection ended (G9): "a failover, a
    firewall that dropped the idle socket". A failover (or a restart, or a sweep of idle sessions) ends
    the pooled connections too, and the renewal took one per turn from the pool: a broken one failed, was
    dropped, and the claim waited a third of the lease for the next turn. With four idle connections in
    the pool, four turns failed in a row, the claim ran out while the owner was still inside its call, and
    another process took the run over (it would then ask the lookup, "not applied", and send the step
    again). Proves: with every session of the owner's process ended, the next renewal still lands (on a
    new connection), and another claim is refused at every try until twice the lease has passed."""
    with PostgresJournal(pg_url, owner_lease_s=1.5, pool_size=4) as journal:
        pool = journal._pool
        with pool.connection(), pool.connection(), pool.connection(), pool.connection():
            pass  # four connections idle in the pool, as after any burst of reads and appends
        claim = journal.claim("failover")
        assert 5 == _end_sessions(pg_url, ("effectlog-journal", "effectlog-owner"))
        taken: list[bool] = []
        with PostgresJournal(pg_url) as other:
            deadline = time.monotonic() + 3.0  # the owner inside a tool call, twice its lease
            while time.monotonic() < deadline and not taken:
                try:
                    other.release(other.claim("failover"))
                    taken.append(True)
                except RunOwned:
                    time.sleep(0.02)
        journal.release(claim)
    assert [] == taken
