"""Who may write a run: one live owner per run, a fact of the journal itself.

A process that drives a run (``effectlog run``, a runtime's run actor, a session's
pass) first *claims* it from the journal; every append to a claimed run is checked
inside the append's own transaction, and an append by anyone else to a run that has
a live owner is refused with ``RunOwned`` (exit 6), naming the owner. Operators
(approve, deny, reconcile) make a one-shot claim for the length of their one
transaction, so they write a run nobody drives, while other runs in the same journal
are driven by other processes.

What makes an owner *live* is the backend's, and never a guess:

- SQLite: an open-file-description (OFD) lock on one byte of the database file
  itself, at an offset derived from the run id. The kernel releases it when the
  owner's process dies (SIGKILL included), and it is a lock on the file, not on a
  path: symlinks, hard links, ``./`` and ``..`` all name the same bytes.
- PostgreSQL: a session advisory lock, held on a connection kept for the claim; the
  server releases it when that connection ends, whichever host the owner was on.

The owner row (pid, host, kind, since, token) names the owner for messages and
``status``; on PostgreSQL its token fences appends of an owner whose connection was
lost while another took the run over.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import msgspec

from effectlog.events import Event

OwnerKind = Literal["run", "session", "operator", "runner"]

# How long a claim waits for one-shot writers (operators) inside a transaction on the run.
PASSING_WAIT_S = 5.0


class Owner(msgspec.Struct, frozen=True, kw_only=True):
    """The process that drives (or last drove) a run."""

    pid: int
    host: str
    kind: str = "run"
    since: int = 0  # ns since the epoch, when the claim was taken
    runner: str | None = None
    # The machine boot and pid namespace the pid is one of (``this_node``; "" where unknown): a host name
    # alone is shared by containers of one host and by machines named alike, whose pids are not ours.
    node: str = ""
    # Its process's start in clock ticks after boot (``/proc``; 0 where unknown): with ``node``, it tells that
    # process from a later one given its pid without the wall clock, which an NTP step moves under ``since``.
    started: int = 0

    def describe(self) -> str:
        if self.runner:
            return f"runner {self.runner}" + (f" (pid {self.pid} on {self.host})" if self.host else "")
        return f"{self.kind} pid {self.pid} on {self.host}"


class InheritedHolder(Owner, frozen=True, kw_only=True):
    """A process that holds a run's lock it inherited through ``fork()`` from the run's owner (named in
    messages and ``status`` only; never recorded as an owner row)."""

    via: str = ""

    def describe(self) -> str:
        return f"{super().describe()} ({self.via})"


class Claim(msgspec.Struct, kw_only=True):
    """This process's ownership of one run, from ``Journal.claim`` until ``Journal.release``."""

    run_id: str
    owner: Owner
    token: int = 0  # the owner row's token written for this claim (0 until written)
    released: bool = False


class OwnerStatus(msgspec.Struct, frozen=True, kw_only=True):
    """What a reader can say about a run's owner: the last one recorded, and whether it still lives."""

    owner: Owner | None
    live: bool
    waiting: bool = False  # the live owner waits for a person's decision (a runner in waiting_decision)


def this_host() -> str:
    return socket.gethostname() or "localhost"


@functools.cache
def this_node() -> str:
    """This process's boot and pid namespace (Linux: ``/proc``), "" where there is no telling."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as file:
            boot = file.read().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot}/{namespace}"


def new_owner(kind: str = "run", runner: str | None = None) -> Owner:
    pid = os.getpid()
    fields = _stat(pid)
    return Owner(
        pid=pid,
        host=this_host(),
        kind=kind,
        since=time.time_ns(),
        runner=runner,
        node=this_node(),
        started=(_ticks(fields) or 0) if fields else 0,
    )


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Owner)


def encode_owner(owner: Owner) -> str:
    return _encoder.encode(owner).decode()


def decode_owner(text: str | bytes | None) -> Owner | None:
    """The owner row's JSON; ``None`` for a missing or unreadable row (it only ever names, never decides)."""
    if not text:
        return None
    try:
        return _decoder.decode(text)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def plausible(owner: Owner | None) -> Owner | None:
    """The recorded owner, if it can be the live one: a process of this host that is gone is not.

    A new owner's row is written with its first append; until then the row names the
    last owner, and naming a dead process as the one driving the run would mislead.
    """
    if owner is None or owner.runner:
        return owner
    return owner if may_still_act(owner) else None


def may_still_act(owner: Owner) -> bool:
    """Whether the owner's process may still be running: ``False`` only when this process can tell it is gone.

    Its pid is looked up only on the same host, boot and pid namespace (``node``); there, a pid now
    used by a process started after the claim is another process (the owner's ended).
    """
    if owner.host != this_host() or (owner.node and owner.node != this_node()):
        return True  # another machine, boot or namespace: its pids are not this one's to look up
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    fields = _stat(owner.pid)
    if fields and fields[0] in (b"Z", b"X"):
        return False  # killed, not yet reaped by its parent: it runs nothing any more
    if owner.started and owner.node and fields and _ticks(fields) is not None:
        return _ticks(fields) == owner.started  # another start: the pid is another process's now
    _, started = _process(owner.pid)  # an owner row written before ``started``
    return started is None or owner.since == 0 or started <= owner.since + _START_SLACK_NS


# ``/proc`` gives a process's start in clock ticks after boot and the boot in whole seconds.
_START_SLACK_NS = 2_000_000_000


def _stat(pid: int) -> list[bytes] | None:
    """The fields of ``/proc/<pid>/stat`` after the name (state first); ``None`` where there is no telling."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return file.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _ticks(fields: list[bytes]) -> int | None:
    """The process's start in clock ticks after boot: field 22 of the line, the first two before ")"."""
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _process(pid: int) -> tuple[bytes, int | None]:
    """Process ``pid``'s state letter and start, in ns since the epoch (Linux; ``b""`` and ``None`` where
    there is no telling): only for an owner row written before ``started``."""
    fields = _stat(pid)
    ticks = _ticks(fields) if fields else None
    try:
        with open("/proc/stat", "rb") as file:
            boot = next(int(line.split()[1]) for line in file if line.startswith(b"btime "))
    except (OSError, IndexError, ValueError, StopIteration):
        return b"", None
    if fields is None or ticks is None:
        return b"", None
    return fields[0], boot * 1_000_000_000 + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def describe(owner: Owner | None) -> str:
    return owner.describe() if owner is not None else "another process"


class Fence(Protocol):
    """Another proof of ownership than a claim, checked inside the append's own transaction.

    A fleet attempt's lease is one (``effectlog.fleet.fencing.LeaseFence``): the journal
    calls ``admit`` after it took the transaction's locks and before it writes, and
    ``written`` after its inserts, on the same connection, so the check and the append
    commit together or not at all.
    """

    def admit(self, conn: Any, events: Sequence[Event], encoded: Sequence[bytes]) -> bool:
        """Raise if the writer may not write; False when this very batch was already written under this fence."""
        ...

    def written(self, conn: Any, events: Sequence[Event], encoded: Sequence[bytes]) -> None:
        """After the batch's inserts, in the same transaction."""
        ...
