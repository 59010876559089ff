"""A file location written as a URL or a SQLite URI (``--journal file:j.db``, ``sqlite:///tmp/j.db``,
``file:///tmp/j.db``) is refused as bad input, before anything is made.

SQLite reads ``file:`` as a URI only when asked to; effectlog opens a file by its path. So ``--journal
file:j.db`` quietly made and used a file named ``file:j.db`` in the working directory, and the same run
given later as ``--journal j.db`` (what the user meant) found a second, empty journal and ran every step
again: an effect twice, with both journals verifying. ``sqlite:///...`` and ``file:///...`` failed with
"cannot create the journal (No such file or directory)" naming a path nobody wrote. A file of such a name
is still reachable as ``./NAME``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from effectlog.errors import ExitStatus, LocationAmbiguous
from hardening_kit import NOOP_PLAN, effectlog_beside_plan


def cli(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return effectlog_beside_plan(tmp_path, *argv)


@pytest.mark.parametrize(
    ("argv", "location"),
    [
        (["run", "--journal", "file:j.db", "plan.json"], "file:j.db"),
        (["run", "--journal", "FILE:j.db", "plan.json"], "FILE:j.db"),
        (["run", "--journal", "file:///TMP/j.db", "plan.json"], "file:///TMP/j.db"),
        (["run", "--journal", "sqlite:///j.db", "plan.json"], "sqlite:///j.db"),
        (["run", "--journal", "mysql://u:hunter2@h/db", "plan.json"], "mysql://u:***@h/db"),
        (["run", "--journal", "j.db", "--effects", "file:fx.db", "plan.json"], "file:fx.db"),
        (["run", "--journal", "j.db", "--trace", "file:t.log", "plan.json"], "file:t.log"),
        (["status", "--journal", "file:j.db"], "file:j.db"),
        (["submit", "--store", "file:fleet.db", "--scope", "s", "--key", "k", "plan.json"], "file:fleet.db"),
    ],
    ids=["file-uri", "file-upper", "file-url", "sqlite-url", "other-scheme", "effects", "trace", "status", "store"],
)
def test_a_location_written_as_a_url_is_bad_input_and_nothing_is_made(
    tmp_path: Path, argv: list[str], location: str
) -> None:
    """Proves: exit 2, one line naming the location (a password in it masked), no traceback, and no
    file made beside the plan (before, ``file:j.db`` was made and used as a journal)."""
    done = cli(tmp_path, argv)
    lines = done.stderr.strip().splitlines()
    assert (ExitStatus.BAD_INPUT, 1) == (done.returncode, len(lines)), done.stderr
    assert ["plan.json"] == sorted(p.name for p in tmp_path.iterdir())
    assert (True, True, False) == (location in lines[0], "./" in lines[0], "hunter2" in lines[0]), lines[0]


def test_a_file_of_such_a_name_is_reached_as_dot_slash_name(tmp_path: Path) -> None:
    """The escape the message names works: ``./file:j.db`` is that file, and the run completes in it."""
    done = cli(tmp_path, ["run", "--journal", "./file:j.db", "--quiet", "plan.json"])
    assert (0, True) == (done.returncode, (tmp_path / "file:j.db").is_file()), done.stderr


def test_the_same_run_under_the_uri_and_the_path_is_never_two_journals(tmp_path: Path) -> None:
    """The duplicate it caused: ``file:j.db`` then ``j.db``. Proves: the first is refused with nothing made,
    so the second is the run's only journal and its step ran once."""
    first = cli(tmp_path, ["run", "--journal", "file:j.db", "--quiet", "plan.json"])
    second = cli(tmp_path, ["run", "--journal", "j.db", "--json", "plan.json"])
    assert (ExitStatus.BAD_INPUT, 0) == (first.returncode, second.returncode), first.stderr + second.stderr
    assert ["j.db", "plan.json"] == sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("j.db-"))


@pytest.mark.parametrize("location", ["file:j.db", "sqlite:///j.db", "file:///tmp/j.db"])
def test_the_api_refuses_a_url_journal_or_effect_store_before_making_it(
    tmp_path: Path, location: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SqliteJournal``, ``Runtime`` and ``durable.run`` take the same text: each raises
    ``LocationAmbiguous`` (exit 2's error), and nothing is made in the working directory."""
    from effectlog import durable
    from effectlog.journal import SqliteJournal
    from effectlog.runtime import Runtime

    monkeypatch.chdir(tmp_path)
    with pytest.raises(LocationAmbiguous):
        SqliteJournal(location)
    with pytest.raises(LocationAmbiguous):
        Runtime(location)
    with pytest.raises(LocationAmbiguous), durable.run("r1", journal=location):
        pass
    with SqliteJournal(tmp_path / "j.db") as journal, Runtime(journal, effects=location) as rt:
        from effectlog.plan import parse_plan

        with pytest.raises(LocationAmbiguous):
            rt.run(parse_plan(json.dumps({**NOOP_PLAN, "adapters": {"n": {"type": "effects.control"}}}).encode()))
        assert [] == list(journal.read("r1"))
    assert ["j.db"] == sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("j.db-"))


def test_a_durable_agents_journal_given_as_a_uri_is_not_made_absolute_into_a_path() -> None:
    """Framework integrations make a relative journal path absolute once (a tool may change the working
    directory). ``file:j.db`` made absolute became ``/cwd/file:j.db``, a path the open no longer refuses.
    Proves: the text is kept as given, so the open refuses it."""
    from effectlog.integrations.framework_steps import fixed_location

    assert ("file:j.db", "sqlite:///j.db") == (fixed_location("file:j.db"), fixed_location("sqlite:///j.db"))


@pytest.mark.parametrize("trace", ["file:t.jsonl", "sqlite:///t.jsonl", "t.jsonl\n", ""])
def test_the_api_refuses_a_url_or_whitespace_edged_trace_before_making_anything(
    tmp_path: Path, trace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Runtime(trace=...)`` takes the trace's location as the CLI's ``--trace`` does. Before, the CLI
    refused ``file:t.jsonl`` and the API made a trace file of that name. Proves: the API raises
    ``LocationAmbiguous`` (or ``BadInput`` for the empty text), before the journal is made: nothing at all
    is in the working directory."""
    from effectlog.errors import BadInput
    from effectlog.runtime import Runtime

    monkeypatch.chdir(tmp_path)
    with pytest.raises(BadInput) as refused:
        Runtime("j.db", trace=trace)
    assert (True, []) == ("trace" in str(refused.value), sorted(p.name for p in tmp_path.iterdir()))


def test_a_path_object_reaches_a_file_of_such_a_name_by_its_absolute_path(tmp_path: Path) -> None:
    """``Path("./file:j.db")`` is ``file:j.db`` once made text, so the ``./NAME`` advice does not reach
    such a file from the API. Proves: the refusal also names an absolute path as the way, and that way
    opens the file."""
    from effectlog.runtime import Runtime

    with pytest.raises(LocationAmbiguous) as refused:
        Runtime(Path("./file:j.db"))
    with Runtime(tmp_path / "file:j.db"):
        pass
    assert (True, True) == ("absolute path" in str(refused.value), (tmp_path / "file:j.db").is_file())
