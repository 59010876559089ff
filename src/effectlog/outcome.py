"""What a call to run returns, and the types the runtime takes (policy, crash hooks)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, overload

import msgspec

from effectlog.errors import ExitStatus
from effectlog.fold import RunState

Decision = Literal["allow", "deny", "require_approval"]
CrashHook = Callable[[str, str], None]


class PolicyRequest(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    step_id: str
    adapter: str
    args: dict[str, Any]
    idempotent: bool


Policy = Callable[[PolicyRequest], Decision]


class SimulatedCrash(BaseException):
    """Raised by an in-process crash hook: the run actor stops dead, writing nothing more."""


class StepSummary(msgspec.Struct, frozen=True, kw_only=True, gc=False):  # two strings and an int: never a cycle
    id: str
    state: str
    attempt: int


class StepRows(Sequence[StepSummary]):
    """A closed run's step rows, built on first read from the seal bytes the outcome already holds.

    A re-run of a sealed run returns at once, whatever its length: the rows (one per step, so
    O(steps) to build) are decoded only when something reads them, from data held in memory,
    never from the journal, which may be closed by then. Read-only: a ``Sequence`` indexable,
    iterable, sized, and equal to a ``list`` of the same rows. msgspec reads a ``list``'s storage
    directly, so a lazy ``list`` subclass would encode as ``[]``; this type is refused by a bare
    encoder instead, and ``enc_hook`` below encodes it as the list it stands for.
    """

    __slots__ = ("_count", "_load", "_rows")
    __hash__ = None  # type: ignore[assignment]  # as a list: rows compare by value

    def __init__(self, load: Callable[[], list[StepSummary]], count: int | None = None) -> None:
        self._load = load
        self._count = count
        self._rows: list[StepSummary] | None = None

    @property
    def loaded(self) -> bool:
        """Whether the rows have been built (for tests and benchmarks: reading them builds them)."""
        return self._rows is not None

    def rows(self) -> list[StepSummary]:
        """The rows as a new list (built now if not yet)."""
        return list(self._all())

    def _all(self) -> list[StepSummary]:
        rows = self._rows
        if rows is None:
            # Raises (CorruptEvent) without caching when the held bytes do not decode. Two threads
            # reading at once may both build the rows: equal lists, either one kept.
            rows = self._rows = self._load()
        return rows

    def __len__(self) -> int:
        return self._count if self._count is not None and self._rows is None else len(self._all())

    @overload
    def __getitem__(self, index: int) -> StepSummary: ...

    @overload
    def __getitem__(self, index: slice) -> list[StepSummary]: ...

    def __getitem__(self, index: int | slice) -> StepSummary | list[StepSummary]:
        return self._all()[index]

    def __iter__(self) -> Iterator[StepSummary]:
        return iter(self._all())

    def __reversed__(self) -> Iterator[StepSummary]:
        return reversed(self._all())

    def __contains__(self, value: object) -> bool:
        return value in self._all()

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        return self._all().index(value, start, len(self) if stop is None else stop)

    def count(self, value: Any) -> int:
        return self._all().count(value)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StepRows):
            return self._all() == other._all()
        if isinstance(other, list):
            return self._all() == other
        return NotImplemented

    def __repr__(self) -> str:
        return repr(self._all())

    def __reduce__(self) -> tuple[type[list[StepSummary]], tuple[list[StepSummary]]]:
        return list, (self._all(),)  # pickled and copied as the list it stands for


def enc_hook(value: Any) -> Any:
    """msgspec's ``enc_hook`` for outcomes: ``StepRows`` encode as the list of rows they stand for.

    ``msgspec.json.encode(outcome, enc_hook=enc_hook)`` (or ``to_builtins``) gives exactly
    what the same outcome with a plain list of the same rows gives.
    """
    if isinstance(value, StepRows):
        return value._all()  # encoded, never kept: no copy
    raise NotImplementedError(f"effectlog cannot encode objects of type {type(value).__name__}")


class RunOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """How a call to ``run`` ended, and what it cost.

    ``steps`` is a read-only sequence: a ``list`` for a run driven now, ``StepRows`` (built when
    first read) for the re-run of a closed run; encode with ``enc_hook``.
    """

    run_id: str
    state: str
    exit_status: int
    message: str
    step_id: str | None = None
    steps: Sequence[StepSummary] = []
    events_written: int = 0
    adapter_calls: int = 0


def outcome_of(
    state: RunState,
    message: str = "",
    *,
    events_written: int = 0,
    adapter_calls: int = 0,
    steps: Sequence[StepSummary] | None = None,
) -> RunOutcome:
    """The outcome a run's recorded state stands for (``steps``: its rows, when already known from a seal)."""
    status = {
        "completed": ExitStatus.DONE,
        "failed": ExitStatus.RUN_FAILED,
        "cancelled": ExitStatus.RUN_FAILED,
        "stopped": ExitStatus.STOPPED_UNCERTAIN,
        "suspended": ExitStatus.SUSPENDED,
    }.get(state.state, ExitStatus.RUN_FAILED)
    if not message:
        message = _describe(state)
    return RunOutcome(
        run_id=state.run_id,
        state=state.state,
        exit_status=int(status),
        message=message,
        step_id=state.blocked_step,
        steps=steps
        if steps is not None
        else [StepSummary(id=s.step_id, state=s.state, attempt=s.attempt) for s in state.ordered_steps()],
        events_written=events_written,
        adapter_calls=adapter_calls,
    )


def reconcile_hint(journal: str, run_id: str, step_id: str) -> str:
    return (
        f"effectlog reconcile --journal {journal} --run-id {run_id} --step {step_id} "
        "--outcome applied|not-applied --evidence TEXT --operator NAME"
    )


def _describe(state: RunState) -> str:
    if state.state == "completed":
        return f"run {state.run_id} completed"
    if state.state == "suspended":
        return f"run {state.run_id} suspended: step {state.blocked_step!r} waits for approval"
    if state.state == "stopped":
        return f"run {state.run_id} stopped: step {state.blocked_step!r} has an uncertain effect"
    return f"run {state.run_id} {state.state}" + (f": {state.reason}" if state.reason else "")
