"""Fleet throughput: claims per second and end-to-end runs per second, 1, 2, 4 and 8 runner processes.

    .venv/bin/python experiments/fleet_bench.py [--quick]

Both backends in one invocation, on this machine: a SQLite fleet store (WAL,
``synchronous=FULL``) and a PostgreSQL store on a throwaway local server with fsync
on (``tests/pg_cluster.py``, ``durable=True``). For each backend and each number of
runner processes N:

* **claims/s**: M queued requests, N processes each looping "list candidates, schedule,
  claim" until nothing is queued. Nothing runs: this is the lease machinery alone.
* **runs/s**: M requests of a two-step no-op plan, N real ``effectlog runner``
  processes (capacity 1, recovery passes on, as deployed), each claim -> prepare ->
  start -> the runtime's two durable commits per step -> succeed.

Rates come from the store's own history timestamps (first lease to last lease, or to
last success), so process start-up is not counted. The machine's CPU count is in the
results: with fewer cores than processes, the processes share them. Results go to
``experiments/results/fleet.json`` and the "Numbers" section of ``docs/fleet.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from effectlog.fleet import open_store, schedule
from effectlog.fleet.model import Offer
from effectlog.fleet.runner import spread
from effectlog.plan import AdapterDecl, Plan, StepDecl

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results" / "fleet.json"
DOC = ROOT / "docs" / "fleet.md"
START, END = "<!-- fleet-bench:start -->", "<!-- fleet-bench:end -->"
PROCESSES = (1, 2, 4, 8)


def noop_plan(run_id: str, steps: int) -> Plan:
    return Plan(
        run_id=run_id,
        adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
        steps=tuple(StepDecl(id=f"s{i}", adapter="noop") for i in range(steps)),
    )


def submit_all(url: str, count: int, steps: int) -> None:
    store = open_store(url)
    try:
        for i in range(count):
            store.submit("bench", f"k{i}", noop_plan(f"run-{i}", steps))
    finally:
        store.close()


def claim_worker(url: str, runner_id: str) -> None:
    """Child process: say ready, wait for "go", claim until nothing is queued (the lease path alone)."""
    store = open_store(url)
    offer = Offer(runner_id=runner_id, capabilities=frozenset(), free=8)
    try:
        print("ready", flush=True)
        sys.stdin.readline()
        while True:
            candidates = store.candidates(32)
            if not candidates:
                return
            for request_id in spread(schedule(candidates, offer), runner_id):
                store.claim(request_id, runner_id, 300.0)
    finally:
        store.close()


def span(url: str, first: str, last: str) -> tuple[int, float]:
    """(count of `last` transitions, seconds from the first `first` to the last `last`), by the store's clock."""
    store = open_store(url)
    try:
        rows = store.history()
    finally:
        store.close()
    starts = [h.at for h in rows if h.transition == first]
    ends = [h.at for h in rows if h.transition == last]
    return len(ends), max(ends) - min(starts)


def measure_claims(url: str, n: int, count: int, tmp: Path) -> float:
    """All N claimers start together (a ready/go barrier over their pipes)."""
    submit_all(url, count, 1)
    with open(tmp / "claims.log", "ab") as log:
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "claim-worker", url, f"claimer-{i}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
            )
            for i in range(n)
        ]
    for p in procs:
        assert p.stdout is not None
        if p.stdout.readline().strip() != b"ready":
            raise SystemExit(f"claim worker did not start; see {tmp / 'claims.log'}")
    for p in procs:
        assert p.stdin is not None
        p.stdin.write(b"go\n")
        p.stdin.flush()
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"claim worker failed: {codes}; see {tmp / 'claims.log'}")
    claimed, seconds = span(url, "lease", "lease")
    if claimed != count:
        raise SystemExit(f"{claimed} claims for {count} requests")
    return claimed / seconds


def measure_runs(url: str, n: int, count: int, tmp: Path) -> float:
    """N runners start on an empty store and say ready; then the requests arrive; SIGTERM once all succeeded."""
    open_store(url).close()  # create the schema before N processes race to
    argv = [
        sys.executable, "-m", "effectlog", "runner", "--store", url, "--capacity", "1", "--poll-s", "0.01",
        "--lease-s", "30",
    ]  # fmt: skip
    logs = [tmp / f"runner-{n}-{i}.log" for i in range(n)]
    procs = []
    for i, log_path in enumerate(logs):
        with open(log_path, "wb") as log:
            procs.append(
                subprocess.Popen(
                    [*argv, "--runner-id", f"runner-{i}"], stdin=subprocess.DEVNULL, stdout=log, stderr=log
                )
            )
    deadline = time.monotonic() + 120
    while not all("ready:" in p.read_text(errors="replace") for p in logs):
        if time.monotonic() > deadline or any(proc.poll() is not None for proc in procs):
            raise SystemExit(f"runners did not start; see {tmp}")
        time.sleep(0.05)
    submit_all(url, count, 2)
    store = open_store(url)
    try:
        while len(store.requests(["succeeded"])) < count:
            if time.monotonic() > deadline + 600:
                raise SystemExit(f"runs did not finish; see {tmp}")
            time.sleep(0.1)
    finally:
        store.close()
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    codes = [proc.wait() for proc in procs]
    if any(codes):
        raise SystemExit(f"runner failed: {codes}; see {tmp}")
    done, seconds = span(url, "lease", "succeed")
    return done / seconds


def bench_backend(
    name: str, fresh_url: Any, tmp: Path, *, claims: int, runs: int, repeat: int
) -> dict[str, dict[str, float]]:
    """Median of ``repeat`` measurements per process count, each on a fresh store."""
    out: dict[str, dict[str, float]] = {}
    for n in PROCESSES:
        c = statistics.median(measure_claims(fresh_url(), n, claims, tmp) for _ in range(repeat))
        r = statistics.median(measure_runs(fresh_url(), n, runs, tmp) for _ in range(repeat))
        out[str(n)] = {"claims_per_s": round(c, 1), "runs_per_s": round(r, 1)}
        print(f"{name:<10} {n} runner process(es): {c:8.1f} claims/s  {r:7.1f} runs/s", flush=True)
    return out


def render(results: dict[str, Any]) -> str:
    m = results["machine"]
    lines = [
        START,
        "",
        f"Measured by `experiments/fleet_bench.py` on {m['cpus']} CPU(s), {m['platform']}, Python {m['python']};"
        f" {results['params']['claims']} requests for claims, {results['params']['runs']} two-step no-op runs,"
        f" median of {results['params']['repeat']} measurements each."
        " SQLite: WAL, `synchronous=FULL`. PostgreSQL: local server, fsync on."
        " Rates use the store's history timestamps, so process start-up is excluded.",
        "",
        "| backend | runner processes | claims/s | vs 1 process | runs/s | vs 1 process |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for backend, rows in results["results"].items():
        one = rows["1"]
        for n, row in rows.items():
            lines.append(
                f"| {backend} | {n} | {row['claims_per_s']:.0f} | {row['claims_per_s'] / one['claims_per_s']:.2f} |"
                f" {row['runs_per_s']:.1f} | {row['runs_per_s'] / one['runs_per_s']:.2f} |"
            )
    lines += ["", END]
    return "\n".join(lines)


def write_doc(section: str) -> None:
    text = DOC.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{DOC}: no {START} ... {END} section to fill")
    DOC.write_text(pattern.sub(lambda _: section, text), encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run, not for the docs)")
    parser.add_argument("--no-doc", action="store_true", help="do not rewrite docs/fleet.md")
    args = parser.parse_args()
    claims, runs = (60, 30) if args.quick else (400, 160)
    repeat = 1 if args.quick else 3
    sys.path.insert(0, str(ROOT / "tests"))
    from pg_cluster import PgCluster

    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "params": {"claims": claims, "runs": runs, "processes": list(PROCESSES), "repeat": repeat},
        "results": {},
    }
    with tempfile.TemporaryDirectory(prefix="effectlog-fleet-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        counter = iter(range(10**6))
        results["results"]["sqlite"] = bench_backend(
            "sqlite", lambda: str(tmp / f"fleet-{next(counter)}.db"), tmp, claims=claims, runs=runs, repeat=repeat
        )
        with PgCluster(durable=True) as pg:
            results["results"]["postgres"] = bench_backend(
                "postgres", pg.create_database, tmp, claims=claims, runs=runs, repeat=repeat
            )
    results["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if not args.quick:
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")
        if not args.no_doc:
            write_doc(render(results))
    print(render(results))
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "claim-worker":
        claim_worker(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(main())
