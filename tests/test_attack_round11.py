"""Round-11 attacks: the user's world (hostile tools, user lookups and evidence, odd plans and CLI inputs,
the framework integrations) with cases nobody had tried. Each test is one suspicion, a failing
reproduction first where it found a defect, kept as a regression test where it found none. Real SQLite
files, real processes (``python -m effectlog``) where the CLI is the point.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import journal_tamper
from hardening_kit import SAFETY_TIMEOUT_S, cli_env, last_line

# A user adapter module: each send is written to sends.jsonl (step, key, the body as the tool got it)
# before the tool does what its mode says.
TOOLS = '''
import dataclasses
import json
import os

from effectlog.adapters import Evidence
from effectlog.errors import NotApplied


class BadStr(Exception):
    def __str__(self):
        raise ValueError("no str for you")


@dataclasses.dataclass
class Quote:
    """A result read through a property-like field: each read answers anew (a live view, a cache that
    expires), and with ``expires`` the second read raises."""

    price: int = 0
    expires: bool = False

    def __getattribute__(self, name):
        if name != "price":
            return object.__getattribute__(self, name)
        reads = object.__getattribute__(self, "__dict__").setdefault("_reads", [])
        reads.append(1)
        if len(reads) > 1 and object.__getattribute__(self, "expires"):
            raise RuntimeError("quote expired")
        return len(reads)


class Hostile:
    def __init__(self, options):
        self.mode = options["mode"]
        self.blocking = options.get("blocking", True)
        self.applied = options.get("applied")

    def invoke(self, request):
        with open("sends.jsonl", "a") as fh:
            fh.write(json.dumps([request.step_id, request.idempotency_key, request.args]) + "\\n")
        mode = self.mode
        if mode == "mutate":
            # Normalises its args in place and takes the token out before logging: a lost reply after it.
            request.args["amount"] = request.args["amount"] * 100
            token = request.args.pop("token")
            request.args.setdefault("tags", []).append("charged")
            if sum(1 for _ in open("sends.jsonl")) < 3:
                raise ConnectionError(f"reply lost (token {token})")
            return {"ok": True}
        if mode == "str-raises":
            raise BadStr()
        if mode == "surrogate":
            raise OSError("cannot read " + os.fsdecode(b"/srv/in/\\xff.csv"))  # a Latin-1 file name
        if mode == "not-applied-surrogate":
            raise NotApplied("refused \\udcff.csv")
        if mode == "raise":
            raise ConnectionError("reply lost")
        if mode == "close-stderr":  # a library's clean-up, or a redirect_stderr whose file was closed
            import sys

            sys.stderr.close()
            return {"ok": True}
        if mode == "chdir":  # a tool that works in its own directory and never goes back
            os.chdir(request.args["to"])
            return {"ok": True}
        if mode == "fork":  # a child that forgets os._exit and returns into effectlog
            if os.fork() == 0:
                return {"who": "child"}
            os.wait()
            return {"who": "parent"}
        if mode == "own-sigterm":  # a library's own "graceful shutdown" handler, installed in passing
            import signal

            signal.signal(signal.SIGTERM, lambda signum, frame: None)
            return {"ok": True}
        if mode == "sigterm-me":  # the service manager stopping the service while this step runs
            import signal

            os.kill(os.getpid(), signal.SIGTERM)
            return {"ok": True}
        if mode == "closerange":  # a daemonising helper: close every descriptor past the standard three
            os.closerange(3, 65536)
            return {"ok": True}
        if mode in ("live-view", "expiring"):
            return {"quote": Quote(expires=mode == "expiring")}
        raise AssertionError(mode)

    def lookup(self, request):
        return Evidence(applied=self.applied, detail="asked the provider")


ADAPTERS = {"hostile": lambda decl, ctx: Hostile(decl.options)}
'''


class World:
    """A directory with the hostile tools module, a plan, and ``effectlog`` to run in it."""

    def __init__(self, where: Path) -> None:
        self.dir = where
        (where / "hostile_tools.py").write_text(TOOLS)
        self.env = cli_env({"PYTHONPATH": str(where)})

    def plan(self, mode: str, *, idempotent: bool, sends: int = 1, **step: Any) -> None:
        options: dict[str, Any] = {"mode": mode, **step.pop("options", {})}
        pay: dict[str, Any] = {"id": "pay", "adapter": "tool", **step}
        if sends > 1:
            pay["retry"] = {"attempts": sends, "backoff_base_s": 0, "backoff_cap_s": 0}
        plan = {
            "run_id": "r",
            "adapters": {"tool": {"type": "hostile", "idempotent": idempotent, "options": options}},
            "steps": [pay],
        }
        (self.dir / "plan.json").write_text(json.dumps(plan))

    def effectlog(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "effectlog", *argv],
            cwd=self.dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=SAFETY_TIMEOUT_S,
            check=False,
        )

    def run(self) -> subprocess.CompletedProcess[str]:
        return self.effectlog("run", "plan.json", "--journal", "j.db", "--adapters", "hostile_tools:ADAPTERS")

    def sends(self) -> list[list[Any]]:
        path = self.dir / "sends.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def status(self) -> dict[str, Any]:
        done = self.effectlog("status", "--journal", "j.db", "--run-id", "r", "--json")
        assert 0 == done.returncode, done.stderr
        status: dict[str, Any] = json.loads(done.stdout)
        return status

    def journal_bytes(self) -> bytes:
        with journal_tamper.connect(self.dir / "j.db") as db:
            return b"".join(bytes(row[0]) for row in db.execute("SELECT body FROM ev"))


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def _steps(status: dict[str, Any]) -> list[tuple[str, str]]:
    return [(s["id"], s["state"]) for s in status["steps"]]


# -- (1) hostile tools -------------------------------------------------------------------------------


def test_a_tool_mutating_its_request_args_gets_the_recorded_body_on_every_send(world: World) -> None:
    """An idempotent tool that edits ``request.args`` in place (scales the amount, pops the secret token,
    appends a tag) and then loses its reply: the plan's own args were handed to it, so each re-send of
    the same key carried another body (amount 500, then 50,000, no token: a key bound to one body reused
    for others), and the error text was redacted against the edited args, so the secret token was written
    to the journal in clear. Proves: every send of the key gets exactly the body the journal digested,
    and the secret never reaches the journal."""
    world.plan("mutate", idempotent=True, sends=3, args={"amount": 5, "token": "tok-SECRET-1"}, secret=["token"])

    done = world.run()
    sent = world.sends()

    assert 0 == done.returncode, done.stderr
    assert [["pay", sent[0][1], {"amount": 5, "token": "tok-SECRET-1"}]] * 3 == sent
    assert b"tok-SECRET-1" not in world.journal_bytes()


def test_a_durable_tool_retried_within_its_call_gets_the_args_it_was_called_with(tmp_path: Path) -> None:
    """``@durable.tool(idempotent=True, retry=2)`` whose body appends to a list arg and sets a key of a
    dict arg before its reply is lost: each retry of the same key was sent the edited objects (the
    ``fee`` twice over), not the call the journal fingerprinted. Proves: every try gets the arguments
    as called (the fingerprinted ones), and the caller's objects are not the tool's to edit (a resumed
    pass, which does not call the tool, would leave them as they were)."""
    from effectlog import durable

    sent: list[tuple[list[str], dict[str, Any]]] = []

    @durable.tool(idempotent=True, retry=2)
    def charge(items: list[str], meta: dict[str, Any]) -> str:
        sent.append((list(items), dict(meta)))
        items.append("fee")
        meta["token"] = "x"
        if len(sent) < 3:
            raise ConnectionError("reply lost")
        return "ok"

    items, meta = ["a"], {"k": 1}
    with durable.run("r", journal=str(tmp_path / "j.db")):
        charge(items, meta)

    assert [(["a"], {"k": 1})] * 3 == sent
    assert (["a"], {"k": 1}) == (items, meta)


@pytest.mark.parametrize("idempotent", [False, True], ids=["not-idempotent", "idempotent"])
@pytest.mark.parametrize("mode", ["str-raises", "surrogate", "not-applied-surrogate"])
def test_a_tool_error_whose_text_cannot_be_printed_or_encoded_is_one_line(
    world: World, mode: str, idempotent: bool
) -> None:
    """A tool raising an exception whose ``__str__`` raises, an ``OSError`` whose message names a file whose
    name is not UTF-8 (``os.fsdecode`` gives lone surrogates), or ``NotApplied`` with such a message: the
    reason was formatted with ``str(exc)`` and encoded into the journal as is, so ``effectlog run`` ended
    with a traceback and exit 1, the step left requested. Proves: the run ends with its documented
    status (uncertain: 3; idempotent, sends spent: 1; not applied: 1), one error line naming the step,
    the step in its state, and the one send."""
    world.plan(mode, idempotent=idempotent)

    done = world.run()
    line = last_line(done.stderr)

    expected = "failed" if idempotent or mode == "not-applied-surrogate" else "uncertain"
    assert (3 if expected == "uncertain" else 1, True) == (done.returncode, "step 'pay'" in line), done.stderr
    assert [("pay", expected)] == _steps(world.status())
    assert 1 == len(world.sends())


def test_a_durable_tool_error_whose_text_cannot_be_printed_or_encoded_is_recorded(tmp_path: Path) -> None:
    """The ``durable`` twin: a non-idempotent tool raising an exception whose ``__str__`` raises gave its
    caller that ``__str__``'s ValueError (the step left requested), and ``NotApplied`` naming a file that
    is not UTF-8 gave a UnicodeEncodeError from the journal. Proves: the first is ``UncertainEffect`` with
    the step uncertain, the second is the tool's ``NotApplied`` with the step failed, each reason escaped."""
    from effectlog import durable
    from effectlog.errors import NotApplied, UncertainEffect
    from effectlog.session import SqliteCheckpointer

    class BadStr(Exception):
        def __str__(self) -> str:
            raise ValueError("no str for you")

    @durable.tool(idempotent=False)
    def send() -> None:
        raise BadStr()

    @durable.tool(idempotent=False)
    def upload() -> None:
        raise NotApplied("refused " + "/srv/in/\udcff.csv")

    journal = str(tmp_path / "j.db")
    with pytest.raises(UncertainEffect), durable.run("a", journal=journal):
        send()
    with pytest.raises(NotApplied), durable.run("b", journal=journal):
        upload()
    with SqliteCheckpointer(journal) as store:
        states = [(s.state, s.reason) for run in ("a", "b") for s in store.load(run).steps]

    assert [
        ("uncertain", "outcome unknown: BadStr: <its str() raised ValueError>"),
        ("failed", "refused /srv/in/\\udcff.csv"),
    ] == states


def test_a_tool_that_changes_the_working_directory_leaves_relative_journal_and_store_paths_alone(
    world: World, tmp_path: Path
) -> None:
    """Found nothing (kept as a regression test). A tool ``os.chdir``s elsewhere and stays there; the run
    was started with a relative ``--journal`` and ``--effects`` and the next steps use the effect store
    (idempotent) and the journal. Proves: every later commit and key lands in the files the run was
    started with (none made in the tool's directory), the run completes, ``verify`` passes."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    plan = {
        "run_id": "r",
        "adapters": {
            "cd": {"type": "hostile", "idempotent": False, "options": {"mode": "chdir", "blocking": False}},
            "fx": {"type": "effects.idempotent", "idempotent": True},
        },
        "steps": [{"id": "cd", "adapter": "cd", "args": {"to": str(elsewhere)}}, {"id": "pay", "adapter": "fx"}],
    }
    (world.dir / "plan.json").write_text(json.dumps(plan))

    done = world.effectlog(
        "run", "plan.json", "--journal", "j.db", "--effects", "fx.db", "--adapters", "hostile_tools:ADAPTERS"
    )
    ledger = world.effectlog("effects", "--effects", "fx.db", "--json")

    assert (0, []) == (done.returncode, sorted(p.name for p in elsewhere.iterdir())), done.stderr
    assert (0, 1) == (ledger.returncode, len(json.loads(ledger.stdout)))
    assert 0 == world.effectlog("verify", "--journal", "j.db").returncode


def test_a_forked_child_returning_from_a_tool_into_effectlog_leaves_the_parent_running(world: World) -> None:
    """An in-process tool forks and waits for its child; the child, forgetting ``os._exit`` (or ending with
    ``sys.exit``, as daemonising code does), returns into effectlog's loop. The child is refused at its first
    journal write (``journal_inherited``, exit 6: nothing written, nothing sent), but unwinding
    ``asyncio.run`` closes the child's copy of the event loop, whose ``epoll_ctl(DEL)`` of the self-pipe acts
    on the epoll instance the fork left shared with the parent: the parent's loop never hears that the next
    step's thread finished and ``effectlog run`` hangs for ever after ``pay`` (confirmed; it did not hang
    every time, so the strict xfail this was could pass by chance). Nothing is lost or sent twice (a killed
    parent resumes at ``next``). Proves: the parent completes the run (``effectlog.loopfork`` gives a
    forked child's loop an epoll instance and self-pipe of its own)."""
    plan = {
        "run_id": "r",
        "adapters": {
            "fork": {"type": "hostile", "idempotent": False, "options": {"mode": "fork", "blocking": False}},
            "after": {"type": "hostile", "idempotent": False, "options": {"mode": "chdir"}},
        },
        "steps": [{"id": "pay", "adapter": "fork"}, {"id": "next", "adapter": "after", "args": {"to": "."}}],
    }
    (world.dir / "plan.json").write_text(json.dumps(plan))
    argv = [sys.executable, "-m", "effectlog", "run", "plan.json", "--journal", "j.db"]
    try:  # a hang detector, not a timing assertion: the run takes well under a second
        done = subprocess.run(
            [*argv, "--adapters", "hostile_tools:ADAPTERS"], cwd=world.dir, env=world.env, capture_output=True,
            text=True, timeout=20, check=False,
        )  # fmt: skip
        status = done.returncode
    except subprocess.TimeoutExpired:
        status = None

    assert 0 == status
    assert [("pay", "confirmed"), ("next", "confirmed")] == _steps(world.status())
    assert ["pay", "next"] == [send[0] for send in world.sends()]


def test_a_tool_that_installs_its_own_sigterm_handler_does_not_take_effectlogs_stop_away(world: World) -> None:
    """An in-process tool (``blocking = False``: it runs in the main thread) installs its own SIGTERM handler
    and returns. A SIGTERM during a later step (systemd stopping the service) then went to the tool's
    handler: effectlog never heard it, ran every remaining step and exited 0, where README promises 143
    after the current step's commit. Proves: the stop handlers effectlog had before an in-process call are
    back after it, so the run stops after the step the signal came in (exit 143), the rest unsent and the
    run resumable."""
    plan = {
        "run_id": "r",
        "adapters": {
            "own": {"type": "hostile", "idempotent": False, "options": {"mode": "own-sigterm", "blocking": False}},
            "term": {"type": "hostile", "idempotent": False, "options": {"mode": "sigterm-me"}},
            "rest": {"type": "hostile", "idempotent": False, "options": {"mode": "chdir"}},
        },
        "steps": [
            {"id": "own", "adapter": "own"},
            {"id": "stop", "adapter": "term"},
            {"id": "rest", "adapter": "rest", "args": {"to": "."}},
        ],
    }
    (world.dir / "plan.json").write_text(json.dumps(plan))

    done = world.run()

    assert 143 == done.returncode, done.stderr
    assert ["own", "stop"] == [send[0] for send in world.sends()]
    assert [("own", "confirmed"), ("stop", "confirmed")] == _steps(world.status())


# -- (2) keys and evidence ---------------------------------------------------------------------------


@pytest.mark.parametrize("applied", [None, "false", "no", 0, 1], ids=repr)
def test_a_lookup_whose_evidence_is_no_yes_or_no_is_refused_and_writes_nothing(world: World, applied: Any) -> None:
    """``reconcile --lookup`` recorded ``"applied" if found.applied else "not_applied"``: a user's lookup
    building ``Evidence(applied=resp["applied"])`` from a provider answering ``null`` ("unknown") or
    ``"false"`` (a string) was taken as not applied (the step back to pending: the next run sends a new
    attempt, a second effect if the first had landed) or as applied (the effect taken as done, the run
    moving on without it). ``Evidence`` is a msgspec Struct: its constructor checks no types, as
    ``Receipt.ok``'s is checked for a tool's answer. Proves: anything but a bool is refused in one line
    (exit 2) naming the type, nothing is written, and the step stays uncertain."""
    world.plan("raise", idempotent=False, options={"applied": applied})
    assert 3 == world.run().returncode
    before = world.journal_bytes()

    done = world.effectlog(
        "reconcile", "--journal", "j.db", "--run-id", "r", "--step", "pay", "--lookup",
        "--adapters", "hostile_tools:ADAPTERS",
    )  # fmt: skip

    assert (2, True) == (done.returncode, "Evidence.applied" in last_line(done.stderr)), done.stderr
    assert before == world.journal_bytes()
    assert [("pay", "uncertain")] == _steps(world.status())


@pytest.mark.parametrize("mode", ["live-view", "expiring"])
def test_a_result_that_answers_anew_each_time_it_is_read_is_recorded_as_read_once(world: World, mode: str) -> None:
    """A tool returns a dataclass whose field answers anew each read (msgspec reads fields with getattr):
    the result was encoded once to check it, once into the event and once more into the checkpoint
    segment built from the live state, so the segment held another price than the event and ``verify``
    failed the journal for good (exit 7, "a checkpoint disagrees with the replay"); a field that raised
    on its second read ended ``effectlog run`` with a traceback, exit 1, the step's answer lost. Proves:
    the answer is read once, every record of it is that reading: the run completes, ``verify`` passes,
    one send."""
    world.plan(mode, idempotent=False)
    world.env["EFFECTLOG_CHECKPOINT_EVERY"] = "1"

    done = world.run()
    checked = world.effectlog("verify", "--journal", "j.db")

    assert 0 == done.returncode, done.stderr
    assert (0, "") == (checked.returncode, checked.stderr)
    assert [("pay", "confirmed")] == _steps(world.status())
    assert 1 == len(world.sends())


def test_a_durable_result_that_raises_on_its_second_read_is_recorded_from_its_first(tmp_path: Path) -> None:
    """The ``durable`` twin: the result was read to check it and again to normalise it, outside the
    check, so the second read's RuntimeError reached the caller with the step left requested. Proves:
    the call returns the first reading, recorded, and a resumed pass returns the same."""
    import dataclasses

    from effectlog import durable

    @dataclasses.dataclass
    class Quote:
        price: int = 0

        def __getattribute__(self, name: str) -> Any:
            if name != "price":
                return object.__getattribute__(self, name)
            reads = object.__getattribute__(self, "__dict__").setdefault("_reads", [])
            reads.append(1)
            if len(reads) > 1:
                raise RuntimeError("quote expired")
            return 7

    @durable.tool(idempotent=False)
    def quote() -> Quote:
        return Quote()

    journal = str(tmp_path / "j.db")
    with durable.run("r", journal=journal):
        live = quote()
    with durable.run("r", journal=journal):
        again = quote()

    assert ({"price": 7}, {"price": 7}) == (live, again)


def test_a_result_of_str_int_and_float_subclasses_is_recorded_as_their_values(tmp_path: Path) -> None:
    """``numpy.float64`` is a float and ``numpy.str_`` a str (subclasses), as are ``markupsafe.Markup``
    and a user's ``class Cents(int)``: msgspec refuses subclasses of str, int and float, so a tool answering
    ``{"score": np.float64(0.93)}`` (any numpy or pandas result) was unrecordable: after its effect, a
    non-idempotent call stopped the run as uncertain for an operator to reconcile. Proves: such values are
    recorded as the plain value they hold (read through the base type, never a subclass's own
    ``__str__``/``__float__``), returned live and on resume alike, the tool called once."""
    from effectlog import durable

    # numpy is not a dependency: these are what numpy.float64 and numpy.str_ are to the encoder, a float and
    # a str subclass (each lying through its own methods, as a subclass may: the base type's value counts).
    class Float64(float):
        def __float__(self) -> float:
            return -1.0

        def __repr__(self) -> str:
            return "np.float64(-1)"

    class Str_(str):
        def __str__(self) -> str:
            return "dog"

    class Cents(int):
        def __int__(self) -> int:
            return 0

    calls: list[int] = []

    @durable.tool(idempotent=False)
    def classify() -> dict[str, Any]:
        calls.append(1)
        return {"score": Float64(0.93), "label": Str_("cat"), "cents": Cents(1299)}

    journal = str(tmp_path / "j.db")
    with durable.run("r", journal=journal):
        live = classify()
    with durable.run("r", journal=journal):
        again = classify()

    expected = {"score": 0.93, "label": "cat", "cents": 1299}
    assert (expected, expected, [1]) == (live, again, calls)
    assert [float, str, int] == [type(live[k]) for k in ("score", "label", "cents")]


# -- (3) plans and CLI inputs ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("run_id", "journal"),
    [
        ("-7", "j.db"),
        ("onboard/42", "j.db"),
        ("order  42", "j.db"),
        ("café", "j.db"),
        ("r", "-j.db"),
        ("r", "two\nlines.db"),
        ("-r x", "$(touch pwned)  j.db"),
    ],
    ids=["leading-dash", "slash", "spaces", "non-ascii", "journal-leading-dash", "journal-newline", "all"],
)
def test_the_reconcile_command_effectlog_prints_works_as_printed_for_odd_names(
    tmp_path: Path, run_id: str, journal: str
) -> None:
    """The command a stopped run prints is meant to be copied. A durable (or session) run id is any text,
    but ``--run-id`` took only plan ids (letters, digits, ``. _ : @ -``): the command printed for
    ``durable.run("onboard/42")`` was refused ("not a valid id", exit 2), so the stopped run could not be
    reconciled, approved or even shown from the CLI. ``shlex.quote`` makes any value one shell word, but a
    value starting with ``-`` (``"-7"``, a journal ``-j.db``) is still read by argparse as an option
    ("expected one argument"), and a value with a newline made the one error line two (and ``str()`` of
    the error, which folds whitespace, named another file). Proves: the printed command is one line, and run by a shell
    with the outcome filled in it reconciles the step (exit 0), running nothing else."""
    from effectlog import durable
    from effectlog.errors import UncertainEffect

    @durable.tool(idempotent=False)
    def send() -> None:
        raise ConnectionError("reply lost")

    (tmp_path / "work").mkdir()
    here = os.getcwd()
    os.chdir(tmp_path / "work")
    try:
        with pytest.raises(UncertainEffect) as caught, durable.run(run_id, journal=journal):
            send()
    finally:
        os.chdir(here)
    command = caught.value.fields["command"]
    typed = command.replace("applied|not-applied", "not-applied").replace("TEXT", "bank-says-no")
    shell = f'effectlog() {{ "{sys.executable}" -m effectlog "$@"; }}\n{typed.replace("NAME", "ann")}\n'
    done = subprocess.run(
        ["bash", "-c", shell], cwd=tmp_path / "work", env=cli_env(), capture_output=True, text=True,
        timeout=SAFETY_TIMEOUT_S, check=False,
    )  # fmt: skip

    assert (1, True) == (len(command.splitlines()), command.startswith("effectlog reconcile ")), command
    assert (0, "") == (done.returncode, done.stderr), command
    assert not (tmp_path / "work" / "pwned").exists()


def test_a_tool_that_closes_sys_stderr_does_not_end_the_run_after_its_commit(world: World) -> None:
    """A tool closes the ``sys.stderr`` object (not fd 2, which round 4 covered): the progress line
    logged after the step's durable commit went through a ``logging.StreamHandler`` holding that object,
    whose error handler wrote "--- Logging error ---" to it and raised ValueError out of the run: exit 1
    (documented as "the run failed") with the run open, nothing on stderr to say why. Proves: the run
    goes on and completes (exit 0), the lines that cannot be written are dropped, one send."""
    world.plan("close-stderr", idempotent=False)

    done = world.run()

    assert 0 == done.returncode, done.stderr
    assert ("completed", [("pay", "confirmed")]) == (world.status()["state"], _steps(world.status()))
    assert 1 == len(world.sends())


@pytest.mark.parametrize("blocking", [False, True], ids=["in-process", "on-a-thread"])
def test_a_tool_that_closes_every_descriptor_past_stderr_ends_the_run_in_one_line(world: World, blocking: bool) -> None:
    """An in-process tool (``blocking = False``) calls ``os.closerange(3, 65536)``, as daemonising helpers
    do: it closes the journal's database, WAL and shared-memory descriptors and the event loop's
    self-pipe. The next commit fails ("locking protocol"), the event loop's selector fails with EBADF, and
    ``effectlog run`` ends with three chained tracebacks and exit 1, the step left requested. Nothing is
    lost or sent twice (the next run finds the step uncertain), but the error contract is broken. The same
    from a tool on a thread (the loop, asleep meanwhile, must still hear the thread's answer). Proves: one
    error line naming the step (``descriptors_closed``), a documented status (6: the journal can no longer
    be used by this process), and the next run stops on the step as uncertain without a second send."""
    world.plan("closerange", idempotent=False, options={"blocking": blocking})

    done = world.run()
    again = world.run()

    assert (6, True) == (done.returncode, "step 'pay'" in last_line(done.stderr)), done.stderr
    assert (3, 1) == (again.returncode, len(world.sends()))


def test_a_ledger_the_steps_own_adapter_never_wrote_is_no_evidence_that_its_effect_is_absent(world: World) -> None:
    """A plan whose first step uses the built-in ``effects.control`` (so the run pins ``fx.db``) and whose
    second step is the user's own ``pay`` adapter, which charges a real provider and keeps its own records;
    ``pay`` stops uncertain after its effect. ``reconcile --step pay --from-ledger fx.db`` checked only that
    *some* adapter of the run uses the effect store and that the store is the pinned one, then looked for
    ``pay``'s key in a ledger ``pay`` never writes: "not applied", the step back to pending, and the next
    run charged again. Proves: the ledger is refused as evidence for a step whose own adapter did not ask
    for the effect store when built (``run.started.store_adapters``; exit 2, nothing written, the step still
    uncertain), and the charge happens once."""
    plan = {
        "run_id": "r",
        "adapters": {
            "note": {"type": "effects.control", "idempotent": False},
            "pay": {"type": "hostile", "idempotent": False, "options": {"mode": "raise"}},
        },
        "steps": [{"id": "note", "adapter": "note"}, {"id": "pay", "adapter": "pay"}],
    }
    (world.dir / "plan.json").write_text(json.dumps(plan))
    argv = ("plan.json", "--journal", "j.db", "--effects", "fx.db", "--adapters", "hostile_tools:ADAPTERS")
    assert 3 == world.effectlog("run", *argv).returncode
    before = world.journal_bytes()

    done = world.effectlog("reconcile", "--journal", "j.db", "--run-id", "r", "--step", "pay", "--from-ledger", "fx.db")
    again = world.effectlog("run", *argv)

    assert (2, True) == (done.returncode, "--from-ledger" in last_line(done.stderr)), done.stderr
    assert (before, 3, 1) == (world.journal_bytes(), again.returncode, len(world.sends()))


# -- (4) integrations and text the journal cannot hold -------------------------------------------------


def test_a_durable_call_with_an_arg_that_is_not_utf8_text_is_bad_input(tmp_path: Path) -> None:
    """A file name from ``os.listdir`` on a directory with a Latin-1 name holds a lone surrogate: a durable
    call with it raised the encoder's UnicodeEncodeError at its caller (not an effectlog error, nothing
    naming the arg). Proves: ``BadInput`` naming the argument, the function not called, nothing recorded."""
    from effectlog import durable
    from effectlog.errors import BadInput
    from effectlog.session import SqliteCheckpointer

    called: list[str] = []

    @durable.tool(idempotent=False)
    def upload(path: str) -> None:
        called.append(path)

    journal = str(tmp_path / "j.db")
    with pytest.raises(BadInput) as caught, durable.run("r", journal=journal):
        upload(os.fsdecode(b"/srv/in/\xff.csv"))
    with SqliteCheckpointer(journal) as store:
        steps = store.state("r").ordered_steps()  # an unknown run's state is the empty one

    message = str(caught.value)
    assert (True, True, [], []) == ("args.path" in message, "surrogate" in message, called, steps), message


def test_a_session_models_tool_call_with_a_lone_surrogate_is_told_back_not_a_run_stuck_forever(
    tmp_path: Path,
) -> None:
    """Round 7's NaN case with text: ``json.loads`` turns a model's ``"\\ud800"`` escape into a lone
    surrogate, which the journal cannot encode: the tool step raised UnicodeEncodeError out of the agent
    loop after the model's answer was recorded, and every later pass replayed the answer and raised again.
    Proves: the model is told, no tool runs, the run completes with the model's next answer."""
    import asyncio

    from effectlog.session import Session, SqliteCheckpointer, call, say
    from session_kit import drive, lines, scripted

    calls = tmp_path / "calls"
    script = [call("transfer", to="\ud800", amount=5), say("could not send")]
    with SqliteCheckpointer(tmp_path / "j.db") as store:
        steps = asyncio.run(drive(Session("s1", scripted(calls, script=script), store)))
    assert ("could not send", []) == (
        getattr(steps[-1], "result", None),
        [line for line in lines(calls) if line.startswith("transfer")],
    )


@pytest.mark.xfail(
    strict=True,
    reason="not fixed (upstream): the Agents SDK's own tool-invocation fingerprint (agents/_tool_invocation.py "
    "_fingerprint: json.dumps(ensure_ascii=False).encode('utf-8')) raises before effectlog's tool wrapper runs",
)
def test_an_openai_agents_tool_call_with_a_lone_surrogate_is_told_back_not_a_run_stuck_forever(
    tmp_path: Path,
) -> None:
    """The OpenAI Agents twin: a model answer whose tool-call arguments hold a ``"\\ud800"`` escape raises
    UnicodeEncodeError out of ``run_sync``; the answer is recorded, so every later pass replays it and
    raises again: the run is stuck for good (``status``: interrupted). The raise is the SDK's (it
    fingerprints the call's parsed arguments as UTF-8 before the tool runs), so effectlog's argument check
    (now canonical JSON, which names lone surrogates as it names NaN) is never reached. Proves (when
    fixed): the tool is not run, the model is told, the run completes, and a second pass replays it."""
    from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    from effectlog.integrations.openai_agents import DurableRunner
    from provider_standin import ProviderStandIn

    set_tracing_disabled(True)
    ran: list[str] = []

    @function_tool
    def charge(to: str, amount: int) -> str:
        """Charge a customer."""
        ran.append(to)
        return f"charged {amount}"

    provider = ProviderStandIn([("charge", '{"to": "\\ud800", "amount": 5}'), "could not charge"]).start()
    try:
        client = AsyncOpenAI(base_url=provider.url, api_key="test", max_retries=0)
        model = OpenAIChatCompletionsModel(model="stand-in", openai_client=client)
        agent = Agent(name="billing", model=model, tools=[charge])
        runner = DurableRunner(journal=tmp_path / "runs.db")
        first = runner.run_sync(agent, "charge", run_id="r").final_output
        again = runner.run_sync(agent, "charge", run_id="r").final_output
    finally:
        provider.stop()

    assert ("could not charge", "could not charge", []) == (first, again, ran)


def test_args_that_differ_in_key_order_are_one_call_and_in_type_or_normalisation_another(tmp_path: Path) -> None:
    """Found nothing (kept as a regression test). A resumed durable block calls the recorded position with
    args that differ only in dict order (the same call: replayed, not run), or in ``1`` vs ``1.0``,
    ``True`` vs ``1``, ``0.0`` vs ``-0.0``, NFC vs NFD ``café`` (each another call to canonical JSON:
    ``ReplayDivergence``, never the recorded result of the other call, never a second run)."""
    import unicodedata

    from effectlog import durable
    from effectlog.errors import ReplayDivergence

    calls: list[Any] = []

    @durable.tool(idempotent=False)
    def pay(x: Any) -> str:
        calls.append(x)
        return "ok"

    nfc, nfd = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    cases: dict[str, tuple[Any, Any]] = {
        "order": ({"a": 1, "b": 2}, {"b": 2, "a": 1}),
        "int-float": (1, 1.0),
        "bool-int": (True, 1),
        "zero": (0.0, -0.0),
        "nfc-nfd": (nfc, nfd),
    }
    seen: dict[str, str] = {}
    for name, (first, then) in cases.items():
        with durable.run(name, journal=str(tmp_path / "j.db")):
            pay(first)
        try:
            with durable.run(name, journal=str(tmp_path / "j.db")):
                pay(then)
            seen[name] = "replayed"
        except ReplayDivergence:
            seen[name] = "divergence"

    expected = {"order": "replayed", "int-float": "divergence", "bool-int": "divergence", "zero": "divergence"}
    assert ({**expected, "nfc-nfd": "divergence"}, 5) == (seen, len(calls))


DURABLE_CLOSERANGE = """
import os, sys
from pathlib import Path
from effectlog import durable
from effectlog.errors import EffectlogError

calls = Path(sys.argv[2])


@durable.tool(idempotent=False)
def daemonise() -> str:
    with calls.open("a") as f:
        f.write("call\\n")
    os.closerange(3, 65536)
    return "done"


try:
    with durable.run("r", journal=sys.argv[1]):
        daemonise()
except EffectlogError as exc:
    print(exc.code, exc.step_id, flush=True)
    sys.exit(int(exc.exit_status))
print("completed")
"""


def test_a_durable_tool_that_closes_every_descriptor_past_stderr_is_never_recorded_nor_repeated(
    tmp_path: Path,
) -> None:
    """A ``@durable.tool`` (a session's tool path, not a plan's) calls ``os.closerange(3, 65536)``. Proves: the
    block ends with ``descriptors_closed`` (exit 6) naming the step, and the next pass finds the step
    uncertain (exit 3) without calling the tool again: one call."""
    argv = [sys.executable, "-c", DURABLE_CLOSERANGE, str(tmp_path / "j.db"), str(tmp_path / "calls")]
    first = subprocess.run(argv, capture_output=True, text=True, env=cli_env(), timeout=SAFETY_TIMEOUT_S)
    again = subprocess.run(argv, capture_output=True, text=True, env=cli_env(), timeout=SAFETY_TIMEOUT_S)
    assert (6, "descriptors_closed") == (first.returncode, first.stdout.split(" ")[0]), first.stderr
    assert "Traceback" not in first.stderr, first.stderr
    assert (3, 1) == (again.returncode, (tmp_path / "calls").read_text().count("call")), again.stderr
