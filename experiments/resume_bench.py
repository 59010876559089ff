"""Resume and replay CPU cost as history grows (issue 18, items 3 and 4).

    PYTHONPATH=src .venv/bin/python experiments/resume_bench.py [--quick]

CPU time (``time.process_time()``) measured in this one process, on cached pages:

1. resume of a half-finished run (S confirmed steps of a 2S-step plan; 1 + 3S events) to the
   first effect of its next step: load (the last checkpoint segment's frontier + the tail, or
   every segment + the tail, or the full replay: ``journal.resume_point``), ``run.resumed``
   and ``step.requested`` durable; at about 1k, 10k and 100k events. The ``Plan`` object is
   loaded and digested before the clock starts: parsing a 66k-step plan and its digest (with
   its pinned form, step ids and step positions, computed once per ``Plan`` object, ~60 ms CPU
   at 66k steps) are the plan's own costs,
   paid by a first run too, and reported apart (``plan_digest_ms``);
2. re-run of a sealed (closed) run of 333 / 3,333 / 33,333 steps, the sizes interleaved over 15
   rounds (each size's median over them): it answers from its seal, as a
   user's ``rt.run(plan)`` does: the seal read and hashed against the chain head, its run-level
   stream inflated and decoded, the plan and adapters checked, the outcome returned. The outcome's
   step rows (``RunOutcome.steps``, ``StepRows``) are built only when read, so this measure does
   not read them; building them (inflate and decode the seal's rows, one ``StepSummary`` per step)
   is O(steps) and reported apart as ``materialise_ms``, what a caller that reads every row (``run
   --json``, the table ``run`` prints) pays on top;
3. full replay + verify (``integrity.verify_run``: chain, decode, columns, fold, seal and
   checkpoint checks) per event, with the replay-only fold; and the pure reference fold; and
   verify's breakdown: ``load_run`` (the same replay without the segments' and seal's checks), what
   verify adds to it, and inside the replay the chain's links and the decode, each alone;
4. the per-step cost of a fresh run with checkpoints written (the default cadence) and with
   checkpoints off, interleaved over rounds (CPU and wall per step, ``synchronous=FULL``), and
   the cost of one segment measured directly (on a shared machine the A/B medians are noisy).

With ``--baseline-src /work/main/src`` the same measurements (1-3) of that tree's effectlog run in a
child process after this one's, and ``ratios`` says baseline / this. Results go to
``experiments/results/resume.json`` (read by ``experiments/bench.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from effectlog.journal import SqliteJournal, load_run
from effectlog.plan import AdapterDecl, Plan, StepDecl
from effectlog.runtime import Runtime, SimulatedCrash

HERE = Path(__file__).resolve().parent
RERUN_ROUNDS = 15


def noop_plan(run_id: str, steps: int) -> Plan:
    return Plan(
        run_id=run_id,
        adapters={"noop": AdapterDecl(type="noop", idempotent=True)},
        steps=tuple(StepDecl(id=f"step-{i}", adapter="noop") for i in range(steps)),
    )


def build_histories(workdir: Path, steps: int) -> tuple[Path, Path]:
    """A finished run of ``steps`` steps, and a run of ``2 * steps`` stopped after ``steps``
    (written with synchronous=NORMAL only to build them quickly: resume reads)."""
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


def resume_cpu_ms(path: Path, steps: int, workdir: Path) -> tuple[float, float]:
    """CPU and wall ms from ``run`` to the first effect of the next step (the crash hook)."""
    copy = workdir / "resume-copy.db"
    shutil.copyfile(path, copy)
    first_new = f"step-{steps}"
    plan = noop_plan("resume", 2 * steps)
    digest = plan.digest  # computed once per Plan object, as its parsing: the plan's cost, not the resume's
    marks: list[float] = []

    def at_first_effect(point: str, step_id: str) -> None:
        if point == "after_request" and step_id == first_new:
            marks.extend((time.process_time(), time.perf_counter()))
            raise SimulatedCrash(point)

    try:
        with Runtime(copy, crash_hook=at_first_effect) as rt:
            cpu, wall = time.process_time(), time.perf_counter()
            with contextlib.suppress(SimulatedCrash):
                rt.run(plan)
            if not marks or not digest:
                raise RuntimeError("the resumed run never reached its next step")
            return (marks[0] - cpu) * 1e3, (marks[1] - wall) * 1e3
    finally:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{copy}{suffix}").unlink(missing_ok=True)


def rerun_cpu_ms(path: Path, steps: int) -> tuple[float, float | None]:
    """CPU ms of ``rt.run(plan)`` on a closed run (its rows untouched), then of reading every row once
    (``None`` for a baseline whose rows are a list already built inside the run)."""
    plan = noop_plan("resume", steps)
    assert plan.digest  # the plan's own one-off cost (see resume_cpu_ms)
    with Runtime(path) as rt:
        cpu = time.process_time()
        outcome = rt.run(plan)
        cpu = time.process_time() - cpu
    if outcome.state != "completed" or outcome.events_written:
        raise RuntimeError("a closed run's re-run wrote events")
    if isinstance(outcome.steps, list):  # a baseline: its rows were built inside the run
        return cpu * 1e3, None
    if getattr(outcome.steps, "loaded", False):
        raise RuntimeError("the re-run built its rows inside the measure")
    built = time.process_time()
    rows = list(outcome.steps)
    built = time.process_time() - built
    if len(rows) != steps or rows[-1].id != f"step-{steps - 1}":
        raise RuntimeError("the re-run's rows are not the run's steps")
    return cpu * 1e3, built * 1e3


def verify_us_per_event(path: Path) -> dict[str, float]:
    """CPU us per event: ``verify_run`` as ``effectlog verify`` runs it (read, chain, decode, columns,
    the replay-only fold, checkpoint and seal checks); the read alone, as records and as the rows
    ``verify_run`` reads (``read_rows``); and, over the same records
    already read, the replay-only fold and the pure reference fold (chain and decode included)."""
    from effectlog import events, fold
    from effectlog.integrity import verify_run
    from effectlog.journal import _no_cyclic_gc

    fast_fold = getattr(fold, "replay_records_fast", fold.replay_records)  # a baseline may not have it

    with SqliteJournal(path, writer=False) as journal:
        cpu = time.process_time()
        state = verify_run(journal, "resume")
        verify = time.process_time() - cpu
        cpu = time.process_time()
        # verify's replay without the checkpoint and seal checks (after verify, so on warmer caches: the
        # difference below is an upper bound on what those checks cost)
        loaded = load_run(journal, "resume")
        load_s = time.process_time() - cpu
        cpu = time.process_time()
        records = list(journal.read("resume"))
        read = time.process_time() - cpu
        read_rows = getattr(journal, "read_rows", None)  # what verify_run reads (a baseline may not have it)
        cpu = time.process_time()
        rows = list(read_rows("resume")) if read_rows is not None else records
        rows_s = time.process_time() - cpu
        with _no_cyclic_gc():
            cpu = time.process_time()
            fast = fast_fold(records, journal.chain, run_id="resume")
            fast_s = time.process_time() - cpu
            cpu = time.process_time()
            pure = fold.replay_records(records, journal.chain, run_id="resume")
            pure_s = time.process_time() - cpu
            # The two C-level costs inside every replay, per row as the replay pays them (the object
            # dropped after each row, as the fold drops it): the chain's links and the typed decode.
            link, decode = journal.chain.link, events.decode
            prevs = [bytes(32), *(rec.hash for rec in records[:-1])]  # each row links from the one before
            cpu = time.process_time()
            for prev, rec in zip(prevs, records, strict=True):
                link(prev, rec.body)
            chain_s = time.process_time() - cpu
            cpu = time.process_time()
            for rec in records:
                decode(rec.body)
            decode_s = time.process_time() - cpu
    if not pure == fast == state == loaded:
        raise RuntimeError("the replay-only fold and the pure fold disagree")
    n = state.seq
    return {
        "verify_us_per_event": verify / n * 1e6,
        "read_us_per_event": read / n * 1e6,
        "read_rows_us_per_event": (rows_s if rows is not records else read) / n * 1e6,
        "replay_only_fold_us_per_event": fast_s / n * 1e6,
        "pure_fold_us_per_event": pure_s / n * 1e6,
        # The breakdown of verify: the replay as load_run runs it over the rows, and what verify adds
        # (every checkpoint segment and the seal decoded and compared); inside the replay, the chain
        # and the decode (each measured alone over the records read).
        "load_run_us_per_event": load_s / n * 1e6,
        "segment_and_seal_checks_us_per_event": (verify - load_s) / n * 1e6,
        "chain_us_per_event": chain_s / n * 1e6,
        "decode_us_per_event": decode_s / n * 1e6,
    }


def segment_cost(workdir: Path) -> dict[str, float]:
    """What one checkpoint segment costs to build (the frontier's update, encode), measured directly: a
    segment of a 1,000-step run carrying the 170 steps its last 512 events changed (best of 20)."""
    from effectlog.journal import checkpoint

    try:
        from effectlog.journal.frontier import PlanIds, Tracker
    except ImportError:  # a baseline without frontiers
        PlanIds = Tracker = None

    with Runtime(SqliteJournal(workdir / "segment.db", durability="normal")) as rt:
        rt.run(noop_plan("seg", 1000))
        state = load_run(rt.journal, "seg")
    changed = [f"step-{i}" for i in range(830, 1000)]
    plan = noop_plan("seg", 1000)
    before = None
    if Tracker is not None:  # the tracker as it stood at the previous segment (steps 0-829 done)
        before, _ = Tracker(PlanIds(plan.steps)).advance(state, {f"step-{i}" for i in range(830)})
    best = float("inf")
    for _ in range(20):
        cpu = time.process_time()
        if before is not None:
            _, front = before.advance(state, set(changed))
            row = checkpoint.segment_row(state, changed, front)
        else:
            row = checkpoint.segment_row(state, changed)
        best = min(best, time.process_time() - cpu)
    return {
        "segment_ms": best * 1e3,
        "steps_in_segment": len(changed),
        "us_per_step_written": best / len(changed) * 1e6,
        "segment_bytes": len(row[2]),
    }


def per_step(workdir: Path, steps: int, rounds: int) -> dict[str, Any]:
    """CPU and wall us per step of a fresh run, checkpoints on (default) and off, interleaved (ABBA)."""
    from effectlog.journal import checkpoint

    out: dict[str, list[tuple[float, float]]] = {"with_checkpoints": [], "without_checkpoints": []}
    default = checkpoint.EVERY_EVENTS
    try:
        for r in range(rounds):
            order = (("with_checkpoints", default), ("without_checkpoints", 0))
            for name, every in order if r % 2 == 0 else order[::-1]:
                checkpoint.EVERY_EVENTS = every
                path = workdir / f"step-{name}-{r}.db"
                with Runtime(path) as rt:
                    cpu, wall = time.process_time(), time.perf_counter()
                    rt.run(noop_plan("steps", steps))
                    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                out[name].append((cpu / steps * 1e6, wall / steps * 1e6))
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
    finally:
        checkpoint.EVERY_EVENTS = default
    return {
        name: {
            "cpu_us_per_step": statistics.median(c for c, _ in rows),
            "wall_us_per_step": statistics.median(w for _, w in rows),
            "rounds": rows,
        }
        for name, rows in out.items()
    } | {"steps": steps, "checkpoint_every_events": default, "segment_cost": segment_cost(workdir)}


def baseline(src: str, workdir: Path, *, quick: bool) -> dict[str, Any]:
    """The same measurements of another effectlog (``src``), in a child process, after ours."""
    out = workdir / "baseline.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", "--out", str(out)]
    argv += ["--quick"] if quick else []
    env = {**os.environ, "PYTHONPATH": src}
    print(f"baseline: {src}", flush=True)
    subprocess.run(argv, env=env, check=True)
    data: dict[str, Any] = json.loads(out.read_text())
    data["src"] = src
    return data


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Baseline / this, per measurement (above 1: this is cheaper)."""
    base = results["baseline"]
    return {
        "resume_cpu": [
            {"events": a["events"], "ratio": round(b["cpu_ms"] / a["cpu_ms"], 1)}
            for a, b in zip(results["resume"], base["resume"], strict=True)
        ],
        "sealed_rerun_cpu": [
            {"steps": a["steps"], "ratio": round(b["cpu_ms"] / a["cpu_ms"], 1)}
            for a, b in zip(results["sealed_rerun"], base["sealed_rerun"], strict=True)
        ],
        "verify_per_event": [
            {"events": a["events"], "ratio": round(b["verify_us_per_event"] / a["verify_us_per_event"], 2)}
            for a, b in zip(results["replay"], base["replay"], strict=True)
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1k and 10k events only, fewer rounds")
    parser.add_argument("--out", default=str(HERE / "results" / "resume.json"))
    parser.add_argument(
        "--baseline-src",
        metavar="DIR",
        help="also measure the effectlog sources in DIR (e.g. the main checkout's src) in a child, side by side",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [333, 3333] if args.quick else [333, 3333, 33_333]
    results: dict[str, Any] = {"python": sys.version.split()[0], "resume": [], "sealed_rerun": [], "replay": []}
    with tempfile.TemporaryDirectory(prefix="resume-bench-") as tmp:
        workdir = Path(tmp)
        histories = {steps: build_histories(workdir, steps) for steps in sizes}
        # A re-run is about 1 ms of fixed cost: measured size after size, the machine's state drifted
        # between the blocks and moved the flatness ratio by a third from one bench to the next (1.3x
        # to 2.2x). So every round re-runs each size once, in turn (RERUN_ROUNDS rounds), and each size's
        # figure is its median over the rounds.
        reruns_by_size: dict[int, list[tuple[float, float | None]]] = {steps: [] for steps in sizes}
        for _ in range(RERUN_ROUNDS):
            for steps in sizes:
                reruns_by_size[steps].append(rerun_cpu_ms(histories[steps][0], steps))
        for steps in sizes:
            finished, half = histories[steps]
            with SqliteJournal(half, writer=False) as journal:
                events = load_run(journal, "resume").seq
            runs = [resume_cpu_ms(half, steps, workdir) for _ in range(5)]
            plan = noop_plan("resume", 2 * steps)
            cpu = time.process_time()
            assert plan.digest
            digest_ms = (time.process_time() - cpu) * 1e3
            row = {
                "plan_digest_ms": digest_ms,
                "events": events,
                "confirmed_steps": steps,
                "plan_steps": 2 * steps,
                "cpu_ms": statistics.median(c for c, _ in runs),
                "wall_ms": statistics.median(w for _, w in runs),
            }
            results["resume"].append(row)
            print(f"resume {events} events: {row['cpu_ms']:.1f} ms CPU ({row['wall_ms']:.1f} ms wall)", flush=True)
            reruns = reruns_by_size[steps]
            rerun = statistics.median(c for c, _ in reruns)
            built = [b for _, b in reruns if b is not None]
            rerun_row: dict[str, Any] = {"steps": steps, "cpu_ms": rerun}
            if built:
                rerun_row["materialise_ms"] = statistics.median(built)  # informational: reading every row
            results["sealed_rerun"].append(rerun_row)
            print(
                f"sealed re-run {steps} steps: {rerun:.2f} ms CPU"
                + (f" (reading its rows after: {rerun_row['materialise_ms']:.2f} ms)" if built else ""),
                flush=True,
            )
            runs3 = [verify_us_per_event(finished) for _ in range(3)]  # (a baseline without the fast fold: pure)
            vrow = {"events": 1 + 3 * steps} | {k: statistics.median(r[k] for r in runs3) for k in runs3[0]}
            results["replay"].append(vrow)
            print(
                f"replay+verify {vrow['events']} events: {vrow['verify_us_per_event']:.2f} us/event "
                f"(read {vrow['read_us_per_event']:.2f}, as rows {vrow['read_rows_us_per_event']:.2f}; "
                f"on read records: replay-only fold "
                f"{vrow['replay_only_fold_us_per_event']:.2f}, pure fold {vrow['pure_fold_us_per_event']:.2f}; "
                f"load_run {vrow['load_run_us_per_event']:.2f}, segment+seal checks "
                f"{vrow['segment_and_seal_checks_us_per_event']:.2f}, chain {vrow['chain_us_per_event']:.2f}, "
                f"decode {vrow['decode_us_per_event']:.2f})",
                flush=True,
            )
            for path in (finished, half):
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{path}{suffix}").unlink(missing_ok=True)
        if not args.child:
            results["per_step"] = per_step(workdir, 300 if args.quick else 1000, 3 if args.quick else 7)
            ps = results["per_step"]
            print(
                f"per step: {ps['with_checkpoints']['cpu_us_per_step']:.1f} us CPU with checkpoints, "
                f"{ps['without_checkpoints']['cpu_us_per_step']:.1f} without; one segment of "
                f"{ps['segment_cost']['steps_in_segment']} steps {ps['segment_cost']['segment_ms']:.2f} ms "
                f"({ps['segment_cost']['us_per_step_written']:.2f} us per step written)",
                flush=True,
            )
        if args.baseline_src:
            results["baseline"] = baseline(args.baseline_src, workdir, quick=args.quick)
            results["ratios"] = ratios(results)
            print(json.dumps(results["ratios"], indent=1), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
