"""Instructions per steady step of a no-op run, counted by valgrind: a measure that a loaded
machine does not move, for comparing two versions of the hot path (issue 18).

    .venv/bin/python experiments/instructions_per_step.py [SRC_DIR ...]   # default: ./src
    .venv/bin/python experiments/instructions_per_step.py --fleet [SRC_DIR ...]   # per fleet run

For each source tree it runs, under ``valgrind --tool=callgrind``, one run of 300 and one of
1,300 no-op steps on /dev/shm (after warm-up runs and the WAL presized, as ``bench.py`` does)
and prints the difference divided by 1,000: user-space instructions (Python, SQLite, msgspec,
OpenSSL) per step, kernel work excluded. The cyclic GC is off in the child, because a full
collection falling in one run and not the other moves the difference by tens of thousands of
instructions per step; the GC's own share is measured by running with ``--gc``.
Each tree is run once before counting so its bytecode caches are written (compiling a changed
module would otherwise be counted). CPU time on a shared 2-core machine varies by +-15%
between rounds; this count varies by about 1%.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHILD = r"""
import asyncio, gc, os, shutil, sys, tempfile
from pathlib import Path
sys.path.insert(0, os.environ["BENCH_DIR"])
from bench import noop_plan
from bench_evidence import presize_wal
from effectlog.runtime import Runtime
if not os.environ.get("KEEP_GC"):
    gc.disable()
d = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
try:
    rt = Runtime(os.path.join(d, "j.db"))
    rt.run(noop_plan("warm-up", 5))
    presize_wal(Path(d) / "j.db")
    rt.run(noop_plan("warm-up-2", 2))
    k = int(os.environ["RUNS"])
    if k > 1:
        asyncio.run(rt.arun_many([noop_plan(f"b-{i}", int(os.environ["STEPS"])) for i in range(k)]))
    else:
        rt.run(noop_plan("bench", int(os.environ["STEPS"])))
    rt.close()
finally:
    shutil.rmtree(d)
"""


def instructions(src: str, steps: int, runs: int, *, keep_gc: bool, valgrind: bool = True) -> int:
    env = {
        "PYTHONPATH": src,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONHASHSEED": "0",
        "BENCH_DIR": str(HERE),
        "STEPS": str(steps),
        "RUNS": str(runs),
        **({"KEEP_GC": "1"} if keep_gc else {}),
    }
    command = [sys.executable, "-c", CHILD]
    if valgrind:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    if not valgrind:
        return 0
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1))


# --fleet: one SQLite fleet runner (capacity 1, recovery passes on) over queued 2-step no-op runs, as
# fleet_bench.py's runs/s measures them; the requests are submitted outside valgrind. Heartbeats, recovery
# passes and idle polls come with wall time, which valgrind stretches by the machine's load: their intervals
# are set long enough that none falls inside the counted runs (else the count moves by ~25% with the load).
FLEET_SUBMIT = r"""
import os, sys
sys.path.insert(0, os.environ["BENCH_DIR"])
from fleet_bench import submit_all
submit_all(sys.argv[1], int(sys.argv[2]), 2)
"""
FLEET_RUN = r"""
import gc, sys
gc.disable()
from effectlog.cli import main
quiet = ["--lease-s", "3000", "--heartbeat-s", "1000", "--poll-s", "1000"]
main(["runner", "--store", sys.argv[1], "--capacity", "1", *quiet, "--exit-when-idle", "--runner-id", "r1"])
"""


def fleet_instructions(src: str, runs: int) -> int:
    """Instructions of one runner process that drives ``runs`` queued runs to success and exits when idle."""
    env = {"PYTHONPATH": src, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONHASHSEED": "0",
           "BENCH_DIR": str(HERE)}  # fmt: skip
    where = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        store = os.path.join(where, "fleet.db")
        subprocess.run([sys.executable, "-c", FLEET_SUBMIT, store, str(runs)], env=env, check=True)
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", FLEET_RUN]
        done = subprocess.run([*command, store], env=env, capture_output=True, text=True, check=True)
    finally:
        shutil.rmtree(where)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_step(src: str, runs: int, *, keep_gc: bool = False) -> float:
    """Instructions per steady step of ``runs`` concurrent no-op runs: two counted runs' difference."""
    small, large = (300, 1300) if runs == 1 else (20, 70)
    instructions(src, 2, 1, keep_gc=keep_gc, valgrind=False)  # bytecode caches written
    diff = instructions(src, large, runs, keep_gc=keep_gc) - instructions(src, small, runs, keep_gc=keep_gc)
    return diff / ((large - small) * runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("src", nargs="*", default=[str(HERE.parent / "src")], help="source trees to compare")
    parser.add_argument("--runs", type=int, default=1, help="concurrent runs (arun_many); steps per run scale down")
    parser.add_argument("--gc", action="store_true", help="leave the cyclic GC on")
    parser.add_argument("--fleet", action="store_true", help="instructions per fleet run (one SQLite runner) instead")
    args = parser.parse_args(argv)
    if args.fleet:
        for src in args.src:
            diff = fleet_instructions(src, 240) - fleet_instructions(src, 40)
            print(f"{src}: {diff / 200 / 1000:.1f}k instructions per fleet run (2-step no-op runs, SQLite, 1 runner)")
        return 0
    for src in args.src:
        counted = per_step(src, args.runs, keep_gc=args.gc)
        gc = "on" if args.gc else "off"
        print(f"{src}: {counted / 1000:.1f}k instructions per step (runs={args.runs}, gc={gc})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
