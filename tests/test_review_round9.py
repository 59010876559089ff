"""Review round 9: effectlog as a new user and a tired operator use it, from the docs alone.

Each case is something README.md or docs/*.md promises (a command, an exit status, an error
message, "nothing is written") that did not hold when run as written, in a scratch directory,
as a real ``python -m effectlog`` process on real SQLite files (three cases call the function behind
a command directly: the waiting-step block, the crash matrix's checks, the console's store):

* ``requests`` and ``operator requeue|fail|cancel`` given a mistyped ``--store`` created an empty
  fleet store there (``requests`` then listed no requests and exited 0, so a mistyped path read
  as "the queue is empty"), and given a plain journal turned it into a fleet store by adding the
  fleet's tables: commands that look at or decide on existing requests now refuse a store that
  is not there, or is not a fleet store, and write nothing (``submit``, ``runner`` and
  ``recovery`` still create one: docs/fleet.md, "the first runner to connect creates both schemas").
  The console's ``--store`` (which shows and decides requests) is opened the same way.
* ``lineage`` and ``repin`` wrote to ``sys.stdout`` directly, past the CLI's output guard: with
  stdout on a full disk ``lineage`` printed a traceback and exited 1, where every other command
  prints one ``output_unwritable`` line and exits 2 (and ``repin`` would have reported a repin
  it had already written as a crash).
* ``verify --expect-head`` (guarantees.md: keep the head outside with ``head``, then ``verify
  --expect-head``) took what ``head`` prints, ``RUN SEQ HEX``, as a head that disagrees: exit 7, an
  integrity failure, for an untouched journal. A value that is no head at all (``zz``) was exit 7
  too, and an empty one (``--expect-head "$HEAD"`` with ``HEAD`` unset) skipped the check and
  said ``ok``, exit 0. Now ``--expect-head`` takes the hex or ``head``'s own line (of that run),
  and anything else is bad input, exit 2.
* ``retry`` of a run whose every step is done said to "name the step to run again from
  (--from-step S)", an option ``retry`` does not have (trying it: a usage error); and an option a
  command does not have was reported as ``effectlog: usage: unrecognized arguments: ... (see
  'effectlog --help')``, naming neither the command nor its help, where every other usage error
  names both (tests/test_cli_contract.py).
* ``--help`` and ``--version`` with stdout on a full disk lost their text and exited 0, where
  every command's own output, lost so, is one ``output_unwritable`` line and exit 2.
* ``status --run-id``'s block for a step that waits for a person (README: "shown with its adapter
  or tool, args, ... and the exact command to resolve it") put the command one column left of the
  other values, and a session's ``tool:`` five columns left: values are now in one column.
* ``retry`` and ``fork`` of a durable run (README's ``durable.run`` example) said
  ``unknown_run: run 'onboard-42': run 'onboard-42' is a session run: it has no pinned plan``: a
  run the journal holds called unknown, named twice, called a session, with nothing to do next;
  and ``repin`` of one said to "fork it to run steps again", which then refused it.
* A command that prints nothing (``recovery --once`` with nothing to recover) said
  ``output_unwritable ... it is lost``, exit 2, with stdout on /dev/full: the final flush wrote an
  empty string, which is a zero-length write(2), and /dev/full refuses even that.
* ``crash-matrix run --backend postgres --postgres-url URL`` on a server it could not use ran
  every case, and the judge of a case whose worker wrote no event raised ``ValueError`` (a
  traceback) instead of calling the case failed; a ``--postgres-url`` in ``keyword=value`` form
  (README: exit 2 where a ``postgresql://`` URL belongs) was not refused before the cases ran.
* docs/guarantees.md (G7) cites the bad-input corpus by its number of cases, which no test
  compared with the corpus: it is checked here.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sqlite3
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from effectlog.errors import ExitStatus
from hardening_kit import cli_env, effectlog

SRC = Path(__file__).resolve().parent.parent / "src" / "effectlog"

APPROVAL_PLAN = {
    "run_id": "refund-042",
    "adapters": {"bank": {"type": "effects.control", "version": "1", "idempotent": False}},
    "steps": [{"id": "refund", "adapter": "bank", "args": {"n": 1}}],
}


def _tables(path: Path) -> list[str]:
    with sqlite3.connect(path) as db:
        return sorted(str(r[0]) for r in db.execute("SELECT name FROM sqlite_master"))


def _a_journal(cwd: Path) -> Path:
    """``runs.db`` holding one completed run, made by ``effectlog run`` as the README does."""
    (cwd / "plan.json").write_text(json.dumps(APPROVAL_PLAN))
    done = effectlog("run", "plan.json", "--journal", "runs.db", "--effects", "fx.db", cwd=cwd)
    assert done.returncode == ExitStatus.DONE, done.stderr
    return cwd / "runs.db"


FLEET_LOOKS = [
    pytest.param(["requests"], id="requests"),
    pytest.param(["requests", "--request", "1"], id="requests-one"),
    pytest.param(["requests", "--json"], id="requests-json"),
    pytest.param(["operator", "requeue", "--request", "1", "--reason", "r", "--by", "alice"], id="requeue"),
    pytest.param(["operator", "fail", "--request", "1", "--reason", "r", "--by", "alice"], id="fail"),
    pytest.param(["operator", "cancel", "--request", "1", "--reason", "r", "--by", "alice"], id="cancel"),
]


@pytest.mark.parametrize("argv", FLEET_LOOKS)
def test_a_fleet_command_on_a_mistyped_store_refuses_and_creates_nothing(tmp_path: Path, argv: list[str]) -> None:
    """README: bad input exits 2 with one line naming what and where, and nothing is written. A
    mistyped ``--store`` for a command about existing requests is refused so, and no file is made
    (before, an empty fleet store appeared and ``requests`` said, exit 0, that the queue was empty)."""
    done = effectlog(*argv, "--store", "fleet.dbb", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (ExitStatus.BAD_INPUT, "")
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert "--store fleet.dbb: no fleet store there" in lines[0]
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("argv", FLEET_LOOKS)
def test_a_fleet_command_on_a_plain_journal_refuses_and_leaves_it_unchanged(tmp_path: Path, argv: list[str]) -> None:
    """A journal that is not a fleet store (``--store runs.db`` where ``--journal`` belonged) is
    refused, exit 2, and keeps exactly its tables: before, it was given the fleet's tables."""
    journal = _a_journal(tmp_path)
    before = _tables(journal)
    done = effectlog(*argv, "--store", "runs.db", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (ExitStatus.BAD_INPUT, ""), done.stderr
    assert "runs.db: not a fleet store" in done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert _tables(journal) == before
    assert effectlog("verify", "--journal", "runs.db", cwd=tmp_path).returncode == ExitStatus.DONE


def test_requests_on_a_real_fleet_store_still_lists_its_requests(tmp_path: Path) -> None:
    """The refusal is for a store that is not there: a store made by ``submit`` is read as before."""
    (tmp_path / "plan.json").write_text(json.dumps(APPROVAL_PLAN))
    made = effectlog("submit", "plan.json", "--store", "fleet.db", "--scope", "s", "--key", "k", cwd=tmp_path)
    assert made.returncode == ExitStatus.DONE, made.stderr
    listed = effectlog("requests", "--store", "fleet.db", "--json", cwd=tmp_path)
    assert listed.returncode == ExitStatus.DONE, listed.stderr
    assert [(r["scope"], r["key"], r["state"]) for r in json.loads(listed.stdout)] == [("s", "k", "queued")]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_lineage_on_a_full_stdout_gives_one_line_and_exit_2_not_a_traceback(tmp_path: Path) -> None:
    """docs: ``output_unwritable`` (exit 2, one line) when stdout cannot be written, as for every
    other command; ``lineage`` wrote past the guard and died with OSError (a traceback, exit 1)."""
    _a_journal(tmp_path)
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "effectlog", "lineage", "--journal", "runs.db", "--run-id", "refund-042"],
            cwd=tmp_path,
            env=cli_env(),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == ExitStatus.BAD_INPUT, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("effectlog: output_unwritable:"), done.stderr


def test_no_cli_command_writes_to_sys_stdout_past_the_output_guard() -> None:
    """The class behind the lineage case: every CLI module writes stdout through ``output.out`` or
    ``output.emit_json`` (which turn a closed pipe or a full disk into one line and a stable exit
    status). A direct ``sys.stdout.write`` or ``print`` anywhere else in ``effectlog.cli`` bypasses it."""
    offenders = []
    for path in sorted((SRC / "cli").glob("*.py")):
        if path.name == "output.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Name) and f.id == "print":
                    offenders.append(f"{path.name}:{node.lineno} print")
                if (
                    isinstance(f, ast.Attribute)
                    and f.attr == "write"
                    and isinstance(f.value, ast.Attribute)
                    and f.value.attr == "stdout"
                ):
                    offenders.append(f"{path.name}:{node.lineno} sys.stdout.write")
    assert offenders == []


def _head(cwd: Path) -> tuple[str, str]:
    """``effectlog head`` of ``refund-042`` as printed, and its hex from ``--json``."""
    line = effectlog("head", "--journal", "runs.db", "--run-id", "refund-042", cwd=cwd)
    as_json = effectlog("head", "--journal", "runs.db", "--run-id", "refund-042", "--json", cwd=cwd)
    assert (line.returncode, as_json.returncode) == (ExitStatus.DONE, ExitStatus.DONE), line.stderr
    return line.stdout.strip(), str(json.loads(as_json.stdout)["head"])


def test_verify_accepts_the_head_exactly_as_the_head_command_prints_it(tmp_path: Path) -> None:
    """The documented round trip, as a script writes it: ``--expect-head "$(effectlog head ...)"``
    and ``--expect-head HEX`` (from ``head --json``) both verify an untouched run, exit 0."""
    _a_journal(tmp_path)
    line, hexhead = _head(tmp_path)
    for kept in (line, hexhead, hexhead.upper()):
        done = effectlog(
            "verify", "--journal", "runs.db", "--run-id", "refund-042", "--expect-head", kept, cwd=tmp_path
        )
        assert (done.returncode, done.stderr) == (ExitStatus.DONE, ""), kept


def test_verify_still_fails_on_a_kept_head_that_is_not_the_runs(tmp_path: Path) -> None:
    """A well-formed head that is not the run's is still an integrity failure (exit 7), in either form:
    another hex, or ``head``'s line with another seq."""
    _a_journal(tmp_path)
    line, hexhead = _head(tmp_path)
    other = ("0" if hexhead[0] != "0" else "1") + hexhead[1:]
    run_id, seq, _ = line.split(" ")
    for kept in (other, f"{run_id} {seq} {other}", f"{run_id} {int(seq) - 1} {hexhead}"):
        done = effectlog(
            "verify", "--journal", "runs.db", "--run-id", "refund-042", "--expect-head", kept, cwd=tmp_path
        )
        assert done.returncode == ExitStatus.INTEGRITY, (kept, done.stderr)


@pytest.mark.parametrize(
    "kept",
    ["", " ", "zz", "00", "refund-042 9", "other-run 9 {hex}", "{hex}00", "refund-042 nine {hex}"],
    ids=["empty", "blank", "not-hex", "short", "no-hex", "another-run", "long", "bad-seq"],
)
def test_an_expect_head_that_is_no_head_is_bad_input_not_an_integrity_failure_or_a_pass(
    tmp_path: Path, kept: str
) -> None:
    """A value that cannot be a kept head is refused as bad input (exit 2, one line naming
    ``--expect-head``), never read as tampering (exit 7) nor, when empty, as no check at all (exit 0)."""
    _a_journal(tmp_path)
    _, hexhead = _head(tmp_path)
    value = kept.format(hex=hexhead)
    done = effectlog("verify", "--journal", "runs.db", "--run-id", "refund-042", "--expect-head", value, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (ExitStatus.BAD_INPUT, ""), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "--expect-head" in done.stderr


def test_retry_of_a_finished_run_points_to_a_command_that_exists(tmp_path: Path) -> None:
    """The refusal's advice, followed as written, works: it names ``effectlog fork ... --from-step``
    (which has the option), and that command then forks the run, exit 0."""
    _a_journal(tmp_path)
    done = effectlog(
        "retry", "--journal", "runs.db", "--run-id", "refund-042", "--by", "a", "--reason", "r", cwd=tmp_path
    )
    assert done.returncode == ExitStatus.CONFLICT, done.stderr
    assert "effectlog fork" in done.stderr
    assert "--new-run-id" in done.stderr
    assert "--from-step" in done.stderr
    followed = effectlog(
        "fork",
        *("--journal", "runs.db", "--run-id", "refund-042", "--new-run-id", "refund-043", "--from-step", "refund"),
        *("--by", "a", "--reason", "r", "--effects", "fx.db"),
        cwd=tmp_path,
    )
    assert followed.returncode == ExitStatus.DONE, followed.stderr


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("retry", "--journal", "j.db", "--run-id", "r", "--by", "a", "--reason", "r", "--from-step", "s"), "retry"),
        (("status", "--journal", "j.db", "--bogus"), "status"),
        (("run", "plan.json", "--journal", "j.db", "--bogus"), "run"),
        (
            ("operator", "requeue", "--store", "f.db", "--request", "1", "--by", "a", "--reason", "r", "-x"),
            "operator",
        ),
        (("crash-matrix", "verify", "m.json", "--bogus"), "crash-matrix verify"),
    ],
    ids=["retry", "status", "run", "operator-requeue", "crash-matrix-verify"],
)
def test_an_option_the_command_does_not_have_is_named_with_the_command_and_its_help(
    tmp_path: Path, argv: tuple[str, ...], said: str
) -> None:
    """``effectlog: usage: COMMAND: unrecognized arguments: ... (see 'effectlog COMMAND --help')``,
    exit 2, one line, as for every other usage error; nothing is created."""
    done = effectlog(*argv, cwd=tmp_path)
    assert done.returncode == ExitStatus.BAD_INPUT, done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith(f"effectlog: usage: {said}: unrecognized arguments: "), done.stderr
    assert f"(see 'effectlog {said} --help')" in done.stderr
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
@pytest.mark.parametrize("argv", [("--help",), ("--version",), ("run", "--help"), ("crash-matrix", "soak", "--help")])
def test_help_and_version_on_a_full_stdout_say_the_output_is_lost(tmp_path: Path, argv: tuple[str, ...]) -> None:
    """A script saving ``effectlog --help`` (or ``--version``) to a full disk is told, exit 2, as it is for
    every other output of effectlog; before, exit 0 with nothing written."""
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "effectlog", *argv],
            cwd=tmp_path,
            env=cli_env(),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == ExitStatus.BAD_INPUT, done.stderr
    assert done.stderr.startswith("effectlog: output_unwritable:"), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("argv", [("--help",), ("--version",), ("status", "--help")])
def test_help_and_version_still_print_to_stdout_and_exit_0(tmp_path: Path, argv: tuple[str, ...]) -> None:
    """The ordinary case: the text on stdout, nothing on stderr, exit 0."""
    done = effectlog(*argv, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (ExitStatus.DONE, "")
    assert done.stdout.startswith("effectlog" if argv == ("--version",) else "usage: effectlog")


def test_the_number_of_bad_input_cases_guarantees_md_cites_is_the_corpus_size() -> None:
    """G7's "the N cases of tests/data/bad/manifest.toml", and the row of "What was tested, in numbers"
    (which said 88 while G7 said 118), are the number of cases the corpus holds."""
    root = SRC.parent.parent
    text = (root / "docs" / "guarantees.md").read_text()
    cited = re.findall(r"the (\d+) cases of `tests/data/bad/manifest.toml`", text)
    cited += re.findall(r"^\| Bad input \| the corpus \| (\d+) \|$", text, flags=re.MULTILINE)
    with open(root / "tests" / "data" / "bad" / "manifest.toml", "rb") as f:
        held = len(tomllib.load(f)["case"])
    assert [int(n) for n in cited] == [held, held]


@pytest.mark.parametrize("adapter_type", ["shell", None], ids=["plan-adapter", "session-tool"])
@pytest.mark.parametrize("action", ["reconcile", "approve"])
def test_every_value_of_a_waiting_steps_block_starts_in_one_column(adapter_type: str | None, action: str) -> None:
    """Each ``  label:  value`` line of the block ``status`` prints has its value at the same column,
    whatever the label (``adapter``/``tool``, ``reconcile``/``approve``), so a tired eye reading down
    the block, or ``cut -c``, finds every value in the same place."""
    from effectlog.cli.run_views import render_at_stake
    from effectlog.stake import AtStake

    item = AtStake(
        step_id="push",
        state="uncertain" if action == "reconcile" else "awaiting_approval",
        kind="tool",
        adapter="sh",
        adapter_type=adapter_type,
        args={"n": 1},
        args_digest="d" * 64,
        idempotency_key="el1-k",
        idempotent=False,
        attempt=1,
        reason="why",
        action=action,  # type: ignore[arg-type]
        command=f"effectlog {action} --journal j.db",
    )
    lines = [line for line in render_at_stake([item]).splitlines() if line.startswith("  ")]
    assert len(lines) == 7, lines
    columns = {len(line) - len(line.split(":", 1)[1].lstrip()) for line in lines}
    assert len(columns) == 1, lines


DURABLE = """
from effectlog import durable


@durable.tool(idempotent=False)
def send_email(to: str, body: str, idempotency_key: str = "") -> str:
    return f"sent to {to}"


with durable.run("onboard-42", journal="runs-durable.db"):
    print(send_email("a@b.example", "welcome"))
"""


@pytest.mark.parametrize(
    "argv",
    [
        ("retry", "--by", "a", "--reason", "r"),
        ("fork", "--new-run-id", "onboard-43", "--by", "a", "--reason", "r"),
    ],
    ids=["retry", "fork"],
)
def test_a_lifecycle_command_on_a_durable_run_says_what_the_run_is_and_what_to_do(
    tmp_path: Path, argv: tuple[str, ...]
) -> None:
    """The README's durable run, then ``retry|fork`` of it: exit 2, one line, not ``unknown_run``
    (the run is there), the run named once, and the way to go on (run its code again)."""
    (tmp_path / "d.py").write_text(DURABLE)
    made = subprocess.run([sys.executable, "d.py"], cwd=tmp_path, env=cli_env(), capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    before = (tmp_path / "runs-durable.db").read_bytes()
    done = effectlog(argv[0], "--journal", "runs-durable.db", "--run-id", "onboard-42", *argv[1:], cwd=tmp_path)
    assert (done.returncode, done.stdout) == (ExitStatus.BAD_INPUT, ""), done.stderr
    line = done.stderr.strip()
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert not line.startswith("effectlog: unknown_run"), line
    assert line.count("onboard-42") == 1, line
    assert "durable or session run" in line, line
    assert "running its code again" in line, line
    assert (tmp_path / "runs-durable.db").read_bytes() == before


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_command_that_prints_nothing_does_not_say_its_output_was_lost(tmp_path: Path) -> None:
    """Nothing to write is nothing lost: ``recovery --once`` with nothing to recover, stdout on /dev/full,
    exits 0 with nothing on stderr."""
    (tmp_path / "plan.json").write_text(json.dumps(APPROVAL_PLAN))
    made = effectlog("submit", "plan.json", "--store", "fleet.db", "--scope", "s", "--key", "k", cwd=tmp_path)
    assert made.returncode == ExitStatus.DONE, made.stderr
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "effectlog", "recovery", "--store", "fleet.db", "--once"],
            cwd=tmp_path,
            env=cli_env(),
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    assert (done.returncode, done.stderr) == (ExitStatus.DONE, "")


def test_every_crash_matrix_check_judges_a_case_whose_workers_wrote_no_event() -> None:
    """A worker that never reached the journal (a server it could not connect to) leaves no event:
    each case's checks then say what is wrong, never raise, and the case fails."""
    from effectlog.crashmatrix.cases import CASES, Evidence
    from effectlog.crashmatrix.usercases import user_cases

    every = [*CASES, *user_cases(True).values(), *user_cases(False).values()]
    for case in every:
        n = len(case.actions)
        nothing = Evidence(events=[], effects=0, exits=[1] * n, signals=[None] * n, reached=[None] * n, receipts=[])
        problems = case.check(nothing)
        assert problems, case.name
        assert all(isinstance(p, str) for p in problems), case.name


def test_crash_matrix_refuses_a_keyword_form_postgres_url_before_running_any_case(tmp_path: Path) -> None:
    """``--postgres-url 'host=... dbname=...'`` is bad input (exit 2, one line naming ``--postgres-url``),
    said before any case runs: no report, no progress line."""
    done = effectlog(
        *("crash-matrix", "run", "--backend", "postgres", "--postgres-url", "host=127.0.0.1 dbname=x"),
        *("--output", "out/report.json", "--workdir", "wd"),
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout) == (ExitStatus.BAD_INPUT, ""), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "--postgres-url" in done.stderr
    assert os.listdir(tmp_path) == []


def test_repin_of_a_durable_run_does_not_send_the_operator_to_fork(tmp_path: Path) -> None:
    """``repin`` of the README's (completed) durable run is refused (exit 5) as a run that pins no
    adapters, not with the closed-run advice to fork it, a command that refuses every durable run."""
    (tmp_path / "d.py").write_text(DURABLE)
    made = subprocess.run([sys.executable, "d.py"], cwd=tmp_path, env=cli_env(), capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    done = effectlog(
        "repin", "--journal", "runs-durable.db", "--run-id", "onboard-42", "--by", "a", "--reason", "r", cwd=tmp_path
    )
    assert done.returncode == ExitStatus.CONFLICT, done.stderr
    assert "fork" not in done.stderr
    assert "durable or session run" in done.stderr


def test_the_consoles_store_is_never_given_the_fleets_tables(tmp_path: Path) -> None:
    """The console reads and decides fleet requests through ``decisions.with_store``: a plain journal
    given as its ``--store`` is refused (``JournalUnreadable``) and keeps its tables, as for ``requests``."""
    from effectlog.console.decisions import Config, with_store
    from effectlog.errors import JournalUnreadable

    journal = _a_journal(tmp_path)
    before = _tables(journal)
    config = Config(journal=str(journal), users={}, store=str(journal))
    with pytest.raises(JournalUnreadable, match="not a fleet store"):
        with_store(config, lambda store: store.requests())
    assert _tables(journal) == before


@pytest.mark.parametrize("action", ["reconcile", "approve"])
def test_a_decision_about_an_attempt_the_step_never_reached_is_bad_input_not_stale_evidence(
    tmp_path: Path, action: str
) -> None:
    """``reconcile --attempt 5`` (and ``approve --attempt 5``) on a step at attempt 1 said the evidence was
    stale, "another decision and run came in between" (exit 5): sending the operator to look for a decision
    nobody made. An attempt above the step's is one that never happened, a mistyped number. Proves: exit 2,
    one line naming both attempts, nothing written; the step's own attempt is still taken."""
    from console_kit import Setup

    setup = Setup(tmp_path)
    run_id = setup.uncertain() if action == "reconcile" else setup.held()
    step = "charge" if action == "reconcile" else "refund"
    says = (
        ("--outcome", "applied", "--evidence", "psp: ch_1", "--operator", "bob")
        if action == "reconcile"
        else ("--by", "bob")
    )
    ops = (action, "--journal", setup.journal, "--run-id", run_id, "--step", step, *says)
    before = setup.timeline(run_id)

    typo = effectlog(*ops, "--attempt", "5", cwd=tmp_path)
    after = setup.timeline(run_id)
    current = effectlog(*ops, "--attempt", "1", cwd=tmp_path)

    line = typo.stderr.strip()
    assert (ExitStatus.BAD_INPUT, 1, before) == (typo.returncode, len(typo.stderr.splitlines()), after), typo.stderr
    assert ("attempt 5" in line, "attempt 1" in line, "came in between" in line) == (True, True, False), line
    assert 0 == current.returncode, current.stderr
