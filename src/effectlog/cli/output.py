"""Output helpers shared by the CLI commands: stable JSON, plain tables, and a stdout that
tools never write into and a closed pipe never turns into a different exit status."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

import msgspec


def _enc_hook(value: Any) -> Any:
    """A closed run's outcome holds its step rows lazily (``outcome.StepRows``): encoded as their list."""
    from effectlog.outcome import enc_hook

    return enc_hook(value)


_json = msgspec.json.Encoder(order="sorted", enc_hook=_enc_hook)


class _Stdout:
    gone = False  # the reader went away: fd 1 now points at /dev/null


_STDOUT = _Stdout()


def out(text: str) -> None:
    """Write ``text`` to stdout now. A reader that went away (``effectlog run ... | head -1``)
    is not an error of the command: the rest of its output is dropped, its exit status stays."""
    if _STDOUT.gone or sys.stdout is None:  # None: started with fd 1 closed
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        drop_stdout()


def err(text: str) -> None:
    """Write ``text`` to stderr now; a stderr that is closed or gone is not a reason to lose the exit status."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # AttributeError: sys.stderr is None
        sys.stderr.write(text)
        sys.stderr.flush()


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
def tools_write_to_stderr() -> Iterator[TextIO]:
    """While tools run, whatever they write to stdout (``print``, fd 1, child processes) goes to stderr.

    Yields a stream on the real stdout for effectlog's own output during the block (the
    runner's ``--json`` events); ``run`` writes its table or ``--json`` after the block. Either
    way a chatty tool can never break a reader of effectlog's output.
    """
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout at all: nothing to protect
        yield sys.stdout
        return
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        yield sys.stdout
        return
    real = open(saved, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115 - closed below
    try:
        yield real
    finally:
        with contextlib.suppress(OSError, ValueError):
            real.close()
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()  # a tool's buffered print goes to stderr too
        os.dup2(saved, 1)
        os.close(saved)


class NdjsonLog(io.StringIO):
    """A runner's log as newline-delimited JSON: one object per line it logs, on ``stream``.

    The runner writes ``effectlog runner ID: [request N [attempt M]: ]MESSAGE``; each becomes
    ``{"ts", "runner_id", "request_id", "attempt_no", "message"}`` (ids null when absent).
    """

    _LINE = re.compile(
        r"effectlog runner (?P<runner>.*?): (?:request (?P<req>\d+)(?: attempt (?P<att>\d+))?: )?(?P<msg>.*)"
    )

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream
        self._partial = ""
        self._gone = False  # the reader went away: the runner goes on, its events are dropped

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in lines if not self._gone else ():
            m = self._LINE.fullmatch(line)
            event = {
                "ts": time.time(),
                "runner_id": m.group("runner") if m else None,
                "request_id": int(m.group("req")) if m and m.group("req") else None,
                "attempt_no": int(m.group("att")) if m and m.group("att") else None,
                "message": m.group("msg") if m else line,
            }
            try:
                self.stream.write(_json.encode(event).decode() + "\n")
                self.stream.flush()
            except (BrokenPipeError, ValueError):
                self._gone = True
                break
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.flush()


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
