"""Review round 8: attacks on this session's fixes while they are fresh.

The lost-WAL check (``walwatch``) now asks ``statx(2)`` for the inode alone through ``ctypes`` instead of
``os.stat``. It is what refuses a commit after the journal's or the effect store's WAL was deleted or
replaced under the process, so every case ``os.stat`` caught must still be caught, with statx in use:
these tests look at real files (ext4, tmpfs, bind mounts where the test may mount) and compare with
``os.stat`` directly.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectlog.journal import walwatch
from effectlog.journal.walwatch import WalWatch

needs_statx = pytest.mark.skipif(walwatch._Use.statx is None, reason="no statx in this libc")


def _stat_id(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A ``-wal`` file held open the way SQLite holds it (so its inode cannot be freed and reused)."""
    path = str(tmp_path / "j.db-wal")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        yield str(tmp_path / "j.db"), fd
    finally:
        os.close(fd)


def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return probe.returncode == 0


@needs_statx
def test_the_statx_struct_layout_matches_the_kernel_abi() -> None:
    """``_Statx`` is the kernel's 256-byte ``struct statx`` with ``stx_ino`` at 32 and ``stx_dev_major`` at
    136 (linux/stat.h, the same on every architecture): a wrong offset would read another field as the
    inode and the check could never see a replaced WAL."""
    assert ctypes.sizeof(walwatch._Statx) == 256
    assert walwatch._Statx.mask.offset == 0
    assert walwatch._Statx.ino.offset == 32
    assert walwatch._Statx.rdev_major.offset == 128
    assert walwatch._Statx.dev_major.offset == 136
    assert walwatch._Statx.dev_minor.offset == 140


@needs_statx
def test_identity_agrees_with_stat_on_every_mounted_file_system() -> None:
    """For the root of every mount this process sees (ext4, tmpfs, proc, sysfs, cgroup, overlay, devpts:
    each its own device number, some with minors past 255), statx's ``(dev, ino)`` is ``os.stat``'s, and
    statx stays in use (nothing was taken for a refusal)."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            points.append(point)
    checked = 0
    for point in points:
        expected = _stat_id(point)
        if expected is None:
            continue
        assert walwatch.identity(point) == expected, point
        checked += 1
    assert checked >= 3
    assert walwatch._Use.statx is not None


@needs_statx
def test_a_deleted_wal_is_lost_while_its_descriptor_is_still_open(wal: tuple[str, int]) -> None:
    """The WAL unlinked while SQLite's descriptor keeps it alive: statx finds no file, the check says lost."""
    db, _ = wal
    watch = WalWatch(db)
    assert not watch.lost()
    os.unlink(db + "-wal")
    assert watch.lost()
    assert walwatch._Use.statx is not None


@needs_statx
def test_a_wal_replaced_by_rename_or_by_a_new_file_is_lost(wal: tuple[str, int], tmp_path: Path) -> None:
    """Another file renamed over the WAL, and (separately) the WAL deleted and a new one created (what
    another process's open does after the last close deleted it): both are another inode, both lost."""
    db, _ = wal
    watch = WalWatch(db)
    other = tmp_path / "other"
    other.write_bytes(b"y")
    os.rename(other, db + "-wal")
    assert watch.lost()

    db2 = str(tmp_path / "k.db")
    fd = os.open(db2 + "-wal", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        watch2 = WalWatch(db2)
        os.unlink(db2 + "-wal")
        os.close(os.open(db2 + "-wal", os.O_RDWR | os.O_CREAT, 0o600))
        assert watch2.lost()
    finally:
        os.close(fd)


@needs_statx
@pytest.mark.skipif(not _can_mount(), reason="needs root and a mount namespace")
def test_a_wal_hidden_by_a_mount_over_its_directory_is_lost(tmp_path: Path) -> None:
    """In a child in its own mount namespace: a tmpfs, then a bind mount of another directory holding a
    WAL with the same name, mounted over the journal's directory. The name now reaches a file on another
    device (tmpfs) or another file (the bind mount: same device, another inode): lost both times, as
    ``os.stat`` would say; and a journal reached through a bind mount of its own directory is not lost."""
    script = f"""
import os, subprocess, sys
from effectlog.journal.walwatch import WalWatch, _Use
base = {str(tmp_path)!r}
d, other, alias = os.path.join(base, "d"), os.path.join(base, "other"), os.path.join(base, "alias")
for p in (d, other, alias):
    os.makedirs(p)
fd = os.open(os.path.join(d, "j.db-wal"), os.O_RDWR | os.O_CREAT, 0o600)
open(os.path.join(other, "j.db-wal"), "w").close()
subprocess.run(["mount", "--bind", d, alias], check=True)
through_alias = WalWatch(os.path.join(alias, "j.db"))
watch = WalWatch(os.path.join(d, "j.db"))
assert not watch.lost() and not through_alias.lost()
subprocess.run(["mount", "-t", "tmpfs", "tmpfs", d], check=True)
open(os.path.join(d, "j.db-wal"), "w").close()
tmpfs = watch.lost()
subprocess.run(["umount", d], check=True)
assert not watch.lost()
subprocess.run(["mount", "--bind", other, d], check=True)
bound = watch.lost()
print(tmpfs, bound, _Use.statx is not None)
"""
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True", "True"]


@needs_statx
def test_a_statx_that_leaves_the_inode_out_of_its_mask_falls_back_to_stat(wal: tuple[str, int]) -> None:
    """A statx that succeeds but fills no inode (``stx_mask`` without ``STATX_INO``: a file system or a
    filter that answers less than asked) is not believed: the answer comes from ``os.stat`` (a zeroed
    buffer would otherwise read as inode 0 on device 0:0, the same before and after a replacement), and
    the check goes to ``os.stat`` for good."""
    db, _ = wal
    saved = walwatch._Use.statx
    try:
        walwatch._Use.statx = lambda *args: 0  # "success", the buffer untouched: mask 0, inode 0, dev 0:0
        watch = WalWatch(db)
        assert walwatch._Use.statx is None
        assert watch._wal._seen == _stat_id(db + "-wal")  # (the -wal half of the watch)
        walwatch._Use.statx = lambda *args: 0
        os.unlink(db + "-wal")
        assert watch.lost()
    finally:
        walwatch._Use.statx = saved


@needs_statx
def test_the_check_is_right_in_threads_and_in_a_forked_child(wal: tuple[str, int]) -> None:
    """Four threads checking at once (each its own buffer) never see a loss that is not there, and all
    see it once the WAL is gone; a forked child (the ctypes function and the name it points to carried
    over) sees the same."""
    db, _ = wal
    watch = WalWatch(db)
    wrong: list[bool] = []

    def check(n: int) -> None:
        for _ in range(n):
            if watch.lost():
                wrong.append(True)

    threads = [threading.Thread(target=check, args=(2000,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        ok = not watch.lost()
        os.unlink(db + "-wal")
        os._exit(0 if ok and watch.lost() else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert watch.lost()


def test_an_openai_agents_tool_failing_after_its_effect_with_an_sdk_argument_error_is_not_taken_as_not_applied(
    tmp_path: Path,
) -> None:
    """attack18 made the SDK's argument check (the function never ran) ``NotApplied`` by the error's text.
    The same ``ModelBehaviorError`` text also comes out of a function that already made its effect: one that
    drives another tool or agent of the SDK built without a failure function (the user's choice), whose
    arguments are refused there. Proves: that call is taken as "not applied", the model is told, retries
    under a new call id, and the customer is charged twice. (Expected once fixed: the step is uncertain,
    ``UncertainEffect``, one charge; the fix decides by whether the function ran, not by the message.)"""
    from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from agents.exceptions import ModelBehaviorError
    from openai import AsyncOpenAI

    from effectlog.errors import UncertainEffect
    from effectlog.integrations.openai_agents import DurableRunner
    from provider_standin import ProviderStandIn

    set_tracing_disabled(True)
    effects: list[str] = []

    @function_tool
    def charge(to: str, amount: int) -> str:
        """Charge a customer, then send the receipt through another SDK tool (not idempotent)."""
        effects.append(to)  # the charge went through
        # what the SDK raises for the receipt tool's refused arguments when it has no failure function
        raise ModelBehaviorError("Invalid JSON input for tool send_receipt: expected a JSON object")

    provider = ProviderStandIn([("charge", {"to": "bob", "amount": 5}), ("charge", {"to": "bob", "amount": 5}), "done"])
    provider.start()
    try:
        client = AsyncOpenAI(base_url=provider.url, api_key="test", max_retries=0)
        model = OpenAIChatCompletionsModel(model="stand-in", openai_client=client)
        agent = Agent(name="billing", instructions="Charge customers.", model=model, tools=[charge])
        with contextlib.suppress(UncertainEffect):
            DurableRunner(journal=tmp_path / "runs.db").run_sync(agent, "charge bob 5", run_id="order-8")
    finally:
        provider.stop()
    assert ["bob"] == effects


def test_pg_a_claim_with_a_longer_owner_lease_outlives_a_server_restart_longer_than_its_lease() -> None:
    """attack17's restart grace keeps a claim last renewed before the server's start alive for 15 s after
    that start (``RESTART_GRACE_S``, the default owner lease), so that its owner gets a turn to renew. An
    owner with a longer ``owner_lease_s`` renews every third of it: with 90 s, every 30 s, and a restart
    longer than its lease left a window from the start's 15th second to the owner's next turn in which a
    claim took a live owner's run over (its call still in flight: a resume then sends the step again).
    The restart here is real (``pg_ctl`` stop and start); its length past the lease is written into the
    owner row (``alive_until`` in the past, what 90 s down would leave) instead of waited for. Proves: for
    20 s after the restart (past the default grace, within the owner's 90 s lease and its first renewal turn)
    no claim from another journal takes the run from its live owner: the owner row records its lease, and the
    grace lasts at least that long."""
    import psycopg

    from effectlog.errors import RunOwned
    from effectlog.journal.postgres import PostgresJournal
    from pg_fixture import started_cluster

    cluster = started_cluster()
    taken = False
    try:
        url = cluster.create_database()
        with PostgresJournal(url, owner_lease_s=90.0) as journal:
            claim = journal.claim("restart")
            with psycopg.connect(url, autocommit=True) as conn:  # as if the server had been down past the lease
                conn.execute(
                    "UPDATE effectlog.owners SET alive_until = extract(epoch FROM clock_timestamp()) - 1"
                    " WHERE run_id = 'restart'"
                )
            pg_ctl = str(cluster._bindir / "pg_ctl")
            cluster._run([pg_ctl, "-D", str(cluster.data), "-m", "fast", "-w", "-t", "30", "stop"], "stop")
            options = f"-c listen_addresses=127.0.0.1 -p {cluster.port} -k {cluster.tmp} -c fsync=off"
            cluster._run([pg_ctl, "-D", str(cluster.data), "-l", str(cluster.log), "-o", options, "-w", "start"],
                         "start")  # fmt: skip
            with PostgresJournal(url) as other:
                until = time.monotonic() + 20.0  # the grace (15 s) and a margin, within the owner's first turn
                while time.monotonic() < until and not taken:
                    try:
                        other.release(other.claim("restart"))
                        taken = True
                    except RunOwned:
                        time.sleep(0.2)
            journal.release(claim)
    finally:
        cluster.stop()
    assert not taken
