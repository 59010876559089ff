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
    plan = {"run_id": "r1", "adapters": {"n": {"type": "noop"}}, "steps": [{"id": "a", "adapter": "n"}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    done = subprocess.run(
        [sys.executable, "-m", "effectlog", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    lines = done.stderr.strip().splitlines()
    assert (ExitStatus.BAD_INPUT, 1) == (done.returncode, len(lines)), done.stderr
    assert (True, True) == (f"argument {flag}: " in lines[0], "is empty" in lines[0]), lines[0]
    assert ["plan.json"] == sorted(p.name for p in tmp_path.iterdir())
