"""Round 16 against PostgreSQL owner renewal: cases the renewal's own tests did not try.

Real server (``pg_url``), real journals; the only thing steered is when the renewal thread runs.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import psycopg
import pytest

from effectlog.errors import BadInput, RunOwned
from effectlog.journal.ownership import decode_owner, encode_owner
from effectlog.journal.postgres import PostgresJournal
from effectlog.journal.postgres_schema import OWNER_RENEWED, SCHEMA
from hardening_kit import cli_env
from lock_watch import PAUSE_S, SIGN_S, WatchedLock, wait_done_or_kept_waiting

pytest_plugins = ["pg_fixture"]

RENEWER = "effectlog-owner-renewal"


def _renewed(url: str, run_id: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(OWNER_RENEWED, (run_id,)).fetchone()
    return bool(row and row[2])


class _HeldRenewal:
    """The journal's pool, as the renewal thread sees it: its first checkout waits until ``go``, as one
    does when the pool's connections are all busy (the renewal already chose the claims it renews)."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.waiting = threading.Event()
        self.go = threading.Event()
        self.done = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    @contextlib.contextmanager
    def connection(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        held = threading.current_thread().name == RENEWER and not self.waiting.is_set()
        if held:
            self.waiting.set()
            assert self.go.wait(PAUSE_S)
        try:
            with self._pool.connection(*args, **kwargs) as conn:
                yield conn
        finally:
            if held:
                self.done.set()


def test_a_renewal_that_lands_after_release_does_not_keep_the_run(pg_url: str) -> None:
    """Proves: a renewal that chose its claims before ``release`` and wrote after it does not renew the
    released claim; the run can be claimed at once (before: the row was renewed a full lease past the
    release, and every claim of it, this very process's too, was refused as driven by a live owner)."""
    journal = PostgresJournal(pg_url, owner_lease_s=3.0)
    held = _HeldRenewal(journal._pool)
    journal._pool = held  # type: ignore[assignment]
    renewal = journal._renewal = WatchedLock(journal._renewal)  # type: ignore[assignment]
    try:
        claim = journal.claim("race")
        assert held.waiting.wait(SIGN_S), "the renewer never began a renewal"  # "race" in its list of claims
        releasing = threading.Thread(target=journal.release, args=(claim,))
        releasing.start()
        # The release is done (one that does not wait for the renewal) or waits for the renewal's lock.
        wait_done_or_kept_waiting(releasing, renewal, "the release while the renewal waits for a connection")
        held.go.set()
        assert held.done.wait(SIGN_S), "the renewal, let go, never wrote"
        releasing.join(SIGN_S)
        assert (False, False) == (releasing.is_alive(), _renewed(pg_url, "race"))
        with PostgresJournal(pg_url) as other:
            other.release(other.claim("race"))
        journal.release(journal.claim("race"))
    finally:
        held.go.set()
        journal.close()


# A process that is the run's owner: it prints the owner row its claim would write, then lives on.
LIVE_OWNER = """
import sys, time
from effectlog.journal.ownership import encode_owner, new_owner
print(encode_owner(new_owner()), flush=True)
time.sleep(600)
"""


def test_a_live_owner_of_this_host_is_not_taken_for_gone_after_the_clock_is_stepped(pg_url: str) -> None:
    """Proves: an owner of this host that is still running keeps its run after the wall clock was stepped
    forward (NTP) since its claim. Its claim's ``since`` is then older than its start as ``/proc`` now
    gives it (boot time there follows the wall clock), which read as "its pid is another process's, started
    after the claim": the run was taken over while its owner (maybe inside a tool call) lived on."""
    with PostgresJournal(pg_url) as journal:
        journal.release(journal.claim("stepped"))
    child = subprocess.Popen([sys.executable, "-c", LIVE_OWNER], stdout=subprocess.PIPE, text=True, env=cli_env())
    try:
        assert child.stdout is not None
        owner = decode_owner(child.stdout.readline())
        assert owner is not None
        assert child.pid == owner.pid
        stepped = msgspec.structs.replace(owner, since=owner.since - 10 * 1_000_000_000)  # clock +10 s since
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                f"UPDATE {SCHEMA}.owners SET holder = %s, alive_until = extract(epoch FROM clock_timestamp()) + 30"
                " WHERE run_id = %s",
                (encode_owner(stepped), "stepped"),
            )
        with PostgresJournal(pg_url) as journal:
            with pytest.raises(RunOwned):
                journal.claim("stepped")
            assert journal.owner("stepped").live
    finally:
        child.kill()
        child.wait()


def test_every_claim_released_after_its_connection_ended_stops_being_renewed(pg_url: str) -> None:
    """Proves: when the connection holding two claims of one journal has ended, releasing both clears both
    rows, and both runs can be claimed at once (before: the first release dropped the dead connection and
    the second returned before clearing its row, which kept that run refused for a lease)."""
    journal = PostgresJournal(pg_url, owner_lease_s=30.0)
    try:
        first, second = journal.claim("lost-1"), journal.claim("lost-2")
        assert journal._owner_conn is not None
        backend = journal._owner_conn.info.backend_pid
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (backend,))
        journal.release(first)
        journal.release(second)
        assert (False, False) == (_renewed(pg_url, "lost-1"), _renewed(pg_url, "lost-2"))
        with PostgresJournal(pg_url) as other:
            other.release(other.claim("lost-1"))
            other.release(other.claim("lost-2"))
    finally:
        journal.close()


@pytest.mark.parametrize("lease", [0.0, -1.0, float("nan"), float("inf")])
def test_an_owner_lease_that_cannot_be_renewed_is_refused(pg_url: str, lease: float) -> None:
    """Proves: ``owner_lease_s`` of zero, below zero or not finite is refused at open with ``BadInput``
    naming it (before: zero or less had the renewal thread renew in a tight loop, hammering the server, and
    no claim's row was ever ahead; infinity left the row of an owner on a host that died ahead for ever, its
    run never to be resumed)."""
    with pytest.raises(BadInput, match="owner_lease_s"):
        PostgresJournal(pg_url, owner_lease_s=lease)


def test_a_server_idle_session_timeout_does_not_end_a_claim_during_a_long_call(pg_url: str) -> None:
    """Proves: on a database whose sessions end after half a second idle (``idle_session_timeout``), a claim
    outlives a call longer than its lease: another claim is still refused. Before: the server ended the idle
    claim connection (its lock) and every pooled connection the renewal was to use (each idle a third of the
    lease), so no renewal landed and the run was taken over while its owner was inside its call."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        server = conn.info.server_version
        conn.execute(f"ALTER DATABASE {conn.info.dbname} SET idle_session_timeout = '500ms'")
    if server < 140000:
        pytest.skip("idle_session_timeout is PostgreSQL 14's")
    with PostgresJournal(pg_url, owner_lease_s=3.0) as journal:
        claim = journal.claim("idle")
        threading.Event().wait(4.5)  # the owner inside a tool call, its journal idle, past its lease
        with PostgresJournal(pg_url) as other, pytest.raises(RunOwned):
            other.claim("idle")
        journal.release(claim)
