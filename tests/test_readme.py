"""The README's promises: its Python examples run as written, its exit-status table is the code's."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from docs_examples import Example, all_examples, marker_errors, run, workdir
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
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
        )
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


# -- every page's examples -------------------------------------------------------------

EXAMPLES = all_examples()
RUNNABLE = [e for e in EXAMPLES if e.kind != "file"]


@pytest.mark.parametrize("example", RUNNABLE, ids=[f"{e.where}:{e.kind}" for e in RUNNABLE])
def test_docs_examples_run_as_written(tmp_path: Path, example: Example) -> None:
    """Each shell and Python example of README.md and docs/*.md runs as written (tests/docs_examples.py says how).

    It runs in a fresh directory after the earlier examples of its page; one marked
    ``<!-- docs-test: skip REASON -->`` is reported as skipped, with its page, line and reason.
    """
    if example.skip is not None:
        pytest.skip(f"{example.where}: docs-test skip marker: {example.skip}")
    work, env = workdir(tmp_path)
    for earlier in EXAMPLES:
        if earlier.page == example.page and earlier.line < example.line and earlier.skip is None:
            problem = run(earlier, work, env)
            if problem is not None:
                pytest.fail(f"{example.where}: an earlier example of the page failed first: {earlier.where}: {problem}")
    problem = run(example, work, env)
    assert problem is None, f"{example.where} ({example.kind} example): {problem}"


def test_docs_skip_markers_are_few_and_explained(capsys: pytest.CaptureFixture[str]) -> None:
    """Every skip marker sits on the line before an example's fence and gives its reason; most examples run.

    Prints the inventory: how many examples run, and each skipped one with its reason.
    """
    assert [] == marker_errors()
    skipped = [e for e in RUNNABLE if e.skip is not None]
    with capsys.disabled():
        sys.stdout.write(f"\ndocs examples: {len(RUNNABLE) - len(skipped)} run, {len(skipped)} skipped\n")
        for e in skipped:
            sys.stdout.write(f"  skipped {e.where}: {e.skip}\n")
    assert len(skipped) < len(RUNNABLE) / 2
