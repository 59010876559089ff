"""Shared parts of the console tests: journals with runs that wait for a person, a real console server.

The server is ``python -m effectlog console`` as a real process on 127.0.0.1 at a free
port; the runs are made by real ``effectlog run`` processes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from effectlog.console.users import hash_password, token_digest
from hardening_kit import effectlog

CARD = "4242424242424242"
NASTY = "<script>alert('x')</script>\"quoted\""  # must reach the page escaped, never as markup
PASSWORDS = {"olga": "olga-pw-1", "vik": "vik-pw-2"}
TOKENS = {"olga": "olga-token-" + "a" * 32, "vik": "vik-token-" + "b" * 32}

LOST_REPLY = """
class LostReply:
    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        self.store.apply_control(request)
        raise ConnectionError("connection reset after the effect")


class LostReplyWithLookup(LostReply):
    def lookup(self, request):
        return self.store.lookup(request)


class Echo:  # answers with its "say" arg: a receipt holding whatever text the test chose
    def invoke(self, request):
        return {"said": request.args["say"]}


ADAPTERS = {
    "test.echo": lambda decl, ctx: Echo(),
    "test.lost-reply": lambda decl, ctx: LostReply(ctx.effect_store()),
    "test.lost-reply-lookup": lambda decl, ctx: LostReplyWithLookup(ctx.effect_store()),
}
"""


def held_plan(run_id: str) -> dict[str, object]:
    return {
        "run_id": run_id,
        "adapters": {"payments": {"type": "effects.control", "version": "1", "idempotent": False}},
        "steps": [
            {
                "id": "refund",
                "adapter": "payments",
                "args": {"amount_cents": 50000, "note": NASTY, "card": CARD},
                "secret": ["card"],
                "approval": "required",
            }
        ],
    }


def uncertain_plan(run_id: str, adapter_type: str = "test.lost-reply") -> dict[str, object]:
    return {
        "run_id": run_id,
        "adapters": {"psp": {"type": adapter_type, "version": "1", "idempotent": False}},
        "steps": [{"id": "charge", "adapter": "psp", "args": {"amount_cents": 1299, "card": CARD}, "secret": ["card"]}],
    }


class Setup:
    """A directory with a journal (SQLite unless given), an effect store, a users file (olga: operator, vik: viewer)."""

    def __init__(self, tmp_path: Path, journal: str | None = None) -> None:
        self.dir = tmp_path
        self.journal = journal or str(tmp_path / "journal.db")
        self.effects = str(tmp_path / "effects.db")
        self.users = str(tmp_path / "users.toml")
        (tmp_path / "lost_tools.py").write_text(LOST_REPLY)
        Path(self.users).write_text(
            "".join(
                f'[users.{name}]\nrole = "{role}"\npassword = "{hash_password(PASSWORDS[name])}"\n'
                f'token_sha256 = "{token_digest(TOKENS[name])}"\n\n'
                for name, role in (("olga", "operator"), ("vik", "viewer"))
            )
        )

    def run(self, plan: dict[str, object], expected_status: int) -> None:
        name = f"{plan['run_id']}.json"
        (self.dir / name).write_text(json.dumps(plan))
        done = effectlog(
            "run", name, "--journal", self.journal, "--effects", self.effects, "--adapters", "lost_tools:ADAPTERS",
            cwd=self.dir, env={"PYTHONPATH": str(self.dir)},
        )  # fmt: skip
        assert expected_status == done.returncode, done.stderr

    def held(self, run_id: str = "refund-1") -> str:
        self.run(held_plan(run_id), 4)
        return run_id

    def uncertain(self, run_id: str = "charge-1") -> str:
        self.run(uncertain_plan(run_id), 3)
        return run_id

    def timeline(self, run_id: str) -> list[dict[str, object]]:
        done = effectlog("timeline", "--journal", self.journal, "--run-id", run_id, "--json", cwd=self.dir)
        assert 0 == done.returncode, done.stderr
        events: list[dict[str, object]] = json.loads(done.stdout)
        return events


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def console(setup: Setup, *extra: str) -> Iterator[str]:
    """``effectlog console`` serving ``setup``'s journal; yields its base URL; SIGTERM at the end."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(setup.dir)]))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "effectlog", "console", "--journal", setup.journal, "--users", setup.users,
         "--port", str(port), *extra],
        cwd=setup.dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120  # a Python start-up and the server's on a loaded machine
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the console did not start: {proc.communicate()[1]}") from None
                time.sleep(0.1)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(html: str) -> str:
    found = _CSRF.search(html)
    assert found is not None, html
    return found.group(1)


def login(base: str, user: str) -> tuple[httpx.Client, str]:
    """A client logged in as ``user``, and its session's CSRF token."""
    client = httpx.Client(base_url=base, follow_redirects=False, timeout=30)
    token = csrf_of(client.get("/login").text)
    done = client.post("/login", data={"user": user, "password": PASSWORDS[user], "csrf": token})
    assert (303, "/") == (done.status_code, done.headers.get("location")), done.text
    return client, csrf_of(client.get("/").text)


def effects_rows(setup: Setup) -> list[dict[str, object]]:
    done = effectlog("effects", "--effects", setup.effects, "--json", cwd=setup.dir)
    assert 0 == done.returncode, done.stderr
    rows: list[dict[str, object]] = json.loads(done.stdout)
    return rows


def digest_on_page(html: str) -> str:
    found = re.search(r'name="digest" value="([0-9a-f]{64})"', html)
    assert found is not None, html
    return found.group(1)
