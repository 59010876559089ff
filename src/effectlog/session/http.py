"""A gateway for OpenAI-compatible chat completion endpoints, over httpx (extra: ``effectlog[http]``).

Each request carries the step's key in the ``Idempotency-Key`` header, so a provider
that honours it answers a resent request (after a crash between send and record)
from its first generation instead of billing a second one. Status codes follow the
IETF Idempotency-Key draft: 422 means the key was used with another body
(``IdempotencyConflict``, never a replay); 409 means the first request with this key
is still being processed (an HTTP error: the intent stays, the next pass resends).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from effectlog.canonical import canonical_json
from effectlog.errors import BadInput, IdempotencyConflict
from effectlog.session.gateway import ToolboxGateway
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
    ) -> None:
        super().__init__(model=model, tools=tools)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.headers = dict(headers or {})
        self.transport = transport
        self.calls = 0

    async def complete(self, body: Mapping[str, Any], *, idempotency_key: str) -> dict[str, Any]:
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
        response.raise_for_status()
        data = response.json()
        if not isinstance(data, dict):
            raise BadInput(f"{self.url} answered with JSON that is not an object")
        return data
