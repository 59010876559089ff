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

    def describe(self) -> str:
        if self.runner:
            return f"runner {self.runner}" + (f" (pid {self.pid} on {self.host})" if self.host else "")
        return f"{self.kind} pid {self.pid} on {self.host}"


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


def new_owner(kind: str = "run", runner: str | None = None) -> Owner:
    return Owner(pid=os.getpid(), host=this_host(), kind=kind, since=time.time_ns(), runner=runner)


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
    if owner is None or owner.runner or owner.host != this_host():
        return owner
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return owner  # alive, another user's
    return owner


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
