"""An idle runner on a SQLite store sleeps in the kernel (inotify on the store's directory), not on a 10 ms poll,
and still picks up work another process queues, also after the WAL was checkpointed and truncated."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from effectlog.fleet import inotify, open_store, wakeups
from effectlog.fleet.contract import noop_plan
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


def test_the_watcher_reads_only_after_a_commit_and_wakes_only_for_queued_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In one process: the watcher's connection runs no statement while nothing is written, a few after each
    commit that queued nothing (a claim, heartbeats: no wake-up, and quiet again after them, so its own reads do
    not wake it), and a submit wakes it."""
    statements: list[str] = []
    real_connect = sqlite3.connect

    def counted(*args: Any, **kwargs: Any) -> sqlite3.Connection:  # the watcher's connection, statements counted
        db = real_connect(*args, **kwargs)
        db.set_trace_callback(statements.append)
        return db

    path = str(tmp_path / "fleet.db")
    writer = open_store(path)
    watching = open_store(path)
    woken = threading.Semaphore(0)
    monkeypatch.setattr(wakeups.sqlite3, "connect", counted)
    try:
        watching.watch(woken.release)
        writer.submit("s", "k0", noop_plan("run-0"))
        assert woken.acquire(timeout=SAFETY_S)
        lease = writer.claim_next("r", [], 60.0, 1)[0]
        for _ in range(5):
            writer.heartbeat(lease, 60.0)
        time.sleep(1.0)  # let the watcher go back to sleep
        before = len(statements)
        time.sleep(1.0)  # quiet: nothing is written
        assert before == len(statements), statements[before:]
        assert not woken.acquire(timeout=0)  # the claim and the heartbeats queued nothing
        writer.submit("s", "k1", noop_plan("run-1"))
        assert woken.acquire(timeout=SAFETY_S)
    finally:
        writer.close()
        watching.close()
    assert 0 < before <= 2 + 7 * 3, statements  # 7 commits: each read once or twice, the counter once


def test_without_inotify_the_watcher_polls_and_still_wakes_for_a_submit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where inotify cannot be had (another platform, no descriptors left), the watcher reads PRAGMA
    data_version on its tick instead, and a submit still wakes it."""
    monkeypatch.setattr(wakeups.Inotify, "open", classmethod(lambda cls, directory: None))
    path = str(tmp_path / "fleet.db")
    writer, watching = open_store(path), open_store(path)
    woken = threading.Event()
    try:
        watching.watch(woken.set)
        writer.submit("s", "k", noop_plan("run-1"))
        assert woken.wait(SAFETY_S)
    finally:
        writer.close()
        watching.close()


def test_a_watcher_still_wakes_after_the_stores_directory_was_renamed(tmp_path: Path) -> None:
    """The store's directory is renamed under open stores: the watch follows the directory, so a later submit
    through an open store still wakes the watcher."""
    before, after = tmp_path / "a", tmp_path / "b"
    before.mkdir()
    writer, watching = open_store(str(before / "fleet.db")), open_store(str(before / "fleet.db"))
    woken = threading.Event()
    try:
        watching.watch(woken.set)
        before.rename(after)
        writer.submit("s", "k", noop_plan("run-1"))
        assert woken.wait(SAFETY_S)
    finally:
        writer.close()
        watching.close()


def test_a_watcher_whose_store_cannot_be_opened_leaves_no_descriptor_open(tmp_path: Path) -> None:
    """The watcher thread's own connection fails (the store's path is a directory now): the thread ends,
    the runner keeps its --poll-s fallback, and the inotify watch and both ends of the stop pipe are
    closed (the review found the inotify descriptor and a pipe end left open when the connect failed).

    Counted in a fresh interpreter: in the test process, threads left by earlier tests (a late call's
    waiter, an owner's renewal) may open or close a descriptor between the two listings."""
    (tmp_path / "store.db").mkdir()
    count = (
        "import os, sys\n"
        "from effectlog.fleet import wakeups\n"
        "before = sorted(os.listdir('/proc/self/fd'))\n"
        "for _ in range(3):\n"
        "    wakeups.watch_sqlite(sys.argv[1], lambda: None).stop()\n"
        "after = sorted(os.listdir('/proc/self/fd'))\n"
        "print(before == after, before, after)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", count, str(tmp_path / "store.db")],
        capture_output=True,
        text=True,
        timeout=SAFETY_S,
        check=True,
    )
    assert done.stdout.startswith("True "), done.stdout + done.stderr


def test_a_watcher_whose_runner_has_no_free_slot_reads_nothing_and_looks_again_once_one_frees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While ``wanted`` says the runner cannot take work (every slot busy), commits to the store (its own
    appends, a submit) cost the watcher no statement and no wake-up; once a slot is free, a submit wakes
    it again. (A busy runner's own 7 commits per run each cost its watcher reads before.)"""
    statements: list[str] = []
    real_connect = sqlite3.connect

    def counted(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        db = real_connect(*args, **kwargs)
        db.set_trace_callback(statements.append)
        return db

    path = str(tmp_path / "fleet.db")
    writer, watching = open_store(path), open_store(path)
    woken = threading.Semaphore(0)
    free = threading.Event()
    asked: list[bool] = []  # each time the watcher asks whether a slot is free (only after a write)

    def wanted() -> bool:
        asked.append(True)
        return free.is_set()

    monkeypatch.setattr(wakeups.sqlite3, "connect", counted)
    try:
        watching.watch(woken.release, wanted)
        time.sleep(0.2)
        before = len(statements)
        for i in range(5):
            writer.submit("s", f"busy-{i}", noop_plan(f"run-busy-{i}"))
        wait_until(lambda: len(asked) >= 2, "the watcher to see the writes and look again for a free slot")
        time.sleep(0.5)  # longer than the watcher's settle and late checks
        busy = statements[before:]
        assert (False, []) == (woken.acquire(timeout=0), busy)
        free.set()
        writer.submit("s", "free", noop_plan("run-free"))
        assert woken.acquire(timeout=SAFETY_S)
    finally:
        writer.close()
        watching.close()


def test_a_busy_runners_watcher_is_not_woken_by_each_commit_and_still_sees_work_queued_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the runner has no free slot, 20 commits to the store (a busy runner's own appends: six a run)
    wake its watcher once, for the first, not once each: it then only looks whether a slot freed. Once one
    has, work queued while it was busy still wakes the runner, with no further commit."""
    reads: list[int] = []
    real_read = inotify.Inotify.read

    def counted(self: inotify.Inotify) -> inotify.Changes:
        reads.append(1)
        return real_read(self)

    monkeypatch.setattr(inotify.Inotify, "read", counted)
    path = str(tmp_path / "fleet.db")
    writer, watching = open_store(path), open_store(path)
    woken = threading.Semaphore(0)
    free = threading.Event()
    asked: list[int] = []  # the reads made so far, each time the watcher asks whether a slot is free

    def wanted() -> bool:
        asked.append(len(reads))
        return free.is_set()

    try:
        watching.watch(woken.release, wanted)
        for i in range(20):
            writer.submit("s", f"busy-{i}", noop_plan(f"run-busy-{i}"))
        # Woken by a write, it asks for a slot once after its read and again while it waits for one.
        wait_until(lambda: len(asked) >= 2, "the watcher to read a write and look again for a free slot")
        time.sleep(0.2)  # longer than the watcher's settle and late checks
        assert (False, 1) == (woken.acquire(timeout=0), len(reads))
        free.set()
        assert woken.acquire(timeout=SAFETY_S)
    finally:
        writer.close()
        watching.close()
