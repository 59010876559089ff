"""The fleet's numeric settings: what is accepted, checked once, before anything is claimed or written.

A lease is a time in the future, by the store's clock. A lease of NaN or infinity
never expires, so nobody could ever take its request back; one of zero or less is
expired before it is granted. Every duration a runner, the recovery service or a
submitter gives is a finite number in a stated range, else ``BadInput`` (exit 2).
The store applies the same bound when it reads: a lease whose expiry is NULL, NaN,
or further away than the longest lease it would grant is treated as expired.
"""

from __future__ import annotations

import math

from effectlog.errors import BadInput

MAX_LEASE_S = 86_400.0  # a day: a lease longer than this is a lock nobody can break in time
MAX_POLL_S = 3_600.0
MAX_CAPACITY = 256
MAX_REQUEUES = 100
MAX_BACKOFF_S = 3_600.0
DEFAULT_MAX_REQUEUES = 3
DEFAULT_REQUEUE_BACKOFF_S = 2.0  # the first automatic requeue waits this long, each next one twice as long


def seconds(flag: str, value: float, *, high: float, zero: bool = False) -> float:
    """``value`` if it is a finite number of seconds in ``(0, high]`` (``[0, high]`` with ``zero``)."""
    low_ok = value >= 0 if zero else value > 0
    if not (isinstance(value, int | float) and math.isfinite(value) and low_ok and value <= high):
        lowest = "0" if zero else "more than 0"
        raise BadInput(f"{flag} {value!r}: give a finite number of seconds, {lowest} and at most {high:g}")
    return float(value)


def count(flag: str, value: int, *, low: int, high: int) -> int:
    if not low <= value <= high:
        raise BadInput(f"{flag} {value}: give a whole number from {low} to {high}")
    return value


def runner_timing(lease_s: float, heartbeat_s: float | None, poll_s: float) -> tuple[float, float, float]:
    """``(lease, heartbeat, poll)`` checked; the heartbeat defaults to a third of the lease and must be shorter."""
    lease = seconds("--lease-s", lease_s, high=MAX_LEASE_S)
    beat = lease / 3 if heartbeat_s is None else seconds("--heartbeat-s", heartbeat_s, high=MAX_LEASE_S)
    if beat >= lease:
        raise BadInput(f"--heartbeat-s {beat:g}: must be shorter than the lease (--lease-s {lease:g})")
    return lease, beat, seconds("--poll-s", poll_s, high=MAX_POLL_S)


def requeue_delay(base_s: float, requeues: int) -> float:
    """The wait before the ``requeues``-th automatic requeue can be claimed: ``base * 2**(n-1)``, capped."""
    if requeues < 1 or base_s <= 0:
        return 0.0
    return min(base_s * 2.0 ** min(requeues - 1, 30), MAX_BACKOFF_S)
