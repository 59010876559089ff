"""Whether a long run costs more per step than a short one, what each commit writes, and what bounds 32 runs.

    .venv/bin/python experiments/long_run.py sizes [--dir DIR] [--rounds 4]
    .venv/bin/python experiments/long_run.py pages [--steps 1000]
    .venv/bin/python experiments/long_run.py group [--dir DIR] [--rounds 7]

Issue 18, the fourth pass (docs/architecture.md). ``sizes``: one run of 1,000 and one of 10,000 no-op
steps, alternating in one invocation, each on a fresh journal with its WAL pre-grown as ``bench.py``
does: wall and thread CPU per step (the whole run over N), the CPU inside the commits
(``writer.append_alone``) and outside, and the waits per commit (voluntary switches). ``pages``: reads
the WAL before the journal is closed (frames with the current salts) and counts which database pages
the run's commits wrote, effectlog's and the floor's (``bench.py``'s two commits per step). ``group``:
``bench.py``'s concurrent measure, one run against 32 runs of 100 steps, alternating.
DIR defaults to this checkout (the disk). Nothing asserts on it.
"""

from __future__ import annotations

import argparse
import collections
import sqlite3
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench import PAYLOAD, effectlog_concurrent, floor_db, fresh, noop_plan, presize_wal, waits  # noqa: E402
from effectlog.runtime import Runtime  # noqa: E402


def one_run(where: Path, n: int) -> tuple[float, ...]:
    path = fresh(where, "long-run.db")
    rt = Runtime(path)
    try:
        rt.run(noop_plan("warm-up", 5))
        presize_wal(path)
        rt.run(noop_plan("warm-up-2", 2))
        alone, inside = rt.writer.append_alone, [0, 0]

        def timed(*args: Any) -> Any:
            t, w = time.thread_time_ns(), waits()
            try:
                return alone(*args)
            finally:
                inside[0] += time.thread_time_ns() - t
                inside[1] += waits() - w

        rt.writer.append_alone = timed  # type: ignore[method-assign]
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        rt.run(noop_plan("bench", n))
        cpu, wall = time.thread_time_ns() - cpu, time.perf_counter_ns() - wall
    finally:
        rt.close()
    return wall / n / 1e3, cpu / n / 1e3, inside[0] / n / 1e3, (cpu - inside[0]) / n / 1e3, inside[1] / (2 * n)


def sizes(args: argparse.Namespace) -> None:
    got: dict[int, list[tuple[float, ...]]] = {1000: [], 10_000: []}
    for r in range(args.rounds):
        for n, rows in got.items():
            rows.append(one_run(Path(args.dir), n))
            print(f"round {r + 1}, N={n}: wall %.0f µs, CPU %.0f (in commits %.0f, outside %.0f), "
                  "waits per commit %.3f" % rows[-1], flush=True)  # fmt: skip
    for n, rows in got.items():
        med = [statistics.median(row[i] for row in rows) for i in range(5)]
        print(f"N={n}, medians: wall %.0f µs, CPU %.0f (in commits %.0f, outside %.0f), waits per commit %.3f"
              % tuple(med))  # fmt: skip


def wal_pages(wal: bytes) -> tuple[collections.Counter[int], int]:
    """Database page numbers of the WAL's current frames, and its commits (frames that end one)."""
    page, salts = struct.unpack(">I", wal[8:12])[0], wal[16:24]
    written: collections.Counter[int] = collections.Counter()
    commits, off = 0, 32
    while off + 24 + page <= len(wal) and wal[off + 8 : off + 16] == salts:
        number, size_after = struct.unpack(">II", wal[off : off + 8])
        written[number] += 1
        commits += size_after > 0
        off += 24 + page
    return written, commits


def pages(args: argparse.Namespace) -> None:
    where = Path("/dev/shm") if Path("/dev/shm").is_dir() else HERE
    for who in ("effectlog", "floor"):
        path = fresh(where, f"long-run-{who}.db")
        if who == "effectlog":
            rt = Runtime(path)
            rt.run(noop_plan("warm-up", 5))
            presize_wal(path)
            rt.run(noop_plan("warm-up-2", 2))
            rt.run(noop_plan("bench", args.steps))
            wal = Path(f"{path}-wal").read_bytes()
            rt.close()
        else:
            db = floor_db(path)
            presize_wal(path)
            for seq in range(2 * args.steps):
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT INTO events VALUES (?, ?, ?)", ("run", seq, PAYLOAD))
                db.execute("COMMIT")
            wal = Path(f"{path}-wal").read_bytes()
            db.close()
        written, commits = wal_pages(wal)
        with sqlite3.connect(path) as db:
            roots = {int(p): name for name, p in db.execute("SELECT name, rootpage FROM sqlite_master WHERE rootpage")}
        frames = sum(written.values())
        print(f"{who}, {args.steps} steps: {commits} commits, {frames / commits:.2f} frames per commit, "
              f"{len(written)} distinct pages; page 1 (the header: file size, free list) {written[1] / commits:.2f} "
              "per commit; most written: " + ", ".join(
                  f"{p}{f' ({roots[p]})' if p in roots else ''} {c}" for p, c in written.most_common(6)))  # fmt: skip
        fresh(path.parent, path.name)  # removes this run's journal files (and only them)


def group(args: argparse.Namespace) -> None:
    ratios, rates = [], {1: [], 32: []}
    for r in range(args.rounds):
        got = {}
        for k, seen in rates.items():
            got[k] = effectlog_concurrent(fresh(Path(args.dir), "long-run-group.db"), k, 100)
            seen.append(got[k]["steps_per_s"])
        ratios.append(got[32]["steps_per_s"] / got[1]["steps_per_s"])
        print(f"round {r + 1}: " + "; ".join(
            f"{k} run(s) {g['steps_per_s']:.0f} steps/s, CPU {g['cpu_us_per_step']:.0f} µs/step, {g['commits']} "
            f"commits" for k, g in got.items())
            + f"; ratio {ratios[-1]:.2f}", flush=True)  # fmt: skip
    print(f"median ratio {statistics.median(ratios):.2f}; one run {statistics.median(rates[1]):.0f} steps/s, "
          f"32 runs {statistics.median(rates[32]):.0f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("what", choices=("sizes", "pages", "group"))
    parser.add_argument("--dir", default=str(HERE), help="where the journals go (default: this checkout, the disk)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=1000)
    args = parser.parse_args(argv)
    {"sizes": sizes, "pages": pages, "group": group}[args.what](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
