"""The operator console in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``, via selenium).

A person logs in, opens Needs attention, follows the held run, approves the exact call
it shows, and sees it approved; the journal then holds ``step.approved`` by that person,
bound to the digest the page showed. ``make test`` installs chromium when it is missing
(.ci/ensure-chromium). Under ``CI=true`` a browser that cannot start fails the test:
CI must never pass by skipping it; elsewhere it skips with the reason.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from console_kit import PASSWORDS, Setup, console

CHROMIUM_ARGS = ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage")


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
    # A click that submits a form returns before the next page has loaded: find elements by waiting
    # for them (up to 10 s), never by the machine's speed.
    driver.implicitly_wait(10)
    try:
        yield driver
    finally:
        driver.quit()


def test_a_person_logs_in_opens_needs_attention_and_approves_a_held_step(tmp_path: Path, browser: Any) -> None:
    """Log in as the operator olga; Needs attention lists refund-1 as held for approval; its page
    shows the call with its digest; "Approve this exact call" records step.approved by olga, bound
    to that digest; the page says so, and Needs attention then reads "ready to resume"."""
    from selenium.webdriver.common.by import By

    setup = Setup(tmp_path)
    setup.held("refund-1")
    with console(setup) as base:
        browser.get(f"{base}/")
        assert browser.current_url.endswith("/login")
        browser.find_element(By.ID, "user").send_keys("olga")
        browser.find_element(By.ID, "password").send_keys(PASSWORDS["olga"])
        browser.find_element(By.ID, "login").click()

        row = browser.find_element(By.CSS_SELECTOR, "#attention tr.why-held-for-approval")
        assert ["held for approval", "refund-1", "refund"] == [
            td.text for td in row.find_elements(By.TAG_NAME, "td")[1:4]
        ]
        assert "olga (operator)" == browser.find_element(By.ID, "whoami").text
        row.find_element(By.LINK_TEXT, "refund-1").click()

        shown = browser.find_element(By.CSS_SELECTOR, "#stake-refund code.digest").text
        browser.find_element(By.CSS_SELECTOR, "#approve-refund button").click()
        decided = browser.find_element(By.ID, "decided").text
        timeline = browser.find_element(By.ID, "timeline").text
        browser.find_element(By.ID, "nav-attention").click()
        after = browser.find_element(By.CSS_SELECTOR, "#attention tbody tr").text

    approved = [(e["by"], e["args_digest"]) for e in setup.timeline("refund-1") if e["type"] == "step.approved"]
    assert [("olga", shown)] == approved
    assert "approve recorded in the journal under olga" in decided
    assert "step.approved" in timeline
    assert "ready to resume" in after
