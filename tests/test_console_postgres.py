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
