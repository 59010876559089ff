"""Before/after of per-run ownership (issue 11): one run of N steps and K concurrent runs, side by side.

    .venv/bin/python experiments/ownership_bench.py --before REV [--reps 5]

``--before`` is a git revision (e.g. the commit before ownership landed); it is checked
out into a temporary worktree and both trees run the same measurement in child
processes, interleaved (before, after, before, after, ...), so each ratio compares runs
taken seconds apart on the same disk. Reported: median wall time per step for one run
of 1,000 no-op steps and aggregate steps/s for 32 runs of 100 steps in one process,
plus CPU time, and the after/before ratio. Results go to
``experiments/results/ownership.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import asyncio, json, sys, time
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime

def plan(run_id, steps):
    return Plan(run_id=run_id, adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
                steps=tuple(StepDecl(id=f"step-{i}", adapter="noop") for i in range(steps)))

what, path = sys.argv[1], sys.argv[2]
with Runtime(path) as rt:
    rt.run(plan("warm-up", 5))
    wall, cpu = time.perf_counter(), time.process_time()
    if what == "single":
        outcomes = [rt.run(plan("bench", 1000))]
        steps = 1000
    else:
        outcomes = asyncio.run(rt.arun_many([plan(f"bench-{k}", 100) for k in range(32)]))
        steps = 3200
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
assert all(o.state == "completed" for o in outcomes)
print(json.dumps({"us_per_step": wall / steps * 1e6, "steps_per_s": steps / wall,
                  "cpu_us_per_step": cpu / steps * 1e6}))
"""


def measure(src: Path, what: str, workdir: Path, n: int) -> dict[str, float]:
    journal = workdir / f"{src.parent.name}-{what}-{n}.db"
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, what, str(journal)], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", required=True, help="git revision to compare against")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=ROOT / "experiments" / "results" / "ownership.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before_tree = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before_tree), args.before],
                       check=True, capture_output=True)  # fmt: skip
        try:
            trees = {"before": before_tree / "src", "after": ROOT / "src"}
            samples: dict[str, dict[str, list[dict[str, float]]]] = {k: {"single": [], "concurrent": []} for k in trees}
            for n in range(args.reps):
                for what in ("single", "concurrent"):
                    for name, src in trees.items():
                        samples[name][what].append(measure(src, what, Path(tmp), n))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before_tree)], check=False)
    report: dict[str, Any] = {"before": args.before, "reps": args.reps}
    for what, metric in (("single", "us_per_step"), ("concurrent", "steps_per_s")):
        row = {name: statistics.median(s[metric] for s in samples[name][what]) for name in samples}
        cpu = {name: statistics.median(s["cpu_us_per_step"] for s in samples[name][what]) for name in samples}
        report[what] = {"metric": metric, **row, "ratio_after_before": row["after"] / row["before"],
                        "cpu_us_per_step": cpu}  # fmt: skip
        print(
            f"{what:10s} {metric:12s} before {row['before']:9.1f}  after {row['after']:9.1f}  "
            f"after/before {row['after'] / row['before']:.3f}  cpu us/step {cpu['before']:.1f} -> {cpu['after']:.1f}"
        )
    args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
