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
    gone = False  # the reader went away: fd 1 (or ``held``) now points at /dev/null
    keep = False  # the ``effectlog`` process: once tools ran, fd 1 stays on stderr until it exits
    held: TextIO | None = None  # then: the real stdout, on a descriptor of its own, for ``out()``
    lost: OSError | None = None  # a write that failed otherwise (a full disk): the rest of the output is dropped


_STDOUT = _Stdout()


def standard_descriptors_open() -> None:
    """Point fds 0, 1 and 2 at /dev/null when the process was started with them closed (a
    supervisor's or a shell's ``2>&-``); called first thing by the process entry point.

    Otherwise the first file the process opens takes the free number: with fd 2 closed that was
    the journal, ``tools_write_to_stderr`` pointed fd 1 at it, and a tool's ``print`` wrote into
    the journal file (left "malformed" by the next checkpoint). Python set ``sys.stdout`` (or
    ``sys.stderr``, ``sys.stdin``) to None for a closed descriptor: each gets a stream on /dev/null instead.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free number: ``fd`` itself when it is the first
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    if sys.stdin is None:  # (read by console hash-password)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - lives as long as the process
    if sys.stdout is None:
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 - lives as long as the process
    if sys.stderr is None:
        sys.stderr = open(2, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 - lives as long as the process


def keep_tools_off_stdout() -> None:
    """Called by the process entry point only (``python -m effectlog``, the ``effectlog`` script).

    From the first ``tools_write_to_stderr`` block on, fd 1 is never pointed back at the real
    stdout: a thread a tool leaves running, or an ``atexit`` hook of its module, that prints
    after the run ends still writes to stderr, and ``out()`` writes to the real stdout through
    a descriptor of its own. An in-process caller of ``main()`` (a test with ``capsys``, a
    program embedding the CLI) does not call this: its fd 1 is given back when the block ends.
    """
    _STDOUT.keep = True


def _stream() -> TextIO | None:
    return _STDOUT.held if _STDOUT.held is not None else sys.stdout


def out(text: str) -> None:
    """Write ``text`` to stdout now. A reader that went away (``effectlog run ... | head -1``)
    is not an error of the command: the rest of its output is dropped, its exit status stays."""
    stream = _stream()
    if _STDOUT.gone or stream is None:  # None: started with fd 1 closed
        return
    try:
        if text:  # out("") only flushes: writing "" is a zero-length write(2), which /dev/full refuses too
            stream.write(text)
        stream.flush()
    except BrokenPipeError:
        drop_stdout()
    except OSError as exc:  # a full disk, an I/O error: the output is lost, which ``lost_output`` says
        _STDOUT.lost = exc
        drop_stdout()


def lost_output() -> OSError | None:
    """The error that lost the command's output on stdout (not a reader that went away), if any."""
    return _STDOUT.lost


def err(text: str) -> None:
    """Write ``text`` to stderr now; a stderr that is closed or gone is not a reason to lose the exit status."""
    with contextlib.suppress(OSError, ValueError, AttributeError):  # AttributeError: sys.stderr is None
        sys.stderr.write(text)
        sys.stderr.flush()


def drop_stdout() -> None:
    """Point the real stdout (fd 1, or the descriptor ``out()`` holds) at /dev/null, so nothing
    more (not even the interpreter's last flush) fails on it."""
    _STDOUT.gone = True
    with contextlib.suppress(OSError, ValueError, AttributeError):  # AttributeError: sys.stdout is None
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, (_STDOUT.held or sys.stdout).fileno())
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

    In the ``effectlog`` process (``keep_tools_off_stdout``) fd 1 stays on stderr after the
    block, until the process exits, and ``out()`` writes to the yielded stream: what a tool's
    thread prints after its call is covered too. Called in-process (``main()`` from Python),
    fd 1 is pointed back at the caller's stdout when the block ends, as the caller expects;
    a tool's thread printing after that writes to the caller's stdout.
    """
    if _STDOUT.held is not None:  # an earlier block of this process kept fd 1 on stderr
        yield _STDOUT.held
        return
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
    if _STDOUT.keep:  # the descriptor is out()'s until the process exits
        _STDOUT.held = open(saved, "w", encoding="utf-8", buffering=1)  # noqa: SIM115 - lives as long as the process
        try:
            yield _STDOUT.held
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()  # a tool's buffered print goes to stderr too
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
