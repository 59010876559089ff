"""Plots and ``docs/performance.md`` from one ``make bench`` (nothing here measures or judges a target:
``bench_targets.py`` does)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench_targets import (
    GROUP_MIN,
    OVERHEAD_MAX,
    RESUME_CPU_MAX_MS,
    ROOT,
    dig,
    earlier_targets,
    fleet_figures,
    number,
    targets,
)

# -- plots ------------------------------------------------------------------------------------------


def write_plots(results: dict[str, Any], img: Path, resume: dict[str, Any] | None = None) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img.mkdir(parents=True, exist_ok=True)
    images: dict[str, str] = {}

    # single runs: wall and CPU per step for every system at every size
    sizes = sorted(results["single"], key=int)
    systems = [
        ("floor", "SQLite floor (2 commits)"),
        ("effectlog", "effectlog"),
        ("dbos", "DBOS (SQLite)"),
        ("langgraph", "LangGraph SqliteSaver, sync"),
    ]
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    width = 0.2
    for i, (key, label) in enumerate(systems):
        xs, walls, cpus = [], [], []
        for j, n in enumerate(sizes):
            row = dig(results, "single", n, key) or dig(results, "peers", key, n) or {}
            if number(row.get("us_per_step")):
                xs.append(j + (i - 1.5) * width)
                walls.append(row["us_per_step"])
                cpus.append(row.get("cpu_us_per_step", 0.0))
        bars = ax.bar(xs, walls, width, label=f"{label}: wall")
        ax.bar(xs, cpus, width * 0.5, color="black", alpha=0.55, label="CPU time of the process" if i == 0 else None)
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
    ax.hlines(
        allowed,
        [x - 0.3 for x in xs],
        [x + 0.3 for x in xs],
        colors="black",
        linewidth=2,
        label=f"allowed by {OVERHEAD_MAX}x the floor",
    )
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
        pairs = list(zip(row.get("fsync_us_rounds") or [], row.get("effectlog_over_floor_rounds") or [], strict=False))
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
    cpu_ceiling = [
        1e6 / results["concurrent"][k]["cpu_us_per_step"] for k in ks if results["concurrent"][k].get("cpu_us_per_step")
    ]
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
            ax.plot(
                ev,
                [x["half_resume_to_next_effect_cpu_ms"] for x in rows],
                "s-",
                label="half-finished: to next effect (CPU)",
            )
        ax.plot(
            [x["finished_events"] for x in rows],
            [x["finished_full_replay_ms"] for x in rows],
            "^--",
            label="finished: a full replay would take (wall)",
        )
        if all("finished_rerun_cpu_ms" in x for x in rows):
            ax.plot(
                [x["finished_events"] for x in rows],
                [x["finished_rerun_cpu_ms"] for x in rows],
                "v-",
                label="finished: re-run from its seal (CPU)",
            )
        theirs = sorted((int(k), v) for k, v in (dig(resume, "resume_cpu_ms") or {}).items() if number(v))
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
        f"Measured {m['date']} on {m['cores']} cores{f' ({cpu})' if (cpu := m.get('cpu')) else ''}, "
        f"Python {m['python']}, SQLite {m['sqlite']}"
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
    earlier_missed = [row for row in earlier if row["met"] is False]
    if earlier_missed:
        lines.append("")
    lines += [f"- **{row['target']}** ({row['status']}): {row['why']}" for row in earlier_missed]
    lines += single_section(results, images)
    lines += peers_section(results)
    lines += concurrency_section(results, images)
    lines += instructions_section(results)
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
        "| RAM disk, CPU µs/step: floor / effectlog's rows / effectlog |",
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
        in_ram = "not measured"
        if "floor" in ram and "effectlog" in ram:
            in_ram = " / ".join(_fmt(dig(ram, k, "cpu_us_per_step")) for k in ("floor", "rows", "effectlog"))
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
        "the same pair run in every round on tmpfs (`/dev/shm`), where a sync returns at once, in CPU time; "
        "between them, *effectlog's rows*: effectlog's events table (its schema, unique index and triggers) "
        "and commits (one row, then two) written by raw `sqlite3` with event-sized bodies, no Python around "
        "them: SQLite's share of effectlog's cost.",
        "",
        "**The WAL's regime is the same for every N.** A new journal's WAL grows with every commit until the "
        "first checkpoint (each sync then also extends the file); after it, commits overwrite frames of a file "
        "that no longer grows. With fresh files, N = 100 and 1,000 ran wholly in the first regime and N = 10,000 "
        "mostly in the second, which is what made the old N = 10,000 point an outlier. Now, before each "
        "measured run (floor and effectlog alike), a filler table written on a second connection grows the WAL "
        f"to the checkpoint interval ({pages:,} pages), is dropped, and the WAL is checkpointed with `RESTART`: "
        "every run, whatever its N, appends from the start of an already-grown WAL, as a long-lived journal "
        "does in service, and the checkpoints a long run reaches happen inside it, as they would in service "
        "(counted in the table). The pages a run allocates then come from the freelist the filler left, which "
        "adds a freelist page to an occasional commit, on both sides alike.",
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
            for k in (
                "startup_ms",
                "cpu_startup_ms",
                "run_start_ms",
                "cpu_run_start_ms",
                "closing_ms",
                "cpu_closing_ms",
            )
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
            *[
                f"| {k} | {_fmt(v.get('syncs_per_step'), '.2f') if 'error' not in v else v['error']} |"
                for k, v in syncs.items()
            ],
        ]
    lines += [
        "",
        *sorted(set(notes)),
        "",
        "DBOS runs a workflow of N `@DBOS.step` calls with its system database on SQLite (rollback journal); "
        'LangGraph runs N sequential nodes checkpointed by `SqliteSaver` with `durability="sync"`, each in '
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


def instructions_section(results: dict[str, Any]) -> list[str]:
    """Instructions per step counted by valgrind, and what one of them cost in CPU time on this machine."""
    counted = results.get("instructions") or {"error": "not counted (no figure in this run's JSON)"}
    lines = ["", "## Instructions per step (counted, not timed)", ""]
    if "error" in counted:
        return [*lines, f"Not measured in this run: {counted['error']}."]
    user = number(dig(results, "single", "1000", "evidence", "ram", "effectlog", "user_us_per_step"))
    speed = ""
    if user:
        speed = (
            f" On this run's machine one run's step spent {user:,.0f} µs of user-space CPU on a RAM disk "
            f"(N=1,000): about {counted['one_run'] / user:,.0f} of these instructions per µs, the figure to "
            "compare machines by, since every CPU time above scales with it."
        )
    return [
        *lines,
        "| runs in one process | user-space instructions per steady step |",
        "|---:|---:|",
        f"| 1 | {counted['one_run'] / 1e3:,.1f}k |",
        f"| 32 | {counted['runs_32'] / 1e3:,.1f}k |",
        "",
        "`experiments/instructions_per_step.py` under `valgrind --tool=callgrind`: two runs of different length "
        "on /dev/shm, the difference divided by the extra steps (Python, SQLite, msgspec, OpenSSL; the kernel "
        "excluded; the cyclic GC off). The count moves about 1% between runs and not with the machine's load "
        f"or speed, so it compares versions measured on different machines.{speed}",
    ]


def resume_section(results: dict[str, Any], images: dict[str, str], resume: dict[str, Any] | None) -> list[str]:
    lines = ["", "## Resume", ""]
    if "resume" in images:
        lines += [f"![resume]({images['resume']})", ""]
    lines += ["### Measured by `experiments/resume_bench.py`", ""]
    if resume is None:
        lines.append(
            "Not measured: `experiments/results/resume.json` is absent (no `experiments/resume_bench.py` "
            "in this tree, or it has not been run)."
        )
    else:
        lines += ["| figure | value |", "|---|---:|"]
        for k, v in sorted((dig(resume, "resume_cpu_ms") or {}).items(), key=lambda kv: int(kv[0])):
            lines.append(f"| resume to next effect, {int(k):,} events, ms CPU | {_fmt(v, '.1f')} |")
        for k, v in sorted((dig(resume, "sealed_rerun_cpu_ms") or {}).items(), key=lambda kv: int(kv[0])):
            lines.append(f"| re-run of a sealed {int(k):,}-step run, ms CPU | {_fmt(v, '.1f')} |")
        lines.append(
            f"| full replay + verify, µs per event CPU | {_fmt(dig(resume, 'replay_verify_us_per_event_cpu'), '.2f')} |"
        )
        for k in ("with", "without"):
            lines.append(
                f"| single-run step {k} open-run checkpoints, µs | "
                f"{_fmt(dig(resume, 'checkpoint_per_step_us', k), '.1f')} |"
            )
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
    columns = [
        ("claims_per_s", "claims/s", ",.0f"),
        ("claims_vs_1", "claims/s vs 1 process (median of rounds)", ".2f"),
        ("claim_cpu_us", "claimer CPU µs per claim", ",.0f"),
        ("server_claim_cpu_us", "server CPU µs per claim", ",.0f"),
        ("attempts_per_claim", "attempts per claim", ".2f"),
        ("runs_per_s", "runs/s", ",.1f"),
        ("statements_per_run", "statements per run", ".1f"),
        ("commits_per_run", "commits per run", ".1f"),
        ("cpu_ms_per_run", "CPU ms per run", ".1f"),
    ]
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
