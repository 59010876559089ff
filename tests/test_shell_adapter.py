"""The ``shell`` adapter: key passing, the environment allow-list, what it records, and
killing the whole process group when a command outlives its timeout."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import msgspec
import pytest

from effectlog.adapters import Request, idempotency_key
from effectlog.adapters.shell import ShellAdapter, ShellTimeout
from effectlog.errors import BadInput, ExitStatus
from effectlog.plan import parse_plan
from effectlog.runtime import Runtime


def request(args: dict[str, object], *, timeout_s: float | None = None, step_id: str = "deploy") -> Request:
    return Request(
        run_id="shell-run",
        step_id=step_id,
        attempt=1,
        idempotency_key=idempotency_key("shell-run", step_id, 1),
        args=args,
        timeout_s=timeout_s,
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_gone(pid: int) -> bool:
    """True once ``pid`` no longer runs: absent, or a zombie (dead, only waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_until_gone(pid: int, polls: int = 200) -> bool:
    """Poll a bounded number of times: a SIGKILLed process disappears asynchronously."""
    for _ in range(polls):
        if is_gone(pid):
            return True
        time.sleep(0.05)
    return False


def test_the_idempotency_key_is_passed_in_the_environment(tmp_path: Path) -> None:
    """The command sees the step's key as EFFECTLOG_IDEMPOTENCY_KEY (so a script can dedupe)."""
    req = request({"argv": ["sh", "-c", 'printf %s "$EFFECTLOG_IDEMPOTENCY_KEY" > key.txt'], "cwd": str(tmp_path)})

    receipt = ShellAdapter().invoke(req)

    assert 0 == receipt.data["exit_status"]
    assert req.idempotency_key == (tmp_path / "key.txt").read_text()


def test_only_allow_listed_environment_variables_reach_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command's environment is the allow-list (from the process or the step's ``env``) plus
    the key; everything else, inherited or given in ``env``, is left out."""
    monkeypatch.setenv("EL_ALLOWED", "from-parent")
    monkeypatch.setenv("EL_SECRET", "must-not-leak")
    adapter = ShellAdapter({"env_allow": ["PATH", "EL_ALLOWED", "EL_GIVEN"]})
    req = request(
        {
            "argv": ["sh", "-c", "env > env.txt"],
            "cwd": str(tmp_path),
            "env": {"EL_GIVEN": "from-step", "EL_NOT_ALLOWED": "dropped"},
        }
    )

    adapter.invoke(req)

    lines = (tmp_path / "env.txt").read_text().splitlines()
    seen = {line.split("=", 1)[0]: line.split("=", 1)[1] for line in lines if "=" in line}
    # sh may add a few of its own (PWD, SHLVL, _): ignore those, nothing else is allowed.
    seen = {k: v for k, v in seen.items() if k not in ("PWD", "OLDPWD", "SHLVL", "_")}
    assert {
        "PATH": os.environ["PATH"],
        "EL_ALLOWED": "from-parent",
        "EL_GIVEN": "from-step",
        "EFFECTLOG_IDEMPOTENCY_KEY": req.idempotency_key,
    } == seen


@pytest.mark.parametrize(
    ("script", "expected_status", "expected_ok"),
    [("echo out; echo err >&2; exit 0", 0, True), ("echo out; echo err >&2; exit 3", 3, False)],
    ids=["success", "failure"],
)
def test_the_receipt_records_exit_status_and_output_digests(
    script: str, expected_status: int, expected_ok: bool
) -> None:
    """The receipt holds the exit status, and sha256 digests and sizes of stdout and stderr (never
    the output itself); a non-zero status is a known failure (``ok=False``), not an unknown."""
    receipt = ShellAdapter().invoke(request({"argv": ["sh", "-c", script]}))

    assert expected_ok == receipt.ok
    assert {
        "exit_status": expected_status,
        "stdout_sha256": sha256(b"out\n"),
        "stderr_sha256": sha256(b"err\n"),
        "stdout_bytes": 4,
        "stderr_bytes": 4,
    } == {k: v for k, v in receipt.data.items() if k != "pgid"}


@pytest.mark.parametrize("argv", [[], "sh -c true", ["sh", 1]], ids=["empty", "string", "non-string"])
def test_a_malformed_argv_is_bad_input(argv: object) -> None:
    """``args.argv`` must be a non-empty list of strings; anything else is refused before running."""
    with pytest.raises(BadInput) as caught:
        ShellAdapter().invoke(request({"argv": argv}))

    assert "args.argv" in caught.value.message


def test_a_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    """When the command outlives its timeout, the adapter kills its process group: the
    grandchild (a background ``sleep 300``) is gone too, and the call raises ShellTimeout
    (outcome unknown)."""
    pidfile = tmp_path / "pidfile"
    req = request({"argv": ["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"]}, timeout_s=0.5)

    with pytest.raises(ShellTimeout):
        ShellAdapter().invoke(req)

    grandchild = int(pidfile.read_text())
    assert wait_until_gone(grandchild)


def test_a_timed_out_shell_step_stops_the_run_after_its_process_group_is_killed(tmp_path: Path) -> None:
    """Through the runtime: a non-idempotent shell step that times out is uncertain (run stopped,
    exit 3), and by the time ``run`` returns its process group is already dead, so a CLI that
    exits right after leaves no stray processes behind."""
    pidfile = tmp_path / "pidfile"
    raw = {
        "run_id": "shell-timeout",
        "adapters": {"sh": {"type": "shell"}},
        "steps": [
            {
                "id": "hang",
                "adapter": "sh",
                "args": {"argv": ["sh", "-c", f"sleep 300 & echo $! > {pidfile}; wait"]},
                "timeout_s": 0.5,
            }
        ],
    }
    plan = parse_plan(msgspec.json.encode(raw))

    with Runtime(tmp_path / "journal.db") as rt:
        outcome = rt.run(plan)
        step = rt.load(plan.run_id).step("hang")

    assert step is not None
    assert ("stopped", int(ExitStatus.STOPPED_UNCERTAIN), "uncertain") == (
        outcome.state,
        outcome.exit_status,
        step.state,
    )
    assert "ShellTimeout" in step.reason
    assert is_gone(int(pidfile.read_text()))


def kill_daemon(pidfile: Path) -> None:
    """SIGKILL the daemon whose pid the test's command wrote (it may take a moment to write it)."""
    deadline = time.monotonic() + 60  # a loaded machine may take seconds to start the daemon's shell
    while time.monotonic() < deadline:
        if pidfile.exists() and pidfile.read_text().strip():
            os.kill(int(pidfile.read_text()), 9)
            return
        time.sleep(0.05)


def test_a_command_that_leaves_a_daemon_holding_its_output_is_done_when_it_exits(tmp_path: Path) -> None:
    """``sh -c 'setsid sleep 30 & echo started'``: a "start a service" step. The service (in a session of
    its own, so not the command's process group) keeps the stdout pipe open; the adapter waited for the
    pipe's end, not the command's, so the step ran into its timeout and was called uncertain, a started
    service reported as an unknown outcome. Proves: the command's exit decides (exit 0, ok), the output
    written before it is in the receipt, and the call returns long before the service ends."""
    pidfile = tmp_path / "pidfile"
    script = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 30' & echo started"
    began = time.monotonic()
    try:
        receipt = ShellAdapter().invoke(request({"argv": ["sh", "-c", script]}, timeout_s=20))
        took = time.monotonic() - began
    finally:
        kill_daemon(pidfile)
    assert (True, 0, sha256(b"started\n")) == (receipt.ok, receipt.data["exit_status"], receipt.data["stdout_sha256"])
    assert took < 15, took  # bounded far below the service's 30 s and the 20 s timeout: not a wall-time benchmark


def test_a_timeout_returns_even_when_an_escaped_daemon_holds_the_output(tmp_path: Path) -> None:
    """A command that outlives its timeout and left a daemon (another session, so the kill of the
    command's process group misses it) holding stdout: after the kill the adapter read the pipe to its
    end, so the call hung for as long as the daemon lived. Proves: ShellTimeout (outcome unknown) comes
    soon after the timeout, not when the daemon ends."""
    pidfile = tmp_path / "pidfile"
    script = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 30' & sleep 25"
    began = time.monotonic()
    try:
        with pytest.raises(ShellTimeout):
            ShellAdapter().invoke(request({"argv": ["sh", "-c", script]}, timeout_s=0.5))
        took = time.monotonic() - began
    finally:
        kill_daemon(pidfile)
    assert took < 15, took
