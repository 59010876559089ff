"""Where ``verify``'s time per event goes, beyond ``resume_bench``'s breakdown (issue 18, round 7).

    PYTHONPATH=src .venv/bin/python experiments/verify_costs.py [--steps N] [--compiled]

CPU time (``time.process_time()``, best of 5, the cyclic GC off as ``verify`` runs it) over a finished
no-op run of N steps (1 + 3N events, default 33,333: the bench's 100k-event journal):

1. ``columns``: what reading a row costs per column, from the events table itself: every column
   ``read_rows`` selects, then without ``seq`` and the index columns, then only ``body`` and ``hash``;
   and the same number of NULL columns from an in-memory table (no object built: the sqlite3
   module's own cost per column; CPython 3.11 releases and re-takes the GIL around each
   ``sqlite3_column_type`` of each row);
2. ``parts``: over the rows already read, a loop that only unpacks them, then links the chain
   (``sha256(head + body)``), then decodes each body, then both; and ``fold.replay_rows`` over the same
   rows (the fold's own work is its excess over ``chain + decode``);
3. ``fresh_process``: one ``verify_run`` as ``effectlog verify`` runs it, the first in a new process (a
   child, median of 3): CPU per event, minor page faults and peak RSS growth (``VmHWM``: ``ru_maxrss``
   is inherited across ``fork``);
4. ``--instructions``: the same parts counted in instructions (``valgrind --tool=callgrind``, a child doing
   the part twice minus one doing it once, after the same warm-up, ``PYTHONHASHSEED=0``, the cyclic GC
   off): ``verify_run``, ``load_run``, ``fold_rows`` over rows already read (with the segments' stops and
   without), the chain alone (``sha256(head + body)`` and ``sha256(head).update(body)``), and every
   segment inflated, then decoded (in full, and with its steps left as stored, as ``verify``'s quick
   path decodes it); per event. Deterministic where CPU time on a shared machine is not
   (about 30-45 minutes at the default size on a 2-core machine: the one ``verify_run`` pair alone
   took 6 min 45 s);
5. ``--compiled``: ``fold_rows`` compiled with mypyc (the module's ``fold_rows`` and nothing else, into a
   temporary copy of ``src``; needs mypyc and a C compiler) against the interpreted one, ``load_run``
   and ``verify_run`` each: does a compiled fold reach the target?
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@contextlib.contextmanager
def _gc_off() -> Iterator[None]:
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def best(fn: Callable[[], Any], rounds: int = 5) -> float:
    """Least CPU seconds of ``rounds`` calls."""
    least = float("inf")
    for _ in range(rounds):
        with _gc_off():
            cpu = time.process_time()
            fn()
            least = min(least, time.process_time() - cpu)
    return least


def columns(path: Path, events: int) -> dict[str, float]:
    db = sqlite3.connect(path)
    queries = {
        "read_rows' six columns": (
            "SELECT e.id & 4294967295, e.body, e.hash, e.step_id, e.phase, e.attempt FROM events e"
        ),
        "without seq": "SELECT e.body, e.hash, e.step_id, e.phase, e.attempt FROM events e",
        "body and hash only": "SELECT e.body, e.hash FROM events e",
    }
    out = {name: best(lambda q=q: db.execute(q).fetchall()) / events * 1e6 for name, q in queries.items()}
    db.close()
    mem = sqlite3.connect(":memory:")
    mem.execute("CREATE TABLE t (a)")
    mem.executemany("INSERT INTO t VALUES (NULL)", [()] * events)
    for n in (1, 2, 6):
        q = "SELECT " + ", ".join(["a"] * n) + " FROM t"
        out[f"{n} NULL column(s), in memory"] = best(lambda q=q: mem.execute(q).fetchall()) / events * 1e6
    mem.close()
    return out


def parts(path: Path) -> dict[str, float]:
    from effectlog import events as ev
    from effectlog import fold
    from effectlog.journal import SqliteJournal

    with SqliteJournal(path, writer=False) as journal:
        rows = list(journal.read_rows("resume"))
        chain = journal.chain
    n = len(rows)
    decode, sha256 = ev._decoder.decode, hashlib.sha256

    def unpack() -> None:
        for row in rows:
            _at, _body, _digest, _sid, _phase, _attempt = row

    def link() -> None:
        head = bytes(32)
        for row in rows:
            _at, body, digest, _sid, _phase, _attempt = row
            if sha256(head + body).digest() != digest:
                raise RuntimeError("chain")
            head = digest

    def decoded() -> None:
        for row in rows:
            decode(row[1])

    def both() -> None:
        head = bytes(32)
        for row in rows:
            _at, body, digest, _sid, _phase, _attempt = row
            if sha256(head + body).digest() != digest:
                raise RuntimeError("chain")
            decode(body)
            head = digest

    timed = {"unpack": unpack, "chain": link, "decode": decoded, "chain + decode": both}
    out = {name: best(fn) / n * 1e6 for name, fn in timed.items()}
    out["fold.replay_rows"] = best(lambda: fold.replay_rows(iter(rows), chain, run_id="resume")) / n * 1e6
    return out


def verify_and_load(path: Path) -> dict[str, float]:
    from effectlog.integrity import verify_run
    from effectlog.journal import SqliteJournal, load_run

    with SqliteJournal(path, writer=False) as journal:
        n = load_run(journal, "resume").seq
        return {
            "load_run": best(lambda: load_run(journal, "resume"), 3) / n * 1e6,
            "verify_run": best(lambda: verify_run(journal, "resume"), 3) / n * 1e6,
        }


_FRESH = """
import json, resource, sys, time
from effectlog.integrity import verify_run
from effectlog.journal import SqliteJournal

def high_water_mb():  # VmHWM: this process's own peak (ru_maxrss is inherited from the parent across fork)
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024

with SqliteJournal(sys.argv[1], writer=False) as journal:
    before, peak = resource.getrusage(resource.RUSAGE_SELF), high_water_mb()
    cpu = time.process_time()
    state = verify_run(journal, "resume")
    cpu = time.process_time() - cpu
    after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({
    "verify_us_per_event": cpu / state.seq * 1e6,
    "minor_page_faults": after.ru_minflt - before.ru_minflt,
    "peak_rss_growth_mb": high_water_mb() - peak,
}))
"""


def fresh_process(path: Path, rounds: int = 3) -> dict[str, Any]:
    """``verify_run`` once in each of ``rounds`` new processes (the median CPU of them)."""
    runs = []
    for _ in range(rounds):
        child = subprocess.run(
            [sys.executable, "-c", _FRESH, str(path)], check=True, capture_output=True, text=True, env=os.environ
        )
        runs.append(json.loads(child.stdout))
    runs.sort(key=lambda r: r["verify_us_per_event"])
    return runs[len(runs) // 2]


_COUNTED = r"""
import gc, hashlib, sys, zlib
gc.disable()
from effectlog import fold
from effectlog.integrity import verify_run
from effectlog.journal import SqliteJournal, load_run
from effectlog.journal import checkpoint
part, times = sys.argv[2], int(sys.argv[3])
with SqliteJournal(sys.argv[1], writer=False) as journal:
    journal.runs()
    rows = list(journal.read_rows("resume")) if part.startswith(("fold", "chain")) else []
    segments = journal.stored_checkpoints("resume")
    stops = [segment[1] for segment in segments]
    inflated = [zlib.decompress(segment[3]) for segment in segments]
    sha256 = hashlib.sha256
    for _ in range(times):
        if part == "verify_run":
            verify_run(journal, "resume")
        elif part == "load_run":
            load_run(journal, "resume")
        elif part in ("fold_rows, stops", "fold_rows"):
            folding = fold.fold_rows(
                iter(rows), journal.chain, run_id="resume", stops=stops if part.endswith("stops") else ()
            )
            try:
                while True:
                    next(folding)
            except StopIteration:
                pass
        elif part == "chain: sha256(head + body)":
            head = bytes(32)
            for row in rows:
                sha256(head + row[1]).digest()
                head = row[2]
        elif part == "chain: sha256(head).update(body)":
            head = bytes(32)
            for row in rows:
                h = sha256(head)
                h.update(row[1])
                h.digest()
                head = row[2]
        elif part == "chain: the loop alone":
            head = bytes(32)
            for row in rows:
                head = row[2]
        elif part == "segments: inflate":
            for segment in segments:
                zlib.decompress(segment[3])
        elif part == "segments: decode":
            for raw in inflated:
                checkpoint._decoder.decode(raw)
        elif part == "segments: decode, steps as stored":
            for raw in inflated:
                checkpoint._raw_steps_decoder.decode(raw)
"""

COUNTED_PARTS = (
    "verify_run",
    "load_run",
    "fold_rows, stops",
    "fold_rows",
    "chain: sha256(head + body)",
    "chain: sha256(head).update(body)",
    "chain: the loop alone",
    "segments: inflate",
    "segments: decode",
    "segments: decode, steps as stored",
)


def instructions(path: Path, events: int) -> dict[str, Any]:
    """Instructions per event of each of ``COUNTED_PARTS``: a child doing it twice minus one doing it once
    (both under callgrind at once: two cores), so imports and the warm-up cancel out."""
    if shutil.which("valgrind") is None:
        return {"skipped": "valgrind is missing"}
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONHASHSEED": "0"}
    callgrind = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", _COUNTED]
    out: dict[str, Any] = {}
    for part in COUNTED_PARTS:
        children = [
            subprocess.Popen(
                [*callgrind, str(path), part, str(times)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for times in (1, 2)
        ]
        counts = []
        for child in children:
            _, err = child.communicate()
            found = re.search(r"Collected : (\d+)", err)
            if child.returncode != 0 or found is None:
                raise RuntimeError(f"no instruction count for {part!r}:\n{err[-2000:]}")
            counts.append(int(found.group(1)))
        out[part] = round((counts[1] - counts[0]) / events)
    return out


def _hot_module(src: Path) -> str:
    """``fold_rows`` alone, as a module importing everything else from the interpreted ``effectlog.fold``."""
    text = (src / "effectlog" / "fold.py").read_text()
    start, end = text.index("def fold_rows("), text.index("def _built(")
    names = (
        "Record, Row, RunState, StepState, initial, apply, _STEP_TAGS, _STEP_FIXED, _step_after, _replace, _STEP, "
        "_TAG_OF, _step_admission, _raise_if_moved, _not_bytes, _check_columns, _moved_row, _apply_run, _built, "
        "_build_pending"
    )
    extra = "_next_stop" if "def _next_stop(" in text else None
    header = (
        "from __future__ import annotations\n"
        "import hashlib\n"
        "from collections.abc import Generator, Iterable\n"
        "from typing import Any\n"
        "import msgspec\n"
        "from effectlog import events as ev\n"
        "from effectlog.chain import Chain\n"
        "from effectlog.errors import ChainBroken, CorruptEvent\n"
        f"from effectlog.fold import ({names}{', ' + extra if extra else ''})\n\n"
    )
    return header + text[start:end]


def compiled(path: Path, workdir: Path) -> dict[str, Any]:
    """``fold_rows`` compiled by mypyc (in a copy of ``src``) against the interpreted one, each measured in a
    child process (``--child-measure``)."""
    mypyc = shutil.which("mypyc", path=str(Path(sys.executable).parent)) or shutil.which("mypyc")
    if mypyc is None or shutil.which("cc") is None:
        return {"skipped": "mypyc or a C compiler is missing"}
    copy = workdir / "compiled"
    shutil.copytree(ROOT / "src", copy / "src")
    shutil.copytree(ROOT / "specs", copy / "specs")
    hot = copy / "src" / "effectlog" / "fold_hot.py"
    hot.write_text(_hot_module(ROOT / "src"))
    built = subprocess.run(
        [mypyc, "effectlog/fold_hot.py"], check=False, cwd=copy / "src", capture_output=True, text=True
    )
    if built.returncode != 0:
        return {"skipped": f"mypyc failed: {(built.stdout + built.stderr)[-2000:]}"}
    hot.unlink()  # import the extension, not the source
    out: dict[str, Any] = {}
    for name, src, env in (("interpreted", ROOT / "src", {}), ("compiled", copy / "src", {"FOLD_HOT": "1"})):
        argv = [sys.executable, str(Path(__file__).resolve()), "--child-measure", str(path)]
        child = subprocess.run(
            argv, env={**os.environ, "PYTHONPATH": str(src), **env}, check=True, capture_output=True, text=True
        )
        out[name] = json.loads(child.stdout)
    return out


def _child_measure(path: Path) -> None:
    if os.environ.get("FOLD_HOT"):
        import effectlog.fold_hot as hot  # type: ignore[import-not-found]

        from effectlog import fold, integrity

        if not hot.__file__.endswith(".so"):
            raise RuntimeError("the compiled fold_rows is not the one imported")
        fold.fold_rows = hot.fold_rows  # ``replay_rows`` (load_run) and verify's own fold
        integrity.fold_rows = hot.fold_rows  # type: ignore[attr-defined]
    print(json.dumps(verify_and_load(path)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=33_333)
    parser.add_argument("--instructions", action="store_true", help="only count instructions per part (callgrind)")
    parser.add_argument("--compiled", action="store_true", help="also measure fold_rows compiled with mypyc")
    parser.add_argument("--child-measure", metavar="DB", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_measure:
        _child_measure(Path(args.child_measure))
        return
    sys.path.insert(0, str(HERE))
    from resume_bench import build_histories

    with tempfile.TemporaryDirectory(prefix="verify-costs-") as tmp:
        workdir = Path(tmp)
        finished, _ = build_histories(workdir, args.steps)
        events = 1 + 3 * args.steps
        results: dict[str, Any] = {"events": events, "python": sys.version.split()[0]}
        if args.instructions:
            results["instructions_per_event"] = instructions(finished, events)
            print(json.dumps(results, indent=1))
            return
        results["columns_us_per_row"] = columns(finished, events)
        results["parts_us_per_event"] = parts(finished)
        results["verify_us_per_event"] = verify_and_load(finished)
        results["fresh_process"] = fresh_process(finished)
        if args.compiled:
            results["compiled_fold_rows_us_per_event"] = compiled(finished, workdir)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
