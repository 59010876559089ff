"""One owner per run, enforced between real processes; other runs of the file and readers are free.

The holder is a tiny ``python -c`` program that claims run ``payment-001`` with the
library API and holds it until its stdin closes; the second writer is the real
``effectlog run`` command and the same library API in another process, reporting
errors the way ``effectlog.cli.main`` does.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectlog.journal import SqliteJournal

# Claims run payment-001 (its first event names the owner) and writes run-1; says "ready".
HOLDER = """
import sys
from effectlog.journal import SqliteJournal
from effectlog.testing import sample_run

journal = SqliteJournal(sys.argv[1])
journal.claim("payment-001")
journal.append(sample_run("payment-001")[:1])
journal.append(sample_run("run-1"))
print("ready", flush=True)
sys.stdin.read()
journal.close()
"""

# Claims a run (argv[2]) for writing; errors are reported as effectlog.cli.main reports them.
SECOND_WRITER = """
import sys
from effectlog.errors import EffectlogError
from effectlog.journal import SqliteJournal

try:
    with SqliteJournal(sys.argv[1]) as journal:
        journal.release(journal.claim(sys.argv[2]))
except EffectlogError as exc:
    sys.stderr.write(f"effectlog: {exc.code}: {exc}\\n")
    raise SystemExit(int(exc.exit_status))
print("claimed")
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


def test_a_second_process_claiming_the_run_exits_6_naming_the_holder(
    journal: Path, holder: subprocess.Popen[str]
) -> None:
    """While one process owns a run, another claiming it gets run_owned, exit 6, naming the holder's pid and host."""
    result = python(SECOND_WRITER, str(journal), "payment-001")
    assert (6, "") == (result.returncode, result.stdout)
    expected = f"effectlog: run_owned: run 'payment-001': the run is driven by run pid {holder.pid} on "
    assert result.stderr.startswith(expected)


def test_another_run_of_the_same_file_is_free(journal: Path, holder: subprocess.Popen[str]) -> None:
    """Ownership is per run, not per file: a second process claims another run of the same journal."""
    result = python(SECOND_WRITER, str(journal), "payment-002")
    assert (0, "claimed\n", "") == (result.returncode, result.stdout, result.stderr)


def test_readers_need_no_lock(journal: Path, holder: subprocess.Popen[str]) -> None:
    """While the writer holds the lock, a reader opens the journal and `effectlog verify` succeeds."""
    with SqliteJournal(journal, writer=False) as reader:
        assert (["payment-001", "run-1"], 8) == (reader.runs(), reader.head("run-1")[0])
    result = subprocess.run(
        [sys.executable, "-m", "effectlog", "verify", "--journal", str(journal)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (0, "ok: 2 run(s), 9 event(s) verified\n") == (result.returncode, result.stdout)


def test_the_run_is_released_when_the_writer_exits(journal: Path, holder: subprocess.Popen[str]) -> None:
    """Once the holding process has closed the journal and exited, another process may claim the run."""
    assert 6 == python(SECOND_WRITER, str(journal), "payment-001").returncode
    release(holder)
    assert 0 == holder.returncode
    result = python(SECOND_WRITER, str(journal), "payment-001")
    assert (0, "claimed\n", "") == (result.returncode, result.stdout, result.stderr)


def test_effectlog_run_of_an_owned_run_exits_6_and_writes_nothing(journal: Path, holder: subprocess.Popen[str]) -> None:
    """The real CLI, as a second process, gets exit 6 naming the holder's pid; the journal is unchanged."""
    plan = Path(__file__).resolve().parents[1] / "examples" / "payment.json"
    before = journal.read_bytes()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "effectlog",
            "run",
            str(plan),
            "--journal",
            str(journal),
            "--effects",
            str(journal.parent / "effects.db"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert 6 == done.returncode
    assert f"pid {holder.pid}" in done.stderr
    assert 1 == len(done.stderr.strip().splitlines())
    assert before == journal.read_bytes()
