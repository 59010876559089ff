"""The console's change feed, against the real server process: pages update without reload (issue 15).

``/api/changes?since=V`` (a long poll, bearer token) and ``/events`` (server-sent events,
the pages' session) say when the journal moved. Each test makes the journal move with a
real ``effectlog run`` process, never by calling our own storage from the test.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from console_kit import TOKENS, Setup, console, held_plan, login


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    """A journal with one run held for approval (refund-1)."""
    s = Setup(tmp_path)
    s.held("refund-1")
    return s


def bearer(base: str, user: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKENS[user]}"}, timeout=60)


def long_poll(base: str, since: str, answers: list[dict[str, Any]]) -> threading.Thread:
    def wait() -> None:
        with bearer(base, "vik") as c:
            answers.append(c.get("/api/changes", params={"since": since, "wait": "45"}).json())

    thread = threading.Thread(target=wait)
    thread.start()
    return thread


def test_a_long_poll_answers_when_another_process_appends_and_not_before(setup: Setup) -> None:
    """A long poll of /api/changes with the current version waits while nothing is written (a short
    wait returns ``changed: false`` and the same version); while one is waiting, a real
    ``effectlog run`` of another run appends to the journal, and the poll answers ``changed: true``
    with a new version."""
    with console(setup) as base, bearer(base, "vik") as c:
        first = c.get("/api/changes").json()["version"]
        quiet = c.get("/api/changes", params={"since": first, "wait": "1"}).json()
        answers: list[dict[str, Any]] = []
        thread = long_poll(base, first, answers)
        setup.held("refund-2")  # another process writes run.started, step.denied, run.suspended
        thread.join(60)
        latest = c.get("/api/changes").json()["version"]

    assert {"version": first, "changed": False} == quiet
    assert [{"version": latest, "changed": True}] == answers
    assert first != latest


def test_the_change_feed_needs_a_token_and_a_number_of_seconds(setup: Setup) -> None:
    """Without a bearer token /api/changes is 401; a wait that is not a number is 400."""
    with console(setup) as base, httpx.Client(base_url=base, timeout=30) as anon, bearer(base, "vik") as c:
        refused = anon.get("/api/changes")
        bad = c.get("/api/changes", params={"since": "x", "wait": "soon"})

    assert (401, 400) == (refused.status_code, bad.status_code)


def test_the_event_stream_tells_a_logged_in_page_that_another_process_appended(setup: Setup) -> None:
    """/events streams ``event: changed`` to a logged-in session once a real ``effectlog run``
    process appends to the journal, with the version /api/changes then reports; without a login,
    /events sends to the login page."""
    with console(setup) as base, bearer(base, "vik") as c:
        first = c.get("/api/changes").json()["version"]
        anon = httpx.get(f"{base}/events", follow_redirects=False, timeout=30)
        client, _ = login(base, "vik")
        seen: list[str] = []
        with client.stream("GET", "/events", params={"since": first}, timeout=60) as stream:
            lines = stream.iter_lines()
            while not any(line.startswith("event: version") for line in seen):
                seen.append(next(lines))
            setup.run(held_plan("refund-3"), 4)
            while not seen[-1].startswith("event: changed"):
                seen.append(next(lines))
            changed_to = next(lines)
        latest = c.get("/api/changes").json()["version"]

    assert (303, "/login") == (anon.status_code, anon.headers.get("location"))
    assert "text/event-stream" in stream.headers["content-type"]
    assert f"data: {first}" in seen
    assert f"data: {latest}" == changed_to
    assert first != latest


def test_a_runs_own_feed_moves_with_that_run_only(setup: Setup) -> None:
    """/api/changes?run=refund-1 (what refund-1's page follows) does not move when a real process
    starts another run in the journal, and moves once ``effectlog deny`` (another process) decides
    refund-1; the journal-wide version moved both times."""
    from hardening_kit import effectlog

    with console(setup) as base, bearer(base, "vik") as c:
        run_first = c.get("/api/changes", params={"run": "refund-1"}).json()["version"]
        all_first = c.get("/api/changes").json()["version"]
        setup.held("refund-2")
        other = c.get("/api/changes", params={"since": run_first, "run": "refund-1", "wait": "2"}).json()
        all_second = c.get("/api/changes", params={"since": all_first, "wait": "2"}).json()
        denied = effectlog(
            "deny", "--journal", setup.journal, "--run-id", "refund-1", "--step", "refund", "--by", "vik",
            "--reason", "not today", cwd=setup.dir,
        )  # fmt: skip
        own = c.get("/api/changes", params={"since": run_first, "run": "refund-1", "wait": "30"}).json()

    assert 0 == denied.returncode, denied.stderr
    assert {"version": run_first, "changed": False} == other
    assert True is all_second["changed"]
    assert (True, False) == (own["changed"], own["version"] == run_first)


def test_the_event_stream_ends_with_one_line_when_the_journal_can_no_longer_be_read(setup: Setup) -> None:
    """The journal file is overwritten with garbage while a page's event stream is open: the stream
    ends with ``event: broken`` and a one-line reason naming the journal, never a traceback."""
    with console(setup) as base:
        client, _ = login(base, "vik")
        with client.stream("GET", "/events", timeout=60) as stream:
            lines = stream.iter_lines()
            seen = [next(lines)]
            while not seen[-1].startswith("event: version"):
                seen.append(next(lines))
            Path(setup.journal).write_bytes(b"this is not a database " * 200)
            seen.extend(lines)  # until the server ends the stream

    broken = seen.index("event: broken")
    assert f"data: {setup.journal}: cannot read the journal's version (file is not a database)" == seen[broken + 1]
    assert [] == [line for line in seen if "Traceback" in line or 'File "' in line]
