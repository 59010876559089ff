"""The operator console on a PostgreSQL journal: the same pages and decisions as on SQLite (issue 15)."""

from __future__ import annotations

from pathlib import Path

from console_kit import Setup, console, digest_on_page, effects_rows, held_plan, login

pytest_plugins = ["pg_fixture"]


def test_on_postgres_needs_attention_lists_the_held_run_and_approve_is_journaled_once(
    tmp_path: Path, pg_url: str
) -> None:
    """A run held for approval in a PostgreSQL journal is listed in Needs attention; approving it
    from the page records step.approved by the logged-in operator; the resumed run applies it once."""
    setup = Setup(tmp_path, journal=pg_url)
    setup.held("refund-pg")
    with console(setup) as base:
        client, token = login(base, "olga")
        attention = client.get("/").text
        digest = digest_on_page(client.get("/runs/refund-pg").text)
        done = client.post("/runs/refund-pg/steps/refund/approve", data={"csrf": token, "digest": digest})

    assert ("held for approval: 1" in attention, 303) == (True, done.status_code)
    approved = [(e["by"], e["args_digest"]) for e in setup.timeline("refund-pg") if e["type"] == "step.approved"]
    assert [("olga", digest)] == approved
    setup.run(held_plan("refund-pg"), 0)
    assert [("refund-pg", "refund", 1)] == [(r["run_id"], r["step_id"], r["attempt"]) for r in effects_rows(setup)]


def test_on_postgres_the_change_feed_answers_when_another_process_appends(tmp_path: Path, pg_url: str) -> None:
    """On a PostgreSQL journal, /api/changes with the current version reports no change while nothing
    is written, and a new version once a real ``effectlog run`` process has appended another run."""
    import httpx

    from console_kit import TOKENS

    setup = Setup(tmp_path, journal=pg_url)
    setup.held("refund-pg-1")
    with console(setup) as base:
        c = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKENS['vik']}"}, timeout=60)
        first = c.get("/api/changes").json()["version"]
        quiet = c.get("/api/changes", params={"since": first, "wait": "1"}).json()
        setup.held("refund-pg-2")
        moved = c.get("/api/changes", params={"since": first, "wait": "30"}).json()
        c.close()

    assert {"version": first, "changed": False} == quiet
    assert (True, False) == (moved["changed"], moved["version"] == first)
