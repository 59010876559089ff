"""What OpenTelemetry costs per step (issue 16), side by side in one run.

    .venv/bin/python experiments/otel_overhead.py [--before REV] [--reps 5]

Four variants run the same measurement in child processes, interleaved (so each ratio
compares runs taken seconds apart on the same disk): ``before`` (a git revision without the
instrumentation, checked out into a temporary worktree; default: the branch's merge base
with main), ``off`` (this tree, OpenTelemetry not imported), ``api`` (this tree, the API
imported but no SDK configured: what an application with the ``[otel]`` extra and no set-up
gets) and ``on`` (the SDK configured, every span and metric recorded, spans handed to an
exporter that drops them). Reported: median wall and CPU time per step for one run of 1,000
no-op steps, and the ratio to ``before``. ``--dir /dev/shm`` puts the journals in memory, so
the comparison is not drowned by a shared disk's fsync times. Results go to
``experiments/results/otel_overhead.json``.
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
import json, sys, time
mode, path = sys.argv[1], sys.argv[2]
if mode in ("api", "on"):
    import opentelemetry.metrics, opentelemetry.trace
if mode == "on":
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime

def plan(run_id, steps):
    return Plan(run_id=run_id, adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
                steps=tuple(StepDecl(id=f"step-{i}", adapter="noop") for i in range(steps)))

with Runtime(path) as rt:
    rt.run(plan("warm-up", 5))
    wall, cpu = time.perf_counter(), time.process_time()
    outcome = rt.run(plan("bench", 1000))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
assert outcome.state == "completed"
print(json.dumps({"us_per_step": wall / 1000 * 1e6, "cpu_us_per_step": cpu / 1000 * 1e6}))
"""

VARIANTS = ("before", "off", "api", "on")


def measure(src: Path, mode: str, journal: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    for name in [k for k in env if k.startswith("OTEL_")]:
        del env[name]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, "off" if mode == "before" else mode, str(journal)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", help="git revision without the instrumentation (default: merge base with main)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", type=Path, help="where the journals go (e.g. /dev/shm: no disk noise, CPU only)")
    parser.add_argument("--json", type=Path, default=ROOT / "experiments" / "results" / "otel_overhead.json")
    args = parser.parse_args()
    before = (
        args.before
        or subprocess.run(
            ["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    with tempfile.TemporaryDirectory() as tmp:
        before_tree = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before_tree), before],
                       check=True, capture_output=True)  # fmt: skip
        try:
            samples: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
            for n in range(args.reps):
                for mode in VARIANTS:
                    src = before_tree / "src" if mode == "before" else ROOT / "src"
                    where = args.dir if args.dir is not None else Path(tmp)
                    samples[mode].append(measure(src, mode, where / f"otel-overhead-{os.getpid()}-{mode}-{n}.db"))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before_tree)], check=False)
    report: dict[str, Any] = {"revision": before, "reps": args.reps, "steps": 1000, "dir": str(args.dir or "tmp")}
    base = statistics.median(s["us_per_step"] for s in samples["before"])
    for mode in VARIANTS:
        wall = statistics.median(s["us_per_step"] for s in samples[mode])
        cpu = statistics.median(s["cpu_us_per_step"] for s in samples[mode])
        spread = (min(s["us_per_step"] for s in samples[mode]), max(s["us_per_step"] for s in samples[mode]))
        report[mode] = {"us_per_step": wall, "cpu_us_per_step": cpu, "range": spread, "ratio_to_before": wall / base}
        print(f"{mode:7s} us/step {wall:8.1f} (range {spread[0]:.1f}-{spread[1]:.1f})  cpu us/step {cpu:7.1f}  "
              f"ratio to before {wall / base:.3f}")  # fmt: skip
    args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
