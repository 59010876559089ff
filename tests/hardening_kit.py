"""What the hardening tests share: running the CLI as a real process, byte snapshots of a
directory, journals built in known (good and broken) shapes, and read-only paths that hold
even for root.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import journal_tamper
from effectlog.chain import Chain
from effectlog.journal import SqliteJournal
from effectlog.plan import load_plan
from effectlog.runtime import Runtime, SimulatedCrash

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "bad"
GOOD_PLAN = DATA / "plans" / "good.json"
KEY = b"correct horse battery staple"
SAFETY_TIMEOUT_S = 120  # a hung child fails the test instead of hanging CI; never a timing assertion


def wait_until_gone_or_effect(pidfile: Path, effect: Path, fallback_s: float) -> None:
    """Return once the process whose pid a command wrote to ``pidfile`` is gone (absent or a zombie), or
    once ``effect`` exists: either way nothing more can come of it, however slow the machine. A command
    killed before it even wrote its pid gets the old fixed wait, ``fallback_s``. For tests that need a
    killed command's late effect NOT to happen: they wait for the positive sign, not a guessed time."""
    if not pidfile.exists() or not pidfile.read_text().strip():
        time.sleep(fallback_s)
        return
    stat = Path(f"/proc/{int(pidfile.read_text())}/stat")
    deadline = time.monotonic() + SAFETY_TIMEOUT_S
    while not effect.exists():
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except FileNotFoundError:
            return
        assert time.monotonic() < deadline, f"the command ({stat.parent.name}) still runs after {SAFETY_TIMEOUT_S}s"
        time.sleep(0.02)


def cli_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a CLI child gets: ours, without a journal key unless ``extra`` sets one."""
    env = {k: v for k, v in os.environ.items() if k != "EFFECTLOG_JOURNAL_KEY"}
    for name, value in (extra or {}).items():
        # PYTHONPATH adds to ours (which may point at the source under test), never replaces it.
        env[name] = os.pathsep.join([value, env["PYTHONPATH"]]) if name == "PYTHONPATH" and env.get(name) else value
    return env


def effectlog(
    *argv: str,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m effectlog ARGV`` as a real process in ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "effectlog", *argv],
        cwd=cwd,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=SAFETY_TIMEOUT_S,
        check=False,
        preexec_fn=preexec,
    )


# A one-step plan of a no-op adapter, for tests of the CLI's arguments.
NOOP_PLAN = {"run_id": "r1", "adapters": {"n": {"type": "noop"}}, "steps": [{"id": "a", "adapter": "n"}]}


def effectlog_beside_plan(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``effectlog`` with ``NOOP_PLAN`` written to ``cwd/plan.json`` first."""
    (cwd / "plan.json").write_text(json.dumps(NOOP_PLAN))
    return effectlog(*argv, cwd=cwd)


# A progress line of `effectlog run` (on by default, docs/observability.md): the run's start or resume,
# a step's outcome, the run's end.
PROGRESS = re.compile(
    r"effectlog: run \S+ (?:started|resumed|step \S+ (?:confirmed|failed|uncertain|resent|denied|held) \(.*"
    r"|\S+ \(exit \d+\))"
)


def last_line(stderr: str) -> str:
    """The error contract for a failure while a run runs: no traceback; every line before the last
    is a progress line; returns the last line, the one error line."""
    assert "Traceback" not in stderr, stderr
    *progress, last = stderr.splitlines() or [""]
    assert [] == [line for line in progress if not PROGRESS.fullmatch(line)], stderr
    return last


def one_line(stderr: str) -> str:
    """The CLI's error contract: exactly one line on stderr and no traceback; returns that line."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert 1 == len(lines), stderr
    return lines[0]


# -- read-only paths that hold for root too -----------------------------------------------------

_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _CAP_FOWNER = 1, 2, 3


def respect_file_modes() -> None:
    """preexec_fn: as root, drop the capabilities that let root write through 0444/0555.

    They are dropped from the bounding set, so the exec'd child cannot get them back. For
    any other user file modes already hold and this does nothing.
    """
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _CAP_FOWNER):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def make_read_only(path: Path) -> None:
    path.chmod(0o555 if path.is_dir() else 0o444)


def make_writable(root: Path) -> None:
    """Undo ``make_read_only`` anywhere under ``root`` (so pytest can remove it)."""
    for path in [root, *root.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)


# -- snapshots --------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every file under ``root`` with its bytes (directories as ``None``, a FIFO unread), by relative path."""
    out: dict[str, bytes | None] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = None if path.is_dir() else b"<fifo>" if path.is_fifo() else path.read_bytes()
    return out


def sqlite_sidecar_or_lock(name: str, data: bytes | None) -> bool:
    """A file a failed command may leave: its writer lock, SQLite's -shm, an empty -wal."""
    return name.endswith((".lock", "-shm")) or (name.endswith("-wal") and data == b"")


# -- journals in known shapes -----------------------------------------------------------------


def run_good_plan(path: Path, chain: Chain | None = None, crash_after: str | None = None) -> None:
    """Run tests/data/bad/plans/good.json (two noop steps) into ``path``, optionally dying after a step."""

    def hook(point: str, step_id: str) -> None:
        if point == "after_confirm" and step_id == crash_after:
            raise SimulatedCrash(point)

    runtime = Runtime(SqliteJournal(path, chain=chain), crash_hook=hook)
    try:
        if crash_after is None:
            assert "completed" == runtime.run(load_plan(GOOD_PLAN)).state
        else:
            with pytest.raises(SimulatedCrash):
                runtime.run(load_plan(GOOD_PLAN))
    finally:
        runtime.close()


def _edit(path: Path, *sql: str) -> None:
    db = journal_tamper.connect(path, isolation_level=None)
    try:
        for statement in sql:
            db.execute(statement)
    finally:
        db.close()


def build_journal(kind: str, path: Path) -> None:
    """Put a journal of shape ``kind`` at ``path`` (the names tests/data/bad/manifest.toml uses)."""
    if kind == "completed":
        run_good_plan(path)
    elif kind == "interrupted":
        run_good_plan(path, crash_after="charge")
    elif kind == "keyed":
        run_good_plan(path, Chain(KEY))
    elif kind == "newer-schema":
        run_good_plan(path)
        _edit(path, "UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    elif kind == "truncated":
        run_good_plan(path)
        with path.open("r+b") as fh:
            fh.truncate(2 * 4096)
    elif kind == "edited-row":  # an open run, so that a resume replays (and checks) its history
        run_good_plan(path, crash_after="charge")
        _edit(
            path,
            "DROP TRIGGER events_append_only_update",
            "UPDATE ev SET body = CAST(replace(CAST(body AS TEXT), 'el1-', 'el2-') AS BLOB) WHERE seq = 3",
        )
    elif kind == "zero-length":
        path.write_bytes(b"")
    elif kind == "not-sqlite":
        path.write_text("run_id,step,state\ngood-run,charge,confirmed\n")
    elif kind == "foreign-sqlite":
        _edit(path, "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)", "INSERT INTO users VALUES (1, 'ana')")
    elif kind == "wal-only":
        side = path.parent / "elsewhere"
        side.mkdir()
        run_good_plan(side / path.name)
        db = sqlite3.connect(side / path.name, isolation_level=None)
        db.execute("PRAGMA wal_autocheckpoint = 0")
        db.execute("INSERT INTO meta (key, value) VALUES ('note', 'only in the WAL')")
        shutil.copyfile(side / (path.name + "-wal"), path.parent / (path.name + "-wal"))
        db.close()
        shutil.rmtree(side)
    elif kind == "directory":
        path.mkdir()
    else:
        raise AssertionError(f"no journal builder named {kind!r}")


def generate_plan(kind: str, path: Path) -> None:
    """Plans too big or too deep to keep in the repository."""
    if kind == "nested-100000":
        args = "[" * 100_000 + "]" * 100_000
        path.write_text(
            '{"run_id": "deep", "adapters": {"t": {"type": "noop"}}, '
            f'"steps": [{{"id": "a", "adapter": "t", "args": {{"x": {args}}}}}]}}'
        )
    elif kind == "args-over-1-mib":
        blob = "x" * (1_153_448 - len('{"blob":""}'))  # canonical JSON of the args: 1.1 MiB
        step = {"id": "a", "adapter": "t", "args": {"blob": blob}}
        path.write_text(json.dumps(plan_dict("big", [step], {"t": {"type": "noop"}})))
    else:
        raise AssertionError(f"no plan generator named {kind!r}")


def plan_dict(run_id: str, steps: list[dict[str, Any]], adapters: dict[str, Any]) -> dict[str, Any]:
    return {"run_id": run_id, "adapters": adapters, "steps": steps}


def refused_by_every_opener(location: str | os.PathLike[str], error: type[BaseException]) -> None:
    """``Runtime``, ``durable.run`` and ``EffectStore`` given ``location`` each raise ``error`` (the API's
    three ways to open a SQLite file by its location)."""
    from effectlog import durable
    from effectlog.adapters import EffectStore

    with pytest.raises(error):
        Runtime(location)
    with pytest.raises(error), durable.run("r1", journal=location):
        pass
    with pytest.raises(error):
        EffectStore(location)
