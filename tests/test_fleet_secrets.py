"""Secret args in the fleet: the store keeps digests, the runner supplies the values from its own machine.

Real `effectlog submit` and `effectlog runner` processes on SQLite and PostgreSQL
stores. After the submit and after the run, every byte the store holds (the SQLite
file with its -wal and -shm; every row of every table of both PostgreSQL schemas) is
searched for the secret value: it is never there, as in a plain run's journal. The
tool still receives the real value, from the runner's environment or its provider hook,
and only when it hashes to the submitted digest.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from effectlog.fleet import is_postgres, open_store

pytest_plugins = ["pg_fixture", "fleet_kit"]

TOOLS = '''
import os

class Record:
    """A tool that writes the card it was given to a file beside the test (not to any store)."""

    def __init__(self, path):
        self.path = path

    def invoke(self, request):
        with open(self.path, "a") as f:
            f.write(request.args["card"] + "\\n")
        return {"ok": True}


ADAPTERS = {"test.record": lambda decl, ctx: Record(decl.options["path"])}


def provide(wanted):
    """A secrets provider hook: the runner asks, by run, step, arg name and digest."""
    return os.environ.get("HOOK_CARD") if wanted.name == "card" else None
'''


def store_bytes(url: str) -> bytes:
    """Every byte the store holds: the SQLite file and its companions, or every row of both PostgreSQL schemas."""
    if not is_postgres(url):
        files = [Path(url + suffix) for suffix in ("", "-wal", "-shm")]
        return b"".join(f.read_bytes() for f in files if f.exists())
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT schemaname, tablename FROM pg_catalog.pg_tables"
            " WHERE schemaname IN ('effectlog', 'effectlog_fleet')"
        ).fetchall()
        assert len(tables) >= 5
        rows = [
            str(row[0]).encode()
            for schema, table in tables
            for row in conn.execute(f'SELECT t::text FROM "{schema}"."{table}" t').fetchall()
        ]
    return b"\n".join(rows)


def cli(tmp_path: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run(
        [sys.executable, "-m", "effectlog", *argv], capture_output=True, text=True, timeout=120, check=False,
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": path, **(env or {})},
    )  # fmt: skip


def submit_secret_plan(tmp_path: Path, store_url: str, card: str) -> None:
    (tmp_path / "record_tools.py").write_text(TOOLS)
    plan = {
        "run_id": "pay-1",
        "adapters": {"rec": {"type": "test.record", "options": {"path": str(tmp_path / "received.txt")}}},
        "steps": [{"id": "charge", "adapter": "rec", "args": {"card": card, "amount_cents": 1299}, "secret": ["card"]}],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    done = cli(tmp_path, "submit", "plan.json", "--store", store_url, "--scope", "shop", "--key", "order-1")
    assert 0 == done.returncode, done.stderr


@pytest.mark.parametrize("source", ["environment", "provider-hook"])
def test_a_secret_arg_is_never_in_the_fleet_store_and_the_tool_still_gets_it(
    tmp_path: Path, store_url: str, source: str
) -> None:
    """After submit and after a successful run, the store holds the secret's digest and never its value.

    The runner supplies the value (EFFECTLOG_SECRET_CARD, or `--secrets record_tools:provide`),
    the tool receives exactly it, and no command prints it.
    """
    card = f"4111-{secrets.token_hex(8)}"
    submit_secret_plan(tmp_path, store_url, card)
    assert card.encode() not in store_bytes(store_url)
    assert b"$secret_sha256" in store_bytes(store_url)

    if source == "environment":
        env, extra = {"EFFECTLOG_SECRET_CARD": card}, ()
    else:
        env, extra = {"HOOK_CARD": card}, ("--secrets", "record_tools:provide")
    runner = cli(
        tmp_path, "runner", "--store", store_url, "--adapters", "record_tools:ADAPTERS", "--exit-when-idle",
        "--poll-s", "0.05", *extra, env=env,
    )  # fmt: skip
    assert 0 == runner.returncode, runner.stderr
    with open_store(store_url) as store:
        assert ["succeeded"] == [r.state for r in store.requests()], store.history()
    assert [card] == (tmp_path / "received.txt").read_text().splitlines()
    assert card.encode() not in store_bytes(store_url)
    listed = cli(tmp_path, "requests", "--store", store_url, "--request", "1", "--json")
    assert card not in runner.stdout + runner.stderr + listed.stdout + listed.stderr


@pytest.mark.parametrize("given", [None, "4111-another-card"], ids=["missing", "another-value"])
def test_a_runner_without_the_submitted_secret_fails_the_attempt_before_any_step(
    tmp_path: Path, store_url: str, given: str | None
) -> None:
    """No value, or a value whose digest is not the submitted one: the attempt fails (secret_unavailable)
    before any step is requested, the tool is never called, and neither value reaches the store."""
    card = f"4111-{secrets.token_hex(8)}"
    submit_secret_plan(tmp_path, store_url, card)
    env = {} if given is None else {"EFFECTLOG_SECRET_CARD": given}
    runner = cli(
        tmp_path, "runner", "--store", store_url, "--adapters", "record_tools:ADAPTERS", "--exit-when-idle",
        "--poll-s", "0.05", env=env,
    )  # fmt: skip
    assert 0 == runner.returncode, runner.stderr
    with open_store(store_url) as store:
        assert ["failed"] == [r.state for r in store.requests()]
        reason = store.history()[-1].reason
        assert 0 == store.journal().head("pay-1")[0]
    assert ("holds no value" if given is None else "not the submitted one") in reason
    assert not (tmp_path / "received.txt").exists()
    stored = store_bytes(store_url)
    assert card.encode() not in stored
    assert given is None or given.encode() not in stored


@pytest.mark.parametrize("spec", ["no_such_module:provide", "record_tools:ADAPTERS"], ids=["missing", "not-callable"])
def test_a_bad_secrets_provider_exits_2_before_the_store_exists(tmp_path: Path, spec: str) -> None:
    """`runner --secrets` naming nothing importable, or something that is not a callable: exit 2, no store file."""
    (tmp_path / "record_tools.py").write_text(TOOLS)
    done = cli(tmp_path, "runner", "--store", "fleet.db", "--secrets", spec, "--exit-when-idle")
    assert (2, 1) == (done.returncode, len(done.stderr.splitlines())), done.stderr
    assert not (tmp_path / "fleet.db").exists()
