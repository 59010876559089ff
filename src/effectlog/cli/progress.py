"""``--progress``, ``--quiet`` and ``--log-format``: progress lines on stderr for commands that drive runs.

Progress is on by default when stderr is a terminal. When it is not (a pipe, a file, a test
harness), it is on only when asked for with ``--progress`` or ``--log-format``: scripts that
read stderr for the one-line error contract (README, exit statuses) see exactly what they
saw before.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def add_progress_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--progress",
        action="store_true",
        help="a line per step on stderr even when stderr is not a terminal (default: only on a terminal)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr (errors still print)")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="progress and log records on stderr as text lines or one JSON object per line (implies --progress)",
    )


def apply_progress_args(args: argparse.Namespace) -> None:
    from effectlog.observe.progress import cli_logging

    wanted = args.progress or args.log_format is not None or sys.stderr.isatty()
    cli_logging(quiet=args.quiet or not wanted, log_format=args.log_format or "text")


def add_line_args(p: argparse.ArgumentParser) -> None:
    """For commands whose progress lines were always on (crash-matrix run and soak): silence or JSON."""
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr (errors still print)")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="progress lines on stderr as text (default) or one JSON object per line",
    )


def line_sink(args: argparse.Namespace, logger: str) -> Callable[[str], None]:
    """Where a command's progress lines go: stderr as text, one JSON object per line, or nowhere."""
    from effectlog.cli.output import err  # a closed stderr never costs the exit status

    if args.quiet:
        return lambda line: None
    if args.log_format == "json":
        import datetime
        import json

        def emit(line: str) -> None:
            now = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
            record = {"event": line, "level": "info", "logger": logger, "timestamp": now}
            err(json.dumps(record, sort_keys=True) + "\n")

        return emit

    def text(line: str) -> None:
        err(line + "\n")

    return text
