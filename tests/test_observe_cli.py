"""The CLI's own OpenTelemetry set-up, in real processes: ``OTEL_TRACES_EXPORTER=console`` prints
spans on stderr (stdout stays the --json answer), and a run SIGKILLed then resumed gives a second
trace whose run span links to the first (issue 16)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def effectlog(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
    )


def spans_in(stderr: str) -> list[dict[str, Any]]:
    """The console exporter's spans: one JSON object per line, beside other stderr lines."""
    found = [json.loads(line) for line in stderr.splitlines() if line.startswith('{"name"')]
    return [s for s in found if "context" in s]


def write_plan(path: Path, steps: list[dict[str, Any]], adapter: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"run_id": "r", "adapters": {"t": adapter}, "steps": steps}))
    return path


NOOP = {"type": "noop", "version": "1", "idempotent": True}
SHELL = {"type": "shell", "version": "1", "idempotent": False}


def test_console_exporter_prints_spans_on_stderr_and_stdout_stays_json(tmp_path: Path) -> None:
    """OTEL_TRACES_EXPORTER=console: run, step and tool spans on stderr; --json on stdout parses alone."""
    plan = write_plan(tmp_path / "plan.json", [{"id": "a", "adapter": "t"}, {"id": "b", "adapter": "t"}], NOOP)
    done = effectlog(
        "run", str(plan), "--journal", str(tmp_path / "j.db"), "--json", env={"OTEL_TRACES_EXPORTER": "console"}
    )
    assert (0, "completed") == (done.returncode, json.loads(done.stdout)["state"]), done.stderr
    names = sorted(s["name"] for s in spans_in(done.stderr))
    assert ["effectlog.run", "effectlog.step", "effectlog.step", "effectlog.tool", "effectlog.tool"] == names
    # The run recorded its traceparent and was sealed when it closed: the seal still verifies.
    verified = effectlog("verify", "--journal", str(tmp_path / "j.db"))
    assert (0, "") == (verified.returncode, verified.stderr)


def test_console_metrics_are_exported_at_exit(tmp_path: Path) -> None:
    """OTEL_METRICS_EXPORTER=console: the counters are written when the command ends (steps by outcome)."""
    plan = write_plan(tmp_path / "plan.json", [{"id": "a", "adapter": "t"}], NOOP)
    done = effectlog("run", str(plan), "--journal", str(tmp_path / "j.db"), env={"OTEL_METRICS_EXPORTER": "console"})
    assert 0 == done.returncode, done.stderr
    exports = [json.loads(line) for line in done.stderr.splitlines() if line.startswith('{"resource_metrics"')]
    names = {
        m["name"] for e in exports for rm in e["resource_metrics"] for sm in rm["scope_metrics"] for m in sm["metrics"]
    }
    assert {"effectlog.steps", "effectlog.step.duration", "effectlog.journal.commit.duration"} <= names


def test_a_runner_exports_requests_by_state_read_from_its_store_before_it_exits(tmp_path: Path) -> None:
    """OTEL_METRICS_EXPORTER=console on a runner that exits when idle: its last export (made while the store
    is still open) has effectlog.fleet.requests with the store's count per state, and its claims."""
    from fleet_kit import write_plan as fleet_plan

    store = str(tmp_path / "fleet.db")
    for n in (1, 2):
        plan = fleet_plan(tmp_path / f"plan{n}.json", f"run-{n}", [("a", "idem")])
        assert 0 == effectlog("submit", str(plan), "--store", store, "--scope", "s", "--key", str(n)).returncode
    argv = ("runner", "--store", store, "--effects", str(tmp_path / "e.db"), "--exit-when-idle", "--quiet")
    done = effectlog(*argv, "--poll-s", "0.01", env={"OTEL_METRICS_EXPORTER": "console"})
    assert 0 == done.returncode, done.stderr
    exports = [json.loads(line) for line in done.stderr.splitlines() if line.startswith('{"resource_metrics"')]
    metrics = {
        m["name"]: m["data"]["data_points"]
        for e in exports
        for rm in e["resource_metrics"]
        for sm in rm["scope_metrics"]
        for m in sm["metrics"]
    }
    by_state = {p["attributes"]["effectlog.fleet.state"]: p["value"] for p in metrics["effectlog.fleet.requests"]}
    assert {"succeeded": 2} == by_state
    assert 2 == sum(p["value"] for p in metrics["effectlog.fleet.claims"])


@pytest.mark.crash
def test_a_run_killed_and_resumed_gives_a_second_trace_linked_to_the_first(tmp_path: Path) -> None:
    """Step b SIGKILLs the effectlog process the first time; the resume's run span links to the first
    process's run span (recorded in run.started), whose trace the first process's ended spans carry."""
    marker = tmp_path / "killed-once"
    kill_once = f"test -f {marker} || {{ touch {marker}; kill -9 $PPID; sleep 5; }}"
    plan = write_plan(
        tmp_path / "plan.json",
        [
            {"id": "a", "adapter": "t", "args": {"argv": ["true"]}},
            {"id": "b", "adapter": "t", "args": {"argv": ["sh", "-c", kill_once]}},
        ],
        {"type": "shell", "version": "1", "idempotent": True},
    )
    args = ("run", str(plan), "--journal", str(tmp_path / "j.db"), "--json")
    env = {"OTEL_TRACES_EXPORTER": "console"}
    first = effectlog(*args, env=env)
    assert -signal.SIGKILL == first.returncode, first.stderr
    second = effectlog(*args, env=env)
    assert (0, "completed") == (second.returncode, json.loads(second.stdout)["state"]), second.stderr
    before = spans_in(first.stderr)
    (run,) = [s for s in spans_in(second.stderr) if s["name"] == "effectlog.run"]
    first_trace = {s["context"]["trace_id"] for s in before}
    (link,) = run["links"]
    assert ({link["context"]["trace_id"]}, True) == (first_trace, run["context"]["trace_id"] not in first_trace)
    # The first process's step a ended (and was exported) before the kill: its parent is the linked span.
    (step_a,) = [s for s in before if s["name"] == "effectlog.step"]
    assert step_a["parent_id"] == link["context"]["span_id"]


def test_progress_lines_per_step_on_stderr_by_default_and_quiet_silences_them(tmp_path: Path) -> None:
    """`effectlog run` writes a line per step on stderr by default, on a pipe too (--progress, kept for
    scripts, changes nothing); with --quiet it writes none; stdout is the same either way."""
    plan = write_plan(tmp_path / "plan.json", [{"id": "a", "adapter": "t"}, {"id": "b", "adapter": "t"}], NOOP)
    loud = effectlog("run", str(plan), "--journal", str(tmp_path / "loud.db"))
    flagged = effectlog("run", str(plan), "--journal", str(tmp_path / "flagged.db"), "--progress")
    quiet = effectlog("run", str(plan), "--journal", str(tmp_path / "quiet.db"), "--quiet")
    assert (0, 0, 0) == (loud.returncode, flagged.returncode, quiet.returncode), loud.stderr + quiet.stderr
    lines = [line.split(" (")[0] for line in loud.stderr.splitlines()]
    expected = [
        "effectlog: run r started",
        "effectlog: run r step a confirmed",
        "effectlog: run r step b confirmed",
        "effectlog: run r completed",
    ]
    assert (expected, "", loud.stdout, loud.stdout) == (lines, quiet.stderr, quiet.stdout, flagged.stdout)
    assert expected == [line.split(" (")[0] for line in flagged.stderr.splitlines()]


def test_bad_input_prints_one_line_and_no_progress(tmp_path: Path) -> None:
    """Input refused before any step runs (a plan naming an unknown adapter type) gives exactly one stderr
    line, the error, with progress on by default."""
    plan = write_plan(tmp_path / "plan.json", [{"id": "a", "adapter": "t"}], {"type": "nosuch", "version": "1"})
    done = effectlog("run", str(plan), "--journal", str(tmp_path / "j.db"))
    assert 2 == done.returncode  # BAD_INPUT
    assert [f"effectlog: adapter_not_found: {plan}: adapters.t: no adapter of type 'nosuch' is registered"] == (
        done.stderr.splitlines()
    )


def test_a_run_that_fails_ends_stderr_with_its_one_line_error(tmp_path: Path) -> None:
    """A step fails while the run runs: progress lines come first, the last stderr line is the run's error."""
    steps = [
        {"id": "a", "adapter": "t", "args": {"argv": ["true"]}},
        {"id": "b", "adapter": "t", "args": {"argv": ["false"]}},
    ]
    plan = write_plan(tmp_path / "plan.json", steps, {"type": "shell", "version": "1", "idempotent": False})
    done = effectlog("run", str(plan), "--journal", str(tmp_path / "j.db"))
    quiet = effectlog("run", str(plan), "--journal", str(tmp_path / "q.db"), "--quiet")
    assert (1, 1) == (done.returncode, quiet.returncode)
    *progress, last = done.stderr.splitlines()
    assert quiet.stderr.splitlines() == [last]
    assert "run r failed at step 'b': the tool reported failure" == last
    assert ["effectlog: run r started", "effectlog: run r step a confirmed", "effectlog: run r step b failed"] == [
        line.split(" (")[0] for line in progress[:3]
    ]


def test_runner_writes_a_line_per_claim_and_outcome_quiet_silences_them_json_parses(tmp_path: Path) -> None:
    """`effectlog runner` on stderr: ready, each claim and each attempt's outcome, exiting; --quiet: none of
    them (nothing went wrong), only an attempt that did not succeed; --log-format json: the same lines,
    each one JSON object."""
    from fleet_kit import write_plan as fleet_plan

    def runner(store: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        for n in (1, 2):
            plan = fleet_plan(tmp_path / f"plan{n}.json", f"run-{n}", [("a", "idem")])
            submitted = effectlog("submit", str(plan), "--store", str(store), "--scope", "s", "--key", str(n))
            assert 0 == submitted.returncode, submitted.stderr
        argv = ("--store", str(store), "--effects", str(tmp_path / "e.db"), "--runner-id", "r1")
        return effectlog("runner", *argv, "--exit-when-idle", "--poll-s", "0.01", *extra)

    text = runner(tmp_path / "text.db")
    quiet = runner(tmp_path / "quiet.db", "--quiet")
    as_json = runner(tmp_path / "json.db", "--log-format", "json")
    assert (0, 0, 0) == (text.returncode, quiet.returncode, as_json.returncode), text.stderr + as_json.stderr
    # A request whose step fails: under --quiet its outcome still prints (it did not succeed).
    failing = write_plan(tmp_path / "f.json", [{"id": "a", "adapter": "t", "args": {"argv": ["false"]}}], SHELL)
    store = ("--store", str(tmp_path / "quiet.db"))
    assert 0 == effectlog("submit", str(failing), *store, "--scope", "s", "--key", "f").returncode
    told = effectlog("runner", *store, "--runner-id", "r1", "--exit-when-idle", "--poll-s", "0.01", "--quiet")
    assert (0, ["effectlog runner r1: request 3 attempt 1: failed"]) == (told.returncode, told.stderr.splitlines())
    expected = [
        "ready: capabilities [], capacity 1",
        "request 1 attempt 1: leased with token 1",
        "request 1 attempt 1: succeeded",
        "request 2 attempt 1: leased with token 1",
        "request 2 attempt 1: succeeded",
        "exiting: 2 attempt(s) ended",
    ]
    assert [f"effectlog runner r1: {line}" for line in expected] == text.stderr.splitlines()
    assert "" == quiet.stderr
    records = [json.loads(line) for line in as_json.stderr.splitlines()]
    assert [line.split(": ", 1)[1] if line.startswith("request") else line for line in expected] == [
        r["message"] for r in records
    ]
    assert [(None, None), (1, 1), (1, 1)] == [(r["request_id"], r["attempt_no"]) for r in records[:3]]


def test_log_format_json_lines_each_parse(tmp_path: Path) -> None:
    """--log-format json: every stderr line is one JSON object with the structured fields."""
    steps = [
        {"id": "a", "adapter": "t", "args": {"argv": ["true"]}},
        {"id": "b", "adapter": "t", "args": {"argv": ["false"]}},
    ]
    plan = write_plan(tmp_path / "plan.json", steps, {"type": "shell", "version": "1", "idempotent": False})
    done = effectlog("run", str(plan), "--journal", str(tmp_path / "j.db"), "--log-format", "json", "--json")
    assert 1 == done.returncode, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    assert [
        ("run.started", None, "info"),
        ("step.confirmed", "a", "info"),
        ("step.failed", "b", "warning"),
        ("run.ended", None, "warning"),
    ] == [(r["effectlog_event"], r.get("step_id"), r["level"]) for r in records]
    assert {"run_id": "r", "attempt": 1, "outcome": "failed", "logger": "effectlog.run"} == {
        k: records[2][k] for k in ("run_id", "attempt", "outcome", "logger")
    }


def test_log_format_json_makes_the_error_line_json_too(tmp_path: Path) -> None:
    """--log-format json: a run that fails ends stderr with its error as one JSON object (level error, the
    same text as the text line); bad input is exactly one line, one JSON object naming its code."""
    steps = [{"id": "b", "adapter": "t", "args": {"argv": ["false"]}}]
    plan = write_plan(tmp_path / "plan.json", steps, {"type": "shell", "version": "1", "idempotent": False})
    failed = effectlog("run", str(plan), "--journal", str(tmp_path / "j.db"), "--log-format", "json")
    text = effectlog("run", str(plan), "--journal", str(tmp_path / "t.db"))
    assert (1, 1) == (failed.returncode, text.returncode), failed.stderr
    records = [json.loads(line) for line in failed.stderr.splitlines()]
    assert [("run.started", "info"), ("step.failed", "warning"), ("run.ended", "warning")] == [
        (r["effectlog_event"], r["level"]) for r in records[:-1]
    ]
    assert ("error", 1, text.stderr.splitlines()[-1]) == (
        records[-1]["level"],
        records[-1]["exit_status"],
        records[-1]["event"],
    )
    bad = effectlog("run", str(tmp_path / "missing.json"), "--journal", str(tmp_path / "b.db"), "--log-format", "json")
    (line,) = bad.stderr.splitlines()
    record = json.loads(line)
    assert (2, "bad_plan", 2, "error") == (bad.returncode, record["code"], record["exit_status"], record["level"])
    assert record["event"].startswith("effectlog: bad_plan: ")


def test_an_applications_logging_handlers_see_effectlog_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """In a library process: with the `effectlog` logger at INFO, each step is a stdlib log record with extras."""
    import logging

    from effectlog.plan import load_plan
    from effectlog.runtime import Runtime

    plan = write_plan(tmp_path / "plan.json", [{"id": "a", "adapter": "t"}], NOOP)
    caplog.set_level(logging.INFO, logger="effectlog")
    with Runtime(tmp_path / "j.db") as rt:
        rt.run(load_plan(plan))
    steps = [r for r in caplog.records if getattr(r, "effectlog_event", "") == "step.confirmed"]
    assert [("effectlog.run", "r", "a", "confirmed")] == [
        (r.name, r.run_id, r.step_id, r.outcome)
        for r in steps  # type: ignore[attr-defined]
    ]


def test_main_inside_a_program_leaves_its_logging_as_it_found_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """`main(["run", ...])` called by another program writes its progress lines while it runs, then puts the
    `effectlog` logger back (level, propagation, handlers): the program's own handlers see later records."""
    import logging

    from effectlog.cli import main
    from effectlog.plan import load_plan
    from effectlog.runtime import Runtime

    plan = write_plan(tmp_path / "plan.json", [{"id": "a", "adapter": "t"}], NOOP)
    logger = logging.getLogger("effectlog")
    before = (logger.level, logger.propagate, list(logger.handlers))
    assert 0 == main(["run", str(plan), "--journal", str(tmp_path / "cli.db")])
    assert "effectlog: run r step a confirmed" in capsys.readouterr().err
    assert before == (logger.level, logger.propagate, list(logger.handlers))
    caplog.set_level(logging.INFO, logger="effectlog")
    with Runtime(tmp_path / "lib.db") as rt:
        rt.run(load_plan(plan))
    assert ["step.confirmed"] == [
        r.effectlog_event  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "effectlog_event", "").startswith("step.")
    ]


def test_progress_is_on_by_default_when_stderr_is_a_terminal(tmp_path: Path) -> None:
    """With stderr on a pseudo-terminal and no flag, `effectlog run` writes its progress lines there."""
    import pty

    plan = write_plan(tmp_path / "plan.json", [{"id": "a", "adapter": "t"}], NOOP)
    master, slave = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "effectlog", "run", str(plan), "--journal", str(tmp_path / "j.db")],
            stdout=subprocess.PIPE,
            stderr=slave,
            timeout=120,
            check=False,
        )
        os.close(slave)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:  # EIO: the terminal's other end is closed and everything was read
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
    assert 0 == done.returncode
    assert "effectlog: run r step a confirmed" in seen.decode()


@pytest.mark.crash
def test_crash_matrix_soak_progress_as_json_lines_and_quiet(tmp_path: Path) -> None:
    """`crash-matrix soak --log-format json`: each progress line on stderr is one JSON object; --quiet: none."""
    argv = ("crash-matrix", "soak", "--kills", "10", "--steps", "3", "--seed", "3")
    loud = effectlog(*argv, "--workdir", str(tmp_path / "a"), "--log-format", "json")
    quiet = effectlog(*argv, "--workdir", str(tmp_path / "b"), "--quiet")
    assert (0, 0, "") == (loud.returncode, quiet.returncode, quiet.stderr), loud.stderr
    records = [json.loads(line) for line in loud.stderr.splitlines()]
    assert [("soak: 10/10 kills", "effectlog.crashmatrix")] == [
        (r["event"].split(",")[0], r["logger"]) for r in records
    ]


@pytest.mark.crash
def test_crash_matrix_run_progress_and_problems_as_json_lines_and_quiet(tmp_path: Path) -> None:
    """`crash-matrix run --log-format json` against an adapter that duplicates an effect: a JSON line per
    case (info), then each problem as a JSON line (error), every line parses; --quiet: only the problems."""
    tests = str(Path(__file__).resolve().parent)
    path = tests + os.pathsep + os.environ.get("PYTHONPATH", "")
    env = {"EFFECTLOG_TEST_LEDGER": str(tmp_path / "ledger.db"), "PYTHONPATH": path}
    adapter = ("--adapter", "crash_adapters:declares_but_duplicates", "--ledger", "crash_adapters:count")

    def matrix(name: str, *extra: str) -> subprocess.CompletedProcess[str]:
        where = ("--output", str(tmp_path / f"{name}.json"), "--workdir", str(tmp_path / name))
        return effectlog("crash-matrix", "run", *adapter, *where, *extra, env=env)

    loud = matrix("a", "--log-format", "json")
    quiet = matrix("b", "--quiet")
    assert (1, 1) == (loud.returncode, quiet.returncode), loud.stderr
    records = [json.loads(line) for line in loud.stderr.splitlines()]
    levels = [r["level"] for r in records]
    cases = levels.count("info")
    assert (6, ["info"] * cases) == (cases, levels[:cases])
    problems = records[cases:]
    assert {"error"} == {r["level"] for r in problems}
    assert 1 <= sum("user-after-effect" in r["event"] for r in problems)  # the duplicated effect is named
    assert [r["event"] for r in problems] == quiet.stderr.splitlines()


def test_retry_and_recover_write_progress_lines_and_quiet_silences_them(tmp_path: Path) -> None:
    """`retry` (and so `fork`, the same drive) and `recover` write the same per-step lines as `run`;
    --quiet silences them and stdout is unchanged (issue 16's left-over: they printed none)."""
    steps = [
        {"id": "a", "adapter": "t", "args": {"argv": ["true"]}},
        {"id": "b", "adapter": "t", "args": {"argv": ["test", "-e", str(tmp_path / "open")]}},
    ]
    plan = write_plan(tmp_path / "plan.json", steps, SHELL)
    for name in ("loud", "quiet"):
        assert 1 == effectlog("run", str(plan), "--journal", str(tmp_path / f"{name}.db"), "--quiet").returncode
    (tmp_path / "open").touch()
    audit = ("--run-id", "r", "--by", "ops", "--reason", "door open")
    loud = effectlog("retry", "--journal", str(tmp_path / "loud.db"), *audit)
    quiet = effectlog("retry", "--journal", str(tmp_path / "quiet.db"), *audit, "--quiet")
    assert (0, 0) == (loud.returncode, quiet.returncode), loud.stderr + quiet.stderr
    expected = [
        "effectlog: run r.retry1 started (forked from r at step b)",
        "effectlog: run r.retry1 step a carried (from r, not run again)",
        "effectlog: run r.retry1 resumed",  # a fork is written, then driven like a resumed run
        "effectlog: run r.retry1 step b confirmed",
        "effectlog: run r.retry1 completed",
    ]
    lines = [
        line if "carried" in line or "forked" in line else line.split(" (")[0] for line in loud.stderr.splitlines()
    ]
    assert (expected, "", loud.stdout) == (lines, quiet.stderr, quiet.stdout)

    # recover: a run SIGKILLed inside its non-idempotent step b is resumed by `recover`, which says
    # step by step what it found: b's outcome is unknown, so the run stops for reconciliation.
    kill_plan = write_plan(
        tmp_path / "kill.json",
        [
            {"id": "a", "adapter": "t", "args": {"argv": ["true"]}},
            {"id": "b", "adapter": "t", "args": {"argv": ["sh", "-c", "kill -9 $PPID"]}},
        ],
        SHELL,
    )
    for name in ("killed", "killed-quiet"):
        killed = effectlog("run", str(kill_plan), "--journal", str(tmp_path / f"{name}.db"), "--quiet")
        assert -signal.SIGKILL == killed.returncode, killed.stderr
    recovered = effectlog("recover", "--journal", str(tmp_path / "killed.db"))
    quiet_recovered = effectlog("recover", "--journal", str(tmp_path / "killed-quiet.db"), "--quiet")
    lines = [line.split(" (")[0] for line in recovered.stderr.splitlines()]
    expected = ["effectlog: run r resumed", "effectlog: run r step b uncertain", "effectlog: run r stopped"]
    assert (expected, "") == (lines, quiet_recovered.stderr)
    assert [True, True] == ["r    resumed  stopped" in out.stdout for out in (recovered, quiet_recovered)]
