"""Attack round 17 against PostgreSQL ownership: what the owner renewal does when the server ends every
session of the owner's process at once (a failover, a server restart, an operator's sweep of idle
sessions), while the owner is inside a long tool call.

Real server (``pg_url``), real journals, real ``pg_terminate_backend``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from effectlog.errors import RunOwned
from effectlog.journal.postgres import PostgresJournal
from hardening_kit import cli_env, effectlog

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


_RUNNER = """
import sys
from effectlog.fleet import open_store
from effectlog.fleet.runner import Runner, RunnerConfig
store = open_store(sys.argv[1], pool_size=4)
pool = store._pool
with pool.connection(), pool.connection(), pool.connection(), pool.connection():
    pass  # four connections idle in the pool, as after any burst of claims and appends
config = RunnerConfig(store=sys.argv[1], runner_id="A", lease_s=1.5, heartbeat_s=0.5, poll_s=0.05, recover=False,
                      max_attempts=1)
Runner(config, store, log=open("/dev/null", "w")).serve()
store.close()
"""


def test_a_runners_lease_outlives_the_end_of_every_session_of_its_process_during_a_long_call(
    tmp_path: Path, pg_url: str
) -> None:
    """The fleet's twin of the case above: a runner keeps its attempt's lease by heartbeats, each one
    transaction on a pooled connection, and a failed heartbeat waited for the next (a third of the lease).
    After a failover every idle pooled connection was broken, one failed per heartbeat, and with four idle
    the lease ran out while the runner was inside its step's call: recovery then moves the attempt on (a
    person asked to reconcile while the call may still land, or an idempotent step sent again by another
    runner). Proves: with every session of the runner's process ended mid-call, the lease is never seen
    run out while the call goes on."""
    plan = tmp_path / "p.json"
    plan.write_text(json.dumps({
        "run_id": "slow",
        "adapters": {"sh": {"type": "shell", "idempotent": False}},
        "steps": [{"id": "s1", "adapter": "sh", "args": {"argv": ["sleep", "4"]}}],
    }))  # fmt: skip
    assert 0 == effectlog("submit", "--store", pg_url, "--scope", "s", "--key", "k", str(plan), cwd=tmp_path).returncode
    runner = subprocess.Popen([sys.executable, "-c", _RUNNER, pg_url], cwd=tmp_path, env=cli_env())
    lapsed: list[float] = []
    try:
        with psycopg.connect(pg_url, autocommit=True, application_name="attack17-watch") as conn:

            def lease_left() -> float | None:
                row = conn.execute(
                    "SELECT a.lease_expires_at - extract(epoch FROM clock_timestamp()) FROM effectlog_fleet.attempts a"
                    " JOIN effectlog.events e ON e.run_id = 'slow' AND e.phase = 'step.requested'"
                    " WHERE a.state = 'running'"
                ).fetchone()
                return None if row is None else float(row[0])

            deadline = time.monotonic() + 120  # the runner's start-up on a loaded machine
            while lease_left() is None and time.monotonic() < deadline:
                time.sleep(0.02)  # until the step's call has begun
            assert lease_left() is not None
            assert _end_sessions(pg_url, ("effectlog-fleet", "effectlog-journal", "effectlog-owner")) >= 4
            until = time.monotonic() + 3.0  # inside the 4 s call, twice the lease
            while time.monotonic() < until:
                left = lease_left()
                if left is not None and left <= 0:
                    lapsed.append(left)
                time.sleep(0.02)
    finally:
        runner.kill()
        runner.wait()
    assert [] == lapsed


def test_a_claim_outlives_a_server_restart_longer_than_its_lease(tmp_path: Path) -> None:
    """A server restart (maintenance, ``pg_ctl restart``, a managed database's reboot) longer than the
    owner's lease: nobody could renew or claim meanwhile, and once the server was back the first claim to
    arrive found the owner's ``alive_until`` in the past and took the run over, while its owner (alive,
    inside its call) had not had a turn to renew yet. Proves: for a lease after the server's start, the
    claim of an owner whose last renewal predates that start is still refused (exit 6), and the owner
    then renews and keeps its run."""
    from pg_fixture import started_cluster

    cluster = started_cluster()
    taken: list[bool] = []
    renewed = False
    try:
        url = cluster.create_database()
        with PostgresJournal(url, owner_lease_s=1.5) as journal:
            claim = journal.claim("restart")
            pg_ctl = str(cluster._bindir / "pg_ctl")
            cluster._run([pg_ctl, "-D", str(cluster.data), "-m", "fast", "-w", "-t", "30", "stop"], "stop")
            time.sleep(2.5)  # down for longer than the lease, the owner inside its call
            options = f"-c listen_addresses=127.0.0.1 -p {cluster.port} -k {cluster.tmp} -c fsync=off"
            cluster._run([pg_ctl, "-D", str(cluster.data), "-l", str(cluster.log), "-o", options, "-w", "start"],
                         "start")  # fmt: skip
            with PostgresJournal(url) as other:
                until = time.monotonic() + 2.0
                while time.monotonic() < until and not taken:
                    try:
                        other.release(other.claim("restart"))
                        taken.append(True)
                    except RunOwned:
                        time.sleep(0.02)
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(
                    "SELECT alive_until > extract(epoch FROM clock_timestamp()) FROM effectlog.owners"
                    " WHERE run_id = 'restart'"
                ).fetchone()
            renewed = bool(row and row[0])
            journal.release(claim)
    finally:
        cluster.stop()
    assert ([], True) == (taken, renewed)


def test_a_run_released_after_every_session_of_its_process_ended_is_claimable_at_once(pg_url: str) -> None:
    """A release clears its owner row's ``alive_until`` on a pooled connection. After a failover (every
    session of the process ended), that connection was a broken one: the clearing failed, silently, and
    the released run stayed "renewed" by a live process (this one) for a lease: every claim of it, this
    process's next resume included, was refused (exit 6). Proves: released after its process's sessions
    were all ended, the run is claimed by another journal at once."""
    with PostgresJournal(pg_url, pool_size=4) as journal:
        pool = journal._pool
        with pool.connection(), pool.connection(), pool.connection(), pool.connection():
            pass  # four connections idle in the pool, as after any burst of reads and appends
        claim = journal.claim("released")
        assert 5 == _end_sessions(pg_url, ("effectlog-journal", "effectlog-owner"))
        journal.release(claim)
        with PostgresJournal(pg_url) as other:
            other.release(other.claim("released"))


_STOPPABLE_OWNER = """
import sys
from effectlog.journal.postgres import PostgresJournal
journal = PostgresJournal(sys.argv[1], owner_lease_s=1.0)
claim = journal.claim("stopped")
print("claimed", flush=True)
sys.stdin.readline()
journal.release(claim)
journal.close()
print("released", flush=True)
"""


def test_an_owner_stopped_with_sigstop_past_its_lease_keeps_its_run(pg_url: str) -> None:
    """A process stopped (SIGSTOP, a debugger, a frozen container) renews nothing, so its ``alive_until``
    runs out; its claim connection is still open (the kernel keeps the socket), and with it the session
    lock. Proves: another claim is refused while the owner is stopped past twice its lease (the lock
    decides, not ``alive_until`` alone), and once continued and released the run is claimed at once.
    Regression; nothing found."""
    owner = subprocess.Popen(
        [sys.executable, "-c", _STOPPABLE_OWNER, pg_url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=cli_env(),
    )  # fmt: skip
    assert owner.stdin is not None
    assert owner.stdout is not None
    try:
        assert "claimed" == owner.stdout.readline().strip()
        os.kill(owner.pid, signal.SIGSTOP)
        try:
            time.sleep(2.0)
            with PostgresJournal(pg_url) as other, pytest.raises(RunOwned):
                other.claim("stopped")
        finally:
            os.kill(owner.pid, signal.SIGCONT)
        owner.stdin.write("go\n")
        owner.stdin.flush()
        assert "released" == owner.stdout.readline().strip()
        with PostgresJournal(pg_url) as other:
            other.release(other.claim("stopped"))
    finally:
        owner.kill()
        owner.wait()
