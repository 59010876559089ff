"""What a tool may have done to this process's descriptors, looked at after each call.

A tool that closes every descriptor past stderr (``os.closerange(3, ...)``, as daemonising helpers
do) takes the journal's, SQLite's and the event loop's with it. Recording its outcome then would go
through SQLite connections whose descriptor numbers may name other files by now, and the loop's next
wait fails with EBADF (in-process tool) or never wakes (tool on a thread: its wake-up went to the
closed self-pipe). So after each call of a tool that is not effectlog's own, ``refuse_closed`` looks
(an ``fstat`` per open effectlog file) and, if one is gone, ends the run with ``DescriptorsClosed``
before anything of the step is recorded; ``loopfork.watch_closed`` keeps the loop awake meanwhile.
"""

from __future__ import annotations

import asyncio

from effectlog import loopfork
from effectlog.errors import DescriptorsClosed
from effectlog.journal import filelocks


def refuse_closed(run_id: str, step_id: str) -> None:
    """``DescriptorsClosed`` if the call just made closed descriptors of this process's effectlog files.

    Then those files' connections are never closed (``filelocks.may_close``), and the running loop gets
    an epoll instance and self-pipe of its own (``loopfork.replace_closed``), so that the run ends with
    this error, in one line."""
    if not filelocks.descriptors_closed():
        return
    loopfork.replace_closed(asyncio._get_running_loop())  # None: a coroutine driven by hand (durable)
    raise DescriptorsClosed(
        f"step {step_id!r}: its tool closed descriptors of this process that effectlog's files use (the "
        "journal's, and SQLite's with them); nothing more is written by this process, and what the tool did "
        "is not recorded: run it again (the step is then found uncertain, or resent under its key)",
        run_id=run_id,
        step_id=step_id,
    )
