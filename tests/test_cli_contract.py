"""The command line's contract beyond bad input: help on every option, usage errors said once,
``--json`` on every command that reports something, and third-party adapters loaded only
when a plan names them. Commands run as real processes, plug-ins as real installed
distributions (a ``.dist-info`` directory on the path), nothing mocked.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from effectlog.cli import build_parser
from hardening_kit import SAFETY_TIMEOUT_S, cli_env, one_line


def effectlog(where: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "effectlog", *argv],
        cwd=where,
        env=cli_env(env),
        capture_output=True,
        text=True,
        timeout=SAFETY_TIMEOUT_S,
        check=False,
    )


def write_plan(path: Path, run_id: str, adapters: dict[str, Any], steps: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps({"run_id": run_id, "adapters": adapters, "steps": steps}))
    return path.name


# -- help and usage ---------------------------------------------------------------------------


def _options(parser: argparse.ArgumentParser, command: str) -> Iterator[tuple[str, str, str | None]]:
    """(command, option, help) for every argument of every (sub)command, hidden ones included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{command} {name}")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield command, "/".join(action.option_strings) or action.dest, action.help


def test_every_option_of_every_command_has_help_text() -> None:
    """Walking the whole parser (the internal crash-matrix worker too): every option and
    positional argument has a help text, and none is hidden with SUPPRESS."""
    options = list(_options(build_parser(), "effectlog"))

    assert len(options) > 60
    assert [] == [(c, o) for c, o, h in options if not h or h == argparse.SUPPRESS]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ((), "effectlog: usage: the following arguments are required: COMMAND (see 'effectlog --help')"),
        (("run",), "effectlog: usage: run: the following arguments are required: PLAN, --journal"),
        (("crash-matrix", "soak", "--kills", "x"), "effectlog: usage: crash-matrix soak: argument --kills"),
    ],
)
def test_a_usage_error_is_one_line_naming_effectlog_and_the_command_once(
    tmp_path: Path, argv: tuple[str, ...], said: str
) -> None:
    """A usage error is exit 2 and one line: ``effectlog: usage: COMMAND: message``, never the
    doubled ``effectlog: error: effectlog: ...``."""
    done = effectlog(tmp_path, *argv)
    line = one_line(done.stderr)

    assert (2, True, 1) == (done.returncode, line.startswith(said), line.count("effectlog:")), line


def test_crash_matrix_help_lists_its_actions_and_not_the_internal_worker(tmp_path: Path) -> None:
    """``crash-matrix --help`` lists run, verify and soak; the internal worker is not listed and
    no ``==SUPPRESS==`` leaks into the text."""
    done = effectlog(tmp_path, "crash-matrix", "--help")

    listed = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("    ")]

    assert (0, ["run", "verify", "soak"], False) == (done.returncode, listed, "SUPPRESS" in done.stdout), done.stdout


# -- --json everywhere --------------------------------------------------------------------------


def test_approve_deny_head_and_reconcile_report_as_json(tmp_path: Path) -> None:
    """approve, deny and reconcile with ``--json`` print one JSON object naming the run, its
    state and the decided step; ``head --json`` prints run_id, seq and head; and ``run --json``
    of a held run carries the approve command."""
    noop = {"tool": {"type": "noop"}}
    held = [{"id": "pay", "adapter": "tool", "approval": "required"}]
    write_plan(tmp_path / "a.json", "held-a", noop, held)
    write_plan(tmp_path / "b.json", "held-b", noop, held)
    shell = {"sh": {"type": "shell"}}
    write_plan(
        tmp_path / "c.json",
        "slow",
        shell,
        [{"id": "wait", "adapter": "sh", "args": {"argv": ["sleep", "5"]}, "timeout_s": 0.2}],
    )
    held_a = effectlog(tmp_path, "run", "a.json", "--journal", "j.db", "--json")
    effectlog(tmp_path, "run", "b.json", "--journal", "j.db")
    effectlog(tmp_path, "run", "c.json", "--journal", "j.db")
    common = ("--journal", "j.db", "--json")

    approved = effectlog(tmp_path, "approve", *common, "--run-id", "held-a", "--step", "pay", "--by", "ana")
    denied = effectlog(tmp_path, "deny", *common, "--run-id", "held-b", "--step", "pay", "--by", "ana")
    reconciled = effectlog(
        tmp_path, "reconcile", *common, "--run-id", "slow", "--step", "wait",
        "--outcome", "not-applied", "--evidence", "no process ran", "--operator", "ana",
    )  # fmt: skip
    head = effectlog(tmp_path, "head", *common, "--run-id", "held-a")

    approve = "effectlog approve --journal j.db --run-id held-a --step pay --attempt 1 --by NAME"
    assert approve == json.loads(held_a.stdout)["approve_command"]
    assert ("held-a", "suspended", "approved") == _decided(approved)
    assert ("held-b", "failed", "denied") == _decided(denied)
    assert ("slow", "stopped", "pending") == _decided(reconciled)  # not applied: a new attempt may run
    assert "not_applied" == json.loads(reconciled.stdout)["step"]["outcome"]
    assert ["head", "run_id", "seq"] == sorted(json.loads(head.stdout))


def _decided(done: subprocess.CompletedProcess[str]) -> tuple[str, str, str]:
    assert 0 == done.returncode, done.stderr
    data = json.loads(done.stdout)
    return data["run_id"], data["run_state"], data["step"]["state"]


# -- third-party adapters: lazy entry points --------------------------------------------------


def _install(site: Path, dist: str, version: str, entry: str, module: str | None = None) -> None:
    """A real installed distribution: NAME-VERSION.dist-info with METADATA and entry_points.txt."""
    info = site / f"{dist}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[effectlog.adapters]\n{entry}\n")
    if module is not None:
        (site / f"{dist}.py").write_text(module)


@pytest.fixture
def plugins(tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir()
    _install(site, "brokenplug", "1.0", "broken = brokenplug_gone:FACTORY")
    good = (
        "class Echo:\n"
        "    blocking = False\n"
        "    def invoke(self, request):\n"
        "        return {'echo': request.step_id}\n"
        "def factory(decl, context):\n"
        "    return Echo()\n"
    )
    _install(site, "goodplug", "2.0", "echo = goodplug:factory", good)
    return {"PYTHONPATH": str(site)}


@pytest.mark.parametrize("adapter_type", ["noop", "echo"])
def test_a_broken_third_party_adapter_does_not_break_plans_that_do_not_name_it(
    tmp_path: Path, plugins: dict[str, str], adapter_type: str
) -> None:
    """With a distribution whose entry point cannot be imported installed, a plan of built-in
    adapters and a plan of another plug-in's adapter both complete: entry points are imported
    only when a plan names their type."""
    plan = write_plan(tmp_path / "p.json", "r", {"t": {"type": adapter_type}}, [{"id": "s", "adapter": "t"}])

    done = effectlog(tmp_path, "run", plan, "--journal", "j.db", env=plugins)

    assert 0 == done.returncode, done.stderr


def test_a_plan_naming_a_broken_third_party_adapter_is_refused_naming_the_distribution(
    tmp_path: Path, plugins: dict[str, str]
) -> None:
    """A plan naming the broken type: exit 2, one line naming the type, the distribution and
    version, and the import error; no journal is created."""
    plan = write_plan(tmp_path / "p.json", "r", {"t": {"type": "broken"}}, [{"id": "s", "adapter": "t"}])

    done = effectlog(tmp_path, "run", plan, "--journal", "j.db", env=plugins)
    line = one_line(done.stderr)

    assert 2 == done.returncode
    assert [] == [w for w in ("'broken'", "brokenplug 1.0", "ModuleNotFoundError", "brokenplug_gone") if w not in line]
    assert not (tmp_path / "j.db").exists()


def test_runner_json_is_one_json_object_per_event_and_tools_print_to_stderr(tmp_path: Path) -> None:
    """``runner --json``: every line on stdout is one JSON object (newline-delimited), events of
    the request name its request id; what the tool prints goes to stderr, never between them.
    ``submit --json`` reports the request it created."""
    (tmp_path / "chatty_tools.py").write_text(
        "class Chatty:\n"
        "    def invoke(self, request):\n"
        "        print('tool chatter', flush=True)\n"
        "        return {}\n"
        "ADAPTERS = {'chatty': lambda decl, context: Chatty()}\n"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    plan = write_plan(tmp_path / "p.json", "fleet-r", {"t": {"type": "chatty"}}, [{"id": "s", "adapter": "t"}])
    submitted = effectlog(tmp_path, "submit", plan, "--store", "s.db", "--scope", "a", "--key", "1", "--json")

    done = effectlog(
        tmp_path, "runner", "--store", "s.db", "--adapters", "chatty_tools:ADAPTERS",
        "--exit-when-idle", "--poll-s", "0.01", "--json", env=env,
    )  # fmt: skip
    events = [json.loads(line) for line in done.stdout.splitlines()]

    assert (0, True) == (submitted.returncode, json.loads(submitted.stdout)["created"]), submitted.stderr
    assert 0 == done.returncode, done.stderr
    assert [] == [e for e in events if sorted(e) != ["attempt_no", "message", "request_id", "runner_id", "ts"]]
    assert 1 in {e["request_id"] for e in events}
    assert ("tool chatter" in done.stderr, "tool chatter" in done.stdout) == (True, False)
