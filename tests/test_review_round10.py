"""Review round 10: this session's changes tried as a new user, a tired operator and an attacker would.

Each test names the defect it reproduces; each runs real SQLite files and real ``effectlog`` processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from console_kit import Setup, free_port
from effectlog.errors import BadInput
from hardening_kit import cli_env, snapshot

PAYMENT = Path(__file__).resolve().parent.parent / "examples" / "payment.json"

# (journal, effects, trace): one file named as two of a Runtime's files.
SHARED = {
    "effects-is-the-journal": ("j.db", "j.db", None),
    "effects-is-the-journals-wal": ("j.db", "./j.db-wal", None),
    "trace-is-the-effect-store": ("j.db", "e.db", "e.db"),
    "trace-is-the-journals-wal": ("j.db", "e.db", "j.db-wal"),
}


@pytest.mark.parametrize(("journal", "effects", "trace"), SHARED.values(), ids=SHARED.keys())
def test_a_runtime_given_one_file_as_two_of_its_files_is_refused_before_any_is_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, journal: str, effects: str, trace: str | None
) -> None:
    """``Runtime("j.db", effects="j.db")`` (the Python API; the CLI's ``run`` was mended this session with
    ``sidecars.refuse_shared``) made the journal ``j.db`` and then refused the effect store "a SQLite file of
    something else ...; nothing was written", a file made by bad input and a message that says otherwise.
    Proves: the constructor refuses, naming the flag, and the directory is as it was."""
    from effectlog.runtime import Runtime

    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.json").write_text(PAYMENT.read_text())
    before = snapshot(tmp_path)

    with pytest.raises(BadInput, match="give each its own file"):
        Runtime(journal, effects=effects, trace=trace).run("p.json")

    assert before == snapshot(tmp_path)


def test_a_runtime_given_an_open_journals_file_as_its_effect_store_is_refused(tmp_path: Path) -> None:
    """A ``Journal`` object and ``effects=`` naming that journal's file by a hard link: refused before the
    effect store is opened (which added its tables to the journal), the journal's tables as they were."""
    from effectlog.journal import open_journal
    from effectlog.runtime import Runtime

    journal = open_journal(str(tmp_path / "j.db"))
    try:
        os.link(tmp_path / "j.db", tmp_path / "hard.db")
        tables = _tables(tmp_path / "j.db")
        with pytest.raises(BadInput, match="give each its own file"):
            Runtime(journal, effects=tmp_path / "hard.db").run(PAYMENT)
    finally:
        journal.close()

    assert tables == _tables(tmp_path / "j.db")


def _tables(path: Path) -> list[str]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return [row[0] for row in db.execute("SELECT name FROM sqlite_master ORDER BY name")]


def _console_start(setup: Setup, extra: list[str], env: dict[str, str]) -> tuple[int | None, str]:
    """Start ``effectlog console``; (exit status, stderr) if it exits, (None, its line) once it serves."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "effectlog", "console", "--journal", setup.journal, "--users", setup.users,
         "--port", str(free_port()), *extra],
        cwd=setup.dir, env=cli_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the "serving" line, or "" once it exits
        if line:
            return None, line
        return proc.wait(), proc.stderr.read() if proc.stderr is not None else ""
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait()


KEYS = {
    "key-file-missing": (["--key-file", "no-such-key"], {}, "--key-file no-such-key"),
    "key-for-an-unkeyed-journal": ([], {"EFFECTLOG_JOURNAL_KEY": "k"}, "opened as hmac"),
    "key-set-but-empty": ([], {"EFFECTLOG_JOURNAL_KEY": " "}, "EFFECTLOG_JOURNAL_KEY is set but empty"),
}


@pytest.mark.parametrize(("extra", "env", "message"), KEYS.values(), ids=KEYS.keys())
def test_a_console_whose_key_cannot_open_its_journal_exits_2_instead_of_serving_errors(
    tmp_path: Path, extra: list[str], env: dict[str, str], message: str
) -> None:
    """A console started with a mistyped ``--key-file``, a key for an unkeyed journal (or the wrong key),
    or ``EFFECTLOG_JOURNAL_KEY`` set empty printed "effectlog console: http://..." and served an error on
    every page: the key was first read at the first request. Proves: it exits 2 with one line naming what
    is wrong, before it serves."""
    setup = Setup(tmp_path)
    setup.held()

    status, said = _console_start(setup, extra, env)

    assert (2, True) == (status, message in said), said


def test_a_handoff_that_makes_a_new_agent_each_time_hands_to_that_agent_not_an_earlier_ones_clone() -> None:
    """A ``Handoff`` whose invocation builds its target agent anew (the SDK's ``on_invoke_handoff`` may
    return any agent) was made durable through a cache of clones keyed by ``id(agent)``: once the first
    target was collected, the next one was often built at its address and was handed the first one's
    clone, its instructions, tools and model (``['agent-0', 'agent-0', 'agent-0', ...]``). Proves: each
    invocation gets the clone of the agent it built. (The targets have no tools or model object, so the
    pass the clones would use is never reached: ``None`` stands for it.)"""
    import asyncio

    from agents import Agent, Handoff

    from effectlog.integrations.openai_agents import _durable_handoff

    async def build(ctx: object, arguments: str) -> Agent[None]:
        built.append(len(built))
        return Agent(name=f"agent-{built[-1]}", instructions=f"you are number {built[-1]}")

    built: list[int] = []
    given = Handoff(
        tool_name="go", tool_description="hand off", input_json_schema={}, on_invoke_handoff=build, agent_name="x"
    )
    durable = _durable_handoff(given, None, {})

    async def invoke_five() -> list[str]:
        return [(await durable.on_invoke_handoff(None, "{}")).name for _ in range(5)]

    assert [f"agent-{n}" for n in range(5)] == asyncio.run(invoke_five())
