"""examples/durable_tool.py measures what docs/integrations.md claims for plain Python: every effect once."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from session_kit import ROOT

pytestmark = pytest.mark.crash


def test_three_passes_apply_every_effect_exactly_once() -> None:
    """Pass 1 (SIGKILLed in reserve and in charge): 2 effects; pass 2 (re-send with the same key, then the
    receipt; the charge stops uncertain and is reconciled): 1; pass 3: 0. The last line is the JSON summary."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "durable_tool.py")],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert 0 == done.returncode, done.stdout + done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    passes = [{"model_calls": 0, "tool_effects": n} for n in (2, 1, 0)]
    assert {"framework": "python", "passes": passes, "ok": True} == summary
    assert "reserve sent 2 times with 1 key(s)" in done.stdout
