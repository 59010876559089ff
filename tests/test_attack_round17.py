"""Attack round 17: the storage and ownership side, with cases earlier rounds did not try.

Each test is a real process (the CLI, a mount namespace made with ``unshare``, SIGKILL where a crash
matters) against real SQLite files.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectlog.adapters.effects import EffectStore
from hardening_kit import cli_env, effectlog, one_line

# -- 1. a path whose text names another file than the one the kernel reaches (/proc magic links) -------


def _shell_plan(path: Path, run_id: str, effects: Path) -> Path:
    """A one-step plan whose non-idempotent shell step appends a line to ``effects`` (outside every
    journal): a step sent twice shows as two lines."""
    plan = {
        "run_id": run_id,
        "adapters": {"sh": {"type": "shell", "idempotent": False}},
        "steps": [{"id": "s1", "adapter": "sh", "args": {"argv": ["sh", "-c", f"echo s1 >> '{effects}'"]}}],
    }
    path.write_text(json.dumps(plan))
    return path


# The agent's own process in a mount namespace of its own (a container's, in miniature): a tmpfs on
# DIR, the run driven there to completion and an effect store made, then the process stays, its cwd DIR, the
# journal open on fd 9.
_AGENT = r"""
set -e
mount -t tmpfs none "$1"
cd "$1"
"$2" -m effectlog run --journal "$1/j.db" "$3" > "$4.out" 2>&1 || true
"$2" -c 'import sys; from effectlog.adapters.effects import EffectStore; EffectStore(sys.argv[1]).close()' "$1/fx.db"
exec 9< "$1/j.db"
echo ok > "$4"
exec sleep 300
"""


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path, Path]]:
    """A process in a mount namespace of its own that ran ``plan.json`` into ``DIR/j.db`` there: (process,
    DIR, plan, the effects file, which both namespaces share). Skips where no mount namespace can be made."""
    work, effects = tmp_path / "app", tmp_path / "effects.txt"
    work.mkdir()
    plan = _shell_plan(tmp_path / "plan.json", "pay", effects)
    ready = tmp_path / "ready"
    try:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", _AGENT, "sh",
             str(work), sys.executable, str(plan), str(ready)],
            cwd=tmp_path, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
    except FileNotFoundError:
        pytest.skip("no unshare(1)")
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if not ready.exists():
            assert proc.stderr is not None
            pytest.skip(f"cannot mount in a mount namespace of its own: {proc.stderr.read()[-200:]!r}")
        assert ["s1"] == effects.read_text().split(), Path(f"{ready}.out").read_text()
        yield proc, work, plan, effects
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("via", ["root", "cwd", "fd"])
def test_a_journal_reached_through_a_proc_link_into_another_mount_namespace_is_refused(
    agent: tuple[subprocess.Popen[bytes], Path, Path, Path], tmp_path: Path, via: str
) -> None:
    """An operator on the host reaches a container's journal as ``/proc/PID/root/app/j.db`` (or through
    the process's ``cwd`` or an open descriptor, ``/proc/PID/fd/9``): the kernel follows those links into
    the process's own mounts, but their text is a path of the *host* (``readlink /proc/PID/root`` is
    ``/``), and effectlog resolved the location by that text (``os.path.realpath``, as SQLite's own
    full-path logic does): it opened, or created, ``/app/j.db`` of the host instead. ``effectlog run``
    there found no such run and sent the finished run's non-idempotent step again: a second effect, and
    ``verify`` of that same location said ok. Proves: such a location is refused before any file is made
    (exit 2, one line naming the location), no second effect is made, and no file appears on the host."""
    proc, work, plan, effects = agent
    location = {
        "root": f"/proc/{proc.pid}/root{work}/j.db",
        "cwd": f"/proc/{proc.pid}/cwd/j.db",
        "fd": f"/proc/{proc.pid}/fd/9",
    }[via]
    assert os.path.exists(location)  # the kernel does reach the agent's journal by that name
    ran = effectlog("run", "--journal", location, str(plan), cwd=tmp_path)
    verified = effectlog("verify", "--journal", location, cwd=tmp_path)
    assert (2, ["s1"], [], True) == (
        ran.returncode,
        effects.read_text().split(),
        sorted(p.name for p in work.iterdir()),  # the host's own /app: nothing made there
        verified.returncode != 0,
    ), (ran.stderr, verified.stdout, verified.stderr)
    assert location in one_line(ran.stderr)


@pytest.mark.parametrize("what", ["effects", "store"])
def test_an_effect_store_or_fleet_store_reached_through_a_proc_link_is_refused(
    agent: tuple[subprocess.Popen[bytes], Path, Path, Path], tmp_path: Path, what: str
) -> None:
    """The effect store and the fleet store are opened by the same text resolution as the journal: an
    agent's effect store reached as ``/proc/PID/root/app/fx.db`` was the host's store of that path (none
    of the agent's keys: an idempotent step sent to it is applied again), or a new one, and a fleet store
    the same. Proves: both are refused as the journal is (exit 2, one line naming the location), and the
    host's own files of that path are left as they were (none made, the host's store unchanged)."""
    proc, work, _, _ = agent
    location = f"/proc/{proc.pid}/root{work}/{'fx' if what == 'effects' else 'store'}.db"
    host_store = work / "fx.db"  # the host's own store at the agent's path (the agent's tmpfs hides it there)
    EffectStore(host_store).close()
    before = (sorted(p.name for p in work.iterdir()), host_store.read_bytes())
    plan = tmp_path / "fx.json"
    plan.write_text(json.dumps({
        "run_id": "fx",
        "adapters": {"tool": {"type": "effects.idempotent", "idempotent": True}},
        "steps": [{"id": "s1", "adapter": "tool", "args": {"cents": 5}}],
    }))  # fmt: skip
    argv = (["run", "--journal", str(tmp_path / "host.db"), "--effects", location, str(plan)] if what == "effects"
            else ["submit", "--store", location, "--scope", "s", "--key", "k", str(plan)])  # fmt: skip
    done = effectlog(*argv, cwd=tmp_path)
    line = one_line(done.stderr)
    left = (sorted(p.name for p in work.iterdir()), host_store.read_bytes())
    assert (2, True, True) == (done.returncode, location in line, left == before), line


# -- 2. a plan or trace path that reaches a journal's sidecar by another name --------------------------


def _alias(tmp_path: Path, target: Path, how: str) -> Path:
    """Another name of ``target``: a symlink to it, a hard link, or ``/proc/self/fd/N`` of a descriptor
    this test keeps open (an ordinary-looking path; nothing in the text says ``-shm``)."""
    alias = tmp_path / "notes.jsonl"
    if how == "symlink":
        alias.symlink_to(target)
    elif how == "hardlink":
        os.link(target, alias)
    else:
        return Path(f"/proc/self/fd/{os.open(target, os.O_RDONLY)}")  # kept open: closing it drops the locks
    return alias


@pytest.mark.parametrize("how", ["symlink", "hardlink", "proc-fd"])
@pytest.mark.parametrize("role", ["trace", "plan"])
def test_a_plan_or_trace_reaching_the_journals_shm_by_another_name_is_refused(
    tmp_path: Path, role: str, how: str
) -> None:
    """Round 16 made a runtime refuse a plan or trace path naming a journal it has open or its
    ``-wal``/``-shm``/``-journal`` (reading it opens and closes a descriptor, and the close drops every
    POSIX lock of the process on that file, SQLite's DMS lock on the -shm included). It told sidecars by
    the text of the path: a symlink to the -shm, a hard link of it or ``/proc/self/fd/N`` named no
    sidecar, so the plan reader (or the trace, which also appends JSON into the file) opened and closed
    the -shm and the lock was gone: another process then takes the index for unused and truncates it
    under this one (SIGBUS), as round 16 showed. Proves: each is refused (bad input naming the path), the
    -shm keeps its size, and SQLite's DMS lock on it is still held."""
    from effectlog.errors import BadInput
    from effectlog.journal.sqlite import SqliteJournal
    from effectlog.runtime import Runtime
    from test_attack_round16 import _dms_held

    shm = tmp_path / "j.db-shm"
    journal = SqliteJournal(tmp_path / "j.db")
    runtime = Runtime(journal)  # its plan reader; the trace's runtime is made with the alias below
    try:
        alias = _alias(tmp_path, shm, how)
        size, before = shm.stat().st_size, _dms_held(shm)
        give = (lambda: Runtime(journal, trace=str(alias))) if role == "trace" else (lambda: runtime.run(str(alias)))
        with pytest.raises(BadInput, match=re.escape(str(alias))):
            give()
        assert (size, True, True) == (shm.stat().st_size, before, _dms_held(shm))
    finally:
        runtime.close()
        journal.close()


@pytest.mark.parametrize("how", ["symlinked-directory", "symlink-to-a-new-file", "relative", "dot-dot"])
def test_a_path_whose_text_and_file_agree_is_not_taken_for_a_misleading_one(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ``location_misleads`` check compares the file a path's text names with the one the kernel
    reaches; ordinary second spellings must still open the one journal (a symlink is fine, G9). Proves:
    through a symlinked directory, a symlink to a journal not made yet, a relative path and ``..``, a
    journal is made (or opened) at the file the path leads to, and both spellings meet one file."""
    from effectlog.journal.sqlite import SqliteJournal

    real = tmp_path / "real"
    real.mkdir()
    monkeypatch.chdir(tmp_path)
    location = {
        "symlinked-directory": "link/j.db",
        "symlink-to-a-new-file": "j.db",
        "relative": "real/j.db",
        "dot-dot": f"{real}/../real/j.db",
    }[how]
    if how == "symlinked-directory":
        (tmp_path / "link").symlink_to(real)
    elif how == "symlink-to-a-new-file":
        (tmp_path / "j.db").symlink_to(real / "j.db")  # dangling until the journal is made
    SqliteJournal(location).close()
    SqliteJournal(real / "j.db").close()
    assert (True, True) == ((real / "j.db").is_file(), os.path.samefile(location, real / "j.db"))
