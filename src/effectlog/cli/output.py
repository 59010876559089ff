"""Output helpers shared by the CLI commands: stable JSON, plain tables, and a stdout that
tools never write into and a closed pipe never turns into a different exit status."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec

_json = msgspec.json.Encoder(order="sorted")


class _Stdout:
    gone = False  # the reader went away: fd 1 now points at /dev/null


_STDOUT = _Stdout()


def out(text: str) -> None:
    """Write ``text`` to stdout now. A reader that went away (``effectlog run ... | head -1``)
    is not an error of the command: the rest of its output is dropped, its exit status stays."""
    if _STDOUT.gone:
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        drop_stdout()


def drop_stdout() -> None:
    """Point fd 1 at /dev/null, so nothing more (not even the interpreter's last flush) fails on it."""
    _STDOUT.gone = True
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def emit_json(value: Any) -> None:
    out(msgspec.json.format(_json.encode(value), indent=2).decode() + "\n")


def emit_ndjson(value: Any) -> None:
    """One JSON object on one line (newline-delimited JSON, for streams of events)."""
    out(_json.encode(value).decode() + "\n")


@contextlib.contextmanager
def tools_write_to_stderr() -> Iterator[None]:
    """While tools run, whatever they write to stdout (``print``, fd 1, child processes) goes to stderr.

    effectlog's own output (a table, ``--json``) is written after the block, to the real
    stdout, so a chatty tool can never break a reader of that output.
    """
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout at all: nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()  # a tool's buffered print goes to stderr too
        os.dup2(saved, 1)
        os.close(saved)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
