"""One writer per journal file, enforced by an OS lock between real processes; readers need none.

The second writer is the real ``effectlog run`` command, and also a tiny ``python -c``
program that opens the journal with the library API and reports the error the way
``effectlog.cli.main`` does.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectlog.errors import ExitStatus, JournalLocked
from effectlog.journal import SqliteJournal

# Holds the writer lock until its stdin closes; says "ready" once it holds it.
HOLDER = """
import sys
from effectlog.journal import SqliteJournal
from effectlog.testing import sample_run

journal = SqliteJournal(sys.argv[1])
journal.append(sample_run("run-1"))
print("ready", flush=True)
sys.stdin.read()
journal.close()
"""

# Opens the journal for writing; errors are reported as effectlog.cli.main reports them.
SECOND_WRITER = """
import sys
from effectlog.errors import EffectlogError
from effectlog.journal import SqliteJournal

try:
    SqliteJournal(sys.argv[1]).close()
except EffectlogError as exc:
    sys.stderr.write(f"effectlog: {exc.code}: {exc}\\n")
    raise SystemExit(int(exc.exit_status))
print("opened")
"""


def python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def journal(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


@pytest.fixture
def holder(journal: Path) -> Iterator[subprocess.Popen[str]]:
    """A real process that holds the journal's writer lock until the test ends."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(journal)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "ready\n" == line, proc.stderr.read() if proc.stderr else ""
        yield proc
    finally:
        release(proc)


def release(proc: subprocess.Popen[str]) -> None:
    """Let the holder close its journal and exit (killed only if it does not)."""
    if proc.poll() is None:
        try:
            proc.communicate(input="", timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def test_second_writer_process_exits_6_naming_the_holder(journal: Path, holder: subprocess.Popen[str]) -> None:
    """While one process writes, another opening the journal for writing gets journal_locked, exit 6, with the pid."""
    result = python(SECOND_WRITER, str(journal))
    expected = f"effectlog: journal_locked: journal {journal} is being written by another process (pid {holder.pid})\n"
    assert (6, "", expected) == (result.returncode, result.stdout, result.stderr)


def test_second_writer_gets_journal_locked_with_the_holder_pid(journal: Path, holder: subprocess.Popen[str]) -> None:
    """The error is JournalLocked, exit status LOCKED (6), and carries the holder's pid as a field."""
    with pytest.raises(JournalLocked) as info:
        SqliteJournal(journal)
    assert (ExitStatus.LOCKED, 6, holder.pid) == (
        info.value.exit_status,
        int(info.value.exit_status),
        info.value.fields["holder_pid"],
    )


def test_readers_need_no_lock(journal: Path, holder: subprocess.Popen[str]) -> None:
    """While the writer holds the lock, a reader opens the journal and `effectlog verify` succeeds."""
    with SqliteJournal(journal, writer=False) as reader:
        assert (["run-1"], 8) == (reader.runs(), reader.head("run-1")[0])
    result = subprocess.run(
        [sys.executable, "-m", "effectlog", "verify", "--journal", str(journal)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (0, "ok: 1 run(s), 8 event(s) verified\n") == (result.returncode, result.stdout)


def test_the_lock_is_released_when_the_writer_exits(journal: Path, holder: subprocess.Popen[str]) -> None:
    """Once the holding process has closed the journal and exited, another process may write."""
    assert 6 == python(SECOND_WRITER, str(journal)).returncode
    release(holder)
    assert 0 == holder.returncode
    result = python(SECOND_WRITER, str(journal))
    assert (0, "opened\n", "") == (result.returncode, result.stdout, result.stderr)


def test_effectlog_run_against_a_locked_journal_exits_6_and_writes_nothing(
    journal: Path, holder: subprocess.Popen[str]
) -> None:
    """The real CLI, as a second process, gets exit 6 naming the holder's pid; the journal is unchanged."""
    plan = Path(__file__).resolve().parents[1] / "examples" / "payment.json"
    before = journal.read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "effectlog", "run", str(plan), "--journal", str(journal), "--effects",
         str(journal.parent / "effects.db")],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert 6 == done.returncode
    assert f"pid {holder.pid}" in done.stderr
    assert 1 == len(done.stderr.strip().splitlines())
    assert before == journal.read_bytes()
