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
import weakref
from typing import Any

_LOOPS: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()


def track(loop: asyncio.AbstractEventLoop) -> None:
    """Remember ``loop`` as one of effectlog's: a forked child detaches it from the parent's."""
    _LOOPS.add(loop)


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


def _after_fork_in_child() -> None:
    for loop in list(_LOOPS):
        with contextlib.suppress(Exception):
            _detach(loop)


os.register_at_fork(after_in_child=_after_fork_in_child)
