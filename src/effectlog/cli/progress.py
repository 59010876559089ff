"""``--quiet`` and ``--log-format``: progress lines on stderr for commands that drive runs."""

from __future__ import annotations

import argparse


def add_progress_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr (errors still print)")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="progress and log records on stderr as text lines (default) or one JSON object per line",
    )


def apply_progress_args(args: argparse.Namespace) -> None:
    from effectlog.observe.progress import cli_logging

    cli_logging(quiet=args.quiet, log_format=args.log_format)
