"""The worker process: runs (or resumes) one plan, with at most one crash point armed.

When the armed point is reached it writes ``"<point> <step>\\n"`` to the notify
pipe and blocks until the parent's SIGKILL. Started as
``python -m effectlog crash-matrix worker``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from effectlog.adapters.registry import Registry, load_object
from effectlog.blind import blind_run
from effectlog.crashmatrix.processes import START
from effectlog.journal import open_journal
from effectlog.plan import load_plan
from effectlog.runtime import Runtime


def block_forever() -> None:
    while True:  # the parent's SIGKILL ends this; nothing after the crash point runs
        time.sleep(3600)


def make_hook(arm: str | None, notify_fd: int | None) -> Callable[[str, str], None]:
    def hook(point: str, step_id: str) -> None:
        if arm is not None and point == arm:
            if notify_fd is not None:
                os.write(notify_fd, f"{point} {step_id}\n".encode())
            block_forever()

    return hook


def work(
    plan_path: str,
    journal: str | None,
    effects: str | None,
    *,
    arm: str | None,
    notify_fd: int | None,
    blind: str | None = None,
    user_adapter: str | None = None,
    adapters: list[str] | None = None,
) -> int:
    plan = load_plan(plan_path)
    announce_start = arm == START and notify_fd is not None
    hook = make_hook(None if announce_start else arm, notify_fd)
    if blind is not None:
        blind_run(plan, blind, effects=effects, crash_hook=hook)
        return 0
    assert journal is not None
    registry = Registry()
    for spec in adapters or []:
        registry.add_module(spec)
    if user_adapter is not None:
        from effectlog.crashmatrix.usercases import USER_TYPE

        registry.factories[USER_TYPE] = load_object(user_adapter)
    with Runtime(open_journal(journal), adapters=registry, effects=effects, crash_hook=hook) as runtime:
        if announce_start:  # the soak: "my run begins now"; the parent kills at a random moment after
            os.write(notify_fd, f"{START} -\n".encode())  # type: ignore[arg-type]
        status = runtime.run(plan).exit_status
    if announce_start:
        # Leave at once: the journal is closed and durable; interpreter teardown would only
        # widen the soak's kill window with moments where there is nothing left to kill.
        os._exit(status)
    return status
