"""Round-10 attacks on the storage side and a run's ownership: aliases, second actors, journal files as
bad input and rows outside the chain, with cases nobody had tried. Each test is one suspicion, a failing
reproduction first where it found a defect, kept as a regression test where it found none. Real SQLite
files, real processes (``python -m effectlog``), real SIGSTOP/SIGKILL where they matter."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hardening_kit import GOOD_PLAN, cli_env, effectlog, one_line, respect_file_modes

pytest_plugins = ["pg_fixture"]


def _state(journal: Path | str, run_id: str, cwd: Path) -> tuple[int, str]:
    """``status --json`` of one run: exit status and state ("" when there is none)."""
    proc = effectlog("status", "--journal", str(journal), "--run-id", run_id, "--json", cwd=cwd)
    return proc.returncode, json.loads(proc.stdout).get("state", "") if proc.returncode == 0 else ""


def _effects_plan(path: Path, run_id: str, adapter_type: str = "effects.idempotent") -> Path:
    """A one-step plan of run ``run_id`` through the effect store (``effects.idempotent``), or an adapter
    of ``adapter_type``."""
    plan = {
        "run_id": run_id,
        "adapters": {"tool": {"type": adapter_type, "idempotent": True}},
        "steps": [{"id": "s1", "adapter": "tool", "args": {"cents": 5}}],
    }
    path.write_text(json.dumps(plan))
    return path


# -- 1. a journal, store or effect store path that is no regular file -------------------------------


def _not_a_file(kind: str, tmp_path: Path) -> str:
    """A path naming something that is no regular file: /dev/null, a FIFO, a unix socket, a symlink to
    /dev/null (every name SQLite would open and put its ``-journal``/``-wal`` beside)."""
    if kind == "dev-null":
        return "/dev/null"
    target = tmp_path / "odd.db"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(target))
        sock.close()
    else:
        target.symlink_to("/dev/null")
    return str(target)


@pytest.mark.parametrize("what", ["journal", "effects", "store"])
@pytest.mark.parametrize("kind", ["dev-null", "fifo", "socket", "symlink-to-dev-null"])
def test_a_device_fifo_or_socket_named_as_a_sqlite_file_is_refused_and_nothing_is_made_beside_it(
    tmp_path: Path, kind: str, what: str
) -> None:
    """``effectlog run --journal /dev/null`` (to "throw the journal away") opened the device with SQLite,
    which failed with "disk I/O error" after creating ``/dev/null-journal``: a stray file in /dev (as
    root) that every later SQLite open of /dev/null reads as a hot journal. A FIFO or a socket gave the
    same error. ``submit --store`` did the same; ``--effects`` already said "not a file". Proves: for a
    journal, an effect store and a fleet store, such a path is refused in one line naming it (exit 2),
    and no file appears beside it (nor beside /dev/null)."""
    path = _not_a_file(kind, tmp_path)
    beside = ["/dev/null" + s for s in ("-journal", "-wal", "-shm")]
    before = {name for name in beside if os.path.exists(name)}
    files_before = sorted(p.name for p in tmp_path.iterdir())
    argv = {
        "journal": ["run", "--journal", path, str(GOOD_PLAN)],
        "effects": ["run", "--journal", str(tmp_path / "j.db"), "--effects", path,
                    str(_effects_plan(tmp_path / "fx.json", "fx"))],
        "store": ["submit", "--store", path, "--scope", "s", "--key", "k", str(GOOD_PLAN)],
    }[what]
    files_before = sorted(p.name for p in tmp_path.iterdir())
    try:
        proc = effectlog(*argv, cwd=tmp_path)
        made = {name for name in beside if os.path.exists(name)} - before
    finally:
        for name in {n for n in beside if os.path.exists(n)} - before:
            os.unlink(name)  # the stray file SQLite made beside /dev/null
    line = one_line(proc.stderr)
    assert (2, True, set()) == (proc.returncode, path in line, made), line
    assert files_before == sorted(p.name for p in tmp_path.iterdir() if p.name not in ("j.db",)
                                  and not p.name.startswith("j.db-"))


# -- 2. an application's own SQLite database given as a journal, store or effect store ---------------


def _application_db(path: Path, shape: str) -> None:
    """An application's own SQLite database in rollback-journal mode: unrelated tables, or tables named
    ``meta`` and ``events`` of another shape with a ``schema_version`` of 1 in ``meta`` (a common layout)."""
    db = sqlite3.connect(path)
    if shape == "unrelated":
        db.executescript("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO users VALUES (1, 'ann');")
    else:
        db.executescript(
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);"
            "INSERT INTO meta VALUES ('schema_version', '1');"
            "CREATE TABLE events (id INTEGER PRIMARY KEY, run_id TEXT, name TEXT);"
            "INSERT INTO events VALUES (1, 'u1', 'login');"
        )
    db.commit()
    db.close()


@pytest.mark.parametrize("what", ["journal", "effects", "store"])
@pytest.mark.parametrize("shape", ["unrelated", "meta-and-events-of-another-shape"])
def test_an_applications_own_sqlite_database_is_refused_byte_for_byte_unchanged(
    tmp_path: Path, shape: str, what: str
) -> None:
    """``effectlog run --journal app.db`` naming an application's own SQLite database (a mistyped
    path) was refused ("not an effectlog journal") only after the journal switched the file to WAL
    (header bytes 18-19: every program using it now makes -wal and -shm files, and one on a network
    file system can no longer open it); with tables named ``meta`` and ``events`` and a
    ``schema_version`` of 1 it was taken for a journal: seals, owners and checkpoints tables and their
    triggers were added to the application's database, then "no such column: e.seq" (storage). The
    effect store and the fleet store switched the file to WAL too. Proves: refused in one line (exit
    2), the database byte for byte as it was, no file left beside it but SQLite's empty ones."""
    app = tmp_path / "app.db"
    _application_db(app, shape)
    before = app.read_bytes()
    argv = {
        "journal": ["run", "--journal", str(app), str(GOOD_PLAN)],
        "effects": ["run", "--journal", str(tmp_path / "j.db"), "--effects", str(app),
                    str(_effects_plan(tmp_path / "fx.json", "fx"))],
        "store": ["submit", "--store", str(app), "--scope", "s", "--key", "k", str(GOOD_PLAN)],
    }[what]
    proc = effectlog(*argv, cwd=tmp_path)
    line = one_line(proc.stderr)
    left = sorted(p.name for p in tmp_path.glob("app.db-*") if p.stat().st_size)
    assert (2, True, True, []) == (proc.returncode, "app.db" in line, before == app.read_bytes(), left), line


# -- 3. a journal in a read-only directory --------------------------------------------------------


@pytest.mark.parametrize("command", [["status"], ["verify"], ["timeline", "--run-id", "good-run"], ["head", "--run-id", "good-run"]])
def test_a_closed_journal_in_a_read_only_directory_can_be_read_and_verified(tmp_path: Path, command: list[str]) -> None:
    """A journal copied to a read-only place (an archive mount, a backup snapshot, a directory of mode
    0555, a container's read-only volume) after its runs ended: nothing beside it (the last close
    checkpointed and deleted the WAL). SQLite cannot make the ``-shm`` a reader of a WAL database needs
    there, so ``status``, ``verify``, ``timeline`` and ``head`` all failed with "journal is read-only
    (attempt to write a readonly database)": the one command that proves an archived journal intact
    could not read it. Proves: each reads it (exit 0, ``verify`` says ok), and the directory holds the
    same files as before."""
    place = tmp_path / "archive"
    place.mkdir()
    journal = place / "j.db"
    assert 0 == effectlog("run", "--journal", str(journal), str(GOOD_PLAN), cwd=tmp_path).returncode
    before = sorted(p.name for p in place.iterdir())
    place.chmod(0o555)
    try:
        proc = effectlog(*command[:1], "--journal", str(journal), *command[1:], cwd=tmp_path, preexec=respect_file_modes)
    finally:
        place.chmod(0o755)
    assert (["j.db"], 0, "") == (before, proc.returncode, proc.stderr)
    assert command[0] != "verify" or proc.stdout.startswith("ok:")


# -- 4. a journal or store file bind-mounted on its own ---------------------------------------------

_IN_OWN_MOUNTS = r"""
import json, subprocess, sys
original, mounted, argv = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
subprocess.run(["mount", "--bind", original, mounted], check=True)
proc = subprocess.run([sys.executable, "-m", "effectlog", *argv], capture_output=True, text=True)
print(json.dumps([proc.returncode, proc.stderr]))
"""


def _in_own_mount_namespace(tmp_path: Path, original: Path, mounted: Path, argv: list[str]) -> tuple[int, str]:
    """``argv`` run as ``python -m effectlog`` in a mount namespace of its own, where ``mounted`` is a bind
    mount of the file ``original`` (as ``docker run -v /srv/j.db:/data/j.db`` makes one); skips where no
    mount namespace can be made (not root)."""
    mounted.touch()
    try:
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", _IN_OWN_MOUNTS,
             str(original), str(mounted), json.dumps(argv)],
            cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120, check=False,
        )
    except FileNotFoundError:
        pytest.skip("no unshare(1)")
    if proc.returncode != 0:
        pytest.skip(f"cannot bind-mount in a mount namespace of its own: {proc.stderr.strip()[-200:]}")
    status, stderr = json.loads(proc.stdout)
    return int(status), str(stderr)


@pytest.mark.parametrize("what", ["journal", "effects", "store"])
def test_a_file_bind_mounted_on_its_own_is_refused_as_a_second_name(tmp_path: Path, what: str) -> None:
    """A journal file bind-mounted on its own (``docker run -v /srv/j.db:/data/j.db``, a systemd
    ``BindPaths=`` of the file) is one inode under two names in two directories, with one link: the hard
    link check sees nothing, and the name check only a second name in use at that instant. SQLite keeps
    the WAL in the directory of the name it opens: a run through the mount that was SIGKILLed (``docker
    kill``) left its committed events in ``/data/j.db-wal``; under the file's own name the run did not
    exist (``status`` showed only the runs checkpointed before), so running it there sent its
    non-idempotent step again, and an effect store lost its keys the same way. Proves: a journal, an
    effect store and a fleet store whose file is a mount point of its own are refused before SQLite
    opens them (exit 6, one line naming the bind mount), and the file is as it was."""
    original, mounted = tmp_path / "a.db", tmp_path / "mounted.db"
    if what == "effects":
        fx = _effects_plan(tmp_path / "fx.json", "fx")
        assert 0 == effectlog("run", "--journal", str(tmp_path / "j0.db"), "--effects", str(original), str(fx),
                              cwd=tmp_path).returncode
        argv = ["run", "--journal", str(tmp_path / "j.db"), "--effects", str(mounted),
                str(_effects_plan(tmp_path / "fx2.json", "fx2"))]
    elif what == "store":
        assert 0 == effectlog("submit", "--store", str(original), "--scope", "s", "--key", "k0", str(GOOD_PLAN),
                              cwd=tmp_path).returncode
        argv = ["submit", "--store", str(mounted), "--scope", "s", "--key", "k",
                str(_effects_plan(tmp_path / "p.json", "r", "noop"))]
    else:
        assert 0 == effectlog("run", "--journal", str(original), str(GOOD_PLAN), cwd=tmp_path).returncode
        argv = ["run", "--journal", str(mounted), str(_effects_plan(tmp_path / "p.json", "r", "noop"))]
    before = original.read_bytes()
    status, stderr = _in_own_mount_namespace(tmp_path, original, mounted, argv)
    line = one_line(stderr)
    assert (6, True, True) == (status, "mount" in line and "mounted.db" in line, before == original.read_bytes()), line


# -- 5. a PostgreSQL connection string in keyword form --------------------------------------------


@pytest.mark.parametrize(
    "location",
    ["host=127.0.0.1 port=5432 dbname=effectlog user=app", "dbname=effectlog", "service=payments", " host = db "],
)
@pytest.mark.parametrize("what", ["journal", "store"])
def test_a_postgresql_connection_string_in_keyword_form_is_not_taken_for_a_file_name(
    tmp_path: Path, location: str, what: str
) -> None:
    """libpq takes a connection string as a URL or as ``keyword=value`` pairs (``psql "host=db
    dbname=effectlog"``, ``PGSERVICE``-style settings, many ``DATABASE_URL``s). ``--journal "host=db
    dbname=effectlog"`` was taken for a SQLite file of that name in the working directory: the run
    completed there, exit 0. Hosts meant to share one PostgreSQL journal (or fleet store) each wrote a
    file of their own, so each drove the run and sent its steps: a second journal, no owner in common.
    Proves: such a location is refused in one line (exit 2) saying to give a ``postgresql://`` URL (or
    ``./`` before a file of that name), and no file is made."""
    plan = _effects_plan(tmp_path / "p.json", "r", "noop")
    argv = (["run", "--journal", location, str(plan)] if what == "journal"
            else ["submit", "--store", location, "--scope", "s", "--key", "k", str(plan)])
    proc = effectlog(*argv, cwd=tmp_path)
    line = one_line(proc.stderr)
    made = sorted(p.name for p in tmp_path.iterdir() if p.name != "p.json")
    assert (2, True, []) == (proc.returncode, "postgresql://" in line, made), line
