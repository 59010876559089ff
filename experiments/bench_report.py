"""Targets, ratios, plots and ``docs/performance.md`` from one ``make bench`` (nothing here measures).

Three result files feed the report: ``bench.json`` (``bench.py``: single runs, peers,
concurrency, footprint), ``fleet.json`` (``fleet_bench.py``) and ``resume.json``
(``resume_bench.py``). Each is read as it is; a file or a figure that is absent makes
its target row "not measured", never a guess.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "experiments" / "results"

# The targets of issue 18 (single run, concurrency, peers, fleet, resume, replay).
OVERHEAD_MAX = 1.3
MIN_ROUNDS = 5
SIZES = ("100", "1000", "10000")
DBOS_MIN = 5.0
LANGGRAPH_MIN = 4.0
GROUP_MIN = 5.0
PG_CLAIMS_MIN = 1500.0
PG_RUNS_MIN = 120.0
SQLITE_RUNS_MIN = 250.0
STATEMENTS_MAX = 30.0
COMMITS_MAX = 7.0
RESUME_CPU_MAX_MS = 30.0
RERUN_CPU_MAX_MS = 20.0
REPLAY_CPU_MAX_US = 4.0
FLAT_MAX = 2.0  # "flat in history": the largest history costs at most this many times the smallest
# Earlier targets (issue 7), still tracked.
FOLD_MAX_US = 10.0
BYTES_MAX = 400.0
RSS_MAX_MB = 150.0


def _get(results: Any, *path: str) -> Any:
    node: Any = results
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def read_results(path: Path) -> dict[str, Any] | None:
    """A result file's JSON object, or None when it is absent or not a JSON object (never an exception)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def number(value: Any) -> float | None:
    """A measured figure, or None for anything that is not one (absent, an error text, a bool)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def normalize_resume(data: dict[str, Any] | None) -> dict[str, Any] | None:
    """resume.json in the shape the report reads, from either shape resume_bench.py may write.

    The agreed shape is kept as it is: ``{"resume_cpu_ms": {"1000": x, ...}, "sealed_rerun_cpu_ms":
    {"33000": w}, "replay_verify_us_per_event_cpu": v, "checkpoint_per_step_us": {"with": a,
    "without": b}}``. The list shape (``resume: [{events, cpu_ms}]``, ``sealed_rerun: [{steps,
    cpu_ms}]``, ``replay: [{events, verify_us_per_event}]``, ``per_step: {with_checkpoints:
    {cpu_us_per_step}, without_checkpoints: ...}``) is translated: sizes become keys, and the
    replay figure is the worst size's.
    """
    if data is None or "resume_cpu_ms" in data or not any(k in data for k in ("resume", "sealed_rerun", "replay")):
        return data

    def keyed(rows: Any, size: str, value: str) -> dict[str, float]:
        found = {}
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict) and number(row.get(size)) is not None and number(row.get(value)) is not None:
                found[str(int(row[size]))] = float(row[value])
        return found

    out: dict[str, Any] = {
        "resume_cpu_ms": keyed(data.get("resume"), "events", "cpu_ms"),
        "sealed_rerun_cpu_ms": keyed(data.get("sealed_rerun"), "steps", "cpu_ms"),
    }
    replay = keyed(data.get("replay"), "events", "verify_us_per_event")
    if replay:
        out["replay_verify_us_per_event_cpu"] = max(replay.values())
    with_, without = (_get(data, "per_step", f"{k}_checkpoints", "cpu_us_per_step") for k in ("with", "without"))
    if number(with_) is not None or number(without) is not None:
        out["checkpoint_per_step_us"] = {"with": with_, "without": without}
    for key in ("why", "measured_at"):
        if key in data:
            out[key] = data[key]
    return out


# -- evaluating one target -----------------------------------------------------------------------


def evaluate(
    name: str,
    measured: Any,
    limit: float,
    *,
    at_most: bool,
    unit: str = "",
    each: list[float] | None = None,
    absent: str = "not measured",
    why: str = "",
    spec: str = ".2f",
) -> dict[str, Any]:
    """One target row: ``met`` is True, False, or None when nothing was measured.

    ``each`` are the per-round values behind a median: a median that meets the target while
    some rounds do not is still "met", and the row says how many rounds did.
    """
    value = number(measured)
    if value is None:
        return {"target": name, "measured": absent, "met": None, "status": "not measured", "why": why}
    ok = (lambda v: v <= limit) if at_most else (lambda v: v >= limit)
    met = ok(value)
    shown = f"{value:{spec}}{unit}"
    status = "met"
    if not met:
        gap = (value / limit - 1) if at_most else (1 - value / limit)
        status = f"missed by {gap:.0%}"
    if each and len(each) > 1:
        shown += f" (rounds {min(each):{spec}} to {max(each):{spec}})"
        passing = sum(1 for v in each if ok(v))
        if passing < len(each):
            status += f" ({passing} of {len(each)} rounds met it)"
    return {"target": name, "measured": shown, "met": met, "status": status, "why": "" if met else why}


def flatness(by_size: Any) -> tuple[float | None, str]:
    """How a cost grows with history: the largest size's figure over the smallest's, and the figures.

    None when fewer than two sizes were measured (one point says nothing about growth).
    """
    if not isinstance(by_size, dict):
        return None, "not measured"
    points = sorted((int(k), number(v)) for k, v in by_size.items() if str(k).isdigit())
    points = [(k, v) for k, v in points if v is not None]
    shown = ", ".join(f"{k:,}: {v:.1f} ms" for k, v in points) or "not measured"
    if len(points) < 2 or points[0][1] == 0:
        return None, shown
    return points[-1][1] / points[0][1], shown


# -- ratios of pairs measured side by side --------------------------------------------------------


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    """Every ratio from pairs measured in the same run (medians of interleaved repeats)."""
    out: dict[str, Any] = {}
    for n, row in results["single"].items():
        out[f"effectlog / floor, us per step, N={n}"] = row["effectlog_over_floor"]
        if "cpu_effectlog_over_floor" in row:
            out[f"effectlog / floor, CPU us per step, N={n}"] = row["cpu_effectlog_over_floor"]
        for name in ("dbos", "langgraph"):
            peer = _get(results, "peers", name, n)
            if peer is None:
                continue
            if "effectlog_speedup" in peer:
                out[f"effectlog / {name}, steps per s, N={n}"] = peer["effectlog_speedup"]
            else:
                out[f"effectlog / {name}, steps per s, N={n}"] = f"not measured ({peer['error']})"
    for k, row in results["concurrent"].items():
        if k != "1":
            out[f"K={k} concurrent runs / one run, aggregate steps per s"] = row["over_one_run"]
    return out


# -- the target rows --------------------------------------------------------------------------------


def single_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for n in SIZES:
        row = _get(results, "single", n) or {}
        each = row.get("effectlog_over_floor_rounds")
        got = evaluate(
            f"single run <= {OVERHEAD_MAX}x the two-commit floor, N={int(n):,}, >= {MIN_ROUNDS} interleaved rounds",
            row.get("effectlog_over_floor"),
            OVERHEAD_MAX,
            at_most=True,
            unit="x",
            each=each,
            why=why_single(results, n) if row else "",
        )
        if row and row.get("rounds", 0) < MIN_ROUNDS:
            got["status"] += f"; only {row.get('rounds')} rounds (a quick run)"
        rows.append(got)
    sizes = [_get(results, "single", n) for n in SIZES]
    present = [row for row in sizes if row]
    regime = results.get("wal_regime")
    complete = (
        len(present) == len(SIZES)
        and all("cpu_us_per_step" in row["effectlog"] and "one_off" in row["effectlog"] for row in present)
        and regime is not None
    )
    rows.append(
        {
            "target": "CPU per step beside wall time, the WAL in the same regime for every N, one-off costs apart",
            "measured": (
                f"CPU and wall per step for every system; WAL: {regime}; start-up, run start and closing apart"
                if complete
                else "not measured at every N (a quick run)"
                if present
                else "not measured"
            ),
            "met": True if complete else None,
            "status": "met" if complete else "not measured",
            "why": "",
        }
    )
    return rows


def peer_and_group_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, label, limit in (
        ("dbos", "DBOS-on-SQLite steps/s", DBOS_MIN),
        ("langgraph", "LangGraph-sync nodes/s", LANGGRAPH_MIN),
    ):
        peer = _get(results, "peers", name, "1000") or {}
        rows.append(
            evaluate(
                f"effectlog >= {limit:.0f}x {label} at N=1,000",
                peer.get("effectlog_speedup"),
                limit,
                at_most=False,
                unit="x",
                each=peer.get("effectlog_speedup_rounds"),
                absent=f"not measured ({peer['error']})" if "error" in peer else "not measured",
                why=why_peer(results, name),
            )
        )
    k32 = _get(results, "concurrent", "32") or {}
    rows.append(
        evaluate(
            f"32 concurrent runs >= {GROUP_MIN:.0f}x one run's steps/s",
            k32.get("over_one_run"),
            GROUP_MIN,
            at_most=False,
            unit="x",
            each=k32.get("over_one_run_rounds"),
            why=why_group(results),
        )
    )
    return rows


def fleet_figures(fleet: dict[str, Any] | None, backend: str, key: str) -> dict[int, float]:
    """``results[backend][processes][key]`` of fleet.json for every process count that has it."""
    by_count = _get(fleet, "results", backend) or {}
    out = {}
    for count, row in by_count.items():
        value = number(_get(row, key))
        if str(count).isdigit() and value is not None:
            out[int(count)] = value
    return dict(sorted(out.items()))


def fleet_targets(fleet: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The fleet rows, read from fleet.json as ``experiments/fleet_bench.py`` wrote it."""
    source = "experiments/results/fleet.json"
    absent = f"not measured ({source} absent)" if fleet is None else "not measured"
    rows = []

    def why(key: str, default: str) -> str:
        given = _get(fleet, "why", key)
        return given if isinstance(given, str) and given else default

    pg_claims = fleet_figures(fleet, "postgres", "claims_per_s")
    top = max(pg_claims) if pg_claims else None
    rows.append(
        evaluate(
            f"PostgreSQL fleet claims/s at {top or 8} runner processes >= {PG_CLAIMS_MIN:,.0f}",
            pg_claims.get(top) if top else None,
            PG_CLAIMS_MIN,
            at_most=False,
            spec=",.0f",
            absent=absent,
            why=why("pg_claims", f"claims/s by processes: {_series(pg_claims)}; see [fleet.md](fleet.md#numbers)."),
        )
    )
    for backend, label in (("postgres", "PostgreSQL"), ("sqlite", "SQLite")):
        claims = fleet_figures(fleet, backend, "claims_per_s")
        ratio = claims[max(claims)] / claims[1] if 1 in claims and len(claims) > 1 else None
        rows.append(
            evaluate(
                f"{label} fleet claims/s at {max(claims) if claims else 8} processes not below 1 process",
                ratio,
                1.0,
                at_most=False,
                unit="x of 1 process",
                absent=absent,
                why=why(f"{backend}_claims_scaling", f"claims/s by processes: {_series(claims)}."),
            )
        )
    for backend, label, limit in (("postgres", "PostgreSQL", PG_RUNS_MIN), ("sqlite", "SQLite", SQLITE_RUNS_MIN)):
        runs = fleet_figures(fleet, backend, "runs_per_s")
        best = max(runs, key=lambda c: runs[c]) if runs else None
        got = evaluate(
            f"{label} fleet runs/s (2-step no-op runs) >= {limit:.0f} at the best process count",
            runs.get(best) if best else None,
            limit,
            at_most=False,
            spec=",.1f",
            absent=absent,
            why=why(f"{backend}_runs", f"runs/s by processes: {_series(runs)}; see [fleet.md](fleet.md#numbers)."),
        )
        if best:
            got["measured"] += f" at {best} processes"
        rows.append(got)
    for key, label, limit in (("statements_per_run", "statements", STATEMENTS_MAX), ("commits_per_run", "commits",
                                                                                      COMMITS_MAX)):
        figures = fleet_figures(fleet, "postgres", key)
        worst = max(figures.values()) if figures else None
        rows.append(
            evaluate(
                f"PostgreSQL {label} per fleet run <= {limit:.0f} (worst process count)",
                worst,
                limit,
                at_most=True,
                spec=",.1f",
                absent=absent,
                why=why(key, f"{label} per run by processes: {_series(figures)}."),
            )
        )
    idle = {b: _get(fleet, "idle_wait", b) or _get(fleet, "results", b, "idle_wait") for b in ("postgres", "sqlite")}
    polls = [b for b, how in idle.items() if isinstance(how, str) and "poll" in how.lower()]
    known = all(isinstance(how, str) and how for how in idle.values())
    rows.append(
        {
            "target": "idle runners wait on LISTEN/NOTIFY (PostgreSQL) or a blocking lock (SQLite), not a 10 ms poll",
            "measured": "; ".join(f"{b}: {how}" for b, how in idle.items()) if known else absent,
            "met": (not polls) if known else None,
            "status": ("met" if not polls else "missed") if known else "not measured",
            "why": why("idle_wait", f"{', '.join(polls)} still polls") if polls else "",
        }
    )
    return rows


def resume_targets(resume: dict[str, Any] | None, results: dict[str, Any]) -> list[dict[str, Any]]:
    """The resume and replay rows, read from resume.json as ``experiments/resume_bench.py`` wrote it.

    bench.py's own resume figures (the section below) are shown beside a row when resume.json
    is absent, as context, never as the row's measurement.
    """
    absent = "not measured (experiments/results/resume.json absent)" if resume is None else "not measured"
    own = {str(x["half_events"] // 1000 * 1000): x for x in results.get("resume", [])}

    def why(key: str, default: str) -> str:
        given = _get(resume, "why", key)
        return given if isinstance(given, str) and given else default

    def context(text: str) -> str:
        return f"{absent}; bench.py's own figure: {text}" if resume is None and text else absent

    resume_cpu = _get(resume, "resume_cpu_ms") or {}
    big = own.get("100000") or (results.get("resume") or [{}])[-1]
    growth, shown = flatness(resume_cpu)
    own_text = (
        f"{big['half_resume_to_next_effect_cpu_ms']:.1f} ms CPU at {big['half_events']:,} events"
        if "half_resume_to_next_effect_cpu_ms" in big
        else ""
    )
    rows = [
        evaluate(
            f"resume of a half-finished 100k-event run to its next effect <= {RESUME_CPU_MAX_MS:.0f} ms CPU",
            resume_cpu.get("100000"),
            RESUME_CPU_MAX_MS,
            at_most=True,
            unit=" ms",
            spec=".1f",
            absent=context(own_text),
            why=why("resume", f"by history: {shown}; the replay of the history still dominates."),
        ),
        evaluate(
            f"resume flat in history: 100k events <= {FLAT_MAX:.0f}x 1k events",
            growth,
            FLAT_MAX,
            at_most=True,
            unit="x",
            absent=absent,
            why=why("resume_flat", f"by history: {shown}: the cost still grows with the events replayed."),
        ),
    ]
    if growth is not None:
        rows[-1]["measured"] += f" ({shown})"
    rerun = _get(resume, "sealed_rerun_cpu_ms") or {}
    largest = max(rerun, key=int) if rerun else "33000"
    own_big = (results.get("resume") or [{}])[-1]
    own_text = (
        f"{own_big['finished_rerun_cpu_ms']:.1f} ms CPU at {own_big['confirmed_steps']:,} steps"
        if "finished_rerun_cpu_ms" in own_big
        else ""
    )
    rows.append(
        evaluate(
            f"re-run of a sealed {int(largest) // 1000}k-step run <= {RERUN_CPU_MAX_MS:.0f} ms CPU",
            rerun.get(largest),
            RERUN_CPU_MAX_MS,
            at_most=True,
            unit=" ms",
            spec=".1f",
            absent=context(own_text),
            why=why("sealed_rerun", "what a re-run still does grows with the number of steps (see the resume table)."),
        )
    )
    growth, shown = flatness(rerun)
    rows.append(
        evaluate(
            f"sealed re-run flat in history: largest <= {FLAT_MAX:.0f}x smallest",
            growth,
            FLAT_MAX,
            at_most=True,
            unit="x",
            absent=absent if resume is None else f"not measured (resume.json has one size only: {shown})",
            why=why("sealed_rerun_flat", f"by size: {shown}."),
        )
    )
    own_fold = max((x["finished_fold_cpu_us_per_event"] for x in results.get("resume", [])), default=None)
    rows.append(
        evaluate(
            f"full replay + verify <= {REPLAY_CPU_MAX_US:.0f} µs per event, CPU",
            _get(resume, "replay_verify_us_per_event_cpu"),
            REPLAY_CPU_MAX_US,
            at_most=True,
            unit=" µs",
            absent=context(f"{own_fold:.2f} µs CPU (worst size)" if own_fold is not None else ""),
            why=why("replay", "decode, hash and fold per event in Python (see docs/architecture.md)."),
        )
    )
    return rows


def earlier_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 7's targets that issue 18 did not restate, measured by bench.py."""
    rows = []
    if results.get("resume"):
        worst = max(max(x["half_fold_cpu_us_per_event"], x["finished_fold_cpu_us_per_event"])
                    for x in results["resume"])
        rows.append(evaluate(f"fold and verify <= {FOLD_MAX_US:.0f} µs per event, CPU (worst size)", worst,
                             FOLD_MAX_US, at_most=True, unit=" µs",
                             why="replay reads, re-hashes, decodes and folds each event in Python."))
        big = results["resume"][-1]
        closed = big["finished_rerun_ms"] < big["finished_full_replay_ms"]
        rows.append({
            "target": "re-running a closed run does not fold its history",
            "measured": f"{big['finished_rerun_ms']:.1f} ms vs {big['finished_full_replay_ms']:.0f} ms "
            f"for a full replay ({big['finished_events']:,} events)",
            "met": closed, "status": "met" if closed else "missed", "why": "",
        })
    fp = results.get("footprint", {})
    rows.append(evaluate(f"<= {BYTES_MAX:.0f} journal bytes per event", fp.get("bytes_per_event"), BYTES_MAX,
                         at_most=True, unit=" B", spec=".0f",
                         why="each event row holds its canonical JSON, its chain hash and a dedup index entry."))
    rows.append(evaluate(f"peak RSS < {RSS_MAX_MB:.0f} MB for a {fp.get('events', 100_000):,}-event run",
                         fp.get("peak_rss_mb_run"), RSS_MAX_MB, at_most=True, unit=" MB", spec=".0f",
                         why="the run keeps its plan and every step's state in memory."))
    return rows


def targets(
    results: dict[str, Any], fleet: dict[str, Any] | None = None, resume: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every target row of issue 18, in the issue's order."""
    return [
        *fleet_targets(fleet),
        *resume_targets(resume, results),
        *single_targets(results),
        *peer_and_group_targets(results),
    ]


# -- why a target is missed: the mechanism, with this run's numbers -----------------------------------


def _series(figures: dict[int, float]) -> str:
    return ", ".join(f"{k}: {v:,.0f}" for k, v in figures.items()) or "not measured"


def why_single(results: dict[str, Any], n: str) -> str:
    """The single-run excess over the floor split into CPU and waiting, with the WAL and fsync evidence."""
    row = results["single"][n]
    floor, mine = row["floor"], row["effectlog"]
    extra, cpu, wait = row["effectlog_minus_floor_us"], row.get("cpu_minus_floor_us"), row.get("wait_minus_floor_us")
    allowed = (OVERHEAD_MAX - 1) * floor["us_per_step"]
    text = (
        f"effectlog spent {extra:,.0f} µs per step more than the floor (median of the rounds' differences; "
        f"{OVERHEAD_MAX}x allows {allowed:,.0f} µs at this floor)."
    )
    if cpu is not None and wait is not None:
        text += (
            f" CPU time of the process: {mine['cpu_us_per_step']:,.0f} µs per step against the floor's "
            f"{floor['cpu_us_per_step']:,.0f}, so {cpu:,.0f} µs of the excess is CPU (building, checking, "
            f"encoding, hashing and inserting three events per step) and {wait:,.0f} µs is waiting (the disk's "
            "syncs, and time descheduled on a shared machine)."
        )
        if "user_us_per_step" in mine and "user_us_per_step" in floor:
            text += (
                f" Of the CPU, user space (Python and SQLite's own work) is {mine['user_us_per_step']:,.0f} µs "
                f"against {floor['user_us_per_step']:,.0f}, the kernel (writes, syncs) {mine['sys_us_per_step']:,.0f}"
                f" µs against {floor['sys_us_per_step']:,.0f}."
            )
        if cpu > allowed:
            text += f" The CPU excess alone is {cpu / allowed:.1f}x what the target allows."
    ev = row.get("evidence") or {}
    if "wal_frames_per_commit" in ev.get("effectlog", {}):
        e, f = ev["effectlog"], ev["floor"]
        text += (
            f" Each commit wrote {e['wal_frames_per_commit']:.1f} WAL pages against the floor's "
            f"{f['wal_frames_per_commit']:.1f} ({e['checkpoints']} and {f['checkpoints']} checkpoints during the run)."
        )
    ram = ev.get("ram") or {}
    if "floor" in ram and "effectlog" in ram:
        rf, re_ = ram["floor"]["us_per_step"], ram["effectlog"]["us_per_step"]
        more = ram.get("effectlog_minus_floor_us", re_ - rf)
        when = "in the same rounds" if "effectlog_minus_floor_us" in ram else "once, after the rounds"
        text += (
            f" The same pair on a RAM disk {when} (a sync returns at once): floor {rf:,.0f} µs per "
            f"step, effectlog {re_:,.0f}: without the disk effectlog's own work costs {more:,.0f} µs per step "
            f"more ({more / allowed:.1f}x the {allowed:,.0f} µs the target allows here)."
        )
    fsyncs = row.get("fsync_us_rounds") or []
    if fsyncs:
        text += (
            f" A 4 KiB write + fsync took {min(fsyncs):,.0f} to {max(fsyncs):,.0f} µs (median per round) in "
            "this N's rounds."
        )
    text += by_disk(results)
    return text


SLOW_SYNC_US = 500.0  # a round whose fsync probe took longer than this ran on a busy disk


def by_disk(results: dict[str, Any]) -> str:
    """The rounds' ratios split by how fast the disk synced in that round, over every N.

    A slow sync lengthens both sides of the ratio by the same amount and pulls it towards 1; a
    fast one leaves effectlog's own work exposed. Empty when the rounds do not cover both kinds.
    """
    quick, slow = [], []
    for row in results["single"].values():
        for fsync, ratio in zip(row.get("fsync_us_rounds") or [], row.get("effectlog_over_floor_rounds") or [],
                                strict=False):
            (slow if fsync > SLOW_SYNC_US else quick).append(ratio)
    if not quick or not slow:
        return ""
    return (
        f" Over every N, the {len(quick)} rounds whose fsync probe took at most {SLOW_SYNC_US:,.0f} µs had "
        f"ratios {min(quick):.2f} to {max(quick):.2f} (median {sorted(quick)[len(quick) // 2]:.2f}), the "
        f"{len(slow)} rounds on a busier disk {min(slow):.2f} to {max(slow):.2f} (median "
        f"{sorted(slow)[len(slow) // 2]:.2f}): a slow sync adds the same time to both sides and hides "
        "effectlog's own work, a fast one exposes it."
    )


def why_peer(results: dict[str, Any], name: str) -> str:
    """A peer ratio missed: syncs per step on each side (strace), CPU per step, and the disk's sync time."""
    peer = _get(results, "peers", name, "1000") or {}
    mine = _get(results, "single", "1000", "effectlog") or {}
    text = (
        "effectlog makes two durable commits per step (intent before the effect, result before advancing) "
        "and keeps them."
    )
    theirs, ours = _get(results, "syncs", name, "syncs_per_step"), _get(results, "syncs", "effectlog", "syncs_per_step")
    if number(theirs) is not None and number(ours) is not None:
        text += (
            f" Counted by strace in this run, {name} waits for {theirs:.1f} syncs per step and effectlog for "
            f"{ours:.1f}: where the disk's syncs dominate, the ratio tends to {theirs / ours:.1f}."
        )
    if "cpu_us_per_step" in peer and "cpu_us_per_step" in mine:
        text += (
            f" CPU per step: {name} {peer['cpu_us_per_step']:,.0f} µs, effectlog {mine['cpu_us_per_step']:,.0f} µs "
            f"({peer['cpu_us_per_step'] / mine['cpu_us_per_step']:.1f}x): where syncs are fast, the ratio tends to "
            "that."
        )
    fsyncs = _get(results, "single", "1000", "fsync_us_rounds") or []
    if fsyncs:
        text += (
            f" In these rounds a 4 KiB write + fsync took {min(fsyncs):,.0f} to {max(fsyncs):,.0f} µs, and the "
            f"floor itself took {_get(results, 'single', '1000', 'floor', 'us_per_step'):,.0f} µs per step."
        )
    return text


def why_group(results: dict[str, Any]) -> str:
    one_run, k32 = _get(results, "concurrent", "1") or {}, _get(results, "concurrent", "32") or {}
    if not one_run or not k32:
        return ""
    per_run = k32.get("steps_per_run", 0)
    text = (
        f"Group commit works (32 runs of {per_run} steps took {k32.get('commits', 0):,} commits instead of "
        f"{32 * (2 * per_run + 2):,}); one run alone did {one_run['steps_per_s']:,.0f} steps/s (rounds "
        f"{min(one_run['samples']):,.0f} to {max(one_run['samples']):,.0f}), and the faster the disk syncs, the "
        "lower the ratio."
    )
    if "cpu_us_per_step" in k32:
        ceiling = 1e6 / k32["cpu_us_per_step"]
        text += (
            f" At K=32 the process spent {k32['cpu_us_per_step']:,.0f} µs of CPU per step: one Python process "
            f"cannot exceed about {ceiling:,.0f} steps/s, {ceiling / one_run['steps_per_s']:.1f}x one run's rate."
        )
    return text


# -- plots ------------------------------------------------------------------------------------------


def write_plots(results: dict[str, Any], img: Path, resume: dict[str, Any] | None = None) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img.mkdir(parents=True, exist_ok=True)
    images: dict[str, str] = {}

    # single runs: wall and CPU per step for every system at every size
    sizes = sorted(results["single"], key=int)
    systems = [("floor", "SQLite floor (2 commits)"), ("effectlog", "effectlog"), ("dbos", "DBOS (SQLite)"),
               ("langgraph", "LangGraph SqliteSaver, sync")]
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    width = 0.2
    for i, (key, label) in enumerate(systems):
        xs, walls, cpus = [], [], []
        for j, n in enumerate(sizes):
            row = _get(results, "single", n, key) or _get(results, "peers", key, n) or {}
            if number(row.get("us_per_step")):
                xs.append(j + (i - 1.5) * width)
                walls.append(row["us_per_step"])
                cpus.append(row.get("cpu_us_per_step", 0.0))
        bars = ax.bar(xs, walls, width, label=f"{label}: wall")
        ax.bar(xs, cpus, width * 0.5, color="black", alpha=0.55,
               label="CPU time of the process" if i == 0 else None)
        del bars
    ax.set_xticks(range(len(sizes)), [f"N = {int(n):,}" for n in sizes])
    ax.set_ylabel("µs per step (lower is better)")
    ax.set_yscale("log")
    ax.set_title("One run of N no-op steps: wall clock (bars) and CPU time (dark inner bars)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(img / "bench-single.png", dpi=110)
    plt.close(fig)
    images["single"] = "img/bench-single.png"

    # where the excess over the floor goes: CPU and waiting, per N
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    xs = range(len(sizes))
    cpu = [results["single"][n].get("cpu_minus_floor_us", 0.0) for n in sizes]
    wait = [results["single"][n].get("wait_minus_floor_us", 0.0) for n in sizes]
    allowed = [(OVERHEAD_MAX - 1) * results["single"][n]["floor"]["us_per_step"] for n in sizes]
    ax.bar(xs, cpu, 0.5, label="extra CPU per step")
    ax.bar(xs, wait, 0.5, bottom=cpu, label="extra waiting per step (disk, descheduled)")
    ax.hlines(allowed, [x - 0.3 for x in xs], [x + 0.3 for x in xs], colors="black", linewidth=2,
              label=f"allowed by {OVERHEAD_MAX}x the floor")
    ax.axhline(0, color="grey", linewidth=0.5)
    ax.set_ylim(top=max([*allowed, *(c + w for c, w in zip(cpu, wait, strict=True))]) * 1.35)
    ax.set_xticks(list(xs), [f"N = {int(n):,}" for n in sizes])
    ax.set_ylabel("µs per step over the floor")
    ax.set_title("effectlog minus the floor, per step")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(img / "bench-excess.png", dpi=110)
    plt.close(fig)
    images["excess"] = "img/bench-excess.png"

    # each round's ratio against how fast the disk synced in that round
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for n in sizes:
        row = results["single"][n]
        pairs = list(zip(row.get("fsync_us_rounds") or [], row.get("effectlog_over_floor_rounds") or [],
                         strict=False))
        if pairs:
            ax.plot([f for f, _ in pairs], [r for _, r in pairs], "o", label=f"N = {int(n):,}")
    ax.axhline(OVERHEAD_MAX, color="grey", linestyle="--", label=f"target: {OVERHEAD_MAX}x")
    ax.set_xscale("log")
    ax.set_xlabel("4 KiB write + fsync in that round, µs (median of the probe)")
    ax.set_ylabel("effectlog ÷ floor, µs per step")
    ax.set_title("Each round's ratio against the disk's sync time")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(img / "bench-ratio-vs-fsync.png", dpi=110)
    plt.close(fig)
    images["ratio_vs_fsync"] = "img/bench-ratio-vs-fsync.png"

    # concurrency
    ks = sorted(results["concurrent"], key=int)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([int(k) for k in ks], [results["concurrent"][k]["steps_per_s"] for k in ks], "o-", label="effectlog")
    cpu_ceiling = [1e6 / results["concurrent"][k]["cpu_us_per_step"] for k in ks
                   if results["concurrent"][k].get("cpu_us_per_step")]
    if len(cpu_ceiling) == len(ks):
        ax.plot([int(k) for k in ks], cpu_ceiling, "x:", label="CPU ceiling (1 s / CPU time per step)")
    one = results["concurrent"]["1"]["steps_per_s"]
    ax.axhline(GROUP_MIN * one, color="grey", linestyle="--", label=f"{GROUP_MIN:.0f}x one run (target at K=32)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent runs in one process (K)")
    ax.set_ylabel("aggregate steps per second")
    ax.set_title("Group commit: runs share durable commits")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(img / "bench-concurrency.png", dpi=110)
    plt.close(fig)
    images["concurrency"] = "img/bench-concurrency.png"

    # resume: bench.py's own figures, and resume_bench.py's CPU figures when present
    rows = results["resume"]
    if rows:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        ev = [x["half_events"] for x in rows]
        ax.plot(ev, [x["half_fold_ms"] for x in rows], "o-", label="half-finished: replay and verify (wall)")
        if all("half_resume_to_next_effect_cpu_ms" in x for x in rows):
            ax.plot(ev, [x["half_resume_to_next_effect_cpu_ms"] for x in rows], "s-",
                    label="half-finished: to next effect (CPU)")
        ax.plot([x["finished_events"] for x in rows], [x["finished_full_replay_ms"] for x in rows], "^--",
                label="finished: a full replay would take (wall)")
        if all("finished_rerun_cpu_ms" in x for x in rows):
            ax.plot([x["finished_events"] for x in rows], [x["finished_rerun_cpu_ms"] for x in rows], "v-",
                    label="finished: re-run from its seal (CPU)")
        theirs = sorted((int(k), v) for k, v in (_get(resume, "resume_cpu_ms") or {}).items() if number(v))
        if theirs:
            ax.plot([k for k, _ in theirs], [v for _, v in theirs], "D-", label="resume_bench.py: to next effect (CPU)")
        ax.axhline(RESUME_CPU_MAX_MS, color="grey", linestyle="--", label=f"{RESUME_CPU_MAX_MS:.0f} ms CPU target")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("events in the run's history")
        ax.set_ylabel("milliseconds")
        ax.set_title("Resume cost against history")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(img / "bench-resume.png", dpi=110)
        plt.close(fig)
        images["resume"] = "img/bench-resume.png"
    return images


# -- the page ---------------------------------------------------------------------------------------


def _fmt(value: Any, spec: str = ",.0f") -> str:
    return format(value, spec) if number(value) is not None else "not measured"


def _table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| target | measured | status |", "|---|---|---|"]
    lines += [f"| {row['target']} | {row['measured']} | {row['status']} |" for row in rows]
    return lines


def write_doc(
    results: dict[str, Any],
    doc: Path,
    images: dict[str, str],
    json_path: Path,
    *,
    fleet: dict[str, Any] | None = None,
    resume: dict[str, Any] | None = None,
) -> None:
    m = results["machine"]
    load = ""
    if "load_start" in m and "load_end" in m:
        load = (
            f" The 1-minute load average was {m['load_start'][0]:.1f} at the start and {m['load_end'][0]:.1f} at "
            f"the end on {m['cores']} cores (the benchmark ran at niceness {m.get('niceness', 0)}): other work "
            "shared the machine, which is why figures are medians of interleaved rounds, why the spread of the "
            "rounds is shown, and why wall clock and CPU time are both given."
        )
    lines: list[str] = [
        "# Performance",
        "",
        "Generated by `make bench` (`experiments/bench.py`, then `experiments/resume_bench.py` and "
        "`experiments/fleet_bench.py` when present, then this report); do not edit by hand. Raw numbers: "
        f"`{_rel(json_path)}`, `experiments/results/resume.json`, `experiments/results/fleet.json`.",
        "",
        f"Measured {m['date']} on {m['cores']} cores, Python {m['python']}, SQLite {m['sqlite']}"
        f"{' (quick run: smaller sizes, fewer rounds)' if m['quick'] else ''}. "
        f"A 4 KiB write plus fsync took a median {m['fsync_us_start']:.0f} µs at the start and "
        f"{m['fsync_us_end']:.0f} µs at the end of the run: every durable commit waits for one, so "
        f"absolute numbers move with the disk, and only ratios of pairs measured side by side mean much.{load}",
        "",
        "Every system runs a no-op step. effectlog and the floor use WAL with `synchronous=FULL`; "
        "the peers use their own defaults (listed below). Each size is measured in interleaved rounds "
        "(fsync probe, floor, effectlog, DBOS, LangGraph, then again); a ratio is the median of the ratios of "
        "each round's back-to-back pair, which cancels the drift of the disk's sync latency. Every time is "
        "given twice: wall clock, and the CPU time of the measuring process (`time.process_time()`, all its "
        "threads; the peers measure their own in their child process).",
        "",
        "## Targets (issue 18)",
        "",
        *_table(rows := targets(results, fleet, resume)),
    ]
    lines += ["", *sources(results, fleet, resume)]
    missed = [row for row in rows if row["met"] is False and row["why"]]
    if missed:
        lines += ["", "### Why targets are missed", ""]
        lines += [f"- **{row['target']}** ({row['status']}): {row['why']}" for row in missed]
    lines += ["", "### Earlier targets (issue 7), still tracked", "", *_table(earlier := earlier_targets(results))]
    lines += [f"- **{row['target']}** ({row['status']}): {row['why']}" for row in earlier if row["met"] is False]
    lines += single_section(results, images)
    lines += peers_section(results)
    lines += concurrency_section(results, images)
    lines += resume_section(results, images, resume)
    lines += footprint_section(results)
    lines += ["", *fleet_table(fleet), "", *fleet_section(doc.parent / "fleet.md")]
    lines.append("")
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text("\n".join(lines))


def sources(results: dict[str, Any], fleet: dict[str, Any] | None, resume: dict[str, Any] | None) -> list[str]:
    """Where each group of rows comes from, and whether its benchmark ran in this invocation."""
    ran = results.get("companions") or {}

    def said(name: str, data: dict[str, Any] | None, script: str) -> str:
        if name in ran:
            how = "ran in this invocation" if ran[name] == "ran" else ran[name]
        elif (ROOT / "experiments" / script).exists():
            how = "not run in this invocation (`bench.py --no-companions`)"
        else:
            how = "not in this tree"
        when = (data or {}).get("measured_at")
        got = "absent" if data is None else f"measured {when}" if when else "present (no date in it)"
        return f"{how}; its results: {got}"

    return [
        "Single-run, peer and concurrency rows: `experiments/bench.py`, this run. "
        f"Fleet rows: `experiments/fleet_bench.py`, {said('fleet', fleet, 'fleet_bench.py')}. "
        f"Resume and replay rows: `experiments/resume_bench.py`, {said('resume', resume, 'resume_bench.py')}."
    ]


def _cpu(row: dict[str, Any]) -> str:
    """CPU time per step, with its user and kernel parts when measured: "360 (300 + 60)"."""
    text = _fmt(row.get("cpu_us_per_step"))
    if number(row.get("user_us_per_step")) is not None and number(row.get("sys_us_per_step")) is not None:
        text += f" ({row['user_us_per_step']:,.0f} + {row['sys_us_per_step']:,.0f})"
    return text


def _rel(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def single_section(results: dict[str, Any], images: dict[str, str]) -> list[str]:
    pages = results.get("wal_autocheckpoint_pages", 8000)
    lines = [
        "",
        "## One run of N steps",
        "",
        f"![µs per step]({images['single']})",
        "",
        "| N | rounds | floor µs/step | CPU (user + kernel) | effectlog µs/step | CPU (user + kernel) "
        "| effectlog ÷ floor | extra CPU µs/step "
        "| extra waiting µs/step | WAL pages per commit, floor / effectlog | checkpoints in the run | fsync µs "
        "| RAM disk µs/step, floor / effectlog |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted(results["single"], key=int):
        row = results["single"][n]
        f, e = row["floor"], row["effectlog"]
        ev = row.get("evidence") or {}
        wal = ckpt = "not measured"
        if "wal_frames_per_commit" in ev.get("effectlog", {}):
            wal = f"{ev['floor']['wal_frames_per_commit']:.1f} / {ev['effectlog']['wal_frames_per_commit']:.1f}"
            ckpt = f"{ev['floor']['checkpoints']} / {ev['effectlog']['checkpoints']}"
        fsyncs = row.get("fsync_us_rounds") or []
        ram = ev.get("ram") or {}
        in_ram = (
            f"{ram['floor']['us_per_step']:,.0f} / {ram['effectlog']['us_per_step']:,.0f}" if "floor" in ram
            else "not measured"
        )
        lines.append(
            f"| {int(n):,} | {row.get('rounds', len(f['samples']))} | {f['us_per_step']:,.0f} "
            f"| {_cpu(f)} | {e['us_per_step']:,.0f} | {_cpu(e)} "
            f"| {row['effectlog_over_floor']:.2f} | {_fmt(row.get('cpu_minus_floor_us'))} "
            f"| {_fmt(row.get('wait_minus_floor_us'))} | {wal} | {ckpt} "
            f"| {f'{min(fsyncs):,.0f} to {max(fsyncs):,.0f}' if fsyncs else 'not measured'} | {in_ram} |"
        )
    if "excess" in images:
        lines += ["", f"![excess over the floor]({images['excess']})"]
    if "ratio_vs_fsync" in images:
        lines += ["", f"![ratio against fsync time]({images['ratio_vs_fsync']})"]
    lines += [
        "",
        "The floor is raw `sqlite3` inserting a 200-byte row per commit (`BEGIN IMMEDIATE`, `INSERT`, "
        "`COMMIT`), two commits per step, nothing else, with the journal's PRAGMAs. effectlog's per-step figure "
        "is the time from the first step's confirmation to the last one's (N - 1 steps): a steady step, apart "
        "from the one-off costs below. *Extra CPU* is effectlog's CPU time per step minus the floor's, *extra "
        "waiting* the rest of the difference (wall minus CPU: syncs, and time descheduled), both medians of "
        "the rounds' differences. CPU is split into user space and kernel by `getrusage` (the kernel part "
        "is mostly the write and fsync calls). WAL pages per commit and checkpoints are counted in one more "
        "round per N, untimed, from the WAL index after every commit; the fsync column is the range of the per-round "
        "medians of a 4 KiB write + fsync probe taken just before each round's pair. The RAM-disk column is "
        "the same pair run in every round on tmpfs (`/dev/shm`), where a sync returns at once: what is left "
        "is each one's CPU work (and, on a shared machine, time descheduled).",
        "",
        "**The WAL's regime is the same for every N.** A new journal's WAL grows with every commit until the "
        "first checkpoint (each sync then also extends the file); after it, commits overwrite frames of a file "
        "that no longer grows. With fresh files, N = 100 and 1,000 ran wholly in the first regime and N = 10,000 "
        "mostly in the second, which is what made the old N = 10,000 point an outlier. Now, before each "
        "measured run (floor and effectlog alike), a filler table written on a second connection grows the WAL "
        f"to the checkpoint interval ({pages:,} pages), is dropped, and the WAL is checkpointed with `RESTART`: "
        "every run, whatever its N, appends from the start of an already-grown WAL, as a long-lived journal "
        "does in service, and the checkpoints a long run reaches happen inside it, as they would in service "
        "(counted in the table).",
        "",
        "### One-off costs, apart from the per-step figure",
        "",
        "| N | start-up ms | (CPU) | run start ms | (CPU) | closing ms | (CPU) | all-in µs/step | (CPU) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted(results["single"], key=int):
        one = results["single"][n]["effectlog"].get("one_off") or {}
        cells = [
            _fmt(one.get(k), ".1f")
            for k in ("startup_ms", "cpu_startup_ms", "run_start_ms", "cpu_run_start_ms", "closing_ms",
                      "cpu_closing_ms")
        ]
        cells += [_fmt(one.get("us_per_step_all_in")), _fmt(one.get("cpu_us_per_step_all_in"))]
        lines.append(f"| {int(n):,} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "*Start-up*: opening the journal (file, schema, ownership). *Run start*: from `run` to the first step's "
        "confirmation, less one steady step: the run's claim, the plan digested and pinned in `run.started`, "
        "its commit. *Closing*: from the last step's confirmation to the outcome: `run.completed` and the run's "
        "seal in one commit, and the outcome built. *All-in* divides the whole run, one-offs included, by N. "
        "The clocks are read from a crash hook that crashes nothing (set on the runtime, so no per-commit "
        "wrapper) at the first and last step's confirmation.",
    ]
    return lines


def peers_section(results: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "### Peers",
        "",
        "| system | N | µs/step | (CPU) | effectlog ÷ peer (steps/s) | rounds |",
        "|---|---:|---:|---:|---:|---|",
    ]
    notes = []
    for name in ("dbos", "langgraph"):
        for n, got in sorted(results["peers"][name].items(), key=lambda kv: int(kv[0])):
            if "error" in got:
                lines.append(f"| {name} | {int(n):,} | not measured | | | {got['error']} |")
                continue
            each = ", ".join(f"{x:.2f}" for x in got.get("effectlog_speedup_rounds", []))
            lines.append(
                f"| {got['library']} | {int(n):,} | {got['us_per_step']:,.0f} | {_fmt(got.get('cpu_us_per_step'))} "
                f"| {got['effectlog_speedup']:.2f} | {each} |"
            )
            notes.append(f"- {got['library']}, N={int(n):,}: SQLite {got['sqlite']}")
    syncs = results.get("syncs") or {}
    if syncs:
        lines += [
            "",
            "Durable syncs per step (fsync-family calls of the whole process, every thread, counted by strace "
            "in a child process: a run of 200 steps less a run of 20, so start-up cancels out; untimed):",
            "",
            "| system | syncs per step |",
            "|---|---:|",
            *[f"| {k} | {_fmt(v.get('syncs_per_step'), '.2f') if 'error' not in v else v['error']} |"
              for k, v in syncs.items()],
        ]
    lines += [
        "",
        *sorted(set(notes)),
        "",
        "DBOS runs a workflow of N `@DBOS.step` calls with its system database on SQLite (rollback journal); "
        "LangGraph runs N sequential nodes checkpointed by `SqliteSaver` with `durability=\"sync\"`, each in "
        "a child process (`experiments/bench_peers.py`). Start-up (imports, launch, graph compilation) is "
        "excluded for everyone; each does a short warm-up run first. Their WAL is not pre-grown: they manage "
        "their own files.",
    ]
    return lines


def concurrency_section(results: dict[str, Any], images: dict[str, str]) -> list[str]:
    lines = [
        "",
        "## Concurrent runs in one process (group commit)",
        "",
        f"![aggregate steps/s]({images['concurrency']})",
        "",
        "| K runs | steps per run | aggregate steps/s | CPU µs per step | ÷ one run | rounds | commits |",
        "|---:|---:|---:|---:|---:|---|---:|",
    ]
    for k in sorted(results["concurrent"], key=int):
        row = results["concurrent"][k]
        each = ", ".join(f"{x:.1f}" for x in row.get("over_one_run_rounds", []))
        lines.append(
            f"| {k} | {row['steps_per_run']} | {row['steps_per_s']:,.0f} | {_fmt(row.get('cpu_us_per_step'))} "
            f"| {row['over_one_run']:.1f} | {each} | {row['commits']:,} |"
        )
    lines += [
        "",
        "Runs started together hand their batches to one journal writer; while one commit is in flight "
        "the next batches queue and go out together. Each run still waits for its own batch to be "
        "durable before it calls its tool or moves on (`tests/test_group_commit.py` checks this from a "
        "second connection while commits are shared). The WAL is pre-grown as for single runs. CPU time per "
        "step includes the writer's thread; 1 s divided by it is what one process could reach if the disk "
        "cost nothing.",
    ]
    return lines


def resume_section(results: dict[str, Any], images: dict[str, str], resume: dict[str, Any] | None) -> list[str]:
    lines = ["", "## Resume", ""]
    if "resume" in images:
        lines += [f"![resume]({images['resume']})", ""]
    lines += ["### Measured by `experiments/resume_bench.py`", ""]
    if resume is None:
        lines.append("Not measured: `experiments/results/resume.json` is absent (no `experiments/resume_bench.py` "
                     "in this tree, or it has not been run).")
    else:
        lines += ["| figure | value |", "|---|---:|"]
        for k, v in sorted((_get(resume, "resume_cpu_ms") or {}).items(), key=lambda kv: int(kv[0])):
            lines.append(f"| resume to next effect, {int(k):,} events, ms CPU | {_fmt(v, '.1f')} |")
        for k, v in sorted((_get(resume, "sealed_rerun_cpu_ms") or {}).items(), key=lambda kv: int(kv[0])):
            lines.append(f"| re-run of a sealed {int(k):,}-step run, ms CPU | {_fmt(v, '.1f')} |")
        lines.append(f"| full replay + verify, µs per event CPU | "
                     f"{_fmt(_get(resume, 'replay_verify_us_per_event_cpu'), '.2f')} |")
        for k in ("with", "without"):
            lines.append(f"| single-run step {k} open-run checkpoints, µs | "
                         f"{_fmt(_get(resume, 'checkpoint_per_step_us', k), '.1f')} |")
    lines += [
        "",
        "### Measured by `experiments/bench.py`",
        "",
        "| confirmed steps | events | replay + verify µs/event | (CPU) | replay ms | resume to next effect ms "
        "| (CPU) | finished: re-run ms | (CPU) | finished: full replay ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in results["resume"]:
        lines.append(
            f"| {x['confirmed_steps']:,} | {x['half_events']:,} | {x['half_fold_us_per_event']:.2f} "
            f"| {x['half_fold_cpu_us_per_event']:.2f} | {x['half_fold_ms']:,.1f} "
            f"| {x['half_resume_to_next_effect_ms']:,.1f} | {_fmt(x.get('half_resume_to_next_effect_cpu_ms'), ',.1f')} "
            f"| {x['finished_rerun_ms']:,.1f} | {_fmt(x.get('finished_rerun_cpu_ms'), ',.1f')} "
            f"| {x['finished_full_replay_ms']:,.1f} |"
        )
    lines += [
        "",
        "A half-finished run has N confirmed steps of a 2N-step plan; resuming it loads its state, records "
        "`run.resumed`, and makes the next step's `step.requested` durable: the time to its next effect "
        "(two commits with `synchronous=FULL`, so its wall clock includes two syncs; its CPU time does not). "
        "A finished run is closed for good: its closing event was written with a *seal*, so a re-run reads "
        "the seal instead of replaying. Histories are built with `synchronous=NORMAL` to save time; resuming "
        "reads them with the default `FULL`.",
    ]
    return lines


def footprint_section(results: dict[str, Any]) -> list[str]:
    fp = results.get("footprint", {})
    lines = ["", f"## Footprint of a {fp.get('events', 100_000):,}-event run", ""]
    if "error" in fp or not fp:
        return [*lines, f"Not measured: {fp.get('error', 'absent')}"]
    tables = ", ".join(f"{name} {size / fp['events']:.0f} B" for name, size in sorted(fp["tables_bytes"].items()))
    return [
        *lines,
        f"- {fp['steps']:,} no-op steps, {fp['events']:,} events, journal file {fp['file_bytes'] / 2**20:.1f} "
        f"MiB: **{fp['bytes_per_event']:.0f} bytes per event** (event bodies alone "
        f"{fp['body_bytes_per_event']:.0f} bytes; per event by table and index: {tables}). The run's "
        "`run.started` pins the whole plan, which is part of that average.",
        f"- Peak RSS of the process running it (a child process): **{fp['peak_rss_mb_run']:.0f} MB**; "
        f"after also replaying the whole run: {fp['peak_rss_mb_with_full_replay']:.0f} MB.",
        "- Written with `synchronous=NORMAL` to keep the benchmark short; the bytes on disk and the "
        "memory do not depend on it.",
    ]


def fleet_table(fleet: dict[str, Any] | None) -> list[str]:
    """fleet.json's figures by backend and process count, the columns it has."""
    lines = ["## Runner fleet: claims and runs per second", ""]
    if fleet is None:
        return [*lines, "Not measured: `experiments/results/fleet.json` is absent."]
    columns = [("claims_per_s", "claims/s", ",.0f"), ("attempts_per_claim", "attempts per claim", ".2f"),
               ("runs_per_s", "runs/s", ",.1f"), ("statements_per_run", "statements per run", ".1f"),
               ("commits_per_run", "commits per run", ".1f"), ("cpu_ms_per_run", "CPU ms per run", ".1f")]
    have = [c for c in columns if any(fleet_figures(fleet, b, c[0]) for b in ("sqlite", "postgres"))]
    lines += [
        f"From `experiments/results/fleet.json` (measured {fleet.get('measured_at', 'at an unknown time')}).",
        "",
        "| backend | runner processes | " + " | ".join(label for _, label, _ in have) + " |",
        "|---|---:|" + "---:|" * len(have),
    ]
    for backend in ("sqlite", "postgres"):
        counts = sorted({c for key, _, _ in have for c in fleet_figures(fleet, backend, key)})
        for count in counts:
            cells = [_fmt(fleet_figures(fleet, backend, key).get(count), spec) for key, _, spec in have]
            lines.append(f"| {backend} | {count} | " + " | ".join(cells) + " |")
    return lines


def fleet_section(fleet_doc: Path) -> list[str]:
    """How to read the fleet's numbers, as experiments/fleet_bench.py last wrote them into docs/fleet.md."""
    text = fleet_doc.read_text() if fleet_doc.exists() else ""
    start, end = "<!-- fleet-bench:start -->", "<!-- fleet-bench:end -->"
    body = text.split(start, 1)[1].split(end, 1)[0].strip() if start in text and end in text else ""
    return [
        "### As `experiments/fleet_bench.py` reported them",
        "",
        body or "Not measured yet: run `python experiments/fleet_bench.py`.",
        "",
        "How to read them is in [fleet.md](fleet.md#numbers).",
    ]
