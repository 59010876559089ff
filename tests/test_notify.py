"""Notifications (issue 17 item 6): a person is told once that a run waits, with the command that resolves it.

A real HTTP receiver on 127.0.0.1 records each POST; the CLI runs in real subprocesses.
A failing hook (nothing listening, a command exiting non-zero) never changes the run.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from effectlog.errors import ApprovalRequired, ExitStatus
from effectlog.journal.sqlite import SqliteJournal
from effectlog.notify import Notification, deliver, notify_new_waits, shown_location, url_hook
from effectlog.session import Session, SqliteCheckpointer, Toolbox, ToolboxGateway, ToolCall

TESTS = Path(__file__).resolve().parent


class Receiver:
    """A webhook receiver on 127.0.0.1 that keeps every JSON body and Idempotency-Key it is sent."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.keys: list[str | None] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.received.append(json.loads(raw))
                receiver.keys.append(self.headers.get("Idempotency-Key"))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/hook"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.stop()


def dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/hook"


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "EFFECTLOG_JOURNAL_KEY"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH", "")) if p)
    return env


def effectlog(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "effectlog", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=90, check=False, env=child_env())


def write_plan(tmp: Path, run_id: str, step: dict[str, Any], adapters: dict[str, Any]) -> Path:
    path = tmp / f"{run_id}.json"
    path.write_text(json.dumps({"run_id": run_id, "adapters": adapters, "steps": [step]}))
    return path


HELD = {"id": "pay", "adapter": "n", "approval": "required"}
NOOP = {"n": {"type": "noop", "version": "1", "idempotent": True}}


def test_a_session_held_for_approval_notifies_the_receiver_once(receiver: Receiver, tmp_path: Path) -> None:
    """A session whose tool needs approval POSTs one notification (run, step, the approve command); a second
    pass over the still-suspended run sends nothing more."""
    tools = Toolbox()

    @tools.tool(idempotent=False)
    def pay(amount: int) -> str:
        """Pays."""
        return "paid"

    def policy(call: ToolCall) -> str:
        return "require_approval"

    async def one_pass(store: SqliteCheckpointer) -> None:
        s = Session("r1", ToolboxGateway(model="m", tools=tools), store, policy=policy, notify=url_hook(receiver.url))
        with pytest.raises(ApprovalRequired):
            await s.tool("pay", {"amount": 5})

    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        asyncio.run(one_pass(store))
        asyncio.run(one_pass(store))
    assert 1 == len(receiver.received)
    note = receiver.received[0]
    assert ("suspended", "r1", "step-0") == (note["kind"], note["run_id"], note["step_id"])
    assert note["command"].startswith(f"effectlog approve --journal {tmp_path / 'runs.db'} --run-id r1 --step step-0")
    assert [f"suspended/r1/step-0/{note['seq']}"] == receiver.keys


def test_cli_run_stopped_on_an_uncertain_step_notifies_once_with_the_reconcile_command(
    receiver: Receiver, tmp_path: Path
) -> None:
    """`effectlog run --notify-url`: a step whose outcome is unknown stops the run (exit 3) and the receiver gets
    one `stopped` notification naming the step and the reconcile command; running it again sends none."""
    plan = write_plan(
        tmp_path, "u1", {"id": "call", "adapter": "api"}, {"api": {"type": "test.unsure", "idempotent": False}}
    )
    args = ("run", str(plan), "--journal", str(tmp_path / "j.db"), "--adapters", "lifecycle_adapters:ADAPTERS")
    first = effectlog(*args, "--notify-url", receiver.url)
    assert ExitStatus.STOPPED_UNCERTAIN == first.returncode, first.stderr
    again = effectlog(*args, "--notify-url", receiver.url)
    assert ExitStatus.STOPPED_UNCERTAIN == again.returncode, again.stderr
    assert ["stopped"] == [n["kind"] for n in receiver.received]
    note = receiver.received[0]
    assert ("u1", "call") == (note["run_id"], note["step_id"])
    assert note["command"].startswith("effectlog reconcile --journal")
    assert " --attempt 1 " in note["command"]  # bound: refused once the step has moved on (exit 5)


def test_cli_run_suspended_runs_the_notify_command_once(tmp_path: Path) -> None:
    """`--notify-command`: the command gets the notification as JSON on stdin, once."""
    plan = write_plan(tmp_path, "h1", HELD, NOOP)
    inbox = tmp_path / "inbox.jsonl"
    cmd = f"cat >> {inbox}; echo >> {inbox}"
    done = effectlog("run", str(plan), "--journal", str(tmp_path / "j.db"), "--notify-command", cmd)
    assert ExitStatus.SUSPENDED == done.returncode, done.stderr
    notes = [json.loads(line) for line in inbox.read_text().splitlines() if line.strip()]
    assert [("suspended", "h1", "pay")] == [(n["kind"], n["run_id"], n["step_id"]) for n in notes]
    assert "effectlog approve" in notes[0]["command"]


@pytest.mark.parametrize("hook", [("--notify-url", "dead"), ("--notify-command", "echo broken >&2; exit 3")])
def test_a_failing_hook_changes_nothing_and_is_reported_on_stderr(tmp_path: Path, hook: tuple[str, str]) -> None:
    """A hook that fails (nothing listens; a command exits 3): same exit status and same journal as with no hook,
    one line on stderr saying the notification was not delivered, no traceback."""
    flag, value = hook
    value = dead_url() if value == "dead" else value
    plain = effectlog("run", str(write_plan(tmp_path, "h1", HELD, NOOP)), "--journal", str(tmp_path / "a.db"))
    hooked = effectlog(
        "run", str(write_plan(tmp_path, "h1", HELD, NOOP)), "--journal", str(tmp_path / "b.db"), flag, value
    )
    assert (ExitStatus.SUSPENDED, ExitStatus.SUSPENDED) == (plain.returncode, hooked.returncode)
    assert "Traceback" not in hooked.stderr
    assert 1 == sum("not delivered" in line for line in hooked.stderr.splitlines()), hooked.stderr
    status = [effectlog("status", "--journal", str(tmp_path / db), "--json").stdout for db in ("a.db", "b.db")]
    assert json.loads(status[0])[0]["state"] == json.loads(status[1])[0]["state"] == "suspended"


def test_a_hook_that_raises_is_logged_and_the_others_still_run(
    receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    """deliver(): a raising hook is written to stderr; the next hook is still called."""

    def broken(note: Notification) -> None:
        raise RuntimeError("boom")

    note = Notification(kind="stopped", run_id="r", step_id="s", command="effectlog reconcile ...")
    deliver([broken, url_hook(receiver.url)], note)
    assert 1 == len(receiver.received)
    assert "not delivered by broken: RuntimeError: boom" in capsys.readouterr().err


def test_a_store_password_never_enters_a_notification() -> None:
    """The location a notification carries has a URL's password masked."""
    expected = "postgresql://ops:***@db.example:5432/fleet"
    assert expected == shown_location("postgresql://ops:s3cret@db.example:5432/fleet")
    assert "/tmp/runs.db" == shown_location("/tmp/runs.db")


def _explode(decl: object, context: object) -> object:
    raise RuntimeError("factory bug")


BROKEN = {"broken": _explode}


def run_broken_request(receiver: Receiver, tmp_path: Path, store: str) -> None:
    """Submit one request whose adapter's factory raises into ``store`` and let a runner (notifying
    ``receiver``) send it to an operator."""
    from effectlog.cli import main

    plan = tmp_path / "broken.json"
    plan.write_text(
        json.dumps({"run_id": "b-1", "adapters": {"b": {"type": "broken"}}, "steps": [{"id": "s", "adapter": "b"}]})
    )
    assert 0 == main(["submit", str(plan), "--store", store, "--scope", "s", "--key", "k"])
    argv = ["runner", "--store", store, "--adapters", "test_notify:BROKEN", "--exit-when-idle", "--poll-s", "0.01"]
    assert 0 == main([*argv, "--notify-url", receiver.url])


def test_a_fleet_request_that_needs_an_operator_notifies_once(receiver: Receiver, tmp_path: Path) -> None:
    """`effectlog runner --notify-url`: a request sent to needs_operator is announced once, with its request id,
    run and the operator command."""
    from effectlog.fleet import open_store

    store = str(tmp_path / "fleet.db")
    run_broken_request(receiver, tmp_path, store)
    with open_store(store) as s:
        request = s.requests()[0]
        assert "needs_operator" == request.state
    assert [("operator_needed", "b-1", request.request_id)] == [
        (n["kind"], n["run_id"], n["request_id"]) for n in receiver.received
    ]
    assert receiver.received[0]["command"].startswith(f"effectlog operator requeue|fail|cancel --store {store}")


@pytest.mark.parametrize("folder", ["two\nlines", "a  b", "$(touch pwned)"], ids=["newline", "spaces", "subst"])
def test_a_fleet_operator_command_for_an_odd_store_path_works_as_printed(
    receiver: Receiver, tmp_path: Path, folder: str
) -> None:
    """The operator command a runner notifies is meant to be pasted. It quoted ``--store`` with plain
    ``shlex.quote``, unlike every other printed command: a store under a directory whose name holds a
    newline made the one command two lines (and ``str()`` of it, which folds whitespace, named another
    file). Proves: the command is one line, and run by a shell as printed (``fail`` chosen, a name and
    reason filled in) it decides that request in that store (exit 0), and nothing else is executed."""
    from effectlog.fleet import open_store

    (tmp_path / folder).mkdir()
    store = str(tmp_path / folder / "fleet.db")
    run_broken_request(receiver, tmp_path, store)
    command = receiver.received[0]["command"]
    typed = command.replace("requeue|fail|cancel", "fail").replace("NAME", "ann").replace("TEXT", "broken")
    shell = f'effectlog() {{ "{sys.executable}" -m effectlog "$@"; }}\n{typed}\n'
    done = subprocess.run(
        ["bash", "-c", shell], cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=90, check=False
    )
    with open_store(store) as s:
        state = s.requests()[0].state
    assert (1, 0, "", "failed") == (len(command.splitlines()), done.returncode, done.stderr, state), command
    assert not (tmp_path / "pwned").exists()


def test_recover_that_stops_a_killed_run_on_an_uncertain_step_notifies_once(receiver: Receiver, tmp_path: Path) -> None:
    """A run killed (SIGKILL) inside a non-idempotent step: `recover --notify-url` stops it as uncertain and the
    receiver is told once; a second `recover` skips the waiting run and tells nobody again."""
    kill = {"argv": ["sh", "-c", "kill -9 $PPID; sleep 5"]}
    plan = write_plan(
        tmp_path,
        "k1",
        {"id": "charge", "adapter": "sh", "args": kill},
        {"sh": {"type": "shell", "version": "1", "idempotent": False}},
    )
    journal = str(tmp_path / "j.db")
    assert -9 == effectlog("run", str(plan), "--journal", journal).returncode
    for _ in range(2):
        done = effectlog("recover", "--journal", journal, "--notify-url", receiver.url)
        assert "Traceback" not in done.stderr
    assert [("stopped", "k1", "charge")] == [(n["kind"], n["run_id"], n["step_id"]) for n in receiver.received]


def test_a_suspended_runs_notification_carries_the_bound_approve_command_status_prints(tmp_path: Path) -> None:
    """The command a notification hands a person is bound to the attempt (and call) they are told about:
    the same line `status --json` lists at stake, `--attempt N` included, so a decision typed from it later
    cannot approve another attempt nobody saw (it is refused, exit 5)."""
    plan = write_plan(tmp_path, "h1", HELD, NOOP)
    inbox = tmp_path / "inbox.jsonl"
    journal = str(tmp_path / "j.db")
    done = effectlog("run", str(plan), "--journal", journal, "--notify-command", f"cat >> {inbox}; echo >> {inbox}")
    assert ExitStatus.SUSPENDED == done.returncode, done.stderr
    notes = [json.loads(line) for line in inbox.read_text().splitlines() if line.strip()]
    status = json.loads(effectlog("status", "--journal", journal, "--run-id", "h1", "--json").stdout)
    stake = status[0]["at_stake"] if isinstance(status, list) else status["at_stake"]
    assert [stake[0]["command"]] == [n["command"] for n in notes]
    assert "--attempt 1" in notes[0]["command"]
    # A library caller whose mark lies after the held step's own event (only run.suspended is new to it):
    # the command is bound from the run's state, the same line.
    got: list[Notification] = []
    with SqliteJournal(journal) as opened:
        notify_new_waits([got.append], opened, journal, {"h1": opened.head("h1")[0] - 1})
    assert [stake[0]["command"]] == [n.command for n in got]


def test_a_fleet_run_held_for_approval_notifies_a_command_bound_to_its_attempt_that_works(
    receiver: Receiver, tmp_path: Path
) -> None:
    """`effectlog runner --notify-url`: a run held for approval is announced with the approve command bound
    to the held attempt and call (`--attempt 1 --expect-digest D`, as `status` lists it); run as given (a
    name filled in), it lets the waiting runner finish the request."""
    import shlex
    import time

    from effectlog.fleet import open_store

    store = str(tmp_path / "fleet.db")
    plan = write_plan(tmp_path, "h9", HELD, NOOP)
    assert 0 == effectlog("submit", str(plan), "--store", store, "--scope", "s", "--key", "k").returncode
    argv = ["runner", "--store", store, "--exit-when-idle", "--poll-s", "0.01", "--notify-url", receiver.url]
    runner = subprocess.Popen([sys.executable, "-m", "effectlog", *argv], env=child_env(), stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120  # a runner's start-up on a loaded machine, then its first turn
        while not receiver.received and runner.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        notes = [(n["kind"], n["run_id"], n["step_id"]) for n in receiver.received]
        command = receiver.received[0]["command"] if receiver.received else ""
        assert [("suspended", "h9", "pay")] == notes
        assert (True, True) == (" --attempt 1 " in command, " --expect-digest " in command), command
        decided = effectlog(*shlex.split(command.replace("NAME", "olga"))[1:])
        assert 0 == decided.returncode, decided.stderr
        assert 0 == runner.wait(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()
    with open_store(store) as s:
        assert ["succeeded"] == [r.state for r in s.requests()]
