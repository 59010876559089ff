"""``actor._guarded`` puts a tool's signal handlers back only in the main thread, which it tells by an
ident taken once (``threading.main_thread().ident`` costs two frames per tool call). After a fork the
thread that forked is the child's main thread: these tests prove the ident follows it, so a tool called
inline in such a child still has the SIGINT handler it replaced put back (README: exit 130)."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from effectlog import actor


def _replaces_sigint(_request: Any) -> str:
    signal.signal(signal.SIGINT, lambda *_: None)
    return "done"


def test_the_main_threads_ident_is_the_one_threading_names() -> None:
    """In this process: the cached ident is the main thread's."""
    assert threading.main_thread().ident == actor._main[0]


def test_a_child_forked_from_another_thread_takes_that_thread_as_its_main_one() -> None:
    """Fork from a worker thread; in the child, the cached ident is the forking thread's (the child's main
    thread), and a tool that replaces the SIGINT handler inline has it put back by ``_guarded``."""
    result: list[int] = []

    def fork_here() -> None:
        pid = os.fork()
        if pid == 0:  # the child: report through the exit status only
            ok = actor._main[0] == threading.get_ident() == threading.main_thread().ident
            before = signal.getsignal(signal.SIGINT)
            actor._guarded(_replaces_sigint, None)  # type: ignore[arg-type]
            ok = ok and signal.getsignal(signal.SIGINT) is before
            os._exit(0 if ok else 1)
        result.append(os.waitpid(pid, 0)[1])

    worker = threading.Thread(target=fork_here)
    worker.start()
    worker.join()
    assert [0] == [os.waitstatus_to_exitcode(status) for status in result]
