"""A gateway for OpenAI-compatible chat completion endpoints, over httpx (extra: ``effectlog[http]``).

Each request carries the step's key in the ``Idempotency-Key`` header, so a provider
that honours it answers a resent request (after a crash between send and record)
from its first generation instead of billing a second one. Status codes follow the
IETF Idempotency-Key draft: 422 means the key was used with another body
(``IdempotencyConflict``, never a replay); 409 means the first request with this key
is still being processed (tried again, like 429 and 5xx).

429, 5xx and connection errors are tried again with the same key (``RetryPolicy``:
exponential backoff with jitter, ``Retry-After`` honoured); past the limit the call
raises ``ModelUnavailable`` and the run stays open. Another refusal (400, 401, 404...)
raises ``ModelRefused``. Neither is a raw httpx error.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from typing import Any

import httpx

from effectlog.canonical import canonical_json
from effectlog.errors import BadInput, IdempotencyConflict, ModelRefused
from effectlog.session.gateway import ToolboxGateway
from effectlog.session.retry import RetryPolicy, TryAgain, Wait, retry_after_seconds, retryable_status, with_retries
from effectlog.session.tools import Toolbox

IDEMPOTENCY_HEADER = "Idempotency-Key"


class OpenAIGateway(ToolboxGateway):
    """``POST {base_url}/chat/completions`` with the body's canonical bytes and the step's key."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        tools: Toolbox | None = None,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy | None = None,
        wait: Wait | None = None,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(model=model, tools=tools)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.transport = transport
        self.retry = retry or RetryPolicy()
        self.wait: Wait = wait or asyncio.sleep  # a test injects one: no test waits on the wall clock
        self.rng = rng or random.Random()
        self.calls = 0

    async def complete(self, body: Mapping[str, Any], *, idempotency_key: str) -> dict[str, Any]:
        return await with_retries(
            lambda: self._post(body, idempotency_key),
            classify=_try_again,
            what=f"model call to {self.url}",
            policy=self.retry,
            wait=self.wait,
            rng=self.rng,
        )

    async def _post(self, body: Mapping[str, Any], idempotency_key: str) -> dict[str, Any]:
        headers = {**self.headers, "Content-Type": "application/json", IDEMPOTENCY_HEADER: idempotency_key}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        self.calls += 1
        async with httpx.AsyncClient(timeout=self.timeout_s, transport=self.transport) as client:
            response = await client.post(self.url, content=canonical_json(dict(body)), headers=headers)
        if response.status_code == httpx.codes.UNPROCESSABLE_ENTITY:
            raise IdempotencyConflict(
                f"the provider refused key {idempotency_key!r}: it was used with a different request body "
                f"({response.text[:200]})",
                key=idempotency_key,
            )
        if retryable_status(response.status_code):
            raise TryAgain(
                f"HTTP {response.status_code}",
                retry_after_seconds(response.headers.get("Retry-After"), time.time()),
            )
        if response.is_error:
            raise ModelRefused(
                f"{self.url} refused the request: HTTP {response.status_code} ({response.text[:200]})",
                status=response.status_code,
                key=idempotency_key,
            )
        try:
            data = response.json()
        except ValueError as exc:
            raise BadInput(f"{self.url} answered with something that is not JSON") from exc
        if not isinstance(data, dict):
            raise BadInput(f"{self.url} answered with JSON that is not an object")
        return data


def _try_again(exc: Exception) -> TryAgain | None:
    if isinstance(exc, TryAgain):
        return exc
    if isinstance(exc, httpx.TransportError):  # no connection, reset, timed out: the request may not have arrived
        return TryAgain(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
    return None
