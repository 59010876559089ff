"""Round-6 attacks: the classes of the earlier rounds (aliases, second processes, stale evidence,
hostile tools, mistyped paths, closed pipes) with cases nobody had tried. Each test is one suspicion,
a failing reproduction first where it found a defect, kept as a regression test where it found none.
Real SQLite files, real processes (``python -m effectlog``)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import journal_tamper
from hardening_kit import GOOD_PLAN, cli_env, effectlog, one_line

pytest_plugins = ["pg_fixture"]

SUFFIXES = ["-wal", "-shm", "-journal"]


def _plan(path: Path, run_id: str, adapter_type: str = "noop") -> Path:
    """A one-step plan of run ``run_id`` (an idempotent adapter of ``adapter_type``) written to ``path``."""
    plan = {
        "run_id": run_id,
        "adapters": {"tool": {"type": adapter_type, "idempotent": True}},
        "steps": [{"id": "s1", "adapter": "tool", "args": {"cents": 5}}],
    }
    path.write_text(json.dumps(plan))
    return path


def _state(journal: Path, run_id: str, cwd: Path) -> tuple[int, str]:
    """``status --json`` of one run: exit status and state ("" when there is none)."""
    proc = effectlog("status", "--journal", str(journal), "--run-id", run_id, "--json", cwd=cwd)
    return proc.returncode, json.loads(proc.stdout).get("state", "") if proc.returncode == 0 else ""


# -- 1. a SQLite file inside another's sidecar names (-wal, -shm, -journal) --------------------------


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_a_journal_named_as_another_journals_sidecar_is_refused(tmp_path: Path, suffix: str) -> None:
    """SQLite keeps a database's WAL, shared-memory index and rollback journal at its name + ``-wal``,
    ``-shm``, ``-journal``. ``effectlog run --journal j.db-wal`` (a tab completion one key too far)
    made a journal in j.db's WAL file: its run completed and was acknowledged, and j.db's next commit
    reset the WAL (or its close deleted it): the run was gone, ``status`` said no journal there. Proves:
    a journal at another SQLite file's sidecar name is refused (exit 2, one line naming the file it
    belongs to), nothing is written, and the next commits to j.db lose nothing."""
    journal = tmp_path / "j.db"
    assert 0 == effectlog("run", "--journal", str(journal), str(GOOD_PLAN), cwd=tmp_path).returncode
    side = tmp_path / f"j.db{suffix}"
    before = side.read_bytes() if side.exists() else None
    proc = effectlog("run", "--journal", str(side), str(_plan(tmp_path / "p.json", "w")), cwd=tmp_path)
    assert (2, True, before) == (
        proc.returncode,
        "j.db" in one_line(proc.stderr),
        side.read_bytes() if side.exists() else None,
    )
    assert (0, "completed") == _state(journal, "good-run", tmp_path)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_an_effect_store_named_as_a_journals_sidecar_is_refused(tmp_path: Path, suffix: str) -> None:
    """The effect store twin: ``--effects j.db-wal`` kept idempotency keys in the journal's WAL file,
    where the journal's next commit overwrote them (a resume would send the key's effect again).
    Proves: refused, exit 2 in one line, and the journal beside it is intact."""
    journal = tmp_path / "j.db"
    assert 0 == effectlog("run", "--journal", str(journal), str(GOOD_PLAN), cwd=tmp_path).returncode
    plan = _plan(tmp_path / "p.json", "fx", "effects.idempotent")
    side = tmp_path / f"j.db{suffix}"
    proc = effectlog("run", "--journal", str(tmp_path / "k.db"), "--effects", str(side), str(plan), cwd=tmp_path)
    assert (2, True) == (proc.returncode, f"j.db{suffix}" in one_line(proc.stderr))
    assert (0, "completed") == _state(journal, "good-run", tmp_path)


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--journal", "{other}", "--effects", "{base}", "{fxplan}"],
        ["run", "--journal", "{base}", "{plan}"],
        ["submit", "--store", "{base}", "--scope", "s", "--key", "k", "{plan}"],
    ],
    ids=["effect-store", "journal", "fleet-store"],
)
def test_a_file_whose_wal_name_holds_another_journal_is_refused(tmp_path: Path, command: list[str]) -> None:
    """The other order: a journal made first at x.db-wal (x.db not there yet) holds a completed run.
    An effect store, journal or fleet store then opened at x.db reads x.db-wal as its WAL, finds no WAL
    header, and its first commit overwrites the file, its close deletes it: the run was gone (``status``
    of x.db-wal: no journal there). Proves: x.db is refused (exit 2, one line naming x.db-wal) and the
    run in x.db-wal is still there, completed."""
    side = tmp_path / "x.db-wal"
    plan = _plan(tmp_path / "p.json", "w")
    assert 0 == effectlog("run", "--journal", str(side), str(plan), cwd=tmp_path).returncode
    names = {
        "other": str(tmp_path / "y.db"),
        "base": str(tmp_path / "x.db"),
        "plan": str(plan),
        "fxplan": str(_plan(tmp_path / "fx.json", "fx", "effects.idempotent")),
    }
    proc = effectlog(*[arg.format(**names) for arg in command], cwd=tmp_path)
    assert (2, True) == (proc.returncode, "x.db-wal" in one_line(proc.stderr))
    assert (0, "completed") == _state(side, "w", tmp_path)


# -- 2. a stored column that is TEXT but not UTF-8 ---------------------------------------------------


def _damage(path: Path, table: str, column: str) -> None:
    """Rewrite ``column`` of the last row of ``table`` as TEXT holding bytes that are not UTF-8 (the
    append-only triggers dropped first, as anyone with the file can)."""
    db = journal_tamper.connect(path)
    for (trigger,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        db.execute(f'DROP TRIGGER "{trigger}"')
    last = "(SELECT max(seq) FROM ev)" if table == "events" else "(SELECT max(seq) FROM seals)"
    rows = "ev" if table == "events" else table  # (journal_tamper: the events' v1 columns)
    db.execute(f"UPDATE {rows} SET {column} = CAST(x'ff00fe' AS TEXT) WHERE seq = {last}")
    db.commit()
    db.close()


@pytest.mark.parametrize(
    ("table", "column"),
    [("events", "hash"), ("events", "body"), ("events", "step_id"), ("seals", "body"), ("seals", "hash")],
)
def test_a_column_stored_as_text_that_is_not_utf8_is_an_integrity_failure(
    tmp_path: Path, table: str, column: str
) -> None:
    """Round 5 made a body of another SQLite type an integrity error; TEXT that is not UTF-8 never
    reached that check: Python's sqlite3 failed to decode it, and ``verify`` ended with ``storage``,
    exit 2 ("bad input or usage") over a damaged journal. Proves: ``verify`` says it is damage, exit 7,
    in one line, for every column a person could rewrite so."""
    journal = tmp_path / "j.db"
    assert 0 == effectlog("run", "--journal", str(journal), str(GOOD_PLAN), cwd=tmp_path).returncode
    _damage(journal, table, column)
    proc = effectlog("verify", "--journal", str(journal), cwd=tmp_path)
    assert (7, "") == (proc.returncode, proc.stdout if proc.returncode != 7 else ""), proc.stderr
    one_line(proc.stderr)


# -- 3. numbers beyond what the store can hold --------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["requests", "--request", "{n}"],
        ["operator", "fail", "--request", "{n}", "--reason", "typo", "--by", "ops"],
        ["operator", "requeue", "--request", "-{n}", "--reason", "typo", "--by", "ops"],
    ],
    ids=["requests", "operator-fail", "operator-negative"],
)
def test_a_request_id_beyond_64_bits_is_bad_input_not_a_traceback(tmp_path: Path, argv: list[str]) -> None:
    """A request id past SQLite's INTEGER (a pasted hash, a typo with extra digits) reached the store,
    whose driver raised OverflowError: a traceback and exit 1 ("the run failed") from a read command.
    Proves: exit 2, one line naming the argument, and the store file unchanged."""
    store = tmp_path / "st.db"
    submit = ["submit", "--store", str(store), "--scope", "s", "--key", "k", str(GOOD_PLAN)]
    assert 0 == effectlog(*submit, cwd=tmp_path).returncode
    effectlog("requests", "--store", str(store), cwd=tmp_path)  # settles the WAL
    before = store.read_bytes()
    n = str(2**64 + 12)
    proc = effectlog(*[a.format(n=n) for a in argv], "--store", str(store), cwd=tmp_path)
    assert (2, True, True) == (proc.returncode, "--request" in one_line(proc.stderr), before == store.read_bytes())


# -- 4. two retries of one failed run at once ---------------------------------------------------------

_RETRY_RACE_SCRIPT = """
    import subprocess, sys
    import effectlog.lifecycle.fork as fork
    from effectlog.cli import main

    common = sys.argv[1:]
    checked = fork.fork_point

    def slow_fork_point(*args, **kwargs):
        # This retry has passed its "retried once" check; another operator's retry runs meanwhile.
        other = subprocess.run(
            [sys.executable, "-m", "effectlog", "retry", "--run-id", "order-1", "--new-run-id", "order-1.b",
             "--by", "ops-b", "--reason", "carrier back", "-q", *common],
            capture_output=True, text=True)
        print("other", other.returncode, file=sys.stderr)
        print(other.stderr, file=sys.stderr, end="")
        return checked(*args, **kwargs)

    fork.fork_point = slow_fork_point
    raise SystemExit(main(["retry", "--run-id", "order-1", "--new-run-id", "order-1.a", "--by", "ops-a",
                           "--reason", "carrier back", "-q", *common]))
"""


def test_two_retries_of_one_run_at_once_never_both_send_its_remaining_steps(tmp_path: Path) -> None:
    """``retry`` promises a run is retried once (a second retry would run its remaining steps again
    under new keys) and refuses when the run already has a fork. Two operators retrying the same
    failed run at the same moment (each naming its own ``--new-run-id``) both pass that check before
    either fork's first event is committed: both forks run, and the email after the failed step is
    sent twice. Proves: of two retries racing, one runs and the other is refused (exit 5 or 6), and
    the email is sent once."""
    journal, effects = tmp_path / "j.db", tmp_path / "e.db"
    gate = tmp_path / "open"
    plan = {
        "run_id": "order-1",
        "adapters": {
            "ledger": {"type": "effects.control", "version": "1", "idempotent": False},
            "gate": {"type": "test.gate", "options": {"open": str(gate)}},
        },
        "steps": [
            {"id": "charge", "adapter": "ledger", "args": {"cents": 500}},
            {"id": "ship", "adapter": "gate"},
            {"id": "email", "adapter": "ledger", "args": {"to": "a@example.com"}},
        ],
    }
    common = ["--journal", str(journal), "--effects", str(effects), "--adapters", "lifecycle_adapters:ADAPTERS"]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    env = {"PYTHONPATH": str(Path(__file__).parent)}  # the test adapters
    assert 1 == effectlog("run", str(path), *common, cwd=tmp_path, env=env).returncode
    gate.touch()
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_RETRY_RACE_SCRIPT), *common],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=cli_env(env),
    )
    db = sqlite3.connect(effects)
    emails = db.execute("SELECT count(*) FROM effects WHERE step_id = 'email'").fetchone()[0]
    db.close()
    other = next(line for line in proc.stderr.splitlines() if line.startswith("other "))
    assert (0, 1, True) == (proc.returncode, emails, other in ("other 5", "other 6")), proc.stderr


# -- 5. a fleet runner whose effect store's WAL is deleted under it -----------------------------------

_RUNNER_TOOL = """
import os, time


class ReadsTheStore:
    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        if not os.path.exists(os.environ["EL_ASKED"]):
            with open(os.environ["EL_STORE"], "rb") as f:  # a backup or checksum step: drops SQLite's locks
                f.read(100)
            open(os.environ["EL_ASKED"], "w").close()
            while not os.path.exists(os.environ["EL_GO"]):
                time.sleep(0.02)
        receipt = self.store.apply_idempotent(request)
        with open(os.environ["EL_LOG"], "a") as log:
            log.write("replayed\\n" if receipt.data.get("replayed") else "applied\\n")
        return receipt


ADAPTERS = {"test.reads-store": lambda decl, ctx: ReadsTheStore(ctx.effect_store())}
"""


def test_a_runner_whose_effect_store_wal_was_deleted_escalates_and_a_requeue_applies_once(tmp_path: Path) -> None:
    """The leftover of round 5 for the fleet: a runner's tool reads the effect store file (dropping the
    process's SQLite locks), another process's close deletes the store's WAL, and the tool applies its
    idempotent effect. Proves: the store refuses the commit, the runner neither crashes nor marks the
    request done or failed but escalates it (``needs_operator``, the reason naming ``store_wal_lost``);
    after ``operator requeue`` a fresh runner applies the key exactly once and the request completes."""
    (tmp_path / "el_runner_tool.py").write_text(_RUNNER_TOOL)
    store, fx, log = tmp_path / "st.db", tmp_path / "fx.db", tmp_path / "calls.log"
    env = {"PYTHONPATH": str(tmp_path), "EL_STORE": str(fx), "EL_LOG": str(log)}
    env |= {"EL_ASKED": str(tmp_path / "asked"), "EL_GO": str(tmp_path / "go")}
    plan = _plan(tmp_path / "plan.json", "r", "test.reads-store")
    assert (
        0
        == effectlog("submit", "--store", str(store), "--scope", "s", "--key", "k", str(plan), cwd=tmp_path).returncode
    )
    runner = [sys.executable, "-m", "effectlog", "runner", "--store", str(store), "--effects", str(fx)]
    runner += ["--adapters", "el_runner_tool:ADAPTERS", "--exit-when-idle", "--quiet"]
    first = subprocess.Popen(runner, env=cli_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "asked").exists():
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "the runner's step never read the effect store"
        time.sleep(0.02)
    visitor = "import sys; from effectlog.adapters import EffectStore; EffectStore(sys.argv[1]).close()"
    assert 0 == subprocess.run([sys.executable, "-c", visitor, str(fx)], env=cli_env(env), timeout=60).returncode
    (tmp_path / "go").touch()
    _, err = first.communicate(timeout=120)
    shown = effectlog("requests", "--store", str(store), "--request", "1", "--json", cwd=tmp_path)
    escalated = json.loads(shown.stdout)
    reasons = " ".join(str(h.get("reason", "")) for h in escalated.get("history", []))
    assert (0, "needs_operator", True, False) == (
        first.returncode,
        escalated["request"]["state"] if "request" in escalated else escalated.get("state"),
        "store_wal_lost" in reasons,
        log.exists(),
    ), (err, shown.stdout)
    requeue = ["operator", "requeue", "--store", str(store), "--request", "1", "--reason", "wal", "--by", "ops"]
    assert 0 == effectlog(*requeue, cwd=tmp_path).returncode
    again = subprocess.run(runner, env=cli_env(env), capture_output=True, text=True, timeout=120)
    assert (0, ["applied"], (0, "completed")) == (
        again.returncode,
        log.read_text().split(),
        _state(store, "r", tmp_path),
    ), again.stderr


# -- 6. fork() and the fleet store's watcher connection ---------------------------------------------

_WATCHER_FORK_SCRIPT = """
    import os, subprocess, sys, textwrap, threading
    from effectlog.fleet import open_store
    from effectlog.fleet.contract import noop_plan

    where, how = sys.argv[1], sys.argv[2]
    store = open_store(where)  # a runner's store, its wake-up watcher running, when it forks a worker
    woken = threading.Event()
    store.watch(woken.set)
    store.submit("t", "k1", noop_plan("run-1"))
    woken.wait(60)  # at once, as a rule; generous for a loaded machine
    go, said = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker does nothing with the store and leaves
        os.read(go, 1)
        if how == "close":
            store.close()
            os._exit(0)
        sys.exit(0)
    store.close()
    # Another process submits and is killed before it closes: its commit is in the WAL only.
    third = '''
    import os, signal, sys
    from effectlog.fleet import open_store
    from effectlog.fleet.contract import noop_plan
    store = open_store(sys.argv[1])
    store.submit("t", "k2", noop_plan("run-2"))
    print("submitted", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    '''
    q = subprocess.run([sys.executable, "-c", textwrap.dedent(third), where], capture_output=True, text=True)
    print(q.stdout.strip(), flush=True)
    os.write(said, b"x")
    os.waitpid(pid, 0)
    with open_store(where) as again:
        print(len(again.requests()), flush=True)
"""


@pytest.mark.parametrize("how", ["close", "exit"])
def test_a_forked_child_of_a_watching_runner_loses_no_other_process_commits(tmp_path: Path, how: str) -> None:
    """The fleet store's wake-up watcher opens its own SQLite connection in a thread, outside the
    registry of connections that a fork child must never close (round 5's leftover). A worker forked
    while the watcher runs closes the inherited store or just exits, after another process committed a
    request and was SIGKILLed (its commit only in the WAL). Proves: the request is still there (a close
    of an inherited connection deleted such a WAL in round 5), both requests counted."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WATCHER_FORK_SCRIPT), str(tmp_path / "fleet.db"), how],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )
    assert (["submitted", "2"], "") == (proc.stdout.split(), proc.stderr)


# -- 7. fork() and the PostgreSQL fleet store's own pool ----------------------------------------------

_PG_STORE_FORK_SCRIPT = """
    import json, os, select, signal, sys
    from effectlog.errors import EffectlogError
    from effectlog.fleet.contract import noop_plan
    from effectlog.fleet.postgres_store import PostgresFleetStore

    def hung(*_):
        raise TimeoutError("no answer within 20 s")

    store = PostgresFleetStore(sys.argv[1], pool_size=1)  # a runner host's store, open when it forks a worker
    first = store.submit("t", "k0", noop_plan("run-0")).request.request_id
    expected = store.request(first).state
    ready, child_said = os.pipe()
    go_child, go = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGALRM, hung)
        signal.alarm(20)
        os.read(go_child, 1)
        reads = {
            "request": lambda: store.request(first),
            "requests": store.requests,
            "attempts": lambda: store.attempts(first),
            "history": lambda: store.history(first),
        }
        said = {}
        for name, call in reads.items():
            try:
                for _ in range(100):
                    call()
                said[name] = "read"
            except EffectlogError as exc:
                said[name] = exc.code
            except BaseException as exc:
                said[name] = type(exc).__name__
        os.write(child_said, json.dumps(said).encode() + b"\\n")
        os._exit(0)
    signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    os.write(go, b"x")
    parent = {"same": 0, "other": 0, "errors": []}
    for i in range(300):
        try:
            parent["same" if store.request(first).state == expected else "other"] += 1
            if i % 30 == 0:
                store.submit("t", f"k{i + 1}", noop_plan(f"run-{i + 1}"))
        except BaseException as exc:
            parent["errors"].append(type(exc).__name__)
            if isinstance(exc, TimeoutError):
                break
    signal.alarm(0)
    if select.select([ready], [], [], 30)[0]:
        child = json.loads(os.read(ready, 1000))
    else:
        child = "hung"
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    print(json.dumps({"child": child, "parent": parent, "submitted": len(store.requests()) - 1}))
"""


def test_reads_through_a_postgres_fleet_store_inherited_across_fork_never_cross_the_parents(pg_url: str) -> None:
    """The fleet store's own connection pool (not the journal's, which refuses in a child since the
    leftovers branch) after ``fork()``: a worker reading requests through the store its parent opened
    sends its queries down the parent's pooled socket while the parent uses it. Proves: every read in
    the child is refused (``journal_inherited``) and the parent's 300 reads and 10 submits all work."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PG_STORE_FORK_SCRIPT), pg_url],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )
    assert proc.stdout, proc.stderr
    refused = "journal_inherited"
    expected = {
        "child": {"request": refused, "requests": refused, "attempts": refused, "history": refused},
        "parent": {"same": 300, "other": 0, "errors": []},
        "submitted": 10,
    }
    assert expected == json.loads(proc.stdout), proc.stderr[-2000:]


# -- 8. --trace naming a file the run's SQLite files use ----------------------------------------------


@pytest.mark.parametrize("target", ["fx.db", "j.db", "j.db-wal", "fx.db-wal", "j.db-shm"])
def test_a_trace_naming_the_journal_the_effect_store_or_their_sidecars_is_refused(tmp_path: Path, target: str) -> None:
    """``--trace`` is checked to be a trace it can extend when the file exists, but the journal and the
    effect store a run creates, and the -wal/-shm files SQLite keeps beside them, do not exist yet when
    it looks (a fresh setup, a tired operator's tab completion). The trace's lines went into the new
    SQLite file, where the next checkpoint overwrote them (the trace silently gone), or into its WAL.
    Proves: refused before anything is created (exit 2, one line naming --trace), no file made."""
    plan = _plan(tmp_path / "p.json", "fx", "effects.idempotent")
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = effectlog("run", "--journal", "j.db", "--effects", "fx.db", "--trace", target, str(plan), cwd=tmp_path)
    assert (2, True, before) == (
        proc.returncode,
        "--trace" in one_line(proc.stderr),
        sorted(p.name for p in tmp_path.iterdir()),
    )


# -- 9. the Python API given a file of something else as its effect store ---------------------------


@pytest.mark.parametrize("what", ["the-journal", "an-app-database"])
def test_the_api_refuses_an_effect_store_that_is_a_file_of_something_else(tmp_path: Path, what: str) -> None:
    """``effectlog run --effects`` refuses a SQLite file that is not an effect store (the journal, a
    user's own database) before anything is written; the check lived in the CLI only, so
    ``Runtime(journal, effects=...)`` (and every program embedding effectlog) wrote the effect store's
    tables into the journal or into the user's database and ran. Proves: the API refuses too (bad_input,
    nothing run), and the file is byte for byte as it was."""
    from effectlog.errors import BadInput
    from effectlog.plan import load_plan
    from effectlog.runtime import Runtime

    journal = tmp_path / "j.db"
    assert 0 == effectlog("run", "--journal", str(journal), str(GOOD_PLAN), cwd=tmp_path).returncode
    target = journal
    if what == "an-app-database":
        target = tmp_path / "app.db"
        db = sqlite3.connect(target)
        db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO users (name) VALUES ('ada')")
        db.commit()
        db.close()
    before = target.read_bytes()
    plan = load_plan(str(_plan(tmp_path / "p.json", "fx", "effects.idempotent")))
    with pytest.raises(BadInput) as refused, Runtime(str(journal), effects=str(target)) as runtime:
        runtime.run(plan)
    assert ("bad_input", before) == (refused.value.code, target.read_bytes())


# -- 10. effectlog.durable and a journal WAL deleted under it ------------------------------------------

_DURABLE_WAL_SCRIPT = """
    import os, subprocess, sys
    from effectlog import durable
    from effectlog.errors import EffectlogError

    where, log = sys.argv[1], sys.argv[2]
    visitor = "import sys; from effectlog.journal import open_journal; open_journal(sys.argv[1]).close()"

    @durable.tool(idempotent=True)
    def charge(cents, idempotency_key=""):
        if not os.path.exists(log):  # first call: a backup step reads the journal file, another process visits
            with open(where, "rb") as f:
                f.read(100)
            subprocess.run([sys.executable, "-c", visitor, where], check=True)
        with open(log, "a") as f:
            f.write(idempotency_key + "\\n")
        return {"charged": cents}

    for attempt in (1, 2):
        try:
            with durable.run("d", journal=where):
                print(charge(500)["charged"], flush=True)
        except EffectlogError as exc:
            print(exc.code, flush=True)
"""


def test_a_durable_run_whose_journal_wal_was_deleted_loses_nothing_and_resends_one_key(tmp_path: Path) -> None:
    """The other leftover: ``effectlog.durable``'s journal WAL deleted under it (its tool read the
    journal file, dropping the process's SQLite locks; another process's close deleted the WAL). Proves:
    the result's commit is refused (``journal_wal_lost``), not written into the deleted WAL; running the
    block again resends the same idempotency key once and records the result; ``verify`` is ok."""
    journal, log = tmp_path / "d.db", tmp_path / "keys.log"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_DURABLE_WAL_SCRIPT), str(journal), str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        env=cli_env(),
    )
    keys = log.read_text().split()
    verify = effectlog("verify", "--journal", str(journal), cwd=tmp_path)
    assert (["journal_wal_lost", "500"], 2, 1, 0) == (
        proc.stdout.split(),
        len(keys),
        len(set(keys)),
        verify.returncode,
    ), proc.stderr
    assert (0, "completed") == _state(journal, "d", tmp_path)


# -- 11. a stop signal during a retry's backoff --------------------------------------------------------

_FLAKY_TOOL = """
import os


class Flaky:
    def invoke(self, request):
        open(os.environ["EL_SENT"], "a").write(request.idempotency_key + "\\n")
        if os.environ.get("EL_OK"):
            return {"sent": True}
        raise ConnectionError("no answer from the endpoint")


ADAPTERS = {"test.flaky": lambda decl, ctx: Flaky()}

if os.environ.get("EL_BACKOFF"):  # touched once a retry's backoff is being waited out (the stop waiter is set)
    from effectlog import runtime as _runtime

    _wait_or_stop = _runtime.Runtime.wait_or_stop

    async def _says_when_waiting(self, delay):
        inner = self.sleep

        async def sleep(seconds):
            open(os.environ["EL_BACKOFF"], "w").close()
            await inner(seconds)

        self.sleep = sleep
        try:
            return await _wait_or_stop(self, delay)
        finally:
            self.sleep = inner

    _runtime.Runtime.wait_or_stop = _says_when_waiting
"""


def _flaky_plan(path: Path, retry: dict[str, float]) -> Path:
    plan = {
        "run_id": "flaky",
        "adapters": {"api": {"type": "test.flaky", "idempotent": True}},
        "steps": [{"id": "call", "adapter": "api", "retry": retry}],
    }
    path.write_text(json.dumps(plan))
    return path


@pytest.mark.parametrize("backoff", [1e308, 86_400.0 * 8])
def test_a_retry_backoff_beyond_a_week_is_a_bad_plan(tmp_path: Path, backoff: float) -> None:
    """``timeout_s`` must be under a week, but a retry's ``backoff_base_s``/``backoff_cap_s`` took any
    number: 1e308 made ``effectlog run`` sleep for ever between two sends of one key (and, with a stop
    deferred to the step's end, ignore SIGTERM for ever). Proves: such a plan is refused (exit 2, one
    line naming the field) before a journal is made."""
    plan = _flaky_plan(tmp_path / "p.json", {"attempts": 3, "backoff_base_s": backoff, "backoff_cap_s": backoff})
    (tmp_path / "el_flaky.py").write_text(_FLAKY_TOOL)
    env = {"PYTHONPATH": str(tmp_path), "EL_SENT": str(tmp_path / "sent.log")}
    proc = effectlog("run", "--journal", "j.db", "--adapters", "el_flaky:ADAPTERS", str(plan), cwd=tmp_path, env=env)
    assert (2, True, False) == (proc.returncode, ".retry" in one_line(proc.stderr), (tmp_path / "j.db").exists())


def test_sigterm_during_a_retry_backoff_stops_the_run_promptly(tmp_path: Path) -> None:
    """An idempotent step whose first send failed waits its backoff (here an hour) before sending the same
    key again. SIGTERM then (systemd stopping the service, a deploy) is documented as "stop after the
    current step's durable commit" (exit 143): nothing is in flight during the backoff, yet the process
    kept sleeping and sent again before it stopped. Proves: it exits 143 within 120 s (far less than the
    backoff), the key was sent once, and running the plan again re-sends that same key."""
    (tmp_path / "el_flaky.py").write_text(_FLAKY_TOOL)
    sent, backoff = tmp_path / "sent.log", tmp_path / "in-backoff"
    env = {"PYTHONPATH": str(tmp_path), "EL_SENT": str(sent), "EL_BACKOFF": str(backoff)}
    plan = _flaky_plan(tmp_path / "p.json", {"attempts": 2, "backoff_base_s": 3600, "backoff_cap_s": 3600, "jitter": 0})
    argv = [sys.executable, "-m", "effectlog", "run", "--journal", "j.db", "--adapters", "el_flaky:ADAPTERS"]
    proc = subprocess.Popen(
        [*argv, str(plan)], cwd=tmp_path, env=cli_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not backoff.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never began its retry's backoff"
        time.sleep(0.02)
    proc.send_signal(15)  # in the backoff now
    try:
        # The bound is what this proves (a stop that does not wait out the hour's backoff), so it stays; 120 s
        # is generous for a loaded 2-core machine and still far below the backoff.
        proc.communicate(timeout=120)
        status: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        status = None
    assert (143, 1) == (status, len(sent.read_text().split()))

    again = subprocess.run([*argv, str(plan)], cwd=tmp_path, env=cli_env({**env, "EL_OK": "1"}), capture_output=True)
    keys = sent.read_text().split()
    assert (0, 2, 1) == (again.returncode, len(keys), len(set(keys)))
