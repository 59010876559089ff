"""The journal-writer actor: one per journal, shared by every run actor in a process.

Run actors hand it batches; it appends them in order. While one commit is in
flight, batches from other runs queue up and go out together in the next
transaction (group commit): each run still waits for its own batch to be durable
before it invokes a tool or advances, so no ordering guarantee is weakened.
With a single active run it appends inline, which is the fastest path.

A group's commit runs on a worker thread (SQLite releases the GIL while it
syncs), so the event loop stays free while the disk is busy: runs that are not in
the group (a tool running on a thread, a run just starting) go on, and their
batches form the next group. When every active run has its batch in the group,
no run can go on until the commit ends, so the commit runs inline, as a lone
run's does: the hop to a thread and back cost ~10% of the CPU per step at 32
runs (futures, wake-ups, the GIL and caches moving between cores). A batch may
carry the seal of the run it closes (``effectlog.seal``); the seal is written in
the same transaction.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import cast

from effectlog.events import Event
from effectlog.fold import Record
from effectlog.journal.checkpoint import CheckpointJournal, CheckpointRow, forwarding, is_checkpointing
from effectlog.journal.protocol import Journal
from effectlog.seal import SealingJournal, SealRow, is_sealing

_Pending = tuple[Sequence[Event], SealRow | None, CheckpointRow | None, "asyncio.Future[list[Record]]"]


class JournalWriter:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.active_runs = 0
        self._queue: list[_Pending] = []
        self._flushing = False
        self.commits = 0
        self.sealing = is_sealing(journal)  # (isinstance, once per class: a runtime per fleet run)
        self.checkpointing = is_checkpointing(journal)
        # A lone run's batch may go straight to append_checkpointed only where append and
        # append_sealed are known to be that call with nothing extra (SQLite's and PostgreSQL's own).
        self._direct = self.checkpointing and forwarding(journal)

    def append_alone(
        self, events: Sequence[Event], seal: SealRow | None = None, checkpoint: CheckpointRow | None = None
    ) -> list[Record] | None:
        """A lone run's batch straight to the journal's widest append, as a plain call (no coroutine for
        the caller to create and await; ``append`` takes this path too): ``None`` (nothing done) when the
        batch must go through ``append`` (other runs active, a group forming, a journal without it)."""
        if self.active_runs > 1 or self._flushing or self._queue or not self._direct:
            return None
        self.commits += 1
        return self.journal.append_checkpointed(  # type: ignore[attr-defined,no-any-return]
            events, (seal,) if seal is not None else (), (checkpoint,) if checkpoint is not None else ()
        )

    async def append(
        self, events: Sequence[Event], seal: SealRow | None = None, checkpoint: CheckpointRow | None = None
    ) -> list[Record]:
        """Append ``events`` atomically, with the seal of the run they close or a checkpoint segment of
        the run they advance if given; returns once durable."""
        queued = self.enqueue(events, seal, checkpoint)
        if queued is not None:
            return await queued
        done = self.append_alone(events, seal, checkpoint)  # the direct path, where the journal has one
        return done if done is not None else self._append_now(events, _one(seal), _one(checkpoint))

    def enqueue(
        self, events: Sequence[Event], seal: SealRow | None = None, checkpoint: CheckpointRow | None = None
    ) -> asyncio.Future[list[Record]] | None:
        """``append``'s group path as a plain call: the batch joins the next group commit and the future
        its run awaits is returned (set once the commit is durable). ``None`` (nothing done) when the batch
        goes alone, inline (``append`` or ``append_alone``). A run actor awaits the future itself: no
        coroutine per batch, and one frame fewer to resume when the group's commit wakes each of its runs."""
        if self.active_runs <= 1 and not self._flushing and not self._queue:
            return None
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Record]] = loop.create_future()
        self._queue.append((events, seal, checkpoint, future))
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().create_task(self._flush())
        return future

    def _append_now(
        self, events: Sequence[Event], seals: Sequence[SealRow] = (), checkpoints: Sequence[CheckpointRow] = ()
    ) -> list[Record]:
        self.commits += 1
        if checkpoints and self.checkpointing:
            return cast(CheckpointJournal, self.journal).append_checkpointed(events, seals, checkpoints)
        if seals and self.sealing:
            return cast(SealingJournal, self.journal).append_sealed(events, seals)
        return self.journal.append(events)

    async def _flush(self) -> None:
        try:
            while self._queue:
                group, self._queue = self._queue, []
                merged = [e for events, _, _, _ in group for e in events]
                seals = [seal for _, seal, _, _ in group if seal is not None]
                checkpoints = [ck for _, _, ck, _ in group if ck is not None]
                try:
                    if len(group) >= self.active_runs:  # every run waits for this commit: nothing to overlap
                        records = self._append_now(merged, seals, checkpoints)
                    else:
                        records = await asyncio.to_thread(self._append_now, merged, seals, checkpoints)
                except Exception:
                    # One run's bad batch must not fail the others: retry each alone.
                    for events, seal, ck, future in group:
                        try:
                            future.set_result(await asyncio.to_thread(self._append_now, events, _one(seal), _one(ck)))
                        except Exception as exc:
                            future.set_exception(exc)
                    continue
                except BaseException as exc:
                    # A simulated crash, an interrupt or a cancellation inside the commit: every
                    # run of the group and every run still waiting learns it; none hears "durable".
                    for _, _, _, future in [*group, *self._queue]:
                        if future.done():
                            continue
                        if isinstance(exc, asyncio.CancelledError):
                            future.cancel()
                        else:
                            future.set_exception(exc)
                    self._queue = []
                    if isinstance(exc, asyncio.CancelledError):
                        raise
                    return
                at = 0
                for events, _, _, future in group:
                    future.set_result(records[at : at + len(events)])
                    at += len(events)
        finally:
            self._flushing = False


def _one(row: tuple[str, int, bytes] | None) -> Sequence[tuple[str, int, bytes]]:
    return (row,) if row is not None else ()
