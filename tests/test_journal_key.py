"""The journal's HMAC key: one spelling of a key is one key, a key that is set must be a key, and a
journal opened with another key than its own is refused before anything is read or written.

* ``EFFECTLOG_JOURNAL_KEY`` and ``--key-file`` are normalised the same way (surrounding ASCII
  whitespace removed, in ``chain_from_env``): ``key\\n`` in the environment was another key than the
  same line in a file, so ``verify`` reported tampering.
* ``EFFECTLOG_JOURNAL_KEY`` set but empty (``=$(cat missing-file)``) was taken for "no key": a writer
  created an unkeyed journal. It is bad input (exit 2), as an empty ``--key-file`` is.
* A keyed journal opened with a different key: ``verify`` reported ``chain_broken`` (exit 7), telling the
  operator the journal was altered, and a writer appended new runs chained with the wrong key, which the
  right key can then never verify. A keyed journal records its key's fingerprint
  (``HMAC-SHA256(key, label)``, never the key) and every open checks it (``wrong_key``, exit 2); a journal
  from before the fingerprint is checked against its last event's chain link.
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from effectlog import events as ev
from effectlog.chain import GENESIS, Chain
from effectlog.errors import BadInput, ExitStatus, WrongKey
from effectlog.fleet import open_store
from effectlog.journal import SqliteJournal, chain_from_env, load_run, open_journal
from effectlog.plan import load_plan
from effectlog.runtime import Runtime
from hardening_kit import GOOD_PLAN, KEY, effectlog, run_good_plan, snapshot, sqlite_sidecar_or_lock
from journal_tamper import connect
from test_journal_layout_v2 import schema_version, to_v1

pytest_plugins = ["pg_fixture"]

WRONG = b"Tr0ub4dor&3"
T0 = 1_700_000_000_000_000_000


@pytest.fixture
def keyed(tmp_path: Path) -> Path:
    """A directory with journal.db, keyed with ``KEY`` and holding the completed run good-run, and the plan
    of another run (other.json) that a writer could start in it, and its own plan (good.json)."""
    run_good_plan(tmp_path / "journal.db", Chain(KEY))
    shutil.copy(GOOD_PLAN, tmp_path / "good.json")
    (tmp_path / "other.json").write_text(GOOD_PLAN.read_text().replace("good-run", "other-run"))
    return tmp_path


def forget_fingerprint(path: Path) -> None:
    """Make ``path`` a keyed journal as effectlog wrote it before the key fingerprint: no meta row."""
    db = connect(path, isolation_level=None)
    try:
        db.execute("DELETE FROM meta WHERE key = 'key_fingerprint'")
    finally:
        db.close()


def held(root: Path) -> dict[str, bytes | None]:
    """Every file under ``root`` with its bytes, but the sidecars an open leaves (lock, -shm, empty -wal)."""
    return {k: v for k, v in snapshot(root).items() if not sqlite_sidecar_or_lock(k, v)}


def meta(path: Path) -> dict[str, str]:
    db = connect(path)
    try:
        return dict(db.execute("SELECT key, value FROM meta").fetchall())
    finally:
        db.close()


# -- 1. one spelling ------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["{k}\n", "{k}\r\n", "  {k}  ", "\t{k}\n\n"])
def test_the_env_key_and_the_key_file_normalise_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str
) -> None:
    """A key spelled with surrounding whitespace is the same key from the environment as from a file,
    and the same as the bare key."""
    text = spelling.format(k=KEY.decode())
    (tmp_path / "k.key").write_text(text)
    monkeypatch.setenv("EFFECTLOG_JOURNAL_KEY", text)
    from_env = chain_from_env()
    monkeypatch.delenv("EFFECTLOG_JOURNAL_KEY")
    assert (KEY, KEY) == (from_env.key, chain_from_env(str(tmp_path / "k.key")).key)


def test_verify_with_the_env_key_and_a_trailing_newline_passes(keyed: Path) -> None:
    """``EFFECTLOG_JOURNAL_KEY="$(printf 'key\\n')"``-style spellings verify the journal the bare key wrote."""
    done = effectlog("verify", "--journal", "journal.db", cwd=keyed, env={"EFFECTLOG_JOURNAL_KEY": KEY.decode() + "\n"})
    assert (ExitStatus.DONE, "") == (done.returncode, done.stderr)


# -- 2. set but empty -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "   ", "\n"])
def test_an_env_key_set_but_empty_is_bad_input_and_creates_nothing(tmp_path: Path, value: str) -> None:
    """``EFFECTLOG_JOURNAL_KEY=$(cat missing-file)``: the writer refuses (exit 2, one line naming the
    variable) instead of creating an unkeyed journal."""
    shutil.copy(GOOD_PLAN, tmp_path / "good.json")
    done = effectlog("run", "good.json", "--journal", "journal.db", cwd=tmp_path, env={"EFFECTLOG_JOURNAL_KEY": value})
    assert ExitStatus.BAD_INPUT == done.returncode
    assert 1 == len(done.stderr.splitlines()), done.stderr
    assert "EFFECTLOG_JOURNAL_KEY is set but empty" in done.stderr
    assert ["good.json"] == sorted(p.name for p in tmp_path.iterdir())


def test_an_env_key_set_but_empty_is_refused_by_chain_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API path (sessions, framework steps) refuses it too; unset still means no key."""
    monkeypatch.setenv("EFFECTLOG_JOURNAL_KEY", " ")
    with pytest.raises(BadInput, match="EFFECTLOG_JOURNAL_KEY"):
        chain_from_env()
    monkeypatch.delenv("EFFECTLOG_JOURNAL_KEY")
    assert chain_from_env().key is None


# -- 3. the wrong key: the CLI --------------------------------------------------------------------

WRITERS = {
    "run-new": ("run", "other.json", "--journal", "journal.db"),
    "run-closed": ("run", "good.json", "--journal", "journal.db"),
    "reconcile": (
        "reconcile",
        "--journal",
        "journal.db",
        "--run-id",
        "good-run",
        "--step",
        "charge",
        "--outcome",
        "applied",
        "--evidence",
        "ledger row 7",
        "--operator",
        "ana",
    ),
    "approve": ("approve", "--journal", "journal.db", "--run-id", "good-run", "--step", "charge", "--by", "ana"),
}
READERS = {
    "verify": ("verify", "--journal", "journal.db"),
    "status": ("status", "--journal", "journal.db"),
    "timeline": ("timeline", "--journal", "journal.db", "--run-id", "good-run"),
    "head": ("head", "--journal", "journal.db", "--run-id", "good-run"),
}


@pytest.mark.parametrize("fingerprinted", [True, False], ids=["fingerprint", "before-fingerprint"])
@pytest.mark.parametrize("argv", [*WRITERS.values(), *READERS.values()], ids=[*WRITERS, *READERS])
def test_a_wrong_key_is_refused_as_bad_input_and_changes_nothing(
    keyed: Path, argv: tuple[str, ...], fingerprinted: bool
) -> None:
    """Every command, reader or writer, refuses a keyed journal opened with another key: exit 2,
    ``wrong_key``, one line naming the journal; not ``chain_broken`` (exit 7, which says the journal was
    altered), and no event appended under the wrong key (every byte of the directory as it was)."""
    if not fingerprinted:
        forget_fingerprint(keyed / "journal.db")
    before = held(keyed)
    done = effectlog(*argv, cwd=keyed, env={"EFFECTLOG_JOURNAL_KEY": WRONG.decode()})
    assert ExitStatus.BAD_INPUT == done.returncode, done.stderr
    assert 1 == len(done.stderr.splitlines()), done.stderr
    assert "wrong_key: journal.db: the key given is not this journal's key" in done.stderr
    assert before == held(keyed)


def test_an_edited_fingerprint_is_reported_as_an_edit_not_as_a_wrong_key(keyed: Path) -> None:
    """The meta row changed by hand while the key is right (it links the journal's last event): ``verify``
    says the row was changed (``chain_broken`` on ``meta.key_fingerprint``, exit 7), not "wrong key"."""
    db = connect(keyed / "journal.db", isolation_level=None)
    try:
        db.execute("UPDATE meta SET value = ? WHERE key = 'key_fingerprint'", (Chain(WRONG).fingerprint(),))
    finally:
        db.close()
    done = effectlog("verify", "--journal", "journal.db", cwd=keyed, env={"EFFECTLOG_JOURNAL_KEY": KEY.decode()})
    assert ExitStatus.INTEGRITY == done.returncode, done.stderr
    assert "chain_broken: journal.db: the journal's recorded key fingerprint (meta key_fingerprint) was changed" in (
        done.stderr
    )
    done = effectlog("verify", "--journal", "journal.db", cwd=keyed, env={"EFFECTLOG_JOURNAL_KEY": "third key"})
    assert (ExitStatus.BAD_INPUT, True) == (done.returncode, "wrong_key" in done.stderr)


def test_the_right_key_still_runs_and_verifies_a_journal_from_before_the_fingerprint(keyed: Path) -> None:
    """Compatibility: a journal without the fingerprint row opens with its key; its first writer records
    the fingerprint (one meta row, nothing else), and verify passes after."""
    forget_fingerprint(keyed / "journal.db")
    env = {"EFFECTLOG_JOURNAL_KEY": KEY.decode()}
    assert ExitStatus.DONE == effectlog("verify", "--journal", "journal.db", cwd=keyed, env=env).returncode
    assert "key_fingerprint" not in meta(keyed / "journal.db")  # a reader writes nothing
    assert ExitStatus.DONE == effectlog("run", "other.json", "--journal", "journal.db", cwd=keyed, env=env).returncode
    assert Chain(KEY).fingerprint() == meta(keyed / "journal.db")["key_fingerprint"]
    assert ExitStatus.DONE == effectlog("verify", "--journal", "journal.db", cwd=keyed, env=env).returncode


# -- 3. the wrong key: the API --------------------------------------------------------------------


def test_the_fingerprint_is_recorded_when_a_keyed_journal_is_created_and_is_not_the_key(tmp_path: Path) -> None:
    """The meta row holds HMAC-SHA256(key, label) in hex: it names the key without holding it. An unkeyed
    journal has none."""
    run_good_plan(tmp_path / "k.db", Chain(KEY))
    run_good_plan(tmp_path / "plain.db")
    stored = meta(tmp_path / "k.db")["key_fingerprint"]
    assert (64, False) == (len(stored), KEY.hex() in stored or KEY.decode() in stored)
    assert Chain(KEY).fingerprint() == stored != Chain(WRONG).fingerprint()
    assert "key_fingerprint" not in meta(tmp_path / "plain.db")


@pytest.mark.parametrize("writer", [True, False])
@pytest.mark.parametrize("fingerprinted", [True, False], ids=["fingerprint", "before-fingerprint"])
def test_the_runtime_api_refuses_a_wrong_key_at_open(keyed: Path, writer: bool, fingerprinted: bool) -> None:
    """``SqliteJournal(path, chain=Chain(other))`` raises ``WrongKey`` (exit 2) in its constructor, before
    a run is read or appended; the file is unchanged."""
    path = keyed / "journal.db"
    if not fingerprinted:
        forget_fingerprint(path)
    before = path.read_bytes(), (keyed / "journal.db-wal").read_bytes() if (keyed / "journal.db-wal").exists() else b""
    with pytest.raises(WrongKey, match=r"journal\.db: the key given is not") as caught:
        SqliteJournal(path, writer=writer, chain=Chain(WRONG))
    assert ExitStatus.BAD_INPUT == caught.value.exit_status
    wal = keyed / "journal.db-wal"
    assert before == (path.read_bytes(), wal.read_bytes() if wal.exists() else b"")


def test_an_empty_journal_from_before_the_fingerprint_takes_its_first_writers_key(tmp_path: Path) -> None:
    """A keyed journal with no events and no fingerprint has nothing to check a key against: its first
    writer records its key's fingerprint, and from then another key is refused."""
    path = tmp_path / "journal.db"
    SqliteJournal(path, chain=Chain(KEY)).close()
    forget_fingerprint(path)
    SqliteJournal(path, chain=Chain(KEY)).close()
    assert Chain(KEY).fingerprint() == meta(path)["key_fingerprint"]
    with pytest.raises(WrongKey):
        SqliteJournal(path, chain=Chain(WRONG))


def test_a_right_key_from_before_the_fingerprint_runs_through_the_runtime(keyed: Path) -> None:
    """The head check accepts the right key: a new run appends and replays under it."""
    forget_fingerprint(keyed / "journal.db")
    runtime = Runtime(SqliteJournal(keyed / "journal.db", chain=Chain(KEY)))
    try:
        assert "completed" == runtime.run(load_plan(keyed / "other.json")).state
        assert "completed" == load_run(runtime.journal, "good-run").state
    finally:
        runtime.close()


def test_a_keyed_v1_journal_is_checked_before_it_is_migrated(keyed: Path) -> None:
    """A schema v1 journal (before the fingerprint, too): a writer with the wrong key is refused before the
    migration (still v1, unchanged); with the right key a reader leaves it as it is and a writer migrates
    it and records the fingerprint in the migration's transaction."""
    path = keyed / "journal.db"
    forget_fingerprint(path)
    to_v1(path)
    before = held(keyed)
    with pytest.raises(WrongKey, match="run 'good-run' seq 8"):
        SqliteJournal(path, chain=Chain(WRONG))
    assert ("1", before) == (schema_version(path), held(keyed))
    SqliteJournal(path, writer=False, chain=Chain(KEY)).close()
    assert ("1", None) == (schema_version(path), meta(path).get("key_fingerprint"))
    journal = SqliteJournal(path, chain=Chain(KEY))
    try:
        assert "completed" == load_run(journal, "good-run").state
    finally:
        journal.close()
    assert ("2", Chain(KEY).fingerprint()) == (schema_version(path), meta(path)["key_fingerprint"])


def test_the_fleet_store_refuses_a_wrong_key(keyed: Path) -> None:
    """A fleet store wraps the journal: its chain is checked the same way, before any fleet table is made."""
    path = keyed / "journal.db"
    tables = set(r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master"))
    with pytest.raises(WrongKey):
        open_store(str(path), chain=Chain(WRONG))
    assert tables == set(r[0] for r in sqlite3.connect(path).execute("SELECT name FROM sqlite_master"))
    open_store(str(path), chain=Chain(KEY)).close()


# -- 3. the wrong key: PostgreSQL -----------------------------------------------------------------


def one_run(url: str, chain: Chain) -> None:
    journal = open_journal(url, chain=chain)
    try:
        journal.claim("r1")
        journal.append([ev.RunStarted(run_id="r1", seq=1, ts=T0, plan_digest="d")])
    finally:
        journal.close()


@pytest.fixture
def pg_keyed(pg_url: str) -> str:
    one_run(pg_url, Chain(KEY))
    return pg_url


def pg_meta(url: str) -> dict[str, str]:
    import psycopg

    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT key, value FROM effectlog.meta").fetchall())


@pytest.mark.postgres
@pytest.mark.parametrize("writer", [True, False])
@pytest.mark.parametrize("fingerprinted", [True, False], ids=["fingerprint", "before-fingerprint"])
def test_postgres_refuses_a_wrong_key_at_open(pg_keyed: str, writer: bool, fingerprinted: bool) -> None:
    """The PostgreSQL journal records and checks the fingerprint as SQLite's does (and its head link for a
    journal from before it): ``WrongKey`` at open, nothing appended."""
    import psycopg

    if not fingerprinted:
        with psycopg.connect(pg_keyed, autocommit=True) as conn:
            conn.execute("DELETE FROM effectlog.meta WHERE key = 'key_fingerprint'")
    else:
        assert Chain(KEY).fingerprint() == pg_meta(pg_keyed)["key_fingerprint"]
    with pytest.raises(WrongKey):
        open_journal(pg_keyed, writer=writer, chain=Chain(WRONG))
    with psycopg.connect(pg_keyed) as conn:
        assert [(1,)] == conn.execute("SELECT count(*) FROM effectlog.events").fetchall()
    journal = open_journal(pg_keyed, writer=writer, chain=Chain(KEY))
    try:
        assert 1 == journal.head("r1")[0]
        assert journal.head("r1")[1] == Chain(KEY).link(GENESIS, next(iter(journal.read("r1"))).body)
    finally:
        journal.close()
    assert ("key_fingerprint" in pg_meta(pg_keyed)) == (fingerprinted or writer)


@pytest.mark.postgres
def test_the_postgres_fleet_store_refuses_a_wrong_key(pg_keyed: str) -> None:
    """The PostgreSQL fleet store opens its journal first: a wrong key is refused there."""
    with pytest.raises(WrongKey):
        open_store(pg_keyed, chain=Chain(WRONG))
