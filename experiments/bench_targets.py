"""The targets of issue 18 (and issue 7's still tracked), evaluated from one ``make bench``: pure
functions of the results, nothing here measures or writes (``bench_report.py`` draws and writes).

Three result files feed the targets: ``bench.json`` (``bench.py``: single runs, peers,
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
# Why claims/s may fall with processes, when fleet.json gives no reason of its own.
_CLAIMS_WHY = {
    "postgres": ".",
    "sqlite": (
        ". A claim is one write transaction through the file's one writer, bound by its WAL fsync, so N "
        "processes can at best match 1; each process's page cache is stale after another's commit, so CPU per "
        "claim grows with N. A blocking gate was tried and not kept (see the SQLite claims row in "
        "[fleet.md](fleet.md#numbers))."
    ),
}
FLAT_MAX = 2.0  # "flat in history": the largest history costs at most this many times the smallest
# Earlier targets (issue 7), still tracked.
FOLD_MAX_US = 10.0
BYTES_MAX = 400.0
RSS_MAX_MB = 150.0


def dig(results: Any, *path: str) -> Any:
    """``results[path[0]][path[1]]...``, or None where a key is missing."""
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
        worst = max(
            (r for r in data["replay"] if isinstance(r, dict) and number(r.get("verify_us_per_event"))),
            key=lambda r: r["verify_us_per_event"],
        )
        parts = {k: v for k, v in worst.items() if k.endswith("_us_per_event") and k != "verify_us_per_event"}
        if parts:
            out["replay_parts_us_per_event"] = {"events": worst.get("events"), **parts}
    with_, without = (dig(data, "per_step", f"{k}_checkpoints", "cpu_us_per_step") for k in ("with", "without"))
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
        status = f"missed by {gap:.0%}" if gap >= 0.005 else "missed by less than 1%"
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
            peer = dig(results, "peers", name, n)
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
        row = dig(results, "single", n) or {}
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
    sizes = [dig(results, "single", n) for n in SIZES]
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
        peer = dig(results, "peers", name, "1000") or {}
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
    k32 = dig(results, "concurrent", "32") or {}
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
    by_count = dig(fleet, "results", backend) or {}
    out = {}
    for count, row in by_count.items():
        value = number(dig(row, key))
        if str(count).isdigit() and value is not None:
            out[int(count)] = value
    return dict(sorted(out.items()))


def claims_vs_one(
    fleet: dict[str, Any] | None, backend: str, claims: dict[int, float]
) -> tuple[float | None, list[float] | None]:
    """The most processes' claims/s against 1 process's, and the rounds behind it.

    fleet.json from interleaved rounds has, per count, ``claims_vs_1``: the median of the
    per-round ratios (each round measured 1 and N processes back to back) and the rounds'
    ratios in ``claims_vs_1_rounds``; the ratio of the two medians would turn drift of the
    machine between measurements into the ratio. Older fleet.json (no rounds): the ratio
    of the medians, no rounds.
    """
    if 1 not in claims or len(claims) < 2:
        return None, None
    top = max(claims)
    median = number(dig(fleet, "results", backend, str(top), "claims_vs_1"))
    if median is None:
        return claims[top] / claims[1], None
    rounds = dig(fleet, "results", backend, str(top), "claims_vs_1_rounds")
    each = [v for v in (number(x) for x in rounds) if v is not None] if isinstance(rounds, list) else []
    return median, each or None


def fleet_targets(fleet: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The fleet rows, read from fleet.json as ``experiments/fleet_bench.py`` wrote it."""
    source = "experiments/results/fleet.json"
    absent = f"not measured ({source} absent)" if fleet is None else "not measured"
    rows = []

    def why(key: str, default: str) -> str:
        given = dig(fleet, "why", key)
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
        ratio, each = claims_vs_one(fleet, backend, claims)
        rows.append(
            evaluate(
                f"{label} fleet claims/s at {max(claims) if claims else 8} processes not below 1 process",
                ratio,
                1.0,
                at_most=False,
                unit="x of 1 process",
                each=each,
                absent=absent,
                why=why(
                    f"{backend}_claims_scaling", f"claims/s by processes: {_series(claims)}" + _CLAIMS_WHY[backend]
                ),
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
            got["measured"] += f" at {best} process{'es' if best > 1 else ''}"
        rows.append(got)
    for key, label, limit in (
        ("statements_per_run", "statements", STATEMENTS_MAX),
        ("commits_per_run", "commits", COMMITS_MAX),
    ):
        figures = fleet_figures(fleet, "postgres", key)
        worst = max(figures.values()) if figures else None
        rows.append(
            evaluate(
                f"PostgreSQL {label} per fleet run <= {limit:.0f} (worst process count)",
                worst,
                limit,
                at_most=True,
                spec=".2f",
                absent=absent,
                why=why(key, f"{label} per run by processes: {_series(figures, '.2f')}."),
            )
        )
    idle = {b: dig(fleet, "idle_wait", b) or dig(fleet, "results", b, "idle_wait") for b in ("postgres", "sqlite")}
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
        given = dig(resume, "why", key)
        return given if isinstance(given, str) and given else default

    def context(text: str) -> str:
        return f"{absent}; bench.py's own figure: {text}" if resume is None and text else absent

    resume_cpu = dig(resume, "resume_cpu_ms") or {}
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
            why=why("resume", f"by history: {shown}: it still grows with the history."),
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
    rerun = dig(resume, "sealed_rerun_cpu_ms") or {}
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
            why=why("sealed_rerun", f"by size: {flatness(rerun)[1]}: it grows with the number of steps."),
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
            why=why(
                "sealed_rerun_flat",
                f"by size: {shown}. The re-run inflates only the seal's run-level stream and leaves its rows "
                "compressed in the outcome (`StepRows`, built when read); what still grows with the steps is "
                "reading the seal's blob and hashing it against the chain head (~0.1 ms at 33k steps), so a "
                "miss here is the fixed part of a re-run (event loop, claim, adapters) varying between sizes "
                "on a shared machine.",
            ),
        )
    )
    own_fold = max((x["finished_fold_cpu_us_per_event"] for x in results.get("resume", [])), default=None)
    rows.append(
        evaluate(
            f"full replay + verify <= {REPLAY_CPU_MAX_US:.0f} µs per event, CPU",
            dig(resume, "replay_verify_us_per_event_cpu"),
            REPLAY_CPU_MAX_US,
            at_most=True,
            unit=" µs",
            absent=context(f"{own_fold:.2f} µs CPU (worst size)" if own_fold is not None else ""),
            why=why("replay", replay_parts(resume)),
        )
    )
    return rows


def replay_parts(resume: dict[str, Any] | None) -> str:
    """Where replay time goes, as resume_bench.py measured it at the worst size (when it says)."""
    parts = dig(resume, "replay_parts_us_per_event") or {}
    shown = [
        f"{k.removesuffix('_us_per_event').replace('_', ' ')} {v:.2f} µs"
        for k, v in parts.items()
        if k != "events" and number(v) is not None
    ]
    if not shown:
        return "see docs/architecture.md."
    read = number(parts.get("read_us_per_event"))
    fold = number(parts.get("replay_only_fold_us_per_event")) or number(parts.get("pure_fold_us_per_event"))
    tail = ""
    if read is not None and fold is not None and read + fold >= REPLAY_CPU_MAX_US:
        tail = (
            f" The read and the fold alone come to {read + fold:.2f} µs, before the hash, the decode and the checks "
            "of the segments and the seal (about 2 µs more): each is already one pass over the rows in Python. "
            "Counted by valgrind this round (experiments/verify_costs.py, by hand, 2026-12-01), verify is 48.3k "
            "instructions per event at 100k events, 8.35k of them the segments' and the seal's checks (decode, "
            "inflate, comparisons: per step carried, not per segment); CPython 3.11's sqlite3 re-takes the GIL "
            "for each column of each row (about 45 ns a column), the hash and the decode are one C call each per "
            "event with nothing around them to cut, and a compiled fold (mypyc) saved 2.7% of verify's "
            "instructions: what is left is C work on Python objects per event, which only a read that builds no "
            "Python object per event (a C extension) or fewer columns and bytes per event (another stored format) "
            "would cut (docs/architecture.md, replay, round 7). At 1k and 10k events verify measured under 4 µs "
            "in the same round of measurements; the cost per event grows with the state a replay keeps."
        )
    return f"at {parts.get('events') or 0:,} events, per event: " + ", ".join(shown) + " (resume_bench.py)." + tail


def earlier_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 7's targets that issue 18 did not restate, measured by bench.py."""
    rows = []
    if results.get("resume"):
        worst = max(
            max(x["half_fold_cpu_us_per_event"], x["finished_fold_cpu_us_per_event"]) for x in results["resume"]
        )
        rows.append(
            evaluate(
                f"fold and verify <= {FOLD_MAX_US:.0f} µs per event, CPU (worst size)",
                worst,
                FOLD_MAX_US,
                at_most=True,
                unit=" µs",
                why="replay reads, re-hashes, decodes and folds each event in Python.",
            )
        )
        big = results["resume"][-1]
        closed = big["finished_rerun_ms"] < big["finished_full_replay_ms"]
        rows.append(
            {
                "target": "re-running a closed run does not fold its history",
                "measured": f"{big['finished_rerun_ms']:.1f} ms vs {big['finished_full_replay_ms']:.0f} ms "
                f"for a full replay ({big['finished_events']:,} events)",
                "met": closed,
                "status": "met" if closed else "missed",
                "why": "",
            }
        )
    fp = results.get("footprint", {})
    rows.append(
        evaluate(
            f"<= {BYTES_MAX:.0f} journal bytes per event",
            fp.get("bytes_per_event"),
            BYTES_MAX,
            at_most=True,
            unit=" B",
            spec=".0f",
            why=_bytes_why(fp),
        )
    )
    rows.append(
        evaluate(
            f"peak RSS < {RSS_MAX_MB:.0f} MB for a {fp.get('events', 100_000):,}-event run",
            fp.get("peak_rss_mb_run"),
            RSS_MAX_MB,
            at_most=True,
            unit=" MB",
            spec=".0f",
            why="the run keeps its plan and every step's state in memory.",
        )
    )
    return rows


def _bytes_why(fp: dict[str, Any]) -> str:
    """Why the journal holds more bytes per event than the target, by table (the footprint's dbstat split)."""
    why = "each event row holds its canonical JSON, its chain hash and a dedup index entry."
    tables, events = fp.get("tables_bytes") or {}, fp.get("events") or 0
    segments = tables.get("checkpoints", 0) / events if events else 0.0
    if segments:
        why += (
            f" The open-run checkpoint segments add {segments:.0f} B per event "
            f"({fp['bytes_per_event'] - segments:.0f} B without them): each step's state is written once more, in the "
            "segment of the window it changed in (zlib-compressed: a resume inflates only the last one), "
            "so a resume need not replay the events."
        )
    return why


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


def _series(figures: dict[int, float], spec: str = ",.0f") -> str:
    return ", ".join(f"{k}: {v:{spec}}" for k, v in figures.items()) or "not measured"


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
    text += why_ram(ev.get("ram") or {}, allowed)
    fsyncs = row.get("fsync_us_rounds") or []
    if fsyncs:
        text += (
            f" A 4 KiB write + fsync took {min(fsyncs):,.0f} to {max(fsyncs):,.0f} µs (median per round) in "
            "this N's rounds."
        )
    text += by_disk(results)
    return text


def why_ram(ram: dict[str, Any], allowed: float) -> str:
    """The RAM-disk pair (and effectlog's rows through raw sqlite3) in CPU per step: what is left
    without the disk, split into SQLite's work for effectlog's rows and the Python around it."""
    if "floor" not in ram or "effectlog" not in ram:
        return ""
    if "effectlog_minus_floor_cpu_us" not in ram:  # an older bench.json: one wall-clock pair after the rounds
        rf, re_ = ram["floor"]["us_per_step"], ram["effectlog"]["us_per_step"]
        return (
            f" The same pair on a RAM disk once, after the rounds (a sync returns at once): floor {rf:,.0f} µs per "
            f"step, effectlog {re_:,.0f}: without the disk effectlog's own work costs {re_ - rf:,.0f} µs per step "
            f"more ({(re_ - rf) / allowed:.1f}x the {allowed:,.0f} µs the target allows here)."
        )
    more = ram["effectlog_minus_floor_cpu_us"]
    text = (
        f" On a RAM disk in the same rounds (a sync returns at once), CPU per step: floor "
        f"{ram['floor']['cpu_us_per_step']:,.0f} µs, effectlog {ram['effectlog']['cpu_us_per_step']:,.0f} µs: "
        f"without the disk effectlog's own work costs {more:,.0f} µs per step more ({more / allowed:.1f}x the "
        f"{allowed:,.0f} µs the target allows here)."
    )
    if "rows_minus_floor_cpu_us" in ram:
        rows = ram["rows_minus_floor_cpu_us"]
        text += (
            f" Of that, effectlog's rows written by raw sqlite3 (its table, unique index and commits, no Python "
            f"around them) cost {rows:,.0f} µs more than the floor's: SQLite's share; the other {more - rows:,.0f} "
            "µs is effectlog's Python (events built, checked by the fold, encoded, hashed; the write gate)."
        )
    return text


SLOW_SYNC_US = 500.0  # a round whose fsync probe took longer than this ran on a busy disk


def by_disk(results: dict[str, Any]) -> str:
    """The rounds' ratios split by how fast the disk synced in that round, over every N.

    A slow sync lengthens both sides of the ratio by the same amount and pulls it towards 1; a
    fast one leaves effectlog's own work exposed. Empty when the rounds do not cover both kinds.
    """
    quick, slow = [], []
    for row in results["single"].values():
        for fsync, ratio in zip(
            row.get("fsync_us_rounds") or [], row.get("effectlog_over_floor_rounds") or [], strict=False
        ):
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
    peer = dig(results, "peers", name, "1000") or {}
    mine = dig(results, "single", "1000", "effectlog") or {}
    text = (
        "effectlog makes two durable commits per step (intent before the effect, result before advancing) "
        "and keeps them."
    )
    theirs, ours = dig(results, "syncs", name, "syncs_per_step"), dig(results, "syncs", "effectlog", "syncs_per_step")
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
    fsyncs = dig(results, "single", "1000", "fsync_us_rounds") or []
    if fsyncs:
        text += (
            f" In these rounds a 4 KiB write + fsync took {min(fsyncs):,.0f} to {max(fsyncs):,.0f} µs, and the "
            f"floor itself took {dig(results, 'single', '1000', 'floor', 'us_per_step'):,.0f} µs per step."
        )
    return text


def why_group(results: dict[str, Any]) -> str:
    one_run, k32 = dig(results, "concurrent", "1") or {}, dig(results, "concurrent", "32") or {}
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
        counted = results.get("instructions") or {}
        if number(counted.get("runs_32")) and number(counted.get("one_run")):
            text += (
                f" Counted by valgrind in this run: {counted['runs_32'] / 1e3:,.1f}k user-space instructions per "
                f'step at 32 runs and {counted["one_run"] / 1e3:,.1f}k for one run (section "Instructions per '
                "step\"); the group shares commits, so what it saves is SQLite's per-commit work and one run's "
                "waiting, not the per-event Python (events built, checked, encoded, hashed)."
            )
        allowed = 1e6 / one_run["steps_per_s"] / 5
        text += (
            " A faster sync makes one run faster and so the group's ratio to it smaller. A second process on the "
            "same journal does not help: their commits take turns at the file's one writer (2 processes x 16 runs "
            "measured 4,600 to 6,000 steps/s against 6,300 to 6,500 for one process, by hand in round 2). "
            f"Reaching 5x needs the group's CPU per step below a fifth of one run's wall time per step (here "
            f"{allowed:,.0f} µs against {k32['cpu_us_per_step']:,.0f}), or a commit's sync overlapped with other "
            "runs' work, which changes when events commit."
        )
    return text
