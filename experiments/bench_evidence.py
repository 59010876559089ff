"""What the benchmark measures besides its figures, as evidence for them (``bench.py`` uses these).

The disk's sync latency, the WAL's regime before a measured run and the pages each commit
writes to it, and how many durable syncs one step of each system waits for.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from effectlog.journal.sqlite_schema import WAL_AUTOCHECKPOINT_PAGES

HERE = Path(__file__).resolve().parent
PROBE = bytes(4096)


# -- the disk ---------------------------------------------------------------------------------------


def fsync_latency_us(workdir: Path, rounds: int = 100) -> float:
    """Median time of a 4 KiB write plus fsync on the benchmark's disk: what one durable commit waits for."""
    path = workdir / "fsync.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    samples = []
    try:
        for i in range(rounds):
            start = time.perf_counter()
            os.pwrite(fd, PROBE, (i % 8) * 4096)
            os.fsync(fd)
            samples.append((time.perf_counter() - start) * 1e6)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(samples)


# -- the WAL's regime, and what a commit writes ---------------------------------------------------


def presize_wal(path: Path) -> dict[str, int]:
    """Put a journal's WAL in its steady state before a measured run, the same way for every N.

    A fresh file's WAL grows with every commit (each sync also extends the file: metadata
    to journal) until the first checkpoint; after it, commits overwrite frames of a file
    that no longer grows. The old benchmark ran N = 100 and 1,000 wholly in the first regime
    and N = 10,000 mostly in the second. Here the WAL is first grown to the checkpoint
    interval by a filler table written on a second connection (fill, checkpoint, drop over
    the same frames), then checkpointed with RESTART: every measured run, whatever its N, appends from the
    start of an already-grown WAL, as a long-lived journal does, and later checkpoints
    (N = 10,000) happen inside the run as they would in service.
    """
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA wal_autocheckpoint = 0")
        page = int(db.execute("PRAGMA page_size").fetchone()[0])
        db.execute("CREATE TABLE bench_wal_filler (b BLOB)")
        db.execute("INSERT INTO bench_wal_filler VALUES (zeroblob(?))", (WAL_AUTOCHECKPOINT_PAGES * page,))
        # Dropping frees as many pages as were filled, so it is written after a checkpoint: over the
        # same frames, and the WAL stays one checkpoint interval long.
        for then in ("DROP TABLE bench_wal_filler", None):
            busy, frames, done = db.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
            if busy or frames != done:
                raise RuntimeError(f"{path}: could not checkpoint the WAL before the run ({busy}, {frames}, {done})")
            if then is not None:
                db.execute(then)
    finally:
        db.close()
    return {"wal_bytes": Path(f"{path}-wal").stat().st_size, "page_size": page}


class WalFrames:
    """Counts the WAL frames written between calls to ``tick`` (one call after each commit).

    Reads ``mxFrame`` and the salt from the wal-index header in the ``-shm`` file (SQLite's
    ``WalIndexHdr``: mxFrame at byte 16, salts at 32, native byte order). A new salt means
    the WAL restarted after a checkpoint: the frames since are counted from zero.
    """

    def __init__(self, path: Path) -> None:
        self.fd = os.open(f"{path}-shm", os.O_RDONLY)
        self.frames = self.checkpoints = self.ticks = 0
        self.last = self.header()

    def header(self) -> tuple[int, bytes]:
        raw = os.pread(self.fd, 48, 0)
        return int.from_bytes(raw[16:20], sys.byteorder), raw[32:40]

    def tick(self) -> None:
        now = self.header()
        self.frames += frames_between(self.last, now)
        self.checkpoints += now[1] != self.last[1]
        self.last = now
        self.ticks += 1

    def close(self) -> None:
        os.close(self.fd)


def frames_between(before: tuple[int, bytes], after: tuple[int, bytes]) -> int:
    """Frames written between two wal-index headers (mxFrame, salt): a new salt restarts the count."""
    return after[0] - before[0] if after[1] == before[1] else after[0]


# -- evidence: durable syncs per step (child processes under strace) ---------------------------------

SYNC_CALLS = ("fsync", "fdatasync", "sync_file_range", "syncfs")


def sync_calls(strace_summary: str) -> int:
    """The sync calls counted in an ``strace -c`` summary (the calls column of each sync row)."""
    total = 0
    for line in strace_summary.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[-1] in SYNC_CALLS and fields[3].isdigit():
            total += int(fields[3])
    return total


def syncs_per_step(system: str, workdir: Path, steps: int = 200, few: int = 20) -> dict[str, Any]:
    """How many times one step waits for the disk: fsync-family calls of the whole child process
    (every thread) counted by strace, for a run of ``steps`` less one of ``few`` steps, so
    start-up, warm-up and the WAL's preparation cancel out. Untimed: strace slows every call."""
    if shutil.which("strace") is None:
        return {"error": "strace is not installed"}
    counts = []
    for n in (few, steps):
        target = workdir / f"syncs-{system}-{n}"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        if system in ("dbos", "langgraph"):
            child = [str(HERE / "bench_peers.py"), system, str(n), str(target)]
        else:
            child = [str(HERE / "bench.py"), "--child-single", system, str(n), "--workdir", str(target)]
        summary = workdir / "strace.txt"
        strace = ["strace", "-f", "-qq", "-c", "-e", f"trace={','.join(SYNC_CALLS)}", "-o", str(summary)]
        try:
            done = subprocess.run(
                [*strace, sys.executable, *child], capture_output=True, text=True, timeout=1800, check=False
            )
        except subprocess.TimeoutExpired:
            return {"error": "did not finish within 1800 s"}
        finally:
            shutil.rmtree(target, ignore_errors=True)
        if done.returncode != 0:
            lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
            return {"error": (lines[-1] if lines else f"exit status {done.returncode}")[:300]}
        counts.append(sync_calls(summary.read_text()))
    return {"syncs_per_step": (counts[1] - counts[0]) / (steps - few), "calls": counts, "steps": [few, steps]}
