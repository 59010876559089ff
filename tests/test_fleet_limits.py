"""The fleet's numbers: every duration is checked before anything is written, and a broken lease can be taken back.

Real `effectlog` processes on SQLite and PostgreSQL stores. A lease of NaN or infinity
would never expire, so its request would stay leased for ever: the flags refuse such
values (exit 2, one line, no store created), and a store that already holds one (written
by an older version, or by hand) is recovered like an expired lease.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from effectlog.errors import StaleLease
from effectlog.fleet import FleetStore, is_postgres
from effectlog.fleet.contract import LONG, requested, started
from fleet_kit import effectlog, write_plan

pytest_plugins = ["pg_fixture", "fleet_kit"]


BAD_RUNNER_FLAGS = [
    ["--lease-s", "nan"],
    ["--lease-s", "inf"],
    ["--lease-s", "-5"],
    ["--lease-s", "0"],
    ["--lease-s", "1e9"],
    ["--heartbeat-s", "-1"],
    ["--heartbeat-s", "nan"],
    ["--heartbeat-s", "30"],
    ["--lease-s", "10", "--heartbeat-s", "20"],
    ["--poll-s", "-0.5"],
    ["--poll-s", "0"],
    ["--poll-s", "nan"],
    ["--capacity", "0"],
    ["--capacity", "100000"],
    ["--max-attempts", "-1"],
]


@pytest.mark.parametrize("flags", BAD_RUNNER_FLAGS, ids=[" ".join(f) for f in BAD_RUNNER_FLAGS])
def test_runner_numbers_out_of_range_exit_2_before_the_store_exists(tmp_path: Path, flags: list[str]) -> None:
    """Each impossible runner setting: exit 2, one line naming the flag, and no store file created."""
    store = tmp_path / "fleet.db"
    done = effectlog("runner", "--store", str(store), "--exit-when-idle", *flags, check=False)
    assert (2, 1) == (done.returncode, len(done.stderr.splitlines())), done.stderr
    assert flags[-2] in done.stderr
    assert "Traceback" not in done.stderr
    assert not store.exists()


@pytest.mark.parametrize("interval", ["nan", "inf", "-1", "0"])
def test_recovery_interval_out_of_range_exits_2(tmp_path: Path, interval: str) -> None:
    """`effectlog recovery --interval` takes a finite, positive number of seconds, else exit 2 and no store."""
    store = tmp_path / "fleet.db"
    done = effectlog("recovery", "--store", str(store), "--interval", interval, check=False)
    assert 2 == done.returncode, done.stderr
    assert "--interval" in done.stderr
    assert not store.exists()


def test_the_store_refuses_a_lease_that_never_expires(store: FleetStore, tmp_path: Path) -> None:
    """Library callers too: claim and heartbeat with NaN, infinity or zero seconds are bad input, nothing leased."""
    from effectlog.errors import BadInput
    from effectlog.fleet.contract import noop_plan

    request = store.submit("s", "k", noop_plan("run-1")).request
    for bad in (float("nan"), float("inf"), 0.0, -1.0):
        with pytest.raises(BadInput):
            store.claim(request.request_id, "r1", bad)
    assert ["queued"] == [a.state for a in store.attempts()]


def _break_lease(url: str, attempt_id: int, value: str) -> None:
    """Write a lease expiry this version never writes, straight into the database (as an older version could)."""
    if is_postgres(url):
        import psycopg

        sql_value = {"NULL": "NULL", "NaN": "'NaN'::float8", "inf": "'Infinity'::float8"}[value]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                f"UPDATE effectlog_fleet.attempts SET lease_expires_at = {sql_value} WHERE attempt_id = %s",
                (attempt_id,),
            )
        return
    with sqlite3.connect(url) as db:  # SQLite stores a NaN as NULL; 9e999 is its infinity
        sql_value = {"NULL": "NULL", "NaN": "NULL", "inf": "9e999"}[value]
        db.execute(f"UPDATE fleet_attempts SET lease_expires_at = {sql_value} WHERE attempt_id = ?", (attempt_id,))


@pytest.mark.parametrize("value", ["NULL", "NaN", "inf"])
def test_recovery_takes_back_a_lease_that_is_not_a_number(
    store_url: str, store: FleetStore, tmp_path: Path, value: str
) -> None:
    """A live attempt whose lease expiry is NULL, NaN or infinite: `effectlog recovery --once` treats it as expired.

    Nothing was requested, so the attempt is lost and the request queued again; the old
    holder's next write is refused as stale.
    """
    plan = write_plan(tmp_path / "p.json", "run-1", [("a", "idem")])
    effectlog("submit", str(plan), "--store", store_url, "--scope", "s", "--key", "k")
    lease = store.claim(1, "old-runner", LONG)
    assert lease is not None
    store.leased_journal(lease).append([started("run-1")])
    _break_lease(store_url, lease.attempt_id, value)
    done = effectlog("recovery", "--store", store_url, "--once")
    assert "request 1 attempt 1: lost" in done.stdout
    assert [("lost", 1), ("queued", 2)] == [(a.state, a.attempt_no) for a in store.attempts()]
    assert "not a valid lease" in store.history()[-1].detail["lease_expires_at"]
    with pytest.raises(StaleLease):
        store.heartbeat(lease, LONG)


@pytest.mark.parametrize("value", ["NULL", "NaN"])
def test_an_operator_can_end_a_request_whose_lease_was_not_a_number(
    store_url: str, store: FleetStore, tmp_path: Path, value: str
) -> None:
    """A step was requested under the broken lease: recovery sends it to needs_operator, and `operator fail` ends it."""
    plan = write_plan(tmp_path / "p.json", "run-1", [("a", "control")])
    effectlog("submit", str(plan), "--store", store_url, "--scope", "s", "--key", "k")
    lease = store.claim(1, "old-runner", LONG)
    assert lease is not None
    store.leased_journal(lease).append([started("run-1"), requested("run-1", 2)])
    _break_lease(store_url, lease.attempt_id, value)
    effectlog("recovery", "--store", store_url, "--once")
    assert "needs_operator" == store.request(1).state
    effectlog("operator", "fail", "--store", store_url, "--request", "1", "--reason", "checked", "--by", "alice")
    assert ("failed", True) == (store.request(1).state, store.request(1).finished_at is not None)
