"""examples/durability.py measures what the README claims: an inference already paid for is not paid again."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from session_kit import ROOT

pytestmark = pytest.mark.crash


def test_three_passes_count_exactly_the_calls_that_had_not_happened() -> None:
    """Pass 1 (SIGKILLed after the tool): model 1 tool 1; pass 2: model 1 tool 0; pass 3: model 0 tool 0."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "durability.py")],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    line = re.compile(r"^pass (?P<n>\d): model \u00d7(?P<model>\d+) · tool \u00d7(?P<tool>\d+)", re.M)
    counts = {int(m["n"]): (int(m["model"]), int(m["tool"])) for m in line.finditer(done.stdout)}
    assert {1: (1, 1), 2: (1, 0), 3: (0, 0)} == counts
