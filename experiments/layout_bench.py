"""The SQLite journal's row layout: candidate layouts of the events table side by side (issue 18).

    PYTHONPATH=src .venv/bin/python experiments/layout_bench.py [--quick] [--no-valgrind]

Raw ``sqlite3`` only (no effectlog Python around the rows), with the journal's PRAGMAs (WAL,
``synchronous=FULL``, its checkpoint interval, 4 KiB pages) on ``/dev/shm`` (a sync returns at
once: what is measured is SQLite's CPU and the pages it writes, not the disk). Rows have the sizes
of a no-op run's events (``step.requested`` 277 bytes, ``step.effected`` 160, ``step.confirmed`` 96,
a 32-byte hash), written as effectlog writes them: ``BEGIN IMMEDIATE``, one ``INSERT`` per row with
body and hash bound as ``bytearray``, ``COMMIT``. Two commit shapes:

- *one run*: a step's ``step.requested`` (one row), then its ``step.effected`` + ``step.confirmed``
  (two rows), two commits per step, as a lone run commits;
- *32 runs*: the group commit of 32 concurrent runs: every run's ``step.requested`` in one commit,
  then every run's ``step.effected`` + ``step.confirmed`` in the next (32, then 64 rows).

For each layout: WAL pages per commit, split by b-tree (from the WAL's frame headers, the
checkpoint held off for that round, pages mapped to b-trees by ``dbstat``); CPU µs per event
(``process_time``, median of interleaved rounds); instructions per event (valgrind, the
difference of two run lengths, so start-up and the first commits cancel); journal bytes per
event for one run of 33,333 steps (100,001 events, a 3.4 MB ``run.started`` as a real run's plan)
with the rest of a real journal (seals, checkpoints, owners: measured in ``bench.json``'s
footprint) added; and the read-back of one run's rows in seq order as replay reads them (pages
of 2,000 rows, a new connection per read: SQLite's cache cold, the OS's warm) at 100k events, in
a one-run journal and in one of 32 interleaved runs.

Results go to ``experiments/results/layout.json``; the table is printed (docs/architecture.md,
"The journal's row layout").
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "layout.json"
WAL_AUTOCHECKPOINT_PAGES = 8000  # the journal's (sqlite_schema.WAL_AUTOCHECKPOINT_PAGES)
READ_PAGE_ROWS = 2000
# A real 33,333-step journal's bytes besides the events table and its index (bench.json footprint:
# checkpoints 1,703,936, seals 90,112, meta, owners and their indexes, the schema): the same for every layout.
OTHER_BYTES = 38_916_096 - 32_239_616 - 4_857_856
PHASES = (("step.requested", 277), ("step.effected", 160), ("step.confirmed", 96))
HASH = bytearray(32)
TRIGGERS = (
    """CREATE TRIGGER events_append_only_update BEFORE UPDATE ON events
       BEGIN SELECT RAISE(ABORT, 'effectlog: events are append-only'); END""",
    """CREATE TRIGGER events_append_only_delete BEFORE DELETE ON events
       BEGIN SELECT RAISE(ABORT, 'effectlog: events are append-only'); END""",
)
RUNS_DDL = "CREATE TABLE runs (run INTEGER PRIMARY KEY, run_id TEXT NOT NULL UNIQUE)"
COLUMNS = "step_id TEXT NOT NULL, phase TEXT NOT NULL, attempt INTEGER NOT NULL, body BLOB NOT NULL, hash BLOB NOT NULL"
READ_COLUMNS = "seq, body, hash, step_id, phase, attempt"


@dataclass(frozen=True)
class Layout:
    name: str
    what: str
    ddl: tuple[str, ...]
    insert: str  # parameters: (run key, seq, step_id, phase, attempt, body, hash)
    read: str  # parameters: (run key, after seq, limit): READ_PAGE's rows
    interned: bool = False  # the run key is a small integer from the runs table
    composite: bool = False  # the rowid is run << 32 | seq
    text_too: bool = False  # the rows keep the run id's text as well (reads filter on it)
    trees: dict[str, str] = field(default_factory=dict)  # b-tree name prefix -> short label


LAYOUTS = (
    Layout(
        "a",
        "current: WITHOUT ROWID, key (run_id, seq); unique (run_id, step_id, phase, attempt)",
        (
            f"""CREATE TABLE events (run_id TEXT NOT NULL, seq INTEGER NOT NULL CHECK (seq > 0), {COLUMNS},
                PRIMARY KEY (run_id, seq), UNIQUE (run_id, step_id, phase, attempt)) WITHOUT ROWID""",
        ),
        "INSERT INTO events (run_id, seq, step_id, phase, attempt, body, hash) VALUES (?, ?, ?, ?, ?, ?, ?)",
        f"SELECT {READ_COLUMNS} FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
    ),
    Layout(
        "b",
        "rowid in append order; unique (run_id, seq); unique (run_id, step_id, phase, attempt)",
        (
            f"""CREATE TABLE events (id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, seq INTEGER NOT NULL
                CHECK (seq > 0), {COLUMNS}, UNIQUE (run_id, seq), UNIQUE (run_id, step_id, phase, attempt))""",
        ),
        "INSERT INTO events (run_id, seq, step_id, phase, attempt, body, hash) VALUES (?, ?, ?, ?, ?, ?, ?)",
        f"SELECT {READ_COLUMNS} FROM events WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
    ),
    Layout(
        "c",
        "(b) with run ids interned (runs table): unique (run, seq); unique (run, step_id, phase, attempt)",
        (
            RUNS_DDL,
            f"""CREATE TABLE events (id INTEGER PRIMARY KEY, run INTEGER NOT NULL, seq INTEGER NOT NULL
                CHECK (seq > 0), {COLUMNS}, UNIQUE (run, seq), UNIQUE (run, step_id, phase, attempt))""",
        ),
        "INSERT INTO events (run, seq, step_id, phase, attempt, body, hash) VALUES (?, ?, ?, ?, ?, ?, ?)",
        f"SELECT {READ_COLUMNS} FROM events WHERE run = ? AND seq > ? ORDER BY seq LIMIT ?",
        interned=True,
    ),
    Layout(
        "d1",
        "rowid = run << 32 | seq (run interned: a run's rows clustered, a new run appended); "
        "unique (run, step_id, phase, attempt)",
        (
            RUNS_DDL,
            f"""CREATE TABLE events (id INTEGER PRIMARY KEY, run INTEGER NOT NULL, seq INTEGER NOT NULL
                CHECK (seq > 0), {COLUMNS}, UNIQUE (run, step_id, phase, attempt))""",
        ),
        "INSERT INTO events (id, run, seq, step_id, phase, attempt, body, hash) "
        "VALUES (? << 32 | ?, ?, ?, ?, ?, ?, ?, ?)",
        f"SELECT {READ_COLUMNS} FROM events WHERE id > ? << 32 | ? AND id < (? + 1) << 32 ORDER BY id LIMIT ?",
        interned=True,
        composite=True,
    ),
    Layout(
        "d3",
        "(d1) keeping run_id TEXT in the rows and the dedup index as now, a trigger tying the rowid to the runs table",
        (
            RUNS_DDL,
            f"""CREATE TABLE events (id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, seq INTEGER NOT NULL
                CHECK (seq > 0 AND seq < 4294967296), {COLUMNS}, UNIQUE (run_id, step_id, phase, attempt))""",
            """CREATE TRIGGER events_keyed BEFORE INSERT ON events
               WHEN NEW.id IS NOT ((SELECT run FROM runs WHERE run_id = NEW.run_id) << 32 | NEW.seq)
               BEGIN SELECT RAISE(ABORT, 'effectlog: an event row is keyed by its run number and seq'); END""",
        ),
        "INSERT INTO events (id, run_id, seq, step_id, phase, attempt, body, hash) "
        "VALUES (? << 32 | ?, ?, ?, ?, ?, ?, ?, ?)",
        # +run_id: filter on the text, never take the dedup index for it (the rowid range is the read).
        f"SELECT {READ_COLUMNS} FROM events WHERE id > ? << 32 | ? AND id < (? + 1) << 32 AND +run_id = ? "
        "ORDER BY id LIMIT ?",
        interned=True,
        composite=True,
        text_too=True,
    ),
    Layout(
        "d2",
        "WITHOUT ROWID keyed (run, seq) with the run interned; unique (run, step_id, phase, attempt)",
        (
            RUNS_DDL,
            f"""CREATE TABLE events (run INTEGER NOT NULL, seq INTEGER NOT NULL CHECK (seq > 0), {COLUMNS},
                PRIMARY KEY (run, seq), UNIQUE (run, step_id, phase, attempt)) WITHOUT ROWID""",
        ),
        "INSERT INTO events (run, seq, step_id, phase, attempt, body, hash) VALUES (?, ?, ?, ?, ?, ?, ?)",
        f"SELECT {READ_COLUMNS} FROM events WHERE run = ? AND seq > ? ORDER BY seq LIMIT ?",
        interned=True,
    ),
)
BY_NAME = {layout.name: layout for layout in LAYOUTS}


# -- writing rows as effectlog commits them ----------------------------------------------------------


def open_db(path: Path, layout: Layout, *, autocheckpoint: int = WAL_AUTOCHECKPOINT_PAGES) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA page_size = 4096")
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = FULL")
    db.execute(f"PRAGMA wal_autocheckpoint = {autocheckpoint}")
    if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'events'").fetchone():
        db.execute("BEGIN IMMEDIATE")
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        for sql in (*layout.ddl, *TRIGGERS):
            db.execute(sql)
        db.execute("COMMIT")
    return db


class Writer:
    """One layout's appends: runs started (their ``run.started`` row, its own commit), then commits of rows."""

    def __init__(self, db: sqlite3.Connection, layout: Layout) -> None:
        self.db, self.layout = db, layout
        self.cursor = db.cursor()
        self.keys: dict[str, Any] = {}
        self.seqs: dict[str, int] = {}

    def start(self, run_ids: list[str], plan_bytes: int) -> None:
        cursor = self.cursor
        cursor.execute("BEGIN IMMEDIATE")
        for run_id in run_ids:
            if self.layout.interned:
                cursor.execute("INSERT INTO runs (run_id) VALUES (?)", (run_id,))
                self.keys[run_id] = cursor.lastrowid
            else:
                self.keys[run_id] = run_id
            self.seqs[run_id] = 0
        cursor.execute("COMMIT")
        self.commit([(run_id, "", "run.started", 0, plan_bytes) for run_id in run_ids])

    def commit(self, rows: list[tuple[str, str, str, int, int]]) -> None:
        """``rows``: (run id, step id, phase, attempt, body size), each at its run's next seq."""
        cursor, insert, keys, seqs = self.cursor, self.layout.insert, self.keys, self.seqs
        composite, text_too = self.layout.composite, self.layout.text_too
        execute = cursor.execute
        execute("BEGIN IMMEDIATE")
        for run_id, step_id, phase, attempt, size in rows:
            seq = seqs[run_id] + 1
            seqs[run_id] = seq
            key = keys[run_id]
            if text_too:
                execute(insert, (key, seq, run_id, seq, step_id, phase, attempt, bytearray(size), HASH))
            elif composite:
                execute(insert, (key, seq, key, seq, step_id, phase, attempt, bytearray(size), HASH))
            else:
                execute(insert, (key, seq, step_id, phase, attempt, bytearray(size), HASH))
        execute("COMMIT")


def step_commits(run_ids: list[str], steps: int, first: int = 0) -> Iterator[list[tuple[str, str, str, int, int]]]:
    """Each step's two commits, for all of ``run_ids`` together (one run: 1 row, then 2)."""
    (req, req_size), (eff, eff_size), (con, con_size) = PHASES
    for i in range(first, first + steps):
        step = f"step-{i}"
        yield [(run_id, step, req, 1, req_size) for run_id in run_ids]
        yield [
            row for run_id in run_ids for row in ((run_id, step, eff, 1, eff_size), (run_id, step, con, 1, con_size))
        ]


def run_ids_for(runs: int, salt: int = 0) -> list[str]:
    # Ids that sort anywhere among each other, as real run ids do (not in start order).
    return [f"run-{((k + salt) * 2654435761) % 2**32:08x}" for k in range(1, runs + 1)]


def history(writer: Writer) -> None:
    """Earlier runs already in the journal (16 finished runs of 100 steps), as in service: a new
    run's rows go among theirs, or after them."""
    old = run_ids_for(16, salt=1000)
    writer.start(old, 10_000)
    list(map(writer.commit, step_commits(old, 100)))


SHAPES = {"one run": (1, 1000, 300, 1300), "32 runs": (32, 100, 20, 70)}  # runs, timed steps, valgrind small/large


# -- 1. CPU per event ---------------------------------------------------------------------------------


def cpu_us_per_event(workdir: Path, layout: Layout, runs: int, steps: int) -> float:
    path = workdir / f"cpu-{layout.name}.db"
    remove(path)
    db = open_db(path, layout)
    try:
        writer = Writer(db, layout)
        history(writer)
        ids = run_ids_for(runs)
        writer.start(ids, 10_000)
        commits = list(step_commits(ids, steps))
        start = time.process_time()
        for rows in commits:
            writer.commit(rows)
        cpu = time.process_time() - start
    finally:
        db.close()
        remove(path)
    return cpu / (3 * runs * steps) * 1e6


# -- 2. WAL pages per commit, by b-tree ---------------------------------------------------------------


def wal_pages(workdir: Path, layout: Layout, runs: int, steps: int) -> dict[str, float]:
    """Pages per commit written to the WAL (checkpoints held off, so every frame stays), by b-tree."""
    path = workdir / f"wal-{layout.name}.db"
    remove(path)
    db = open_db(path, layout, autocheckpoint=0)
    try:
        writer = Writer(db, layout)
        history(writer)
        ids = run_ids_for(runs)
        writer.start(ids, 10_000)
        list(map(writer.commit, step_commits(ids, 5)))  # the first pages of each tree, not timed
        start_frame = frame_count(path)
        commits = list(step_commits(ids, steps, first=5))
        for rows in commits:
            writer.commit(rows)
        pages = frame_pages(path, start_frame)
        tree = {int(p): str(n) for p, n in db.execute("SELECT pageno, name FROM dbstat")}
    finally:
        db.close()
        remove(path)
    by_tree: dict[str, float] = {}
    for page in pages:
        name = label(tree.get(page, "other (freelist, schema)"))
        by_tree[name] = by_tree.get(name, 0) + 1 / len(commits)
    return {"total": len(pages) / len(commits), **dict(sorted(by_tree.items()))}


def label(tree: str) -> str:
    if tree == "events":
        return "table"
    if tree.startswith("sqlite_autoindex_events_"):
        return "index " + tree.rsplit("_", 1)[1]
    return tree


def frame_count(path: Path) -> int:
    size = Path(f"{path}-wal").stat().st_size
    return max(0, (size - 32) // (24 + 4096))


def frame_pages(path: Path, first: int) -> list[int]:
    """The page number of each WAL frame from frame ``first`` on (frame header: page number, big-endian)."""
    pages = []
    with open(f"{path}-wal", "rb") as wal:
        for i in range(first, frame_count(path)):
            wal.seek(32 + i * (24 + 4096))
            pages.append(int.from_bytes(wal.read(4), "big"))
    return pages


# -- 3. instructions per event (valgrind) -----------------------------------------------------------


CHILD = r"""
import os, sys, gc
sys.path.insert(0, os.environ["BENCH_DIR"])
import layout_bench as lb
from pathlib import Path
gc.disable()
layout = lb.BY_NAME[os.environ["LAYOUT"]]
path = Path(os.environ["DB"])
db = lb.open_db(path, layout)
writer = lb.Writer(db, layout)
lb.history(writer)
ids = lb.run_ids_for(int(os.environ["RUNS"]))
writer.start(ids, 10_000)
for rows in lb.step_commits(ids, int(os.environ["STEPS"])):
    writer.commit(rows)
db.close()
"""


def instructions(workdir: Path, layout: Layout, runs: int, steps: int) -> int:
    path = workdir / f"vg-{layout.name}.db"
    remove(path)
    env = {**valgrind_env(layout, path), "RUNS": str(runs), "STEPS": str(steps)}
    done = subprocess.run([*VALGRIND, sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    remove(path)
    return refs(done.stderr)


VALGRIND = ("valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null")


def valgrind_env(layout: Layout, path: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONHASHSEED": "0",
        "BENCH_DIR": str(HERE),
        "LAYOUT": layout.name,
        "DB": str(path),
    }


def refs(stderr: str) -> int:
    found = re.search(r"I\s+refs:\s+([\d,]+)", stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


# -- 4. bytes per event, and the read-back ----------------------------------------------------------


def build(path: Path, layout: Layout, runs: int, events: int, plan_bytes: int) -> sqlite3.Connection:
    """A journal of ``events`` events (about) in ``runs`` runs written together, its WAL checkpointed."""
    remove(path)
    db = open_db(path, layout)
    writer = Writer(db, layout)
    ids = run_ids_for(runs)
    writer.start(ids, plan_bytes)
    for rows in step_commits(ids, (events - runs) // (3 * runs)):
        writer.commit(rows)
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return db


def footprint(db: sqlite3.Connection, events: int) -> dict[str, float]:
    trees = {str(n): int(s) for n, s in db.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name")}
    mine = sum(size for name, size in trees.items() if "events" in name or "runs" in name)
    return {
        "bytes_per_event": (mine + OTHER_BYTES) / events,
        "table_bytes_per_event": trees["events"] / events,
        "index_bytes_per_event": (mine - trees["events"]) / events,
    }


def read_back_us(path: Path, layout: Layout, run_id: str, rounds: int) -> float:
    """Best of ``rounds``: one run's rows in seq order, in pages of 2,000 rows, on a new connection."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        count = read_run(path, layout, run_id)
        best = min(best, (time.process_time() - start) / count * 1e6)
    return best


def read_run(path: Path, layout: Layout, run_id: str) -> int:
    """Read one run's rows as replay does (``READ_PAGE``: pages of 2,000 rows in seq order); how many."""
    db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, isolation_level=None)
    key: Any = run_id
    if layout.interned:
        key = db.execute("SELECT run FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0]
    after, count = 0, 0
    while True:
        if layout.text_too:
            rows = db.execute(layout.read, (key, after, key, run_id, READ_PAGE_ROWS)).fetchall()
        elif layout.composite:
            rows = db.execute(layout.read, (key, after, key, READ_PAGE_ROWS)).fetchall()
        else:
            rows = db.execute(layout.read, (key, after, READ_PAGE_ROWS)).fetchall()
        count += len(rows)
        if len(rows) < READ_PAGE_ROWS:
            break
        after = rows[-1][0]
    db.close()
    return count


READ_CHILD = r"""
import os, sys, gc
sys.path.insert(0, os.environ["BENCH_DIR"])
import layout_bench as lb
from pathlib import Path
gc.disable()
layout, path, run_id = lb.BY_NAME[os.environ["LAYOUT"]], Path(os.environ["DB"]), os.environ["RUN_ID"]
for _ in range(int(os.environ["TIMES"])):
    count = lb.read_run(path, layout, run_id)
print(count)
"""


def read_instructions(path: Path, layout: Layout, run_id: str) -> float:
    """Instructions per event read (valgrind): reading the run three times less reading it once, halved."""
    counts = []
    for times in (1, 3):
        env = {**valgrind_env(layout, path), "RUN_ID": run_id, "TIMES": str(times)}
        done = subprocess.run(
            [*VALGRIND, sys.executable, "-c", READ_CHILD], env=env, capture_output=True, text=True, check=True
        )
        counts.append((refs(done.stderr), int(done.stdout.split()[-1])))
    return (counts[1][0] - counts[0][0]) / (2 * counts[0][1])


# -- the whole benchmark ----------------------------------------------------------------------------


def remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def compile_first() -> None:
    """Write this module's bytecode cache before any count: the first child would count compiling it."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "BENCH_DIR": str(HERE)}
    code = "import os, sys; sys.path.insert(0, os.environ['BENCH_DIR']); import layout_bench"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def run_all(workdir: Path, *, quick: bool, valgrind: bool) -> dict[str, Any]:
    if valgrind:
        compile_first()
    results: dict[str, Any] = {name: {} for name in BY_NAME}
    rounds = 3 if quick else 7
    for shape, (runs, timed, small, large) in SHAPES.items():
        steps = timed // 4 if quick else timed
        say(f"{shape}: WAL pages")
        for layout in LAYOUTS:
            results[layout.name][f"{shape}: wal pages"] = wal_pages(workdir, layout, runs, max(steps // 2, 20))
        say(f"{shape}: CPU, {rounds} interleaved rounds")
        samples: dict[str, list[float]] = {name: [] for name in BY_NAME}
        for _ in range(rounds):
            for layout in LAYOUTS:
                samples[layout.name].append(cpu_us_per_event(workdir, layout, runs, steps))
        for name, values in samples.items():
            results[name][f"{shape}: cpu us/event"] = statistics.median(values)
        if valgrind:
            say(f"{shape}: instructions (valgrind)")
            for layout in LAYOUTS:
                diff = instructions(workdir, layout, runs, large) - instructions(workdir, layout, runs, small)
                results[layout.name][f"{shape}: instructions/event"] = diff / (3 * runs * (large - small))
    events = 30_001 if quick else 100_001
    for layout in LAYOUTS:
        say(f"{layout.name}: journals of {events:,} events")
        one = workdir / f"one-{layout.name}.db"
        db = build(one, layout, 1, events, 104 * (events // 3))  # run.started holds the plan: ~104 bytes a step
        results[layout.name]["bytes"] = footprint(db, events)
        db.close()
        many = workdir / f"many-{layout.name}.db"
        build(many, layout, 32, events, 104 * (events // 96)).close()
        results[layout.name]["read one run (one-run journal) us/event"] = read_back_us(
            one, layout, run_ids_for(1)[0], rounds
        )
        results[layout.name]["read one run (32 interleaved) us/event"] = read_back_us(
            many, layout, run_ids_for(32)[15], rounds
        )
        if valgrind:
            results[layout.name]["read one run (one-run journal) instructions/event"] = read_instructions(
                one, layout, run_ids_for(1)[0]
            )
            results[layout.name]["read one run (32 interleaved) instructions/event"] = read_instructions(
                many, layout, run_ids_for(32)[15]
            )
        remove(one)
        remove(many)
    return {"measured": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "events": events, "layouts": results}


def table(results: dict[str, Any]) -> str:
    head = (
        "| layout | WAL pages/commit, one run (table + indexes) | 32 runs | CPU µs/event, one run | 32 runs "
        "| instructions/event, one run | 32 runs | bytes/event | read one run µs/event: one-run journal "
        "| 32 interleaved | read instructions/event: one-run journal | 32 interleaved |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results["layouts"].items():

        def pages(shape: str, r: dict[str, Any] = r) -> str:
            p = r[f"{shape}: wal pages"]
            parts = " + ".join(f"{p[k]:.2f}" for k in ("table", "index 1", "index 2") if k in p)
            return f"{p['total']:.2f} ({parts})"

        def num(key: str, fmt: str, r: dict[str, Any] = r) -> str:
            return format(r[key], fmt) if key in r else "-"

        lines.append(
            f"| ({name}) | {pages('one run')} | {pages('32 runs')} | {num('one run: cpu us/event', '.1f')} "
            f"| {num('32 runs: cpu us/event', '.1f')} | {num('one run: instructions/event', ',.0f')} "
            f"| {num('32 runs: instructions/event', ',.0f')} | {r['bytes']['bytes_per_event']:.0f} "
            f"| {num('read one run (one-run journal) us/event', '.2f')} "
            f"| {num('read one run (32 interleaved) us/event', '.2f')} "
            f"| {num('read one run (one-run journal) instructions/event', ',.0f')} "
            f"| {num('read one run (32 interleaved) instructions/event', ',.0f')} |"
        )
    lines.append("")
    lines.extend(f"- ({layout.name}) {layout.what}" for layout in LAYOUTS)
    return "\n".join(lines)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and events (a check that it runs)")
    parser.add_argument("--no-valgrind", action="store_true", help="skip the instruction counts")
    parser.add_argument("--report", action="store_true", help="print the table of the saved results only")
    args = parser.parse_args(argv)
    if args.report:
        print(table(json.loads(RESULTS.read_text())))
        return 0
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    workdir = Path(tempfile.mkdtemp(prefix="layout-", dir=base))
    try:
        results = run_all(
            workdir, quick=args.quick, valgrind=not args.no_valgrind and shutil.which("valgrind") is not None
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if not args.quick:
        RESULTS.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
