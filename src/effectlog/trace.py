"""A hash-chained structured trace of every transition, recorded with structlog.

Each record is a JSON line holding the transition (run, seq, step, attempt, event
tag) plus ``prev`` and ``hash``: ``hash = H(prev || canonical record)``, where ``H`` is
the journal's chain function: SHA-256, or HMAC-SHA256 with the journal's key (a keyed
journal's trace cannot be extended or rewritten by someone without the key, as its
journal cannot). The trace is written after the journal commit, so it never claims more
than the journal holds. It carries digests, never arguments, so secrets cannot leak here.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import stat
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import structlog

from effectlog.canonical import canonical_json
from effectlog.errors import BadInput, TraceUnwritable
from effectlog.events import (
    Event,
    StepConfirmed,
    StepDenied,
    StepEvent,
    StepFailed,
    StepRequested,
    StepResent,
    StepUncertain,
    tag_of,
)

_GENESIS_HEX = "0" * 64
TORN = "torn: the file ends inside a record (cut mid-write); the records before it verify"
MAX_LINE_BYTES = 16 << 20  # a record carries ids, digests and a reason, never args or receipts: far less
_FIELDS_NEVER_TRACED = frozenset({"args", "plan", "receipt", "evidence"})
_OUTCOMES: dict[type, str] = {
    StepConfirmed: "confirmed",
    StepFailed: "failed",
    StepUncertain: "uncertain",
    StepDenied: "denied",
    StepResent: "resent",
}


def _link(key: bytes | None, prev: str, record: dict[str, Any]) -> str:
    """A record's ``hash``: SHA-256, or HMAC-SHA256 with the journal's key, of ``prev || canonical record``."""
    data = prev.encode() + canonical_json(record)
    if key is None:
        return hashlib.sha256(data).hexdigest()
    return hmac.new(key, data, hashlib.sha256).hexdigest()


def _untraced_dropped(logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: drops the fields a trace never holds; the record goes on to the file as a dict."""
    for name in _FIELDS_NEVER_TRACED & event_dict.keys():
        del event_dict[name]
    return event_dict


def _record_hash(line: bytes) -> str | None:
    """The ``hash`` of a trace record on ``line``, or None when the line is not one (not JSON, JSON
    that is not an object, no ``hash`` of 64 hex digits): every reader of a line asks this one question."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # nested deeper than the parser goes is no record either
        return None
    found = record.get("hash") if isinstance(record, dict) else None
    if not isinstance(found, str) or len(found) != 64 or found.strip("0123456789abcdef"):
        return None
    return found


def _regular(fd: int, path: Path) -> int:
    """``fd`` if it is a regular file (made blocking again), else closed and ``BadInput``: a FIFO, a
    device (``/dev/zero``: one endless line) or a socket is no trace file, and would block or never end."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadInput(f"{path}: not a regular file, so not a trace file")
    os.set_blocking(fd, True)
    return fd


def last_hash(path: Path) -> str:
    if not path.exists() or path.stat().st_size == 0:
        return _GENESIS_HEX
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - 65536))
        tail = fh.read().splitlines()
    for line in reversed(tail):
        if line.strip():
            found = _record_hash(line)
            if found is not None:
                return found
            break
    raise BadInput(f"{path}: the trace file does not end with a trace record; refusing to extend it")


def _ends_a_line(path: Path, size: int) -> bool:
    """Whether the file's first ``size`` bytes are empty or end with a newline."""
    if size == 0:
        return True
    with path.open("rb") as fh:
        fh.seek(size - 1)
        return fh.read(1) == b"\n"


class _AppendFile:
    """structlog's logger for the trace: chains and writes each record under an exclusive lock on the file.

    The chain continues from the file's last record as it is when the record is written, not as it
    was when this trace was opened: another process tracing into the same file (another run, an
    operator's decision) may have appended since, and chaining from a stale hash broke the chain over
    a file nobody touched. Each record is written whole with ``os.write`` (nothing left in a buffer for
    a later flush or close to write again), or not at all: a write the file cannot take (a full disk, a
    file size limit) is cut back to where the record began, so the file still ends with a whole record
    and the same ``--trace`` can extend it, and raises ``TraceUnwritable``.
    """

    def __init__(self, path: Path, fd: int, prev: str, key: bytes | None) -> None:
        self.path = path
        self.fd = fd
        self.prev = prev
        self.key = key
        self.end = -1  # the file's size after this trace's last write; another size: someone else wrote

    def msg(self, **fields: Any) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            began = os.lseek(self.fd, 0, os.SEEK_END)
            # A file whose last record has no newline after it (a copy, an editor) still verifies; a
            # record written straight after it would share its line, and neither would verify.
            lead = b""
            if began != self.end:
                self.prev = last_hash(self.path)
                lead = b"" if _ends_a_line(self.path, began) else b"\n"
            fields["prev"] = self.prev
            digest = _link(self.key, self.prev, fields)
            fields["hash"] = digest
            data = lead + (json.dumps(fields, sort_keys=True) + "\n").encode()
            size = len(data)
            try:
                while data:
                    data = data[os.write(self.fd, data) :]
            except OSError as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(self.fd, began)
                raise TraceUnwritable(
                    f"{self.path}: cannot write the trace file ({exc.strerror}); the run stopped after its last "
                    "commit and can be resumed"
                ) from None
            self.prev, self.end = digest, began + size
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    info = msg


class Trace:
    """Records transitions to a JSON-lines file (appending, continuing its chain). ``key``: the journal's
    chain key (``Runtime`` passes it), so the trace is chained as its journal is."""

    def __init__(self, path: str | os.PathLike[str], *, key: bytes | None = None) -> None:
        self.path = Path(path)
        self._requested: dict[tuple[str, str, int], int] = {}  # step.requested ts, for durations
        try:
            prev = last_hash(self.path)
            # O_NONBLOCK: a FIFO with no reader fails here (and is refused below) instead of blocking
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK
            self._fd = _regular(os.open(self.path, flags, 0o666), self.path)
            st = os.fstat(self._fd)
        except OSError as exc:
            raise BadInput(f"{self.path}: cannot open the trace file ({exc.strerror})") from None
        self._key = (st.st_dev, st.st_ino)
        logger = _AppendFile(self.path, self._fd, prev, key or None)
        self._log = structlog.wrap_logger(logger, processors=[_untraced_dropped])

    def record(self, event: Event, **extra: Any) -> None:
        fields: dict[str, Any] = {"run_id": event.run_id, "seq": event.seq, "ts": event.ts, **extra}
        if isinstance(event, StepEvent):
            fields.update(step_id=event.step_id, attempt=event.attempt, **self._outcome(event))
        self._log.info(tag_of(event), **fields)

    def _outcome(self, event: StepEvent) -> dict[str, Any]:
        """A step's outcome, its error and its duration (issue 16), from the events alone.

        The duration is ``ts`` of the outcome minus ``ts`` of the ``step.requested`` this trace
        recorded for the same attempt (the runtime's clock, as the journal has it); absent when
        the request was recorded elsewhere (another process, before a crash).
        """
        key = (event.run_id, event.step_id, event.attempt)
        if isinstance(event, StepRequested):
            self._requested[key] = event.ts
            return {}
        outcome = _OUTCOMES.get(type(event))
        if outcome is None:
            return {}
        if isinstance(event, StepDenied) and event.decision == "require_approval":
            outcome = "held"
        found: dict[str, Any] = {"outcome": outcome}
        reason = getattr(event, "reason", "")
        if reason and outcome in ("failed", "uncertain", "denied", "held"):
            found["error"] = reason
        began = self._requested.get(key) if outcome == "resent" else self._requested.pop(key, None)
        if began is not None:
            found["duration_ms"] = round((event.ts - began) / 1e6, 3)
        return found

    def flush(self) -> None:
        """Each record is written whole when it is recorded; nothing is buffered."""

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            with contextlib.suppress(OSError):
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == self._key:  # not a number something else closed and reused
                    os.close(fd)


def verify_trace(path: str | os.PathLike[str], *, key: bytes | None = None) -> tuple[int, int | None, str]:
    """Check a trace's chain: ``(records checked, first bad line or None, reason)``. ``key``: the
    journal's key, for the trace of a keyed journal (without it every record reads as changed)."""
    prev = _GENESIS_HEX
    count = 0
    try:
        fd = _regular(os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK), Path(path))
    except OSError as exc:
        raise BadInput(f"{path}: cannot open the trace file ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as fh:
        # Read no line past MAX_LINE_BYTES: a file without newlines would otherwise be read whole.
        for lineno, line in enumerate(iter(lambda: fh.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(line) > MAX_LINE_BYTES:
                return count, lineno, "not a trace record"
            if not line.strip():
                continue
            stored = _record_hash(line)
            if stored is None:
                if not line.endswith(b"\n"):  # the file's last line, cut short: a crash mid-write, not an edit
                    return count, lineno, TORN
                return count, lineno, "not a trace record"
            record = json.loads(line)
            del record["hash"]
            if record.get("prev") != prev:
                return count, lineno, "prev does not match the previous record's hash"
            if not hmac.compare_digest(_link(key or None, prev, record), stored):
                return count, lineno, "hash does not match the record" + (" (with the key given)" if key else "")
            prev = stored
            count += 1
    return count, None, ""
