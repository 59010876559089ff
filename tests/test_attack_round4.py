"""Round-4 attacks where the user's world touches ours (aliases and second writers, second actors,
keys, evidence, misbehaving tools, stored bytes outside the chain): each test is one suspicion, a
failing reproduction first where it found a defect, kept as a regression test where it found none.
Real SQLite files, real processes (``os.fork`` in a child interpreter, never in pytest's own)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path


def python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by a fresh interpreter (this tree's sources through the inherited PYTHONPATH)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, timeout=120
    )


# -- 2. second actors: a child of fork() -------------------------------------------------------

_FORK_SCRIPT = """
    import json, os, subprocess, sys
    from effectlog.errors import EffectlogError
    from effectlog.journal import SqliteJournal

    where = sys.argv[1]
    journal = SqliteJournal(where)  # opened before fork(): the child inherits its descriptor

    def attempt(claim):
        try:
            claim()
            return "claimed"
        except EffectlogError as exc:
            return exc.code

    go, child_said = os.pipe()
    done, parent_said = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child drives run r with what it has: the inherited journal, else its own
        said = {"inherited": attempt(lambda: journal.claim("r"))}
        if said["inherited"] != "claimed":
            said["own"] = attempt(lambda: SqliteJournal(where).claim("r"))
        os.write(child_said, json.dumps(said).encode() + b"\\n")
        os.read(done, 1)  # holds what it claimed until the parent has tried
        os._exit(0)
    child = json.loads(os.read(go, 1000))
    parent = attempt(lambda: journal.claim("r"))
    outsider = subprocess.run(
        [sys.executable, "-c", "import sys; from effectlog.journal import SqliteJournal; "
         "from effectlog.errors import RunOwned\\n"
         "try:\\n SqliteJournal(sys.argv[1]).claim('r'); print('claimed')\\n"
         "except RunOwned as e: print(e.code)", where],
        capture_output=True, text=True).stdout.strip()
    os.write(parent_said, b"x")
    os.waitpid(pid, 0)
    print(json.dumps({"child": child, "parent": parent, "outsider": outsider}))
"""


def test_a_forked_child_and_its_parent_never_both_own_one_run(tmp_path: Path) -> None:
    """A process that opened a journal and then forked (a pre-forking server, a multiprocessing pool)
    shares its open file description, and so every OFD lock taken through it, with the child: a run
    the child claimed through the inherited journal was claimed again by the parent at once (two live
    owners of one run, G9 broken; the parent's release would even drop the child's lock, letting a
    third process in). Proves: the inherited journal refuses to claim in the child (exit 6, naming the
    fork), the child's own journal claims the run, and while it holds it neither the parent nor any
    other process can."""
    proc = python(_FORK_SCRIPT, str(tmp_path / "j.db"))
    assert "" == proc.stderr
    said = json.loads(proc.stdout)
    expected = {
        "child": {"inherited": "journal_inherited", "own": "claimed"},
        "parent": "run_owned",
        "outsider": "run_owned",
    }
    assert expected == said
