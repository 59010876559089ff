"""A process forked while one of effectlog's event loops runs gets a loop of its own.

An in-process tool may fork (daemonising code, a library spawning a helper). The child holds a
copy of the running loop whose epoll instance and self-pipe are the parent's own kernel objects,
shared, not copied. A child that returns into effectlog (it forgot ``os._exit``, or ends with
``sys.exit``) is refused at its first journal write (``JournalInherited``), but unwinding closes
its loop, and closing removes the self-pipe from the epoll instance it shares with the parent
(``epoll_ctl(DEL)``): the parent's loop then never hears that a tool's thread finished, and the
parent's run hangs for ever after the tool. So in a forked child each such loop gets a fresh epoll
instance and self-pipe before anything in the child can touch the shared ones; the child's copies
of the old descriptors are only closed, which does not change the parent's.

The loops are the ones effectlog runs (``runtime``), tracked weakly; a loop that is not a
selector loop (no ``_selector``) is left as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import weakref
from collections.abc import Callable
from typing import Any

from effectlog.journal.filelocks import identity

_LOOPS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


# Each tracked loop's epoll instance, as (st_dev, st_ino): a number something else closed and reused is not it.
_SELECTORS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[int, int] | None] = weakref.WeakKeyDictionary()


def track(loop: asyncio.AbstractEventLoop) -> None:
    """Remember ``loop`` as one of effectlog's: a forked child detaches it from the parent's."""
    _LOOPS.add(loop)
    selector = getattr(loop, "_selector", None)
    _SELECTORS[loop] = identity(selector.fileno()) if selector is not None else None


def _detach(loop: Any) -> None:
    selector = getattr(loop, "_selector", None)
    if selector is None or loop.is_closed():
        return
    loop._selector = type(selector)()  # a new epoll instance, the child's own
    with contextlib.suppress(Exception):
        selector.close()  # closes the child's descriptor only: no epoll_ctl on the shared instance
    # The old self-pipe is not in the new selector, so this only closes the child's copies of its
    # sockets; then a new pair, registered in the new selector.
    loop._close_self_pipe()
    loop._make_self_pipe()


# Selectors whose descriptor something else closed (``replace_closed``): kept here, never closed, so
# that no close (nor a garbage collection) closes a number another file may have by now.
_ABANDONED: list[Any] = []


def replace_closed(loop: Any) -> None:
    """Give ``loop`` (the running one) a new epoll instance and self-pipe when a tool closed its descriptors
    (``os.closerange``): its next wait failed with EBADF, and the run ended in chained tracebacks instead
    of its error. The old ones are left unclosed: their numbers may be other files' by now."""
    selector = getattr(loop, "_selector", None)
    if selector is None or loop.is_closed():  # no loop (None), or not a selector loop
        return
    found, known = identity(selector.fileno()), _SELECTORS.get(loop)
    if found is not None and (known is None or found == known):
        return
    _ABANDONED.append(selector)
    loop._selector = type(selector)()
    if loop in _SELECTORS:
        _SELECTORS[loop] = identity(loop._selector.fileno())
    old_csock = loop._csock.fileno() if loop._csock is not None else -1
    for sock in (loop._ssock, loop._csock):
        if sock is not None:
            sock.detach()  # the socket object forgets its number without closing it
    loop._ssock = loop._csock = None
    loop._internal_fds -= 1
    loop._make_self_pipe()
    with contextlib.suppress(ValueError):  # not the main thread: signals wake no loop of this thread's
        previous = signal.set_wakeup_fd(-1)  # the loop's old self-pipe, when it handles signals
        signal.set_wakeup_fd(loop._csock.fileno() if previous == old_csock >= 0 else previous)


def watch_closed(loop: Any, every_s: float = 0.5) -> Callable[[], None]:
    """While a tool runs on a thread, look at ``loop``'s descriptors every ``every_s`` on its own thread
    (``replace_closed``); returns the call that stops it. A tool on a thread that closed them left the
    loop asleep on an epoll instance nothing could wake: the thread's answer was queued, but its write
    to the closed self-pipe failed, and the run hung for ever. Asleep at most ``every_s`` now, the loop
    finds the answer queued, with a selector of its own for its next wait. No loop (``None``: a
    coroutine driven by hand, as ``durable`` does): nothing to watch."""
    if loop is None:
        return _nothing
    handle: asyncio.TimerHandle | None = None

    def tick() -> None:
        nonlocal handle
        replace_closed(loop)
        handle = loop.call_later(every_s, tick)

    handle = loop.call_later(every_s, tick)

    def stop() -> None:
        if handle is not None:
            handle.cancel()

    return stop


def _nothing() -> None:
    pass


def _after_fork_in_child() -> None:
    for loop in list(_LOOPS):
        with contextlib.suppress(Exception):
            _detach(loop)


os.register_at_fork(after_in_child=_after_fork_in_child)
