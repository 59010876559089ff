"""One file may not serve one command as two things: the journal, the effect store, the fleet store and
the trace are each their own file, and a second name for one of them (the same name twice, ``./x``, a
symlink, a hard link, a sidecar such as ``j.db-wal``) is refused before anything is created or changed.

Before, ``run --journal j.db --effects j.db`` on a new file made the journal there, then refused the
effect store ("a SQLite file of something else"): bad input that created a file. Every command runs as
a real ``effectlog`` process on real SQLite files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from effectlog.errors import ExitStatus
from hardening_kit import effectlog, one_line


def snapshot(root: Path) -> dict[str, bytes | str | None]:
    """Every name under ``root``: a file's bytes, a symlink's target text (it may dangle), a directory None."""
    out: dict[str, bytes | str | None] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = os.readlink(path) if path.is_symlink() else None if path.is_dir() else path.read_bytes()
    return out


PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.json"


def _plan(cwd: Path) -> str:
    (cwd / "p.json").write_text(PAYMENT.read_text())
    return "p.json"


def _alias(cwd: Path, how: str) -> str:
    """A second name for ``j.db`` (which need not exist yet)."""
    if how == "same":
        return "j.db"
    if how == "dot":
        (cwd / "sub").mkdir()
        return "./sub/../j.db"
    if how == "symlink":
        os.symlink("j.db", cwd / "link.db")
        return "link.db"
    if how == "absolute":
        return str(cwd / "j.db")
    assert how == "wal", how
    return "j.db-wal"


ALIASES = ["same", "dot", "symlink", "absolute", "wal"]
BY = ["--by", "ann", "--reason", "test"]


@pytest.mark.parametrize("how", ALIASES)
def test_run_with_the_effect_store_at_the_new_journals_file_is_refused_and_creates_nothing(
    tmp_path: Path, how: str
) -> None:
    plan = _plan(tmp_path)
    effects = _alias(tmp_path, how)
    before = snapshot(tmp_path)

    done = effectlog("run", plan, "--journal", "j.db", "--effects", effects, cwd=tmp_path)

    assert (int(ExitStatus.BAD_INPUT), "") == (done.returncode, done.stdout), done.stderr
    assert "--effects" in one_line(done.stderr)
    assert before == snapshot(tmp_path)


@pytest.mark.parametrize("how", ALIASES)
def test_runner_with_the_effect_store_at_the_new_fleet_stores_file_is_refused_and_creates_nothing(
    tmp_path: Path, how: str
) -> None:
    store = _alias(tmp_path, how)
    before = snapshot(tmp_path)

    done = effectlog(
        "runner", "--store", "j.db", "--effects", store, "--exit-when-idle", "--quiet", cwd=tmp_path
    )  # fmt: skip

    assert (int(ExitStatus.BAD_INPUT), "") == (done.returncode, done.stdout), done.stderr
    assert "--effects" in one_line(done.stderr)
    assert before == snapshot(tmp_path)


@pytest.mark.parametrize("command", ["recover", "fork", "retry"])
def test_a_lifecycle_command_with_the_effect_store_at_the_journals_file_changes_nothing(
    tmp_path: Path, command: str
) -> None:
    """An existing journal (a completed run) and ``--effects`` naming that journal by a hard link: exit 2
    naming --effects (checked before the run's state is), every file byte-identical."""
    first = effectlog("run", _plan(tmp_path), "--journal", "j.db", "--effects", "e.db", cwd=tmp_path)
    assert 0 == first.returncode, first.stderr
    os.link(tmp_path / "j.db", tmp_path / "hard.db")
    argv = {
        "recover": ["recover"],
        "fork": ["fork", "--run-id", "payment-001", "--from-step", "charge", "--new-run-id", "p2", *BY],
        "retry": ["retry", "--run-id", "payment-001", "--new-run-id", "p2", *BY],
    }[command]
    before = snapshot(tmp_path)

    done = effectlog(*argv, "--journal", "j.db", "--effects", "hard.db", cwd=tmp_path)

    assert (int(ExitStatus.BAD_INPUT), "") == (done.returncode, done.stdout), done.stderr
    assert "--effects" in one_line(done.stderr)
    assert {k: v for k, v in before.items() if not k.endswith("-shm")} == {
        k: v for k, v in snapshot(tmp_path).items() if not k.endswith("-shm")
    }
