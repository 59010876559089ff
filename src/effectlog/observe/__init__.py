"""Observability: OpenTelemetry spans and metrics, through ``opentelemetry-api`` only.

Nothing here is a dependency: without the ``[otel]`` extra, or with it but no SDK
configured by the application (or by the CLI from ``OTEL_*`` variables), ``telemetry()``
answers ``None`` and every hook in the runtime is one ``is None`` check. The check is
made once per run drive, operator decision or fleet attempt, never per step.

What is emitted, and under which names, is described in docs/observability.md.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import wraps
from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    from effectlog.observe._telemetry import RunObserver, Telemetry
    from effectlog.observe.hooks import RunHooks

__all__ = ["decision", "provider_of", "requests_gauge", "run_observer", "session_spans", "telemetry"]

_P = ParamSpec("_P")
_R = TypeVar("_R")

# (id of the tracer provider, id of the meter provider, what they made): rebuilt when either changes.
_cache: list[tuple[int, int, Telemetry | None]] = [(0, 0, None)]
# Set while a decision is observed: a decision made through another (reconcile --lookup ends in
# reconcile) is one span and one count, not two.
_deciding: ContextVar[bool] = ContextVar("effectlog_deciding", default=False)


def telemetry() -> Telemetry | None:
    """The instruments, or ``None`` when no SDK (or other real provider) is configured.

    The API's own providers (the proxy and the no-op ones, which are what an application
    that configured nothing gets) count as "off". OpenTelemetry is not even imported when
    nothing else in the process imported it: then nobody can have configured it.
    """
    if "opentelemetry.trace" not in sys.modules and "opentelemetry.metrics" not in sys.modules:
        return None
    from opentelemetry import metrics, trace

    tp, mp = trace.get_tracer_provider(), metrics.get_meter_provider()
    key_t, key_m, found = _cache[0]
    if (key_t, key_m) == (id(tp), id(mp)):
        return found
    real_t = not type(tp).__module__.startswith("opentelemetry.trace")
    real_m = not type(mp).__module__.startswith("opentelemetry.metrics")
    made = None
    if real_t or real_m:
        from effectlog.observe._telemetry import Telemetry

        made = Telemetry(tp, mp)
    _cache[0] = (id(tp), id(mp), made)
    return made


def run_observer(run_id: str, step_of: Callable[[str], object] | None = None) -> RunHooks | None:
    """The spans and metrics of one run drive, and its log records when the ``effectlog.run``
    logger is enabled for INFO; ``None`` when neither is on (checked once per drive)."""
    from effectlog.observe import progress

    found = telemetry()
    log = progress.StepLog(run_id) if progress.enabled() else None
    if found is None:
        return log
    from effectlog.observe._telemetry import RunObserver

    spans = RunObserver(found, run_id, step_of)
    return spans if log is None else progress.Both(spans, log)


def session_spans(
    run_id: str, *, recorded_seq: int, resumed_from: str, step_of: Callable[[str], object] | None = None
) -> RunObserver | None:
    """A session pass's ``effectlog.run`` span, begun (linked to ``resumed_from``), with its
    ``effectlog.step`` spans to come from what the pass records; ``None`` when telemetry is off."""
    found = telemetry()
    if found is None:
        return None
    from effectlog.observe._telemetry import RunObserver

    spans = RunObserver(found, run_id, step_of)
    spans.begin(recorded_seq=recorded_seq, resumed_from=resumed_from)
    return spans


def decision(kind: str, *, on_step: bool = True) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """A span (``effectlog.<kind>``) and metrics around an operator decision.

    The decorated function takes ``(journal, run_id, step_id, ...)`` (``(journal, run_id, ...)``
    when not ``on_step``) and returns the run's state after the decision (or what it made);
    who decided is its ``by`` or ``operator`` keyword. When telemetry is off the wrapper only calls it.
    """

    def wrap(fn: Callable[_P, _R]) -> Callable[_P, _R]:
        @wraps(fn)
        def observed(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            found = telemetry()
            if found is None or _deciding.get():
                return fn(*args, **kwargs)
            run_id = str(args[1]) if len(args) > 1 else str(kwargs.get("run_id", ""))
            step_id = ""
            if on_step:
                step_id = str(args[2]) if len(args) > 2 else str(kwargs.get("step_id", ""))
            by = kwargs.get("by", kwargs.get("operator", ""))
            token = _deciding.set(True)
            try:
                return found.decision(
                    kind, run_id, step_id, lambda: fn(*args, **kwargs), by=by if isinstance(by, str) else ""
                )
            finally:
                _deciding.reset(token)

        return observed

    return wrap


@contextmanager
def requests_gauge(store: object) -> Iterator[None]:
    """While inside: ``effectlog.fleet.requests`` (requests by state) is read from ``store`` at each
    metric collection. Leaving waits for a collection in progress, so the store can then be closed."""
    found = telemetry()
    if found is None:
        yield
        return
    found.watch_requests(store)
    try:
        yield
    finally:
        found.unwatch_requests(store)


def provider_of(gateway: object) -> str:
    """``gen_ai.provider.name`` for a session gateway: its ``gen_ai_provider`` attribute if it has one."""
    given = getattr(gateway, "gen_ai_provider", None)
    if isinstance(given, str) and given:
        return given
    return "openai" if type(gateway).__name__ == "OpenAIGateway" else "_OTHER"
