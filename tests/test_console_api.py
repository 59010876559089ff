"""The console's JSON API under /api/, against the real server process (issue 15).

Bearer tokens only: no token or a wrong one is 401, a viewer's decision 403; reads
return what the pages show (no secret value in any body); a decision is the pages'
own operation under the token's user, and a changed digest is refused (409) with
nothing written.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from console_kit import CARD, TOKENS, Setup, console, login
from effectlog.console.users import token_digest
from hardening_kit import effectlog


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    """A journal with one run held for approval (refund-1) and one stopped as uncertain (charge-1)."""
    s = Setup(tmp_path)
    s.held("refund-1")
    s.uncertain("charge-1")
    return s


def api(base: str, user: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {TOKENS[user]}"} if user else {}
    return httpx.Client(base_url=base, headers=headers, timeout=30)


def test_the_api_needs_a_valid_bearer_token_and_ignores_the_session_cookie(setup: Setup) -> None:
    """No token, a wrong token, another scheme, or only a logged-in session's cookie: 401 with
    WWW-Authenticate: Bearer and a JSON error."""
    with console(setup) as base, api(base, None) as anon:
        browser, _ = login(base, "olga")
        statuses = [
            browser.get("/api/runs").status_code,
            anon.get("/api/runs").status_code,
            anon.get("/api/runs", headers={"Authorization": "Bearer nope"}).status_code,
            anon.get("/api/runs", headers={"Authorization": f"Basic {TOKENS['olga']}"}).status_code,
        ]
        last = anon.post("/api/runs/refund-1/steps/refund/approve", json={"digest": "0" * 64})

    assert [401, 401, 401, 401] == statuses
    assert (401, "unauthorized", "Bearer") == (
        last.status_code,
        last.json()["code"],
        last.headers["www-authenticate"],
    )


def test_reads_show_the_attention_list_runs_and_what_is_at_stake_without_secret_values(setup: Setup) -> None:
    """A viewer's token reads the attention list (counts, oldest first), the runs (newest first), and
    one run with what is at stake; the card number appears in no body, only its digest."""
    with console(setup) as base, api(base, "vik") as c:
        attention = c.get("/api/attention")
        runs = c.get("/api/runs")
        run = c.get("/api/runs/refund-1")
        missing = c.get("/api/runs/nope")

    assert {"held for approval": 1, "uncertain": 1} == attention.json()["counts"]
    assert ["refund-1", "charge-1"] == [a["run_id"] for a in attention.json()["items"]]
    assert ["charge-1", "refund-1"] == [r["run_id"] for r in runs.json()["runs"]]
    stake = run.json()["at_stake"][0]
    assert ("refund", "approve", 64) == (stake["step_id"], stake["action"], len(stake["args_digest"]))
    assert "$secret_sha256" in stake["args"]["card"]
    assert [] == [r.url for r in (attention, runs, run) if CARD in r.text]
    assert (404, "unknown_run") == (missing.status_code, missing.json()["code"])


def test_a_viewer_token_cannot_decide_and_a_changed_digest_is_refused(setup: Setup) -> None:
    """A viewer's approve is 403; an operator's approve with a digest that is not the held call's is
    409 (digest_mismatch); neither writes anything."""
    before = [e["type"] for e in setup.timeline("refund-1")]
    with console(setup) as base, api(base, "vik") as viewer, api(base, "olga") as operator:
        digest = viewer.get("/api/runs/refund-1").json()["at_stake"][0]["args_digest"]
        refused = viewer.post("/api/runs/refund-1/steps/refund/approve", json={"digest": digest})
        stale = operator.post("/api/runs/refund-1/steps/refund/approve", json={"digest": "e" * 64})

    assert (403, "forbidden") == (refused.status_code, refused.json()["code"])
    assert (409, "digest_mismatch") == (stale.status_code, stale.json()["code"])
    assert before == [e["type"] for e in setup.timeline("refund-1")]


def test_api_decisions_are_journaled_under_the_tokens_user(setup: Setup) -> None:
    """Approve (with the digest read from the API) and reconcile (with evidence) through the API are
    recorded as by olga, the token's user; a ``by``/``operator`` field in the body is ignored."""
    with console(setup) as base, api(base, "olga") as c:
        digest = c.get("/api/runs/refund-1").json()["at_stake"][0]["args_digest"]
        approved = c.post("/api/runs/refund-1/steps/refund/approve", json={"digest": digest, "by": "mallory"})
        reconciled = c.post(
            "/api/runs/charge-1/steps/charge/reconcile",
            json={"outcome": "applied", "evidence": "ledger row 7", "operator": "mallory"},
        )

    assert (200, "approved", "olga") == (
        approved.status_code,
        approved.json()["step"]["state"],
        approved.json()["by"],
    )
    assert (200, "reconciled") == (reconciled.status_code, reconciled.json()["step"]["state"])
    assert [("olga", digest)] == [
        (e["by"], e["args_digest"]) for e in setup.timeline("refund-1") if e["type"] == "step.approved"
    ]
    assert [("olga", "ledger row 7")] == [
        (e["operator"], e["evidence"]) for e in setup.timeline("charge-1") if e["type"] == "step.reconciled"
    ]


def test_new_token_prints_a_token_and_the_users_file_line_that_matches_it(tmp_path: Path) -> None:
    """``effectlog console new-token`` prints a fresh token and the ``token_sha256`` line for it."""
    done = effectlog("console", "new-token", cwd=tmp_path)
    token_line, file_line = done.stdout.splitlines()
    token = token_line.removeprefix("token: ")

    assert (0, "") == (done.returncode, done.stderr)
    assert f'token_sha256 = "{token_digest(token)}"' == file_line
    assert len(token) >= 40


def test_a_runs_json_gives_each_steps_evidence_so_far_and_receipts(setup: Setup) -> None:
    """/api/runs/charge-1 lists, for its step, the doubt and then the reconciliation made through the
    API (by the token's user, with its evidence), in journal order; no tool reply means no receipt."""
    with console(setup) as base, api(base, "olga") as c:
        c.post("/api/runs/charge-1/steps/charge/reconcile", json={"outcome": "applied", "evidence": "ledger row 9"})
        step = c.get("/api/runs/charge-1").json()["steps"][0]

    assert [] == step["receipts"]
    assert [("uncertain", ""), ("reconciled applied", "olga (a person)")] == [
        (e["what"], e["by"]) for e in step["evidence"]
    ]
    assert "ledger row 9" == step["evidence"][1]["text"]
