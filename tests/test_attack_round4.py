"""Round-4 attacks where the user's world touches ours (aliases and second writers, second actors,
evidence, misbehaving tools): each test is one suspicion, a failing reproduction first where it found
a defect, kept as a regression test where it found none. Real SQLite files, real PostgreSQL, real
processes and SIGKILL (``os.fork`` only in a child interpreter, never in pytest's own)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from console_kit import Setup, console, effects_rows, login, uncertain_plan
from effectlog.adapters import EffectStore
from effectlog.errors import ExitStatus
from hardening_kit import effectlog, one_line

pytest_plugins = ["pg_fixture"]


def python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` run by a fresh interpreter (this tree's sources through the inherited PYTHONPATH)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, timeout=120
    )


# -- 2. second actors: a child of fork() -------------------------------------------------------

_FORK_SCRIPT = """
    import json, os, subprocess, sys
    from effectlog.errors import EffectlogError
    from effectlog.journal import SqliteJournal

    where = sys.argv[1]
    journal = SqliteJournal(where)  # opened before fork(): the child inherits its descriptor
    journal.claim("x")  # a run the parent drives across the fork

    def attempt(claim):
        try:
            claim()
            return "claimed"
        except EffectlogError as exc:
            return exc.code

    go, child_said = os.pipe()
    done, parent_said = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child drives run r with what it has: the inherited journal, else its own
        said = {"inherited": attempt(lambda: journal.claim("r"))}
        journal.close()  # the parent's claim of x, copied into the child, must outlive this
        if said["inherited"] != "claimed":
            said["own"] = attempt(lambda: SqliteJournal(where).claim("r"))
        os.write(child_said, json.dumps(said).encode() + b"\\n")
        os.read(done, 1)  # holds what it claimed until the parent has tried
        os._exit(0)
    child = json.loads(os.read(go, 1000))
    parent = attempt(lambda: journal.claim("r"))
    def outside(run_id):
        return subprocess.run(
            [sys.executable, "-c", "import sys; from effectlog.journal import SqliteJournal; "
             "from effectlog.errors import RunOwned\\n"
             "try:\\n SqliteJournal(sys.argv[1]).claim(sys.argv[2]); print('claimed')\\n"
             "except RunOwned as e: print(e.code)", where, run_id],
            capture_output=True, text=True).stdout.strip()
    outsider = [outside("r"), outside("x")]
    os.write(parent_said, b"x")
    os.waitpid(pid, 0)
    print(json.dumps({"child": child, "parent": parent, "outsider": outsider}))
"""


def test_a_forked_child_and_its_parent_never_both_own_one_run(tmp_path: Path) -> None:
    """A process that opened a journal and then forked (a pre-forking server, a multiprocessing pool)
    shares its open file description, and so every OFD lock taken through it, with the child: a run
    the child claimed through the inherited journal was claimed again by the parent at once (two live
    owners of one run, G9 broken; the parent's release would even drop the child's lock, letting a
    third process in). Proves: the inherited journal refuses to claim in the child (exit 6, naming the
    fork), and closing it there leaves the parent's run x held; a journal the child opens itself is
    refused too (SQLite's lock records came with the fork: tests/test_attack_round5.py), so run r is
    the parent's to claim, and then no other process can."""
    proc = python(_FORK_SCRIPT, str(tmp_path / "j.db"))
    assert "" == proc.stderr
    said = json.loads(proc.stdout)
    expected = {
        "child": {"inherited": "journal_inherited", "own": "journal_inherited"},
        "parent": "claimed",
        "outsider": ["run_owned", "run_owned"],
    }
    assert expected == said


_PG_FORK_SCRIPT = """
    import json, os, signal, sys
    from effectlog.errors import EffectlogError
    from effectlog.journal.postgres import PostgresJournal

    url = sys.argv[1]
    journal = PostgresJournal(url)
    journal.claim("x")  # the parent owns a run: its owner connection exists before the fork

    def attempt(claim):
        try:
            claim()
            return "claimed"
        except EffectlogError as exc:
            return exc.code

    go, child_said = os.pipe()
    done, parent_said = os.pipe()
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)
        said = {"inherited": attempt(lambda: journal.claim("r"))}
        journal.close()  # the parent's claim of x and its sessions must outlive this
        if said["inherited"] != "claimed":
            said["own"] = attempt(lambda: PostgresJournal(url).claim("r"))
        os.write(child_said, json.dumps(said).encode() + b"\\n")
        os.read(done, 1)
        os._exit(0)
    child = json.loads(os.read(go, 1000))
    parent = attempt(lambda: journal.claim("r"))
    outsider = attempt(lambda: PostgresJournal(url).claim("x"))
    os.write(parent_said, b"x")
    os.waitpid(pid, 0)
    print(json.dumps({"child": child, "parent": parent, "outsider": outsider}))
"""


def test_on_postgresql_a_forked_child_and_its_parent_never_both_own_one_run(pg_url: str) -> None:
    """The PostgreSQL journal after fork(): the child's copy shares the parent's server sessions, so a
    claim through it took a session advisory lock the parent's session already could (locks of one
    session stack), and parent and child both claimed run r; the child's close unlocked the parent's
    runs on that session. Proves: the inherited journal refuses to claim in the child (exit 6) and its
    close leaves the parent's claim of x held, the child's own journal claims r, and the parent cannot."""
    proc = python(_PG_FORK_SCRIPT, pg_url)
    assert "" == proc.stderr
    expected = {
        "child": {"inherited": "journal_inherited", "own": "claimed"},
        "parent": "run_owned",
        "outsider": "run_owned",
    }
    assert expected == json.loads(proc.stdout)


# -- 4. evidence: an answer about one attempt recorded on another ---------------------------

# A user's adapter: attempt 1 fails before its effect, attempt 2 applies it and loses the reply,
# later attempts apply it and answer. Its lookup waits for a file before it answers (a slow API).
_SLOW_LOOKUP_MODULE = """
import os, time
from effectlog.adapters import Evidence


class Flaky:
    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        if request.attempt == 1:
            raise ConnectionError("refused before the effect")
        receipt = self.store.apply_control(request)
        if request.attempt == 2:
            raise ConnectionError("connection reset after the effect")
        return receipt

    def lookup(self, request):
        open(os.environ["EL_ASKED"], "w").close()
        while not os.path.exists(os.environ["EL_GO"]):
            time.sleep(0.02)
        return self.store.lookup(request)


ADAPTERS = {"test.flaky": lambda decl, ctx: Flaky(ctx.effect_store())}
"""


def test_a_slow_lookups_answer_is_never_recorded_on_a_later_attempt(tmp_path: Path) -> None:
    """``reconcile --lookup`` asks the adapter about the uncertain attempt (1) and records the answer
    on the step as it is *when the answer comes*: while a slow lookup ran, a person reconciled attempt
    1 and the next run's attempt 2 applied its effect and lost the reply, so the lookup's "attempt 1:
    not applied" was recorded as attempt 2's outcome, and the next run sent attempt 3: two effects,
    and verify passes. Proves: evidence about one attempt is refused (exit 5, one line, nothing
    written) once the step has moved on, and the effect happens once."""
    (tmp_path / "el_slow_lookup.py").write_text(_SLOW_LOOKUP_MODULE)
    path = ":".join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "EL_ASKED": str(tmp_path / "asked"), "EL_GO": str(tmp_path / "go")}
    plan = {
        "run_id": "mail-1",
        "adapters": {"mail": {"type": "test.flaky", "idempotent": False}},
        "steps": [{"id": "email", "adapter": "mail", "args": {"to": "customer@example.com"}}],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    where = ("--journal", str(tmp_path / "j.db"))
    tools = ("--adapters", "el_slow_lookup:ADAPTERS")
    run = ("run", str(tmp_path / "plan.json"), *where, "--effects", str(tmp_path / "fx.db"), *tools)
    step = ("--run-id", "mail-1", "--step", "email")

    def el(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "effectlog", *args], env=env, capture_output=True, text=True, timeout=120
        )

    assert 3 == el(*run).returncode  # attempt 1: uncertain
    slow = subprocess.Popen(
        [sys.executable, "-m", "effectlog", "reconcile", *where, *step, "--lookup", *tools],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "asked").exists():
        assert slow.poll() is None, slow.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    by_hand = el("reconcile", *where, *step, "--outcome", "not-applied", "--evidence", "checked", "--operator", "ops")
    assert 0 == by_hand.returncode, by_hand.stderr
    assert 3 == el(*run).returncode  # attempt 2: applied, reply lost
    (tmp_path / "go").touch()
    _, stale_err = slow.communicate(timeout=120)
    rest = el(*run)  # attempt 2 still uncertain: the run stops again, nothing sent
    store = EffectStore(str(tmp_path / "fx.db"), read_only=True)
    effects = [row.attempt for row in store.rows(run_id="mail-1")]
    store.close()

    assert (ExitStatus.CONFLICT, 1) == (slow.returncode, len(stale_err.strip().splitlines())), stale_err
    assert "Traceback" not in stale_err
    assert (3, [2]) == (rest.returncode, effects)
    assert 0 == el("verify", *where).returncode


# -- 5. tools that misbehave: a tool that closes the process's stdout and stderr --------------

_CLOSER_MODULE = """
import os


class Closer:
    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        receipt = self.store.apply_control(request)
        if request.step_id == "s1":
            os.close(1)
            os.close(2)
        return receipt


ADAPTERS = {"test.closer": lambda decl, ctx: Closer(ctx.effect_store())}
"""


def test_a_tool_that_closes_stdout_and_stderr_loses_no_result_and_repeats_no_effect(tmp_path: Path) -> None:
    """A tool that closes fds 1 and 2 after its effect (a library that "daemonizes", a careless
    cleanup): the progress lines and the JSON outcome written after it must not fail between the
    effect and its recorded result. Proves: the run completes (exit 0) with the outcome on stdout,
    each step confirmed once, one effect per step, and a second run sends nothing (found nothing:
    kept as a regression test)."""
    (tmp_path / "el_closer.py").write_text(_CLOSER_MODULE)
    env = {**os.environ, "PYTHONPATH": ":".join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    steps = [{"id": f"s{i}", "adapter": "c", "args": {"i": i}} for i in (1, 2, 3)]
    plan = {"run_id": "r", "adapters": {"c": {"type": "test.closer", "idempotent": False}}, "steps": steps}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    run = [sys.executable, "-m", "effectlog", "run", str(tmp_path / "plan.json"), "--journal", str(tmp_path / "j.db")]
    run += ["--effects", str(tmp_path / "fx.db"), "--adapters", "el_closer:ADAPTERS", "--json"]

    first = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
    again = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
    store = EffectStore(str(tmp_path / "fx.db"), read_only=True)
    effects = sorted(row.step_id for row in store.rows(run_id="r"))
    store.close()

    assert (0, "completed") == (first.returncode, json.loads(first.stdout)["state"]), first.stderr
    assert (0, ["s1", "s2", "s3"]) == (again.returncode, effects)


# -- 4. evidence: a person's decision about one attempt recorded on another --------------------


def _stale_person_setup(tmp_path: Path) -> tuple[Setup, Callable[..., subprocess.CompletedProcess[str]]]:
    """charge-1 stopped on attempt 1 (the lost-reply tool applies its effect, then raises)."""
    setup = Setup(tmp_path)
    setup.uncertain("charge-1")

    def el(*args: str) -> subprocess.CompletedProcess[str]:
        return effectlog(*args, cwd=setup.dir, env={"PYTHONPATH": str(setup.dir)})

    return setup, el


def _next_attempt_uncertain(setup: Setup, el: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    """Another operator says attempt 1 did not apply, and the next run's attempt 2 stops uncertain too."""
    ops = ("--journal", setup.journal, "--run-id", "charge-1", "--step", "charge")
    done = el("reconcile", *ops, "--outcome", "not-applied", "--evidence", "psp: none", "--operator", "ann")
    assert 0 == done.returncode, done.stderr
    setup.run(uncertain_plan("charge-1"), 3)


def test_a_persons_reconcile_bound_to_an_attempt_is_refused_once_the_step_moved_on(tmp_path: Path) -> None:
    """``reconcile --attempt N``: a person's decision names the attempt their evidence is about (as
    ``status`` prints it); after another operator's decision and a run moved the step to attempt 2,
    ``--attempt 1 --outcome not-applied`` would start attempt 3 over attempt 2's effect. Proves: it
    is refused (exit 5, one line naming both attempts, nothing written), and ``--attempt 2`` is taken."""
    setup, el = _stale_person_setup(tmp_path)
    _next_attempt_uncertain(setup, el)
    before = setup.timeline("charge-1")
    ops = ("--journal", setup.journal, "--run-id", "charge-1", "--step", "charge")
    says = ("--outcome", "not-applied", "--evidence", "psp: none for attempt 1", "--operator", "bob")

    stale = el("reconcile", *ops, "--attempt", "1", *says)
    after = setup.timeline("charge-1")
    current = el("reconcile", *ops, "--attempt", "2", "--outcome", "applied", "--evidence", "psp", "--operator", "bob")

    assert (ExitStatus.CONFLICT, before) == (stale.returncode, after)
    assert "attempt 1" in one_line(stale.stderr)
    assert "attempt 2" in one_line(stale.stderr)
    assert 0 == current.returncode, current.stderr


def test_the_reconcile_command_effectlog_prints_is_bound_to_the_attempt_it_was_printed_for(tmp_path: Path) -> None:
    """The command ``status`` prints for an uncertain step carries ``--attempt N``: an operator who
    copies it at attempt 1 and runs it (filled in with "not applied") after the step moved on to
    attempt 2 is refused (exit 5, nothing written) instead of starting attempt 3 over attempt 2's
    effect; the command printed at attempt 2 is taken."""
    setup, el = _stale_person_setup(tmp_path)

    def printed() -> list[str]:
        done = el("status", "--journal", setup.journal, "--run-id", "charge-1", "--json")
        assert 0 == done.returncode, done.stderr
        (item,) = json.loads(done.stdout)["at_stake"]
        fill = {"applied|not-applied": "not-applied", "TEXT": "psp: none", "NAME": "bob"}
        return [fill.get(a, a) for a in str(item["command"]).split()[1:]]

    at_attempt_1 = printed()
    _next_attempt_uncertain(setup, el)
    before = setup.timeline("charge-1")
    stale = el(*at_attempt_1)
    after = setup.timeline("charge-1")
    current = el(*printed())

    assert ["--attempt", "1"] == at_attempt_1[at_attempt_1.index("--attempt") :][:2]
    assert (ExitStatus.CONFLICT, before) == (stale.returncode, after)
    assert 0 == current.returncode, current.stderr


def test_a_console_reconcile_posted_from_a_page_of_an_earlier_attempt_is_refused(tmp_path: Path) -> None:
    """The console's reconcile form is bound to the attempt the page showed: an operator who loaded
    the page at attempt 1 and posts "not applied" after the step moved on to attempt 2 (applied,
    reply lost) would start attempt 3, a second effect. Proves: the post is refused (409) and
    nothing is written, and the next run sends nothing (one effect per applied attempt)."""
    setup, el = _stale_person_setup(tmp_path)
    with console(setup) as base:
        client, token = login(base, "olga")
        page = client.get("/runs/charge-1").text
        _next_attempt_uncertain(setup, el)
        before = setup.timeline("charge-1")
        form = {"csrf": token, "outcome": "not_applied", "evidence": "psp: nothing for this key"}
        shown = re.search(r'name="attempt" value="(\d+)"', page)
        if shown is not None:
            form["attempt"] = shown.group(1)
        done = client.post("/runs/charge-1/steps/charge/reconcile", data=form)
        client.close()
    after = setup.timeline("charge-1")
    setup.run(uncertain_plan("charge-1"), 3)  # still uncertain: stops again, sends nothing

    assert (409, before) == (done.status_code, after)
    assert [1, 2] == [row["attempt"] for row in effects_rows(setup)]


# -- 5. tools that misbehave: a tool's own stdout and effectlog's --json ------------------------

# Idempotent, prints on every call; raises KeyboardInterrupt when EL_INTERRUPT is set (the run stops,
# open, exit 130: an interrupted run for ``recover``); refuses (not applied) with EL_FAIL. With
# EL_LINGER, a thread it starts prints once the tool returned and effectlog pointed fd 1 back at the
# real stdout, or (fd 1 kept on stderr) once the command's main thread ended: after its last line.
_CHATTY_MODULE = """
import os, threading, time


class Chatty:
    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        print("tool output on stdout", flush=True)
        os.write(1, b"tool output on fd 1\\\\n")
        if os.environ.get("EL_INTERRUPT"):
            raise KeyboardInterrupt
        if os.environ.get("EL_FAIL"):
            from effectlog.errors import NotApplied

            raise NotApplied("the tool refuses")
        if os.environ.get("EL_LINGER"):
            def later():
                while os.fstat(1).st_ino == os.fstat(2).st_ino:  # until effectlog points fd 1 back
                    if not threading.main_thread().is_alive():  # or the command is over
                        break
                    time.sleep(0.0005)
                print("a tool's thread, after it returned", flush=True)

            threading.Thread(target=later, daemon=False).start()  # the interpreter waits for it
        return self.store.apply_idempotent(request)


ADAPTERS = {"test.chatty": lambda decl, ctx: Chatty(ctx.effect_store())}
"""


def _chatty(tmp_path: Path) -> tuple[dict[str, str], tuple[str, ...], tuple[str, ...]]:
    (tmp_path / "el_chatty.py").write_text(_CHATTY_MODULE)
    env = {**os.environ, "PYTHONPATH": ":".join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    plan = {
        "run_id": "r",
        "adapters": {"c": {"type": "test.chatty", "idempotent": True}},
        "steps": [{"id": "s1", "adapter": "c", "args": {"i": 1}}],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    where = ("--journal", str(tmp_path / "j.db"), "--effects", str(tmp_path / "fx.db"))
    return env, where, ("--adapters", "el_chatty:ADAPTERS")


def test_recover_json_is_only_effectlogs_output_while_tools_print(tmp_path: Path) -> None:
    """``effectlog recover --json`` drives tools as ``run`` does, but did not send their stdout to
    stderr: a tool's print landed in the JSON report a script parses. Proves: the report on stdout is
    exactly one JSON document, the tool's lines are on stderr, and the step was done once."""
    env, where, tools = _chatty(tmp_path)
    first = subprocess.run(
        [sys.executable, "-m", "effectlog", "run", str(tmp_path / "plan.json"), *where, *tools],
        env={**env, "EL_INTERRUPT": "1"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ExitStatus.INTERRUPTED == first.returncode, first.stderr
    done = subprocess.run(
        [sys.executable, "-m", "effectlog", "recover", *where, *tools, "--json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert 0 == done.returncode, done.stderr
    assert [("r", "resumed")] == [(r["run_id"], r["action"]) for r in json.loads(done.stdout)]
    assert 2 == done.stderr.count("tool output on")


def test_run_json_is_only_effectlogs_output_when_a_tools_thread_outlives_it(tmp_path: Path) -> None:
    """A tool that starts a thread which prints after the tool returned: G7 promises that ``--json``
    output is only effectlog's. fd 1 was pointed back at the real stdout when the run ended, and the
    thread's line landed in the JSON. Proves: stdout is exactly one JSON document and the thread's
    line is on stderr (the ``effectlog`` process keeps fd 1 on stderr until it exits)."""
    env, where, tools = _chatty(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "effectlog", "run", str(tmp_path / "plan.json"), *where, *tools, "--json"],
        env={**env, "EL_LINGER": "1"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert 0 == done.returncode, done.stderr
    assert "completed" == json.loads(done.stdout)["state"]
    assert 1 == done.stderr.count("a tool's thread, after it returned")


@pytest.mark.parametrize("command", ["recover", "fork", "retry"])
def test_every_command_driving_tools_keeps_a_lingering_threads_print_out_of_json(tmp_path: Path, command: str) -> None:
    """``recover``, ``fork`` and ``retry`` drive tools as ``run`` does: a thread a tool starts that
    prints after the command's last line must not land in their ``--json``. Proves: for each, stdout
    is exactly one JSON document and the thread's line is on stderr."""
    env, where, tools = _chatty(tmp_path)
    first = subprocess.run(
        [sys.executable, "-m", "effectlog", "run", str(tmp_path / "plan.json"), *where, *tools],
        env={**env, **{"recover": {"EL_INTERRUPT": "1"}, "fork": {}, "retry": {"EL_FAIL": "1"}}[command]},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert 0 != first.returncode or command == "fork", first.stderr
    audit = ("--by", "ops", "--reason", "again")
    argv = {
        "recover": ["recover"],
        "fork": ["fork", "--run-id", "r", "--new-run-id", "r2", "--from-step", "s1", *audit],
        "retry": ["retry", "--run-id", "r", "--new-run-id", "r2", *audit],
    }[command]
    done = subprocess.run(
        [sys.executable, "-m", "effectlog", *argv, *where, *tools, "--json"],
        env={**env, "EL_LINGER": "1"}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert 0 == done.returncode, done.stderr
    json.loads(done.stdout)  # one document, nothing else
    assert 1 == done.stderr.count("a tool's thread, after it returned")


def test_the_console_script_is_the_process_entry_point_as_python_m_effectlog_is() -> None:
    """The lingering-thread cover above lives in ``cli.process_main`` (fd 1 kept on stderr until the
    process exits); ``main()`` in-process gives fd 1 back. Proves: the installed ``effectlog`` command
    is declared with ``process_main``, as ``python -m effectlog`` runs it, not with ``main``."""
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    main_module = (Path(__file__).parent.parent / "src" / "effectlog" / "__main__.py").read_text()

    assert "effectlog.cli:process_main" == pyproject["project"]["scripts"]["effectlog"]
    assert "raise SystemExit(process_main())" in main_module


def test_main_called_in_process_gives_fd_1_back_to_its_caller(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``main()`` from Python (a test with ``capsys``, a program embedding the CLI) must find fd 1 as it
    left it and effectlog's output on its ``sys.stdout``: only ``process_main`` keeps fd 1 on stderr.
    Proves: after an in-process ``run --json`` whose tool wrote to fd 1, fd 1 is the same file as
    before, and the JSON is in what ``capsys`` captured."""
    from effectlog.cli import main

    _, where, tools = _chatty(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = os.fstat(1)
    status = main(["run", str(tmp_path / "plan.json"), *where, *tools, "--json", "--quiet"])
    after = os.fstat(1)

    assert 0 == status
    assert (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)
    assert '"state": "completed"' in capsys.readouterr().out


# -- 1. aliases: the effect store under a second name --------------------------------------------

# An idempotent tool over the built-in effect store that logs whether each call applied the effect
# or was answered from the stored key, and SIGKILLs its own process after the effect when EL_KILL is
# set (the effect committed in the store's WAL, the journal's result not written).
_KILLER_MODULE = """
import os, signal


class Killer:
    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        receipt = self.store.apply_idempotent(request)
        with open(os.environ["EL_LOG"], "a") as log:
            log.write("replayed\\n" if receipt.data.get("replayed") else "applied\\n")
        if os.environ.get("EL_KILL"):
            os.kill(os.getpid(), signal.SIGKILL)
        return receipt


ADAPTERS = {"test.killer": lambda decl, ctx: Killer(ctx.effect_store())}
"""


def test_an_effect_store_reached_by_a_hard_link_never_applies_a_key_twice(tmp_path: Path) -> None:
    """The effect store is SQLite too, and SQLite keeps its WAL beside the name it was opened by: a run
    SIGKILLed after its idempotent effect (committed in ``fx.db-wal``) resumed with ``--effects`` naming
    a hard link of the store read the file without that WAL, did not find the key, and applied the
    effect again (two effects for one key, verify ok), as the journal's own hard-link refusal exists to
    prevent. Proves: the store under a second name is refused (exit 6, one line, nothing sent), and
    resumed under its own name the key is answered from the store: one effect."""
    (tmp_path / "el_killer.py").write_text(_KILLER_MODULE)
    log = tmp_path / "calls.log"
    path = ":".join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "EL_LOG": str(log)}
    plan = {
        "run_id": "pay-1",
        "adapters": {"psp": {"type": "test.killer", "idempotent": True}},
        "steps": [{"id": "charge", "adapter": "psp", "args": {"cents": 500}}],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))

    def run(effects: str, **extra: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "effectlog", "run", str(tmp_path / "plan.json"), "--journal"]
        argv += [str(tmp_path / "j.db"), "--effects", str(tmp_path / effects), "--adapters", "el_killer:ADAPTERS"]
        return subprocess.run(argv, env={**env, **extra}, capture_output=True, text=True, timeout=120)

    EffectStore(str(tmp_path / "fx.db")).close()  # created and checkpointed: its id is in the file itself
    assert -9 == run("fx.db", EL_KILL="1").returncode
    os.link(tmp_path / "fx.db", tmp_path / "alias.db")
    aliased = run("alias.db")
    os.unlink(tmp_path / "alias.db")
    own = run("fx.db")

    assert ExitStatus.LOCKED == aliased.returncode, aliased.stderr
    assert "alias.db" in one_line(aliased.stderr)
    assert (0, ["applied", "replayed"]) == (own.returncode, log.read_text().split())


# -- 4. evidence: another request's effect under the same run, step and attempt ---------------------

_REFUSING_MODULE = """
import os


class MaybeRefused:
    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        if os.environ.get("EL_FAIL"):
            raise ConnectionError("connection reset before the request was sent")
        return self.store.apply_control(request)

    def lookup(self, request):
        return self.store.lookup(request)


ADAPTERS = {"test.maybe-refused": lambda decl, ctx: MaybeRefused(ctx.effect_store())}
"""


def test_a_ledger_row_of_another_request_is_no_evidence_for_this_one(tmp_path: Path) -> None:
    """Run id pay-1 in two journals sharing one effect store (G2's "run id reused in another journal"):
    A charged 5 cents; B's request for 50,000 cents failed before it was sent and stopped uncertain.
    ``reconcile --from-ledger`` on B found A's row under (pay-1, charge, attempt 1) and recorded B's
    charge as applied: an effect that never happened, silently lost, although the store keeps each
    row's body digest (the idempotent path refuses another body under a key). Proves: a row whose
    body is not the request's is no evidence: refused (exit 5, one line, nothing written), B stays
    uncertain, and a person's reconcile is still possible."""
    (tmp_path / "el_refusing.py").write_text(_REFUSING_MODULE)
    path = ":".join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    tools = ("--adapters", "el_refusing:ADAPTERS")

    def plan(name: str, cents: int) -> str:
        steps = [{"id": "charge", "adapter": "psp", "args": {"cents": cents}}]
        raw = {"run_id": "pay-1", "adapters": {"psp": {"type": "test.maybe-refused", "idempotent": False}}}
        (tmp_path / name).write_text(json.dumps({**raw, "steps": steps}))
        return str(tmp_path / name)

    def el(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "effectlog", *args], env={**env, **extra}, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip

    fx = str(tmp_path / "fx.db")
    assert 0 == el("run", plan("a.json", 5), "--journal", str(tmp_path / "a.db"), "--effects", fx, *tools).returncode
    b = ("--journal", str(tmp_path / "b.db"))
    assert 3 == el("run", plan("b.json", 50000), *b, "--effects", fx, *tools, EL_FAIL="1").returncode
    before = el("timeline", *b, "--run-id", "pay-1", "--json").stdout

    done = el("reconcile", *b, "--run-id", "pay-1", "--step", "charge", "--from-ledger", fx)
    after = el("timeline", *b, "--run-id", "pay-1", "--json").stdout

    assert ExitStatus.CONFLICT == done.returncode, done.stderr
    assert "pay-1" in one_line(done.stderr)
    assert before == after


# -- 1. aliases: other spellings of one journal in one process -------------------------------------


def test_proc_fd_paths_and_a_relative_path_after_chdir_meet_the_same_run_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One journal reached as an absolute path, as ``/proc/self/fd/N`` of a descriptor open on it, and
    as a relative path after ``chdir``: each must be the same file to the run locks (a second name
    would mean a second WAL). Proves: all three open (one name after ``realpath``), a claim through one
    refuses the others (exit 6), and verify passes (found nothing: kept as a regression test)."""
    from effectlog.errors import RunOwned
    from effectlog.journal import SqliteJournal

    where = tmp_path / "sub" / "j.db"
    where.parent.mkdir()
    first = SqliteJournal(str(where))
    fd = os.open(where, os.O_RDONLY)
    try:
        via_proc = SqliteJournal(f"/proc/self/fd/{fd}")
        monkeypatch.chdir(tmp_path)
        relative = SqliteJournal("sub/../sub/./j.db")
        first.claim("r")
        refused = []
        for other in (via_proc, relative):
            with pytest.raises(RunOwned):
                other.claim("r")
            refused.append(other.path == first.path)
        for journal in (relative, via_proc, first):
            journal.close()
    finally:
        os.close(fd)  # after the journals: this process's descriptors of the file close together

    assert [True, True] == refused
    assert 0 == effectlog("verify", "--journal", str(where), cwd=tmp_path).returncode


# -- 1. second writers: a tool that opens and closes the journal file in the run's own process ------

# An in-process tool that reads the journal file (a report attaching its header, a backup, a checksum):
# closing its descriptor drops every POSIX lock this process holds on the file, SQLite's included.
_READER_TOOL_MODULE = """
import os, time


class ReadsTheJournal:
    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        if request.args.get("read_journal"):
            with open(os.environ["EL_JOURNAL"], "rb") as f:
                f.read(100)
            open(os.environ["EL_ASKED"], "w").close()
            while not os.path.exists(os.environ["EL_GO"]):
                time.sleep(0.02)
        return self.store.apply_control(request)


ADAPTERS = {"test.reads-journal": lambda decl, ctx: ReadsTheJournal(ctx.effect_store())}
"""

_HOLDER = """
import sys, time
from effectlog.journal import SqliteJournal
journal = SqliteJournal(sys.argv[1])
print("open", flush=True)
sys.stdin.readline()
journal.close()
"""


def test_a_tool_reading_the_journal_file_in_process_loses_no_acknowledged_step(tmp_path: Path) -> None:
    """Run r's first step is an in-process tool that reads the journal file, as a report or backup step
    might: closing its descriptor dropped SQLite's own locks of the run's process on the file. Another
    process driving another run of the journal (one owner per run, not per file) then deleted the WAL
    at its close, r went on committing into the deleted WAL and reported "completed" (exit 0), and with
    a third process holding the journal open (a console, a runner) until r ended, every commit after
    the deletion was lost: s1's result, s2 and s3 (effects applied, verify ok). Proves: r stops at its
    next commit instead (exit 6, one line, nothing more written), and running the plan again finds s1
    uncertain (exit 3), with one effect and no step applied twice."""
    (tmp_path / "el_reader_tool.py").write_text(_READER_TOOL_MODULE)
    journal, fx = str(tmp_path / "j.db"), str(tmp_path / "fx.db")
    path = ":".join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "EL_JOURNAL": journal}
    env |= {"EL_ASKED": str(tmp_path / "asked"), "EL_GO": str(tmp_path / "go")}
    adapters = {"t": {"type": "test.reads-journal", "idempotent": False}}
    steps = [{"id": f"s{i}", "adapter": "t", "args": {"read_journal": i == 1, "i": i}} for i in (1, 2, 3)]
    (tmp_path / "r.json").write_text(json.dumps({"run_id": "r", "adapters": adapters, "steps": steps}))
    other = [{"id": "o1", "adapter": "t", "args": {"i": 0}}]
    (tmp_path / "o.json").write_text(json.dumps({"run_id": "o", "adapters": adapters, "steps": other}))
    tools = ("--journal", journal, "--effects", fx, "--adapters", "el_reader_tool:ADAPTERS")

    def run(plan: str) -> list[str]:
        return [sys.executable, "-m", "effectlog", "run", str(tmp_path / plan), *tools]

    a = subprocess.Popen(run("r.json"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "asked").exists():
        assert a.poll() is None, a.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert 0 == subprocess.run(run("o.json"), env=env, capture_output=True, timeout=120).returncode
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, journal], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert "open" == holder.stdout.readline().strip()
    (tmp_path / "go").touch()
    first = a.communicate(timeout=120)
    holder.communicate("\n", timeout=60)
    again = subprocess.run(run("r.json"), env=env, capture_output=True, text=True, timeout=120)
    store = EffectStore(fx, read_only=True)
    effects = sorted(row.step_id for row in store.rows(run_id="r"))
    store.close()

    assert ExitStatus.LOCKED == a.returncode, first[1]
    assert "journal_wal_lost" in first[1].strip().splitlines()[-1]
    assert (ExitStatus.STOPPED_UNCERTAIN, ["s1"]) == (again.returncode, effects), again.stderr
    assert 0 == subprocess.run([sys.executable, "-m", "effectlog", "verify", "--journal", journal], env=env).returncode


# -- 3. keys: arguments JSON cannot tell apart ---------------------------------------------------


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
def test_a_durable_call_with_a_non_finite_float_is_refused_not_taken_for_none(tmp_path: Path, value: float) -> None:
    """Canonical JSON writes NaN and both infinities as ``null``: ``pay(inf)`` and ``pay(None)`` had one
    fingerprint, one approval hash and one body digest, so a later pass calling ``pay(None)`` was given
    ``pay(inf)``'s recorded result (a call that never ran reported as done) instead of a divergence.
    Proves: such a call is refused before anything is recorded or run (BadInput naming the value), as a
    plan's NaN or Infinity is, and ``pay(None)`` in the same run then runs for real."""
    from effectlog import durable
    from effectlog.errors import BadInput

    calls: list[object] = []

    @durable.tool(idempotent=True)
    def pay(amount: float | None, idempotency_key: str = "") -> str:
        calls.append(amount)
        return f"paid {amount}"

    journal = str(tmp_path / "d.db")
    with durable.run("n1", journal=journal):
        with pytest.raises(BadInput, match="finite"):
            pay(value)
        second = pay(None)

    assert ("paid None", [None]) == (second, calls)
