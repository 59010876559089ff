"""The effect store under a second name: what counts effects must be one ledger, whatever it is called.

SQLite keeps a database's WAL beside the name it was opened by. An effect committed through one name
and not yet checkpointed is invisible through another name of the same file, so an idempotency key
would be applied a second time and a ledger inspection would answer "not applied" for an effect that
exists. Hard links were refused already (tests/test_attack_round4.py); these cases are the other ways
to get a second name: a rename while a process has the store open, and a bind mount of the file
(root only). The journal refuses the same cases (tests/test_run_ownership.py); the store now shares
its check (``filelocks.second_name``) and its check before each commit (the name still leads to the
file it opened).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectlog.adapters.effects import EffectStore
from effectlog.adapters.protocol import Request
from effectlog.errors import StoreAliased

_HOLDER = """
import sys
from effectlog.adapters.effects import EffectStore
from effectlog.adapters.protocol import Request
store = EffectStore(sys.argv[1])
store.apply_idempotent(Request(run_id="pay-1", step_id="charge", attempt=1, idempotency_key="k-1", args={"c": 5}))
print("ready", flush=True)
sys.stdin.read()  # holds the store open (its effect in the WAL) until the test closes stdin
store.close()
"""

CHARGE = Request(run_id="pay-1", step_id="charge", attempt=1, idempotency_key="k-1", args={"c": 5})


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A live process that applied key k-1 through ``fx.db`` and keeps the store open."""
    argv = [sys.executable, "-c", _HOLDER, str(tmp_path / "fx.db")]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert "ready\n" == proc.stdout.readline()
    yield proc
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=30)


def test_a_store_renamed_while_another_process_has_it_open_is_refused_under_its_new_name(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    """Renamed while a live process holds it, with an effect only in the WAL beside the old name: the
    new name read the file without that WAL and applied key k-1 a second time. Proves: the new name is
    refused (``StoreAliased``, naming the file) while the old one is in use, and the holder's close
    checkpoints its effect into the file (SQLite skips that for a moved file), so the key is answered
    from the ledger under the new name: one effect. (A holder killed after the rename leaves its WAL
    beside a name nobody opens: SQLite's own hazard of renaming a live database, out of our reach;
    the next test bounds it to what was committed before the rename.)"""
    os.rename(tmp_path / "fx.db", tmp_path / "moved.db")

    with pytest.raises(StoreAliased, match=r"moved\.db"):
        EffectStore(tmp_path / "moved.db")

    holder.stdin.close()  # type: ignore[union-attr]
    holder.wait(timeout=30)  # its close checkpoints the effect into the file under its new name
    store = EffectStore(tmp_path / "moved.db")
    assert (True, 1) == (store.apply_idempotent(CHARGE).data["replayed"], store.count())
    store.close()


_WRITER = """
import os, signal, sys
from effectlog.adapters.effects import EffectStore
from effectlog.adapters.protocol import Request
store = EffectStore(sys.argv[1])
store.apply_idempotent(Request(run_id="pay-1", step_id="charge", attempt=1, idempotency_key="k-1", args={"c": 5}))
print("ready", flush=True)
sys.stdin.readline()  # the test renames the store meanwhile
try:
    store.apply_idempotent(Request(run_id="pay-1", step_id="refund", attempt=1, idempotency_key="k-2", args={}))
    print("applied", flush=True)
except Exception as exc:
    print(type(exc).__name__, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # no close: whatever is in the WAL beside the old name stays there
"""


def test_a_store_renamed_under_its_writer_refuses_the_next_effect_and_keeps_the_earlier_ones(tmp_path: Path) -> None:
    """A writer whose store was renamed under it went on committing into the WAL beside the old name:
    killed there, its effects were orphaned beside a name nobody opens, and the store under its new
    name applied their keys again. Proves: the writer refuses its next effect (``StoreAliased``),
    having first checkpointed what it had committed into the file, so after its SIGKILL the renamed
    store answers the earlier key as applied (one effect) and holds no trace of the refused one."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tmp_path / "fx.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdin is not None
    assert "ready\n" == proc.stdout.readline()
    os.rename(tmp_path / "fx.db", tmp_path / "moved.db")
    proc.stdin.write("go\n")
    proc.stdin.flush()
    answer = proc.stdout.readline().strip()
    assert -9 == proc.wait(timeout=30)

    store = EffectStore(tmp_path / "moved.db")
    again = store.apply_idempotent(CHARGE).data.get("replayed", False)
    assert ("StoreAliased", True, ["k-1"]) == (answer, again, [r.idempotency_key for r in store.rows()])
    store.close()


def _bind_mount(source: Path, target: Path) -> bool:
    target.touch()
    done = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True)
    return done.returncode == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount needs root")
def test_a_store_file_bind_mounted_at_a_second_name_is_refused_there(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    """A bind mount gives the file a second name with one link (the hard-link check does not see it),
    and SQLite a second WAL. Proves: while the store is open under its first name, the second is refused
    (``StoreAliased``), nothing applied."""
    second = tmp_path / "second.db"
    if not _bind_mount(tmp_path / "fx.db", second):
        pytest.skip("mount --bind is not permitted here")
    try:
        with pytest.raises(StoreAliased, match=r"second\.db"):
            EffectStore(second)
    finally:
        subprocess.run(["umount", "--lazy", str(second)], check=True)  # lazy: even if a failed check left it open
