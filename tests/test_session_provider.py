"""Provider idempotency: the key (run_id, step_id, body digest) travels as Idempotency-Key, and a crash
between send and record does not bill a second generation."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from effectlog.errors import IdempotencyConflict
from effectlog.session import Session, SqliteCheckpointer, provider_key
from effectlog.session.http import OpenAIGateway
from provider_standin import ProviderStandIn
from session_kit import ROOT, drive, toolbox

RUN = "run-1"
BODY = {"model": "stand-in", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def provider() -> Iterator[ProviderStandIn]:
    server = ProviderStandIn([("transfer", {"to": "bob", "amount": 5}), "sent 5 to bob"]).start()
    yield server
    server.stop()


def gateway(provider: ProviderStandIn, tmp_path: Path) -> OpenAIGateway:
    return OpenAIGateway(provider.url, model="stand-in", tools=toolbox(tmp_path / "calls.log", idempotent=False))


def test_the_key_names_run_step_and_body() -> None:
    """provider_key is (run_id, step_id, sha256(canonical body)[:16]); key order in the body does not matter."""
    key = provider_key("run 1", "step-0", BODY)
    run, step, body16 = key.split("/")
    assert ("run%201", "step-0", 16) == (run, step, len(body16))
    assert key == provider_key("run 1", "step-0", dict(reversed(list(BODY.items()))))
    assert key != provider_key("run 1", "step-0", {**BODY, "messages": []})
    assert key != provider_key("run 2", "step-0", BODY)


def test_without_a_key_every_send_is_billed(provider: ProviderStandIn) -> None:
    """The control: the stand-in bills each request that carries no key, so a blind retry costs twice."""
    for _ in range(2):
        httpx.post(provider.url + "/chat/completions", json=BODY, timeout=10).raise_for_status()
    assert 2 == provider.billed


def test_the_same_key_and_body_is_answered_from_the_first_generation(provider: ProviderStandIn, tmp_path: Path) -> None:
    """Sending the same key twice bills once and returns the same generation both times."""
    gw = gateway(provider, tmp_path)
    first = asyncio.run(gw.complete(BODY, idempotency_key="k"))
    second = asyncio.run(gw.complete(BODY, idempotency_key="k"))
    assert (1, 1) == (provider.billed, provider.replayed)
    assert first == second


def test_a_key_reused_with_another_body_is_an_idempotency_conflict(provider: ProviderStandIn, tmp_path: Path) -> None:
    """A key names one request: the provider's 422 for another body becomes IdempotencyConflict, never a replay."""
    gw = gateway(provider, tmp_path)
    asyncio.run(gw.complete(BODY, idempotency_key="k"))
    with pytest.raises(IdempotencyConflict):
        asyncio.run(gw.complete({**BODY, "messages": [{"role": "user", "content": "bye"}]}, idempotency_key="k"))
    assert 1 == provider.billed


def test_each_model_step_sends_its_key_as_the_idempotency_key_header(provider: ProviderStandIn, tmp_path: Path) -> None:
    """The header the provider receives is the key the journal recorded for the step."""

    async def body(s: Session) -> None:
        await s.model(BODY["messages"], model="stand-in")

    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        asyncio.run(body(Session(RUN, gateway(provider, tmp_path), store)))
        recorded = store.load(RUN).run.steps["step-0"].idempotency_key
    assert [provider_key(RUN, "step-0", BODY)] == provider.keys_seen
    assert recorded == provider.keys_seen[0]


@pytest.mark.crash
def test_a_crash_between_send_and_record_is_not_billed_twice(provider: ProviderStandIn, tmp_path: Path) -> None:
    """A child process is SIGKILLed after the provider answered and before the answer was recorded; the resumed
    call carries the same key, so the provider answers from the first generation and bills it once."""
    journal, calls = tmp_path / "runs.db", tmp_path / "calls.log"
    child = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "session_child.py"),
            str(journal),
            RUN,
            str(calls),
            "after_call",
            "step-0",
            "0",
            provider.url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert -signal.SIGKILL == child.returncode, child.stderr
    assert 1 == provider.billed
    with SqliteCheckpointer(journal) as store:
        assert "requested" == store.state(RUN).steps["step-0"].state
        steps = asyncio.run(drive(Session(RUN, gateway(provider, tmp_path), store)))
    assert "gen-1" == steps[0].response["id"]  # the generation billed before the crash
    assert not steps[0].replayed  # it was asked again, and the provider answered from its record
    assert (2, 1) == (provider.billed, provider.replayed)  # step-0 once, the final answer once
    assert provider.keys_seen[0] == provider.keys_seen[1]
    assert "sent 5 to bob" == steps[-1].result
