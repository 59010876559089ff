"""The operator console in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``, via selenium).

A person logs in, finds what waits in Needs attention, decides it in the page's form,
and watches the list follow the journal without reloading the page (the console's
change feed and ``static/live.js``), while real processes write to the same journal.
Every wait is an explicit condition (``WebDriverWait``), never a guess at the machine's
speed. ``make test`` installs chromium when it is missing (.ci/ensure-chromium). Under
``CI=true`` a browser that cannot start fails the test: CI must never pass by skipping
it; elsewhere it skips with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from console_kit import PASSWORDS, Setup, console, effects_rows, held_plan, uncertain_plan

CHROMIUM_ARGS = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000")
WAIT_S = 30  # the longest any condition may take before the test fails


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"Chromium is required when CI=true and could not start: {reason}", pytrace=False)
    pytest.skip(f"Chromium unavailable: {reason}")


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium driven by chromedriver, quit at the end."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError as exc:
        unavailable(f"selenium is not installed ({exc})")
    binary, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if binary is None or driver_path is None:
        unavailable("chromium or chromedriver is not on PATH (run .ci/ensure-chromium)")
    options = Options()
    options.binary_location = str(binary)
    for arg in CHROMIUM_ARGS:
        options.add_argument(arg)
    try:
        driver = webdriver.Chrome(options=options, service=Service(executable_path=str(driver_path)))
    except Exception as exc:  # selenium's WebDriverException and OSError alike: the browser did not start
        unavailable(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def until(driver: Any, condition: Callable[[Any], Any], what: str) -> Any:
    """Wait for ``condition(driver)`` to be truthy (an element not there yet counts as false)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, WAIT_S, ignored_exceptions=(NoSuchElementException, StaleElementReferenceException))
    return wait.until(condition, message=f"waited {WAIT_S} s for {what}")


def css(selector: str) -> Callable[[Any], Any]:
    from selenium.webdriver.common.by import By

    return lambda d: d.find_element(By.CSS_SELECTOR, selector)


def click(driver: Any, selector: str, what: str) -> None:
    """Find and click ``selector`` as one step, again if a live refresh swapped the element meanwhile."""
    until(driver, lambda d: css(selector)(d).click() or True, what)


def type_into(driver: Any, selector: str, text: str, what: str) -> None:
    until(driver, lambda d: css(selector)(d).send_keys(text) or True, what)


def cells(driver: Any, selector: str, what: str) -> list[str]:
    """The texts of the cells of the row at ``selector``, read in one go (again if the row was swapped)."""
    from selenium.webdriver.common.by import By

    found: list[str] = until(
        driver, lambda d: [td.text for td in css(selector)(d).find_elements(By.TAG_NAME, "td")], what
    )
    return found


def text_of(driver: Any, selector: str, what: str) -> str:
    text: str = until(driver, lambda d: css(selector)(d).text, what)
    return text


def log_in(driver: Any, base: str, user: str) -> None:
    """Log in through the login form and wait for Needs attention with its live feed connected."""
    from selenium.webdriver.common.by import By

    driver.get(f"{base}/")
    until(driver, lambda d: d.current_url.endswith("/login"), "the login page")
    driver.find_element(By.ID, "user").send_keys(user)
    driver.find_element(By.ID, "password").send_keys(PASSWORDS[user])
    driver.find_element(By.ID, "login").click()
    until(driver, lambda d: d.find_element(By.ID, "whoami").text.startswith(user), "the logged-in page")
    live(driver)


def live(driver: Any) -> None:
    until(driver, lambda d: css("#live")(d).text == "live", "the page's live feed to connect")


def attention_runs(driver: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    return [tr.get_attribute("data-run") or "" for tr in driver.find_elements(By.CSS_SELECTOR, "#attention tbody tr")]


def test_a_person_logs_in_opens_needs_attention_and_approves_a_held_step(tmp_path: Path, browser: Any) -> None:
    """Log in as the operator olga; Needs attention lists refund-1 as held for approval; its page
    shows the call with its digest; "Approve this exact call" records step.approved by olga, bound
    to that digest; the page says so, and Needs attention then reads "ready to resume"."""

    setup = Setup(tmp_path)
    setup.held("refund-1")
    with console(setup) as base:
        log_in(browser, base, "olga")
        row = cells(browser, "#attention tr.why-held-for-approval", "the held run in Needs attention")
        assert ["held for approval", "refund-1", "refund"] == row[1:4]
        assert "olga (operator)" == text_of(browser, "#whoami", "who is logged in")
        click(browser, '#attention a[href="/runs/refund-1"]', "the held run's link")

        shown = text_of(browser, "#stake-refund code.digest", "the held call's digest")
        click(browser, "#approve-refund button", "the approve button")
        decided = text_of(browser, "#decided", "the decision's confirmation")
        timeline = text_of(browser, "#timeline", "the timeline")
        click(browser, "#nav-attention", "the Needs attention link")
        after = text_of(browser, "#attention tbody tr.why-ready-to-resume", "the approved run, ready to resume")

    approved = [(e["by"], e["args_digest"]) for e in setup.timeline("refund-1") if e["type"] == "step.approved"]
    assert [("olga", shown)] == approved
    assert "approve recorded in the journal under olga" in decided
    assert "step.approved" in timeline
    assert "ready to resume" in after


def test_an_uncertain_run_is_reconciled_in_the_browser_and_leaves_the_list_without_a_reload(
    tmp_path: Path, browser: Any
) -> None:
    """charge-1 stopped with an uncertain effect: Needs attention lists it as uncertain; its page
    offers the reconcile form; olga reconciles it as applied with evidence; back on Needs attention
    it reads "ready to resume"; a real ``effectlog run`` process then resumes it to completion, and
    the open page drops it from the list by itself: same document (a marker set on the page
    survives), no reload, at least one live refresh. The journal holds olga's evidence."""

    setup = Setup(tmp_path)
    setup.uncertain("charge-1")
    setup.held("refund-1")  # stays in the list: the page must drop exactly the run that moved on
    with console(setup) as base:
        log_in(browser, base, "olga")
        until(browser, css("#attention tr.why-uncertain"), "the uncertain run in Needs attention")
        before = until(browser, attention_runs, "the attention list")
        click(browser, '#attention tr.why-uncertain a[href="/runs/charge-1"]', "the uncertain run's link")

        click(browser, "#reconcile-charge input[value=applied]", "the applied choice")
        type_into(browser, "#reconcile-charge input[name=evidence]", "PSP dashboard: charge ch_91 captured", "evidence")
        click(browser, "#reconcile-charge button[name=reconcile]", "the reconcile button")
        decided = text_of(browser, "#decided", "the decision's confirmation")
        click(browser, "#nav-attention", "the Needs attention link")
        waiting = text_of(browser, "#attention tr.why-ready-to-resume", "the reconciled run, ready to resume")
        live(browser)
        browser.execute_script("window.sameDocument = 'yes';")

        setup.run(uncertain_plan("charge-1"), 0)  # another process resumes it: the step counts as done

        until(browser, lambda d: "charge-1" not in attention_runs(d), "charge-1 to leave the list")
        after = until(browser, attention_runs, "the attention list")
        same = browser.execute_script("return window.sameDocument;")
        refreshes = int(until(browser, css("body"), "the page").get_attribute("data-refreshes") or 0)

    reconciled = [
        (e["outcome"], e["operator"], e["evidence"])
        for e in setup.timeline("charge-1")
        if e["type"] == "step.reconciled"
    ]
    assert ["charge-1", "refund-1"] == before
    assert "reconcile recorded in the journal under olga" in decided
    assert "charge-1" in waiting
    assert (["refund-1"], "yes") == (after, same)
    assert refreshes >= 1
    assert [("applied", "olga", "PSP dashboard: charge ch_91 captured")] == reconciled
    assert "run.completed" == setup.timeline("charge-1")[-1]["type"]


APPLICATION = """
import json, sys, time
from pathlib import Path
from effectlog import Runtime, load_plan

journal, effects, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
held = work / "held-plan.json"
with Runtime(journal, effects=effects) as runtime:
    n = 0
    while not (work / "stop").exists():
        n += 1
        plan = work / f"bg-{n}.json"
        plan.write_text(json.dumps({
            "run_id": f"bg-{n}",
            "adapters": {"ledger": {"type": "effects.control", "version": "1", "idempotent": False}},
            "steps": [{"id": "post", "adapter": "ledger", "args": {"n": n}}],
        }))
        outcome = runtime.run(load_plan(plan))
        (work / "driven.txt").write_text(f"{n} {outcome.state}")
        if (work / "resume").exists() and not (work / "resumed.txt").exists():
            (work / "resumed.txt").write_text(runtime.run(load_plan(held)).state)
        time.sleep(0.05)
"""


def test_a_held_step_is_approved_while_the_application_drives_other_runs_and_then_runs_once(
    tmp_path: Path, browser: Any
) -> None:
    """An application process (a real ``Runtime`` holding the journal open) keeps driving runs bg-1,
    bg-2, ... in the same journal. Meanwhile olga approves refund-1's held step in the browser: the
    approval is recorded while the application goes on (it completes runs before and after it). The
    application then resumes refund-1 itself; its run page, left open, shows it completed without a
    reload, and the effect store holds refund-1's refund exactly once."""

    setup = Setup(tmp_path)
    setup.held("refund-1")
    (tmp_path / "held-plan.json").write_text(json.dumps(held_plan("refund-1")))
    (tmp_path / "application.py").write_text(APPLICATION)
    driven = tmp_path / "driven.txt"

    def runs_driven() -> int:
        text = driven.read_text() if driven.exists() else ""
        return int(text.split()[0]) if text.strip() else 0

    app = subprocess.Popen(
        [sys.executable, "application.py", setup.journal, setup.effects, str(tmp_path)],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with console(setup) as base:
            log_in(browser, base, "olga")
            until(browser, lambda _: runs_driven() >= 2, "the application to drive other runs")
            click(browser, '#attention tr.why-held-for-approval a[href="/runs/refund-1"]', "the held run's link")
            shown = text_of(browser, "#stake-refund code.digest", "the held call's digest")
            click(browser, "#approve-refund button", "the approve button")
            until(browser, css("#decided"), "the decision's confirmation")
            at_approval = runs_driven()
            until(browser, lambda _: runs_driven() >= at_approval + 2, "the application to go on after the approval")
            live(browser)
            browser.execute_script("window.sameDocument = 'yes';")

            (tmp_path / "resume").touch()
            until(browser, lambda d: css("#run-state")(d).text == "completed", "refund-1 to complete on the open page")
            same = browser.execute_script("return window.sameDocument;")
    finally:
        (tmp_path / "stop").touch()
        try:
            app.wait(timeout=60)
        finally:
            if app.poll() is None:
                app.kill()
                app.wait()

    assert (0, "") == (app.returncode, app.stderr.read() if app.stderr else "")
    assert ("completed", "yes") == ((tmp_path / "resumed.txt").read_text(), same)
    approved = [(e["by"], e["args_digest"]) for e in setup.timeline("refund-1") if e["type"] == "step.approved"]
    assert [("olga", shown)] == approved
    rows = effects_rows(setup)
    assert [("refund", 1)] == [(r["step_id"], r["attempt"]) for r in rows if r["run_id"] == "refund-1"]
    assert runs_driven() == len({r["run_id"] for r in rows if str(r["run_id"]).startswith("bg-")})


def test_a_live_refresh_keeps_what_the_operator_has_typed_and_a_decision_made_meanwhile_wins(
    tmp_path: Path, browser: Any
) -> None:
    """olga has started typing evidence into charge-1's reconcile form when another operator
    reconciles charge-1 from the CLI (a real ``effectlog reconcile`` process): the open page
    refreshes its live parts (the new event shows) but leaves olga's form as it is, her text in it,
    marked as changed underneath. Submitting it then is refused with the reason on the page, and
    the journal holds only the other operator's decision."""
    from selenium.webdriver.common.by import By

    from hardening_kit import effectlog

    setup = Setup(tmp_path)
    setup.uncertain("charge-1")
    with console(setup) as base:
        log_in(browser, base, "olga")
        click(browser, '#attention a[href="/runs/charge-1"]', "the uncertain run's link")
        live(browser)
        events_before = text_of(browser, "#run-events", "the run's event count")
        type_into(browser, "#reconcile-charge input[name=evidence]", "PSP says: ch_5 ", "the evidence field")

        other = effectlog(
            "reconcile", "--journal", setup.journal, "--run-id", "charge-1", "--step", "charge",
            "--outcome", "not-applied", "--evidence", "refund desk: no charge", "--operator", "vik", cwd=setup.dir,
        )  # fmt: skip

        until(browser, lambda d: css("#run-events")(d).text != events_before, "the page to show the new event")
        stale = until(browser, css("[data-live=stakes]"), "the stakes part").get_attribute("data-stale")
        kept = browser.find_element(By.CSS_SELECTOR, "#reconcile-charge input[name=evidence]")
        typed = kept.get_attribute("value")
        click(browser, "#reconcile-charge input[value=applied]", "the applied choice")
        click(browser, "#reconcile-charge button[name=reconcile]", "the reconcile button")
        refused = text_of(browser, "#error", "the refusal")

    reconciled = [(e["outcome"], e["operator"]) for e in setup.timeline("charge-1") if e["type"] == "step.reconciled"]
    assert 0 == other.returncode, other.stderr
    assert ("true", "PSP says: ch_5 ") == (stale, typed)
    assert "charge" in refused
    assert [("not_applied", "vik")] == reconciled
