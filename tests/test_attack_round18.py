"""Round-18 attacks on the user's side: hostile tools, keys and evidence, the run's life cycle, the
framework integrations and CLI inputs, with cases earlier rounds had not tried. Each test is one
suspicion: a failing reproduction first where it found a defect, kept as a short regression test where
it found none but guards a plausible mistake. Real SQLite files and real ``python -m effectlog``
processes where the CLI is the point.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import journal_tamper
from hardening_kit import SAFETY_TIMEOUT_S, cli_env

# A user adapter module: each send is appended to sends.jsonl (step, key) before the tool does what its
# mode says. ``slow`` marks its start in a file, then sleeps: a signal is sent while it runs.
TOOLS = """
import json
import os
import signal
import sys
import time


class Hostile:
    def __init__(self, options):
        self.mode = options["mode"]
        self.blocking = options.get("blocking", True)

    def invoke(self, request):
        with open("sends.jsonl", "a") as fh:
            fh.write(json.dumps([request.step_id, request.idempotency_key]) + "\\n")
        mode = self.mode
        if mode == "block-signals":  # a library that masks signals around its work and forgets to unmask
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        elif mode == "low-recursion-limit":  # a library that lowers the limit for its own recursion guard
            lowest = 1
            while True:  # the lowest limit allowed here (the depth of this frame), plus a few frames
                try:
                    sys.setrecursionlimit(lowest)
                    break
                except RecursionError:
                    lowest += 1
            sys.setrecursionlimit(lowest + 5)
        elif mode == "chdir":  # a tool that works in its own directory and never goes back
            os.chdir(os.environ.get("WORKDIR", "work"))
        elif mode == "exec":  # replaces the process with another program (a wrapper's "exec" done in Python)
            os.execv("/bin/sh", ["sh", "-c", "exit 0"])
        elif mode == "ship":  # the carrier is down until carrier-up exists: nothing shipped
            if not os.path.exists("carrier-up"):
                from effectlog.errors import NotApplied

                raise NotApplied("carrier down")
        elif mode == "lost":  # the reply is lost: the outcome is unknown
            raise ConnectionError("reply lost")
        elif mode == "slow":  # in flight until the test creates slow-go (two minutes at most)
            open("slow-started", "w").close()
            for _ in range(6000):
                if os.path.exists("slow-go"):
                    break
                time.sleep(0.02)
        elif mode != "ok":
            raise AssertionError(mode)
        return {"ok": True}


    def lookup(self, request):
        how = os.environ["LOOKUP"]
        if how == "exit":  # a helper built on a CLI library, which ends with sys.exit(0) when it is done
            sys.exit(0)
        if how == "generator-exit":
            raise GeneratorExit("closed")
        raise AssertionError(how)


def build(decl, ctx):
    if os.environ.get("HOLD_BUILD"):  # this process's adapters are built only once "go" exists
        open("building", "w").close()
        for _ in range(6000):
            if os.path.exists("go"):
                break
            time.sleep(0.02)
    return Hostile(decl.options)


ADAPTERS = {"hostile": build}

if os.environ.get("FORK_TURN_MARK"):  # a fork says when it comes to the retry turn (it waits there if held)
    import contextlib

    from effectlog.lifecycle import fork as _fork

    _fork_turn = _fork.fork_turn

    @contextlib.asynccontextmanager
    async def _marked_turn(journal, run_id, *args, **kwargs):
        open(os.environ["FORK_TURN_MARK"], "w").close()
        async with _fork_turn(journal, run_id, *args, **kwargs):
            yield

    _fork.fork_turn = _marked_turn
"""


class World:
    """A directory with the hostile tools module, a plan, and ``effectlog`` to run in it."""

    def __init__(self, where: Path) -> None:
        self.dir = where
        (where / "hostile18_tools.py").write_text(TOOLS)
        self.env = cli_env({"PYTHONPATH": str(where)})

    def plan(self, *steps: tuple[str, str, bool], idempotent: bool = False) -> None:
        """Steps as ``(id, mode, blocking)``, each with an adapter of its own."""
        adapters = {
            sid: {"type": "hostile", "idempotent": idempotent, "options": {"mode": mode, "blocking": blocking}}
            for sid, mode, blocking in steps
        }
        plan = {"run_id": "r", "adapters": adapters, "steps": [{"id": sid, "adapter": sid} for sid, _, _ in steps]}
        (self.dir / "plan.json").write_text(json.dumps(plan))

    def argv(self, *argv: str) -> list[str]:
        return [sys.executable, "-m", "effectlog", *argv]

    def effectlog(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(*argv),
            cwd=self.dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=SAFETY_TIMEOUT_S,
            check=False,
        )

    RUN = ("run", "plan.json", "--journal", "j.db", "--adapters", "hostile18_tools:ADAPTERS")

    def run(self) -> subprocess.CompletedProcess[str]:
        return self.effectlog(*self.RUN)

    def sends(self) -> list[str]:
        path = self.dir / "sends.jsonl"
        return [json.loads(line)[0] for line in path.read_text().splitlines()] if path.exists() else []

    def states(self) -> list[tuple[str, str]]:
        done = self.effectlog("status", "--journal", "j.db", "--run-id", "r", "--json")
        assert 0 == done.returncode, done.stderr
        return [(s["id"], s["state"]) for s in json.loads(done.stdout)["steps"]]

    def verified(self) -> None:
        done = self.effectlog("verify", "--journal", "j.db")
        assert 0 == done.returncode, done.stdout + done.stderr


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _one_line(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr


# -- (1) hostile tools: process state effectlog relies on -----------------------------------------


def test_a_tool_that_blocks_the_stop_signals_does_not_take_effectlogs_graceful_stop_away(world: World) -> None:
    """An in-process tool that blocks SIGINT/SIGTERM in the main thread's signal mask (a library masking
    signals around its work and never unmasking) must not swallow effectlog's graceful stop: a SIGTERM
    during a later step still stops the run after that step's commit (exit 143), the next step is not
    sent, and running the plan again sends it once. The mask was left blocked: the SIGTERM waited for
    ever, every remaining step was sent and the run exited 0."""
    world.plan(("mask", "block-signals", False), ("slow", "slow", True), ("last", "ok", False))
    child = subprocess.Popen(
        world.argv(*World.RUN), cwd=world.dir, env=world.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        marker = world.dir / "slow-started"
        for _ in range(int(SAFETY_TIMEOUT_S / 0.02)):
            if marker.exists() or child.poll() is not None:
                break
            subprocess.run(["sleep", "0.02"], check=True)
        child.send_signal(signal.SIGTERM)  # during the slow step, however long the machine took to get there
        (world.dir / "slow-go").touch()
        _, stderr = child.communicate(timeout=SAFETY_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert 128 + signal.SIGTERM == child.returncode, stderr
    _one_line(stderr)
    assert ["mask", "slow"] == world.sends()
    assert [("mask", "confirmed"), ("slow", "confirmed")] == world.states()  # "last" never requested
    again = world.run()
    assert 0 == again.returncode, again.stderr
    assert ["mask", "slow", "last"] == world.sends()
    world.verified()


@pytest.mark.parametrize("blocking", [True, False], ids=["thread", "inline"])
def test_a_tool_that_lowers_the_recursion_limit_does_not_end_the_run_after_its_effect(
    world: World, blocking: bool
) -> None:
    """A tool that lowers ``sys.setrecursionlimit`` (a library's recursion guard, set for the process and
    never put back) must not make effectlog's own commit of its result fail: the step is confirmed, the
    run goes on and completes, each step sent once. The commit raised ``RecursionError``: a traceback,
    exit 1, the step left requested after its effect (uncertain for the next run)."""
    world.plan(("pay", "low-recursion-limit", blocking), ("after", "ok", blocking))
    done = world.run()
    assert 0 == done.returncode, done.stderr
    _one_line(done.stderr)
    assert ["pay", "after"] == world.sends()
    assert [("pay", "confirmed"), ("after", "confirmed")] == world.states()
    world.verified()


@pytest.mark.parametrize("blocking", [True, False], ids=["thread", "inline"])
def test_a_tool_that_execs_another_program_leaves_the_step_uncertain_for_the_next_run(
    world: World, blocking: bool
) -> None:
    """A tool that calls ``os.execv`` replaces the process: effectlog's exit status is gone with it (the
    new program's, here 0, is what the caller sees), as with ``os._exit``. Regression; nothing found: the
    journal holds the intent, and the next run finds the step uncertain (exit 3) instead of sending it
    again, and verifies."""
    world.plan(("pay", "exec", blocking), ("after", "ok", blocking))
    world.run()
    assert ["pay"] == world.sends()
    again = world.run()
    assert 3 == again.returncode, again.stderr
    assert ["pay"] == world.sends()
    assert [("pay", "uncertain")] == world.states()
    world.verified()


# -- (2) notifications from a directory whose name is not UTF-8 -----------------------------------


def test_a_run_in_a_directory_whose_name_is_not_utf8_still_notifies_with_a_command_that_works(
    tmp_path: Path,
) -> None:
    """``effectlog run --journal j.db --notify-command CMD`` in a directory named in Latin-1 (an old share,
    an archive unpacked as is): the notification names the journal by its absolute path, which holds a
    byte that is not UTF-8, and encoding it failed, so the person was never told the run waits ("not
    delivered: UnicodeEncodeError"). Proves: the notification is delivered, and the approve command it
    carries journals the approval when pasted in the run's directory (the CLI takes UTF-8 paths only)."""
    where = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    where.mkdir()
    plan = {
        "run_id": "r",
        "adapters": {"n": {"type": "noop", "idempotent": True}},
        "steps": [{"id": "a", "adapter": "n"}, {"id": "b", "adapter": "n", "approval": "required"}],
    }
    (where / "plan.json").write_text(json.dumps(plan))
    hook = "cat > note.json"
    argv = [sys.executable, "-m", "effectlog", "run", "plan.json", "--journal", "j.db", "--notify-command", hook]
    done = subprocess.run(
        argv, cwd=where, env=cli_env(), capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S, check=False
    )
    assert 4 == done.returncode, done.stderr
    assert "not delivered" not in done.stderr, done.stderr
    note = json.loads((where / "note.json").read_text())
    assert ("suspended", "r", "b") == (note["kind"], note["run_id"], note["step_id"])
    command = note["command"].replace("NAME", "olga", 1)
    approved = subprocess.run(
        f"{sys.executable} -m {command}", shell=True, cwd=where, env=cli_env(),
        capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert 0 == approved.returncode, approved.stderr


def test_a_notification_after_a_tool_changed_the_working_directory_names_the_runs_own_journal(
    world: World,
) -> None:
    """A tool that changes the working directory (``os.chdir("work")``) and a later step held for approval:
    the notification made the relative ``--journal j.db`` absolute only when it was sent, in the tool's
    directory, and named ``work/j.db``, another journal. There, a run of the same plan held at the same
    step took the pasted approve command (exit 0), and the run that notified went on waiting. Proves: the
    notification names the journal the run was opened at, and its command approves that run."""
    plan = {
        "run_id": "r",
        "adapters": {
            "t": {"type": "hostile", "idempotent": False, "options": {"mode": "chdir"}},
            "n": {"type": "noop", "idempotent": True},
        },
        "steps": [{"id": "a", "adapter": "t"}, {"id": "b", "adapter": "n", "approval": "required"}],
    }
    (world.dir / "plan.json").write_text(json.dumps(plan))
    work = world.dir / "work"
    work.mkdir()
    other = {**plan, "adapters": {**plan["adapters"], "t": {"type": "noop", "idempotent": False}}}
    (work / "plan.json").write_text(json.dumps(other))
    there = subprocess.run(
        world.argv("run", "plan.json", "--journal", "j.db"), cwd=work, env=world.env,
        capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert 4 == there.returncode, there.stderr  # another journal, its run held at the same step
    done = world.effectlog(*World.RUN, "--notify-command", "cat > ../note.json")
    assert 4 == done.returncode, done.stderr
    note = json.loads((world.dir / "note.json").read_text())
    assert os.path.realpath(world.dir / "j.db") == os.path.realpath(note["journal"])
    elsewhere = world.dir.parent
    approved = subprocess.run(
        f"{sys.executable} -m {note['command'].replace('NAME', 'olga', 1)}", shell=True, cwd=elsewhere,
        env=world.env, capture_output=True, text=True, timeout=SAFETY_TIMEOUT_S, check=False,
    )  # fmt: skip
    assert 0 == approved.returncode, approved.stderr
    resumed = world.run()
    assert 0 == resumed.returncode, resumed.stderr
    assert [("a", "confirmed"), ("b", "confirmed")] == world.states()


# -- (3) evidence: a lookup that ends its call without an answer -----------------------------------


@pytest.mark.parametrize("how", ["exit", "generator-exit"])
@pytest.mark.parametrize("blocking", [True, False], ids=["thread", "inline"])
def test_a_lookup_that_exits_instead_of_answering_leaves_the_step_uncertain_with_exit_3(
    world: World, how: str, blocking: bool
) -> None:
    """``reconcile --lookup`` whose lookup calls ``sys.exit(0)`` (a helper built on a CLI library) or raises
    another ``BaseException``: the lookup gave no answer, so the step stays uncertain, nothing is written,
    and the command says so in one line with exit 3, as for a lookup that raises. It exited 0, silently
    (or with a traceback), and a script reading the status took the step as reconciled."""
    world.plan(("pay", "lost", blocking))
    assert 3 == world.run().returncode
    world.env["LOOKUP"] = how
    done = world.effectlog(
        "reconcile", "--journal", "j.db", "--run-id", "r", "--step", "pay", "--lookup",
        "--adapters", "hostile18_tools:ADAPTERS",
    )  # fmt: skip
    assert 3 == done.returncode, done.stderr
    _one_line(done.stderr)
    assert "lookup failed" in done.stderr, done.stderr
    assert [("pay", "uncertain")] == world.states()


# -- (4) the run's life cycle: a fork and a retry of one run at once -------------------------------


def test_a_fork_landing_while_a_retry_checks_and_writes_its_fork_does_not_make_the_retry_run_twice(
    world: World,
) -> None:
    """``effectlog retry`` of a failed run, while a colleague runs ``effectlog fork`` of it in another
    process. A run is retried once: a retry of a run that has a fork is refused, since the fork carries on
    its work and the retry would make its remaining steps again under new keys. The retry checked for forks,
    then built its adapters and wrote its fork; a fork written in between was not seen, and both forks sent
    ``email`` (two effects, verify ok). Proves: the fork is written before the retry checks (the retry is
    then refused) or after the retry's fork (a fork on purpose, as documented), never in between."""
    world.plan(("ship", "ship", False), ("email", "ok", False))
    assert 1 == world.run().returncode  # failed at ship, nothing shipped; email never sent
    (world.dir / "carrier-up").touch()
    retry = subprocess.Popen(
        world.argv("retry", "--journal", "j.db", "--run-id", "r", "--by", "ann", "--reason", "carrier up",
                   "--adapters", "hostile18_tools:ADAPTERS"),
        cwd=world.dir, env={**world.env, "HOLD_BUILD": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        for _ in range(int(SAFETY_TIMEOUT_S / 0.02)):
            if (world.dir / "building").exists() or retry.poll() is not None:
                break
            subprocess.run(["sleep", "0.02"], check=True)
        fork = subprocess.Popen(
            world.argv("fork", "--journal", "j.db", "--run-id", "r", "--new-run-id", "r2", "--by", "bob",
                       "--reason", "again", "--adapters", "hostile18_tools:ADAPTERS"),
            cwd=world.dir, env={**world.env, "FORK_TURN_MARK": str(world.dir / "fork-at-turn")},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # Unfixed, the fork is done before the retry's build ends; fixed, it waits for the retry's turn.
        for _ in range(int(SAFETY_TIMEOUT_S / 0.02)):
            if fork.poll() is not None or (world.dir / "fork-at-turn").exists():
                break
            subprocess.run(["sleep", "0.02"], check=True)
        else:
            raise AssertionError("the fork neither ended nor came to the retry turn")
        (world.dir / "go").touch()
        retried = retry.communicate(timeout=SAFETY_TIMEOUT_S)
        forked = fork.communicate(timeout=SAFETY_TIMEOUT_S)
    finally:
        for proc in (retry, fork):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    with journal_tamper.connect(world.dir / "j.db") as db:
        made = [row[0] for row in db.execute("SELECT run_id FROM runs ORDER BY run")]
    if "r.retry1" in made:
        assert 0 == retry.returncode, retried
        # the retry's fork exists: any other fork came after it (on purpose), not before it
        assert made.index("r.retry1") < made.index("r2") if "r2" in made else True, made
    else:
        assert (5, 0) == (retry.returncode, fork.returncode), (retried, forked)
    world.verified()


# -- (5) CLI output: a stdout that cannot take it --------------------------------------------------


@pytest.mark.parametrize("command", ["run", "status", "verify", "timeline"])
def test_a_stdout_on_a_full_disk_is_one_line_and_a_documented_exit_status(world: World, command: str) -> None:
    """``effectlog run plan.json --json > out.json`` (or ``status``, ``verify``, ``timeline``) with the
    output file on a full disk (``/dev/full``): the output is lost, so the command says so in one line
    naming stdout and exits 2 (``output_unwritable``), the run itself as it was (completed, verified). It
    ended with a traceback and exit 1, which reads as "the run failed"."""
    world.plan(("pay", "ok", False))
    argv = {
        "run": (*World.RUN, "--json"),
        "status": ("status", "--journal", "j.db"),
        "verify": ("verify", "--journal", "j.db"),
        "timeline": ("timeline", "--journal", "j.db", "--run-id", "r"),
    }[command]
    if command != "run":
        assert 0 == world.run().returncode
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            world.argv(*argv), cwd=world.dir, env=world.env, stdout=full, stderr=subprocess.PIPE, text=True,
            timeout=SAFETY_TIMEOUT_S, check=False,
        )  # fmt: skip
    assert 2 == done.returncode, done.stderr
    _one_line(done.stderr)
    assert "output_unwritable: stdout:" in done.stderr, done.stderr
    assert [("pay", "confirmed")] == world.states()
    world.verified()


# -- (6) keys: an application that retries a durable call itself ----------------------------------


def test_an_idempotent_durable_call_retried_by_the_application_is_not_sent_again_under_a_new_key(
    tmp_path: Path,
) -> None:
    """``@durable.tool(idempotent=True)`` whose reply is lost after its effect (the charge went through):
    the call raises, its intent stays (the next pass sends the same key), and the application, as most
    code does, catches the error and calls it again with the same args. That second call was a new step
    with a new key: the provider, deduplicating by key, charged twice. Proves: in the pass where the first
    call's outcome is unknown, the same call again is refused (``RunUnfinished``, nothing sent); the next
    pass sends the first key again, and the provider sees one key, one charge."""
    from effectlog import durable
    from effectlog.errors import RunUnfinished

    keys: list[str] = []

    @durable.tool(idempotent=True)
    def charge(amount: int, idempotency_key: str = "") -> dict[str, int]:
        keys.append(idempotency_key)
        if len(keys) == 1:
            raise ConnectionError("reply lost")  # the charge went through; its reply did not
        return {"charged": amount}

    def pay() -> None:
        with durable.run("order-1", journal=journal):
            for _ in range(3):  # the application's own retry loop
                try:
                    charge(5)
                    break
                except ConnectionError:
                    continue

    journal = tmp_path / "runs.db"
    with pytest.raises(RunUnfinished):
        pay()
    assert 1 == len(keys)
    with durable.run("order-1", journal=journal):
        assert {"charged": 5} == charge(5)
    assert [keys[0], keys[0]] == keys  # one key: the provider charged once


# -- (7) framework integrations: the SDK's error-to-model conversion -------------------------------


def test_an_openai_agents_tool_whose_reply_is_lost_is_uncertain_not_a_message_the_model_retries(
    tmp_path: Path,
) -> None:
    """The OpenAI Agents SDK's default ``@function_tool`` turns a tool's exception into a message for the
    model ("An error occurred while running the tool. Please try again."). Under ``DurableRunner`` that
    message was recorded as the call's result, confirmed: a charge whose reply was lost after it went
    through was a completed step, the model tried again under a new call id, and the customer was charged
    twice (the run completed, verify ok). Proves: with the SDK's defaults, the exception reaches effectlog:
    the step is uncertain, the pass raises ``UncertainEffect`` with the reconcile command, and nothing is
    sent again, in this pass or the next."""
    from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    from effectlog.errors import UncertainEffect
    from effectlog.integrations.openai_agents import DurableRunner, idempotency_key
    from provider_standin import ProviderStandIn

    set_tracing_disabled(True)
    effects: list[str] = []

    @function_tool
    def charge(to: str, amount: int) -> str:
        """Charge a customer (not idempotent)."""
        effects.append(idempotency_key())
        if len(effects) == 1:
            raise ConnectionError("reply lost")  # the charge went through; its reply did not
        return f"charged {amount} to {to}"

    provider = ProviderStandIn([("charge", {"to": "bob", "amount": 5}), ("charge", {"to": "bob", "amount": 5}), "done"])
    provider.start()
    try:
        client = AsyncOpenAI(base_url=provider.url, api_key="test", max_retries=0)
        model = OpenAIChatCompletionsModel(model="stand-in", openai_client=client)
        agent = Agent(name="billing", instructions="Charge customers.", model=model, tools=[charge])
        runner = DurableRunner(journal=tmp_path / "runs.db")
        for _ in range(2):
            with pytest.raises(UncertainEffect) as caught:
                runner.run_sync(agent, "charge bob 5", run_id="order-7")
            assert "effectlog reconcile --journal" in str(caught.value)
    finally:
        provider.stop()
    assert 1 == len(effects)


def test_an_openai_agents_call_whose_arguments_the_sdk_refuses_is_not_applied_and_the_model_is_told(
    tmp_path: Path,
) -> None:
    """The other half of the fix above: arguments the tool's schema refuses (``amount`` missing) fail the
    SDK's own check before the function runs, so that call is "not applied" (a failed step, the model told
    why), not an uncertain one, and the run goes on to the model's answer."""
    from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    from effectlog.integrations.openai_agents import DurableRunner
    from effectlog.session import SqliteCheckpointer
    from provider_standin import ProviderStandIn

    set_tracing_disabled(True)
    effects: list[str] = []

    @function_tool
    def charge(to: str, amount: int) -> str:
        """Charge a customer (not idempotent)."""
        effects.append(to)
        return f"charged {amount} to {to}"

    provider = ProviderStandIn([("charge", {"to": "bob"}), "done"])
    provider.start()
    try:
        client = AsyncOpenAI(base_url=provider.url, api_key="test", max_retries=0)
        model = OpenAIChatCompletionsModel(model="stand-in", openai_client=client)
        agent = Agent(name="billing", instructions="Charge customers.", model=model, tools=[charge])
        result = DurableRunner(journal=tmp_path / "runs.db").run_sync(agent, "charge bob", run_id="order-7")
    finally:
        provider.stop()
    assert "done" == result.final_output
    assert [] == effects
    store = SqliteCheckpointer(tmp_path / "runs.db")
    try:
        step = store.state("order-7").step("tool-1-call_0")
    finally:
        store.close()
    assert step is not None
    assert ("failed", False) == (step.state, step.applied)
    assert "Invalid JSON input for tool charge" in (step.reason or "")


# -- (8) a fleet runner whose tool changed the working directory -----------------------------------


def test_a_runners_relative_effect_store_stays_the_one_it_started_with_after_a_tool_changes_directory(
    world: World,
) -> None:
    """``effectlog runner --store s.db --effects fx.db``: a request's tool changes the working directory
    and stays there. Each attempt opened ``fx.db`` anew, relative to wherever the process was by then:
    the next request's keys went into a new, empty store in the tool's directory, pinned by its runs, and
    the store the runner was given never saw them (its ledger, and ``--from-ledger``, said nothing of those
    effects). Proves: every attempt's keys land in the store the runner was started with, and nothing is
    made in the tool's directory."""
    work = world.dir / "work"
    work.mkdir()
    first = {
        "run_id": "a",
        "adapters": {
            "cd": {"type": "hostile", "idempotent": False, "options": {"mode": "chdir"}},
            "fx": {"type": "effects.idempotent", "idempotent": True},
        },
        "steps": [{"id": "cd", "adapter": "cd"}, {"id": "pay", "adapter": "fx"}],
    }
    second = {
        "run_id": "b",
        "adapters": {"fx": {"type": "effects.idempotent", "idempotent": True}},
        "steps": [{"id": "pay", "adapter": "fx"}],
    }
    for key, plan in (("1", first), ("2", second)):
        (world.dir / f"p{key}.json").write_text(json.dumps(plan))
        submitted = world.effectlog("submit", f"p{key}.json", "--store", "s.db", "--scope", "t", "--key", key)
        assert 0 == submitted.returncode, submitted.stderr
    world.env["WORKDIR"] = str(work)
    ran = world.effectlog(
        "runner", "--store", "s.db", "--effects", "fx.db", "--adapters", "hostile18_tools:ADAPTERS",
        "--exit-when-idle", "-q", "--capacity", "1",
    )  # fmt: skip
    assert 0 == ran.returncode, ran.stderr
    assert [] == sorted(p.name for p in work.iterdir())
    ledger = world.effectlog("effects", "--effects", "fx.db", "--json")
    assert 0 == ledger.returncode, ledger.stderr
    assert ["a", "b"] == sorted(row["run_id"] for row in json.loads(ledger.stdout))


@pytest.mark.parametrize("given", [str, Path], ids=["str", "Path"])
def test_a_durable_agents_relative_journal_stays_put_when_a_tool_changes_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: Any
) -> None:
    """``DurableAgent(agent, journal="runs.db")`` opens its journal at each ``run``. A tool that changes the
    working directory (a library working in its own directory) moved the next pass's journal: the replay
    of the completed run opened a new, empty ``work/runs.db``, found no run, and made the charge again.
    Proves: every pass of the agent uses the journal it was given, where it was given; the replay calls
    nothing."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from effectlog.integrations.pydantic_ai import DurableAgent

    monkeypatch.chdir(tmp_path)  # put back after the test, wherever the tool left the process
    (tmp_path / "work").mkdir()
    charges: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(m, ModelResponse) for m in messages):
            return ModelResponse(parts=[ToolCallPart("charge", {"who": "bob"}, tool_call_id="a")])
        return ModelResponse(parts=[TextPart("done")])

    agent: Agent[None, str] = Agent(FunctionModel(model), output_type=str)

    @agent.tool_plain
    def charge(who: str) -> str:
        charges.append(who)
        os.chdir(tmp_path / "work")
        return f"charged {who}"

    durable = DurableAgent(agent, journal=given("runs.db"))
    assert "done" == durable.run_sync("go", run_id="order-1").output
    assert "done" == durable.run_sync("go", run_id="order-1").output
    assert ["bob"] == charges
    assert [] == list((tmp_path / "work").iterdir())


def test_a_keyword_connection_string_given_as_a_journal_or_store_is_still_refused_not_made_absolute(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The two fixes above make a relative journal or store path absolute up front. A PostgreSQL
    connection string in keyword form (``host=db dbname=shop``) is no path: made "absolute" it would pass
    for a file name and become a SQLite file of that name, where hosts meant to share one database each
    drove the run. Proves: ``DurableAgent`` still refuses it (``location_ambiguous``), a runner's attempt
    given it as ``--effects`` fails, and no file is made."""
    from pydantic_ai import Agent
    from pydantic_ai.models.test import TestModel

    from effectlog.errors import LocationAmbiguous
    from effectlog.integrations.pydantic_ai import DurableAgent

    monkeypatch.chdir(world.dir)
    with pytest.raises(LocationAmbiguous):
        DurableAgent(Agent(TestModel()), journal="host=db dbname=shop").run_sync("go", run_id="r")
    assert [] == list(world.dir.glob("host=*"))
    plan = {
        "run_id": "b",
        "adapters": {"fx": {"type": "effects.idempotent", "idempotent": True}},
        "steps": [{"id": "pay", "adapter": "fx"}],
    }
    (world.dir / "p.json").write_text(json.dumps(plan))
    assert 0 == world.effectlog("submit", "p.json", "--store", "s.db", "--scope", "t", "--key", "1").returncode
    ran = world.effectlog("runner", "--store", "s.db", "--effects", "host=db dbname=fx", "--exit-when-idle", "-q")
    assert "attempt 1: failed" in ran.stderr, ran.stderr  # its store refused when the attempt opened it
    assert [] == list(world.dir.glob("host=*"))
