"""durable.run on the PostgreSQL journal: a postgresql:// URL works where a SQLite path does."""

from __future__ import annotations

import pytest

from effectlog import durable
from effectlog.errors import ApprovalRequired
from effectlog.journal import open_journal
from effectlog.session import JournalCheckpointer

pytest_plugins = ["pg_fixture"]
pytestmark = pytest.mark.postgres


def test_a_held_call_is_approved_and_runs_once_on_postgres(pg_url: str) -> None:
    """Held, approved through the store, resumed on a new connection: paid once; the completed run pays nothing."""
    made: list[int] = []

    @durable.tool(idempotent=False, approval=lambda call: call.args["cents"] > 100)
    def pay(cents: int, idempotency_key: str = "") -> dict[str, object]:
        made.append(cents)
        return {"paid": cents, "key": idempotency_key}

    def one_pass() -> object:
        with durable.run("pg-run", journal=pg_url) as run:
            assert 5 == pay(5)["paid"]
            run.finish(pay(500))
        return run.result

    with pytest.raises(ApprovalRequired):
        one_pass()
    with JournalCheckpointer(open_journal(pg_url)) as store:
        store.approve("pg-run", "step-1", by="alice")
    first, again = one_pass(), one_pass()
    assert first == again
    assert [5, 500] == made
