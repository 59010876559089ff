"""Retries of the pydantic-ai model requests a ``DurableAgent`` journals (issue 17 item 5).

The wrapped model's request is tried again on 429, 5xx and connection errors, with the
step's same idempotency key, exponential backoff with jitter and the provider's
``Retry-After`` (``effectlog.session.retry``); past the limit, ``ModelUnavailable`` and the
run stays open. ``POLICY`` and ``WAIT`` are the settings (a test replaces ``WAIT``).
Turn the provider client's own retries off (``max_retries=0``) to count tries in one place.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
from pydantic_ai.exceptions import ModelConnectionError, ModelHTTPError

from effectlog.session.retry import RetryPolicy, TryAgain, Wait, retryable_status, with_retries

T = TypeVar("T")

POLICY = RetryPolicy()
WAIT: Wait = asyncio.sleep
_RNG = random.Random()


def classify(exc: Exception) -> TryAgain | None:
    """A pydantic-ai model error worth another try with the same key, or ``None``."""
    if isinstance(exc, ModelHTTPError) and retryable_status(exc.status_code):
        return TryAgain(f"HTTP {exc.status_code}", getattr(exc, "retry_after", None))
    if isinstance(exc, ModelConnectionError | httpx.TransportError):
        return TryAgain(type(exc).__name__)
    return None


async def retried(send: Callable[[], Awaitable[T]], what: str) -> T:
    return await with_retries(send, classify=classify, what=what, policy=POLICY, wait=WAIT, rng=_RNG)
