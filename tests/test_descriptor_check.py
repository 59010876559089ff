"""``filelocks.descriptors_closed``: the look after each tool call at this process's effectlog files.

It must never take a file another thread is closing for one a tool closed: a fleet runner's attempts
each open and close the effect store, and a false "closed" ends a run with ``descriptors_closed``, its
step's outcome unrecorded (uncertain at the next run, an operator's work for nothing).
"""

from __future__ import annotations

import threading
from pathlib import Path

from effectlog.adapters.effects import EffectStore
from effectlog.journal import filelocks
from effectlog.journal.sqlite import SqliteJournal


def test_a_store_another_thread_closes_is_never_taken_for_one_a_tool_closed(tmp_path: Path) -> None:
    """One thread opens and closes an effect store 300 times while another asks the question all along.
    Proves: the answer is "nothing closed" every time (the close of a file being released is its own)."""
    stop = threading.Event()
    seen: list[bool] = []

    def ask() -> None:
        while not stop.is_set():
            seen.append(filelocks.descriptors_closed())

    with SqliteJournal(tmp_path / "j.db"):  # a file that stays open meanwhile
        asking = threading.Thread(target=ask)
        asking.start()
        try:
            for _ in range(300):
                EffectStore(tmp_path / "e.db").close()
        finally:
            stop.set()
            asking.join()
    assert (True, []) == (len(seen) > 0, [s for s in seen if s])
