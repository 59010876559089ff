"""Starting, signalling and killing real worker processes.

An armed worker tells the parent through a pipe that it reached its crash point,
then blocks; the parent kills it with SIGKILL. Synchronisation is by the pipe,
never by timing; the deadline below is only a safety net for a worker that never
reaches its point (a bug the report then names).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time

import msgspec

SAFETY_DEADLINE_S = 120.0
START = "start"  # not a crash point: the worker announces that its run begins


class ProcessRecord(msgspec.Struct, kw_only=True):
    """One process a case started, and how it ended."""

    do: str
    argv: list[str]
    arm: str | None = None
    reached: str | None = None
    exit_status: int | None = None  # None when it was ended by a signal
    signal: int | None = None
    duration_s: float = 0.0
    after_reached_s: float = 0.0  # from the worker's report to its end (the soak's kill window)
    events_after: int = 0
    effects_after: int = 0
    stderr_tail: str = ""


def effectlog_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "effectlog", *args]


def _read_line(fd: int, deadline: float) -> str | None:
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:  # the worker exited without reaching its point
            return None
        buf += chunk
    return buf.split(b"\n", 1)[0].decode()


def run_process(
    do: str,
    argv: list[str],
    arm: str | None = None,
    *,
    kill_after_s: float | None = None,
    env: dict[str, str] | None = None,
) -> ProcessRecord:
    """Run one process to its end; if ``arm`` is set, SIGKILL it when it reports reaching the point.

    With ``arm="start"`` and ``kill_after_s`` (the soak), the worker reports when its run
    begins and the parent kills it ``kill_after_s`` later: a random moment, not a checkpoint.
    """
    record = ProcessRecord(do=do, argv=argv, arm=arm)
    read_fd = write_fd = -1
    if arm is not None:
        read_fd, write_fd = os.pipe()
        argv = [*argv, "--arm", arm, "--notify-fd", str(write_fd)]
        record.argv = argv
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        pass_fds=(write_fd,) if write_fd >= 0 else (),
        env=env,
    )
    try:
        if write_fd >= 0:
            os.close(write_fd)
            line = _read_line(read_fd, start + SAFETY_DEADLINE_S)
            if line is not None:
                reached_at = time.monotonic()
                record.reached = line.split(" ", 1)[0]
                if arm != START:  # a crash point: the worker is blocked there, kill it now
                    proc.send_signal(signal.SIGKILL)
                elif kill_after_s is not None:  # the soak: kill at a random moment of the run
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=kill_after_s)
                    if proc.poll() is None:
                        proc.send_signal(signal.SIGKILL)
        try:
            _, err = proc.communicate(timeout=SAFETY_DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    finally:
        if read_fd >= 0:
            os.close(read_fd)
    if record.reached is not None:
        record.after_reached_s = round(time.monotonic() - reached_at, 4)
    record.duration_s = round(time.monotonic() - start, 4)
    if proc.returncode < 0:
        record.signal = -proc.returncode
    else:
        record.exit_status = proc.returncode
    record.stderr_tail = err.decode(errors="replace")[-400:]
    return record
