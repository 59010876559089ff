"""``--notify-command`` / ``--notify-url`` for ``run``, ``recover`` and ``runner``: tell a person a run waits.

The CLI notes each run's last sequence number before it drives the run; afterwards,
each ``run.suspended`` or ``run.stopped`` written since then is one notification,
with the command that resolves it. A run that already waited before the command
started is not announced again.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from effectlog import events as ev
from effectlog.notify import Notification, Notifier, cli_hooks, deliver
from effectlog.stake import approve_command, reconcile_command


def add_notify_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--notify-command",
        metavar="CMD",
        help="run CMD (through the shell, the notification as JSON on stdin) when a run suspends for approval, "
        "stops on an uncertain step or needs an operator",
    )
    p.add_argument("--notify-url", metavar="URL", help="POST the notification as JSON to URL (same occasions)")


def hooks(args: argparse.Namespace) -> tuple[Notifier, ...]:
    return cli_hooks(getattr(args, "notify_command", None), getattr(args, "notify_url", None))


def marks(journal: Any, run_ids: Iterable[str]) -> dict[str, int]:
    """Each run's last sequence number now: what was written after it is this command's."""
    return {run_id: journal.head(run_id)[0] for run_id in run_ids}


def notify_new_waits(
    notifiers: Sequence[Notifier], journal: Any, location: str, since: Mapping[str, int]
) -> list[Notification]:
    """One notification per ``run.suspended``/``run.stopped`` written after ``since[run_id]``."""
    sent: list[Notification] = []
    if not notifiers:
        return sent
    for run_id, seq in since.items():
        for record in journal.read(run_id, seq):
            event = ev.decode(record.body)
            if isinstance(event, ev.RunSuspended | ev.RunStopped):
                note = _notification(location, event)
                deliver(notifiers, note)
                sent.append(note)
    return sent


def _notification(location: str, event: ev.RunSuspended | ev.RunStopped) -> Notification:
    if isinstance(event, ev.RunSuspended):
        return Notification(
            kind="suspended",
            run_id=event.run_id,
            step_id=event.step_id,
            reason=event.reason,
            command=approve_command(location, event.run_id, event.step_id),
            journal=location,
            seq=event.seq,
        )
    return Notification(
        kind="stopped",
        run_id=event.run_id,
        step_id=event.step_id,
        reason=event.reason,
        command=reconcile_command(location, event.run_id, event.step_id),
        journal=location,
        seq=event.seq,
    )
