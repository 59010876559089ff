"""What a wait for the disk does to the CPU time of the Python that runs after it (issue 18, fourth pass).

    .venv/bin/python experiments/wake_cost.py [--dir DIR] [--rounds 7] [--reps 400]

The bench measured effectlog's user-space CPU per step at 157-193 µs on the real disk and its total CPU
at 84-134 µs on a RAM disk, same code, same rounds. This probe runs one fixed piece of Python (``work``:
msgspec structs built and encoded, SHA-256, dict and attribute traffic, about a no-op step's mix) after
each kind of wait and reads this thread's CPU clock around the work alone (``CLOCK_THREAD_CPUTIME_ID``,
the scheduler's exact run time, not the tick-sampled user/kernel split of ``getrusage``):

- ``none``: the work back to back;
- ``fsync``: after a 4 KiB ``pwrite`` + ``fsync`` of a file in DIR (default: this checkout, on the disk);
- ``sleep``: after ``time.sleep`` for about an fsync's time (the thread blocks, no I/O);
- ``spin``: after a busy loop for as long (the thread keeps its CPU);
- ``fsync-spin``: the fsync on a helper thread while this one spins on a flag until it is done.

Rounds interleave the modes; the report is each mode's median per round and the median over rounds of
the ratio to ``spin`` in the same round. ``/proc/self/schedstat`` (run time, wait on the run queue, time
slices) and ``getrusage`` (voluntary and involuntary switches) are read around each mode.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

HERE = Path(__file__).resolve().parent


class Ev(msgspec.Struct, frozen=True, tag=True):
    run_id: str
    seq: int
    ts: int
    step_id: str
    attempt: int
    key: str


ENC = msgspec.json.Encoder()


def work(n: int = 12) -> int:
    """About 50-80 µs of the kind of Python a step runs: structs, encoding, hashing, dicts, calls."""
    acc = 0
    state: dict[str, tuple[int, bytes]] = {}
    prev = bytes(32)
    for i in range(n):
        e = Ev(run_id="bench", seq=i, ts=1_700_000_000_000 + i, step_id=f"step-{i}", attempt=1, key="k" * 16)
        body = ENC.encode(e)
        prev = hashlib.sha256(prev + body).digest()
        state[e.step_id] = (e.seq, prev)
        acc += len(body) + e.attempt + len(state)
        acc += sum(len(k) for k in state)
    return acc


def schedstat() -> tuple[int, int, int]:
    with open("/proc/thread-self/schedstat") as f:
        run, wait, slices = f.read().split()
    return int(run), int(wait), int(slices)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", default=str(HERE), help="where the fsync'd file lives (default: on the disk)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=400)
    parser.add_argument("--work", type=int, default=12, help="iterations of the work's loop")
    parser.add_argument("--steps", type=int, default=0, help="instead: effectlog runs of this many steps (below)")
    args = parser.parse_args(argv)
    if args.steps:
        return effectlog_steps(args)
    path = os.path.join(args.dir, f".wake-probe-{os.getpid()}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    page = bytes(4096)
    try:
        # How long an fsync takes here: the waits of sleep and spin are set to it.
        t = []
        for _ in range(200):
            a = time.perf_counter_ns()
            os.pwrite(fd, page, 0)
            os.fsync(fd)
            t.append(time.perf_counter_ns() - a)
        wait_ns = int(statistics.median(t))

        def fsync() -> None:
            os.pwrite(fd, page, 0)
            os.fsync(fd)

        def sleep() -> None:
            time.sleep(wait_ns / 1e9)

        def spin() -> None:
            end = time.perf_counter_ns() + wait_ns
            while time.perf_counter_ns() < end:
                pass

        def none() -> None:
            pass

        def fsync_spin() -> None:
            done = threading.Event()

            def target() -> None:
                fsync()
                done.set()

            threading.Thread(target=target).start()
            while not done.is_set():
                pass

        modes: dict[str, Callable[[], None]] = {
            "none": none, "spin": spin, "sleep": sleep, "fsync": fsync, "fsync-spin": fsync_spin,
        }  # fmt: skip
        per_round: dict[str, list[float]] = {m: [] for m in modes}
        ratios: dict[str, list[float]] = {m: [] for m in modes}
        extra: dict[str, list[tuple[float, float, float, float, float]]] = {m: [] for m in modes}
        for _ in range(args.rounds):
            medians: dict[str, float] = {}
            for name, wait in modes.items():
                cpu: list[int] = []
                r0, s0 = resource.getrusage(resource.RUSAGE_THREAD), schedstat()
                w0 = time.perf_counter_ns()
                for _ in range(args.reps):
                    wait()
                    a = time.thread_time_ns()
                    work(args.work)
                    cpu.append(time.thread_time_ns() - a)
                w1 = time.perf_counter_ns()
                r1, s1 = resource.getrusage(resource.RUSAGE_THREAD), schedstat()
                medians[name] = statistics.median(cpu) / 1000
                per_round[name].append(medians[name])
                reps = args.reps
                extra[name].append(
                    (
                        (r1.ru_nvcsw - r0.ru_nvcsw) / reps,
                        (r1.ru_nivcsw - r0.ru_nivcsw) / reps,
                        (s1[1] - s0[1]) / reps / 1000,  # run-queue wait per rep, µs
                        (r1.ru_utime - r0.ru_utime) / reps * 1e6,  # tick-sampled user per rep, µs
                        (w1 - w0) / reps / 1000,  # wall per rep, µs
                    )
                )
            for name in modes:
                ratios[name].append(medians[name] / medians["spin"])
        print(f"fsync of 4 KiB in {args.dir}: median {wait_ns / 1000:.0f} µs (sleep and spin wait as long)")
        print(f"{'mode':<11} {'work CPU µs (rounds)':<40} {'÷ spin':>7} {'vol/rep':>8} {'invol':>6} {'rq µs':>6} "
              f"{'user µs':>8} {'wall µs':>8}")  # fmt: skip
        for name in modes:
            rounds = ", ".join(f"{v:.0f}" for v in per_round[name])
            cols = [statistics.median(x[i] for x in extra[name]) for i in range(5)]
            print(
                f"{name:<11} {rounds:<40} {statistics.median(ratios[name]):>7.2f} {cols[0]:>8.2f} {cols[1]:>6.2f} "
                f"{cols[2]:>6.1f} {cols[3]:>8.0f} {cols[4]:>8.0f}"
            )
    finally:
        os.close(fd)
        os.unlink(path)
    return 0


# --steps N: effectlog itself. A run of N steps whose journal is on /dev/shm (its commits never sleep), each
# step's tool doing one of the waits above; the tool's own thread CPU (the wait) is taken out, so what is left
# is effectlog's CPU per step after a wait of that kind. Then the same run with the journal on the disk
# (--dir) and a tool that does nothing, and on /dev/shm likewise: the bench's two cases.


def effectlog_steps(args: argparse.Namespace) -> int:
    import shutil
    import tempfile

    from effectlog.adapters.protocol import Receipt, Request
    from effectlog.plan import AdapterDecl, Plan, StepDecl
    from effectlog.runtime import Runtime

    sys.path.insert(0, str(HERE))
    from bench_evidence import presize_wal

    probe = os.path.join(args.dir, f".wake-probe-{os.getpid()}")
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o600)
    page = bytes(4096)
    t = []
    for _ in range(100):
        a = time.perf_counter_ns()
        os.pwrite(fd, page, 0)
        os.fsync(fd)
        t.append(time.perf_counter_ns() - a)
    wait_ns = int(statistics.median(t))
    in_tool, in_commit = [0], [0]

    def spin() -> None:
        end = time.perf_counter_ns() + wait_ns
        while time.perf_counter_ns() < end:
            pass

    def sync(times: int) -> None:
        for _ in range(times):
            os.pwrite(fd, page, 0)
            os.fsync(fd)

    waits: dict[str, Callable[[], None]] = {
        "none": lambda: None,
        "spin": spin,
        "sleep": lambda: time.sleep(wait_ns / 1e9),
        "fsync": lambda: sync(1),
        "fsync x2": lambda: sync(2),
    }

    class Waiting:
        blocking = False
        keeps_descriptors = True

        def __init__(self, wait: Callable[[], None]) -> None:
            self.wait = wait

        def invoke(self, request: Request) -> Receipt:
            a = time.thread_time_ns()
            self.wait()
            in_tool[0] += time.thread_time_ns() - a
            return Receipt(data={"key": request.idempotency_key})

    def run(where: str, mode: str, n: int) -> float:
        d = tempfile.mkdtemp(dir=where)
        try:
            factories = {"wait": lambda decl, ctx: Waiting(waits[mode])}
            rt = Runtime(os.path.join(d, "j.db"), adapters=factories)
            rt.run(plan("warm", 20))
            presize_wal(Path(d) / "j.db")
            rt.run(plan("warm-2", 2))
            writer = rt.writer
            alone = writer.append_alone

            def timed(*a: Any) -> Any:  # the commit's own thread CPU (SQLite, the syscalls, the sync's kernel part)
                t0 = time.thread_time_ns()
                try:
                    return alone(*a)
                finally:
                    in_commit[0] += time.thread_time_ns() - t0

            writer.append_alone = timed  # type: ignore[method-assign]
            in_tool[0] = in_commit[0] = 0
            a = time.thread_time_ns()
            rt.run(plan("bench", n))
            cpu = time.thread_time_ns() - a - in_tool[0]
            commits[(where, mode)].append(in_commit[0] / n / 1000)
            rt.close()
        finally:
            shutil.rmtree(d)
        return cpu / n / 1000

    def plan(run_id: str, n: int) -> Plan:
        return Plan(
            run_id=run_id,
            adapters={"w": AdapterDecl(type="wait", idempotent=True)},
            steps=tuple(StepDecl(id=f"s{i}", adapter="w") for i in range(n)),
        )

    shm = "/dev/shm"
    cases = [(shm, m) for m in waits] + [(args.dir, "none")]
    results: dict[tuple[str, str], list[float]] = {c: [] for c in cases}
    commits: dict[tuple[str, str], list[float]] = {c: [] for c in cases}
    try:
        for _ in range(args.rounds):
            for where, mode in cases:
                results[(where, mode)].append(run(where, mode, args.steps))
    finally:
        os.close(fd)
        os.unlink(probe)
    print(f"fsync of 4 KiB in {args.dir}: median {wait_ns / 1000:.0f} µs; effectlog's thread CPU per step, "
          f"the tool's wait taken out ({args.steps} steps, {args.rounds} rounds)")  # fmt: skip
    base = results[(shm, "spin")]
    for (where, mode), values in results.items():
        ratio = statistics.median(v / b for v, b in zip(values, base, strict=True))
        label = f"journal on {'RAM' if where == shm else 'disk'}, tool: {mode}"
        inside = statistics.median(commits[(where, mode)])
        total = statistics.median(values)
        print(f"{label:<34} {total:7.1f} µs  (÷ spin {ratio:.2f}; in commits {inside:5.1f}, outside "
              f"{total - inside:5.1f})  rounds: " + ", ".join(f"{v:.0f}" for v in values))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
