"""Instructions per steady step of a no-op run, counted by valgrind: a measure that a loaded
machine does not move, for comparing two versions of the hot path (issue 18).

    .venv/bin/python experiments/instructions_per_step.py [SRC_DIR ...]   # default: ./src

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
import subprocess
import sys
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("src", nargs="*", default=[str(HERE.parent / "src")], help="source trees to compare")
    parser.add_argument("--runs", type=int, default=1, help="concurrent runs (arun_many); steps per run scale down")
    parser.add_argument("--gc", action="store_true", help="leave the cyclic GC on")
    args = parser.parse_args(argv)
    small, large = (300, 1300) if args.runs == 1 else (20, 70)
    for src in args.src:
        instructions(src, 2, 1, keep_gc=args.gc, valgrind=False)  # bytecode caches written
        diff = instructions(src, large, args.runs, keep_gc=args.gc) - instructions(
            src, small, args.runs, keep_gc=args.gc
        )
        per_step = diff / ((large - small) * args.runs)
        gc = "on" if args.gc else "off"
        print(f"{src}: {per_step / 1000:.1f}k instructions per step (runs={args.runs}, gc={gc})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
