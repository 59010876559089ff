"""Files and secrets: private file modes, secret args that never leave the plan, and SQL that
is always parameterised, whatever the run ids, step ids and args contain.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effectlog import events as ev
from effectlog.adapters import EffectStore
from effectlog.canonical import digest
from effectlog.cli import main
from effectlog.journal import SqliteJournal, load_run
from effectlog.plan import ID_PATTERN, parse_plan
from effectlog.runtime import Runtime
from hardening_kit import SAFETY_TIMEOUT_S, cli_env, effectlog, one_line, plan_dict, snapshot

# -- file modes ---------------------------------------------------------------------------------

MODES_CHILD = r"""
import json, os, stat, sys
os.umask(0)  # the modes below must come from effectlog, not from a kind umask
from effectlog.adapters import EffectStore
from effectlog.adapters.protocol import Request
from effectlog.journal import SqliteJournal
from effectlog.testing import sample_run
d = sys.argv[1]
journal = SqliteJournal(os.path.join(d, "journal.db"))
journal.append(sample_run("r"))
store = EffectStore(os.path.join(d, "effects.db"))
store.apply_idempotent(Request(run_id="r", step_id="s", attempt=1, idempotency_key="k", args={}))
modes = {n: stat.S_IMODE(os.stat(os.path.join(d, n)).st_mode) for n in sorted(os.listdir(d))}
print(json.dumps(modes))  # while both are open: their -wal and -shm exist too
"""


def test_journal_effect_store_and_sqlite_sidecars_are_created_0600_even_with_umask_0(tmp_path: Path) -> None:
    """A process with umask 0 opens a journal (writer) and an effect store and writes to both:
    while they are open, every file they created (database, -wal, -shm) has mode 0600, readable
    by the owner only, and no lock file is made (a run's owner is a lock on the journal itself)."""
    done = subprocess.run(
        [sys.executable, "-c", MODES_CHILD, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=SAFETY_TIMEOUT_S,
        check=False,
        env=cli_env(),
    )
    assert (0, "") == (done.returncode, done.stderr)
    modes = json.loads(done.stdout)

    expected = ["effects.db", "effects.db-shm", "effects.db-wal", "journal.db", "journal.db-shm", "journal.db-wal"]
    assert expected == sorted(modes)
    assert {name: 0o600 for name in expected} == modes


def test_the_cli_creates_its_journal_and_effect_store_0600_with_umask_0(tmp_path: Path) -> None:
    """``effectlog run`` started with umask 0 leaves journal.db and effects.db at 0600, and no lock file."""
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps(
            plan_dict(
                "modes",
                [{"id": "charge", "adapter": "ledger"}],
                {"ledger": {"type": "effects.idempotent", "idempotent": True}},
            )
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "effectlog", "run", str(plan), "--journal", "journal.db", "--effects", "effects.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=SAFETY_TIMEOUT_S,
        check=False,
        env=cli_env(),
        preexec_fn=lambda: os.umask(0),
    )
    assert 0 == done.returncode, done.stderr

    modes = {n: stat.S_IMODE((tmp_path / n).stat().st_mode) for n in ("journal.db", "effects.db")}

    assert {"journal.db": 0o600, "effects.db": 0o600} == modes
    assert [] == sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".lock"))


# -- secrets ------------------------------------------------------------------------------------

LEAKY_TOOLS = '''
from effectlog.adapters import Receipt


class Declines:
    """A tool whose error message repeats the card number it was given (tools do that)."""

    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        raise ConnectionError(f"gateway timeout while charging card {request.args['card']} cvv {request.args['cvv']}")

    def lookup(self, request):
        return self.store.lookup(request)


ADAPTERS = {"test.declines": lambda decl, ctx: Declines(ctx.effect_store())}
'''


def test_secret_args_never_reach_the_journal_trace_effect_store_or_any_cli_output(tmp_path: Path) -> None:
    """A plan marks ``card`` and ``cvv`` secret. One step goes to an idempotent tool, one to a
    tool whose error message repeats both values. After the run (stopped on the uncertain
    step), a reconciliation, the resume, and every reading command with and without --json,
    neither value appears in any file in the directory (journal, effect store, trace, their
    -wal/-shm) nor in any command's stdout or stderr. The journal holds their digests instead,
    and the tool's echo of them is recorded as ``<secret card>``."""
    card, cvv = f"4111-{secrets.token_hex(8)}", f"cvv-{secrets.token_hex(6)}"
    (tmp_path / "leaky_tools.py").write_text(LEAKY_TOOLS)
    env = {"PYTHONPATH": str(tmp_path)}
    args = {"card": card, "cvv": cvv, "amount_cents": 1299}
    plan = plan_dict(
        "secret-run",
        [
            {"id": "charge", "adapter": "ledger", "args": args, "secret": ["card", "cvv"]},
            {"id": "charge-again", "adapter": "leaky", "args": args, "secret": ["card", "cvv"]},
        ],
        {
            "ledger": {"type": "effects.idempotent", "idempotent": True},
            "leaky": {"type": "test.declines", "idempotent": False},
        },
    )
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    journal = ("--journal", "journal.db")
    outputs: list[subprocess.CompletedProcess[str]] = []

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        done = effectlog(*argv, cwd=tmp_path, env=env)
        outputs.append(done)
        return done

    run = ("run", "plan.json", *journal, "--effects", "effects.db", "--adapters", "leaky_tools:ADAPTERS")
    first = cli(*run, "--trace", "trace.jsonl")
    cli(*run, "--json")
    cli("reconcile", *journal, "--run-id", "secret-run", "--step", "charge-again", "--from-ledger", "effects.db")
    for command in (
        ("status",),
        ("status", "--run-id", "secret-run"),
        ("timeline", "--run-id", "secret-run"),
        ("verify",),
        ("head", "--run-id", "secret-run"),
    ):
        cli(*command, *journal)
        if command[0] != "head":
            cli(*command, *journal, "--json")
    cli("effects", "--effects", "effects.db")
    cli("effects", "--effects", "effects.db", "--json")
    cli(*run, "--trace", "trace.jsonl")

    files = {name: data for name, data in snapshot(tmp_path).items() if data is not None and name != "plan.json"}
    with SqliteJournal(tmp_path / "journal.db", writer=False) as j:
        events = [ev.decode(r.body) for r in j.read("secret-run")]
    started = events[0]
    assert isinstance(started, ev.RunStarted)
    assert started.plan is not None
    uncertain = [e for e in events if isinstance(e, ev.StepUncertain)]

    assert 3 == first.returncode
    assert [] == [o.args for o in outputs if card in o.stdout + o.stderr or cvv in o.stdout + o.stderr]
    assert [] == [name for name, data in files.items() if card.encode() in data or cvv.encode() in data]
    assert {"$secret_sha256": digest(card)} == started.plan["steps"][0]["args"]["card"]
    assert {"$secret_sha256": digest(cvv)} == started.plan["steps"][1]["args"]["cvv"]
    echo = "outcome unknown: ConnectionError: gateway timeout while charging card <secret card> cvv <secret cvv>"
    assert [echo, echo] == [e.reason for e in uncertain]  # attempt 1, and attempt 2 after the ledger said "not applied"
    assert {"trace.jsonl", "journal.db", "effects.db"} <= files.keys()


# -- hostile strings: SQL is parameterised ---------------------------------------------------------

HOSTILE = [
    "x' OR '1'='1",
    "'; DROP TABLE events; --",
    '" OR ""="',
    "good-run' --",
    "1; DELETE FROM events WHERE 1=1",
    "Robert'); DROP TABLE effects;--",
    "ñandú 🦆 \u202e",
    "%",
    "_",
    "*",
]


def _completed_journal(tmp_path: Path) -> None:
    plan = plan_dict(
        "good-run",
        [{"id": "charge", "adapter": "ledger", "args": {"amount_cents": 1299}}],
        {"ledger": {"type": "effects.idempotent", "idempotent": True}},
    )
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    done = effectlog("run", "plan.json", "--journal", "journal.db", "--effects", "effects.db", cwd=tmp_path)
    assert 0 == done.returncode, done.stderr


def test_hostile_run_and_step_ids_on_the_command_line_match_nothing_and_change_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQL fragments, quotes, LIKE wildcards and unicode given as --run-id and --step to status,
    timeline, head, verify, reconcile, approve and effects (the CLI's ``main``, in-process for
    speed): each is refused or matches nothing (exit 2, one line, nothing on stdout; ``effects``
    lists nothing), and afterwards the journal and effect
    store are byte-identical and verify as before. (The journal API's own handling of such ids
    is the next test.)

    Since round 11 the CLI takes any printable id (durable and session runs have such ids), so a
    printable hostile id is looked up and matches nothing (exit 2, ``unknown_run``/``unknown_step``;
    ``effects`` lists nothing and says on stderr that the store holds other runs' effects); one that is
    not printable is still a usage error."""
    _completed_journal(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EFFECTLOG_JOURNAL_KEY", raising=False)
    before = snapshot(tmp_path)
    journal = ("--journal", "journal.db")
    results: list[tuple[str, int, bool, str]] = []
    listed_nothing: list[tuple[str, bool]] = []

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        try:
            status = main(list(argv))
        except SystemExit as exc:  # argparse's usage error, in-process
            status = int(exc.code or 0)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(argv, status, out, err)

    for hostile in HOSTILE:
        for argv in (
            ("status", *journal, "--run-id", hostile),
            ("timeline", *journal, "--run-id", hostile),
            ("head", *journal, "--run-id", hostile),
            ("verify", *journal, "--run-id", hostile),
            ("reconcile", *journal, "--run-id", hostile, "--step", hostile, "--from-ledger", "effects.db"),
            (
                "reconcile",
                *journal,
                "--run-id",
                "good-run",
                "--step",
                hostile,
                "--outcome",
                "applied",
                "--evidence",
                hostile,
                "--operator",
                hostile,
            ),
            ("approve", *journal, "--run-id", "good-run", "--step", hostile, "--by", hostile),
        ):
            done = cli(*argv)
            results.append((argv[0], done.returncode, done.stdout == "", one_line(done.stderr).split(":")[1]))
        listed = cli("effects", "--effects", "effects.db", "--run-id", hostile, "--json")
        if listed.returncode == 0:  # a printable id is a valid durable run id: it lists nothing, and says so
            said = one_line(listed.stderr).startswith(f"effectlog: no effects of run {hostile!r} in effects.db")
            listed_nothing.append((hostile, json.loads(listed.stdout) == [] and said))
        else:
            results.append(("effects", listed.returncode, listed.stdout == "", one_line(listed.stderr).split(":")[1]))
    after = snapshot(tmp_path)
    verified = cli("verify", *journal)

    # A printable id is a valid id (a durable or session run may have it): looked up, it matches nothing
    # (unknown_run / unknown_step); one that is not printable is a usage error. Either way exit 2, one line.
    refused = (" usage", " unknown_run", " unknown_step")
    assert [] == [r for r in results if r[1:3] != (2, True) or r[3] not in refused]
    assert [] == [h for h, nothing in listed_nothing if not nothing]
    assert {k: v for k, v in before.items() if not k.endswith(".lock")} == {
        k: after.get(k) for k in before if not k.endswith(".lock")
    }
    assert (0, "ok: 1 run(s), 5 event(s) verified\n", "") == (verified.returncode, verified.stdout, verified.stderr)


def test_hostile_ids_through_the_api_read_nothing_and_leave_the_schema_intact(tmp_path: Path) -> None:
    """The journal API takes any string as a run id, NUL included: read, head and load_run of
    hostile ids return nothing (no row of another run), and the tables and triggers remain."""
    _completed_journal(tmp_path)
    with SqliteJournal(tmp_path / "journal.db", writer=False) as j:
        seen = [(list(j.read(h)), j.head(h)[0], load_run(j, h).seq) for h in [*HOSTILE, "good-run\x00", "\x00' OR 1=1"]]
        runs = j.runs()
    db = sqlite3.connect(tmp_path / "journal.db")
    try:
        schema = sorted(r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger')"))
    finally:
        db.close()

    assert [([], 0, 0)] * (len(HOSTILE) + 2) == seen
    assert ["good-run"] == runs
    assert {"events", "meta", "events_append_only_update", "events_append_only_delete"} <= set(schema)


JSON_SCALARS = st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=40)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
SQLISH = st.sampled_from(["a--", "0x00", "a:b@c", "x.y-z_w", "DROP", "1-1", "OR", "a--b", "E_", "9"])  # all valid ids


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    run_id=st.from_regex(ID_PATTERN, fullmatch=True) | SQLISH,
    step_ids=st.lists(st.from_regex(ID_PATTERN, fullmatch=True) | SQLISH, min_size=1, max_size=3, unique=True),
    args=st.dictionaries(st.text(max_size=12), JSON_VALUES, max_size=5),
)
def test_any_valid_ids_and_any_args_round_trip_exactly_through_journal_and_effect_store(
    tmp_path_factory: Any, run_id: str, step_ids: list[str], args: dict[str, Any]
) -> None:
    """For any ids the id pattern allows (SQL-looking ones included) and any JSON args (quotes,
    NULs, control characters, any unicode): a run completes; the journal holds exactly that
    run, its plan's args read back equal to the originals, each step's args digest matches, and
    the effect store holds exactly one row per step under exactly those ids."""
    where = tmp_path_factory.mktemp("hostile")
    adapters = {"ledger": {"type": "effects.idempotent", "idempotent": True}}
    plan = parse_plan(
        json.dumps(
            plan_dict(run_id, [{"id": s, "adapter": "ledger", "args": args} for s in step_ids], adapters)
        ).encode()
    )

    with Runtime(where / "journal.db", effects=where / "effects.db") as rt:
        outcome = rt.run(plan)
        state = rt.load(run_id)
        runs = rt.journal.runs()
        started = ev.decode(next(iter(rt.journal.read(run_id))).body)
    store = EffectStore(where / "effects.db")
    try:
        rows = [(r.run_id, r.step_id) for r in store.rows(run_id=run_id)]
    finally:
        store.close()

    assert isinstance(started, ev.RunStarted)
    assert started.plan is not None
    assert ("completed", [run_id]) == (outcome.state, runs)
    assert [args] * len(step_ids) == [s["args"] for s in started.plan["steps"]]
    assert [(run_id, s) for s in step_ids] == rows
    assert step_ids == [s.step_id for s in state.ordered_steps()]
