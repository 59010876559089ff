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

from effectlog.fleet import open_store
from effectlog.plan import AdapterDecl, Plan, StepDecl

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results" / "fleet.json"
DOC = ROOT / "docs" / "fleet.md"
START, END = "<!-- fleet-bench:start -->", "<!-- fleet-bench:end -->"
PROCESSES = (1, 2, 4, 8)
TRACE = os.environ.get("FLEET_BENCH_TRACE")  # a file to append every counted statement to (debugging)
RUNNER_ARGS: list[str] = []  # extra `effectlog runner` flags (--runner-args)


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
    """Child process: say ready, wait for "go", claim as a runner does (``claim_next``) until nothing is left.

    Prints how many claim transactions it made and how many leases they gave, so the
    parent can report attempts per claim (the last, empty-handed call included).
    """
    store = open_store(url)
    calls = leases = 0
    try:
        print("ready", flush=True)
        sys.stdin.readline()
        while True:
            calls += 1
            got = store.claim_next(runner_id, [], 300.0, 1)  # as a runner of capacity 1 claims
            if not got:
                break
            leases += len(got)
    finally:
        store.close()
    print(json.dumps({"calls": calls, "leases": leases}), flush=True)


class Counts:
    """Statements, commits and CPU seconds of one runner process, from the moment it is ready (bench only)."""

    def __init__(self) -> None:
        self.statements = 0
        self.commits = 0
        self.cpu0 = 0.0

    def reset(self) -> None:
        self.statements = self.commits = 0
        self.cpu0 = time.process_time()

    def sql(self, text: str, many: int = 1, *, alone: bool = False) -> None:
        """``many`` statements; ``alone``: outside any transaction block, so a transaction of its own."""
        self.statements += many
        if TRACE is not None:
            with open(TRACE, "a", encoding="utf-8") as f:
                f.write(f"{many} {int(alone)} {' '.join(text.split())[:150]}\n")
        word = text.lstrip()[:8].upper()
        if word.startswith("COMMIT") or (alone and not word.startswith(("BEGIN", "ROLLBACK"))):
            self.commits += 1


def traced_runner(out_path: str, argv: list[str]) -> int:
    """Child process: ``effectlog runner ARGV`` with its SQL counted (wrappers, in this bench only).

    SQLite: a trace callback on every connection counts statements, ``COMMIT``s are
    its commits. PostgreSQL: cursor executes (``executemany`` counts each row, as the
    server sees each) and the driver's own ``BEGIN``/``COMMIT``; the server's
    ``xact_commit`` is read by the parent. Counting starts when ``serve`` starts, so
    opening the store (schema checks) is not charged to the runs.
    """
    import atexit
    import sqlite3

    import psycopg
    from psycopg import _connection_base

    from effectlog.cli import main as cli_main
    from effectlog.fleet import runner as runner_mod

    counts = Counts()
    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        db = real_connect(*args, **kwargs)
        db.set_trace_callback(lambda text: counts.sql(text, alone=not db.in_transaction))
        return db

    sqlite3.connect = connect  # type: ignore[assignment]
    real_execute, real_many = psycopg.Cursor.execute, psycopg.Cursor.executemany
    real_command = _connection_base.BaseConnection._exec_command

    def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        conn = self.connection
        alone = conn.autocommit and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        counts.sql(query if isinstance(query, str) else "", alone=alone)
        return real_execute(self, query, *args, **kwargs)

    def executemany(self: Any, query: Any, params_seq: Any, *args: Any, **kwargs: Any) -> Any:
        rows = list(params_seq)
        counts.sql("", len(rows))
        return real_many(self, query, rows, *args, **kwargs)

    def command(self: Any, cmd: Any, *args: Any, **kwargs: Any) -> Any:
        counts.sql(cmd.decode() if isinstance(cmd, bytes) else str(cmd))
        return real_command(self, cmd, *args, **kwargs)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]
    _connection_base.BaseConnection._exec_command = command  # type: ignore[method-assign]
    real_serve = runner_mod.Runner.serve

    def serve(self: Any) -> int:
        counts.reset()
        return real_serve(self)

    runner_mod.Runner.serve = serve  # type: ignore[method-assign]

    def dump() -> None:
        cpu = time.process_time() - counts.cpu0
        Path(out_path).write_text(json.dumps({"statements": counts.statements, "commits": counts.commits, "cpu_s": cpu}))

    atexit.register(dump)
    return int(cli_main(["runner", *argv]) or 0)


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


def measure_claims(url: str, n: int, count: int, tmp: Path) -> tuple[float, float]:
    """(claims/s, claim transactions per lease): all N claimers start together (a ready/go barrier)."""
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
    reports = []
    for p in procs:
        out, _ = p.communicate()
        if p.returncode:
            raise SystemExit(f"claim worker failed: {p.returncode}; see {tmp / 'claims.log'}")
        reports.append(json.loads(out.decode().strip().splitlines()[-1]))
    claimed, seconds = span(url, "lease", "lease")
    if claimed != count or sum(r["leases"] for r in reports) != count:
        raise SystemExit(f"{claimed} claims for {count} requests")
    return claimed / seconds, sum(r["calls"] for r in reports) / count


def measure_runs(url: str, n: int, count: int, tmp: Path) -> dict[str, float]:
    """N traced runners start on an empty store and say ready; then the requests arrive; SIGTERM once all succeeded.

    Returns runs/s and, per run, the runner processes' statements, commits and CPU seconds.
    """
    open_store(url).close()  # create the schema before N processes race to
    argv = ["--store", url, "--capacity", "1", "--lease-s", "30", *RUNNER_ARGS]
    logs = [tmp / f"runner-{n}-{i}.log" for i in range(n)]
    outs = [tmp / f"runner-{n}-{i}.json" for i in range(n)]
    procs = []
    for i, log_path in enumerate(logs):
        with open(log_path, "wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "traced-runner", str(outs[i]), *argv, "--runner-id", f"runner-{i}"],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
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
    counted = [json.loads(o.read_text()) for o in outs]
    return {
        "runs_per_s": done / seconds,
        "statements_per_run": sum(c["statements"] for c in counted) / done,
        "commits_per_run": sum(c["commits"] for c in counted) / done,
        "cpu_ms_per_run": 1000 * sum(c["cpu_s"] for c in counted) / done,
    }


def bench_backend(
    name: str, fresh_url: Any, tmp: Path, *, claims: int, runs: int, repeat: int
) -> dict[str, dict[str, float]]:
    """Median of ``repeat`` measurements per process count, each on a fresh store."""
    out: dict[str, dict[str, float]] = {}
    for n in PROCESSES:
        claim_rows = [measure_claims(fresh_url(), n, claims, tmp) for _ in range(repeat)]
        run_rows = [measure_runs(fresh_url(), n, runs, tmp) for _ in range(repeat)]
        row = {
            "claims_per_s": round(statistics.median(c for c, _ in claim_rows), 1),
            "attempts_per_claim": round(statistics.median(a for _, a in claim_rows), 3),
        }
        for key in run_rows[0]:
            row[key] = round(statistics.median(r[key] for r in run_rows), 2)
        out[str(n)] = row
        print(
            f"{name:<10} {n} runner process(es): {row['claims_per_s']:8.1f} claims/s"
            f" ({row['attempts_per_claim']:.2f} attempts/claim)  {row['runs_per_s']:7.1f} runs/s"
            f"  {row['statements_per_run']:6.1f} statements/run  {row['commits_per_run']:5.2f} commits/run"
            f"  {row['cpu_ms_per_run']:6.1f} ms CPU/run",
            flush=True,
        )
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
    parser.add_argument("--processes", default="1,2,4,8", help="runner process counts, comma-separated")
    parser.add_argument("--backends", default="sqlite,postgres", help="which stores, comma-separated")
    parser.add_argument("--runner-args", default="", help="extra `effectlog runner` flags, e.g. '--poll-s 0.01'")
    args = parser.parse_args()
    global PROCESSES
    PROCESSES = tuple(int(n) for n in args.processes.split(","))
    RUNNER_ARGS.extend(args.runner_args.split())
    backends = set(args.backends.split(","))
    claims, runs = (60, 30) if args.quick else (400, 160)
    repeat = 1 if args.quick else 3
    sys.path.insert(0, str(ROOT / "tests"))
    from pg_cluster import PgCluster

    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "params": {
            "claims": claims,
            "runs": runs,
            "processes": list(PROCESSES),
            "repeat": repeat,
            "runner_args": RUNNER_ARGS,
        },
        "results": {},
    }
    with tempfile.TemporaryDirectory(prefix="effectlog-fleet-bench-") as tmp_dir:
        tmp = Path(tmp_dir)
        counter = iter(range(10**6))
        if "sqlite" in backends:
            results["results"]["sqlite"] = bench_backend(
                "sqlite", lambda: str(tmp / f"fleet-{next(counter)}.db"), tmp, claims=claims, runs=runs, repeat=repeat
            )
        if "postgres" in backends:
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
    elif len(sys.argv) > 3 and sys.argv[1] == "traced-runner":
        raise SystemExit(traced_runner(sys.argv[2], sys.argv[3:]))
    else:
        raise SystemExit(main())
