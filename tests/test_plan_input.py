"""Plan input at its edges, in-process: ids matched whole, duplicate keys found at any depth,
the plan size cap at its exact boundary, and which tool results can be recorded."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from effectlog.errors import PlanError
from effectlog.plan import is_valid_id, load_plan, parse_plan
from effectlog.recordable import why_unrecordable
from strategies import json_values

valid_ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}", fullmatch=True)


def plan_text(run_id: str = "r", step_id: str = "s") -> str:
    steps = [{"id": step_id, "adapter": "t"}]
    return json.dumps({"run_id": run_id, "adapters": {"t": {"type": "noop"}}, "steps": steps})


@given(valid_ids, st.sampled_from(["\n", "\r\n", " ", "\t"]))
def test_an_id_with_trailing_whitespace_or_newline_is_refused_as_run_id_and_step_id(ident: str, tail: str) -> None:
    """Every valid id is accepted whole; the same id with a trailing newline (which Python's ``$``
    lets through) or other whitespace is refused, as run id and as step id alike."""
    assert is_valid_id(ident)
    assert not is_valid_id(ident + tail)
    parse_plan(plan_text(run_id=ident).encode())
    for bad in (plan_text(run_id=ident + tail), plan_text(step_id=ident + tail)):
        with pytest.raises(PlanError, match="is not a valid id"):
            parse_plan(bad.encode())


@pytest.mark.parametrize(
    ("text", "where", "key"),
    [
        ('{"run_id": "r", "run_id": "r", "adapters": {}, "steps": []}', "plan", "run_id"),
        ('{"run_id": "r", "adapters": {"t": {"type": "noop", "type": "shell"}}, "steps": []}', "adapters.t", "type"),
        (
            '{"run_id": "r", "adapters": {"t": {"type": "noop"}}, '
            '"steps": [{"id": "a", "adapter": "t"}, {"id": "b", "adapter": "t", "args": {"x": [{"k": 1, "k": 2}]}}]}',
            "steps[1].args.x[0]",
            "k",
        ),
    ],
)
def test_a_key_given_twice_is_refused_with_its_json_path(text: str, where: str, key: str) -> None:
    """A key twice in any object of the plan (top level, an adapter, deep in a step's args) is
    refused naming the key and the path of the object that holds it."""
    with pytest.raises(PlanError) as caught:
        parse_plan(text.encode(), "p.json")

    assert f"p.json: {where}: key {key!r} appears more than once" in str(caught.value)


@pytest.mark.parametrize(
    ("text", "where", "key"),
    [
        ('{"run_id":"r","run_id":"r","adapters":{},"steps":[]}', "plan", "run_id"),
        (
            '{"adapters":{"t":{"type":"noop","type":"noop"}},"run_id":"r","steps":[{"adapter":"t","id":"a"}]}',
            "adapters.t",
            "type",
        ),
        (
            '{"adapters":{"t":{"type":"noop"}},"run_id":"r","steps":[{"adapter":"t","args":{"k":1,"k":1},"id":"a"}]}',
            "steps[0].args",
            "k",
        ),
    ],
)
def test_a_key_given_twice_in_compact_json_is_refused_too(text: str, where: str, key: str) -> None:
    """Compact JSON, the form stores and encoders write (whose plans skip the second, duplicate-key pass
    when the bytes are the encoding of what they decode to), with a key twice, even with the same value
    twice, is refused as any other text is."""
    with pytest.raises(PlanError) as caught:
        parse_plan(text.encode(), "p.json")

    assert f"p.json: {where}: key {key!r} appears more than once" in str(caught.value)


def test_the_plan_size_cap_holds_at_its_exact_boundary(tmp_path: Path) -> None:
    """A plan of exactly ``max_plan_bytes`` loads; one byte more is refused without parsing."""
    path = tmp_path / "p.json"
    path.write_text(plan_text())
    size = os.path.getsize(path)

    assert "r" == load_plan(path, max_plan_bytes=size).run_id
    with pytest.raises(PlanError, match=f"over the {size - 1}-byte limit"):
        load_plan(path, max_plan_bytes=size - 1)


@given(json_values)
def test_every_json_value_can_be_recorded(value: Any) -> None:
    """Whatever JSON value a tool returns is recordable (no false refusals)."""
    assert why_unrecordable(value) is None


def _cycle() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ({"a": [1, object()]}, "result.a[1]: a value of type object"),
        (frozenset({1, "x"}), "result: a frozenset mixing int and str"),
        ({"k": {3: "v"}}, "result.k: a dict key of type int"),
        (_cycle(), "result[0]: a self-referencing list"),
        (["ok", "\udc80"], "result[1]: a str with a lone surrogate"),
        ((x for x in ()), "result: a value of type generator"),
    ],
)
def test_an_unrecordable_result_is_named_with_its_type_and_place(value: Any, said: str) -> None:
    """What the journal cannot encode is named: the type and the path inside the result."""
    assert (why_unrecordable(value) or "").startswith(said)
