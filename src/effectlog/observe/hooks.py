"""What a run actor reports to while it drives a run (spans, log records, or both)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from effectlog import events as ev

_T = TypeVar("_T")


class RunHooks(Protocol):
    def fields(self) -> dict[str, str]:
        """Defaulted fields for ``run.started``/``run.resumed`` (the traceparent a resume links to)."""
        ...

    async def drive(self, fn: Callable[[], Awaitable[Any]], *, recorded_seq: int, resumed_from: str) -> Any:
        """Around the whole drive; returns what ``fn`` returns."""
        ...

    def recorded(self, events: Sequence[ev.Event], began: float) -> None:
        """A batch is durable; ``began`` is ``time.perf_counter()`` before it was handed to the writer."""
        ...

    async def tool(self, call: Awaitable[_T], *, step_id: str, attempt: int, adapter: str, key: str) -> _T:
        """Around one send to a tool."""
        ...
