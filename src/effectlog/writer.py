"""The journal-writer actor: one per journal, shared by every run actor in a process.

Run actors hand it batches; it appends them in order. While one commit is in
flight, batches from other runs queue up and go out together in the next
transaction (group commit): each run still waits for its own batch to be durable
before it invokes a tool or advances, so no ordering guarantee is weakened.
With a single active run it appends inline, which is the fastest path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from effectlog.events import Event
from effectlog.fold import Record
from effectlog.journal.protocol import Journal


class JournalWriter:
    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.active_runs = 0
        self._queue: list[tuple[Sequence[Event], asyncio.Future[list[Record]]]] = []
        self._flushing = False
        self.commits = 0

    async def append(self, events: Sequence[Event]) -> list[Record]:
        if self.active_runs <= 1 and not self._flushing and not self._queue:
            return self._append_now(events)
        future: asyncio.Future[list[Record]] = asyncio.get_running_loop().create_future()
        self._queue.append((events, future))
        if not self._flushing:
            self._flushing = True
            asyncio.get_running_loop().create_task(self._flush())
        return await future

    def _append_now(self, events: Sequence[Event]) -> list[Record]:
        self.commits += 1
        return self.journal.append(events)

    async def _flush(self) -> None:
        try:
            while self._queue:
                group, self._queue = self._queue, []
                merged = [e for events, _ in group for e in events]
                try:
                    records = await asyncio.to_thread(self._append_now, merged)
                except Exception:
                    # One run's bad batch must not fail the others: retry each alone.
                    for events, future in group:
                        try:
                            future.set_result(await asyncio.to_thread(self._append_now, events))
                        except Exception as exc:
                            future.set_exception(exc)
                    continue
                at = 0
                for events, future in group:
                    future.set_result(records[at : at + len(events)])
                    at += len(events)
        finally:
            self._flushing = False
