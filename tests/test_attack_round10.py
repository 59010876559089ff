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
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from effectlog.pgcluster import PgCluster
from hardening_kit import GOOD_PLAN, cli_env, effectlog, one_line, respect_file_modes
from test_attack_round6 import _plan

pytest_plugins = ["pg_fixture"]


def _state(journal: Path | str, run_id: str, cwd: Path) -> tuple[int, str]:
    """``status --json`` of one run: exit status and state ("" when there is none)."""
    proc = effectlog("status", "--journal", str(journal), "--run-id", run_id, "--json", cwd=cwd)
    return proc.returncode, json.loads(proc.stdout).get("state", "") if proc.returncode == 0 else ""


def _effects_plan(path: Path, run_id: str, adapter_type: str = "effects.idempotent") -> Path:
    """A one-step plan of run ``run_id`` through the effect store (``effects.idempotent``), or an adapter
    of ``adapter_type``: round 6's plan with another default adapter."""
    return _plan(path, run_id, adapter_type)


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
        "effects": [
            "run",
            "--journal",
            str(tmp_path / "j.db"),
            "--effects",
            path,
            str(_effects_plan(tmp_path / "fx.json", "fx")),
        ],
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
    assert files_before == sorted(
        p.name for p in tmp_path.iterdir() if p.name not in ("j.db",) and not p.name.startswith("j.db-")
    )


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
        "effects": [
            "run",
            "--journal",
            str(tmp_path / "j.db"),
            "--effects",
            str(app),
            str(_effects_plan(tmp_path / "fx.json", "fx")),
        ],
        "store": ["submit", "--store", str(app), "--scope", "s", "--key", "k", str(GOOD_PLAN)],
    }[what]
    proc = effectlog(*argv, cwd=tmp_path)
    line = one_line(proc.stderr)
    left = sorted(p.name for p in tmp_path.glob("app.db-*") if p.stat().st_size)
    assert (2, True, True, []) == (proc.returncode, "app.db" in line, before == app.read_bytes(), left), line


# -- 3. a journal in a read-only directory --------------------------------------------------------


@pytest.mark.parametrize("command", [["status"], ["verify"], ["head", "--run-id", "good-run"]])
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
        argv = [command[0], "--journal", str(journal), *command[1:]]
        proc = effectlog(*argv, cwd=tmp_path, preexec=respect_file_modes)
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
            [
                "unshare",
                "--mount",
                "--propagation",
                "private",
                sys.executable,
                "-c",
                _IN_OWN_MOUNTS,
                str(original),
                str(mounted),
                json.dumps(argv),
            ],
            cwd=tmp_path,
            env=cli_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
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
        assert (
            0
            == effectlog(
                "run", "--journal", str(tmp_path / "j0.db"), "--effects", str(original), str(fx), cwd=tmp_path
            ).returncode
        )
        argv = [
            "run",
            "--journal",
            str(tmp_path / "j.db"),
            "--effects",
            str(mounted),
            str(_effects_plan(tmp_path / "fx2.json", "fx2")),
        ]
    elif what == "store":
        assert (
            0
            == effectlog(
                "submit", "--store", str(original), "--scope", "s", "--key", "k0", str(GOOD_PLAN), cwd=tmp_path
            ).returncode
        )
        argv = [
            "submit",
            "--store",
            str(mounted),
            "--scope",
            "s",
            "--key",
            "k",
            str(_effects_plan(tmp_path / "p.json", "r", "noop")),
        ]
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
    ["host=127.0.0.1 port=5432 dbname=effectlog user=app", " service = payments "],
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
    argv = (
        ["run", "--journal", location, str(plan)]
        if what == "journal"
        else ["submit", "--store", location, "--scope", "s", "--key", "k", str(plan)]
    )
    proc = effectlog(*argv, cwd=tmp_path)
    line = one_line(proc.stderr)
    made = sorted(p.name for p in tmp_path.iterdir() if p.name != "p.json")
    assert (2, True, []) == (proc.returncode, "postgresql://" in line, made), line


# -- 6. second actors while the owner is alive: stopped with SIGSTOP, or reached by another URL ----------


def _slow_plan(path: Path, run_id: str, effects: Path, seconds: int = 2, gate: Path | None = None) -> Path:
    """Run ``run_id``: s1 (not idempotent) appends ``x`` to ``effects`` and then takes ``seconds``; s2
    appends ``y``. With ``gate``, s1 instead takes until ``gate`` exists (two minutes at most), then touches
    ``<gate>.passed`` as its last command: it stays in flight for as long as the test needs, on however
    slow a machine, and says when it is over."""
    sh = {"type": "shell", "idempotent": False}
    wait = f"sleep {seconds}"
    if gate is not None:
        wait = f"t=0; while [ ! -e '{gate}' ] && [ $t -lt 2400 ]; do sleep 0.05; t=$((t+1)); done"
        wait += f"; touch '{gate}.passed'"
    plan = {
        "run_id": run_id,
        "adapters": {"sh": sh},
        "steps": [
            {"id": "s1", "adapter": "sh", "args": {"argv": ["sh", "-c", f"echo x >> '{effects}'; {wait}"]}},
            {"id": "s2", "adapter": "sh", "args": {"argv": ["sh", "-c", f"echo y >> '{effects}'"]}},
        ],
    }
    path.write_text(json.dumps(plan))
    return path


def _owner_inside_s1(journal: str, plan: Path, effects: Path, cwd: Path) -> subprocess.Popen[str]:
    """``effectlog run`` of ``plan`` started and waited for until s1's effect is out (the run is claimed)."""
    owner = subprocess.Popen(
        [sys.executable, "-m", "effectlog", "run", "--journal", journal, str(plan)],
        cwd=cwd,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not effects.exists():
        assert owner.poll() is None, owner.communicate()
        assert time.monotonic() < deadline, "s1 never started"
        time.sleep(0.02)
    return owner


def test_an_owner_stopped_with_sigstop_keeps_its_run_and_finishes_it_once_continued(tmp_path: Path) -> None:
    """The process driving a run is stopped (Ctrl-Z, a debugger, a frozen container) inside a
    non-idempotent step, past the step's own duration. A stopped process is alive: its OS claim must
    hold, so nobody takes the run over while it may still commit. Proves: while it is stopped, a
    second ``run`` is refused (exit 6), ``recover`` skips the run, ``reconcile`` of the step in flight is
    refused (exit 6), and ``status`` names the owner; continued, it finishes: each effect once, the run
    completed and verified."""
    effects = tmp_path / "effects.txt"
    gate = tmp_path / "gate"
    plan = _slow_plan(tmp_path / "p.json", "r1", effects, gate=gate)
    journal = str(tmp_path / "j.db")
    owner = _owner_inside_s1(journal, plan, effects, tmp_path)
    owner.send_signal(signal.SIGSTOP)
    try:
        gate.touch()  # s1's shell ends while its owner is stopped
        deadline = time.monotonic() + 120
        while not Path(f"{gate}.passed").exists():
            assert time.monotonic() < deadline, "s1's shell did not end in 120 s"
            time.sleep(0.02)
        second = effectlog("run", "--journal", journal, str(plan), cwd=tmp_path)
        recover = effectlog("recover", "--journal", journal, "--json", cwd=tmp_path)
        reconcile = effectlog(
            "reconcile",
            "--journal",
            journal,
            "--run-id",
            "r1",
            "--step",
            "s1",
            "--outcome",
            "not-applied",
            "--evidence",
            "none seen",
            "--operator",
            "ana",
            cwd=tmp_path,
        )
        status = effectlog("status", "--journal", journal, "--run-id", "r1", "--json", cwd=tmp_path)
    finally:
        owner.send_signal(signal.SIGCONT)
    _, err = owner.communicate(timeout=60)
    assert (6, 6) == (second.returncode, reconcile.returncode), (second.stderr, reconcile.stderr)
    assert ["skipped"] == [r.get("action") for r in json.loads(recover.stdout)], recover.stdout
    assert "running" == json.loads(status.stdout)["state"], status.stdout
    assert (0, ["x", "y"]) == (owner.returncode, effects.read_text().split()), err
    assert (0, "completed") == _state(journal, "r1", tmp_path)
    assert 0 == effectlog("verify", "--journal", journal, cwd=tmp_path).returncode


def test_on_postgresql_one_database_reached_by_other_urls_is_one_owner(
    tmp_path: Path, pg_url: str, pg_cluster: PgCluster
) -> None:
    """One PostgreSQL database reached by URLs that differ in every way a URL can while meaning the same
    database: ``localhost`` for ``127.0.0.1``, the unix socket, query options in another order, another
    role with the same rights. A run's owner is a session advisory lock, which is per database, whatever
    the route: none of them may be a second owner. Proves: while a run through one URL is inside a
    non-idempotent step, ``run`` through each other URL is refused (exit 6) and writes nothing; the owner
    finishes with each effect once."""
    import psycopg

    parts = urlsplit(pg_url)
    database, port = parts.path.lstrip("/"), parts.port
    socket_dir = str(pg_cluster.tmp)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE ROLE twin LOGIN SUPERUSER")
    try:
        others = [
            f"postgresql://postgres@localhost:{port}/{database}",
            f"postgresql://postgres@/{database}?host={socket_dir}&port={port}",
            f"postgresql://postgres@127.0.0.1:{port}/{database}?connect_timeout=10&application_name=twin",
            f"postgres://twin@127.0.0.1:{port}/{database}?application_name=twin&connect_timeout=10",
        ]
        effects = tmp_path / "effects.txt"
        gate = tmp_path / "gate"
        plan = _slow_plan(tmp_path / "p.json", "pg1", effects, gate=gate)  # s1 outlasts the four refusals
        owner = _owner_inside_s1(pg_url, plan, effects, tmp_path)
        try:
            refused = [effectlog("run", "--journal", url, str(plan), cwd=tmp_path) for url in others]
        finally:
            gate.touch()
        _, err = owner.communicate(timeout=60)
        assert [6] * len(others) == [p.returncode for p in refused], [p.stderr for p in refused]
        assert (0, ["x", "y"]) == (owner.returncode, effects.read_text().split()), err
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("DROP OWNED BY twin")
            conn.execute("DROP ROLE twin")


# -- 7. a journal replaced by a rename while a run holds it ----------------------------------------


def test_a_journal_replaced_by_a_rename_while_in_use_is_refused_and_keeps_its_own_history(tmp_path: Path) -> None:
    """A restore or a sync (``mv restored.db j.db``; rsync writes a temporary file and renames it over)
    replaces j.db while a run holds the old file. The replacement has no WAL of its own: SQLite opens
    ``j.db-wal`` and ``j.db-shm``, the old file's, still in use. A second ``effectlog run`` on j.db then
    read the old file's pages from that WAL as the new file's: ``status`` showed the old file's runs and
    not the replacement's, and its commits went into the shared WAL, whose frames the old file's owner
    checkpointed into its own (unlinked) file while the second process's close checkpointed them over
    the replacement: the replacement's own runs were gone, ``verify`` said ok. Proves: the second run is
    refused (exit 6, one line) and sends nothing; once the old owner has stopped, j.db holds the
    replacement's history, which verifies."""
    effects = tmp_path / "effects.txt"
    gate = tmp_path / "gate"
    old_plan = _slow_plan(tmp_path / "a.json", "A", effects, gate=gate)  # in s1 until the second run is over
    new_plan = _effects_plan(tmp_path / "b.json", "B", "noop")
    journal, replacement = tmp_path / "j.db", tmp_path / "restored.db"
    assert 0 == effectlog("run", "--journal", str(replacement), str(GOOD_PLAN), cwd=tmp_path).returncode
    owner = _owner_inside_s1(str(journal), old_plan, effects, tmp_path)
    try:
        os.rename(replacement, journal)
        second = effectlog("run", "--journal", str(journal), str(new_plan), cwd=tmp_path)
    finally:
        gate.touch()
    owner.communicate(timeout=60)
    line = one_line(second.stderr)
    assert (6, "j.db" in line) == (second.returncode, True), line
    assert ["x"] == effects.read_text().split()
    listing = effectlog("status", "--journal", str(journal), "--json", cwd=tmp_path)
    runs = sorted((r["run_id"], r["state"]) for r in json.loads(listing.stdout))
    assert [("good-run", "completed")] == runs, listing.stdout
    assert 0 == effectlog("verify", "--journal", str(journal), cwd=tmp_path).returncode


# -- 8. two `effectlog run` of one run started together ---------------------------------------------

_AT_THE_GATE = (
    "import os, sys; os.read(0, 1); os.execv(sys.executable, [sys.executable, '-m', 'effectlog', *sys.argv[1:]])"
)


def test_two_runs_of_one_run_released_together_send_each_step_once(tmp_path: Path) -> None:
    """Two ``effectlog run`` of the same new run, held at a gate and released by one write each, round after
    round (two cron jobs firing at the same second, a retried deploy hook): the claim, the owner row,
    the first append and the alias checks all race at the journal's creation or first use. Proves: in
    every round (five) the non-idempotent step's effect happens once, each process ends 0 (it found the run
    completed) or 6 (owned), and the journal verifies."""
    journal = tmp_path / "j.db"
    for round_no in range(5):
        effects = tmp_path / f"fx{round_no}.txt"
        plan = {
            "run_id": f"r{round_no}",
            "adapters": {"sh": {"type": "shell", "idempotent": False}},
            "steps": [{"id": "s1", "adapter": "sh", "args": {"argv": ["sh", "-c", f"echo x >> '{effects}'"]}}],
        }
        path = tmp_path / f"p{round_no}.json"
        path.write_text(json.dumps(plan))
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _AT_THE_GATE, "run", "--journal", str(journal), str(path)],
                cwd=tmp_path,
                env=cli_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            for _ in range(2)
        ]
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go")
            proc.stdin.close()
        statuses = sorted(proc.wait(timeout=120) for proc in procs)
        assert (["x"], True) == (effects.read_text().split(), statuses in ([0, 0], [0, 6])), (round_no, statuses)
    assert 0 == effectlog("verify", "--journal", str(journal), cwd=tmp_path).returncode


# -- 9. the journal's name changed under a live owner ------------------------------------------------


def test_the_journals_directory_renamed_mid_step_stops_the_owner_and_the_step_is_not_sent_again(
    tmp_path: Path,
) -> None:
    """The directory holding the journal is renamed (a deploy swapping ``current``, an operator tidying)
    while a non-idempotent step runs: the owner's name for the file leads nowhere, and a commit there
    would go to a WAL nobody opening the new name reads. Proves: the owner refuses its next commit
    (exit 6, one line), and the run under the new name finds the step uncertain (exit 3), not sent
    again."""
    effects = tmp_path / "effects.txt"
    gate = tmp_path / "gate"
    plan = _slow_plan(tmp_path / "p.json", "r1", effects, gate=gate)
    (tmp_path / "d").mkdir()
    owner = _owner_inside_s1(str(tmp_path / "d" / "j.db"), plan, effects, tmp_path)
    try:
        (tmp_path / "d").rename(tmp_path / "d2")  # while s1 runs
    finally:
        gate.touch()
    _, err = owner.communicate(timeout=60)
    again = effectlog("run", "--journal", str(tmp_path / "d2" / "j.db"), str(plan), cwd=tmp_path)
    assert (6, 3, ["x"]) == (owner.returncode, again.returncode, effects.read_text().split()), (err, again.stderr)


def test_a_hard_link_made_while_a_run_holds_the_journal_is_refused_and_the_owner_finishes_once(
    tmp_path: Path,
) -> None:
    """A hard link to the journal made while a run holds it (a backup by ``cp -l``, a snapshot tool):
    the link is checked at open, never again by the owner. Proves: a run through the link is refused
    (exit 6) while the owner runs, the owner finishes each step once, and after it, both names are
    refused until the link is removed; then the run is completed and verifies."""
    effects = tmp_path / "effects.txt"
    gate = tmp_path / "gate"
    plan = _slow_plan(tmp_path / "p.json", "r1", effects, gate=gate)
    journal, link = tmp_path / "j.db", tmp_path / "k.db"
    owner = _owner_inside_s1(str(journal), plan, effects, tmp_path)
    try:
        os.link(journal, link)
        through_link = effectlog("run", "--journal", str(link), str(plan), cwd=tmp_path)  # while the owner runs
    finally:
        gate.touch()
    _, err = owner.communicate(timeout=60)
    after = [effectlog("run", "--journal", str(name), str(plan), cwd=tmp_path).returncode for name in (journal, link)]
    link.unlink()
    assert (6, 0, [6, 6], ["x", "y"]) == (
        through_link.returncode,
        owner.returncode,
        after,
        effects.read_text().split(),
    ), err
    assert (0, "completed") == _state(journal, "r1", tmp_path)


def test_an_effect_store_replaced_by_a_rename_while_in_use_is_refused_to_the_next_run(tmp_path: Path) -> None:
    """The effect store twin of the replaced journal: a run holds fx.db open (its s2 is running) when
    another store is renamed over fx.db. Proves: a second run naming fx.db is refused (exit 6, one line)
    before it reads or writes the old store's live WAL as the new one's, and the new store's ledger
    holds only its own effect."""
    effects = tmp_path / "effects.txt"
    fx = {"type": "effects.idempotent", "idempotent": True}
    sh = {"type": "shell", "idempotent": False}
    gate = tmp_path / "gate"  # s2 runs (holds fx.db open) until the second run is over, two minutes at most
    hold = f"t=0; while [ ! -e '{gate}' ] && [ $t -lt 2400 ]; do sleep 0.05; t=$((t+1)); done"
    first = tmp_path / "a.json"
    first.write_text(
        json.dumps(
            {
                "run_id": "A",
                "adapters": {"fx": fx, "sh": sh},
                "steps": [
                    {"id": "s1", "adapter": "fx", "args": {"cents": 1}},
                    {"id": "s2", "adapter": "sh", "args": {"argv": ["sh", "-c", f"echo x >> '{effects}'; {hold}"]}},
                    {"id": "s3", "adapter": "fx", "args": {"cents": 3}},
                ],
            }
        )
    )
    store, replacement = tmp_path / "fx.db", tmp_path / "restored.db"
    made = effectlog(
        "run",
        "--journal",
        str(tmp_path / "jc.db"),
        "--effects",
        str(replacement),
        str(_effects_plan(tmp_path / "c.json", "C")),
        cwd=tmp_path,
    )
    assert 0 == made.returncode, made.stderr
    owner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "effectlog",
            "run",
            "--journal",
            str(tmp_path / "ja.db"),
            "--effects",
            str(store),
            str(first),
        ],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not effects.exists():
        assert owner.poll() is None, owner.communicate()
        assert time.monotonic() < deadline, "s2 never started"
        time.sleep(0.02)
    try:
        os.rename(replacement, store)
        second = effectlog(
            "run",
            "--journal",
            str(tmp_path / "jb.db"),
            "--effects",
            str(store),
            str(_effects_plan(tmp_path / "b.json", "B")),
            cwd=tmp_path,
        )
    finally:
        gate.touch()
    owner.communicate(timeout=60)
    line = one_line(second.stderr)
    assert (6, True) == (second.returncode, "fx.db" in line), line
    ledger = effectlog("effects", "--effects", str(store), "--json", cwd=tmp_path)
    assert ["C"] == [row["run_id"] for row in json.loads(ledger.stdout)], ledger.stdout


def test_on_postgresql_a_search_path_that_shadows_a_builtin_is_still_one_owner(tmp_path: Path, pg_url: str) -> None:
    """The journal's tables are schema-qualified, but the run's lock key was ``hashtext(run_id)``,
    resolved through the session's ``search_path``: pg_catalog comes first only when the path does not
    name it. A database with an application's own ``public.hashtext(text)`` (or any same-named helper)
    reached once with the default path and once with ``search_path=public,pg_catalog`` (a role's
    ``ALTER ROLE ... SET search_path``, a URL's ``options``) gave one run two lock keys: two live owners.
    Proves: the second ``run`` is refused (exit 6) and each effect happens once."""
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION public.hashtext(text) RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT 7'")
    other = pg_url + "?options=-c%20search_path%3Dpublic%2Cpg_catalog"
    effects = tmp_path / "effects.txt"
    gate = tmp_path / "gate"
    plan = _slow_plan(tmp_path / "p.json", "sp1", effects, gate=gate)  # s1 outlasts the second run
    owner = _owner_inside_s1(pg_url, plan, effects, tmp_path)
    try:
        second = effectlog("run", "--journal", other, str(plan), cwd=tmp_path)
    finally:
        gate.touch()
    _, err = owner.communicate(timeout=60)
    assert (6, ["x", "y"]) == (second.returncode, effects.read_text().split()), (second.stderr, err)


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink-to-dev-null"])
def test_something_not_a_file_at_the_wal_name_hangs_nothing_and_makes_nothing(tmp_path: Path, kind: str) -> None:
    """The journal's ``-wal`` name taken by a FIFO, a directory or a symlink to /dev/null (a leftover of a
    tool, a hand-made mess). The WAL mark (above) opens that name before SQLite does: a plain open of a
    FIFO blocks until a writer comes, so every command on the journal hung. Proves: ``status`` and ``run``
    each end (a one-line error, exit 2, or success for ``status``), and nothing appears beside /dev/null."""
    journal = tmp_path / "k.db"
    assert 0 == effectlog("run", "--journal", str(journal), str(GOOD_PLAN), cwd=tmp_path).returncode
    wal = tmp_path / "k.db-wal"
    if kind == "fifo":
        os.mkfifo(wal)
    elif kind == "directory":
        wal.mkdir()
    else:
        wal.symlink_to("/dev/null")
    beside = {n for n in ("/dev/null-journal", "/dev/null-wal", "/dev/null-shm") if os.path.exists(n)}
    status = effectlog("status", "--journal", str(journal), cwd=tmp_path)
    run = effectlog(
        "run", "--journal", str(journal), str(_effects_plan(tmp_path / "p.json", "r", "noop")), cwd=tmp_path
    )
    assert status.returncode in (0, 2), status.stderr
    assert status.returncode == 0 or one_line(status.stderr)
    assert (2, True) == (run.returncode, bool(one_line(run.stderr))), run.stderr
    assert beside == {n for n in ("/dev/null-journal", "/dev/null-wal", "/dev/null-shm") if os.path.exists(n)}


# -- 10. fleet tables edited by hand -------------------------------------------------------------


def test_a_request_re_pointed_at_a_new_run_id_by_hand_does_not_run_its_steps_again(tmp_path: Path) -> None:
    """A request that succeeded (its non-idempotent step applied) is edited by hand in the SQLite store:
    the triggers that keep a request's identity dropped, its ``run_id`` and the ``run_id`` in its stored
    plan changed, a queued attempt added (a botched repair, a restore script, someone who can write the
    file). The next runner claims it and starts the new run id from scratch: the step is sent a second
    time, and ``verify`` says ok (each run verifies on its own; the fleet tables are outside the chain).
    Proves (when fixed): the step is not sent again, or ``verify`` names the request served twice."""
    effects = tmp_path / "effects.txt"
    plan = {
        "run_id": "f1",
        "adapters": {"sh": {"type": "shell", "idempotent": False}},
        "steps": [{"id": "s1", "adapter": "sh", "args": {"argv": ["sh", "-c", f"echo x >> '{effects}'"]}}],
    }
    (tmp_path / "p.json").write_text(json.dumps(plan))
    store = str(tmp_path / "st.db")
    assert 0 == effectlog("submit", "--store", store, "--scope", "s", "--key", "k", "p.json", cwd=tmp_path).returncode
    assert 0 == effectlog("runner", "--store", store, "--exit-when-idle", "-q", cwd=tmp_path).returncode
    db = sqlite3.connect(store)
    for (trigger,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND name LIKE 'fleet%'"):
        db.execute(f'DROP TRIGGER "{trigger}"')
    db.execute(
        "UPDATE fleet_requests SET run_id = 'f1-edited', finished_at = NULL, "
        'plan = replace(plan, \'"run_id":"f1"\', \'"run_id":"f1-edited"\')'
    )
    db.execute(
        "INSERT INTO fleet_attempts (request_id, attempt_no, state, created_at) "
        "SELECT request_id, 2, 'queued', created_at FROM fleet_attempts"
    )
    db.commit()
    db.close()
    effectlog("runner", "--store", store, "--exit-when-idle", "-q", cwd=tmp_path)
    verify = effectlog("verify", "--journal", store, cwd=tmp_path)
    assert ["x"] == effects.read_text().split() or verify.returncode != 0
