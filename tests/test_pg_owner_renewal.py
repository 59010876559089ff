"""A PostgreSQL run's owner is live while its process renews its claim, not only while its claim's
connection lasts.

A claim is a session advisory lock, which the server drops when that connection ends. The process may
live on (the server ended the session: a failover, an idle-session timeout, a firewall dropping the idle
socket during a long tool call), maybe inside a tool call whose effect has not landed yet; another
process that took the run over then asked the tool's lookup ("not applied": still in flight) and sent
the step again, two effects (round 15's reproduction, tests/test_attack_round15.py). So the owner row
carries ``alive_until``, pushed on by a thread of the owner's process and cleared on release; a claim
is refused while it is ahead, unless the owner is a process of this host known to be gone (a SIGKILL'd
owner is taken over at once, as before). Real server, real processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from effectlog.errors import ExitStatus, RunOwned
from effectlog.journal.ownership import Owner, encode_owner, new_owner, this_host
from effectlog.journal.postgres import PostgresJournal
from effectlog.journal.postgres_schema import OWNER_RENEWED, SCHEMA
from effectlog.runtime import Runtime
from hardening_kit import SAFETY_TIMEOUT_S, cli_env
from test_attack_round15 import ADAPTERS, _terminate, _wait_for, gated_plan
from test_lifecycle import effect_counts

pytest_plugins = ["pg_fixture"]

HERE = Path(__file__).parent

# P1 with a short lease: drives the gated step; its tool blocks until the test lets it land.
SHORT_LEASE_DRIVER = """
import sys
from effectlog.journal.postgres import PostgresJournal
from effectlog.runtime import Runtime
from test_attack_round15 import ADAPTERS, gated_plan

url, effects, directory = sys.argv[1:4]
with Runtime(PostgresJournal(url, owner_lease_s=1.5), effects=effects, adapters=ADAPTERS) as rt:
    print(rt.run(gated_plan(directory)).state)
"""


def _renewed(url: str, run_id: str) -> bool:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(OWNER_RENEWED, (run_id,)).fetchone()
    return bool(row and row[2])


def _set_owner(url: str, run_id: str, owner: Owner, alive_for_s: float) -> None:
    """The row another process's claim leaves (its session lock gone with its connection)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE {SCHEMA}.owners SET holder = %s, alive_until = extract(epoch FROM clock_timestamp()) + %s"
            " WHERE run_id = %s",
            (encode_owner(owner), alive_for_s, run_id),
        )


def _claimed_once(url: str, run_id: str) -> None:
    with PostgresJournal(url) as journal:
        journal.claim(run_id)


def test_an_owner_on_another_host_still_renewing_is_refused_until_its_claim_runs_out(pg_url: str) -> None:
    """Proves: with no session lock held, a row naming a process of another host renewed 30 s ahead makes
    a claim fail with ``RunOwned`` naming that host, and ``owner`` report it live; once its time has
    passed (not renewed: that host died), the claim succeeds."""
    _claimed_once(pg_url, "r1")
    elsewhere = Owner(pid=4242, host="other-host.example", kind="run", since=time.time_ns())
    _set_owner(pg_url, "r1", elsewhere, 30)
    with PostgresJournal(pg_url) as journal:
        with pytest.raises(RunOwned, match=r"other-host\.example"):
            journal.claim("r1")
        status = journal.owner("r1")
        assert (True, "other-host.example") == (status.live, status.owner.host if status.owner else None)
        _set_owner(pg_url, "r1", elsewhere, -1)
        claim = journal.claim("r1")
        assert claim.token > 0
        journal.release(claim)


def test_an_owner_of_this_host_that_is_gone_is_taken_over_at_once(pg_url: str) -> None:
    """Proves: a row renewed 30 s ahead by a process of this host that has ended (its pid gone, or used by a
    process started after the claim) does not hold the run: the claim succeeds without waiting."""
    _claimed_once(pg_url, "r1")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    me = new_owner()
    gone = Owner(pid=int(ended.stdout), host=this_host(), since=me.since, node=me.node)
    reused = Owner(pid=os.getpid(), host=this_host(), since=1, node=me.node)  # claimed before this process began
    with PostgresJournal(pg_url) as journal:
        for owner in (gone, reused):
            _set_owner(pg_url, "r1", owner, 30)
            journal.release(journal.claim("r1"))


def test_an_owner_killed_and_not_yet_reaped_is_taken_over_at_once(pg_url: str) -> None:
    """Proves: a row renewed 30 s ahead by a child of this process that was SIGKILLed and is not reaped yet
    (a zombie: its pid still answers) does not hold the run."""
    _claimed_once(pg_url, "r1")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        me = new_owner()
        _set_owner(pg_url, "r1", Owner(pid=child.pid, host=this_host(), since=me.since, node=me.node), 30)
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + SAFETY_TIMEOUT_S
        while Path(f"/proc/{child.pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
            assert time.monotonic() < deadline, "the child never ended"
            time.sleep(0.01)
        with PostgresJournal(pg_url) as journal:
            journal.release(journal.claim("r1"))
    finally:
        child.wait()


def test_a_released_claim_is_no_longer_renewed(pg_url: str) -> None:
    """Proves: while a claim is held its row is renewed; once released (the process still running), the
    row says so at once and another journal object claims the run."""
    with PostgresJournal(pg_url) as first:
        claim = first.claim("r1")
        held = _renewed(pg_url, "r1")
        first.release(claim)
        after = _renewed(pg_url, "r1")
        with PostgresJournal(pg_url) as second:
            second.release(second.claim("r1"))
    assert (True, False) == (held, after)


def test_an_owner_whose_connection_ended_keeps_the_run_past_its_lease_while_it_renews(
    tmp_path: Path, pg_url: str
) -> None:
    """P1 (lease 1.5 s, renewed every 0.5 s) is inside a non-idempotent call when the server ends its
    claim connection. Proves: three leases later another process's resume is still refused (P1 renews),
    P1's call then lands and its run completes, and after it the run resumes as completed: one effect."""
    effects = tmp_path / "e.db"
    child = subprocess.Popen(
        [sys.executable, "-c", SHORT_LEASE_DRIVER, pg_url, str(effects), str(tmp_path)],
        env=cli_env({"PYTHONPATH": str(HERE)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(tmp_path / "started", child)
        assert 1 == _terminate(pg_url, "effectlog-owner")
        time.sleep(4.5)  # three leases: only renewals keep the row ahead
        with Runtime(pg_url, effects=effects, adapters=ADAPTERS) as rt, pytest.raises(RunOwned):
            rt.run(gated_plan(str(tmp_path)))
    finally:
        (tmp_path / "go").touch()
        out, err = child.communicate(timeout=SAFETY_TIMEOUT_S)
    with Runtime(pg_url, effects=effects, adapters=ADAPTERS) as rt:
        again = rt.run(gated_plan(str(tmp_path))).state
    assert ("completed", 0, "completed") == (out.strip(), child.returncode, again), err
    assert Counter({("pay-1", "pay"): 1}) == effect_counts(effects)


def test_a_killed_owner_of_this_host_is_resumed_at_once(tmp_path: Path, pg_url: str) -> None:
    """P1 is SIGKILLed inside its non-idempotent call (its row renewed seconds ahead). Proves: another
    process resumes the run at once, and finds the step uncertain (it never waits out P1's lease, and
    never guesses): the run stops for a reconciliation, with no second effect."""
    effects = tmp_path / "e.db"
    child = subprocess.Popen(
        [sys.executable, "-c", SHORT_LEASE_DRIVER.replace("owner_lease_s=1.5", "owner_lease_s=600"), pg_url,
         str(effects), str(tmp_path)],
        env=cli_env({"PYTHONPATH": str(HERE)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    _wait_for(tmp_path / "started", child)
    child.send_signal(signal.SIGKILL)
    child.communicate(timeout=SAFETY_TIMEOUT_S)
    renewed_after_kill = _renewed(pg_url, "pay-1")
    with Runtime(pg_url, effects=effects, adapters=ADAPTERS) as rt:
        outcome = rt.run(gated_plan(str(tmp_path)))
    assert (True, "stopped", ExitStatus.STOPPED_UNCERTAIN, "pay") == (
        renewed_after_kill,
        outcome.state,
        outcome.exit_status,
        outcome.step_id,
    )
    assert Counter() == effect_counts(effects)


_HAS_COLUMN = (
    "SELECT count(*) FROM information_schema.columns WHERE table_name = 'owners' AND column_name = 'alive_until'"
)


def test_a_journal_whose_owners_table_predates_renewals_is_read_and_then_migrated(pg_url: str) -> None:
    """An owners table of an earlier version has no ``alive_until``. Proves: a reader reads a run's owner
    from it (never renewed: not live) without changing it, and the first writer adds the column."""
    _claimed_once(pg_url, "r1")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {SCHEMA}.owners DROP COLUMN alive_until")
    with PostgresJournal(pg_url, writer=False) as reader:
        status = reader.owner("r1")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        before = conn.execute(_HAS_COLUMN).fetchone()
    with PostgresJournal(pg_url) as writer:
        writer.release(writer.claim("r1"))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        after = conn.execute(_HAS_COLUMN).fetchone()
    assert (False, (0,), (1,)) == (status.live, before, after)
