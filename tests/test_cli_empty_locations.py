"""A file or database location given as empty or blank text (``--journal ""``, an unset shell variable in
``--effects "$FX"``) is bad input, named by its flag. It reached SQLite as the current directory ("cannot
open the journal (Is a directory)", exit 2 as a storage error), or made a store file named by a space."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from effectlog.errors import ExitStatus


def refusal(tmp_path: Path, argv: list[str]) -> str:
    """Run ``effectlog ARGV`` beside a valid plan; the one line it printed, once it is shown to have refused
    as bad input (exit 2, that one line on stderr) with no file made beside the plan."""
    plan = {"run_id": "r1", "adapters": {"n": {"type": "noop"}}, "steps": [{"id": "a", "adapter": "n"}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    done = subprocess.run(
        [sys.executable, "-m", "effectlog", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    lines = done.stderr.strip().splitlines()
    assert (ExitStatus.BAD_INPUT, 1) == (done.returncode, len(lines)), done.stderr
    assert ["plan.json"] == sorted(p.name for p in tmp_path.iterdir())
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["run", "--journal", "", "plan.json"], "--journal"),
        (["run", "--journal", "j.db", "--effects", " ", "plan.json"], "--effects"),
        (["run", "--journal", "j.db", "--trace", "", "plan.json"], "--trace"),
        (["run", "--journal", "j.db", ""], "plan"),
        (["status", "--journal", ""], "--journal"),
        (["submit", "--store", "\t", "--scope", "s", "--key", "k", "plan.json"], "--store"),
    ],
    ids=["journal", "effects-blank", "trace", "plan", "status", "submit-store"],
)
def test_an_empty_location_is_bad_input_naming_its_flag_and_nothing_is_made(
    tmp_path: Path, argv: list[str], flag: str
) -> None:
    """Proves: exit 2, one line naming the flag, no traceback, and no file made in the directory."""
    line = refusal(tmp_path, argv)
    assert (True, True) == (f"argument {flag}: " in line, "is empty" in line), line


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["run", "--journal", "j.db/", "plan.json"], "--journal"),
        (["run", "--journal", "j.db", "--effects", "fx.db/", "plan.json"], "--effects"),
        (["run", "--journal", "j.db", "--trace", "t.log/", "plan.json"], "--trace"),
        (["effects", "--effects", "fx.db/"], "--effects"),
        (["status", "--journal", "j.db/"], "--journal"),
        (["submit", "--store", "fleet.db/", "--scope", "s", "--key", "k", "plan.json"], "--store"),
    ],
    ids=["journal", "effects", "trace", "effects-cmd", "status", "submit-store"],
)
def test_a_file_location_ending_in_a_slash_is_bad_input_naming_its_flag_and_nothing_is_made(
    tmp_path: Path, argv: list[str], flag: str
) -> None:
    """``--effects fx.db/`` (a shell's completion of a directory, a variable with a slash appended) names a
    directory, not a file: ``run`` ended in a traceback (``IsADirectoryError``, exit 1) after making the
    journal, while ``--journal j.db/`` quietly made and used ``j.db``, and ``effects --effects fx.db/`` said
    there was no store there. Proves: every file flag refuses it the same way, exit 2, one line naming the
    flag, no traceback, and no file made in the directory."""
    line = refusal(tmp_path, argv)
    assert (True, True) == (f"argument {flag}: " in line, "names a directory" in line), line


def test_an_effect_store_path_that_cannot_be_created_is_a_storage_error_not_a_traceback(tmp_path: Path) -> None:
    """The API's twin: ``Runtime(effects="fx.db/")`` (or a store whose name is taken by a directory's
    trailing slash) raised ``IsADirectoryError`` out of the run; the journal already says "cannot create
    the journal". Proves: the run raises effectlog's ``StorageError`` naming the store, and the run has
    not started (no ``run.started`` in the journal)."""
    from effectlog.errors import StorageError
    from effectlog.journal import SqliteJournal
    from effectlog.plan import parse_plan
    from effectlog.runtime import Runtime

    plan = {"run_id": "r1", "adapters": {"n": {"type": "noop"}}, "steps": [{"id": "a", "adapter": "n"}]}
    plan = parse_plan(json.dumps(plan).encode())
    with SqliteJournal(tmp_path / "j.db") as journal, Runtime(journal, effects=str(tmp_path / "fx.db") + "/") as rt:
        with pytest.raises(StorageError) as caught:
            rt.run(plan)
        assert ("cannot create the effect store" in str(caught.value), []) == (
            True,
            list(journal.read("r1")),
        )
