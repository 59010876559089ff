"""The real parts the integration tests drive are installed by ``make test`` (``.[dev]``), so their tests
never skip: a missing package fails here, by name, and in the tests that import it.

Proves: each package that pyproject.toml's dev extra lists for a real part imports in the test venv.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REAL_PARTS = {  # distribution in the dev extra -> the module the tests import
    "pydantic-ai-slim": "pydantic_ai",
    "openai-agents": "agents",
    "opentelemetry-sdk": "opentelemetry.sdk",
    "psycopg": "psycopg",
}


def _dev_extra() -> set[str]:
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    return {entry.split("[")[0].split(">")[0].split("=")[0].strip() for entry in dev}


@pytest.mark.parametrize("distribution", sorted(REAL_PARTS))
def test_each_real_part_is_in_the_dev_extra_and_imports(distribution: str) -> None:
    assert distribution in _dev_extra()
    assert importlib.import_module(REAL_PARTS[distribution]) is not None
