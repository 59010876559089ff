"""Side-by-side benchmark of effectlog against the SQLite floor, DBOS Transact and LangGraph (issues 7, 18).

    make bench                       # or: .venv/bin/python experiments/bench.py [--quick] [--no-companions]

Everything is measured in this one invocation, on this machine, with a no-op step and
SQLite in WAL mode with ``synchronous=FULL`` (the peers with their own defaults, reported):

1. the floor: raw ``sqlite3`` doing two durable commits per step;
2. effectlog, one run of N = 100, 1,000, 10,000 no-op idempotent steps, its steady per-step
   cost apart from its one-off costs (start-up, run start with the plan pinned, closing
   with the seal);
3. effectlog, K = 1, 8, 32, 128 concurrent runs in one process (``Runtime.arun_many``);
4. DBOS Transact on SQLite and LangGraph with SqliteSaver (``durability="sync"``), each in a
   child process (``bench_peers.py``);
5. resume: a run with N confirmed steps, half-finished and finished, up to 100,000 events;
6. journal bytes per event and peak RSS of a 100,000-event run (in a child process).

Every time is taken twice: wall clock and the process's CPU time (``time.process_time()``,
with its user and kernel parts from ``getrusage``). Before every measured single or
concurrent run the WAL is put in the same regime (``bench_evidence.presize_wal``). Measurements of one
kind are interleaved (fsync probe, floor, effectlog, peers, then again) in at least five
rounds; medians are reported, and every ratio is the median of each round's pair. One more
untimed round per N counts WAL pages per commit and checkpoints.

Then ``experiments/resume_bench.py`` and ``experiments/fleet_bench.py`` run when present
(each writes its own ``experiments/results/*.json``); ``bench_targets.py`` judges every
target of issue 18 from ``experiments/results/bench.json`` and theirs, and ``bench_report.py``
writes ``docs/performance.md`` with plots in ``docs/img/bench-*.png``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_evidence import WalFrames, fsync_latency_us, presize_wal, syncs_per_step
from effectlog.journal import SqliteJournal, load_run
from effectlog.journal.sqlite_schema import INSERT, MIGRATIONS, WAL_AUTOCHECKPOINT_PAGES
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime, SimulatedCrash

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
PAYLOAD = bytes(200)  # the floor's row: about the size of an effectlog event body


# -- plans and small helpers ------------------------------------------------------------------


def noop_plan(run_id: str, steps: int) -> Plan:
    return Plan(
        run_id=run_id,
        adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
        steps=tuple(StepDecl(id=f"step-{i}", adapter="noop") for i in range(steps)),
    )


def median(values: list[float]) -> float:
    return statistics.median(values)


def waits() -> int:
    """This process's voluntary context switches so far: each a wait (a sync's I/O, a lock), two per
    durable commit on the floor (the data, the cache flush; docs/architecture.md, fourth pass)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


def kernel_user() -> tuple[float, float]:
    """This process's CPU seconds so far, split: in user space (Python, SQLite) and in the kernel (I/O calls)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


# -- 1. the floor ---------------------------------------------------------------------------


FLOOR_DDL = "CREATE TABLE events (run_id TEXT, seq INTEGER, body BLOB, PRIMARY KEY (run_id, seq)) WITHOUT ROWID"
FLOOR_INSERT = "INSERT INTO events VALUES (?, ?, ?)"


def floor_db(path: Path, ddl: tuple[str, ...] = (FLOOR_DDL,)) -> sqlite3.Connection:
    """Raw sqlite3 with the journal's PRAGMAs (WAL, synchronous=FULL, checkpoint interval)."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    db.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
    for statement in ddl:
        db.execute(statement)
    return db


# The journal's current schema (SQLite schema v2: runs numbered in ``runs``, an event's rowid ``run << 32 | seq``)
# with the two runs the rows floor writes, numbered as a writer numbers them: INSERT binds the number.
ROWS_DDL = (*(sql for step in MIGRATIONS for sql in step), "INSERT INTO runs (run_id) VALUES ('run'), ('warm-up')")
RUN, WARM_UP = 1, 2


def floor_commits(steps: int) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """The floor's commits: two per step, one 200-byte row each."""
    return [(FLOOR_INSERT, [("run", seq, PAYLOAD)]) for seq in range(2 * steps)]


def effectlog_rows_commits(steps: int) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """effectlog's rows without effectlog: its events table (schema, unique index, triggers) and its
    commits (``step.requested``; then ``step.effected`` with ``step.confirmed``), with bodies of an
    event's size and a 32-byte hash, written by raw sqlite3. What SQLite alone costs for them."""
    body, digest = bytes(220), bytes(32)
    commits: list[tuple[str, list[tuple[Any, ...]]]] = []
    seq = 0
    for i in range(steps):
        step = f"step-{i}"
        commits.append((INSERT, [(RUN, seq + 1, step, "requested", 1, body, digest)]))
        commits.append(
            (
                INSERT,
                [(RUN, seq + 2, step, "effected", 1, body, digest), (RUN, seq + 3, step, "confirmed", 1, body, digest)],
            )
        )
        seq += 3
    return commits


def floor_single(path: Path, steps: int, *, evidence: bool = False, rows: str = "floor") -> dict[str, float]:
    """Two commits per step and nothing else; wall and CPU microseconds per step. ``rows="effectlog"``
    writes effectlog's table and rows instead of the floor's (``effectlog_rows_commits``)."""
    if rows == "effectlog":
        db, commits = floor_db(path, ROWS_DDL), effectlog_rows_commits(steps)
        warm = [(INSERT, [(WARM_UP, seq, f"w-{seq}", "requested", 1, PAYLOAD, PAYLOAD[:32])]) for seq in range(1, 11)]
    else:
        db, commits = floor_db(path), floor_commits(steps)
        warm = [(FLOOR_INSERT, [("warm-up", seq, PAYLOAD)]) for seq in range(10)]
    try:
        presize_wal(path)
        for sql, batch in warm:  # warm-up, as effectlog's: statements prepared, pages cached
            db.executemany(sql, batch)
        wal = WalFrames(path) if evidence else None
        start, cpu, split, waited = time.perf_counter(), time.process_time(), kernel_user(), waits()
        for sql, batch in commits:
            db.execute("BEGIN IMMEDIATE")
            for row in batch:
                db.execute(sql, row)
            db.execute("COMMIT")
            if wal is not None:
                wal.tick()
        seconds, cpu, after = time.perf_counter() - start, time.process_time() - cpu, kernel_user()
        waited = waits() - waited
    finally:
        db.close()
    got = {
        "waits_per_commit": waited / len(commits),
        "us_per_step": seconds / steps * 1e6,
        "cpu_us_per_step": cpu / steps * 1e6,
        "user_us_per_step": (after[0] - split[0]) / steps * 1e6,
        "sys_us_per_step": (after[1] - split[1]) / steps * 1e6,
    }
    if wal is not None:
        wal.close()
        got |= {"commits": wal.ticks, "wal_frames_per_commit": wal.frames / wal.ticks, "checkpoints": wal.checkpoints}
    return got


# -- 2. and 3. effectlog ----------------------------------------------------------------------


class Marks:
    """A crash hook that crashes nothing: it notes the clocks when the first and the last step are
    confirmed (and, for evidence, counts WAL frames after every commit of a step)."""

    def __init__(self, first: str, last: str, wal: WalFrames | None = None) -> None:
        self.first, self.last, self.wal = first, last, wal
        self.at: dict[str, tuple[float, ...]] = {}

    def __call__(self, point: str, step_id: str) -> None:
        if self.wal is not None and point in ("after_request", "after_confirm"):
            self.wal.tick()
        if point == "after_confirm" and step_id in (self.first, self.last):
            self.at[step_id] = (time.perf_counter(), time.process_time(), *kernel_user(), waits())


def effectlog_single(path: Path, steps: int, *, evidence: bool = False) -> dict[str, float]:
    """One run of ``steps`` no-op steps, its per-step cost apart from its one-off costs.

    The per-step figure is the time from the first step's confirmation to the last's, over
    ``steps - 1`` steps. One-off costs, each in wall and CPU milliseconds: start-up (opening
    the journal: file, schema, ownership), run start (the claim, the plan pinned in
    ``run.started``, up to the first step's confirmation, less one steady step) and closing
    (``run.completed`` with its seal, and the outcome).
    """
    clock = time.perf_counter, time.process_time
    t0 = [c() for c in clock]
    rt = Runtime(path)
    opened = [c() for c in clock]
    try:
        rt.run(noop_plan("warm-up", 5))
        presize_wal(path)
        rt.run(noop_plan("warm-up-2", 2))  # statements re-prepared after the filler's schema change
        wal = WalFrames(path) if evidence else None
        marks = Marks("step-0", f"step-{steps - 1}", wal)
        rt.crash_hook = marks  # set after construction: no per-commit before_commit wrapper
        commits = rt.writer.commits
        start = [c() for c in clock]
        outcome = rt.run(noop_plan("bench", steps))
        end = [c() for c in clock]
        commits = rt.writer.commits - commits
    finally:
        rt.close()
    if outcome.state != "completed":
        raise RuntimeError(f"effectlog run ended {outcome.state}: {outcome.message}")
    first, last = marks.at["step-0"], marks.at[f"step-{steps - 1}"]
    got: dict[str, float] = {
        "user_us_per_step": (last[2] - first[2]) / (steps - 1) * 1e6,
        "sys_us_per_step": (last[3] - first[3]) / (steps - 1) * 1e6,
        "waits_per_commit": (last[4] - first[4]) / (2 * (steps - 1)),  # two commits per steady step
    }
    for i, kind in ((0, ""), (1, "cpu_")):
        step = (last[i] - first[i]) / (steps - 1)
        got[f"{kind}us_per_step"] = step * 1e6
        got[f"{kind}startup_ms"] = (opened[i] - t0[i]) * 1e3
        got[f"{kind}run_start_ms"] = (first[i] - start[i] - step) * 1e3
        got[f"{kind}closing_ms"] = (end[i] - last[i]) * 1e3
        got[f"{kind}us_per_step_all_in"] = (end[i] - start[i]) / steps * 1e6
    if wal is not None:
        wal.tick()  # the closing commit
        wal.close()
        got |= {"commits": commits, "wal_frames_per_commit": wal.frames / commits, "checkpoints": wal.checkpoints}
    return got


def effectlog_concurrent(path: Path, runs: int, steps: int) -> dict[str, float]:
    """K runs of ``steps`` steps each, started together in one process: aggregate steps/s and
    the process's CPU time per step (the group's commits run on a worker thread: counted too)."""
    with Runtime(path) as rt:
        rt.run(noop_plan("warm-up", 5))
        presize_wal(path)
        rt.run(noop_plan("warm-up-2", 2))
        plans = [noop_plan(f"bench-{k}", steps) for k in range(runs)]
        commits = rt.writer.commits
        start, cpu = time.perf_counter(), time.process_time()
        outcomes = asyncio.run(rt.arun_many(plans))
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        commits = rt.writer.commits - commits
    if any(o.state != "completed" for o in outcomes):
        raise RuntimeError("a concurrent run did not complete")
    return {
        "steps_per_s": runs * steps / seconds,
        "cpu_us_per_step": cpu / (runs * steps) * 1e6,
        "commits": commits,
        "seconds": seconds,
    }


# -- 4. peers ---------------------------------------------------------------------------------


def peer(name: str, steps: int, workdir: Path, timeout_s: float) -> dict[str, Any]:
    """Run one peer in a child process; a failure is recorded with its reason, never a number."""
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / "bench_peers.py"), name, str(steps), str(workdir)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"did not finish within {timeout_s:.0f} s"}
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return {"error": (lines[-1] if lines else f"exit status {done.returncode}")[:300]}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- 5. resume --------------------------------------------------------------------------------


def build_histories(workdir: Path, steps: int) -> tuple[Path, Path]:
    """A finished run of ``steps`` steps, and a run of ``2 * steps`` stopped after ``steps``.

    Written with synchronous=NORMAL only to build them quickly: resume reads, and the
    bytes on disk are the same.
    """
    finished, half = workdir / f"finished-{steps}.db", workdir / f"half-{steps}.db"
    with Runtime(SqliteJournal(finished, durability="normal")) as rt:
        rt.run(noop_plan("resume", steps))
    last = f"step-{steps - 1}"

    def stop(point: str, step_id: str) -> None:
        if point == "after_confirm" and step_id == last:
            raise SimulatedCrash(point)

    with Runtime(SqliteJournal(half, durability="normal"), crash_hook=stop) as rt, contextlib.suppress(SimulatedCrash):
        rt.run(noop_plan("resume", 2 * steps))
    return finished, half


def fold_us_per_event(path: Path) -> tuple[float, float, int]:
    """``load_run``: read, verify the chain, decode and fold every event of the run.

    Returns wall and CPU microseconds per event: the replay is pure CPU work on cached
    pages, and on a shared machine the wall clock also counts time spent descheduled.
    """
    with SqliteJournal(path, writer=False) as journal:
        start, cpu = time.perf_counter(), time.process_time()
        state = load_run(journal, "resume")
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return seconds / state.seq * 1e6, cpu / state.seq * 1e6, state.seq


def resume_half_ms(path: Path, steps: int, workdir: Path) -> tuple[float, float]:
    """Wall and CPU time from ``arun`` to the first effect of the next step: replay, ``run.resumed``
    and ``step.requested`` durable (two commits, synchronous=FULL)."""
    copy = workdir / "resume-copy.db"
    shutil.copyfile(path, copy)
    first_new = f"step-{steps}"

    def at_first_effect(point: str, step_id: str) -> None:
        if point == "after_request" and step_id == first_new:
            raise SimulatedCrash(point)

    plan = noop_plan("resume", 2 * steps)
    try:
        with Runtime(copy, crash_hook=at_first_effect) as rt:
            start, cpu = time.perf_counter(), time.process_time()
            try:
                rt.run(plan)
            except SimulatedCrash:
                return (time.perf_counter() - start) * 1e3, (time.process_time() - cpu) * 1e3
            raise RuntimeError("the resumed run never reached its next step")
    finally:
        for suffix in ("", "-wal", "-shm", ".lock"):
            Path(f"{copy}{suffix}").unlink(missing_ok=True)


def rerun_finished_ms(path: Path, steps: int) -> tuple[float, float]:
    """Wall and CPU time to re-run a closed run: it answers from its seal, nothing is replayed or written."""
    plan = noop_plan("resume", steps)
    with Runtime(path) as rt:
        start, cpu = time.perf_counter(), time.process_time()
        outcome = rt.run(plan)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if outcome.state != "completed" or outcome.events_written:
        raise RuntimeError("a closed run's re-run wrote events")
    return seconds * 1e3, cpu * 1e3


# -- 6. footprint (child process) ---------------------------------------------------------------


def peak_rss_mb() -> float:
    """This process's peak RSS. ``VmHWM`` belongs to the process image, whereas Linux carries
    ``ru_maxrss`` over from the parent across fork and exec (it would report the parent's peak)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def footprint_child(workdir: Path, steps: int) -> dict[str, Any]:
    """One run of ``steps`` no-op steps (3 events each, ~100k events for 33,333 steps): the
    process's peak RSS and the journal's bytes per event."""
    path = workdir / "footprint.db"
    plan = noop_plan("footprint", steps)
    with Runtime(SqliteJournal(path, durability="normal")) as rt:
        outcome = rt.run(plan)
    run_rss = peak_rss_mb()
    with SqliteJournal(path, writer=False) as journal:
        state = load_run(journal, "footprint")
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        body = db.execute("SELECT SUM(LENGTH(body)) FROM events").fetchone()[0]
        try:
            tables = {name: size for name, size in db.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")}
        except sqlite3.Error:
            tables = {}
    finally:
        db.close()
    size = path.stat().st_size
    return {
        "steps": steps,
        "events": state.seq,
        "state": outcome.state,
        "file_bytes": size,
        "bytes_per_event": size / state.seq,
        "body_bytes_per_event": body / state.seq,
        "tables_bytes": tables,
        "peak_rss_mb_run": run_rss,
        "peak_rss_mb_with_full_replay": peak_rss_mb(),
    }


def footprint(workdir: Path, steps: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child-footprint", str(steps), "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else "failed"}
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- the whole benchmark -----------------------------------------------------------------------


def fresh(workdir: Path, name: str) -> Path:
    path = workdir / name
    for suffix in ("", "-wal", "-shm", ".lock"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return path


def say(text: str) -> None:
    print(text, flush=True)


def single_sizes(results: dict[str, Any], args: argparse.Namespace, workdir: Path, plan: dict[str, Any]) -> None:
    """1, 2, 4: one run of N steps, interleaved with the floor and (at 100 and 1,000) the peers.

    Each round measures, back to back: the disk's fsync latency, the floor, effectlog, the
    same pair on a RAM disk (tmpfs: a sync returns at once, what is left is CPU), the peers.
    One extra round per N, not timed into the figures, counts what each commit writes to the
    WAL (instrumenting every commit would cost time of its own).
    """
    ram = Path(plan["ramdir"]) if plan.get("ramdir") else None
    for n in plan["sizes"]:
        rows: dict[str, list[dict[str, float]]] = {"floor": [], "effectlog": []}
        peer_runs: dict[str, list[dict[str, Any]]] = {"dbos": [], "langgraph": []}
        fsyncs: list[float] = []
        for r in range(plan["rounds"][n]):
            fsyncs.append(fsync_latency_us(workdir, rounds=30))
            rows["floor"].append(floor_single(fresh(workdir, "floor.db"), n))
            rows["effectlog"].append(effectlog_single(fresh(workdir, "effectlog.db"), n))
            if ram is not None:
                rows.setdefault("ram_floor", []).append(floor_single(fresh(ram, "floor.db"), n))
                rows.setdefault("ram_effectlog", []).append(effectlog_single(fresh(ram, "effectlog.db"), n))
                rows.setdefault("ram_rows", []).append(floor_single(fresh(ram, "rows.db"), n, rows="effectlog"))
            if n in plan["peer_sizes"]:
                for name in ("dbos", "langgraph"):
                    target = workdir / f"{name}-{n}-{r}"
                    shutil.rmtree(target, ignore_errors=True)
                    peer_runs[name].append(peer(name, n, target, args.peer_timeout))
                    shutil.rmtree(target, ignore_errors=True)
            shown = [
                f"{k} {v[-1]['us_per_step']:.0f} us/step ({v[-1]['cpu_us_per_step']:.0f} CPU)" for k, v in rows.items()
            ]
            shown += [f"{k} {v[-1].get('us_per_step', float('nan')):.0f}" for k, v in peer_runs.items() if v]
            say(f"N={n} round {r + 1}: fsync {fsyncs[-1]:.0f} us; " + ", ".join(shown))
        evidence: dict[str, Any] = {
            "floor": floor_single(fresh(workdir, "floor.db"), n, evidence=True),
            "effectlog": effectlog_single(fresh(workdir, "effectlog.db"), n, evidence=True),
        }
        results["single"][str(n)] = summarize_single(rows, fsyncs, evidence)
        for name, runs in peer_runs.items():
            if runs:
                results["peers"][name][str(n)] = summarize_peer(runs, rows["effectlog"])
        row = results["single"][str(n)]
        if "ram" in row["evidence"]:
            ram_row = row["evidence"]["ram"]
            say(
                f"N={n} on a RAM disk, CPU per step: floor {ram_row['floor']['cpu_us_per_step']:.0f} us, effectlog's "
                f"rows alone {ram_row.get('rows', {}).get('cpu_us_per_step', float('nan')):.0f} us, effectlog "
                f"{ram_row['effectlog']['cpu_us_per_step']:.0f} us"
            )
        say(
            f"N={n}: effectlog / floor {row['effectlog_over_floor']:.2f} (wall), "
            f"CPU +{row['cpu_minus_floor_us']:.0f} us/step; WAL frames per commit "
            f"{evidence['floor']['wal_frames_per_commit']:.1f} (floor), "
            f"{evidence['effectlog']['wal_frames_per_commit']:.1f} (effectlog)"
        )


def summarize_single(
    rows: dict[str, list[dict[str, float]]], fsyncs: list[float], evidence: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """Medians over rounds; every ratio and difference is taken per round (a back-to-back pair), then
    the median over rounds: the disk's sync latency drifts during a run, and this cancels the drift."""
    out: dict[str, Any] = {"rounds": len(rows["floor"]), "fsync_us_rounds": fsyncs, "evidence": evidence}
    for name, got in rows.items():
        walls, cpus = [g["us_per_step"] for g in got], [g["cpu_us_per_step"] for g in got]
        summary = {
            "us_per_step": median(walls),
            "cpu_us_per_step": median(cpus),
            "user_us_per_step": median([g["user_us_per_step"] for g in got]),
            "sys_us_per_step": median([g["sys_us_per_step"] for g in got]),
            "waits_per_commit": median([g["waits_per_commit"] for g in got]),
            "steps_per_s": 1e6 / median(walls),
            "samples": walls,
            "cpu_samples": cpus,
        }
        if name.startswith("ram_"):
            evidence.setdefault("ram", {})[name[4:]] = summary
        else:
            out[name] = summary
    # On the RAM disk, CPU time (not the wall clock, which also counts time descheduled) per round's pair.
    for name in ("effectlog", "rows"):
        if "ram_floor" in rows and f"ram_{name}" in rows:
            pairs = zip(rows[f"ram_{name}"], rows["ram_floor"], strict=True)
            evidence["ram"][f"{name}_minus_floor_cpu_us"] = median(
                [e["cpu_us_per_step"] - f["cpu_us_per_step"] for e, f in pairs]
            )
    mine = rows["effectlog"]
    out["effectlog"]["one_off"] = {
        key: median([g[key] for g in mine]) for key in mine[0] if key.endswith("_ms") or key.endswith("_all_in")
    }
    pairs = list(zip(mine, rows["floor"], strict=True))
    out["effectlog_over_floor_rounds"] = [e["us_per_step"] / f["us_per_step"] for e, f in pairs]
    out["effectlog_over_floor"] = median(out["effectlog_over_floor_rounds"])
    out["cpu_effectlog_over_floor"] = median([e["cpu_us_per_step"] / f["cpu_us_per_step"] for e, f in pairs])
    out["effectlog_minus_floor_us"] = median([e["us_per_step"] - f["us_per_step"] for e, f in pairs])
    out["cpu_minus_floor_us"] = median([e["cpu_us_per_step"] - f["cpu_us_per_step"] for e, f in pairs])
    # What is not CPU in this process: waiting for the disk's syncs, and time spent descheduled.
    out["wait_minus_floor_us"] = median(
        [(e["us_per_step"] - e["cpu_us_per_step"]) - (f["us_per_step"] - f["cpu_us_per_step"]) for e, f in pairs]
    )
    return out


def summarize_peer(runs: list[dict[str, Any]], mine: list[dict[str, float]]) -> dict[str, Any]:
    """A peer's medians, and effectlog's speed-up as the median of each round's pair."""
    ok = [got for got in runs if "us_per_step" in got]
    if not ok:
        return {"error": runs[-1]["error"]}
    same_round = [
        got["us_per_step"] / m["us_per_step"] for got, m in zip(runs, mine, strict=True) if "us_per_step" in got
    ]
    return {
        "effectlog_speedup": median(same_round),
        "effectlog_speedup_rounds": same_round,
        "us_per_step": median([got["us_per_step"] for got in ok]),
        "cpu_us_per_step": median([got["cpu_us_per_step"] for got in ok]),
        "steps_per_s": 1e6 / median([got["us_per_step"] for got in ok]),
        "samples": [got["us_per_step"] for got in ok],
        "cpu_samples": [got["cpu_us_per_step"] for got in ok],
        "library": ok[-1]["library"],
        "sqlite": ok[-1]["sqlite"],
        "errors": [x["error"] for x in runs if "error" in x],
    }


def concurrent_runs(results: dict[str, Any], plan: dict[str, Any], workdir: Path) -> None:
    """3: concurrent runs, round-robin over K so each round's ratios compare neighbours."""
    per_run, ks = plan["per_run"], plan["concurrency"]
    rounds: list[dict[int, dict[str, float]]] = []
    for r in range(plan["group_rounds"]):
        rounds.append({k: effectlog_concurrent(fresh(workdir, "concurrent.db"), k, per_run) for k in ks})
        say(f"concurrency round {r + 1}: " + ", ".join(f"K={k} {g['steps_per_s']:.0f}" for k, g in rounds[-1].items()))
    for k in ks:
        rates = [got[k]["steps_per_s"] for got in rounds]
        results["concurrent"][str(k)] = {
            "runs": k,
            "steps_per_run": per_run,
            "steps_per_s": median(rates),
            "cpu_us_per_step": median([got[k]["cpu_us_per_step"] for got in rounds]),
            "samples": rates,
            "over_one_run": median([got[k]["steps_per_s"] / got[1]["steps_per_s"] for got in rounds]),
            "over_one_run_rounds": [got[k]["steps_per_s"] / got[1]["steps_per_s"] for got in rounds],
            "commits": rounds[0][k]["commits"],
        }
        say(f"K={k}: {median(rates):.0f} steps/s aggregate ({rounds[0][k]['commits']} commits)")


def resume_sizes(results: dict[str, Any], plan: dict[str, Any], workdir: Path) -> None:
    """5: resume a half-finished run and re-run a finished one, at growing history."""
    for steps in plan["resume_steps"]:
        finished, half = build_histories(workdir, steps)
        half_fold, half_cpu, half_events = zip(*(fold_us_per_event(half) for _ in range(3)), strict=True)
        fin_fold, fin_cpu, fin_events = zip(*(fold_us_per_event(finished) for _ in range(3)), strict=True)
        resume, resume_cpu = zip(*(resume_half_ms(half, steps, workdir) for _ in range(3)), strict=True)
        rerun, rerun_cpu = zip(*(rerun_finished_ms(finished, steps) for _ in range(3)), strict=True)
        row = {
            "confirmed_steps": steps,
            "half_events": half_events[0],
            "finished_events": fin_events[0],
            "half_fold_us_per_event": median(list(half_fold)),
            "finished_fold_us_per_event": median(list(fin_fold)),
            "half_fold_cpu_us_per_event": median(list(half_cpu)),
            "finished_fold_cpu_us_per_event": median(list(fin_cpu)),
            "half_fold_ms": median(list(half_fold)) * half_events[0] / 1e3,
            "finished_full_replay_ms": median(list(fin_fold)) * fin_events[0] / 1e3,
            "half_resume_to_next_effect_ms": median(list(resume)),
            "half_resume_to_next_effect_cpu_ms": median(list(resume_cpu)),
            "finished_rerun_ms": median(list(rerun)),
            "finished_rerun_cpu_ms": median(list(rerun_cpu)),
        }
        results["resume"].append(row)
        say(
            f"resume {steps} steps ({half_events[0]} events): fold {row['half_fold_us_per_event']:.2f} us/event "
            f"({row['half_fold_cpu_us_per_event']:.2f} CPU), to next effect {row['half_resume_to_next_effect_ms']:.1f}"
            f" ms ({row['half_resume_to_next_effect_cpu_ms']:.1f} CPU); finished re-run {row['finished_rerun_ms']:.1f}"
            f" ms ({row['finished_rerun_cpu_ms']:.1f} CPU)"
        )
        for path in (finished, half):
            for suffix in ("", "-wal", "-shm", ".lock"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)


def counted_instructions(quick: bool) -> dict[str, Any]:
    """7: user-space instructions per steady step, one run and 32 runs, counted by valgrind
    (``instructions_per_step.py``): the one figure here that neither the machine's load nor its speed
    moves, so it compares this run with earlier ones made on other machines."""
    if quick:
        return {"error": "not counted in a quick run"}
    if shutil.which("valgrind") is None:
        return {"error": "valgrind is not installed"}
    from instructions_per_step import per_step

    src = str(ROOT / "src")
    try:
        counted = {"one_run": per_step(src, 1), "runs_32": per_step(src, 32)}
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        return {"error": f"valgrind failed: {str(exc).splitlines()[0]}"}
    say(
        f"instructions per step (valgrind): one run {counted['one_run'] / 1e3:.1f}k, "
        f"32 runs {counted['runs_32'] / 1e3:.1f}k"
    )
    return counted


def cpu_model(info: str | None = None) -> str:
    """The CPU's model name and clock as /proc/cpuinfo (or ``info``) gives them ("" where it has none)."""
    if info is None:
        try:
            info = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ""
    fields: dict[str, str] = {}
    for line in info.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name, mhz = " ".join(fields.get("model name", "").split()), fields.get("cpu MHz", "")
    try:
        return f"{name} at {float(mhz):,.0f} MHz" if name else ""
    except ValueError:
        return name


def run_all(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    quick = args.quick
    plan: dict[str, Any] = {
        "sizes": [100, 1000, 10_000],
        # At least five rounds each; the short sizes are cheap, and more rounds steady their medians.
        "rounds": {100: 2, 1000: 2} if quick else {100: 9, 1000: 7, 10_000: 5},
        "group_rounds": 2 if quick else 5,
        "peer_sizes": [100] if quick else [100, 1000],
        "concurrency": [1, 8, 32] if quick else [1, 8, 32, 128],
        "per_run": 50 if quick else 100,
        "resume_steps": [333, 3333] if quick else [333, 3333, 33_333],
        "footprint_steps": 3333 if quick else 33_333,
    }
    if quick:
        plan["sizes"] = [100, 1000]
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        plan["ramdir"] = tempfile.mkdtemp(prefix="effectlog-bench-", dir=shm)
    results: dict[str, Any] = {
        "machine": {
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "sqlite": sqlite3.sqlite_version,
            "platform": platform.platform(),
            "cpu": cpu_model(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "quick": quick,
            "load_start": os.getloadavg(),
            "niceness": os.nice(0),
        },
        "plan": plan,
        "wal_autocheckpoint_pages": WAL_AUTOCHECKPOINT_PAGES,
        "wal_regime": f"pre-grown to {WAL_AUTOCHECKPOINT_PAGES:,} pages and checkpointed (RESTART) before every run",
        "single": {},
        "peers": {"dbos": {}, "langgraph": {}},
        "concurrent": {},
        "resume": [],
    }
    results["machine"]["fsync_us_start"] = fsync_latency_us(workdir)
    say(f"fsync (4 KiB write + fsync) median: {results['machine']['fsync_us_start']:.0f} us")
    try:
        single_sizes(results, args, workdir, plan)
    finally:
        if plan.get("ramdir"):
            shutil.rmtree(plan["ramdir"], ignore_errors=True)
    results["syncs"] = {name: syncs_per_step(name, workdir) for name in ("floor", "effectlog", "dbos", "langgraph")}
    say(
        "syncs per step: "
        + ", ".join(f"{k} {v.get('syncs_per_step', v.get('error'))}" for k, v in results["syncs"].items())
    )
    concurrent_runs(results, plan, workdir)
    resume_sizes(results, plan, workdir)
    results["footprint"] = footprint(workdir, plan["footprint_steps"])
    say(f"footprint: {json.dumps({k: v for k, v in results['footprint'].items() if k != 'tables_bytes'})}")
    results["instructions"] = counted_instructions(args.quick)
    results["machine"]["fsync_us_end"] = fsync_latency_us(workdir)
    results["machine"]["load_end"] = os.getloadavg()
    say(f"fsync median at the end: {results['machine']['fsync_us_end']:.0f} us")
    return results


COMPANIONS = (("resume", "resume_bench.py"), ("fleet", "fleet_bench.py"))


def run_companions(quick: bool) -> dict[str, str]:
    """The other benchmarks whose JSON the report reads, each in its own process, when present.

    Each writes its own ``experiments/results/*.json``; a failure is recorded and shown in the
    report, and the rows it would feed say "not measured", never an older figure as a new one.
    """
    ran: dict[str, str] = {}
    for name, script in COMPANIONS:
        path = HERE / script
        if not path.exists():
            ran[name] = f"{script} absent"
            continue
        say(f"\n-- {script}{' --quick' if quick else ''}")
        done = subprocess.run([sys.executable, str(path), *(["--quick"] if quick else [])], check=False)
        ran[name] = "ran" if done.returncode == 0 else f"{script} exited with status {done.returncode}"
        if done.returncode != 0:
            (HERE / "results" / f"{name}.json").unlink(missing_ok=True)  # not an older run's figures
    return ran


def report(json_path: Path, doc: Path, img: Path) -> None:
    """docs/performance.md and its plots from bench.json, with resume.json and fleet.json as present."""
    from bench_report import write_doc, write_plots
    from bench_targets import RESULTS, normalize_resume, read_results

    results = json.loads(json_path.read_text())
    fleet, resume = read_results(RESULTS / "fleet.json"), normalize_resume(read_results(RESULTS / "resume.json"))
    write_doc(results, doc, write_plots(results, img, resume), json_path, fleet=fleet, resume=resume)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds (for development)")
    parser.add_argument("--workdir", type=Path, help="where the journals go (default: a temporary directory)")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "bench.json")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "performance.md")
    parser.add_argument("--img", type=Path, default=ROOT / "docs" / "img")
    parser.add_argument("--peer-timeout", type=float, default=1800.0)
    parser.add_argument("--report-only", action="store_true", help="rewrite the doc and plots from the JSON files")
    parser.add_argument(
        "--no-companions", action="store_true", help="do not run resume_bench.py and fleet_bench.py (report their JSON)"
    )
    parser.add_argument("--child-footprint", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child-single", nargs=2, metavar=("SYSTEM", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child_footprint:
        print(json.dumps(footprint_child(args.workdir, args.child_footprint)))
        return 0
    if args.child_single:
        system, n = args.child_single[0], int(args.child_single[1])
        single = {"floor": floor_single, "effectlog": effectlog_single}[system]
        print(json.dumps(single(fresh(args.workdir, f"{system}.db"), n)))
        return 0

    from bench_targets import ratios

    if args.report_only:
        report(args.json, args.doc, args.img)
        return 0
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="effectlog-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        results = run_all(args, workdir)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    results["ratios"] = ratios(results)
    say("\nratios (measured in this run):")
    for name, value in results["ratios"].items():
        say(f"  {name}: {value:.2f}" if isinstance(value, float) else f"  {name}: {value}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    if not args.no_companions:
        results["companions"] = run_companions(args.quick)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    report(args.json, args.doc, args.img)
    say(f"\nwrote {args.json.relative_to(ROOT) if args.json.is_relative_to(ROOT) else args.json} and {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
