"""An idle runner on a SQLite store sleeps in the kernel (inotify on the store's directory), not on a 10 ms poll,
and still picks up work another process queues, also after the WAL was checkpointed and truncated."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from effectlog.fleet import open_store
from fleet_kit import SAFETY_S, RunnerProcess, effectlog, wait_until, write_plan

pytest_plugins = ["fleet_kit"]

BENCH = Path(__file__).resolve().parents[1] / "experiments" / "fleet_bench.py"
HOUR = ("--poll-s", "3600", "--lease-s", "3600", "--heartbeat-s", "1200")  # only a wake-up makes it look again
IDLE_S = 2.0
# Counted from ``serve``: one recovery pass and one claim round at start, a few reads each. The 10 ms
# data_version poll this replaced made ~100 statements per idle second.
AT_MOST = 20


def test_an_idle_sqlite_runner_runs_no_statements_while_nothing_is_written(tmp_path: Path) -> None:
    """A real runner process (its SQL counted by the bench's wrapper) that finds nothing to do runs no statement
    while no process writes the store: its start-up round and nothing more over the idle seconds."""
    store_path = str(tmp_path / "fleet.db")
    open_store(store_path).close()
    out, log_path = tmp_path / "counts.json", tmp_path / "idle.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(BENCH),
                "traced-runner",
                str(out),
                "--store",
                store_path,
                *HOUR,
                "--runner-id",
                "idle",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    try:
        wait_until(lambda: "ready:" in log_path.read_text() or proc.poll() is not None or None, "the runner to start")
        assert proc.poll() is None, log_path.read_text()
        time.sleep(IDLE_S)  # the quiet span being counted, not a wait for something to happen
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(SAFETY_S)
    counted = json.loads(out.read_text())
    assert 0 == proc.returncode, log_path.read_text()
    assert counted["statements"] <= AT_MOST, counted
    assert 0 == counted["commits"]


def test_an_idle_runner_picks_up_work_queued_after_the_wal_was_truncated(
    tmp_path: Path, runners: list[RunnerProcess]
) -> None:
    """Another process checkpoints the store and truncates its WAL to nothing, then submits: the WAL is rewritten
    from its start, the runner (whose poll is an hour) is woken by that write and finishes the request. Twice, so
    the second is a wake-up after the first run's own writes, not a first look."""
    store_path = str(tmp_path / "fleet.db")
    store = open_store(store_path)
    try:
        runner = RunnerProcess(store_path, tmp_path, "idle", extra=HOUR)
        runners.append(runner)
        wait_until(lambda: "ready:" in runner.log() or runner.proc.poll() is not None or None, "the runner to start")
        assert runner.proc.poll() is None, runner.log()
        for i in range(2):
            truncate = "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')"
            subprocess.run([sys.executable, "-c", truncate, store_path], check=True, timeout=SAFETY_S)
            plan = write_plan(tmp_path / f"p{i}.json", f"run-{i}", [("a", "idem")])
            effectlog("submit", str(plan), "--store", store_path, "--scope", "wal", "--key", f"k{i}")
            wait_until(lambda n=i + 1: len(store.requests(["succeeded"])) == n or None, f"request {i + 1} to succeed")
    finally:
        store.close()
