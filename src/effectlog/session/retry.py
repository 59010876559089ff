"""Retrying a model call: 429, 5xx and lost connections, with exponential backoff, jitter and ``Retry-After``.

Every try sends the same request with the same idempotency key, so a provider that
honours the key bills one generation however many tries it takes. Past the limit the
call raises ``ModelUnavailable``: the step's intent stays in the journal, the run stays
open, and a later pass sends the same request again with the same key.

Only model calls are retried here. A tool call is never retried behind the journal's
back: a tool declares its own retries (``durable.tool(retry=...)``).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from email.utils import parsedate_to_datetime
from typing import TypeVar

import msgspec

from effectlog.errors import ModelUnavailable

T = TypeVar("T")
Wait = Callable[[float], Awaitable[None]]

# 408 timeout, 409 "the first request with this key is still being processed", 425 too early, 429 rate limit.
RETRY_STATUSES = frozenset({408, 409, 425, 429})


def retryable_status(status: int) -> bool:
    return status in RETRY_STATUSES or 500 <= status <= 599


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How often and how patiently a model call is tried."""

    attempts: int = 6  # tries in all, the first one included
    base_s: float = 0.5  # the first backoff; each next one doubles
    max_s: float = 30.0  # no backoff is longer
    max_retry_after_s: float = 300.0  # a provider asking for a longer pause ends the tries (the run stays open)

    def backoff(self, retry: int, rng: random.Random) -> float:
        """Exponential backoff with "equal jitter": half fixed, half random, so clients spread out."""
        ceiling: float = min(self.max_s, self.base_s * 2.0**retry)
        return ceiling / 2 + rng.uniform(0, ceiling / 2)


class TryAgain(Exception):
    """What a classifier makes of a failure worth another try: why, and the provider's ``Retry-After``."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """``Retry-After`` in seconds from ``now`` (a number or an HTTP date); ``None`` if absent or unreadable."""
    if not value:
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - now)


async def with_retries(
    send: Callable[[], Awaitable[T]],
    *,
    classify: Callable[[Exception], TryAgain | None],
    what: str,
    policy: RetryPolicy,
    wait: Wait,
    rng: random.Random,
) -> T:
    """``send()`` until it answers, a failure ``classify`` does not retry, or the policy's limit."""
    last = ""
    for attempt in range(policy.attempts):
        try:
            return await send()
        except Exception as exc:
            again = classify(exc)
            if again is None:
                raise
            last = again.reason
        if attempt + 1 == policy.attempts:
            break
        if again.retry_after is not None and again.retry_after > policy.max_retry_after_s:
            raise ModelUnavailable(
                f"{what}: the provider asks to wait {again.retry_after:.0f}s ({last}), longer than "
                f"{policy.max_retry_after_s:.0f}s; the run stays open: run it again later (same key, billed once)",
                reason=last,
            )
        pause = again.retry_after if again.retry_after is not None else policy.backoff(attempt, rng)
        await wait(pause)
    raise ModelUnavailable(
        f"{what} failed {policy.attempts} times (last: {last}); the run stays open: run it again later "
        "(the same request and key, billed once)",
        reason=last,
        attempts=policy.attempts,
    )
