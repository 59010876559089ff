"""Model-call retries (issue 17 item 5): 429, 5xx and lost connections are tried again with the same key.

A real provider stand-in on 127.0.0.1 answers with the faults each test scripts; the
backoff waits are recorded by an injected ``wait`` (no test waits on the wall clock).
"""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path

import pytest

from effectlog.errors import ExitStatus, ModelRefused, ModelUnavailable
from effectlog.session import Session, SqliteCheckpointer
from effectlog.session.http import OpenAIGateway
from effectlog.session.retry import RetryPolicy, retry_after_seconds
from provider_standin import ProviderStandIn

RUN = "run-r"
MESSAGES = [{"role": "user", "content": "hi"}]


class Waits:
    def __init__(self) -> None:
        self.asked: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)


@pytest.fixture
def provider() -> Iterator[ProviderStandIn]:
    server = ProviderStandIn(["hello"]).start()
    yield server
    server.stop()


def gateway(url: str, waits: Waits, attempts: int = 6) -> OpenAIGateway:
    return OpenAIGateway(
        url, model="stand-in", retry=RetryPolicy(attempts=attempts), wait=waits, rng=random.Random(7), timeout_s=10
    )


async def one_call(store: SqliteCheckpointer, gw: OpenAIGateway) -> dict[str, object]:
    session = Session(RUN, gw, store)
    try:
        return await session.model(MESSAGES, model="stand-in")
    finally:
        session.release()


def test_429_then_500_then_200_bills_one_generation_under_one_key(provider: ProviderStandIn, tmp_path: Path) -> None:
    """A 429 with Retry-After: 2, then a 500, then the answer: three requests, one key, one generation billed;
    the first pause is the provider's Retry-After, the second an exponential backoff with jitter."""
    provider.faults = [(429, {"Retry-After": "2"}), (500, {})]
    waits = Waits()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        answer = asyncio.run(one_call(store, gateway(provider.url, waits)))
        key = store.state(RUN).steps["step-0"].idempotency_key
        assert "confirmed" == store.state(RUN).steps["step-0"].state
    assert "hello" == answer["choices"][0]["message"]["content"]  # type: ignore[index]
    assert (3, 1) == (provider.requests, provider.billed)
    assert [key, key, key] == provider.keys_seen
    assert 2.0 == waits.asked[0]
    assert 2 == len(waits.asked)
    assert 0.5 <= waits.asked[1] <= 1.0  # backoff 2 ** 1 * 0.5 = 1.0 with equal jitter: in [0.5, 1.0]


def test_past_the_limit_the_error_is_clear_and_the_run_stays_open_and_resumable(
    provider: ProviderStandIn, tmp_path: Path
) -> None:
    """Five 503s against a limit of 3 tries: ModelUnavailable (one line, exit 130, run and step named), the step's
    intent stays; the next pass, the provider healthy again, sends the same key and completes, billed once."""
    provider.faults = [(503, {})] * 3
    waits = Waits()
    with SqliteCheckpointer(tmp_path / "runs.db") as store:
        with pytest.raises(ModelUnavailable) as caught:
            asyncio.run(one_call(store, gateway(provider.url, waits, attempts=3)))
        error = caught.value
        assert (ExitStatus.INTERRUPTED, RUN, "step-0") == (error.exit_status, error.run_id, error.step_id)
        assert "\n" not in str(error)
        assert "HTTP 503" in str(error)
        state = store.state(RUN)
        assert ("running", "requested") == (state.state, state.steps["step-0"].state)
        asyncio.run(one_call(store, gateway(provider.url, waits)))
        assert "confirmed" == store.state(RUN).steps["step-0"].state
    assert 1 == provider.billed
    assert 1 == len(set(provider.keys_seen))


def test_a_dead_endpoint_is_retried_then_a_clear_error(tmp_path: Path) -> None:
    """Nothing listens on the port: connection errors are retried to the limit, then ModelUnavailable, not httpx."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    waits = Waits()
    with SqliteCheckpointer(tmp_path / "runs.db") as store, pytest.raises(ModelUnavailable) as caught:
        asyncio.run(one_call(store, gateway(f"http://127.0.0.1:{port}/v1", waits, attempts=4)))
    assert 3 == len(waits.asked)
    assert "ConnectError" in str(caught.value)


def test_a_refusal_is_not_retried_and_is_not_a_raw_httpx_error(provider: ProviderStandIn, tmp_path: Path) -> None:
    """A 401 is final: one request, ModelRefused naming the status, no wait."""
    provider.faults = [(401, {})]
    waits = Waits()
    with SqliteCheckpointer(tmp_path / "runs.db") as store, pytest.raises(ModelRefused) as caught:
        asyncio.run(one_call(store, gateway(provider.url, waits)))
    assert ([], 1, 401) == (waits.asked, provider.requests, caught.value.fields["status"])


@pytest.mark.parametrize(
    ("header", "expected"),
    [("3", 3.0), ("0", 0.0), ("-4", 0.0), ("soon", None), (None, None), (formatdate(1000.0 + 30, usegmt=True), 30.0)],
)
def test_retry_after_is_read_as_seconds_or_as_an_http_date(header: str | None, expected: float | None) -> None:
    """Retry-After: delta-seconds or an HTTP date (relative to now); anything else is ignored."""
    assert expected == retry_after_seconds(header, now=1000.0)


def test_a_long_retry_after_ends_the_tries_at_once(provider: ProviderStandIn, tmp_path: Path) -> None:
    """A provider asking for a pause longer than the policy allows: no wait, ModelUnavailable, run open."""
    provider.faults = [(429, {"Retry-After": "3600"})]
    waits = Waits()
    with SqliteCheckpointer(tmp_path / "runs.db") as store, pytest.raises(ModelUnavailable):
        asyncio.run(one_call(store, gateway(provider.url, waits)))
    assert [] == waits.asked


def test_the_cli_style_message_has_no_traceback(tmp_path: Path) -> None:
    """A child process whose model endpoint is dead prints one line naming the run and step, no traceback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    code = f"""
import asyncio, sys
from effectlog.errors import EffectlogError
from effectlog.session import Session, SqliteCheckpointer
from effectlog.session.http import OpenAIGateway
from effectlog.session.retry import RetryPolicy
async def main():
    gw = OpenAIGateway("http://127.0.0.1:{port}/v1", model="m", retry=RetryPolicy(attempts=2, base_s=0.01))
    with SqliteCheckpointer(sys.argv[1]) as store:
        await Session("r", gw, store).model([{{"role": "user", "content": "hi"}}])
try:
    asyncio.run(main())
except EffectlogError as exc:
    print(exc, file=sys.stderr)
    sys.exit(exc.exit_status)
"""
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "r.db")], capture_output=True, text=True, timeout=60, check=False
    )
    assert ExitStatus.INTERRUPTED == done.returncode
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("run 'r', step 'step-0': model call to")


def test_a_durable_agent_model_request_is_retried_with_the_same_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pydantic-ai: a 429 (ModelHTTPError) then a 503 from the wrapped model are tried again under the step's one
    idempotency key; the run completes with one model step."""
    from pydantic_ai import Agent
    from pydantic_ai.exceptions import ModelHTTPError
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from effectlog.integrations import pydantic_ai_retry
    from effectlog.integrations.pydantic_ai import IDEMPOTENCY_HEADER, DurableAgent

    waits = Waits()
    monkeypatch.setattr(pydantic_ai_retry, "WAIT", waits)
    faults = [429, 503]
    keys: list[str] = []

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        keys.append((info.model_settings or {}).get("extra_headers", {})[IDEMPOTENCY_HEADER])
        if faults:
            raise ModelHTTPError(faults.pop(0), "fn")
        return ModelResponse(parts=[TextPart("done")])

    durable = DurableAgent(Agent(FunctionModel(answer)), journal=tmp_path / "runs.db")
    result = asyncio.run(durable.run("go", run_id="pa"))
    assert "done" == result.output
    assert (3, 1, 2) == (len(keys), len(set(keys)), len(waits.asked))
