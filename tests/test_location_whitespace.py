"""A file location whose name begins or ends with whitespace (``--journal "j.db "``, a location read from a
file or an environment variable with its newline, ``Runtime("j.db\\n")``) is bad input when no such file is
there yet, before anything is made.

A name's edge whitespace is invisible in every listing and message, and it is what a pasted or read-in
location carries by mistake: ``j.db `` was made and used as a journal, and the same run given later as
``j.db`` (what the user meant) found a second, empty journal and ran every step again, as ``file:j.db`` did
(tests/test_url_locations.py). A file of such a name that is already there is opened as before: its runs are
not stranded.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from effectlog.errors import ExitStatus, LocationAmbiguous
from hardening_kit import effectlog_beside_plan, refused_by_every_opener


def cli(tmp_path: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return effectlog_beside_plan(tmp_path, *argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--journal", "j.db ", "plan.json"],
        ["run", "--journal", " j.db", "plan.json"],
        ["run", "--journal", "j.db\n", "plan.json"],
        ["run", "--journal", "j.db", "--effects", "fx.db\t", "plan.json"],
        ["submit", "--store", "fleet.db ", "--scope", "s", "--key", "k", "plan.json"],
    ],
    ids=["trailing-space", "leading-space", "newline", "effects", "store"],
)
def test_a_new_location_with_edge_whitespace_is_bad_input_and_nothing_is_made(tmp_path: Path, argv: list[str]) -> None:
    """Proves: exit 2, one line naming the location as given (its whitespace shown), and no file made."""
    done = cli(tmp_path, argv)
    lines = done.stderr.strip().splitlines()
    assert (ExitStatus.BAD_INPUT, 1) == (done.returncode, len(lines)), done.stderr
    assert "whitespace" in lines[0], lines[0]
    assert ["plan.json"] == sorted(p.name for p in tmp_path.iterdir())


def test_the_same_run_under_a_pasted_location_and_the_path_is_never_two_journals(tmp_path: Path) -> None:
    """The duplicate it caused: ``j.db `` then ``j.db``. Proves: the first is refused with nothing made, so
    the second is the run's only journal."""
    first = cli(tmp_path, ["run", "--journal", "j.db ", "--quiet", "plan.json"])
    second = cli(tmp_path, ["run", "--journal", "j.db", "--quiet", "plan.json"])
    assert (ExitStatus.BAD_INPUT, 0) == (first.returncode, second.returncode), first.stderr + second.stderr
    assert ["j.db", "plan.json"] == sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("j.db-"))


def test_the_api_refuses_a_new_location_with_edge_whitespace_made_absolute_or_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Runtime``, ``durable.run`` and an effect store given a name read with its newline raise
    ``LocationAmbiguous`` (exit 2's error), also when the text was made absolute first (the fleet runner and
    the integrations do), and nothing is made."""
    monkeypatch.chdir(tmp_path)
    for location in ("j.db\n", " j.db", str(tmp_path / " j.db"), tmp_path / "j.db "):
        refused_by_every_opener(location, LocationAmbiguous)
    assert [] == list(tmp_path.iterdir())


def test_a_file_of_such_a_name_already_there_is_opened_as_before(tmp_path: Path) -> None:
    """A journal made under such a name before this check is not stranded: it opens, and its run is there."""
    import sqlite3

    from effectlog.journal import SqliteJournal

    name = tmp_path / "j.db "
    sqlite3.connect(name).close()  # an empty file SQLite made: effectlog makes its schema in it
    with SqliteJournal(name) as journal:
        assert [] == list(journal.read("r1"))
    done = cli(tmp_path, ["run", "--journal", "j.db ", "--quiet", "plan.json"])
    assert 0 == done.returncode, done.stderr


def test_an_empty_location_from_the_api_is_said_to_be_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Runtime("")`` (an unset variable's text) said the path "reaches the journal through a link whose text
    names another file (<the working directory>), as /proc/PID/root ... do": a message about another thing.
    Proves: the error (exit 2's) says it is empty, for a journal and an effect store, and nothing is made."""
    from effectlog.adapters import EffectStore
    from effectlog.errors import BadInput
    from effectlog.runtime import Runtime

    monkeypatch.chdir(tmp_path)
    for open_it in (Runtime, EffectStore):
        with pytest.raises(BadInput, match="is empty, not a location") as info:
            open_it("")
        assert "/proc" not in info.value.message
    assert [] == list(tmp_path.iterdir())
