"""The lost-WAL check before each commit must not read the WAL's timestamps (issue 18, fourth pass).

Since Linux 6.13 (multigrain timestamps) a file whose ctime or mtime was read (``stat``) gets a
fine-grained new mtime at its next write, which dirties its inode; ext4 then writes the inode's block
in the commit's ``fdatasync``, a third I/O round trip per commit (3.0 sleeps per commit against
SQLite's own 2.0, measured). A write whose file was not looked at since its last write takes the
coarse clock instead: a time no later than a fine reading of the clock taken just before it. These
tests watch that on real files, with no timing: after ``os.stat`` (the control; skipped where the
kernel has no multigrain timestamps) every write takes a fresh fine-grained mtime, after the check
none does (a clock tick falling inside the window can make one look fresh: a few are allowed).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from effectlog.journal import SqliteJournal, walwatch
from effectlog.journal.walwatch import WalWatch
from effectlog.testing import sample_run

TRIES = 20
NO_MULTIGRAIN = "this kernel gives coarse mtimes to files whose timestamps were read (no multigrain timestamps)"


def _fresh_after(path: Path, write: Callable[[], None], look: Callable[[], object]) -> int:
    """How many of TRIES writes made right after ``look()`` took a fine-grained mtime newer than a clock
    reading taken after ``look()`` and before the write (the file's flag cleared by a write first)."""
    fresh = 0
    for _ in range(TRIES):
        os.stat(path)  # read: the next write takes a fine-grained mtime, which clears the flag
        write()
        look()
        before = time.time_ns()
        write()
        fresh += os.stat(path).st_mtime_ns > before
    return fresh


def _multigrain(path: Path, write: Callable[[], None]) -> None:
    """Skip unless a write after ``os.stat`` takes a fresh fine-grained mtime (most of the time: a clock tick
    between the two writes gives the coarse clock's newer time instead)."""
    if _fresh_after(path, write, lambda: os.stat(path)) < TRIES // 2:
        pytest.skip(NO_MULTIGRAIN)


def test_the_wal_check_reads_no_timestamps(tmp_path: Path) -> None:
    """``WalWatch.lost()`` looks at the WAL without reading its ctime or mtime: the writes after it keep the
    coarse clock, where the same writes after ``os.stat`` take fresh fine-grained times."""
    wal = tmp_path / "j.db-wal"
    fd = os.open(wal, os.O_RDWR | os.O_CREAT, 0o600)
    try:

        def write() -> None:
            os.pwrite(fd, b"x" * 64, 0)

        _multigrain(wal, write)
        watch = WalWatch(str(tmp_path / "j.db"))
        assert _fresh_after(wal, write, watch.lost) <= TRIES // 4
        assert not watch.lost()
    finally:
        os.close(fd)


def test_a_journal_commit_does_not_read_its_wal_timestamps(tmp_path: Path) -> None:
    """End to end on a real journal (WAL, synchronous=FULL): a commit's own checks before it writes (the
    moved file, the lost WAL) do not read the WAL's timestamps, so its writes take the coarse clock and
    its sync writes no inode; with an ``os.stat`` of the WAL before it, they take fresh times. (The
    write that clears the flag first rewrites the WAL header's own bytes, unchanged, between commits.)"""
    path = tmp_path / "j.db"
    journal = SqliteJournal(path)
    try:
        claim = journal.claim("r")
        events = iter(sample_run("r", steps=TRIES))
        journal.append([next(events)])  # the owner row: the next appends take the one-statement path
        wal = Path(f"{path}-wal")
        fd = os.open(wal, os.O_RDWR)
        try:
            header = os.pread(fd, 32, 0)

            def fresh_after(look: Callable[[], object]) -> int:
                fresh = 0
                for _ in range(TRIES // 2):
                    os.stat(wal)
                    os.pwrite(fd, header, 0)  # the same bytes: a fine-grained mtime, the flag cleared
                    look()
                    before = time.time_ns()
                    journal.append([next(events)])  # its checks, then its writes
                    fresh += os.stat(wal).st_mtime_ns > before
                return fresh

            if fresh_after(lambda: os.stat(wal)) < TRIES // 4:
                pytest.skip(NO_MULTIGRAIN)
            assert fresh_after(lambda: None) <= TRIES // 8  # a tick of the clock in the window can make one look fresh
        finally:
            os.close(fd)
        journal.release(claim)
    finally:
        journal.close()


def test_identity_is_what_stat_gives(tmp_path: Path) -> None:
    """``walwatch.identity`` gives ``(st_dev, st_ino)`` as ``os.stat`` does, symlinks followed, ``None`` for no
    file; the same where ``statx`` is unavailable, and it falls back to ``os.stat`` for good when a
    sandbox refuses ``statx`` (then the answers are still right)."""
    f = tmp_path / "f"
    f.write_bytes(b"x")
    link = tmp_path / "link"
    link.symlink_to(f)
    cases = [str(f), str(tmp_path), str(link), "/dev/null"]

    def expected(p: str) -> tuple[int, int]:
        st = os.stat(p)
        return st.st_dev, st.st_ino

    for p in cases:
        assert walwatch.identity(p) == expected(p)
    assert walwatch.identity(str(tmp_path / "missing")) is None
    saved = walwatch._Use.statx
    try:
        walwatch._Use.statx = None
        assert [walwatch.identity(p) for p in cases] == [expected(p) for p in cases]
        assert walwatch.identity(str(tmp_path / "missing")) is None
        if saved is not None:
            walwatch._Use.statx = lambda *args: -1  # a sandbox's filter: every statx call refused
            assert walwatch.identity(str(tmp_path / "missing")) is None
            assert walwatch._Use.statx is not None  # a missing file is no proof that statx is refused
            assert walwatch.identity(str(f)) == expected(str(f))
            assert walwatch._Use.statx is None  # refused where stat answered: stat from now on
    finally:
        walwatch._Use.statx = saved
