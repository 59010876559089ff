"""Helpers for the fleet's process tests: real runner processes, pipes to know where they are, a store to look.

Synchronisation is by pipes and by polling the store, never by sleeping a guessed
time; ``SAFETY_S`` is only a net so that a bug fails the test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from effectlog.fleet import FleetStore, open_store

SAFETY_S = 120.0
T = TypeVar("T")


def effectlog(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the CLI in a child process; with ``check`` a non-zero exit fails the test with its stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "effectlog", *args], capture_output=True, text=True, timeout=SAFETY_S, check=False
    )
    if check and done.returncode != 0:
        pytest.fail(f"effectlog {' '.join(args)} exited {done.returncode}: {done.stderr}")
    return done


def write_plan(path: Path, run_id: str, steps: list[tuple[str, str]]) -> Path:
    """A plan whose steps are (id, adapter) with adapters `control` (no idempotency) and `idem`."""
    plan = {
        "run_id": run_id,
        "adapters": {
            "control": {"type": "effects.control"},
            "idem": {"type": "effects.idempotent", "idempotent": True},
        },
        "steps": [{"id": sid, "adapter": adapter, "args": {"n": i}} for i, (sid, adapter) in enumerate(steps)],
    }
    path.write_text(json.dumps(plan))
    return path


class RunnerProcess:
    """One `effectlog runner` child; optionally armed at a point it reports on a pipe, then blocks."""

    def __init__(
        self,
        store: str,
        workdir: Path,
        name: str,
        *,
        arm: str | None = None,
        resumable: bool = False,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.log_path = workdir / f"runner-{name}.log"
        argv = [
            sys.executable, "-m", "effectlog", "runner", "--store", store, "--runner-id", name,
            "--effects", str(workdir / "effects.db"), *extra,
        ]  # fmt: skip
        self.notify_r = self.resume_w = -1
        keep: list[int] = []
        if arm is not None:
            self.notify_r, notify_w = os.pipe()
            argv += ["--arm", arm, "--notify-fd", str(notify_w)]
            keep.append(notify_w)
            if resumable:
                resume_r, self.resume_w = os.pipe()
                argv += ["--resume-fd", str(resume_r)]
                keep.append(resume_r)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=keep)
        for fd in keep:
            os.close(fd)

    def reached(self) -> str:
        """Block until the armed point is reported; returns "<point> <step>"."""
        deadline = time.monotonic() + SAFETY_S
        buf = b""
        while b"\n" not in buf:
            ready, _, _ = select.select([self.notify_r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                pytest.fail(f"runner {self.name} never reached its point; log: {self.log()}")
            chunk = os.read(self.notify_r, 4096)
            if not chunk:
                pytest.fail(f"runner {self.name} exited before its point; log: {self.log()}")
            buf += chunk
        return buf.split(b"\n", 1)[0].decode()

    def resume(self) -> None:
        os.write(self.resume_w, b"go")

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def wait(self) -> int:
        try:
            return self.proc.wait(timeout=SAFETY_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"runner {self.name} did not exit; log: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Teardown: make sure nothing is left running (a stopped process needs SIGCONT to die cleanly)."""
        if self.proc.poll() is None:
            for signum in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(self.proc.pid, signum)
                except ProcessLookupError:
                    break
            self.proc.wait()
        for fd in (self.notify_r, self.resume_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


def wait_until(check: Callable[[], T | None], what: str, *, every: float = 0.05) -> T:
    """Poll ``check`` until it returns something other than None/False; fail after the safety net."""
    deadline = time.monotonic() + SAFETY_S
    while True:
        found = check()
        if found is not None and found is not False:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting: {what}")
        time.sleep(every)


def looking(location: str) -> Iterator[FleetStore]:
    store = open_store(location)
    try:
        yield store
    finally:
        store.close()


def snapshot(store: FleetStore, run_id: str, effects: Path) -> dict[str, Any]:
    """Everything a zombie might change: requests, attempts, history, the run's journal, the effect ledger."""
    from effectlog.adapters.effects import EffectStore

    ledger = EffectStore(effects)
    try:
        rows = [(r.step_id, r.attempt, r.idempotency_key) for r in ledger.rows()]
    finally:
        ledger.close()
    return {
        "requests": store.requests(),
        "attempts": store.attempts(),
        "history": store.history(),
        "journal": [(r.seq, r.body, r.hash) for r in store.journal().read(run_id)],
        "effects": rows,
    }


# -- fixtures (modules use them with ``pytest_plugins = ["pg_fixture", "fleet_kit"]``) ----------


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh fleet store: a SQLite file, or a database on the throwaway PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "fleet.db")
    request.applymarker(pytest.mark.postgres)
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(store_url: str) -> Iterator[FleetStore]:
    s = open_store(store_url)
    yield s
    s.close()


@pytest.fixture
def runners() -> Iterator[list[RunnerProcess]]:
    started: list[RunnerProcess] = []
    yield started
    for runner in started:
        runner.stop()


def together(scripts: list[list[str]], timeout: float = 300) -> list[Any]:
    """Start one ``python -c`` child per argv, wait until each says ``ready``, tell them all ``go`` at
    once, and return each one's last line of output as JSON (each must exit 0)."""
    procs = [
        subprocess.Popen([sys.executable, "-c", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for argv in scripts
    ]
    for p in procs:
        assert p.stdout is not None
        assert "ready" == p.stdout.readline().strip()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=timeout)
        assert 0 == p.returncode
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out
