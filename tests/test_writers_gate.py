"""The writers' gate of a SQLite journal file (``filelocks.SharedFile.enter``/``leave``), between real
processes and between threads of one process.

Every commit takes this process's turn, then the gate byte's OFD write lock, before ``BEGIN
IMMEDIATE``. The holder here is a real ``python -c`` process that takes the gate byte of the
journal file and keeps it until its stdin closes.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effectlog.errors import JournalLocked
from effectlog.integrity import verify_run
from effectlog.journal import SqliteJournal, filelocks
from effectlog.testing import sample_run

# Takes the writers' gate of the file (argv[1]) the way a writer of another process does; says "held".
GATE_HOLDER = """
import fcntl, os, struct, sys
from effectlog.journal import filelocks

fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack(filelocks._FLOCK, fcntl.F_WRLCK, os.SEEK_SET, filelocks.GATE, 1, 0))
print("held", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    path = tmp_path / "j.db"
    SqliteJournal(path).close()  # the file exists, with its schema
    return path


@pytest.fixture
def gate_holder(journal: Path) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", GATE_HOLDER, str(journal)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert "held\n" == proc.stdout.readline()
    yield proc
    leave(proc)


def leave(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def test_an_append_gives_up_while_another_process_holds_the_gate_and_writes_nothing(
    journal: Path, gate_holder: subprocess.Popen[str]
) -> None:
    """While another process holds the gate, an append waits its timeout, then raises JournalLocked
    (exit 6) naming the journal, with nothing written; this process's turn is given back, so the next
    append, once the other process has left, goes through."""
    events = sample_run("r1")
    with SqliteJournal(journal, busy_timeout_s=0.3) as writer:
        with pytest.raises(JournalLocked) as refused:
            writer.append(events)
        assert (str(journal), 6) == (str(refused.value).split(":")[0], int(refused.value.exit_status))
        assert (0, []) == (writer.head("r1")[0], writer.runs())
        leave(gate_holder)
        writer.append(events)
        assert (len(events), ["r1"]) == (writer.head("r1")[0], writer.runs())


def test_an_append_waits_for_the_other_process_to_leave_the_gate(
    journal: Path, gate_holder: subprocess.Popen[str]
) -> None:
    """An append started while another process holds the gate is still waiting, unwritten, after
    a while; it completes once that process leaves."""
    events = sample_run("r1")
    with SqliteJournal(journal, busy_timeout_s=30) as writer:
        appender = threading.Thread(target=writer.append, args=(events,))
        appender.start()
        appender.join(timeout=0.5)
        waiting = appender.is_alive()
        with SqliteJournal(journal, writer=False) as reader:
            unwritten = reader.runs()
        leave(gate_holder)
        appender.join(timeout=30)
        assert (True, [], False) == (waiting, unwritten, appender.is_alive())
        assert len(events) == writer.head("r1")[0]


def test_threads_of_one_process_take_turns_and_every_commit_lands(journal: Path) -> None:
    """Four threads, each with its own journal object on one file, append their own runs' 17 events
    one commit at a time, all at once: every event lands, and every run replays and verifies."""
    runs = [f"r{k}" for k in range(4)]
    histories = {run_id: sample_run(run_id, steps=5) for run_id in runs}
    errors: list[BaseException] = []

    def drive(run_id: str) -> None:
        try:
            with SqliteJournal(journal) as writer:
                claim = writer.claim(run_id)
                for event in histories[run_id]:
                    writer.append([event])
                writer.release(claim)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(run_id,)) for run_id in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    with SqliteJournal(journal, writer=False) as reader:
        verified = {run_id: (verify_run(reader, run_id).seq, verify_run(reader, run_id).state) for run_id in runs}
    assert ([], dict.fromkeys(runs, (17, "completed"))) == (errors, verified)


# Appends one run (argv[2]) to the journal (argv[1]) with the gate's timeout argv[3]; reports how it went.
APPENDER = """
import json, sys, time
from effectlog.errors import JournalLocked
from effectlog.journal import SqliteJournal
from effectlog.testing import sample_run

with SqliteJournal(sys.argv[1], busy_timeout_s=float(sys.argv[3])) as writer:
    print("ready", flush=True)
    start = time.monotonic()
    try:
        writer.append(sample_run(sys.argv[2]))
        out = {"ok": True}
    except JournalLocked as exc:
        out = {"ok": False, "error": str(exc), "exit": int(exc.exit_status)}
    out["waited_s"] = time.monotonic() - start
print(json.dumps(out), flush=True)
"""


def lobby_held(journal: Path) -> bool:
    """Whether a process holds the gate's lobby byte (the waiter that polls the gate)."""
    fd = os.open(journal, os.O_RDWR)
    try:
        return fcntl.F_UNLCK != filelocks._ofd(fd, fcntl.F_OFD_GETLK, fcntl.F_WRLCK, filelocks.LOBBY)
    finally:
        os.close(fd)


def appenders(journal: Path, runs: list[str], timeout_s: float) -> list[subprocess.Popen[str]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(journal), run_id, str(timeout_s)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for run_id in runs
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert "ready\n" == proc.stdout.readline()
    return procs


def reports(procs: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    out = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=60)
        assert 0 == proc.returncode
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_processes_waiting_for_the_gate_queue_in_its_lobby_and_all_get_through(
    journal: Path, gate_holder: subprocess.Popen[str]
) -> None:
    """Three processes append while a fourth holds the gate: one of them holds the lobby (it polls the
    gate, the others poll the lobby); nothing is written until the holder leaves; then every append
    lands, every run verifies, and the lobby is left free."""
    runs = ["r1", "r2", "r3"]
    procs = appenders(journal, runs, 60.0)
    deadline = time.monotonic() + 60
    while not lobby_held(journal):
        assert time.monotonic() < deadline, "no waiter took the lobby"
        time.sleep(0.01)
    with SqliteJournal(journal, writer=False) as reader:
        unwritten = reader.runs()
    leave(gate_holder)
    done = reports(procs)
    with SqliteJournal(journal, writer=False) as reader:
        verified = {run_id: verify_run(reader, run_id).state for run_id in runs}
    assert ([], [True] * 3, dict.fromkeys(runs, "completed"), False) == (
        unwritten,
        [d["ok"] for d in done],
        verified,
        lobby_held(journal),
    )


def test_every_waiter_gives_up_at_its_own_deadline_with_the_same_error(
    journal: Path, gate_holder: subprocess.Popen[str]
) -> None:
    """While another process keeps the gate, three appenders with a 1 s timeout each raise JournalLocked
    (exit 6, the message naming the journal and the timeout) after waiting at least 1 s and well under the
    2 s a follower would take if it waited out the lobby head's timeout before its own; nothing is
    written and the lobby is left free."""
    procs = appenders(journal, ["r1", "r2", "r3"], 1.0)
    done = reports(procs)
    expected = f"{journal}: another process kept the journal's write lock for 1s"
    assert [(False, expected, 6)] * 3 == [(d["ok"], d["error"], d["exit"]) for d in done]
    assert [True] * 3 == [1.0 <= d["waited_s"] < 1.9 for d in done], [d["waited_s"] for d in done]
    with SqliteJournal(journal, writer=False) as reader:
        assert [] == reader.runs()
    assert not lobby_held(journal)
