"""Step-by-step records through the standard ``logging`` module, and the CLI's progress lines.

effectlog logs under the ``effectlog`` logger (``effectlog.run`` for runs and steps): an
application's handlers, levels and formatters apply, and nothing is built when the logger
is not enabled for INFO at the start of a run drive (the default: the root logger is at
WARNING). Each record carries structured fields in ``extra`` (``effectlog_event``,
``run_id``, ``step_id``, ``attempt``, ``outcome``, ``duration_ms``). The CLI turns them into
progress lines on stderr (``--quiet`` silences them; ``--log-format json`` renders one JSON
object per line with structlog).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from effectlog import events as ev
from effectlog.observe.hooks import RunHooks

_T = TypeVar("_T")

LOGGER = logging.getLogger("effectlog.run")

_ENDS: dict[type, str] = {
    ev.StepConfirmed: "confirmed",
    ev.StepFailed: "failed",
    ev.StepUncertain: "uncertain",
    ev.StepResent: "resent",
}


def enabled() -> bool:
    return LOGGER.isEnabledFor(logging.INFO)


class StepLog:
    """The log records of one run drive: its start, each step's outcome, its end."""

    def __init__(self, run_id: str, logger: logging.Logger = LOGGER) -> None:
        self.run_id = run_id
        self.logger = logger
        self.began: dict[str, float] = {}

    def _log(self, level: int, message: str, **fields: Any) -> None:
        self.logger.log(level, message, extra={"run_id": self.run_id, **fields})

    def fields(self) -> dict[str, str]:
        return {}

    async def drive(self, fn: Callable[[], Awaitable[Any]], *, recorded_seq: int, resumed_from: str) -> Any:
        outcome = await fn()
        level = logging.INFO if outcome.exit_status == 0 else logging.WARNING
        self._log(
            level,
            f"run {self.run_id} {outcome.state} (exit {outcome.exit_status})",
            effectlog_event="run.ended",
            outcome=outcome.state,
            exit_status=outcome.exit_status,
        )
        return outcome

    def recorded(self, events: Sequence[ev.Event], began: float) -> None:
        now = time.perf_counter()
        for event in events:
            if isinstance(event, ev.RunStarted | ev.RunResumed):  # only once it is durable: checks come first
                how = "started" if isinstance(event, ev.RunStarted) else "resumed"
                note = ""
                if isinstance(event, ev.RunStarted) and event.forked_from:
                    note = f" (forked from {event.forked_from} at step {event.from_step})"
                self._log(logging.INFO, f"run {self.run_id} {how}{note}", effectlog_event=f"run.{how}")
                continue
            if isinstance(event, ev.StepCarried):
                self._log(
                    logging.INFO,
                    f"run {self.run_id} step {event.step_id} carried (from {event.from_run}, not run again)",
                    effectlog_event="step.carried",
                    step_id=event.step_id,
                    outcome="carried",
                )
                continue
            if isinstance(event, ev.StepRequested):
                self.began[event.step_id] = now
                continue
            if isinstance(event, ev.StepDenied):
                outcome = "held" if event.decision == "require_approval" else "denied"
                self._step(event, outcome, now, logging.WARNING, event.reason)
                continue
            outcome = _ENDS.get(type(event), "")
            if outcome:
                level = logging.INFO if outcome in ("confirmed", "resent") else logging.WARNING
                self._step(event, outcome, now, level, getattr(event, "reason", ""))

    def _step(self, event: Any, outcome: str, now: float, level: int, reason: str) -> None:
        sid = event.step_id
        started = self.began.get(sid) if outcome == "resent" else self.began.pop(sid, None)
        took = (now - started) * 1000 if started is not None else None
        detail = f"attempt {event.attempt}" + (f", {took:.1f} ms" if took is not None else "")
        self._log(
            level,
            f"run {self.run_id} step {sid} {outcome} ({detail})" + (f": {reason}" if reason else ""),
            effectlog_event=f"step.{outcome}",
            step_id=sid,
            attempt=event.attempt,
            outcome=outcome,
            duration_ms=round(took, 3) if took is not None else None,
        )

    async def tool(self, call: Awaitable[_T], *, step_id: str, attempt: int, adapter: str, key: str) -> _T:
        return await call


class Both:
    """Spans and log records for the same run drive."""

    def __init__(self, spans: RunHooks, log: StepLog) -> None:
        self.spans = spans
        self.log = log

    def fields(self) -> dict[str, str]:
        return self.spans.fields()

    async def drive(self, fn: Callable[[], Awaitable[Any]], *, recorded_seq: int, resumed_from: str) -> Any:
        async def logged() -> Any:
            return await self.log.drive(fn, recorded_seq=recorded_seq, resumed_from=resumed_from)

        return await self.spans.drive(logged, recorded_seq=recorded_seq, resumed_from=resumed_from)

    def recorded(self, events: Sequence[ev.Event], began: float) -> None:
        self.spans.recorded(events, began)
        self.log.recorded(events, began)

    async def tool(self, call: Awaitable[_T], *, step_id: str, attempt: int, adapter: str, key: str) -> _T:
        return await self.spans.tool(call, step_id=step_id, attempt=attempt, adapter=adapter, key=key)


# The ``effectlog`` logger's level and propagation before the CLI set them: ``main()`` may run inside
# another program (or a test), which gets its logging back as it was when the command ends.
_before: list[tuple[int, bool]] = []


class _CurrentStderr:
    """The CLI handler's stream: whatever ``sys.stderr`` is at each write. A tool may close or replace
    ``sys.stderr``; a progress line (logged after a durable commit) that cannot be written is dropped, as
    ``cli.output.err`` drops an error line, never raised out of the run (``logging``'s own error handler
    writes to the same closed stream and raises)."""

    def write(self, text: str) -> int:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # AttributeError: sys.stderr is None
            sys.stderr.write(text)
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.flush()


def cli_logging(*, quiet: bool, log_format: str) -> None:
    """The CLI's handler: ``effectlog`` records on stderr, as text lines or one JSON object per line."""
    logger = logging.getLogger("effectlog")
    restore_logging()  # main() called again in one process: one handler, the last one asked for
    _before.append((logger.level, logger.propagate))
    if quiet:
        logger.setLevel(logging.ERROR)  # an application's own handlers (none in the CLI) would see errors only
        return
    handler: logging.StreamHandler[Any] = logging.StreamHandler(_CurrentStderr())
    handler.effectlog_cli = True  # type: ignore[attr-defined]
    if log_format == "json":
        import structlog

        handler.setFormatter(
            structlog.stdlib.ProcessorFormatter(
                foreign_pre_chain=[
                    structlog.stdlib.add_log_level,
                    structlog.stdlib.add_logger_name,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.stdlib.ExtraAdder(),
                ],
                processors=[
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.JSONRenderer(sort_keys=True),
                ],
            )
        )
    else:
        handler.setFormatter(logging.Formatter("effectlog: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the CLI owns the process: no second copy through the root logger


def restore_logging() -> None:
    """Undo ``cli_logging``: its handler removed, the ``effectlog`` logger's level and propagation as before."""
    logger = logging.getLogger("effectlog")
    for handler in [h for h in logger.handlers if getattr(h, "effectlog_cli", False)]:
        logger.removeHandler(handler)
    if _before:
        level, propagate = _before.pop()
        logger.setLevel(level)
        logger.propagate = propagate
