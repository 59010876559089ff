"""Idle runners wake on queued work (LISTEN/NOTIFY on PostgreSQL, the store's queued counter on SQLite),
not on a tight poll; the poll stays as the fallback."""

from __future__ import annotations

import threading
from pathlib import Path

from effectlog.fleet import FleetStore, open_store
from effectlog.fleet.contract import noop_plan
from fleet_kit import RunnerProcess, effectlog, wait_until, write_plan

pytest_plugins = ["pg_fixture", "fleet_kit"]

HOUR = "3600"  # --poll-s at its maximum: only a wake-up can make the runner look again within the test


def test_an_idle_runner_with_an_hour_long_poll_runs_work_submitted_later(
    store_url: str, store: FleetStore, runners: list[RunnerProcess], tmp_path: Path
) -> None:
    """A runner that found nothing (and would sleep an hour) claims and finishes each request submitted while it
    idles: the submit's signal wakes it. Three in a row, so it is the wake-up each time, not a first look."""
    store.candidates(1)  # the store's schema exists before the runner opens it
    runner = RunnerProcess(
        store_url, tmp_path, "idle", extra=("--poll-s", HOUR, "--lease-s", HOUR, "--heartbeat-s", "1200")
    )
    runners.append(runner)
    wait_until(lambda: "ready:" in runner.log() or runner.proc.poll() is not None or None, "the runner to start")
    assert runner.proc.poll() is None, runner.log()
    for i in range(3):
        plan = write_plan(tmp_path / f"p{i}.json", f"run-{i}", [("a", "idem")])
        effectlog("submit", str(plan), "--store", store_url, "--scope", "wake", "--key", f"k{i}")
        done = i + 1
        wait_until(lambda n=done: len(store.requests(["succeeded"])) == n or None, f"request {done} to succeed")


def test_a_store_watcher_calls_wake_for_a_queued_attempt_and_stops_on_close(store_url: str) -> None:
    """``watch`` calls back when another store queues an attempt, and ``close`` ends its thread."""
    watching = open_store(store_url)
    woken = threading.Event()
    watching.watch(woken.set)
    other = open_store(store_url)
    try:
        assert not woken.wait(0.3)  # nothing queued yet
        other.submit("s", "k", noop_plan("run-1"))
        assert woken.wait(60)
    finally:
        other.close()
        watching.close()
    assert [] == [t.name for t in threading.enumerate() if t.name in ("effectlog-listen", "effectlog-watch")]
