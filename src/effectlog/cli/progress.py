"""``--quiet`` and ``--log-format``: progress lines on stderr for commands that drive runs.

Progress is on by default, on a terminal or not: a line per step (``effectlog run``), per case
or kill (``crash-matrix``), per claim and attempt outcome (``runner``); ``--quiet`` silences
it. The one-line error contract (README, exit statuses) still holds where it matters: bad
input is refused before any step runs, so it prints no progress, only its one line; a run
that fails while it runs ends stderr with its one-line error (progress lines come before it).
"""

from __future__ import annotations

import argparse
import io
import re
import sys
from collections.abc import Callable
from typing import TextIO

# Set by main() from --log-format json: then the error lines are JSON objects too, so every
# stderr line of the command parses (tools that write to stderr themselves excepted).
_JSON_ERRORS = [False]


def json_errors(args: argparse.Namespace) -> None:
    _JSON_ERRORS[0] = getattr(args, "log_format", None) == "json"


def error_line(text: str, *, logger: str = "effectlog", **fields: object) -> str:
    """An error line for stderr: ``text`` itself, or with ``--log-format json`` one JSON object whose
    ``event`` is that same text (``level`` error, ``logger``, ``timestamp``, and ``fields``)."""
    if not _JSON_ERRORS[0]:
        return text + "\n"
    import datetime
    import json

    now = datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")
    record = {**fields, "event": text, "level": "error", "logger": logger, "timestamp": now}
    return json.dumps(record, sort_keys=True) + "\n"


def end_logging() -> None:
    """At the end of ``main()``: the ``effectlog`` logger as it was before the command set it up."""
    progress = sys.modules.get("effectlog.observe.progress")  # not imported: nothing was set up
    if progress is not None:
        progress.restore_logging()


def add_progress_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--progress",
        action="store_true",
        help="a line per step on stderr (the default; kept so scripts that pass it still work)",
    )
    p.add_argument("--quiet", "-q", action="store_true", help="no progress lines on stderr (errors still print)")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        help="progress and log records on stderr as text lines (default) or one JSON object per line",
    )


def apply_progress_args(args: argparse.Namespace) -> None:
    from effectlog.observe.progress import cli_logging

    cli_logging(quiet=args.quiet, log_format=args.log_format or "text")


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


def add_runner_args(p: argparse.ArgumentParser) -> None:
    """``runner``: its lines (a claim, an attempt's outcome, problems) silenced or as JSON on stderr."""
    p.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress lines on stderr (ready, each claim, each attempt that succeeded, exiting); "
        "problems and attempts that did not succeed still print",
    )
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="the runner's lines on stderr as text (default) or one JSON object per line",
    )


def runner_log(args: argparse.Namespace, stdout: TextIO) -> TextIO | None:
    """Where the runner writes its lines: ``--json`` events on stdout, else stderr as text, JSON or problems only."""
    from effectlog.cli.output import NdjsonLog

    if args.json:
        return NdjsonLog(stdout)
    if args.quiet:
        return ProblemsOnly(sys.stderr)
    if args.log_format == "json":
        return NdjsonLog(sys.stderr)
    return None  # the runner's default: text lines on stderr


class ProblemsOnly(io.StringIO):
    """A runner's log under ``--quiet``: its progress lines (ready, a claim, an attempt that succeeded,
    exiting) are dropped; anything else (an attempt that failed or needs an operator, a refused
    heartbeat, a lost lease, a failed claim, recovery's decisions, a signal) is written as is."""

    _PROGRESS = re.compile(
        r"effectlog runner .*?: (?:ready: .*|exiting: .*"
        r"|request \d+ attempt \d+: leased with token \d+"
        r"|request \d+ attempt \d+: succeeded)"  # other outcomes (failed, needs_operator, ...) still print
    )

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self._partial = ""

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        kept = [line for line in lines if not self._PROGRESS.fullmatch(line)]
        if kept:
            self.stream.write("".join(line + "\n" for line in kept))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()
