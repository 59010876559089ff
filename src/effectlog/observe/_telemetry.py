"""The instruments and the span bookkeeping, used only when a real provider is configured.

Step spans are derived from the events a run records (``step.requested`` opens one,
``step.confirmed``/``failed``/``uncertain``/``denied`` closes it), so the actor only reports
what it made durable; tool spans wrap the adapter call itself. Names and attributes are
listed in docs/observability.md; model calls follow the OpenTelemetry GenAI conventions.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import Link, Span, SpanContext, Status, StatusCode, TraceFlags, TracerProvider

from effectlog import events as ev

_T = TypeVar("_T")

NS = "effectlog."
# The outcomes a step span ends with (``effectlog.outcome``); "resent" is counted per re-send.
OUTCOMES = ("confirmed", "uncertain", "failed", "resent", "denied", "held")


def traceparent(span: Span) -> str:
    """The W3C ``traceparent`` of ``span`` (what the journal records so a resume can link to it)."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parse_traceparent(text: str) -> SpanContext | None:
    parts = text.split("-")
    if len(parts) != 4 or parts[0] != "00":
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    ctx = SpanContext(trace_id=trace_id, span_id=span_id, is_remote=True, trace_flags=TraceFlags(flags))
    return ctx if ctx.is_valid else None


class Telemetry:
    """One tracer and the metric instruments, built once per configured provider pair."""

    def __init__(self, tp: TracerProvider, mp: MeterProvider) -> None:
        from effectlog import __version__

        self.tracer = tp.get_tracer("effectlog", __version__)
        self.meter_provider = mp
        meter = mp.get_meter("effectlog", __version__)
        self.steps = meter.create_counter("effectlog.steps", unit="{step}", description="Step attempts by outcome")
        self.uncertain_open = meter.create_up_down_counter(
            "effectlog.steps.uncertain_open",
            unit="{step}",
            description="Steps recorded uncertain (+1) minus steps reconciled (-1): summed, the steps waiting",
        )
        self.reconciliations = meter.create_counter(
            "effectlog.reconciliations", unit="{step}", description="Uncertain steps resolved, by kind"
        )
        self.approvals_held = meter.create_counter(
            "effectlog.approvals.held", unit="{step}", description="Steps held for an operator's approval"
        )
        self.step_duration = meter.create_histogram(
            "effectlog.step.duration", unit="s", description="From step.requested to the step's outcome"
        )
        self.tool_duration = meter.create_histogram(
            "effectlog.tool.duration", unit="s", description="One send to a tool (adapter call)"
        )
        self.commit_duration = meter.create_histogram(
            "effectlog.journal.commit.duration", unit="s", description="Until a batch of events is durable"
        )
        self.claims = meter.create_counter("effectlog.fleet.claims", unit="{lease}", description="Requests claimed")
        self.renewals = meter.create_counter(
            "effectlog.fleet.lease_renewals", unit="{lease}", description="Lease renewals at a heartbeat"
        )
        self.leases_lost = meter.create_counter(
            "effectlog.fleet.leases_lost", unit="{lease}", description="Attempts stopped because their lease was lost"
        )
        self.fleet_decisions = meter.create_counter(
            "effectlog.fleet.decisions", unit="{request}", description="Operator decisions on fleet requests, by action"
        )
        # Read from the store at each collection, not counted at transitions: the store is the one
        # place that knows every request's state across submitters, runners, recovery and operators.
        self._stores: list[Any] = []
        self._stores_lock = threading.Lock()
        self._states_seen: set[str] = set()
        meter.create_observable_gauge(
            "effectlog.fleet.requests",
            callbacks=[self._requests_by_state],
            unit="{request}",
            description="Requests by the state of their current attempt, read from the fleet store",
        )
        self.model_duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s", description="GenAI operation duration"
        )
        self.token_usage = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}", description="Number of input and output tokens used"
        )

    # -- operator decisions ------------------------------------------------------------------

    def decision(self, kind: str, run_id: str, step_id: str, call: Callable[[], _T], *, by: str = "") -> _T:
        name, _, how = kind.partition(":")
        attrs: dict[str, Any] = {NS + "run.id": run_id}
        if step_id:
            attrs[NS + "step.id"] = step_id
        if by:
            attrs[NS + "decided_by"] = by
        if how:
            attrs[NS + "reconcile.kind"] = how
        with self.tracer.start_as_current_span(NS + name, attributes=attrs) as span:
            state = call()
            changed = getattr(state, "changed", None)  # repin: the adapters whose implementation it accepted
            if isinstance(changed, Mapping):
                span.set_attribute(NS + "repin.adapters", sorted(str(k) for k in changed))
            step = state.step(step_id) if step_id and hasattr(state, "step") else None
            if step is not None:
                span.set_attribute(NS + "step.state", step.state)
                span.set_attribute(NS + "attempt", step.attempt)
                if step.outcome:
                    span.set_attribute(NS + "reconcile.outcome", step.outcome)
            if name == "reconcile":
                self.reconciliations.add(1, {NS + "reconcile.kind": how or "operator"})
                self.uncertain_open.add(-1)
            return state

    def fleet_decision(self, action: str, request_id: int, by: str, call: Callable[[], _T]) -> _T:
        """``effectlog.fleet.<action>`` (requeue, fail, cancel) around an operator's decision on a request."""
        attrs: dict[str, Any] = {
            NS + "fleet.request_id": request_id,
            NS + "fleet.decision": action,
            NS + "decided_by": by,
        }
        with self.tracer.start_as_current_span(NS + "fleet." + action, attributes=attrs) as span:
            view = call()
            span.set_attribute(NS + "run.id", str(getattr(view, "run_id", "")))
            span.set_attribute(NS + "attempt", int(getattr(view, "attempt_no", 0)))
            span.set_attribute(NS + "fleet.state", str(getattr(view, "state", "")))
            self.fleet_decisions.add(1, {NS + "fleet.decision": action})
            return view

    def watch_requests(self, store: Any) -> None:
        """Report ``effectlog.fleet.requests`` from ``store`` (its ``requests()``) until ``unwatch_requests``."""
        with self._stores_lock:
            self._stores.append(store)
            if len(self._stores) == 1:
                self._states_seen = set()  # the zeros are for states this store had, not another's

    def unwatch_requests(self, store: Any) -> None:
        """Export the store's last counts (a collection now, while it is open), then stop reading it."""
        flush = getattr(self.meter_provider, "force_flush", None)
        if flush is not None:
            with contextlib.suppress(Exception):  # telemetry never fails a command: the counts just go unexported
                flush(timeout_millis=5_000)
        with self._stores_lock:
            if store in self._stores:
                self._stores.remove(store)

    def _requests_by_state(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._stores_lock:
            store = self._stores[0] if self._stores else None
            if store is None:
                return []
            try:
                counts = Counter(view.state for view in store.requests())
            except Exception:  # a store that cannot answer now reports nothing, it never stops the export
                return []
            self._states_seen.update(counts)
            # A state seen before and now empty reports 0, so a dashboard does not keep its last count.
            return [Observation(counts.get(s, 0), {NS + "fleet.state": s}) for s in sorted(self._states_seen)]

    # -- model calls (sessions) ------------------------------------------------------------

    async def model_call(
        self,
        call: Awaitable[_T],
        *,
        run_id: str,
        step_id: str,
        model: str,
        idempotency_key: str,
        provider: str,
        parent: Span | None = None,
    ) -> _T:
        """A ``chat {model}`` span with the GenAI attributes, token usage from an OpenAI-shaped answer.

        Its parent is ``parent`` when given (a session's step span), else the current span."""
        base = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider, "gen_ai.request.model": model}
        attrs = {**base, "gen_ai.system": provider, NS + "run.id": run_id, NS + "step.id": step_id}
        attrs[NS + "idempotency_key"] = idempotency_key
        began = time.perf_counter()
        ctx = trace.set_span_in_context(parent) if parent is not None else None
        with self.tracer.start_as_current_span(
            f"chat {model}", context=ctx, kind=trace.SpanKind.CLIENT, attributes=attrs
        ) as span:
            try:
                response = await call
            except BaseException as exc:
                self.model_duration.record(time.perf_counter() - began, {**base, "error.type": type(exc).__name__})
                raise
            self.model_duration.record(time.perf_counter() - began, base)
            if isinstance(response, Mapping):
                _gen_ai_response(span, response, self, base)
            return response

    # -- the fleet ------------------------------------------------------------------------------

    def claimed(self, request_id: int, runner_id: str, run_id: str, attempt: int) -> None:
        """The ``fleet.claim`` span and count: report-only (a raising processor must not cost the lease just
        taken, nor, for a claim carried in a run's last commit, the attempt thread that runs it)."""
        attrs: dict[str, Any] = {
            NS + "fleet.request_id": request_id,
            NS + "fleet.runner_id": runner_id,
            NS + "run.id": run_id,
        }
        attrs[NS + "attempt"] = attempt
        with (
            reporting_only("the effectlog.fleet.claim span"),
            self.tracer.start_as_current_span(NS + "fleet.claim", attributes=attrs),
        ):
            self.claims.add(1, {NS + "fleet.runner_id": runner_id})

    def attempt(self, request_id: int, runner_id: str, run_id: str, attempt: int, call: Callable[[], str]) -> str:
        """``call()`` (the attempt) inside the ``fleet.attempt`` span; the span is report-only, the attempt is not."""
        attrs: dict[str, Any] = {
            NS + "fleet.request_id": request_id,
            NS + "fleet.runner_id": runner_id,
            NS + "run.id": run_id,
            NS + "attempt": attempt,
        }
        span: Span = trace.INVALID_SPAN
        with reporting_only("the effectlog.fleet.attempt span"):
            span = self.tracer.start_span(NS + "fleet.attempt", attributes=attrs)
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                outcome = call()
        except BaseException as exc:
            with reporting_only("the effectlog.fleet.attempt span"):
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                span.end()
            raise
        with reporting_only("the effectlog.fleet.attempt span"):
            span.set_attribute(NS + "outcome", outcome)
            if outcome in ("failed", "needs_operator", "lost"):
                span.set_status(Status(StatusCode.ERROR, outcome))
            span.end()
        return outcome


def _gen_ai_response(span: Span, response: Mapping[str, Any], t: Telemetry, base: Mapping[str, Any]) -> None:
    if isinstance(response.get("model"), str):
        span.set_attribute("gen_ai.response.model", response["model"])
    if isinstance(response.get("id"), str):
        span.set_attribute("gen_ai.response.id", response["id"])
    choices = response.get("choices")
    if isinstance(choices, list):
        reasons = [c.get("finish_reason") for c in choices if isinstance(c, Mapping)]
        span.set_attribute("gen_ai.response.finish_reasons", [r for r in reasons if isinstance(r, str)])
    usage = response.get("usage")
    if not isinstance(usage, Mapping):
        return
    for field, name, kind in (
        ("prompt_tokens", "gen_ai.usage.input_tokens", "input"),
        ("completion_tokens", "gen_ai.usage.output_tokens", "output"),
    ):
        value = usage.get(field, usage.get(name.rsplit(".", 1)[1]))
        if isinstance(value, int):
            span.set_attribute(name, value)
            t.token_usage.record(value, {**base, "gen_ai.token.type": kind})


@contextlib.contextmanager
def reporting_only(what: str) -> Iterator[None]:
    """Around a call into the OpenTelemetry SDK made while a run is driven. The SDK calls an application's
    own span processors and metric readers, which may raise; telemetry is a report of what happened, never
    an outcome: raised through the tool hook it stood for the tool's (a receipt in hand thrown away, the
    step recorded uncertain or failed, an idempotent one sent again). Said once a process, then dropped."""
    try:
        yield
    except Exception as exc:  # whatever an application's processor raises
        if not _said[0]:
            _said[0] = True
            logging.getLogger("effectlog.telemetry").warning(
                "telemetry: %s raised %s: %s; the run goes on without it", what, type(exc).__name__, exc
            )


_said = [False]


def _described(step: Any) -> dict[str, Any]:
    """The step's attributes from its ``step.requested`` (or its recorded state, which holds the same)."""
    return {
        NS + "adapter": step.adapter,
        NS + "idempotent": step.idempotent,
        NS + "idempotency_key": step.idempotency_key,
        NS + "step.kind": step.kind,
    }


class _OpenStep:
    __slots__ = ("began", "resends", "span")

    def __init__(self, span: Span, began: float) -> None:
        self.span = span
        self.began = began
        self.resends = 0


class RunObserver:
    """The spans of one run drive: ``effectlog.run``, its ``effectlog.step`` children, their tool calls."""

    def __init__(self, telemetry: Telemetry, run_id: str, step_of: Callable[[str], Any] | None = None) -> None:
        self.t = telemetry
        self.run_id = run_id
        # The recorded step (adapter, kind, key) for a span a resume opens at step.resent.
        self.step_of = step_of
        self.span: Span = trace.INVALID_SPAN
        self.open: dict[str, _OpenStep] = {}
        self.first_seq = 0
        self.last_seq = 0

    def fields(self) -> dict[str, str]:
        """What ``run.started``/``run.resumed`` record so that the next process links to this one."""
        found = traceparent(self.span)
        return {"traceparent": found} if found else {}

    def begin(self, *, recorded_seq: int, resumed_from: str) -> None:
        """Start the ``effectlog.run`` span, linked to the span of the process it resumes."""
        previous = parse_traceparent(resumed_from) if resumed_from else None
        links = [Link(previous, {NS + "link": "resumes"})] if previous is not None else []
        attrs: dict[str, Any] = {NS + "run.id": self.run_id, NS + "resumed": recorded_seq > 0}
        self.span = self.t.tracer.start_span(NS + "run", attributes=attrs, links=links)

    def failed(self, exc: BaseException) -> None:
        """End the run span (and any step still open) on an exception that left the drive."""
        self.span.record_exception(exc)
        self.span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
        self._end_open("interrupted", StatusCode.ERROR)
        self._end_run()

    def ended(self, state: str, *, message: str = "", step_id: str | None = None) -> None:
        """End the run span with the run's state (a step still open ends ``interrupted``)."""
        self.span.set_attribute(NS + "run.state", state)
        if step_id is not None:
            self.span.set_attribute(NS + "step.id", step_id)
        if state in ("failed", "stopped"):
            self.span.set_status(Status(StatusCode.ERROR, message or state))
        self._end_open("interrupted", StatusCode.UNSET)
        self._end_run()

    async def drive(self, fn: Callable[[], Awaitable[Any]], *, recorded_seq: int, resumed_from: str) -> Any:
        with reporting_only("the effectlog.run span"):
            self.begin(recorded_seq=recorded_seq, resumed_from=resumed_from)
        try:
            with trace.use_span(self.span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                outcome = await fn()
        except BaseException as exc:
            with reporting_only("the effectlog.run span"):
                self.failed(exc)
            raise
        with reporting_only("the effectlog.run span"):
            self.span.set_attribute(NS + "exit_status", outcome.exit_status)
            self.ended(outcome.state, message=outcome.message, step_id=outcome.step_id)
        return outcome

    def _end_run(self) -> None:
        if self.first_seq:
            self.span.set_attribute(NS + "seq.first", self.first_seq)
            self.span.set_attribute(NS + "seq.last", self.last_seq)
        self.span.end()

    def _end_open(self, outcome: str, code: StatusCode) -> None:
        for sid in list(self.open):
            self._close(sid, outcome, code, "")

    # -- what the run made durable ---------------------------------------------------------------

    def recorded(self, events: Sequence[ev.Event], began: float) -> None:
        with reporting_only("the spans of what was recorded"):  # the batch is durable whatever happens here
            self._recorded(events, began)

    def _recorded(self, events: Sequence[ev.Event], began: float) -> None:
        now = time.perf_counter()
        self.t.commit_duration.record(now - began)
        for event in events:
            if not self.first_seq:
                self.first_seq = event.seq
            self.last_seq = event.seq
            handler = _HANDLERS.get(type(event))
            if handler is not None:
                handler(self, event, now)

    def _step_span(self, event: Any, now: float, **attrs: Any) -> _OpenStep:
        found = self.open.get(event.step_id)
        if found is not None:
            found.span.set_attribute(NS + "seq.last", event.seq)
            return found
        base: dict[str, Any] = {
            NS + "run.id": self.run_id,
            NS + "step.id": event.step_id,
            NS + "attempt": event.attempt,
            NS + "seq.first": event.seq,
            NS + "seq.last": event.seq,
        }
        span = self.t.tracer.start_span(
            NS + "step", context=trace.set_span_in_context(self.span), attributes={**base, **attrs}
        )
        found = self.open[event.step_id] = _OpenStep(span, now)
        return found

    def _close(self, sid: str, outcome: str, code: StatusCode, why: str, now: float | None = None) -> None:
        found = self.open.pop(sid, None)
        if found is None:
            return
        span = found.span
        span.set_attribute(NS + "outcome", outcome)
        if found.resends:
            span.set_attribute(NS + "resends", found.resends)
        if code is StatusCode.ERROR:
            span.set_status(Status(code, why or outcome))
        elif code is StatusCode.OK:
            span.set_status(Status(code))
        self.t.steps.add(1, {NS + "outcome": outcome})
        self.t.step_duration.record((now or time.perf_counter()) - found.began, {NS + "outcome": outcome})
        span.end()

    def _requested(self, event: Any, now: float) -> None:
        self._step_span(event, now, **_described(event))

    def _resent(self, event: Any, now: float) -> None:
        step = self.step_of(event.step_id) if self.step_of is not None and event.step_id not in self.open else None
        found = self._step_span(event, now, **(_described(step) if step is not None else {}))
        found.resends += 1
        found.span.add_event(NS + "resent", {NS + "resend": event.resend, NS + "reason": event.reason})
        self.t.steps.add(1, {NS + "outcome": "resent"})

    def _confirmed(self, event: Any, now: float) -> None:
        found = self._step_span(event, now)
        if getattr(event, "rebuilt", False):
            found.span.set_attribute(NS + "rebuilt", True)
        self._close(event.step_id, "confirmed", StatusCode.OK, "", now)

    def _failed(self, event: Any, now: float) -> None:
        self._step_span(event, now)
        self._close(event.step_id, "failed", StatusCode.ERROR, event.reason, now)

    def _uncertain(self, event: Any, now: float) -> None:
        self._step_span(event, now)
        self.t.uncertain_open.add(1)
        self._close(event.step_id, "uncertain", StatusCode.ERROR, event.reason, now)

    def _denied(self, event: Any, now: float) -> None:
        held = event.decision == "require_approval"
        found = self._step_span(event, now, **{NS + "decided_by": event.by})
        found.span.set_attribute(NS + "reason", event.reason)
        if held:
            self.t.approvals_held.add(1)
            self._close(event.step_id, "held", StatusCode.UNSET, event.reason, now)
        else:
            self._close(event.step_id, "denied", StatusCode.ERROR, event.reason, now)

    # -- one call to a model (sessions) -----------------------------------------------------------

    async def model(self, call: Awaitable[_T], *, step_id: str, model: str, key: str, provider: str) -> _T:
        """A ``chat {model}`` span under the step's span (the run's when the step has none open)."""
        found = self.open.get(step_id)
        return await self.t.model_call(
            call,
            run_id=self.run_id,
            step_id=step_id,
            model=model,
            idempotency_key=key,
            provider=provider,
            parent=found.span if found is not None else self.span,
        )

    # -- one send to the tool ----------------------------------------------------------------------

    async def tool(self, call: Awaitable[_T], *, step_id: str, attempt: int, adapter: str, key: str) -> _T:
        found = self.open.get(step_id)
        parent = found.span if found is not None else self.span
        attrs: dict[str, Any] = {
            NS + "run.id": self.run_id,
            NS + "step.id": step_id,
            NS + "attempt": attempt,
            NS + "adapter": adapter,
            NS + "idempotency_key": key,
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": adapter,
        }
        span: Span = trace.INVALID_SPAN
        with reporting_only("the effectlog.tool span"):
            span = self.t.tracer.start_span(NS + "tool", context=trace.set_span_in_context(parent), attributes=attrs)
        began = time.perf_counter()
        try:
            with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
                result = await call
        except BaseException as exc:
            with reporting_only("the effectlog.tool span"):
                # A tool's message may echo its args, secret ones too: the span keeps the type only. The
                # message, redacted, is the reason its step span ends with (from the journal's event).
                span.record_exception(exc, attributes=_NOT_RECORDED)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        else:
            if getattr(result, "ok", True) is False:
                with reporting_only("the effectlog.tool span"):
                    span.set_status(Status(StatusCode.ERROR, "the tool reported failure"))
            return result
        finally:
            with reporting_only("the effectlog.tool span"):
                self.t.tool_duration.record(time.perf_counter() - began, {NS + "adapter": adapter})
                span.end()


_NOT_RECORDED = {
    "exception.message": "(not recorded: it may echo secret args; the step span's status has it, redacted)",
    "exception.stacktrace": "",
}

_HANDLERS: dict[type, Callable[[RunObserver, Any, float], None]] = {
    ev.StepRequested: RunObserver._requested,
    ev.StepResent: RunObserver._resent,
    ev.StepConfirmed: RunObserver._confirmed,
    ev.StepFailed: RunObserver._failed,
    ev.StepUncertain: RunObserver._uncertain,
    ev.StepDenied: RunObserver._denied,
}
