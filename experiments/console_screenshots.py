"""Screenshots of each console page for docs/console.md: ``make console-screenshots``.

Makes a demo journal with real ``effectlog run`` processes (a run held for approval, one
stopped as uncertain, one completed) and a fleet store with one request, starts
``effectlog console`` on 127.0.0.1 at a free port, logs in with headless Chromium
(Debian's ``chromium`` + ``chromium-driver``, via selenium) and writes
``docs/img/console-*.png``. Not a test: look at the pictures.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from effectlog.console.users import hash_password

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(os.environ.get("CONSOLE_SHOTS_OUT", ROOT / "docs" / "img"))  # elsewhere to preview
LOST_REPLY = """
class LostReply:
    def __init__(self, store):
        self.store = store

    def invoke(self, request):
        self.store.apply_control(request)
        raise ConnectionError("connection reset after the effect")


ADAPTERS = {"demo.lost-reply": lambda decl, ctx: LostReply(ctx.effect_store())}
"""
PLANS = {
    "refund-042": {
        "adapters": {"payments": {"type": "effects.control", "version": "1", "idempotent": False}},
        "steps": [
            {
                "id": "refund",
                "adapter": "payments",
                "args": {"amount_cents": 50000, "customer": "c_981", "card": "4242424242424242"},
                "secret": ["card"],
                "approval": "required",
            }
        ],
    },
    "charge-7": {
        "adapters": {"psp": {"type": "demo.lost-reply", "version": "1", "idempotent": False}},
        "steps": [{"id": "charge", "adapter": "psp", "args": {"amount_cents": 1299, "order": "o_77"}}],
    },
    "invoice-3": {
        "adapters": {"sh": {"type": "shell", "version": "1", "idempotent": True}},
        "steps": [
            {"id": "render", "adapter": "sh", "args": {"argv": ["sh", "-c", "echo rendered invoice 3"]}},
            {"id": "send", "adapter": "sh", "args": {"argv": ["sh", "-c", "echo sent to c_981"]}},
        ],
    },
    "nightly-1": {
        "adapters": {"sh": {"type": "shell", "version": "1", "idempotent": True}},
        "steps": [{"id": "fetch", "adapter": "sh", "args": {"argv": ["sh", "-c", "echo fetched"]}}],
    },
}


def effectlog(work: Path, *argv: str) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), str(work)]))}
    argv_ = [sys.executable, "-m", "effectlog", *argv]
    return subprocess.run(argv_, cwd=work, env=env, capture_output=True, check=False).returncode


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="console-shots-"))
    (work / "demo_tools.py").write_text(LOST_REPLY)
    (work / "users.toml").write_text(f'[users.olga]\nrole = "operator"\npassword = "{hash_password("olga")}"\n')
    for run_id, plan in PLANS.items():
        if run_id == "nightly-1":
            (work / f"{run_id}.json").write_text(json.dumps({"run_id": run_id, **plan}))
            continue  # a fleet request, below
        (work / f"{run_id}.json").write_text(json.dumps({"run_id": run_id, **plan}))
        effectlog(work, "run", f"{run_id}.json", "--journal", "runs.db", "--effects", "effects.db",
                  "--adapters", "demo_tools:ADAPTERS")  # fmt: skip
    effectlog(work, "submit", "nightly-1.json", "--store", "fleet.db", "--scope", "nightly", "--key", "2026-11-30")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "effectlog", "console", "--journal", "runs.db", "--users", "users.toml",
         "--store", "fleet.db", "--effects", "effects.db", "--port", str(port)],
        cwd=work, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path="/usr/bin/chromedriver"))
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.1)
        driver.get(f"{base}/login")
        shot(driver, "login")
        driver.find_element(By.ID, "user").send_keys("olga")
        driver.find_element(By.ID, "password").send_keys("olga")
        driver.find_element(By.ID, "login").click()
        live(driver)
        shot(driver, "attention")
        for name, path in (("runs", "/runs"), ("run-held", "/runs/refund-042"), ("run-uncertain", "/runs/charge-7"),
                           ("run-done", "/runs/invoice-3"), ("requests", "/requests"),
                           ("request", "/requests/1")):  # fmt: skip
            driver.get(base + path)
            live(driver)
            shot(driver, name)
    finally:
        driver.quit()
        server.send_signal(signal.SIGTERM)
        server.wait()


def live(driver: webdriver.Chrome) -> None:
    """Wait until the page is loaded and its live feed is connected (the header says "live")."""
    WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "live").text == "live")


def shot(driver: webdriver.Chrome, name: str) -> None:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, max(600, min(int(height) + 160, 2400)))
    path = OUT / f"console-{name}.png"
    driver.save_screenshot(str(path))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
