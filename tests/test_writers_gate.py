"""The writers' gate of a SQLite journal file (``filelocks.SharedFile.enter``/``leave``), between real
processes and between threads of one process.

Every commit takes this process's turn, then the gate byte's OFD write lock, before ``BEGIN
IMMEDIATE``. The holder here is a real ``python -c`` process that takes the gate byte of the
journal file and keeps it until its stdin closes.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectlog.errors import JournalLocked
from effectlog.integrity import verify_run
from effectlog.journal import SqliteJournal
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
