"""Shared fixtures. Hypothesis profiles: 'ci' runs more examples than the default."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# Test kits used both as modules and as fixture plugins: their asserts are rewritten too.
pytest.register_assert_rewrite("fleet_kit")

settings.register_profile("default", max_examples=60, deadline=None)
settings.register_profile("ci", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") == "true" else "default")
