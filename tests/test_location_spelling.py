"""A new file location whose name is another spelling of a file already there (``jé.db`` composed, NFC,
against ``jé.db`` decomposed, NFD: ``e`` and a combining accent), or whose name begins or ends with an
invisible format character (a byte-order mark from a location read out of a file Notepad saved, a zero-width
space pasted from a web page), is bad input, before anything is made.

Linux keeps a file name as the bytes it is given, so the two spellings of ``jé.db`` are two files that every
listing, terminal and message shows alike. A journal made under one and the same run given later under the
other (a script written on macOS, a name pasted from another program) found a second, empty journal and
ran every step again: a non-idempotent effect made twice, as ``j.db `` did (tests/test_location_whitespace.py).
A file of either spelling already there opens as before: its runs are not stranded.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import unicodedata
from pathlib import Path

import pytest

from effectlog.errors import ExitStatus, LocationAmbiguous
from hardening_kit import NOOP_PLAN, effectlog, refused_by_every_opener

NFC = unicodedata.normalize("NFC", "jé.db")
NFD = unicodedata.normalize("NFD", "jé.db")

# One non-idempotent step over the effect store: each time it runs, the ledger gets a row.
PLAN = {
    "run_id": "pay-1",
    "adapters": {"bank": {"type": "effects.control", "version": "1", "idempotent": False}},
    "steps": [{"id": "pay", "adapter": "bank", "args": {"n": 1}}],
}


def cli(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``effectlog ARGV`` in ``cwd`` beside ``PLAN`` as ``plan.json`` and ``NOOP_PLAN`` as ``noop.json``."""
    (cwd / "plan.json").write_text(json.dumps(PLAN))
    (cwd / "noop.json").write_text(json.dumps(NOOP_PLAN))
    return effectlog(*argv, cwd=cwd)


def effects_made(cwd: Path, store: str = "fx.db") -> int:
    with sqlite3.connect(cwd / store) as db:
        return int(db.execute("SELECT count(*) FROM effects").fetchone()[0])


@pytest.mark.parametrize(("first", "second"), [(NFC, NFD), (NFD, NFC)], ids=["nfc-then-nfd", "nfd-then-nfc"])
def test_the_same_run_under_two_spellings_of_one_journal_name_makes_its_effect_once(
    tmp_path: Path, first: str, second: str
) -> None:
    """The duplicate: the run under one spelling, then under the other. Proves: the second is exit 2, one
    line naming the file already there, nothing made, and the effect was made once."""
    done = cli(tmp_path, "run", "--journal", first, "--effects", "fx.db", "--quiet", "plan.json")
    assert 0 == done.returncode, done.stderr
    before = sorted(p.name for p in tmp_path.iterdir())
    again = cli(tmp_path, "run", "--journal", second, "--effects", "fx.db", "--quiet", "plan.json")
    lines = again.stderr.strip().splitlines()
    assert (ExitStatus.BAD_INPUT, 1) == (again.returncode, len(lines)), again.stderr
    assert "spelling" in lines[0], lines[0]
    assert repr(first) in lines[0], lines[0]
    assert before == sorted(p.name for p in tmp_path.iterdir())
    assert 1 == effects_made(tmp_path)


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--journal", "j.db", "--effects", NFD, "plan.json"],
        ["submit", "--store", NFD, "--scope", "s", "--key", "k", "plan.json"],
    ],
    ids=["effects", "store"],
)
def test_an_effect_store_or_fleet_store_under_another_spelling_is_refused_before_anything_is_made(
    tmp_path: Path, argv: list[str]
) -> None:
    """The effect store and the fleet store are SQLite files effectlog makes when missing, as the journal.
    Proves: exit 2, one line, and nothing made (not even the journal the same command would have made)."""
    sqlite3.connect(tmp_path / NFC).close()
    before = [NFC, "noop.json", "plan.json"]
    done = cli(tmp_path, *argv)
    lines = done.stderr.strip().splitlines()
    assert (ExitStatus.BAD_INPUT, 1) == (done.returncode, len(lines)), done.stderr
    assert "spelling" in lines[0], lines[0]
    assert repr(NFC) in lines[0], lines[0]
    assert sorted(before) == sorted(p.name for p in tmp_path.iterdir())


@pytest.mark.parametrize(
    "name",
    ["\ufeffj.db", "j.db\u200b", "\u2060j.db"],
    ids=["byte-order-mark", "zero-width-space", "word-joiner"],
)
def test_a_new_location_with_an_invisible_edge_is_bad_input(tmp_path: Path, name: str) -> None:
    """A location read from a file saved with a byte-order mark (``--journal "$(cat where.txt)"``), or pasted
    with a zero-width character, is ``j.db`` to every eye and another file to the kernel. Proves: exit 2,
    one line, nothing made."""
    done = cli(tmp_path, "run", "--journal", name, "--quiet", "noop.json")
    lines = done.stderr.strip().splitlines()
    assert (ExitStatus.BAD_INPUT, 1) == (done.returncode, len(lines)), done.stderr
    assert "invisible" in lines[0], lines[0]
    assert ["noop.json", "plan.json"] == sorted(p.name for p in tmp_path.iterdir())


def test_the_api_refuses_a_new_location_spelled_as_another_file_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Runtime``, ``durable.run`` and an effect store given the other spelling of a file already there (or an
    invisible edge), relative or absolute, raise ``LocationAmbiguous`` (exit 2's error), and nothing is made."""
    monkeypatch.chdir(tmp_path)
    sqlite3.connect(tmp_path / NFC).close()
    for location in (NFD, str(tmp_path / NFD), tmp_path / NFD, "\ufeffj.db"):
        refused_by_every_opener(location, LocationAmbiguous)
    assert [NFC] == [p.name for p in tmp_path.iterdir()]


def test_either_spelling_already_there_opens_as_before(tmp_path: Path) -> None:
    """Two files of the two spellings made before this check: each opens under its own name, with its runs."""
    from effectlog.journal import SqliteJournal

    for name in (NFC, NFD):
        sqlite3.connect(tmp_path / name).close()
    for name in (NFC, NFD):
        with SqliteJournal(tmp_path / name) as journal:
            assert [] == list(journal.read("r1"))
    done = cli(tmp_path, "run", "--journal", NFD, "--effects", "fx.db", "--quiet", "plan.json")
    assert 0 == done.returncode, done.stderr


def test_a_new_name_of_its_own_is_made_whatever_its_spelling(tmp_path: Path) -> None:
    """The check is about another file there, not about the spelling: a decomposed name with no twin, and a
    name with a zero-width joiner inside it (as some scripts and emoji need), are made and used."""
    for name in (NFD, "a\u200db.db"):
        done = cli(tmp_path, "run", "--journal", name, "--quiet", "noop.json")
        assert 0 == done.returncode, done.stderr
        assert (tmp_path / name).is_file()
