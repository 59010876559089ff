"""Review round 6: today's speed work and edge fixes (``git diff 8f09706..main -- src``) read for an effect
that could happen twice, a result lost, a run owned by two, a check skipped, or an error escaping as a
traceback. Each test is one finding: a failing reproduction first, the fix after it."""

from __future__ import annotations

from typing import Any

import pytest

from effectlog.canonical import canonical_json, digest
from effectlog.errors import BadInput
from effectlog.recordable import why_unrecordable
from effectlog.session.identity import finite


def _nested(leaf: Any, depth: int) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


# -- canonical JSON: a NaN nested deeper than the walk's old depth limit ----------------------------


@pytest.mark.parametrize("depth", [257, 300, 900])
def test_deep_nan_is_refused_not_recorded_as_null(depth: int) -> None:
    """A NaN nested between 257 and ~990 levels deep (the encoder goes on to Python's recursion limit)
    was passed by the non-finite walk, which stopped at 256: its canonical bytes, digest and recorded
    result were those of ``None``'s nesting (``f(nan)`` and ``f(None)`` one call, a result read back as
    None). Every place that refuses a NaN uses this walk: canonical JSON, results, session identity."""
    nan, none = _nested(float("nan"), depth), _nested(None, depth)
    expected = (True, True, True)
    refused_canonical = False
    try:
        refused_canonical = digest(nan) != digest(none)
    except BadInput:
        refused_canonical = True
    refused_result = why_unrecordable(nan) is not None
    try:
        finite(nan, "args")
        refused_identity = False
    except BadInput:
        refused_identity = True
    assert expected == (refused_canonical, refused_result, refused_identity)


def test_deep_finite_value_still_encodes() -> None:
    """The walk that now goes all the way down passes a deep value with nulls and finite floats."""
    value = _nested({"a": None, "b": 1.5}, 900)
    expected = canonical_json(value)
    assert expected == canonical_json(value, "result")
    assert why_unrecordable(value) is None
