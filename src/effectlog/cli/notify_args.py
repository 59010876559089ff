"""``--notify-command`` / ``--notify-url`` for ``run``, ``recover`` and ``runner``: tell a person a run waits.

The CLI notes each run's last sequence number before it drives the run; afterwards,
each ``run.suspended`` or ``run.stopped`` written since then is one notification,
with the command that resolves it. A run that already waited before the command
started is not announced again.
"""

from __future__ import annotations

import argparse

from effectlog.notify import Notifier, cli_hooks


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
