"""Round-8 attacks: the code that changed for speed (the SQLite fleet store and journal sharing one
connection, the claim carried in a run's last commit, the one-statement lease fence, PostgreSQL's
``claim_next`` function), the attempt-bound decisions, and the general classes with new cases. Each
test is one suspicion, a failing reproduction first where it found a defect, kept as a regression
test where it found none. Real SQLite files, real processes (``python -m effectlog`` or a child
interpreter running a real ``Runner``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hardening_kit import cli_env, effectlog, one_line


def _script_report(*args: str) -> tuple[Any, subprocess.CompletedProcess[str]]:
    """Run a script in a child interpreter; its report is the JSON of its last line of stdout."""
    argv = [sys.executable, "-c", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=cli_env())
    lines = proc.stdout.strip().splitlines() or ["{}"]
    return json.loads(lines[-1]), proc


pytest_plugins = ["pg_fixture"]

# -- 1. an application's span processor that raises on the fleet's own spans ------------------------

_FLEET_WITH_RAISING_PROCESSOR = textwrap.dedent(
    """
    import itertools, json, os, sys, threading
    from pathlib import Path
    import msgspec
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanProcessor
    from effectlog.fleet import open_store
    from effectlog.fleet.runner import Runner, RunnerConfig
    from effectlog.plan import parse_plan

    where, name, nth = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    seen = itertools.count(1)

    class Raises(SpanProcessor):
        def on_start(self, span, parent_context=None):
            if span.name == name and next(seen) == nth:
                raise RuntimeError("collector down")

    provider = TracerProvider()
    provider.add_span_processor(Raises())
    trace.set_tracer_provider(provider)

    def hung():  # the defect's shape: the runner never returns; say what the store holds and stop
        with open_store(str(where / "s.db")) as look:
            print(json.dumps({"rc": "hung", "states": [r.state for r in look.requests()]}), flush=True)
        os._exit(9)

    threading.Timer(30, hung).start()
    store = open_store(str(where / "s.db"))
    for i in (1, 2):
        plan = {"run_id": f"r{i}", "adapters": {"c": {"type": "effects.control"}},
                "steps": [{"id": "s", "adapter": "c", "args": {"n": i}}]}
        store.submit("t", f"k{i}", parse_plan(msgspec.json.encode(plan)))
    config = RunnerConfig(
        store=str(where / "s.db"), effects=str(where / "e.db"), exit_when_idle=True, recover=False, poll_s=0.1
    )
    try:
        rc = Runner(config, store).serve()
    except BaseException as exc:
        rc = f"{type(exc).__name__}: {exc}"
    print(json.dumps({"rc": rc, "states": [r.state for r in store.requests()]}), flush=True)
    os._exit(0)
    """
)


@pytest.mark.parametrize(
    ("span", "nth"),
    [("effectlog.fleet.claim", 1), ("effectlog.fleet.claim", 2), ("effectlog.fleet.attempt", 1)],
    ids=["claim", "carried-claim", "attempt"],
)
def test_a_span_processor_that_raises_on_a_fleet_span_loses_no_request_and_hangs_no_runner(
    tmp_path: Path, span: str, nth: int
) -> None:
    """Round 7 made the run's and the tool's spans report-only; the runner's own spans were not. An
    application's span processor raising when ``effectlog.fleet.claim`` starts crashed the runner's main
    loop with the request just leased (left leased until its lease ran out, then counted as an automatic
    requeue); raising for the claim carried in a run's last commit killed the attempt thread inside its
    ``finally``: the next request stayed leased and never ran, the finished attempt's slot stayed busy
    for good, and the runner never exited (not even on SIGTERM); raising when ``effectlog.fleet.attempt``
    starts, every request the runner leased was abandoned unreported ("error") and the runner went on
    to lease the next. Telemetry is a report, never an outcome. Proves: both requests succeed, the
    runner returns 0."""
    report, proc = _script_report(_FLEET_WITH_RAISING_PROCESSOR, str(tmp_path), span, str(nth))
    assert {"rc": 0, "states": ["succeeded", "succeeded"]} == report, proc.stderr[-1500:]


# -- 2. approve --expires-in that is no number of seconds --------------------------------------------


@pytest.mark.parametrize("seconds", ["inf", "nan", "1e300", "-0"])
def test_approve_expires_in_that_is_no_time_is_refused_in_one_line(tmp_path: Path, seconds: str) -> None:
    """``approve --expires-in S`` checked only ``S <= 0``: ``nan`` passed it and ``inf`` (or anything past
    about 1.8e299, whose nanoseconds overflow to infinity) too, and ``int(S * 1e9)`` then raised out of the
    command as a traceback with exit 1. Proves: each is refused as bad input (exit 2) in one line naming
    the flag, and the held step stays held (nothing written)."""
    from console_kit import Setup, held_plan

    setup = Setup(tmp_path)
    setup.run(held_plan("h1"), 4)
    before = setup.timeline("h1")
    done = effectlog(
        "approve", "--journal", setup.journal, "--run-id", "h1", "--step", "refund", "--by", "olga",
        f"--expires-in={seconds}", cwd=tmp_path,
    )  # fmt: skip
    assert (2, True, before) == (done.returncode, "--expires-in" in one_line(done.stderr), setup.timeline("h1"))


# -- 3. command-line text that is not UTF-8 ----------------------------------------------------------

_NOT_UTF8 = "\udcff"  # how Python decodes the byte 0xff of an argument (surrogateescape), as from a shell's $'\xff'


@pytest.mark.parametrize(
    ("flag", "argv"),
    [
        ("--by", ["approve", "--journal", "J", "--run-id", "h1", "--step", "refund", "--by", f"olga{_NOT_UTF8}"]),
        ("--effects", ["run", "P", "--journal", "J", "--effects", f"e{_NOT_UTF8}.db"]),
        ("--scope", ["submit", "--store", "S", "--scope", _NOT_UTF8, "--key", "k", "P"]),
        ("--runner-id", ["runner", "--store", "S", "--exit-when-idle", "--runner-id", f"r{_NOT_UTF8}"]),
    ],
    ids=["approve-by", "run-effects", "submit-scope", "runner-id"],
)
def test_an_argument_that_is_not_utf8_is_refused_in_one_line_and_writes_nothing(
    tmp_path: Path, flag: str, argv: list[str]
) -> None:
    """A byte that is not UTF-8 in an argument (a shell's ``$'\\xff'``, a name pasted from a Latin-1
    file) reaches Python as a lone surrogate. Names and reasons are recorded as UTF-8 text, so
    ``approve --by``/``deny --reason`` (the decision event), ``run --effects`` (the store's path pinned
    in ``run.started``), ``submit --scope/--requires`` and ``runner --runner-id`` (fleet rows) raised
    ``UnicodeEncodeError`` out of the command: a traceback with exit 1 (the runner's after opening the
    store, in its first claim). Proves: each is refused as bad input (exit 2) in one line naming the
    flag; the held run and the fleet store are unchanged."""
    from console_kit import Setup, held_plan

    setup = Setup(tmp_path)
    setup.run(held_plan("h1"), 4)
    store = tmp_path / "s.db"
    plan = tmp_path / "q.json"
    plan.write_text(json.dumps({**held_plan("q1"), "steps": [{"id": "s", "adapter": "payments", "args": {"n": 1}}]}))
    assert (
        0
        == effectlog("submit", "--store", str(store), "--scope", "t", "--key", "q", str(plan), cwd=tmp_path).returncode
    )
    before = (setup.timeline("h1"), store.read_bytes())
    swap = {"J": setup.journal, "S": str(store), "P": str(plan)}
    done = effectlog(*[swap.get(a, a) for a in argv], cwd=tmp_path)
    line = one_line(done.stderr)
    assert (2, True) == (done.returncode, flag in line), line
    assert before == (setup.timeline("h1"), store.read_bytes())


# -- 4. the attempt a console decision is bound to, given as a digit that is no number ---------------


@pytest.mark.parametrize("attempt", ["\u00b2", "\u2460", "2147483648"])
def test_a_decision_bound_to_an_attempt_that_is_no_whole_number_is_bad_input(tmp_path: Path, attempt: str) -> None:
    """The console's decisions take the attempt the page showed (a hidden field, or ``attempt`` in the
    API's body) and check it with ``str.isdigit()``, which is true for superscripts and circled
    digits (``²``, ``①``) that ``int()`` refuses: the ValueError left the API as a 500 "internal
    error" instead of its 400. Proves: every attempt that is not a whole number above 0 is a 400
    ``bad_input`` and nothing is written."""
    import httpx

    from console_kit import TOKENS, Setup, console

    setup = Setup(tmp_path)
    setup.uncertain()
    before = setup.timeline("charge-1")
    auth = {"Authorization": "Bearer " + TOKENS["olga"]}
    body = {"outcome": "applied", "evidence": "psp: paid", "attempt": attempt}
    with console(setup) as base:
        done = httpx.post(base + "/api/runs/charge-1/steps/charge/reconcile", headers=auth, json=body, timeout=30)
    code = done.json().get("code") if done.headers.get("content-type", "").startswith("application/json") else ""
    assert (400, "bad_input", before) == (done.status_code, code, setup.timeline("charge-1"))


# -- 5. a schema version in a file's meta table that is no version -------------------------------------


@pytest.mark.parametrize("version", ["\u00b2", "x", "-1", "3.0"])
@pytest.mark.parametrize("which", ["journal", "fleet store"])
def test_a_schema_version_that_is_no_whole_number_is_an_unreadable_file_not_a_traceback(
    tmp_path: Path, which: str, version: str
) -> None:
    """A journal's ``meta.schema_version`` was checked with ``str.isdigit()`` (true of ``²``, which
    ``int()`` refuses) and a fleet store's ``meta.fleet_schema_version`` not at all: ``x`` or ``²`` raised
    ValueError and ``-1`` a KeyError (a migration "from v-1") out of every command that opened the file,
    a traceback with exit 1. A meta row edited by hand, restored from another tool or half-written is
    what these checks are for. Proves: the command exits 2 in one line saying the file is unreadable,
    and the file is unchanged."""
    import sqlite3

    from console_kit import Setup, held_plan

    setup = Setup(tmp_path)
    if which == "journal":
        setup.run(held_plan("h1"), 4)
        path, key, argv = Path(setup.journal), "schema_version", ["verify", "--journal", setup.journal]
    else:
        plan = tmp_path / "q.json"
        plan.write_text(json.dumps(held_plan("q1")))
        path = tmp_path / "s.db"
        assert (
            0
            == effectlog(
                "submit", "--store", str(path), "--scope", "t", "--key", "q", str(plan), cwd=tmp_path
            ).returncode
        )
        key, argv = "fleet_schema_version", ["requests", "--store", str(path)]
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE meta SET value = ? WHERE key = ?", (version, key))
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    before = path.read_bytes()
    done = effectlog(*argv, cwd=tmp_path)
    assert (2, "journal_unreadable", before) == (
        done.returncode,
        one_line(done.stderr).split(":")[1].strip(),
        path.read_bytes(),
    )


# -- 6. --max-attempts against claims carried in two runs' last commits at once ----------------------

_TWO_CARRIED_CLAIMS = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from pathlib import Path
    import msgspec
    from effectlog.fleet import open_store
    from effectlog.fleet.runner import Runner, RunnerConfig
    from effectlog.plan import parse_plan

    where = Path(sys.argv[1])
    threading.Timer(60, lambda: os._exit(9)).start()
    store = open_store(str(where / "s.db"))
    for i in range(6):
        plan = {"run_id": f"r{i}", "adapters": {"c": {"type": "effects.idempotent", "idempotent": True}},
                "steps": [{"id": "s", "adapter": "c", "args": {"n": i}}]}
        store.submit("t", f"k{i}", parse_plan(msgspec.json.encode(plan)))
    first = threading.Lock()

    class Runner2(Runner):
        def _attempt(self, slot):  # the first attempt to finish lingers after its commit until another one's
            outcome = super()._attempt(slot)
            if first.acquire(blocking=False):
                done = lambda: sum(r.state == "succeeded" for r in store.requests()) >= 2
                deadline = time.monotonic() + 120  # ends as soon as the other has: generous for a loaded machine
                while not done() and time.monotonic() < deadline:
                    time.sleep(0.01)
            return outcome

    config = RunnerConfig(
        store=str(where / "s.db"), effects=str(where / "e.db"), capacity=2, max_attempts=3, recover=False, poll_s=0.05
    )
    rc = Runner2(config, store, log=open(os.devnull, "w")).serve()
    print(json.dumps({"rc": rc, "attempts": sum(a.state != "queued" for a in store.attempts())}), flush=True)
    os._exit(0)
    """
)


def test_two_attempts_ending_together_carry_no_claim_past_max_attempts(tmp_path: Path) -> None:
    """``runner --max-attempts N`` stops claiming once N attempts started; a claim carried in a run's
    last commit checked ``started`` there, but ``started`` counted it only later, on the attempt's thread,
    after the commit. Capacity 2, N = 3: the first two attempts end together, the first's commit carries
    the third claim, and the second's commit, landing before the first's thread counted it, carried a
    fourth. (Left to chance, one run in three did so here.) Proves: exactly 3 attempts are made."""
    report, proc = _script_report(_TWO_CARRIED_CLAIMS, str(tmp_path))
    assert {"rc": 0, "attempts": 3} == report, proc.stderr[-1500:]


# -- 7. the command a notification carries, about the attempt the person will look at --------------


@pytest.mark.parametrize(("which", "status", "verb"), [("held", 4, "approve"), ("uncertain", 3, "reconcile")])
def test_a_notifications_command_is_bound_to_the_attempt_it_announces(
    tmp_path: Path, which: str, status: int, verb: str
) -> None:
    """Round 7 bound the decisions to an attempt (``approve|deny|reconcile --attempt N``), and the run's
    own message, ``run --json`` and the session's notifications print the bound command. The
    notification of ``run --notify-command|--notify-url`` (and the runner's) still carried the unbound
    one: a person acting on it after the step moved on to another attempt (reconciled "not applied" and
    held again with the same args) decided a call they never saw. Proves: the command in the notification
    names the attempt that is waiting (``--attempt 1``)."""
    from console_kit import Setup, held_plan, uncertain_plan

    setup = Setup(tmp_path)
    plan = held_plan("n1") if which == "held" else uncertain_plan("n1")
    (tmp_path / "n1.json").write_text(json.dumps(plan))
    inbox = tmp_path / "inbox.jsonl"
    done = effectlog(
        "run", "n1.json", "--journal", setup.journal, "--effects", setup.effects, "--adapters", "lost_tools:ADAPTERS",
        "--notify-command", f"cat >> {inbox}; echo >> {inbox}", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    notes = [json.loads(line) for line in inbox.read_text().splitlines() if line.strip()]
    commands = [n["command"] for n in notes]
    assert (status, 1, True) == (done.returncode, len(commands), f"effectlog {verb}" in commands[0]), done.stderr
    assert "--attempt 1 " in commands[0], commands[0]


# -- 8. started with stdout or stderr closed ---------------------------------------------------------

_CHATTY = """
class Chatty:
    def invoke(self, request):
        print("a tool's chatter " * 8000)  # 136 KB on stdout
        return {"ok": 1}

ADAPTERS = {"test.chatty": lambda decl, ctx: Chatty()}
"""


@pytest.mark.parametrize("closed", [1, 2], ids=["stdout", "stderr"])
def test_a_run_started_with_a_standard_descriptor_closed_keeps_the_journal_intact(tmp_path: Path, closed: int) -> None:
    """A supervisor or a shell's ``2>&-``/``>&-`` starts ``effectlog run`` with fd 2 (or 1) closed, so
    the first file the process opens, the journal, gets that number. ``tools_write_to_stderr`` then
    pointed fd 1 at "stderr", the journal's descriptor: a tool's ``print`` wrote into the journal file
    at offset 0, and the next checkpoint left it "malformed" (every run in it lost: ``journal_damaged``,
    exit 7). With fd 1 closed, ``sys.stdout`` is None and the command died on it with a traceback
    before running anything. Proves: the run completes (exit 0) and every run in the journal still
    verifies."""
    import os

    (tmp_path / "chatty.py").write_text(_CHATTY)
    journal = str(tmp_path / "j.db")
    steps = [{"id": f"s{i}", "adapter": "t"} for i in range(40)]
    adapters = {"t": {"type": "test.chatty", "version": "1", "idempotent": True}}
    for run_id in ("before", "chatty"):
        (tmp_path / f"{run_id}.json").write_text(json.dumps({"run_id": run_id, "adapters": adapters, "steps": steps}))
    common = ("--journal", journal, "--adapters", "chatty:ADAPTERS", "--quiet")
    env = {"PYTHONPATH": str(tmp_path)}
    assert 0 == effectlog("run", "before.json", *common, cwd=tmp_path, env=env).returncode
    done = effectlog("run", "chatty.json", *common, cwd=tmp_path, env=env, preexec=lambda: os.close(closed))
    verified = effectlog("verify", "--journal", journal, cwd=tmp_path)
    assert (0, 0, "ok: 2 run(s)") == (done.returncode, verified.returncode, verified.stdout[:12]), verified.stderr


# -- 9. SIGTERM while the run whose last commit would carry the next claim is finishing --------------


@pytest.mark.parametrize("point", ["before_append:run.completed", "prepared"])
def test_sigterm_before_the_carrying_commit_leaves_the_next_request_queued_and_the_runner_exits(
    tmp_path: Path, point: str
) -> None:
    """SIGTERM means "finish running attempts, claim nothing more". The next claim now rides in the
    commit that records a run's ``run.completed``: a signal that arrives before that commit must keep
    it out (else the runner, told to stop, takes one more request, or strands it leased). Two requests;
    the runner, stopped at ``point`` of the first attempt, gets SIGTERM, then goes on. Proves: the
    first request succeeds, the second is still queued (never leased), the runner exits 0. (Found
    nothing: kept as a regression test.)"""
    from fleet_kit import RunnerProcess, wait_until, write_plan

    store = str(tmp_path / "s.db")
    for i in (1, 2):
        plan = write_plan(tmp_path / f"p{i}.json", f"r{i}", [("s", "idem")])
        assert (
            0
            == effectlog(
                "submit", "--store", store, "--scope", "t", "--key", f"k{i}", str(plan), cwd=tmp_path
            ).returncode
        )
    runner = RunnerProcess(
        store,
        tmp_path,
        "A",
        arm=point,
        resumable=True,
        extra=("--lease-s", "5", "--heartbeat-s", "0.5", "--poll-s", "0.05"),
    )
    try:
        runner.reached()
        runner.signal(signal.SIGTERM)
        wait_until(lambda: "signal 15" in runner.log() or None, "the runner took the signal")  # then go on
        runner.resume()
        code = runner.wait()
    finally:
        runner.stop()
    done = effectlog("requests", "--store", store, "--json", cwd=tmp_path)
    states = [r["state"] for r in json.loads(done.stdout)]
    assert (0, ["succeeded", "queued"]) == (code, states), runner.log()


# -- 10. PostgreSQL: the claim function of fleet schema v3, and capabilities with odd text ---------

_ODD_CAPABILITIES = [
    "it's",
    'a"b',
    "back\\slash",
    "%",
    "_",
    ".*",
    "é",
    "e\u0301",
    "😀",
    "[1]",
    '{"a":1}',
    "null",
    " x ",
    "A",
    "a",
]


def _odd_capability_claims(store: object) -> dict[str, list[str]]:
    """Each odd capability required by one request, offered by one runner: what each runner is leased."""
    import msgspec

    from effectlog.plan import parse_plan

    for i, cap in enumerate(_ODD_CAPABILITIES):
        plan = {
            "run_id": f"r{i}",
            "adapters": {"c": {"type": "effects.control"}},
            "steps": [{"id": "s", "adapter": "c"}],
        }
        store.submit("t", f"k{i}", parse_plan(msgspec.json.encode(plan)), [cap])  # type: ignore[attr-defined]
    got = {cap: [lease.run_id for lease in store.claim_next(f"runner{i}", [cap], 30.0, 5)]  # type: ignore[attr-defined]
           for i, cap in enumerate(_ODD_CAPABILITIES)}  # fmt: skip
    got["*"] = [lease.run_id for lease in store.claim_next("wild", ["%", ".*", "*", "_"], 30.0, 5)]  # type: ignore[attr-defined]
    return got


_EXACT = {**{cap: [f"r{i}"] for i, cap in enumerate(_ODD_CAPABILITIES)}, "*": []}


def test_capabilities_with_quotes_wildcards_and_unicode_match_only_themselves_on_sqlite(tmp_path: Path) -> None:
    """The claim matches a request's required capabilities against the runner's offer in SQL (SQLite:
    ``json_each``; PostgreSQL: ``jsonb <@`` in ``claim_next``). Quotes, backslashes, LIKE and regex
    metacharacters, JSON-looking text, case and Unicode (composed and decomposed é) must match
    exactly, never as a pattern. Proves: each runner is leased exactly the request needing its
    capability, and a runner offering ``%``/``.*``/``*``/``_`` nothing else. (Found nothing.)"""
    from effectlog.fleet.sqlite_store import SqliteFleetStore

    with SqliteFleetStore(tmp_path / "s.db") as store:
        assert _EXACT == _odd_capability_claims(store)


def test_capabilities_and_a_dropped_claim_function_on_postgresql(pg_url: str) -> None:
    """PostgreSQL's half of the test above (found nothing), and: fleet schema v3 claims through the
    function ``effectlog_fleet.claim_next``. Dropped (a DBA's clean-up, a restore that skipped
    functions) while the schema version still says 3, every claim of every runner failed ("function
    does not exist", logged at each poll) for good: a store that opened fine and never leased again.
    Proves: a store opened after the function is gone makes it again, and the claim leases."""
    import msgspec
    import psycopg

    from effectlog.fleet.postgres_store import PostgresFleetStore
    from effectlog.plan import parse_plan

    with PostgresFleetStore(pg_url) as store:
        assert _EXACT == _odd_capability_claims(store)
        plan = {"run_id": "z", "adapters": {"c": {"type": "effects.control"}}, "steps": [{"id": "s", "adapter": "c"}]}
        store.submit("t", "z", parse_plan(msgspec.json.encode(plan)))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP FUNCTION effectlog_fleet.claim_next(text, integer, text, double precision)")
    with PostgresFleetStore(pg_url) as store:
        assert ["z"] == [lease.run_id for lease in store.claim_next("y", [], 30.0, 1)]


# -- 11. a runner whose --effects is mistyped ----------------------------------------------------------


@pytest.mark.parametrize(
    "effects", ["missing-dir/e.db", "s.db", "plan.json"], ids=["no-dir", "the-store", "not-sqlite"]
)
def test_a_runner_with_an_effect_store_it_cannot_use_claims_nothing(tmp_path: Path, effects: str) -> None:
    """``effectlog run`` checks ``--effects`` before anything (``check_effect_store``); ``runner`` did not:
    a mistyped path in a directory that does not exist, the store file itself, or a file that is no
    SQLite database was found only when each attempt built its runtime, after the claim. So the
    runner leased every request in the queue in turn and sent each to ``needs_operator`` (or, for the
    store file itself, to ``failed``, which ends the request for good). Proves: the runner exits 2 in
    one line naming ``--effects`` before claiming, and every request is still queued."""
    from fleet_kit import write_plan

    store = str(tmp_path / "s.db")
    plan = write_plan(tmp_path / "plan.json", "r1", [("s", "control")])
    for i in (1, 2):
        (tmp_path / f"p{i}.json").write_text(plan.read_text().replace('"r1"', f'"r{i}"'))
        assert (
            0
            == effectlog(
                "submit", "--store", store, "--scope", "t", "--key", f"k{i}", f"p{i}.json", cwd=tmp_path
            ).returncode
        )
    done = effectlog("runner", "--store", store, "--effects", effects, "--exit-when-idle", cwd=tmp_path)
    line = one_line(done.stderr)
    states = [r["state"] for r in json.loads(effectlog("requests", "--store", store, "--json", cwd=tmp_path).stdout)]
    assert (2, True, ["queued", "queued"]) == (done.returncode, "--effects" in line, states), line


# -- 12. a fleet decision from a page about an earlier attempt of the request ------------------------


def test_a_fleet_decision_posted_from_a_page_about_an_earlier_attempt_is_refused(tmp_path: Path) -> None:
    """Round 7 bound the run decisions (approve, deny, reconcile) to the attempt the page showed; the
    request page's decisions (requeue, fail for good, cancel) are not: the page shows "attempt 1:
    needs_operator" and its forms carry no attempt, the API takes none. Attempt 1 needed an operator,
    one operator requeued it, attempt 2 needed an operator for another reason; a second operator's
    "Fail (for good)" from the page about attempt 1 (the body names attempt 1) ended the request over
    a situation they never saw. Proves: the API refuses it (409), so does ``effectlog operator fail
    --attempt 1`` (exit 5, one line), and the request is still waiting at attempt 2; ``--attempt 2`` decides."""
    import httpx
    import msgspec

    from console_kit import TOKENS, Setup, console, held_plan
    from effectlog.fleet.sqlite_store import SqliteFleetStore
    from effectlog.plan import parse_plan

    setup = Setup(tmp_path)
    setup.run(held_plan("h1"), 4)  # the console's journal
    store = str(tmp_path / "s.db")
    with SqliteFleetStore(store) as fleet:
        plan = {"run_id": "f1", "adapters": {"c": {"type": "effects.control"}}, "steps": [{"id": "s", "adapter": "c"}]}
        request = fleet.submit("t", "k", parse_plan(msgspec.json.encode(plan))).request.request_id
        for attempt in (1, 2):
            lease = fleet.claim(request, "r", 30.0)
            assert lease is not None
            fleet.advance(lease, "prepare", op_key="prepare")
            fleet.advance(lease, "start", op_key="start")
            fleet.advance(lease, "escalate", op_key="final", reason=f"attempt {attempt}: a person looks")
            if attempt == 1:
                fleet.operate(request, "requeue", by="ana", reason="looked at attempt 1")
    auth = {"Authorization": "Bearer " + TOKENS["olga"]}
    with console(setup, "--store", store) as base:
        stale = httpx.post(
            base + f"/api/requests/{request}/fail", headers=auth, json={"reason": "gone", "attempt": "1"}, timeout=30
        )
    pick = ["--store", store, "--request", str(request), "--by", "olga", "--reason", "gone"]
    late = effectlog("operator", "fail", *pick, "--attempt", "1", cwd=tmp_path)
    with SqliteFleetStore(store) as fleet:
        now = fleet.request(request)
    assert (409, 5, "needs_operator", 2) == (stale.status_code, late.returncode, now.state, now.attempt_no)
    assert "attempt 2" in one_line(late.stderr)
    assert 0 == effectlog("operator", "fail", *pick, "--attempt", "2", cwd=tmp_path).returncode


# -- 13. two retries of one failed run at once, on each backend ----------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_second_retry_while_the_first_runs_is_refused_and_repeats_no_effect(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    """``effectlog retry`` holds the run's retry turn (a claim on ``"R retry"``) from its "once" check
    to its fork's end, so two retries of one run never both fork it. Attacked with the first retry
    held inside its fork (a step that waits) and a second started meanwhile, on SQLite and on
    PostgreSQL, whose claims are advisory locks. Proves: the second exits 6 (``run_owned``) in one line,
    the first completes, there is one fork, and the charge carried into it was made once. (Found
    nothing: kept as a regression test.)"""
    import shutil
    import time

    from effectlog.adapters.effects import EffectStore

    journal = request.getfixturevalue("pg_url") if backend == "postgres" else str(tmp_path / "j.db")
    effects = str(tmp_path / "e.db")
    shutil.copy(Path(__file__).parent / "lifecycle_adapters.py", tmp_path / "lifecycle_adapters.py")
    hold, started = tmp_path / "hold", tmp_path / "started"
    plan = {
        "run_id": "o1",
        "adapters": {
            "ledger": {"type": "effects.control", "version": "1", "idempotent": False},
            "gate": {"type": "test.gate", "options": {"open": str(tmp_path / "open")}},
            "slow": {"type": "test.slow", "idempotent": True, "options": {"hold": str(hold), "started": str(started)}},
        },
        "steps": [
            {"id": "charge", "adapter": "ledger"},
            {"id": "ship", "adapter": "gate"},
            {"id": "wait", "adapter": "slow"},
        ],
    }
    (tmp_path / "o1.json").write_text(json.dumps(plan))
    common = ("--journal", journal, "--effects", effects, "--adapters", "lifecycle_adapters:ADAPTERS", "--quiet")
    env = {"PYTHONPATH": str(tmp_path)}
    assert 1 == effectlog("run", "o1.json", *common, cwd=tmp_path, env=env).returncode  # failed at ship
    (tmp_path / "open").touch()
    hold.touch()
    retry = ("retry", "--run-id", "o1", "--by", "ops", "--reason", "gate open", *common)
    first = subprocess.Popen(
        [sys.executable, "-m", "effectlog", *retry], cwd=tmp_path, env=cli_env(env), stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        while not Path(f"{started}-o1.retry1").exists():
            assert first.poll() is None, first.stderr.read() if first.stderr else ""
            assert time.monotonic() < deadline, "the first retry never reached its waiting step"
            time.sleep(0.02)
        second = effectlog(*retry, cwd=tmp_path, env=env)
    finally:
        hold.unlink()
        code = first.wait(timeout=60)
    store = EffectStore(effects, read_only=True)
    charges = [r.run_id for r in store.rows() if r.step_id == "charge"]
    store.close()
    assert (0, 6, "run_owned", ["o1"]) == (
        code,
        second.returncode,
        one_line(second.stderr).split(":")[1].strip(),
        charges,
    )


# -- 14. the one-statement lease fence (SQLite) given leases that are not current ----------------------


@pytest.mark.parametrize(
    "tamper",
    ["nan", "inf", "expired", "too-far", "other-token", "other-runner", "re-granted"],
)
def test_the_one_statement_fence_admits_no_batch_under_a_lease_that_is_not_current(tmp_path: Path, tamper: str) -> None:
    """``SqliteLeaseFence`` checks the lease in the WHERE of the operation record's own INSERT and
    falls back to the full check when it inserts nothing. Attacked with a lease whose expiry is NaN
    (SQLite stores it as NULL), infinity, past, or further ahead than any lease granted; a lease
    object with another token or runner; and a request re-granted (the attempt given up by an
    operator and requeued, attempt 2 leased to another runner with token 2). Proves: each batch is
    refused with ``StaleLease`` (the two-step run's second batch, no transition carried, takes the
    one-statement path) and the run keeps only its first batch. (Found nothing: regression test.)"""
    import sqlite3

    import msgspec

    from effectlog.errors import StaleLease
    from effectlog.fleet import limits
    from effectlog.fleet.contract import noop_plan, requested, started
    from effectlog.fleet.sqlite_store import SqliteFleetStore

    path = tmp_path / "s.db"
    with SqliteFleetStore(path) as store:
        request = store.submit("t", "k", noop_plan("f1", steps=2)).request.request_id
        lease = store.claim(request, "r", 30.0)
        assert lease is not None
        first = store.leased_journal(lease)
        first.append([started("f1")])  # carries nothing: lease current, one statement
        if tamper in ("nan", "inf", "expired", "too-far"):
            value = {"nan": float("nan"), "inf": float("inf"), "expired": store.now() - 1.0,
                     "too-far": store.now() + limits.MAX_LEASE_S + 60}[tamper]  # fmt: skip
            db = sqlite3.connect(path)
            with db:
                db.execute(
                    "UPDATE fleet_attempts SET lease_expires_at = ? WHERE attempt_id = ?", (value, lease.attempt_id)
                )
            db.close()
        elif tamper == "other-token":
            lease = msgspec.structs.replace(lease, token=lease.token + 1)
        elif tamper == "other-runner":
            lease = msgspec.structs.replace(lease, runner_id="r2")
        else:
            store.advance(lease, "prepare", op_key="prepare")
            store.advance(lease, "start", op_key="start")
            store.advance(lease, "escalate", op_key="final", reason="a person looks")
            store.operate(request, "requeue", by="ana", reason="again")
            again = store.claim(request, "r2", 30.0)
            assert again is not None
            assert 2 == again.token
        with pytest.raises(StaleLease):
            store.leased_journal(lease).append([requested("f1", 2)])
        assert 1 == store.journal().head("f1")[0]


# -- 15. one connection, many threads: a busy runner's heartbeats, attempts and claims interleaved ---

_BUSY_RUNNER = textwrap.dedent(
    """
    import collections, io, json, os, sys, threading
    from pathlib import Path
    import msgspec
    from effectlog.adapters.effects import EffectStore
    from effectlog.fleet import open_store
    from effectlog.fleet.runner import Runner, RunnerConfig
    from effectlog.plan import parse_plan

    where = Path(sys.argv[1])
    threading.Timer(60, lambda: os._exit(9)).start()
    store = open_store(str(where / "s.db"))
    for i in range(48):
        plan = {"run_id": f"r{i}", "adapters": {"i": {"type": "effects.idempotent", "idempotent": True},
                                              "c": {"type": "effects.control"}},
                "steps": [{"id": "a", "adapter": "i", "args": {"n": i}}, {"id": "b", "adapter": "c", "args": {"n": i}}]}
        store.submit("t", f"k{i}", parse_plan(msgspec.json.encode(plan)))
    log = io.StringIO()
    config = RunnerConfig(store=str(where / "s.db"), effects=str(where / "e.db"), capacity=4, lease_s=1.0,
                          heartbeat_s=0.01, poll_s=0.01, exit_when_idle=True)
    rc = Runner(config, store, log=log).serve()
    effects = EffectStore(str(where / "e.db"), read_only=True)
    made = collections.Counter((r.run_id, r.step_id) for r in effects.rows())
    effects.close()
    usual = ("ready:", "leased with token", ": succeeded", "exiting:", "is succeeded)")
    print(json.dumps({
        "rc": rc,
        "states": sorted(collections.Counter(r.state for r in store.requests()).items()),
        "effects": sorted(collections.Counter(made.values()).items()),
        "other": [line for line in log.getvalue().splitlines() if not any(u in line for u in usual)],
    }), flush=True)
    os._exit(0)
    """
)


def test_a_busy_runners_threads_sharing_one_connection_lose_and_repeat_nothing(tmp_path: Path) -> None:
    """The SQLite store and its journal share one connection per process; a runner's threads (a
    heartbeat every 10 ms, four attempts, the main loop's claims and recovery passes, the claims
    carried in runs' last commits) take turns on it. Interleaved statements inside another thread's
    transaction would show as a failed write, a lease taken back from a live attempt, an attempt sent
    to an operator, or an effect made twice. Proves: 48 two-step requests all succeed, each of the 96
    effects is made once, and the log says nothing but claims, successes and the heartbeats of
    attempts that had just succeeded. (Found nothing: regression test.)"""
    report, proc = _script_report(_BUSY_RUNNER, str(tmp_path))
    expected = {"rc": 0, "states": [["succeeded", 48]], "effects": [[1, 96]], "other": []}
    assert expected == report, proc.stderr[-1500:]


def test_claims_through_the_v3_function_and_the_v2_statement_at_once_lease_each_request_once(pg_url: str) -> None:
    """During a rolling upgrade to fleet schema v3, runners of the version before (their claim: the
    pick-and-lease statements of ``SqlFleetStore._claim_next``, rows locked ``FOR UPDATE SKIP LOCKED``)
    and of this one (the PL/pgSQL ``claim_next``) claim from one queue. Four claimers, two of each
    kind, drain 120 requests at once. Proves: every request is leased exactly once, with token 1.
    (Found nothing: regression test.)"""
    import threading
    from collections import Counter

    from effectlog.fleet.contract import noop_plan
    from effectlog.fleet.postgres_store import PostgresFleetStore
    from effectlog.fleet.sqlstore import SqlFleetStore, _offer

    with PostgresFleetStore(pg_url) as store:
        for i in range(120):
            store.submit("t", f"k{i}", noop_plan(f"r{i}"))
    got: dict[str, list[tuple[int, int]]] = {}
    go = threading.Barrier(4)

    def claimer(name: str, old: bool) -> None:
        with PostgresFleetStore(pg_url, pool_size=1) as mine:
            go.wait()
            leases = [None]
            while leases:
                if old:  # the statements of the version before v3, on this store's connection
                    leases = SqlFleetStore._claim_next(mine, name, _offer(name, [], 60.0, 2), 60.0, 2)  # type: ignore[assignment]
                else:
                    leases = mine.claim_next(name, [], 60.0, 2)  # type: ignore[assignment]
                got.setdefault(name, []).extend((lease.request_id, lease.token) for lease in leases)  # type: ignore[union-attr]

    threads = [threading.Thread(target=claimer, args=(f"c{i}", i % 2 == 0)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    leased = Counter(request for pairs in got.values() for request, _ in pairs)
    tokens = {token for pairs in got.values() for _, token in pairs}
    assert (dict.fromkeys(range(1, 121), 1), {1}) == (dict(sorted(leased.items())), tokens)
    assert all(got.get(f"c{i}") for i in (0, 1)), {name: len(pairs) for name, pairs in got.items()}


def test_a_claim_function_altered_to_hand_out_unleased_rows_lets_no_runner_write(pg_url: str) -> None:
    """The claim function is a database object a user can replace. Replaced by one that returns the
    oldest queued attempt as a lease without leasing it (a botched hand edit, an old dump's copy), every
    runner is handed the same request. Proves: the lease is worth nothing to either of them: each one's
    first append is refused (``StaleLease``: the attempt is not leased to it) and the run has no event,
    so no tool is ever called twice on such a "lease". (Found nothing: regression test.)"""
    import psycopg

    from effectlog.errors import StaleLease
    from effectlog.fleet.contract import noop_plan, started
    from effectlog.fleet.postgres_store import PostgresFleetStore

    with PostgresFleetStore(pg_url) as store:
        store.submit("t", "k", noop_plan("f1"))
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(
                "CREATE OR REPLACE FUNCTION effectlog_fleet.claim_next(p_offered text, p_limit integer, p_runner text,"
                " p_lease_s double precision) RETURNS TABLE (attempt_id bigint, request_id bigint, attempt_no integer,"
                " fencing_token bigint, lease_expires_at double precision, run_id text, plan text,"
                " cancel_requested_at double precision, t double precision, base_seq bigint) LANGUAGE sql AS $$"
                " SELECT a.attempt_id, a.request_id, a.attempt_no, 1::bigint,"
                " extract(epoch FROM clock_timestamp())::float8 + p_lease_s, r.run_id, r.plan, r.cancel_requested_at,"
                " extract(epoch FROM clock_timestamp())::float8, 0::bigint"
                " FROM effectlog_fleet.attempts a JOIN effectlog_fleet.requests r USING (request_id)"
                " WHERE a.state = 'queued' ORDER BY a.request_id LIMIT p_limit $$"
            )
        handed = [store.claim_next(name, [], 30.0, 1) for name in ("r1", "r2")]
        assert [["f1"], ["f1"]] == [[lease.run_id for lease in leases] for leases in handed]
        refused = 0
        for (lease,) in handed:
            try:
                store.leased_journal(lease).append([started("f1")])
            except StaleLease:
                refused += 1
        assert (2, 0) == (refused, store.journal().head("f1")[0])
