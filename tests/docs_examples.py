"""Find and run the fenced examples of README.md and docs/*.md, as a reader would type them.

What counts as an example:

* a ```python block: written to a file and run with this interpreter; when its first line
  is a comment naming a file (``# my_tools.py``) it is also saved under that name, so
  later examples can import it;
* a ```sh (``bash``, ``shell``, ``console``) block, or an unlabelled block whose every
  line is a command (``effectlog ...``, ``make ...``, ``python ...``, ``mkdir ...``): each
  command runs in ``bash``; a trailing ``# exit N`` comment says the status it must end
  with, otherwise 0.

Everything else (JSON, TOML, mermaid, sample output, diagrams) is not an example.

Examples of one file run in order in one fresh directory holding a copy of
``examples/``, as a reader follows a page; running block *k* first runs blocks 1..k-1
there. ``effectlog`` is the CLI under test, started like an installed script (the
current directory is not on ``sys.path`` unless the CLI puts it there).

Markers, HTML comments the page does not show:

* ``<!-- docs-test: skip REASON -->`` on the line before a fence: the example is
  reported as skipped with REASON (a server, a long run, a placeholder). A marker that
  does not precede a fence, or has no reason, is itself an error;
* ``<!-- docs-test: file NAME`` ... ``-->``: a file the following examples need
  (``plan.json`` for a command that takes one), written when the page reaches it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 180

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
_SKIP = re.compile(r"<!--\s*docs-test:\s*skip\b(?P<reason>.*?)-->")
_FILE = re.compile(r"<!--\s*docs-test:\s*file\s+(?P<name>[^\s]+)[ \t]*\n(?P<body>.*?)-->", re.S)
_SHELL_INFO = {"sh", "bash", "shell", "console"}
_PYTHON_INFO = {"python", "py", "python3"}
_COMMAND = re.compile(r"^(effectlog|make|python|mkdir|cd|export|\.venv/bin/effectlog)(\s|$)")
_EXIT = re.compile(r"#\s*exit\s+(\d+)")


@dataclass(frozen=True)
class Example:
    page: str  # path relative to the repository root
    line: int  # the line of the opening fence
    kind: str  # "python", "shell" or "file"
    body: str
    skip: str | None = None  # the marker's reason
    name: str = ""  # for "file": where to write it

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def _kind(info: str, body: str) -> str | None:
    word = info.strip().split(" ")[0].lower() if info.strip() else ""
    if word in _PYTHON_INFO:
        return "python"
    if word in _SHELL_INFO:
        return "shell"
    if word:
        return None
    commands = _commands(body)
    if commands and all(_COMMAND.match(c) for c in commands):
        return "shell"
    return None


def _commands(body: str) -> list[str]:
    """The commands of a shell block: continuation lines joined, blanks and comment lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def examples(page: Path) -> tuple[list[Example], list[str]]:
    """The page's examples and setup files in order, and any misplaced markers (as errors)."""
    text = page.read_text()
    rel = str(page.relative_to(ROOT))
    found: list[tuple[int, Example]] = []
    used_skips: set[int] = set()
    for m in _FENCE.finditer(text):
        body = textwrap.dedent(m.group("body"))
        kind = _kind(m.group("info"), body)
        if kind is None:
            continue
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip().splitlines()
        skip = None
        if before:
            marker = _SKIP.search(before[-1])
            if marker is not None:
                skip = marker.group("reason").strip() or "(no reason given)"
                used_skips.add(text.rfind("<!--", 0, m.start()))
        found.append((m.start(), Example(page=rel, line=line, kind=kind, body=body, skip=skip)))
    for m in _FILE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        found.append((m.start(), Example(page=rel, line=line, kind="file", body=m.group("body"), name=m.group("name"))))
    errors = [
        f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: a docs-test skip marker must be on the line before a fence"
        " of an example"
        for m in _SKIP.finditer(text)
        if m.start() not in used_skips
    ]
    errors += [
        f"{rel}:{text.count(chr(10), 0, m.start()) + 1}: a docs-test skip marker needs a reason"
        for m in _SKIP.finditer(text)
        if not m.group("reason").strip()
    ]
    return [e for _, e in sorted(found, key=lambda pair: pair[0])], errors


def all_examples() -> list[Example]:
    return [e for page in PAGES for e in examples(page)[0]]


def marker_errors() -> list[str]:
    return [err for page in PAGES for err in examples(page)[1]]


def workdir(base: Path) -> tuple[Path, dict[str, str]]:
    """A fresh reader's directory (a copy of examples/) and the environment its commands run in."""
    work = base / "reader"
    shutil.copytree(ROOT / "examples", work / "examples")
    bin_dir = base / "bin"
    bin_dir.mkdir()
    # `effectlog` as an installed script starts it: -P keeps the current directory off sys.path.
    (bin_dir / "effectlog").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -P -m effectlog "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("EFFECTLOG_JOURNAL_KEY", None)
    return work, env


def run(example: Example, work: Path, env: dict[str, str]) -> str | None:
    """Run one example in ``work``; ``None`` when it behaved as written, else what went wrong."""
    if example.kind == "file":
        (work / example.name).write_text(example.body)
        return None
    if example.kind == "python":
        first = example.body.lstrip().splitlines()[0] if example.body.strip() else ""
        named = re.fullmatch(r"#\s*([\w.-]+\.py)\s*", first)
        if named:
            (work / named.group(1)).write_text(example.body)
        script = work.parent / f"example-{example.line}.py"
        script.write_text(example.body)
        done = _call([sys.executable, str(script)], work, env)
        if done.returncode != 0:
            return f"python example exited {done.returncode}: {_tail(done.stderr)}"
        return None
    for command in _commands(example.body):
        wanted = _EXIT.search(command)
        expected = int(wanted.group(1)) if wanted else 0
        done = _call(["bash", "-c", command], work, env)
        if done.returncode != expected:
            return f"`{command}` exited {done.returncode}, expected {expected}: {_tail(done.stderr or done.stdout)}"
    return None


def _call(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, -1, "", f"did not finish within {TIMEOUT_S}s")


def _tail(text: str, lines: int = 8) -> str:
    return " | ".join(text.strip().splitlines()[-lines:]) or "(no output)"
