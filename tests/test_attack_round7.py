"""Round-7 attacks: the framework integrations, the operator console and observability (the hash-chained
trace, the OpenTelemetry set-up) with cases nobody had tried. Each test is one suspicion, a failing
reproduction first where it found a defect, kept as a regression test where it found none. Real SQLite
files, real processes (``python -m effectlog``)."""

from __future__ import annotations

import json
import re
import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hardening_kit import GOOD_PLAN, cli_env, effectlog, last_line, one_line

# -- 1. a trace file whose last line is JSON but not a trace record --------------------------------


@pytest.mark.parametrize("last", ["[1]", "1", "null", '"x"', '{"hash": 7}'])
def test_run_trace_onto_a_file_ending_in_json_that_is_no_record_is_refused_in_one_line(
    tmp_path: Path, last: str
) -> None:
    """``run --trace F`` extends F's chain from the ``hash`` of its last line. A last line that was JSON
    but not an object (``[1]``, ``1``, ``null``: a file of something else, a hand edit) made the check
    index a list or an int: a TypeError traceback (exit 1) instead of the one-line refusal a last line
    that is not JSON gets. Proves: refused as bad input (exit 2, one line naming the file), no journal
    made, the file byte for byte as it was."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(last + "\n")
    proc = effectlog("run", "--journal", "j.db", "--trace", str(trace), str(GOOD_PLAN), cwd=tmp_path)
    assert (2, True, False, False, last + "\n") == (
        proc.returncode,
        "t.jsonl" in one_line(proc.stderr),
        "Traceback" in proc.stderr,
        (tmp_path / "j.db").exists(),
        trace.read_text(),
    )


@pytest.mark.parametrize("line", ["1", "[]", "null", '"x"'])
def test_verify_trace_names_a_line_of_json_that_is_no_record(tmp_path: Path, line: str) -> None:
    """``verify_trace`` answers ``(records checked, first bad line, reason)``; a line of JSON that is not
    an object raised AttributeError/TypeError out of it instead of naming the line. Proves: a good
    record then such a line gives ``(1, 2, "not a trace record")``."""
    from effectlog import events as ev
    from effectlog.trace import Trace, verify_trace

    path = tmp_path / "t.jsonl"
    trace = Trace(path)
    trace.record(ev.RunStarted(run_id="r", seq=1, ts=1, plan_digest="d"))
    trace.close()
    with path.open("a") as fh:
        fh.write(line + "\n")
    assert (1, 2, "not a trace record") == verify_trace(path)


# -- 2. OpenTelemetry settings the SDK refuses ------------------------------------------------------


@pytest.mark.parametrize("interval", ["0", "-5", "1e308"])
def test_a_metric_interval_the_sdk_refuses_never_stops_the_run(tmp_path: Path, interval: str) -> None:
    """The CLI sets OpenTelemetry up from ``OTEL_*`` and promises telemetry never stops a command (what
    cannot be set up is one line on stderr). ``OTEL_METRIC_EXPORT_INTERVAL=0`` (or negative) parsed as a
    float and went to the SDK, whose ValueError came out as a traceback, exit 1, the run never driven;
    one longer than a thread can wait (``1e308``) killed the SDK's export thread with an OverflowError
    traceback on stderr (and no periodic export). Proves: the run completes (exit 0), stderr names the
    variable in a line, no traceback."""
    env = {"OTEL_METRICS_EXPORTER": "console", "OTEL_METRIC_EXPORT_INTERVAL": interval}
    proc = effectlog("run", "--journal", "j.db", str(GOOD_PLAN), cwd=tmp_path, env=env)
    assert (0, False, True) == (
        proc.returncode,
        "Traceback" in proc.stderr,
        "OTEL_METRIC_EXPORT_INTERVAL" in proc.stderr,
    )


# -- 3. an application's span processor that raises -------------------------------------------------

_RAISING_PROCESSOR = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import msgspec
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanProcessor
    from effectlog.adapters import Receipt
    from effectlog.plan import parse_plan
    from effectlog.runtime import Runtime

    where, idempotent = sys.argv[1], sys.argv[2] == "1"
    SENDS = Path(where) / "sends"

    class Raises(SpanProcessor):
        def on_start(self, span, parent_context=None):
            if span.name == "effectlog.tool" and where.endswith("start"):
                raise RuntimeError("collector down")
        def on_end(self, span):
            if span.name == "effectlog.tool" and where.endswith("end"):
                raise RuntimeError("collector down")

    class Tool:
        def invoke(self, request):
            with SENDS.open("a") as fh:
                fh.write(request.idempotency_key + "\\n")
            return Receipt(data={"paid": 5})

    provider = TracerProvider()
    provider.add_span_processor(Raises())
    trace.set_tracer_provider(provider)
    plan = parse_plan(msgspec.json.encode({
        "run_id": "r",
        "adapters": {"tool": {"type": "custom", "version": "1", "idempotent": idempotent}},
        "steps": [{"id": "pay", "adapter": "tool", **({"retry": {"attempts": 3}} if idempotent else {})}],
    }))
    with Runtime(str(Path(where) / "j.db"), adapters={"custom": lambda decl, ctx: Tool()}) as rt:
        outcome = rt.run(plan)
    print(json.dumps({"state": outcome.state}))
    """
)


@pytest.mark.parametrize("idempotent", [False, True])
@pytest.mark.parametrize("when", ["end", "start"])
def test_a_span_processor_that_raises_neither_loses_a_tools_result_nor_sends_it_twice(
    tmp_path: Path, when: str, idempotent: bool
) -> None:
    """An application configures the OpenTelemetry SDK; its own span processor (an exporter shim, a
    sampler hook) raising when the ``effectlog.tool`` span ends came out of the tool hook as if the tool
    had raised: the receipt in hand was thrown away, a non-idempotent step was recorded uncertain (the
    run stopped for an operator over a payment that went through), an idempotent one with retries was
    sent three times and then recorded failed. Raising when the span starts, the tool was never sent and
    the step was recorded failed (uncertain when not idempotent). Telemetry is a report, never an
    outcome. Proves: the step is confirmed from exactly one send, the run completes."""
    where = tmp_path / when
    where.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", _RAISING_PROCESSOR, str(where), "1" if idempotent else "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=cli_env(),
    )
    assert (0, "completed", 1) == (
        proc.returncode,
        json.loads(proc.stdout or "{}").get("state", proc.stderr[-400:]),
        len((where / "sends").read_text().splitlines()) if (where / "sends").exists() else 0,
    )


# -- 4. a trace file that cannot take the next record (disk full, file size limit) -------------------


def test_a_trace_that_cannot_be_written_stops_the_run_in_one_line_and_stays_extendable(tmp_path: Path) -> None:
    """The trace is written after each journal commit. When the file could take no more (a full disk, a
    file size limit: here RLIMIT_FSIZE just above the trace's size), the OSError came out of the run as a
    traceback (exit 1, and a second one from closing the file), and the half-written record left behind
    made the trace one that ``run --trace`` refuses to extend, so the run could not be resumed with its
    trace. Proves: the run stops with one line naming the trace file (exit 2, bad input), no traceback;
    the trace still verifies and ends with a whole record; a resume with the same ``--trace`` (the limit
    gone) completes the run, each step confirmed once, and the trace verifies."""
    from effectlog.trace import verify_trace

    trace = tmp_path / "t.jsonl"
    first = effectlog("run", "--journal", "seed.db", "--trace", str(trace), str(GOOD_PLAN), cwd=tmp_path)
    assert 0 == first.returncode
    trace.write_bytes(b"\n" * 200_000 + trace.read_bytes())  # room for the journal's files under the limit
    limit = trace.stat().st_size + 300

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    cut = effectlog(
        "run", "--journal", "j.db", "--trace", str(trace), str(GOOD_PLAN), cwd=tmp_path, preexec=small_files
    )
    checked, bad, _ = verify_trace(trace)
    again = effectlog("run", "--journal", "j.db", "--trace", str(trace), str(GOOD_PLAN), cwd=tmp_path)
    status = effectlog("status", "--journal", "j.db", "--run-id", "good-run", "--json", cwd=tmp_path)
    assert (2, True, False, None, 0, "completed", None) == (
        cut.returncode,
        "t.jsonl" in last_line(cut.stderr),
        "Traceback" in cut.stderr,
        bad,
        again.returncode,
        json.loads(status.stdout).get("state"),
        verify_trace(trace)[1],
    )
    assert checked < verify_trace(trace)[0]


# -- 5. the console's approve form posted again for a later attempt of the same call ----------------


def test_an_approve_form_posted_again_after_the_step_moved_to_a_later_attempt_is_refused(tmp_path: Path) -> None:
    """The console's approve form is bound to the held call's args digest only. A step held for approval
    (a non-idempotent charge) is approved, runs, its reply is lost (uncertain), is reconciled "not
    applied", and is held again at attempt 2 with the same args, so the same digest. The approve form
    of attempt 1's page posted again (a browser resubmitting, a second tab, the back button) approved
    attempt 2, a second charge nobody looked at after the first went uncertain. Proves: the form carries
    the attempt its page showed, the late post is refused (409) and nothing is written; a form of the
    page as it is now still approves (303)."""
    from console_kit import Setup, console, digest_on_page, login, uncertain_plan

    setup = Setup(tmp_path)
    plan = uncertain_plan("c1")
    plan["steps"][0]["approval"] = "required"  # type: ignore[index]
    setup.run(plan, 4)
    with console(setup) as base:
        client, token = login(base, "olga")
        page = client.get("/runs/c1").text
        form = {"csrf": token, "digest": digest_on_page(page), "reason": "checked"}
        shown = re.search(r'id="approve-charge".*?name="attempt" value="(\d+)"', page, re.S)
        if shown is not None:
            form["attempt"] = shown.group(1)
        assert 303 == client.post("/runs/c1/steps/charge/approve", data=form).status_code
        setup.run(plan, 3)  # the charge's reply is lost: uncertain
        assert (
            303
            == client.post(
                "/runs/c1/steps/charge/reconcile",
                data={"csrf": token, "outcome": "not_applied", "evidence": "psp: nothing", "attempt": "1"},
            ).status_code
        )
        setup.run(plan, 4)  # held again, attempt 2, same args
        before = setup.timeline("c1")
        late = client.post("/runs/c1/steps/charge/approve", data=form)
        after = setup.timeline("c1")
        now = client.get("/runs/c1").text
        again = re.search(r'id="approve-charge".*?name="attempt" value="(\d+)"', now, re.S)
        fresh = dict(form, attempt=again.group(1) if again is not None else "")
        current = client.post("/runs/c1/steps/charge/approve", data=fresh)
        client.close()
    assert (409, before, "2", 303) == (late.status_code, after, fresh["attempt"], current.status_code)


# -- 6. the console's JSON API given bodies and query values nobody sends ---------------------------


def test_the_api_answers_bad_input_to_a_nested_body_and_to_a_wait_that_is_not_a_number(tmp_path: Path) -> None:
    """``/api/changes?wait=S`` is a long poll clamped to [0, 60] s; ``wait=nan`` passed the clamp (every
    comparison with NaN is false), so the deadline was never reached and the request polled the journal
    for as long as the server lived, one leaked task per request, for any viewer's token. A decision
    body of JSON nested deeper than the parser's recursion limit raised RecursionError, which is no
    ValueError: a 500 "internal error" instead of the API's 400. Proves: both are 400 bad_input answered
    at once, and nothing is written."""
    import httpx

    from console_kit import TOKENS, Setup, console

    setup = Setup(tmp_path)
    setup.uncertain()
    before = setup.timeline("charge-1")
    auth = {"Authorization": "Bearer " + TOKENS["olga"]}
    with console(setup) as base:
        now = httpx.get(base + "/api/changes", headers=auth, timeout=30).json()["version"]
        try:
            waited = httpx.get(base + f"/api/changes?wait=nan&since={now}", headers=auth, timeout=10).status_code
        except httpx.ReadTimeout:
            waited = 0  # still polling after 10 s
        deep = httpx.post(
            base + "/api/runs/charge-1/steps/charge/reconcile", headers=auth, content=b"[" * 100_000, timeout=30
        )
    assert (400, 400, "bad_input", before) == (
        waited,
        deep.status_code,
        deep.json().get("code") if deep.headers.get("content-type", "").startswith("application/json") else deep.text,
        setup.timeline("charge-1"),
    )


# -- 7. a tool's result holding NaN or an infinity ---------------------------------------------------


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_tool_result_holding_a_non_finite_float_is_not_recorded_as_null(tmp_path: Path, value: float) -> None:
    """Canonical JSON writes NaN and both infinities as ``null``, and ``why_unrecordable`` only asked
    whether the result encodes: a tool answering ``{"ratio": inf}`` was recorded as ``{"ratio": null}``
    and the caller (a durable block, a DurableAgent's model) was told ``None``, live and on every
    replay: the tool's real answer silently lost. Round 4 refused such floats in a durable call's args
    but not in what a tool answers. Proves: such a result is an unusable answer like any unencodable one
    (UncertainEffect, the step recorded uncertain, the next pass stops on it again), the call made once,
    and nothing is ever returned as ``None``."""
    from effectlog import durable
    from effectlog.errors import UncertainEffect

    made: list[object] = []

    @durable.tool(idempotent=False)
    def measure() -> dict[str, float]:
        made.append("measure")
        return {"ratio": value}

    answers: list[object] = []
    for _ in range(2):
        try:
            with durable.run("m1", journal=str(tmp_path / "d.db")):
                answers.append(measure())
        except UncertainEffect:
            answers.append("uncertain")
    assert (["uncertain", "uncertain"], ["measure"]) == (answers, made)


# -- 8. two writers of one trace file, and a trace rewritten by someone who can recompute it ----------


def test_two_runs_tracing_into_one_file_at_once_leave_a_chain_that_verifies(tmp_path: Path) -> None:
    """``--trace F`` continues F's chain from the hash of its last line, read once when the trace is
    opened. Two runs traced into one file at once (two ``effectlog run --trace audit.jsonl`` of different
    runs, an operator decision while a run goes on) each chained from the hash it read at open, so
    their interleaved records broke the chain: ``verify_trace`` reported tampering at the second writer's
    first record over a file nobody had touched. Proves: records of two real processes appended turn by
    turn, each after the other's, verify whole, every record counted."""
    from effectlog.trace import verify_trace

    trace = tmp_path / "audit.jsonl"
    writer = textwrap.dedent(
        """
        import sys, time
        from pathlib import Path
        from effectlog import events as ev
        from effectlog.trace import Trace
        path, run_id, turn, peer = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
        trace = Trace(path)
        turn.write_text("open")
        while not peer.exists():
            time.sleep(0.01)
        for seq in range(1, 4):
            trace.record(ev.RunStarted(run_id=run_id, seq=seq, ts=seq))
            time.sleep(0.05)
        trace.close()
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", writer, str(trace), run_id, str(tmp_path / mine), str(tmp_path / theirs)],
            env=cli_env(),
        )
        for run_id, mine, theirs in (("a", "a.open", "b.open"), ("b", "b.open", "a.open"))
    ]
    assert [0, 0] == [p.wait(timeout=60) for p in procs]
    assert (6, None, "") == verify_trace(trace)


def test_a_record_appended_with_a_recomputed_hash_is_named_by_verify_trace(tmp_path: Path) -> None:
    """The trace's chain was ``sha256(prev || record)`` with no secret: anyone who can write the file could
    append a forged record (or cut the last ones) and recompute a chain that ``verify_trace`` accepted.
    Proves: the trace of a keyed journal is chained with the journal's key (HMAC-SHA256, as the journal
    is), so a record appended with a recomputed SHA-256 hash, or an HMAC under another key, is named by
    ``verify_trace`` with the key; the run's own records verify with it, and read as changed without it.
    A trace of an unkeyed journal is as forgeable as that journal (docs/observability.md)."""
    import hashlib
    import hmac

    from effectlog.canonical import canonical_json
    from effectlog.chain import Chain
    from effectlog.journal.sqlite import SqliteJournal
    from effectlog.plan import AdapterDecl, Plan, StepDecl
    from effectlog.runtime import Runtime
    from effectlog.trace import last_hash, verify_trace

    key = b"the journal's key"
    path = tmp_path / "t.jsonl"
    noop = {"n": AdapterDecl(type="noop", idempotent=True)}
    plan = Plan(run_id="r", adapters=noop, steps=(StepDecl(id="s", adapter="n"),))
    with Runtime(SqliteJournal(tmp_path / "j.db", chain=Chain(key)), trace=path) as rt:
        rt.run(plan)
    own = verify_trace(path, key=key)
    assert (None, 1) == (own[1], verify_trace(path)[1])
    prev = last_hash(path)
    for forger in (None, b"another key"):
        forged: dict[str, object] = {"event": "run.completed", "run_id": "r", "seq": 9, "ts": 2, "prev": prev}
        body = prev.encode() + canonical_json(forged)
        forged["hash"] = (
            hashlib.sha256(body).hexdigest() if forger is None else hmac.new(forger, body, hashlib.sha256).hexdigest()
        )
        copy = tmp_path / f"forged-{forger is None}.jsonl"
        copy.write_bytes(path.read_bytes() + (json.dumps(forged) + "\n").encode())
        assert (own[0], own[0] + 1) == verify_trace(copy, key=key)[:2]


# -- 9. a durable tool cancelled while it runs ---------------------------------------------------


def test_a_non_idempotent_durable_call_cancelled_mid_tool_stops_the_run_as_a_resume_would(tmp_path: Path) -> None:
    """A caller's ``asyncio.wait_for`` timed out around a non-idempotent durable tool whose effect was
    already out: CancelledError is no Exception, so the step kept only its intent and the run went on.
    The caller's retry, the same call, became the next step and charged again, while a later pass of
    the same block stops on the first step as uncertain: the live process and the resume disagreed, and
    the live one paid twice. Proves: the cancelled step is recorded uncertain at once, the next call in
    the same block raises UncertainEffect without running, and the tool ran once."""
    import asyncio

    from effectlog import durable
    from effectlog.errors import UncertainEffect

    sent: list[int] = []

    @durable.tool(idempotent=False)
    async def pay(cents: int) -> str:
        sent.append(cents)
        await asyncio.sleep(0.5)  # the effect is out; the answer comes later
        return "paid"

    async def main() -> str:
        async with durable.run("c1", journal=str(tmp_path / "d.db")):
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(pay(5), 0.05)
            try:
                return await pay(5)
            except UncertainEffect:
                return "uncertain"

    assert ("uncertain", [5]) == (asyncio.run(main()), sent)


# -- 10. a model whose tool-call arguments hold NaN ------------------------------------------------


def test_a_models_tool_call_with_nan_in_its_arguments_is_told_back_not_a_run_stuck_forever(tmp_path: Path) -> None:
    """The session's agent loop parses a tool call's ``arguments`` string with ``json.loads``, which takes
    ``NaN`` and ``Infinity`` (no JSON has them, a model may write them). The call then reached the tool
    step, whose check refuses non-finite args with BadInput, raised out of the loop after the model's
    answer was recorded: every later pass replayed that answer and raised again, the run stuck with no
    way on. Proves: the model is told its arguments are not a JSON object (as for any unparseable
    arguments), no tool runs, and the run completes with the model's next answer, on the first pass."""
    import asyncio

    from effectlog.session import Session, SqliteCheckpointer, call, say
    from session_kit import drive, lines, scripted

    calls = tmp_path / "calls"
    script = [call("transfer", to="bob", amount=float("nan")), say("could not send")]
    with SqliteCheckpointer(tmp_path / "j.db") as store:
        steps = asyncio.run(drive(Session("s1", scripted(calls, script=script), store)))
    assert ("could not send", []) == (
        getattr(steps[-1], "result", None),
        [line for line in lines(calls) if line.startswith("transfer")],
    )


# -- 11. the console's session cookie kept after logging out -------------------------------------


def test_a_session_cookie_copied_before_logout_can_no_longer_decide(tmp_path: Path) -> None:
    """The console's sessions live in a signed cookie and nowhere else: logging out cleared the
    browser's copy, but a copy taken before (a shared machine, a proxy log, a stolen cookie) stayed
    valid for its 8 hours and could still approve a held payment. Proves: after logout that cookie is
    a stranger's: the run page redirects to the login (303), an approve with it and its CSRF token is
    refused (401), nothing is written; a fresh login still works."""
    import httpx

    from console_kit import Setup, console, digest_on_page, login

    setup = Setup(tmp_path)
    setup.held()
    with console(setup) as base:
        client, token = login(base, "olga")
        digest = digest_on_page(client.get("/runs/refund-1").text)
        copied = dict(client.cookies)
        assert 303 == client.post("/logout", data={"csrf": token}).status_code
        client.close()
        before = setup.timeline("refund-1")
        with httpx.Client(base_url=base, cookies=copied, follow_redirects=False, timeout=30) as thief:
            page = thief.get("/runs/refund-1")
            approve = thief.post(
                "/runs/refund-1/steps/refund/approve", data={"csrf": token, "digest": digest, "attempt": "1"}
            )
        after = setup.timeline("refund-1")
        again, _ = login(base, "olga")
        fresh = again.get("/runs/refund-1").status_code
        again.close()
    assert (303, 401, before, 200) == (page.status_code, approve.status_code, after, fresh)


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_the_cli_approve_and_deny_bound_to_an_attempt_refuse_a_later_one(tmp_path: Path, decision: str) -> None:
    """The CLI's analog of the console's bound forms: ``approve``/``deny --attempt N`` decide only the held
    call of attempt N. A step held at attempt 1, approved, uncertain, reconciled "not applied", and held
    again at attempt 2 with the same args (the same digest). Proves: ``--attempt 1`` is refused (exit 5,
    one line naming the attempts, nothing written), ``--attempt 2`` decides (exit 0)."""
    from console_kit import Setup, uncertain_plan

    setup = Setup(tmp_path)
    plan = uncertain_plan("c1")
    plan["steps"][0]["approval"] = "required"  # type: ignore[index]
    setup.run(plan, 4)
    pick = ["--journal", setup.journal, "--run-id", "c1", "--step", "charge"]
    assert 0 == effectlog("approve", *pick, "--by", "olga", "--attempt", "1", cwd=tmp_path).returncode
    setup.run(plan, 3)
    reconciled = effectlog(
        "reconcile", *pick, "--outcome", "not-applied", "--evidence", "psp: nothing", "--operator", "olga", cwd=tmp_path
    )
    assert 0 == reconciled.returncode
    setup.run(plan, 4)
    before = setup.timeline("c1")
    extra = ["--reason", "no"] if decision == "deny" else []
    late = effectlog(decision, *pick, "--by", "olga", "--attempt", "1", *extra, cwd=tmp_path)
    after = setup.timeline("c1")
    now = effectlog(decision, *pick, "--by", "olga", "--attempt", "2", *extra, cwd=tmp_path)
    assert (5, True, before, 0) == (late.returncode, "attempt 2" in one_line(late.stderr), after, now.returncode)
