"""Spans and metrics through the real OpenTelemetry SDK and its in-memory exporters (issue 16).

The SDK's providers can be set globally once per process, so this module sets them once and
clears the exporter before each test. Runs use real SQLite journals.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from effectlog import events as ev
from effectlog.adapters import Receipt, Request
from effectlog.adapters.protocol import Evidence
from effectlog.journal import open_journal
from effectlog.plan import Plan, parse_plan
from effectlog.runtime import Runtime, SimulatedCrash

EXPORTER = InMemorySpanExporter()
READER = InMemoryMetricReader()


@pytest.fixture(scope="module", autouse=True)
def _providers() -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))


@pytest.fixture
def spans() -> InMemorySpanExporter:
    EXPORTER.clear()
    return EXPORTER


def make_plan(run_id: str, steps: list[dict[str, Any]], *, idempotent: bool = False) -> Plan:
    raw = {
        "run_id": run_id,
        "adapters": {"tool": {"type": "custom", "version": "1", "idempotent": idempotent}},
        "steps": steps,
    }
    return parse_plan(msgspec.json.encode(raw))


class Tool:
    """Answers ok, reports failure for ``{"fail": true}``, raises for ``{"boom": true}``."""

    def invoke(self, request: Request) -> Receipt:
        if request.args.get("boom"):
            raise ConnectionError("connection reset")
        return Receipt(data={"n": request.args.get("n")}, ok=not request.args.get("fail"))


class Looks(Tool):
    """A tool that can say whether a send took effect (for reconcile --lookup)."""

    def lookup(self, request: Request) -> Evidence:
        return Evidence(applied=True, detail=f"found {request.idempotency_key}")


def runtime(path: Path, **kw: Any) -> Runtime:
    return Runtime(path / "j.db", adapters={"custom": lambda decl, ctx: Tool()}, **kw)


def by_name(found: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in found.get_finished_spans() if s.name == name]


def counter(name: str) -> dict[tuple[tuple[str, Any], ...], float]:
    """Cumulative data points of metric ``name``, keyed by their attributes."""
    data = READER.get_metrics_data()
    points: dict[tuple[tuple[str, Any], ...], float] = {}
    for rm in data.resource_metrics if data is not None else []:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        points[tuple(sorted((point.attributes or {}).items()))] = (
                            value if value is not None else point.count  # type: ignore[attr-defined]
                        )
    return points


def test_run_step_and_tool_spans_nest_with_attributes(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """One run drive gives one effectlog.run span; each step an effectlog.step child; each send an effectlog.tool."""
    with runtime(tmp_path) as rt:
        rt.run(make_plan("r1", [{"id": "a", "adapter": "tool", "args": {"n": 1}}, {"id": "b", "adapter": "tool"}]))
    (run,) = by_name(spans, "effectlog.run")
    steps = by_name(spans, "effectlog.step")
    tools = by_name(spans, "effectlog.tool")
    assert ["a", "b"] == [s.attributes["effectlog.step.id"] for s in steps]  # type: ignore[index]
    assert [run.context.span_id] * 2 == [s.parent.span_id for s in steps]  # type: ignore[union-attr]
    assert [s.context.span_id for s in steps] == [t.parent.span_id for t in tools]  # type: ignore[union-attr]
    first = dict(steps[0].attributes or {})
    expected = {
        "effectlog.run.id": "r1",
        "effectlog.step.id": "a",
        "effectlog.attempt": 1,
        "effectlog.adapter": "tool",
        "effectlog.idempotent": False,
        "effectlog.outcome": "confirmed",
        "effectlog.seq.first": 2,
        "effectlog.seq.last": 4,
    }
    assert expected == {k: first[k] for k in expected}
    assert len(str(first["effectlog.idempotency_key"])) > 0
    assert ("completed", 0, 1, 8) == (
        run.attributes["effectlog.run.state"],  # type: ignore[index]
        run.attributes["effectlog.exit_status"],  # type: ignore[index]
        run.attributes["effectlog.seq.first"],  # type: ignore[index]
        run.attributes["effectlog.seq.last"],  # type: ignore[index]
    )
    assert [StatusCode.OK, StatusCode.OK] == [s.status.status_code for s in steps]


def test_an_exception_in_the_tool_is_an_error_with_an_exception_event(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """A tool that raises: its span has error status and an exception event; the step ends uncertain."""
    with runtime(tmp_path) as rt:
        outcome = rt.run(make_plan("r2", [{"id": "a", "adapter": "tool", "args": {"boom": True}}]))
    assert "stopped" == outcome.state
    (tool,) = by_name(spans, "effectlog.tool")
    (step,) = by_name(spans, "effectlog.step")
    (run,) = by_name(spans, "effectlog.run")
    assert (StatusCode.ERROR, ["exception"]) == (tool.status.status_code, [e.name for e in tool.events])
    assert "ConnectionError" == tool.events[0].attributes["exception.type"]  # type: ignore[index]
    assert ("uncertain", StatusCode.ERROR) == (step.attributes["effectlog.outcome"], step.status.status_code)  # type: ignore[index]
    assert StatusCode.ERROR == run.status.status_code


def test_failed_held_and_denied_steps_have_their_outcomes(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """The step outcome attribute says failed (tool reported failure), held (approval) or denied."""
    with runtime(tmp_path) as rt:
        rt.run(make_plan("f", [{"id": "a", "adapter": "tool", "args": {"fail": True}}]))
        rt.run(make_plan("h", [{"id": "a", "adapter": "tool", "approval": "required"}]))
        rt.deny("h", "a", by="ops", reason="no")
        rt.run(make_plan("h", [{"id": "a", "adapter": "tool", "approval": "required"}]))
    outcomes = [
        (s.attributes["effectlog.run.id"], s.attributes["effectlog.outcome"]) for s in by_name(spans, "effectlog.step")
    ]  # type: ignore[index]
    assert [("f", "failed"), ("h", "held")] == outcomes
    (deny,) = by_name(spans, "effectlog.deny")
    assert ("h", "a", "denied") == (
        deny.attributes["effectlog.run.id"],  # type: ignore[index]
        deny.attributes["effectlog.step.id"],  # type: ignore[index]
        deny.attributes["effectlog.step.state"],  # type: ignore[index]
    )


def test_step_and_reconcile_metrics(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """Steps are counted by outcome; an uncertain step opens (+1) and its reconciliation closes it (-1)."""
    before_steps = counter("effectlog.steps")
    before_open = counter("effectlog.steps.uncertain_open").get((), 0)
    with runtime(tmp_path) as rt:
        rt.run(make_plan("m", [{"id": "a", "adapter": "tool"}, {"id": "b", "adapter": "tool", "args": {"boom": 1}}]))
        mid_open = counter("effectlog.steps.uncertain_open").get((), 0)
        rt.reconcile("m", "b", outcome="applied", evidence="ledger row 7", operator="ops")
    after_steps = counter("effectlog.steps")
    delta = {k: after_steps.get(k, 0) - before_steps.get(k, 0) for k in after_steps}
    assert 1 == delta[(("effectlog.outcome", "confirmed"),)]
    assert 1 == delta[(("effectlog.outcome", "uncertain"),)]
    assert (1, 0) == (mid_open - before_open, counter("effectlog.steps.uncertain_open")[()] - before_open)
    assert counter("effectlog.reconciliations")[(("effectlog.reconcile.kind", "operator"),)] >= 1
    assert counter("effectlog.journal.commit.duration")[()] >= 3
    assert counter("effectlog.tool.duration")[(("effectlog.adapter", "tool"),)] >= 2
    (rec,) = by_name(spans, "effectlog.reconcile")
    assert "applied" == rec.attributes["effectlog.reconcile.outcome"]  # type: ignore[index]


def test_a_resumed_run_links_to_the_span_of_the_process_it_resumes(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """The first drive records its traceparent in run.started; the resume's run span links to it."""

    def crash(point: str, step_id: str) -> None:
        if point == "after_request" and step_id == "b":
            raise SimulatedCrash(point)

    plan = make_plan("res", [{"id": "a", "adapter": "tool"}, {"id": "b", "adapter": "tool"}], idempotent=True)
    with runtime(tmp_path, crash_hook=crash) as rt, pytest.raises(SimulatedCrash):
        rt.run(plan)
    with runtime(tmp_path) as rt:
        assert "completed" == rt.run(plan).state
    first, second = by_name(spans, "effectlog.run")
    assert [first.context.span_id] == [link.context.span_id for link in second.links]
    assert first.context.trace_id == second.links[0].context.trace_id
    journal = open_journal(str(tmp_path / "j.db"))
    try:
        events = [ev.decode(r.body) for r in journal.read("res")]
    finally:
        journal.close()
    started = next(e for e in events if isinstance(e, ev.RunStarted))
    resumed = next(e for e in events if isinstance(e, ev.RunResumed))
    assert (
        f"00-{first.context.trace_id:032x}-{first.context.span_id:016x}-{int(first.context.trace_flags):02x}"
        == started.traceparent
    )
    assert f"{second.context.span_id:016x}" == resumed.traceparent.split("-")[2]
    (resent,) = [s for s in by_name(spans, "effectlog.step") if s.attributes.get("effectlog.resends")]  # type: ignore[union-attr]
    assert ("b", "confirmed") == (resent.attributes["effectlog.step.id"], resent.attributes["effectlog.outcome"])  # type: ignore[index]


def test_off_without_an_sdk_and_without_opentelemetry(tmp_path: Path) -> None:
    """In a fresh process: the API alone (no provider set) is off, and effectlog runs a plan with
    opentelemetry not importable at all (it is never a dependency)."""
    code = (
        "import sys, opentelemetry.trace, opentelemetry.metrics\n"
        "from effectlog.observe import telemetry\n"
        "print(telemetry())\n"
    )
    api_only = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert (0, "None\n") == (api_only.returncode, api_only.stdout), api_only.stderr
    plan = tmp_path / "plan.json"
    plan.write_text(
        '{"run_id": "r", "adapters": {"n": {"type": "noop", "version": "1", "idempotent": true}},'
        ' "steps": [{"id": "a", "adapter": "n"}]}'
    )
    code = (
        "import sys\n"
        "sys.modules['opentelemetry'] = None\n"  # any import of it now fails
        "from effectlog.cli import main\n"
        f"sys.exit(main(['run', {str(plan)!r}, '--journal', {str(tmp_path / 'j.db')!r}, '--json']))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert (0, "completed") == (run.returncode, json.loads(run.stdout)["state"]), run.stderr


def test_session_model_calls_follow_the_genai_conventions(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """A session's model call is a `chat {model}` span with the GenAI attributes; its tool call an effectlog.tool."""
    import asyncio

    from effectlog.session import SqliteCheckpointer
    from session_kit import drive, scripted

    with SqliteCheckpointer(tmp_path / "s.db") as store:
        from effectlog.session import Session

        asyncio.run(drive(Session("sess", scripted(tmp_path / "calls.txt"), store)))
    chats = [s for s in spans.get_finished_spans() if s.name == "chat scripted"]
    expected = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "_OTHER",
        "gen_ai.request.model": "scripted",
        "gen_ai.response.model": "scripted",
        "gen_ai.response.id": "scripted-0",
        "effectlog.run.id": "sess",
    }
    assert 2 == len(chats)
    assert expected == {k: dict(chats[0].attributes or {})[k] for k in expected}
    (tool,) = by_name(spans, "effectlog.tool")
    assert ("execute_tool", "transfer") == (
        tool.attributes["gen_ai.operation.name"],  # type: ignore[index]
        tool.attributes["gen_ai.tool.name"],  # type: ignore[index]
    )


def test_fleet_claim_and_attempt_spans_and_counts(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """A runner's claim is an effectlog.fleet.claim span and a count; its attempt a span holding the run's span."""
    from effectlog.cli import main
    from fleet_kit import write_plan

    store = str(tmp_path / "fleet.db")
    plan = write_plan(tmp_path / "plan.json", "run-1", [("a", "idem")])
    claims_before = sum(counter("effectlog.fleet.claims").values())
    assert 0 == main(["submit", str(plan), "--store", store, "--scope", "s", "--key", "k"])
    argv = ["runner", "--store", store, "--effects", str(tmp_path / "e.db"), "--exit-when-idle", "--poll-s", "0.01"]
    assert 0 == main(argv)
    (claim,) = by_name(spans, "effectlog.fleet.claim")
    (attempt,) = by_name(spans, "effectlog.fleet.attempt")
    (run,) = by_name(spans, "effectlog.run")
    assert ("run-1", 1, "succeeded") == (
        claim.attributes["effectlog.run.id"],  # type: ignore[index]
        attempt.attributes["effectlog.attempt"],  # type: ignore[index]
        attempt.attributes["effectlog.outcome"],  # type: ignore[index]
    )
    assert attempt.context.span_id == run.parent.span_id  # type: ignore[union-attr]
    assert 1 == sum(counter("effectlog.fleet.claims").values()) - claims_before


def test_a_lookup_reconciliation_is_one_span_and_one_count_of_its_kind(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """reconcile --lookup ends in the operator reconcile: still one effectlog.reconcile span, counted as lookup."""
    before = counter("effectlog.reconciliations")
    with Runtime(tmp_path / "j.db", adapters={"custom": lambda decl, ctx: Looks()}) as rt:
        rt.run(make_plan("lk", [{"id": "a", "adapter": "tool", "args": {"boom": 1}}]))
        rt.reconcile_by_lookup("lk", "a")
    after = counter("effectlog.reconciliations")
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    assert {(("effectlog.reconcile.kind", "lookup"),): 1} == delta
    (rec,) = by_name(spans, "effectlog.reconcile")
    assert ("lookup", "applied") == (
        rec.attributes["effectlog.reconcile.kind"],  # type: ignore[index]
        rec.attributes["effectlog.reconcile.outcome"],  # type: ignore[index]
    )


def _needing_operator(store: Any, key: str) -> int:
    """A request whose attempt was lost with no automatic requeue left: it waits for an operator."""
    from effectlog.fleet.contract import SHORT, noop_plan, wait_past
    from effectlog.fleet.recovery import decide_expired

    request_id = int(store.submit("s", key, noop_plan(f"run-{key}"), max_requeues=0).request.request_id)
    lease = store.claim(request_id, "r1", SHORT)
    assert lease is not None
    wait_past(store, lease.expires_at)
    assert store.recover(lease.attempt_id, lease.token, decide_expired) is not None
    return request_id


def test_fleet_operator_decisions_are_spans_from_the_cli_and_the_console(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """requeue (CLI), fail (console) and cancel (CLI) each give an effectlog.fleet.<action> span naming the
    request, the run, the attempt, who decided and the state after; a refused decision is an error span."""
    from effectlog.cli import main
    from effectlog.console.decisions import operate
    from effectlog.fleet import open_store
    from effectlog.fleet.contract import noop_plan

    location = str(tmp_path / "fleet.db")
    before = counter("effectlog.fleet.decisions")
    store = open_store(location)
    try:
        requeued, failed = _needing_operator(store, "a"), _needing_operator(store, "b")
        queued = int(store.submit("s", "c", noop_plan("run-c")).request.request_id)
        common = ["--store", location, "--by", "ops", "--reason", "checked the ledger"]
        assert 0 == main(["operator", "requeue", "--request", str(requeued), *common])
        operate(store, failed, "fail", by="alice", reason="charged upstream")
        assert 0 == main(["operator", "cancel", "--request", str(queued), *common])
        assert 2 == main(["operator", "fail", "--request", str(queued), *common])  # ended: refused, exit 2
    finally:
        store.close()
    keys = (
        "effectlog.fleet.request_id",
        "effectlog.run.id",
        "effectlog.attempt",
        "effectlog.decided_by",
        "effectlog.fleet.state",
    )
    got = [
        (*(s.attributes.get(k) for k in keys), s.name, s.status.status_code)  # type: ignore[union-attr]
        for s in spans.get_finished_spans()
        if s.name.startswith("effectlog.fleet.")
    ]
    assert [
        (requeued, "run-a", 2, "ops", "queued", "effectlog.fleet.requeue", StatusCode.UNSET),
        (failed, "run-b", 1, "alice", "failed", "effectlog.fleet.fail", StatusCode.UNSET),
        (queued, "run-c", 1, "ops", "cancelled", "effectlog.fleet.cancel", StatusCode.UNSET),
        (queued, None, None, "ops", None, "effectlog.fleet.fail", StatusCode.ERROR),
    ] == got
    refused = by_name(spans, "effectlog.fleet.fail")[-1]
    assert ["exception"] == [e.name for e in refused.events]
    after = counter("effectlog.fleet.decisions")
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
    decided = {(("effectlog.fleet.decision", a),): 1 for a in ("requeue", "fail", "cancel")}
    assert decided == delta  # the refused one is not counted as a decision


def test_fleet_requests_by_state_is_read_from_the_store(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """effectlog.fleet.requests reports the store's count per state at each collection while a store is
    watched (a state that emptied reports 0), and nothing once the store is no longer watched (the last
    export a short runner makes on its way out: test_observe_cli)."""
    from effectlog.fleet import open_store
    from effectlog.fleet.contract import noop_plan
    from effectlog.observe import requests_gauge

    store = open_store(str(tmp_path / "fleet.db"))
    try:
        with requests_gauge(store):
            first = int(store.submit("s", "1", noop_plan("run-1")).request.request_id)
            store.submit("s", "2", noop_plan("run-2"))
            assert {(("effectlog.fleet.state", "queued"),): 2} == counter("effectlog.fleet.requests")
            store.cancel(first, by="ops", reason="not needed")
            both = {(("effectlog.fleet.state", "cancelled"),): 1, (("effectlog.fleet.state", "queued"),): 1}
            assert both == counter("effectlog.fleet.requests")
        counter("effectlog.fleet.requests")  # the in-memory reader may still hold what the exit's flush collected
        assert {} == counter("effectlog.fleet.requests")
    finally:
        store.close()


def test_session_runs_have_run_and_step_spans_with_calls_under_their_steps(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    """A session pass is an effectlog.run span; each model or tool step an effectlog.step child with the
    Runtime's attribute names; each `chat` and `effectlog.tool` span sits under its own step's span. A pass
    that stopped early (an exception, then release) ends its run span; the next pass's run span links to it."""
    import asyncio

    from effectlog.session import Session, SqliteCheckpointer
    from session_kit import drive, scripted

    seen: list[str] = []

    def crash_at_the_second_model_call(point: str, step_id: str) -> None:
        seen.append(point)
        if point == "after_intent" and seen.count("after_intent") == 3:
            raise SimulatedCrash(point)

    calls = tmp_path / "calls.txt"
    with SqliteCheckpointer(tmp_path / "s.db") as store:
        first = Session("sess", scripted(calls), store, crash_hook=crash_at_the_second_model_call)
        with pytest.raises(SimulatedCrash):
            asyncio.run(drive(first))
        first.release()  # as the integrations do when a pass stops early
        asyncio.run(drive(Session("sess", scripted(calls), store)))
    done = spans.get_finished_spans()
    by_id = {s.context.span_id: s for s in done}
    runs = by_name(spans, "effectlog.run")
    assert [("running", False), ("completed", True)] == [
        (r.attributes["effectlog.run.state"], r.attributes["effectlog.resumed"])  # type: ignore[index]
        for r in runs
    ]
    assert [runs[0].context.span_id] == [link.context.span_id for link in runs[1].links]
    steps = by_name(spans, "effectlog.step")
    summary = [
        (
            s.attributes["effectlog.step.kind"],  # type: ignore[index]
            s.attributes["effectlog.outcome"],  # type: ignore[index]
            runs.index(by_id[s.parent.span_id]),  # type: ignore[union-attr]
        )
        for s in steps
    ]
    expected = [("model", "confirmed", 0), ("tool", "confirmed", 0), ("model", "interrupted", 0)]
    assert [*expected, ("model", "confirmed", 1)] == summary
    assert {"effectlog.run.id", "effectlog.step.id", "effectlog.attempt", "effectlog.adapter"} <= set(
        steps[1].attributes or {}
    )
    calls_under = [
        (c.name, by_id[c.parent.span_id].attributes["effectlog.step.kind"])  # type: ignore[union-attr, index]
        for c in done
        if c.name in ("chat scripted", "effectlog.tool")
    ]
    assert [("chat scripted", "model"), ("effectlog.tool", "tool"), ("chat scripted", "model")] == calls_under
    for c in done:
        if c.name in ("chat scripted", "effectlog.tool"):
            step = by_id[c.parent.span_id]  # type: ignore[union-attr]
            assert step.attributes["effectlog.step.id"] == c.attributes["effectlog.step.id"]  # type: ignore[index]


def test_repin_and_deny_are_decision_spans_naming_who_decided(tmp_path: Path, spans: InMemorySpanExporter) -> None:
    """repin (an audited decision on a whole run) is an effectlog.repin span with the adapters it accepted;
    a refused repin is an error span; deny names who decided, as every decision does."""
    from effectlog.errors import RepinRefused

    plan = make_plan("rp", [{"id": "a", "adapter": "tool", "approval": "required"}])
    with runtime(tmp_path) as rt:
        assert "suspended" == rt.run(plan).state
        rt.repin("rp", by="ops", reason="v2 deployed")
        rt.deny("rp", "a", by="alice", reason="no")
        with pytest.raises(RepinRefused):
            rt.repin("rp", by="ops", reason="too late")
    accepted, refused = by_name(spans, "effectlog.repin")
    (deny,) = by_name(spans, "effectlog.deny")
    assert ("rp", "ops", (), StatusCode.UNSET) == (
        accepted.attributes["effectlog.run.id"],  # type: ignore[index]
        accepted.attributes["effectlog.decided_by"],  # type: ignore[index]
        accepted.attributes["effectlog.repin.adapters"],  # type: ignore[index]
        accepted.status.status_code,
    )
    assert (StatusCode.ERROR, "effectlog.errors.RepinRefused") == (
        refused.status.status_code,
        refused.events[0].attributes["exception.type"],  # type: ignore[index]
    )
    assert "effectlog.step.id" not in (accepted.attributes or {})
    assert ("alice", "a") == (deny.attributes["effectlog.decided_by"], deny.attributes["effectlog.step.id"])  # type: ignore[index]
