"""The README's promises: its Python examples run as written, its exit-status table is the code's."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from effectlog.errors import ExitStatus

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_examples_run_as_written(tmp_path: Path, index: int) -> None:
    """Each ```python block in the README runs from a fresh directory holding examples/, twice (resume)."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    script = tmp_path / "example.py"
    script.write_text(BLOCKS[index])
    outputs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120, check=False)
        assert 0 == done.returncode, done.stderr
        outputs.append(done.stdout)
    assert outputs[0].strip()


def test_quick_start_has_exactly_the_two_set_up_commands() -> None:
    """The quick start's set-up block is `make crash-matrix` and `make test`, nothing else."""
    section = README.split("## Quick start", 1)[1].split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in section.strip().splitlines()]
    assert ["make crash-matrix", "make test"] == commands


def test_exit_status_table_matches_the_code() -> None:
    """Every exit status in the README's table is an ExitStatus value, and every value is documented."""
    table = README.split("Exit statuses", 1)[1]
    documented = {int(n) for n in re.findall(r"^\| (\d+) \|", table, re.M)}
    assert {int(s) for s in ExitStatus} == documented
