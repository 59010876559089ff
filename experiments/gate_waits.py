"""What waiting at the writers' gate costs SQLite claimers: hand-offs, failed tries, CPU, per claim.

    PYTHONPATH=src .venv/bin/python experiments/gate_waits.py [--processes 1,8] [--requests 1000] [--rounds 3]
        [--durability full|normal]

N processes drain a fresh store's queue as capacity-1 runners do (``claim_next``, one lease
per call), all starting together. Each counts, around the writers' gate
(``filelocks.SharedFile.enter``/``leave``): the wall and CPU time it held the gate, the CPU
it spent waiting for it, and its sleeps while waiting (failed tries). A *hand-off* is a lease
whose previous lease (in the store's history) went to another process: that claim ran on a
page cache the other's commit made stale. This produced the table in docs/fleet.md (Numbers,
"SQLite claims as processes are added"); to compare two versions, run it with each one's
``src`` on PYTHONPATH in alternating rounds. Nothing asserts on it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from effectlog.fleet import open_store
from effectlog.plan import AdapterDecl, Plan, StepDecl

WORKER = r"""
import json, sys, time
from effectlog.fleet.sqlite_store import SqliteFleetStore
from effectlog.journal import filelocks

acc = {"wait": 0.0, "wait_cpu": 0.0, "hold": 0.0, "hold_cpu": 0.0, "sleeps": 0, "claims": 0}
enter, leave, sleep = filelocks.SharedFile.enter, filelocks.SharedFile.leave, time.sleep
mark = [0.0, 0.0]

def counted_enter(self, where, timeout_s):
    t0, c0 = time.perf_counter(), time.thread_time()
    enter(self, where, timeout_s)
    mark[:] = [time.perf_counter(), time.thread_time()]
    acc["wait"] += mark[0] - t0
    acc["wait_cpu"] += mark[1] - c0

def counted_leave(self):
    leave(self)
    acc["hold"] += time.perf_counter() - mark[0]
    acc["hold_cpu"] += time.thread_time() - mark[1]

def counted_sleep(seconds):
    acc["sleeps"] += 1
    sleep(seconds)

filelocks.SharedFile.enter, filelocks.SharedFile.leave = counted_enter, counted_leave
filelocks.time.sleep = counted_sleep  # the module's sleeps are the gate's waits
store = SqliteFleetStore(sys.argv[1], durability=sys.argv[3])
print("ready", flush=True)
sys.stdin.readline()
cpu0 = time.process_time()
while store.claim_next(sys.argv[2], [], 300.0, 1):
    acc["claims"] += 1
acc["cpu"] = time.process_time() - cpu0
store.close()
print(json.dumps(acc), flush=True)
"""


def race(n: int, requests: int, durability: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="effectlog-gate-waits-") as tmp:
        path = str(Path(tmp) / "fleet.db")
        with open_store(path) as store:
            for i in range(requests):
                plan = Plan(
                    run_id=f"run-{i}",
                    adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
                    steps=(StepDecl(id="s0", adapter="noop"),),
                )
                store.submit("bench", f"k{i}", plan)
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, path, f"claimer-{i}", durability],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(n)
        ]
        for p in procs:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise SystemExit("a claimer did not start")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
        with open_store(path) as store:
            leases = [h for h in store.history() if h.transition == "lease"]
    claims = sum(o["claims"] for o in outs)
    total = {k: sum(o[k] for o in outs) for k in outs[0]}
    who = [h.actor_name for h in leases]
    at = [h.at for h in leases]
    return {
        "processes": n,
        "claims_per_s": round(claims / (max(at) - min(at))),
        "handoffs": round(sum(a != b for a, b in itertools.pairwise(who)) / claims, 3),
        "failed_tries_per_claim": round(total["sleeps"] / claims, 2),
        "hold_us": round(1e6 * total["hold"] / claims),
        "hold_cpu_us": round(1e6 * total["hold_cpu"] / claims),
        "wait_cpu_us": round(1e6 * total["wait_cpu"] / claims),
        "cpu_us": round(1e6 * total["cpu"] / claims),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", default="1,8")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--durability", choices=("full", "normal"), default="full")
    args = parser.parse_args()
    for _ in range(args.rounds):
        for n in (int(x) for x in args.processes.split(",")):
            print(json.dumps(race(n, args.requests, args.durability)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
