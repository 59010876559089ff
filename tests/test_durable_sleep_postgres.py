"""Durable sleep and deadlines on PostgreSQL: the same events, the same remainder (issue 17 item 4)."""

from __future__ import annotations

import pytest

from effectlog import durable
from effectlog.errors import DeadlinePassed

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.postgres

T0 = 1_800_000_000 * 10**9
S = 10**9


class Ended(Exception):
    """The pass ends during its sleep (as a process would)."""


def test_a_sleep_resumed_on_postgres_waits_only_the_remainder_and_a_deadline_expires_a_step(pg_url: str) -> None:
    """First pass records the wake-up time and ends in the wait; the next, 100 s later, waits 20 s and completes.
    A run whose deadline passed fails its first step by contract."""

    def ended(seconds: float) -> None:
        raise Ended

    with pytest.raises(Ended), durable.run("pg-nap", journal=pg_url, clock=lambda: T0, sleeper=ended) as run:
        run.sleep(120)
    waits: list[float] = []
    with durable.run("pg-nap", journal=pg_url, clock=lambda: T0 + 100 * S, sleeper=waits.append) as run:
        run.sleep(120)
        assert "running" == run.session.state.state
    assert [20.0] == waits
    with pytest.raises(DeadlinePassed), durable.run("pg-late", journal=pg_url, clock=lambda: T0, deadline=1.0):
        durable.sleep(1)
