"""A journal, fleet store or effect store given as a file that is not SQLite (``--journal notes.txt``,
``--store plan.json``: one argument too far in a command line) is refused before SQLite opens it, so
nothing is made beside it.

``run``, ``submit`` and ``runner`` said ``journal_unreadable`` but SQLite had already put the file in WAL
mode's way and left an empty ``notes.txt-wal`` beside it: bad input that changed the directory. The check
is in the one place every effectlog SQLite file passes before SQLite opens it (``sidecars.refuse_clash``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from effectlog.errors import BadInput, ExitStatus
from hardening_kit import effectlog_beside_plan

TEXT = b"meeting notes\n"


def _listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "plan.json", "--journal", "notes.txt"],
        ["run", "plan.json", "--journal", "notes.txt", "--effects", "fx.db"],
        ["submit", "plan.json", "--store", "notes.txt", "--scope", "s", "--key", "k"],
        ["runner", "--store", "notes.txt", "--exit-when-idle"],
        ["status", "--journal", "notes.txt"],
        ["verify", "--journal", "notes.txt"],
    ],
    ids=["run", "run-with-effects", "submit", "runner", "status", "verify"],
)
def test_a_text_file_given_as_a_database_is_refused_and_nothing_is_made_beside_it(
    tmp_path: Path, argv: list[str]
) -> None:
    """Proves: exit 2, one line naming the file, and the directory byte for byte as it was (the text file
    untouched, no ``-wal``/``-shm`` beside it, no other store made)."""
    (tmp_path / "notes.txt").write_bytes(TEXT)
    done = effectlog_beside_plan(tmp_path, *argv)
    before = {"notes.txt": TEXT, "plan.json": (tmp_path / "plan.json").read_bytes()}
    lines = done.stderr.strip().splitlines()
    assert (ExitStatus.BAD_INPUT, 1) == (done.returncode, len(lines)), done.stderr
    assert (True, before) == ("notes.txt" in lines[0], _listing(tmp_path)), lines[0]


def test_the_api_refuses_a_text_file_as_a_journal_store_or_effect_store(tmp_path: Path) -> None:
    """Proves: ``SqliteJournal``, the SQLite fleet store and ``EffectStore`` raise ``BadInput`` and leave
    the file alone with nothing beside it."""
    from effectlog.adapters.effects import EffectStore
    from effectlog.fleet import open_store
    from effectlog.journal import SqliteJournal

    notes = tmp_path / "notes.txt"
    notes.write_bytes(TEXT)
    for opener in (SqliteJournal, open_store, EffectStore):
        with pytest.raises(BadInput):
            opener(str(notes))
        assert {"notes.txt": TEXT} == _listing(tmp_path), opener
