"""A fleet runner's SIGTERM/SIGINT handler takes no lock the interrupted main thread may hold.

CPython runs a signal handler in the main thread between two bytecodes, wherever that thread is.
The runner's handler used to set its wake-up ``threading.Event`` itself, and ``Event.set`` takes the
event's lock: a signal landing while the main loop was inside ``Event.clear()`` or ``Event.wait()``
(both take that lock) waited forever for a lock its own thread held. In CI a runner told to stop by
SIGTERM did not exit in 60 s (``test_fleet_processes``, the poison request). Here the signal is
delivered while the main thread holds that lock on purpose, in a child process, so a hang fails
the test by timeout instead of hanging the suite.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = r"""
import os, signal, sys, threading, time
from effectlog.fleet import open_store
from effectlog.fleet.runner import Runner, RunnerConfig

store = open_store(sys.argv[1])
runner = Runner(RunnerConfig(store=sys.argv[1], runner_id="R", poll_s=0.05, recover=False), store,
                log=open(os.devnull, "w"))
# Every lock the main loop takes around its waits, held while the signal's handler runs.
held = [runner._wake._cond, runner._stopping._cond]
def serve_with_the_signal_inside_its_locks():
    runner._install_signals()
    for lock in held:
        lock.acquire()
    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs here, between two bytecodes of this thread
    for _ in range(100):
        time.sleep(0)  # bytecodes for the handler to run between
    for lock in reversed(held):
        lock.release()
    return runner.serve()
code = serve_with_the_signal_inside_its_locks()
print("stopped", code, runner._stopping.is_set(), flush=True)
store.close()
"""


def test_sigterm_landing_while_the_main_loop_holds_its_wake_lock_stops_the_runner(tmp_path: Path) -> None:
    """Proves: the runner stops (exit 0, stopping set) when SIGTERM arrives while its main thread
    holds the locks of its wake-up and stop events; before, it hung there for good."""
    try:
        done = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "fleet.db")], capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise AssertionError("the runner hung: its signal handler waited for a lock its own thread held") from exc
    assert (0, "stopped 0 True") == (done.returncode, done.stdout.strip()), done.stderr[-2000:]
