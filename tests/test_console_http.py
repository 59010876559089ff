"""The operator console over HTTP, against the real server process (issue 15).

Each test starts ``effectlog console`` on 127.0.0.1 at a free port over a journal whose
runs were made by real ``effectlog run`` processes, and talks to it with httpx as a
browser would (cookies, forms, the CSRF token). What the console writes is read back
with the CLI's ``timeline``: a decision is the CLI's own operation, under the name of
the user who logged in, and a refused one writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from markupsafe import escape

import journal_tamper
from console_kit import (
    CARD,
    NASTY,
    PASSWORDS,
    TOKENS,
    Setup,
    console,
    csrf_of,
    digest_on_page,
    effects_rows,
    held_plan,
    login,
    uncertain_plan,
)
from effectlog.console.users import check_password
from effectlog.reconcile import LOOKUP_OPERATOR
from hardening_kit import effectlog, one_line

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    """A journal with one run held for approval (refund-1) and one stopped as uncertain (charge-1)."""
    s = Setup(tmp_path)
    s.held("refund-1")
    s.uncertain("charge-1")
    return s


def types(setup: Setup, run_id: str) -> list[object]:
    return [e["type"] for e in setup.timeline(run_id)]


def test_pages_and_decisions_need_a_login(setup: Setup) -> None:
    """Without a session every page sends to /login and a decision is refused with 401, writing nothing."""
    before = types(setup, "refund-1")
    with console(setup) as base:
        import httpx

        with httpx.Client(base_url=base, follow_redirects=False) as anon:
            pages = [anon.get(p) for p in ("/", "/runs", "/runs/refund-1")]
            token = csrf_of(anon.get("/login").text)
            post = anon.post("/runs/refund-1/steps/refund/approve", data={"csrf": token, "digest": "0" * 64})

    assert [(303, "/login")] * 3 == [(r.status_code, r.headers.get("location")) for r in pages]
    assert (401, before) == (post.status_code, types(setup, "refund-1"))


def test_a_wrong_password_is_refused_and_repeated_failures_are_throttled(setup: Setup) -> None:
    """A wrong password is 401 with no session; after five failures in a minute the sixth try is 429,
    even with the right password."""
    with console(setup) as base:
        import httpx

        with httpx.Client(base_url=base, follow_redirects=False) as c:
            token = csrf_of(c.get("/login").text)
            wrong = [
                c.post("/login", data={"user": "olga", "password": "nope", "csrf": token}).status_code for _ in range(5)
            ]
            right = c.post("/login", data={"user": "olga", "password": PASSWORDS["olga"], "csrf": token})
            home = c.get("/")

    assert ([401] * 5, 429, 303) == (wrong, right.status_code, home.status_code)


def test_a_post_without_the_sessions_csrf_token_is_refused_and_writes_nothing(setup: Setup) -> None:
    """A logged-in operator's approve without the CSRF token, or with another one, is 403; the journal
    is unchanged."""
    before = types(setup, "refund-1")
    with console(setup) as base:
        client, _ = login(base, "olga")
        digest = digest_on_page(client.get("/runs/refund-1").text)
        missing = client.post("/runs/refund-1/steps/refund/approve", data={"digest": digest})
        forged = client.post("/runs/refund-1/steps/refund/approve", data={"digest": digest, "csrf": "forged"})

    assert (403, 403) == (missing.status_code, forged.status_code)
    assert "CSRF" in forged.text
    assert before == types(setup, "refund-1")


def test_a_viewer_sees_the_run_but_cannot_decide(setup: Setup) -> None:
    """A viewer's run page has no decision forms, and a POST of a decision (with a valid token) is 403,
    writing nothing."""
    before = types(setup, "refund-1")
    with console(setup) as base:
        client, token = login(base, "vik")
        page = client.get("/runs/refund-1")
        digest = page.text.split('class="digest">')[1][:64]
        done = client.post("/runs/refund-1/steps/refund/approve", data={"csrf": token, "digest": digest})

    assert (200, False) == (page.status_code, 'name="digest"' in page.text)
    assert 403 == done.status_code
    assert before == types(setup, "refund-1")


def test_approve_with_a_digest_that_is_not_the_held_calls_is_refused(setup: Setup) -> None:
    """The page submits the digest of the call it shows; a different one (the call changed since the
    page was drawn) is refused with 409 and the reason, and nothing is written."""
    before = types(setup, "refund-1")
    with console(setup) as base:
        client, token = login(base, "olga")
        shown = digest_on_page(client.get("/runs/refund-1").text)
        stale = "f" * 64
        done = client.post("/runs/refund-1/steps/refund/approve", data={"csrf": token, "digest": stale})

    assert stale != shown
    assert 409 == done.status_code
    assert f"the held call&#39;s args digest is {shown}, not the expected {stale}" in done.text
    assert before == types(setup, "refund-1")


def test_approve_is_journaled_under_the_logged_in_name_and_the_run_then_applies_once(setup: Setup) -> None:
    """Approve from the page records step.approved by the logged-in operator (a ``by`` field in the
    form is ignored: no free-text name), bound to the digest shown; resuming the run applies the
    held step exactly once."""
    with console(setup) as base:
        client, token = login(base, "olga")
        digest = digest_on_page(client.get("/runs/refund-1").text)
        done = client.post(
            "/runs/refund-1/steps/refund/approve", data={"csrf": token, "digest": digest, "by": "mallory"}
        )
        after = client.get(done.headers["location"])

    approved = [e for e in setup.timeline("refund-1") if e["type"] == "step.approved"]
    assert (303, "/runs/refund-1?decided=approve") == (done.status_code, done.headers["location"])
    assert [("olga", digest)] == [(e["by"], e["args_digest"]) for e in approved]
    assert "approve recorded in the journal under olga" in after.text
    setup.run(held_plan("refund-1"), 0)
    assert [("refund", 1)] == [(r["step_id"], r["attempt"]) for r in effects_rows(setup) if r["run_id"] == "refund-1"]


def test_deny_is_journaled_with_its_reason_under_the_logged_in_name(setup: Setup) -> None:
    """Deny needs a reason (400 without one, nothing written); with one, step.denied names the
    logged-in operator and the run fails, as ``effectlog deny`` does."""
    before = types(setup, "refund-1")
    with console(setup) as base:
        client, token = login(base, "olga")
        empty = client.post("/runs/refund-1/steps/refund/deny", data={"csrf": token, "reason": " "})
        unchanged = types(setup, "refund-1")
        done = client.post("/runs/refund-1/steps/refund/deny", data={"csrf": token, "reason": "too large"})

    assert (400, before) == (empty.status_code, unchanged)
    denied = [e for e in setup.timeline("refund-1") if e["type"] == "step.denied" and e["decision"] == "deny"]
    assert 303 == done.status_code
    assert [("olga", "too large")] == [(e["by"], e["reason"]) for e in denied]
    assert "run.failed" == types(setup, "refund-1")[-1]


@pytest.mark.parametrize("outcome", ["applied", "not_applied"])
def test_reconcile_is_journaled_with_evidence_under_the_logged_in_name(setup: Setup, outcome: str) -> None:
    """Reconcile from the page records step.reconciled with the outcome and evidence, the logged-in
    operator as its operator (an ``operator`` form field is ignored), not automated; the run page
    then shows who decided it and on what evidence."""
    with console(setup) as base:
        client, token = login(base, "olga")
        done = client.post(
            "/runs/charge-1/steps/charge/reconcile",
            data={"csrf": token, "outcome": outcome, "evidence": "PSP dashboard: ch_9", "operator": "mallory"},
        )
        page = client.get("/runs/charge-1").text

    reconciled = [e for e in setup.timeline("charge-1") if e["type"] == "step.reconciled"]
    assert 303 == done.status_code
    assert [(outcome, "PSP dashboard: ch_9", "olga", False)] == [
        (e["outcome"], e["evidence"], e["operator"], e.get("automated", False)) for e in reconciled
    ]
    assert f"reconciled {outcome} by olga (a person): PSP dashboard: ch_9" in page


def test_needs_attention_lists_what_waits_oldest_first_and_a_decided_run_moves_on(setup: Setup) -> None:
    """Needs attention lists the held run then the uncertain one (oldest first) with their counts;
    once the held step is approved, that run reads "ready to resume" instead."""
    with console(setup) as base:
        client, token = login(base, "olga")
        first = client.get("/").text
        digest = digest_on_page(client.get("/runs/refund-1").text)
        client.post("/runs/refund-1/steps/refund/approve", data={"csrf": token, "digest": digest})
        second = client.get("/").text

    assert first.index("refund-1") < first.index("charge-1")
    assert (True, True) == ("held for approval: 1" in first, "uncertain: 1" in first)
    assert (False, True) == ("held for approval: 1" in second, "ready to resume: 1" in second)


def test_every_page_escapes_recorded_text_and_no_secret_value_leaves_the_server(setup: Setup) -> None:
    """A recorded argument holding ``<script>`` and quotes reaches the page escaped, never as markup;
    the card number (a secret arg) appears in no page, only its digest."""
    with console(setup) as base:
        client, _ = login(base, "olga")
        pages = [client.get(p).text for p in ("/", "/runs", "/runs/refund-1", "/runs/charge-1")]

    run_page = pages[2]
    assert "<script>" not in "".join(pages)
    assert str(escape(json.dumps(NASTY))) in run_page  # the JSON string of the arg, escaped
    assert [] == [p for p in pages if CARD in p]
    assert "$secret_sha256" in run_page


def test_the_runs_page_filters_by_state_and_pages(setup: Setup) -> None:
    """/runs?state=stopped lists only the uncertain run; an unknown run is a 404 page, no traceback."""
    with console(setup) as base:
        client, _ = login(base, "vik")
        stopped = client.get("/runs?state=stopped").text
        missing = client.get("/runs/nope")

    assert ("charge-1" in stopped, "refund-1" in stopped) == (True, False)
    assert (404, False) == (missing.status_code, "Traceback" in missing.text)
    assert "no run &#39;nope&#39;" in missing.text


BAD_STARTS = {
    "remote-host": (
        ["--host", "0.0.0.0"],
        "console: --host 0.0.0.0 is not loopback; give --allow-remote to bind it anyway",
    ),
    "no-users": (["--users", ""], "console: give --users FILE"),
    "cert-without-key": (["--tls-cert", "c.pem"], "console: give --tls-cert and --tls-key together"),
    "bad-users-file": (["--users", "bad-users.toml"], "users.x.role must be viewer or operator, not 'root'"),
    "no-journal": (["--journal", "nope.db"], "--journal nope.db: no journal file there"),
    "adapters-not-loading": (["--adapters", "nope_mod:X"], "nope_mod:X: cannot import 'nope_mod'"),
}


@pytest.mark.parametrize(("extra", "message"), BAD_STARTS.values(), ids=BAD_STARTS.keys())
def test_a_console_that_cannot_start_safely_exits_2_with_one_line(setup: Setup, extra: list[str], message: str) -> None:
    """A non-loopback --host without --allow-remote, a missing or unusable users file, half a TLS pair,
    or a journal that is not there: exit 2, one line on stderr naming what is wrong, nothing served."""
    (setup.dir / "bad-users.toml").write_text('[users.x]\nrole = "root"\npassword = "x"\n')
    argv = {"--journal": setup.journal, "--users": setup.users}
    for flag, value in zip(extra[::2], extra[1::2], strict=True):
        argv[flag] = value
    done = effectlog("console", *[x for kv in argv.items() for x in kv if kv[1]], cwd=setup.dir)

    assert 2 == done.returncode
    assert message in one_line(done.stderr)


def test_hash_password_prints_a_hash_the_console_accepts(tmp_path: Path) -> None:
    """``effectlog console hash-password`` reads the password from stdin and prints one scrypt hash
    that checks against it and not against another password."""
    done = subprocess.run(
        [sys.executable, "-m", "effectlog", "console", "hash-password"],
        input="s3cret\n", capture_output=True, text=True, cwd=tmp_path, check=False,
    )  # fmt: skip
    stored = done.stdout.strip()

    assert (0, "") == (done.returncode, done.stderr)
    assert (True, False) == (check_password("s3cret", stored), check_password("s3cret!", stored))


def test_fleet_requests_are_listed_and_cancel_is_recorded_under_the_logged_in_name(setup: Setup) -> None:
    """With --store, /requests lists a submitted request; a requeue of a queued request is refused by
    the store (nothing recorded); cancel with a reason is recorded in its history under the
    logged-in operator, exactly as ``effectlog operator cancel`` records it; a viewer is refused."""
    store = str(setup.dir / "fleet.db")
    (setup.dir / "fleet-plan.json").write_text(json.dumps(held_plan("fleet-run-1")))
    submitted = effectlog(
        "submit", "fleet-plan.json", "--store", store, "--scope", "s", "--key", "k1", cwd=setup.dir
    )  # fmt: skip
    assert 0 == submitted.returncode, submitted.stderr
    with console(setup, "--store", store) as base:
        viewer, vtoken = login(base, "vik")
        refused = viewer.post("/requests/1/cancel", data={"csrf": vtoken, "reason": "no"})
        client, token = login(base, "olga")
        listed = client.get("/requests").text
        requeue = client.post("/requests/1/requeue", data={"csrf": token, "reason": "try again"})
        done = client.post("/requests/1/cancel", data={"csrf": token, "reason": "duplicate", "by": "mallory"})
        page = client.get("/requests/1").text
    shown = effectlog("requests", "--store", store, "--request", "1", "--json", cwd=setup.dir)
    history = json.loads(shown.stdout)["history"]

    assert (403, True) == (refused.status_code, "fleet-run-1" in listed)
    assert requeue.status_code in (400, 409)
    assert (303, "cancelled") == (done.status_code, json.loads(shown.stdout)["request"]["state"])
    assert [("withdraw", "operator", "olga", "duplicate")] == [
        (h["transition"], h["actor"], h["actor_name"], h["reason"]) for h in history
    ]
    assert "duplicate" in page


def test_a_run_with_a_live_owner_is_not_listed_approving_another_does_not_disturb_it_and_killed_it_is(
    setup: Setup,
) -> None:
    """While a real ``effectlog run`` process drives run slow-1 (a shell step sleeping), Needs attention
    does not list slow-1, and approving refund-1 in the same journal succeeds without disturbing it;
    once that process is SIGKILLed, slow-1 is listed as interrupted (the journal's owner check, not a
    guess from time)."""
    (setup.dir / "slow.json").write_text(
        json.dumps(
            {
                "run_id": "slow-1",
                "adapters": {"sh": {"type": "shell", "version": "1", "idempotent": True}},
                "steps": [
                    {"id": "wait", "adapter": "sh", "args": {"argv": ["sh", "-c", "echo $$ > started; exec sleep 60"]}}
                ],
            }
        )
    )
    slow = subprocess.Popen(
        [sys.executable, "-m", "effectlog", "run", "slow.json", "--journal", setup.journal],
        cwd=setup.dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120  # an `effectlog run` start-up on a loaded machine
        while not (setup.dir / "started").exists() or not (setup.dir / "started").read_text().strip():
            assert time.monotonic() < deadline, "the slow run did not start in 120 s"
            time.sleep(0.1)
        with console(setup) as base:
            client, token = login(base, "olga")
            while_driven = client.get("/").text
            digest = digest_on_page(client.get("/runs/refund-1").text)
            approved = client.post("/runs/refund-1/steps/refund/approve", data={"csrf": token, "digest": digest})
            still_running = slow.poll()
            os.killpg(slow.pid, signal.SIGKILL)  # the run's process and its sleeping shell step
            slow.wait()
            after_kill = client.get("/").text
    finally:
        if slow.poll() is None:
            os.killpg(slow.pid, signal.SIGKILL)
            slow.wait()
        step_pid = (setup.dir / "started").read_text().strip() if (setup.dir / "started").exists() else ""
        if step_pid:  # the shell step runs in its own session: end it too
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(step_pid), signal.SIGKILL)

    assert ("slow-1" in while_driven, approved.status_code, still_running) == (False, 303, None)
    assert "slow-1" in after_kill
    assert "interrupted: 1" in after_kill


def test_a_journal_that_breaks_under_the_console_gives_an_error_page_never_a_stack_trace(setup: Setup) -> None:
    """The journal file is overwritten with garbage while the console serves it: the pages answer with
    an error status and a short message, and no traceback or source path reaches the browser."""
    with console(setup) as base:
        client, _ = login(base, "vik")
        Path(setup.journal).write_bytes(b"this is not a database " * 200)
        pages = [client.get(p) for p in ("/", "/runs", "/runs/refund-1")]

    assert [True, True, True] == [r.status_code >= 400 for r in pages]
    assert [] == [r.url for r in pages if "Traceback" in r.text or 'File "' in r.text]


def test_reconcile_by_the_steps_own_lookup_records_what_the_adapter_found(setup: Setup) -> None:
    """With --adapters and --effects, "Ask the step's own adapter" is ``reconcile --lookup``: the
    adapter's lookup finds the effect it applied before the reply was lost, and the journal records
    it as applied by the automated lookup of adapter psp (the CLI's operator name for it)."""
    setup.run(uncertain_plan("charge-2", "test.lost-reply-lookup"), 3)
    extra = ("--adapters", "lost_tools:ADAPTERS", "--effects", setup.effects)
    with console(setup, *extra) as base:
        client, token = login(base, "olga")
        page = client.get("/runs/charge-2").text
        done = client.post("/runs/charge-2/steps/charge/reconcile-by-lookup", data={"csrf": token})

    reconciled = [e for e in setup.timeline("charge-2") if e["type"] == "step.reconciled"]
    assert ('id="lookup-charge"' in page, done.status_code) == (True, 303)
    assert [("applied", f"{LOOKUP_OPERATOR}:psp", True)] == [
        (e["outcome"], e["operator"], e.get("automated", False)) for e in reconciled
    ]


def test_a_fleet_request_in_needs_operator_needs_attention_and_requeue_records_the_operator(setup: Setup) -> None:
    """A request whose only attempt was lost (``--max-requeues 0``: a lease ran out, recovery ran)
    waits in needs_operator: Needs attention lists it with its count; requeue from its page queues
    a new attempt and the history names the logged-in operator and the reason."""
    from effectlog.fleet import open_store
    from effectlog.fleet.recovery import recover_once

    store_path = str(setup.dir / "fleet.db")
    (setup.dir / "fleet-plan.json").write_text(json.dumps(held_plan("fleet-run-2")))
    submitted = effectlog(
        "submit", "fleet-plan.json", "--store", store_path, "--scope", "s", "--key", "k2", "--max-requeues", "0",
        cwd=setup.dir,
    )  # fmt: skip
    assert 0 == submitted.returncode, submitted.stderr
    with open_store(store_path) as store:
        lease = store.claim(1, "runner-a", 0.05)
        assert lease is not None
        time.sleep(0.2)
        recover_once(store)
        assert "needs_operator" == store.request(1).state
    with console(setup, "--store", store_path) as base:
        client, token = login(base, "olga")
        attention = client.get("/").text
        done = client.post("/requests/1/requeue", data={"csrf": token, "reason": "the adapter is fixed"})
    with open_store(store_path) as store:
        state, last = store.request(1).state, store.history(1)[-1]

    assert "needs_operator: 1" in attention
    assert 'href="/requests/1"' in attention
    assert (303, "queued") == (done.status_code, state)
    assert ("requeue", "operator", "olga", "the adapter is fixed") == (
        last.transition,
        last.actor,
        last.actor_name,
        last.reason,
    )


def test_a_run_whose_history_does_not_replay_is_listed_as_unreadable_and_hides_no_other(setup: Setup) -> None:
    """One run's second event is deleted (a gap): Needs attention still lists the held run, and lists
    the broken one as unreadable with the journal's own one-line reason."""

    db = journal_tamper.connect(setup.journal, isolation_level=None)
    try:  # as an attacker (or a broken disk) would: around the append-only trigger
        db.execute("DROP TRIGGER events_append_only_delete")
        db.execute("DELETE FROM ev WHERE run_id = ? AND seq = 2", ("charge-1",))
    finally:
        db.close()
    with console(setup) as base:
        client, _ = login(base, "vik")
        attention = client.get("/")

    assert 200 == attention.status_code
    assert ("held for approval: 1", "unreadable: 1") == tuple(
        t for t in ("held for approval: 1", "unreadable: 1") if t in attention.text
    )
    assert "charge-1" in attention.text


def test_the_runs_page_lists_every_other_run_when_one_row_of_the_journal_is_damaged(setup: Setup) -> None:
    """One stored event of charge-1 has its body overwritten (as a broken disk or an attacker would,
    around the append-only trigger): /runs still answers 200 and lists refund-1 as before, and
    lists charge-1 as unreadable with the journal's own reason; a state filter keeps it shown; the
    JSON API's run list says the same."""

    db = journal_tamper.connect(setup.journal, isolation_level=None)
    try:
        db.execute("DROP TRIGGER events_append_only_update")
        db.execute("UPDATE ev SET body = ? WHERE run_id = ? AND seq = 2", (b'{"garbage": true}', "charge-1"))
    finally:
        db.close()
    with console(setup) as base:
        client, _ = login(base, "vik")
        runs = client.get("/runs")
        held = client.get("/runs?state=suspended")
        api = client.get("/api/runs", headers={"Authorization": f"Bearer {TOKENS['vik']}"})

    rows = re.findall(
        r'<tr>\s*<td>[^<]*</td>\s*<td><a href="/runs/([^"]+)">.*?<td class="state-([a-z_]+)">', runs.text, re.S
    )
    assert (200, 200) == (runs.status_code, held.status_code)
    assert [("charge-1", "unreadable"), ("refund-1", "suspended")] == rows
    assert "unreadable: " in runs.text
    assert ("charge-1" in held.text, "refund-1" in held.text) == (True, True)
    assert [("charge-1", "unreadable"), ("refund-1", "suspended")] == [
        (r["run_id"], r["condition"].split(":")[0]) for r in api.json()["runs"]
    ]


def test_the_run_page_shows_each_receipt_and_the_evidence_recorded_so_far_escaped(setup: Setup) -> None:
    """A finished run's page shows its step's receipt (the tool's answer, holding ``<script>`` and
    quotes, escaped); an uncertain step reconciled not-applied shows, in order, its doubt with the
    tool's error and the operator's evidence; its page, as a held step's, draws the step machine
    with the step's state marked."""
    done_plan = {
        "run_id": "echo-1",
        "adapters": {"echo": {"type": "test.echo", "version": "1", "idempotent": True}},
        "steps": [{"id": "say", "adapter": "echo", "args": {"say": NASTY}}],
    }
    setup.run(done_plan, 0)
    with console(setup) as base:
        client, token = login(base, "olga")
        echo = client.get("/runs/echo-1").text
        client.post(
            "/runs/charge-1/steps/charge/reconcile",
            data={"csrf": token, "outcome": "not_applied", "evidence": "PSP: no charge ch_<b>1</b>"},
        )
        charge = client.get("/runs/charge-1").text
        held = client.get("/runs/refund-1").text

    receipts = echo.split('<table class="receipts">')[1].split("</table>")[0]
    assert "<script>" not in echo
    assert str(escape(json.dumps({"said": NASTY}, indent=2))) in receipts
    evidence = re.findall(r'<span class="what">([^<]+)</span>[^:]*:\s*([^<\n]*)', charge)
    assert ("uncertain", "outcome unknown: ConnectionError: connection reset after the effect") == evidence[0]
    assert ("reconciled not_applied", "PSP: no charge ch_&lt;b&gt;1&lt;/b&gt;") in evidence
    assert 'class="state current initial" data-state="pending"' in charge
    assert 'class="state current" data-state="awaiting_approval"' in held
