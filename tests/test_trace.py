"""The hash-chained trace: it verifies, breaks at an edited line, continues across reopenings, leaks nothing."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given

from effectlog import events as ev
from effectlog.errors import BadInput
from effectlog.testing import sample_run
from effectlog.trace import Trace, verify_trace
from strategies import legal_histories

NEVER_TRACED = ("args", "plan", "receipt", "evidence")


def write_trace(path: Path, events: list[ev.Event]) -> None:
    trace = Trace(path)
    try:
        for event in events:
            trace.record(event)
    finally:
        trace.close()


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@given(history=legal_histories())
def test_a_recorded_trace_verifies(history: list[ev.Event]) -> None:
    """Any legal history recorded transition by transition gives a chain verify_trace accepts."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        write_trace(path, history)
        assert (len(history), None, "") == verify_trace(path)


def test_each_record_names_its_transition(tmp_path: Path) -> None:
    """A record holds run, seq, event tag and (for step events) step and attempt, linked by prev/hash."""
    path = tmp_path / "trace.jsonl"
    history = sample_run("r", steps=1)
    write_trace(path, history)
    records = [json.loads(line) for line in lines_of(path)]
    assert [ev.tag_of(e) for e in history] == [r["event"] for r in records]
    assert [("r", e.seq) for e in history] == [(r["run_id"], r["seq"]) for r in records]
    assert ("s0", 1) == (records[1]["step_id"], records[1]["attempt"])
    assert [r["hash"] for r in records[:-1]] == [r["prev"] for r in records[1:]]
    assert "0" * 64 == records[0]["prev"]


@pytest.mark.parametrize("line", [1, 4, 8])
def test_editing_one_line_breaks_the_chain_at_that_line(tmp_path: Path, line: int) -> None:
    """Changing a field of record N (and re-serialising it) makes verify_trace stop at line N."""
    path = tmp_path / "trace.jsonl"
    write_trace(path, sample_run("r", steps=2))
    lines = lines_of(path)
    record = json.loads(lines[line - 1])
    record["seq"] += 100
    lines[line - 1] = json.dumps(record, sort_keys=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert (line - 1, line, "hash does not match the record") == verify_trace(path)


@pytest.mark.parametrize("line", [1, 4, 7])
def test_removing_one_line_breaks_the_chain_at_the_next(tmp_path: Path, line: int) -> None:
    """A dropped record is noticed at the record that followed it (its prev no longer matches)."""
    path = tmp_path / "trace.jsonl"
    write_trace(path, sample_run("r", steps=2))
    lines = lines_of(path)
    del lines[line - 1]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert (line - 1, line, "prev does not match the previous record's hash") == verify_trace(path)


def test_a_line_that_is_not_a_record_is_reported(tmp_path: Path) -> None:
    """A line that is not JSON with a hash is reported by its line number."""
    path = tmp_path / "trace.jsonl"
    write_trace(path, sample_run("r", steps=1))
    lines = lines_of(path)
    lines.insert(2, "not json")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert (2, 3, "not a trace record") == verify_trace(path)


def test_appending_to_an_existing_trace_continues_its_chain(tmp_path: Path) -> None:
    """A Trace opened on an existing file links its first record to the file's last hash."""
    path = tmp_path / "trace.jsonl"
    history = sample_run("r", steps=2)
    write_trace(path, history[:3])
    last = json.loads(lines_of(path)[-1])["hash"]
    write_trace(path, history[3:])
    assert last == json.loads(lines_of(path)[3])["prev"]
    assert (len(history), None, "") == verify_trace(path)


def test_a_trace_that_does_not_end_with_a_record_is_not_extended(tmp_path: Path) -> None:
    """Opening a trace whose last line is not a record is refused rather than starting a new chain."""
    path = tmp_path / "trace.jsonl"
    write_trace(path, sample_run("r", steps=1))
    with path.open("a", encoding="utf-8") as fh:
        fh.write("garbage\n")
    with pytest.raises(BadInput, match="does not end with a trace record"):
        Trace(path)


def test_args_plan_receipt_and_evidence_never_appear(tmp_path: Path) -> None:
    """Neither event payloads nor extra fields named args/plan/receipt/evidence reach the trace."""
    path = tmp_path / "trace.jsonl"
    secret = {"token": "SECRET-VALUE"}
    events: list[ev.Event] = [
        ev.RunStarted(run_id="r", seq=1, ts=0, plan={"steps": [{"id": "s0", "args": secret}]}),
        ev.StepRequested(run_id="r", seq=2, ts=0, step_id="s0", adapter="a", idempotency_key="k", args_digest="x"),
        ev.StepUncertain(run_id="r", seq=3, ts=0, step_id="s0"),
        ev.StepReconciled(
            run_id="r", seq=4, ts=0, step_id="s0", outcome="applied", evidence="SECRET-VALUE", operator="o"
        ),
        ev.StepEffected(run_id="r", seq=5, ts=0, step_id="s1", receipt=secret),
    ]
    trace = Trace(path)
    try:
        for event in events:
            trace.record(event, args=secret, plan=secret, receipt=secret, evidence="SECRET-VALUE", adapter="a")
    finally:
        trace.close()
    text = path.read_text(encoding="utf-8")
    assert "SECRET" not in text
    records = [json.loads(line) for line in text.splitlines()]
    assert [] == [(r["seq"], k) for r in records for k in NEVER_TRACED if k in r]
    assert ["a"] * len(events) == [r["adapter"] for r in records]  # other extras are kept
    assert (len(events), None, "") == verify_trace(path)


def test_step_records_carry_outcome_error_and_duration_and_still_verify(tmp_path: Path) -> None:
    """Outcome events gain outcome, error (for failures) and duration_ms from step.requested's ts (issue 16)."""
    path = tmp_path / "trace.jsonl"
    req = {"adapter": "t", "idempotency_key": "k", "args_digest": "d"}
    history = [
        ev.StepRequested(run_id="r", seq=2, ts=1_000_000, step_id="a", **req),
        ev.StepConfirmed(run_id="r", seq=3, ts=3_500_000, step_id="a"),
        ev.StepRequested(run_id="r", seq=4, ts=4_000_000, step_id="b", **req),
        ev.StepFailed(run_id="r", seq=5, ts=9_000_000, step_id="b", reason="the tool reported failure"),
        ev.StepDenied(run_id="r", seq=6, ts=9_500_000, step_id="c", decision="require_approval", reason="hold"),
    ]
    write_trace(path, history)
    records = [json.loads(line) for line in lines_of(path)]
    assert [
        {},
        {"outcome": "confirmed", "duration_ms": 2.5},
        {},
        {"outcome": "failed", "error": "the tool reported failure", "duration_ms": 5.0},
        {"outcome": "held", "error": "hold"},
    ] == [{k: r[k] for k in ("outcome", "error", "duration_ms") if k in r} for r in records]
    assert (5, None, "") == verify_trace(path)
