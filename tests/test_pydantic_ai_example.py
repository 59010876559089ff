"""examples/pydantic_ai_durability.py measures what docs/integrations-pydantic-ai.md claims."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from session_kit import ROOT

pytestmark = pytest.mark.crash


def test_three_passes_each_effect_once_and_no_model_step_billed_twice() -> None:
    """Pass 1 (SIGKILLed after the tool's effect): model 1, effect 1; pass 2: model 1, effect 0 (the
    re-sent call carries the same key); pass 3 (completed): nothing. The last line says so, exit 0."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pydantic_ai_durability.py")],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    expected = {
        "framework": "pydantic-ai",
        "passes": [
            {"model_calls": 1, "tool_effects": 1},
            {"model_calls": 1, "tool_effects": 0},
            {"model_calls": 0, "tool_effects": 0},
        ],
        "ok": True,
    }
    assert expected == json.loads(done.stdout.splitlines()[-1])
