"""Bad input never hurts: the corpus in tests/data/bad/, one test per case.

Each case of tests/data/bad/manifest.toml is one ``effectlog`` command run as a real
process. It must end with the documented exit status and exactly one line on stderr,
without a traceback, naming what is wrong and where; and it must leave every file that
existed before it byte for byte as it was, SQLite's -wal and -shm included (a writer
lock file only keeps its name: its content is the pid of whoever took it last).
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path
from typing import Any

import pytest

from hardening_kit import (
    DATA,
    build_journal,
    effectlog,
    generate_plan,
    make_read_only,
    make_writable,
    one_line,
    respect_file_modes,
    snapshot,
    sqlite_sidecar_or_lock,
)

MANIFEST = DATA / "manifest.toml"
CASES: list[dict[str, Any]] = tomllib.loads(MANIFEST.read_text())["case"]
REQUIRED = {"id", "what", "argv", "exit", "message", "where"}
OPTIONAL = {"plan", "journal", "generate", "write", "mkdir", "fifo", "readonly", "env"}


def prepare(case: dict[str, Any], where: Path) -> None:
    """Lay out the case's files in ``where``: its plan, journal, generated plan, files and directories."""
    if "plan" in case:
        shutil.copyfile(DATA / case["plan"], where / Path(case["plan"]).name)
    if "journal" in case:
        build_journal(case["journal"], where / "journal.db")
    if "generate" in case:
        generate_plan(case["generate"], where / "generated.json")
    for name, content in case.get("write", {}).items():
        (where / name).write_text(content)
    for name in case.get("mkdir", []):
        (where / name).mkdir(parents=True)
    for name in case.get("fifo", []):
        os.mkfifo(where / name)


def _data(files: dict[str, bytes | None]) -> dict[str, bytes | None]:
    """Files with their bytes, but a writer lock only by name: its content is the pid of its
    last holder, rewritten by every process that takes it (it is never journal data)."""
    return {name: b"<pid>" if name.endswith(".lock") else data for name, data in files.items()}


def test_the_corpus_has_at_least_forty_well_formed_cases_with_unique_ids() -> None:
    """The manifest holds >= 40 cases, ids are unique, every case has the required fields and
    no unknown one, and every plan file in tests/data/bad/plans/ is used by some case."""
    ids = [c["id"] for c in CASES]
    used = {Path(c["plan"]).name for c in CASES if "plan" in c}
    on_disk = {p.name for p in (DATA / "plans").iterdir()}

    assert len(CASES) >= 40
    assert sorted(set(ids)) == sorted(ids)
    assert [] == [c["id"] for c in CASES if not REQUIRED <= c.keys() <= REQUIRED | OPTIONAL]
    assert set() == on_disk - used


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input_fails_with_one_line_and_leaves_every_file_as_it_was(case: dict[str, Any], tmp_path: Path) -> None:
    """The case's command exits with its documented status; stderr is one line, no traceback,
    naming what is wrong (``message``) and where (``where``); every pre-existing file is
    byte-identical afterwards; and the only new files are a writer lock or SQLite sidecars of a
    file that existed before (a command that fails on input never creates a journal)."""
    prepare(case, tmp_path)
    read_only = [tmp_path / p for p in case.get("readonly", [])]
    for path in read_only:
        make_read_only(path)
    before = snapshot(tmp_path)
    try:
        done = effectlog(
            *case["argv"],
            cwd=tmp_path,
            env=case.get("env"),
            preexec=respect_file_modes if read_only else None,
        )
    finally:
        make_writable(tmp_path)
    after = snapshot(tmp_path)

    line = one_line(done.stderr)
    assert (case["exit"], True, True) == (done.returncode, case["message"] in line, case["where"] in line), line
    assert _data(before) == _data({name: after.get(name) for name in before})
    assert [] == [name for name in after.keys() - before.keys() if not _beside_existing(name, after[name], before)]


def _beside_existing(name: str, data: bytes | None, before: dict[str, bytes | None]) -> bool:
    """A lock or SQLite sidecar of a file that was there before: a new journal is never one."""
    base = name.removesuffix(".lock").removesuffix("-shm").removesuffix("-wal")
    return sqlite_sidecar_or_lock(name, data) and base in before
