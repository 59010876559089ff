"""Events: every type round-trips, the encoding is canonical, and tags are stable and unique."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from effectlog import events as ev
from strategies import EVENT_STRATEGIES, any_event

# The published tags. A tag never changes: journals already written depend on it.
EXPECTED_TAGS = {
    "run.started": "RunStarted",
    "run.resumed": "RunResumed",
    "run.suspended": "RunSuspended",
    "run.stopped": "RunStopped",
    "run.completed": "RunCompleted",
    "run.failed": "RunFailed",
    "run.cancelled": "RunCancelled",
    "run.repinned": "RunRepinned",
    "step.requested": "StepRequested",
    "step.resent": "StepResent",
    "step.effected": "StepEffected",
    "step.confirmed": "StepConfirmed",
    "step.uncertain": "StepUncertain",
    "step.reconciled": "StepReconciled",
    "step.denied": "StepDenied",
    "step.approved": "StepApproved",
    "step.failed": "StepFailed",
    "step.carried": "StepCarried",
    "step.sleeping": "StepSleeping",
    "step.woke": "StepWoke",
    "step.expired": "StepExpired",
}

by_type = pytest.mark.parametrize("cls", ev.EVENT_TYPES, ids=lambda cls: cls.__name__)


def shuffled(value: Any, rnd: random.Random) -> Any:
    """The same JSON value with every object's keys in another insertion order."""
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        return {k: shuffled(v, rnd) for k, v in items}
    if isinstance(value, list):
        return [shuffled(v, rnd) for v in value]
    return value


def object_key_orders(data: bytes) -> list[list[str]]:
    """The key order of every JSON object in ``data``, as written."""
    orders: list[list[str]] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        orders.append([k for k, _ in pairs])
        return dict(pairs)

    json.loads(data, object_pairs_hook=hook)
    return orders


def test_every_event_type_has_a_strategy() -> None:
    """The strategies cover every event type, so a new type cannot skip the round-trip tests."""
    assert set(ev.EVENT_TYPES) == set(EVENT_STRATEGIES)


@by_type
@given(data=st.data())
def test_every_event_type_round_trips(cls: type[ev.Event], data: st.DataObject) -> None:
    """decode(encode(e)) is an equal event of the same type, for every type and any valid field values."""
    event = data.draw(EVENT_STRATEGIES[cls])
    decoded = ev.decode(ev.encode(event))
    assert (cls, event) == (type(decoded), decoded)


@given(event=any_event)
def test_encoding_is_canonical(event: ev.Event) -> None:
    """Encoding a decoded event gives back exactly the bytes it was decoded from."""
    data = ev.encode(event)
    assert data == ev.encode(ev.decode(data))


@given(event=any_event)
def test_every_object_in_the_encoding_has_sorted_keys(event: ev.Event) -> None:
    """Struct fields and nested dict keys alike are written in sorted order."""
    orders = object_key_orders(ev.encode(event))
    assert [sorted(keys) for keys in orders] == orders


@given(event=any_event, rnd=st.randoms(use_true_random=False))
def test_dict_key_order_does_not_change_the_bytes(event: ev.Event, rnd: random.Random) -> None:
    """Rebuilding every dict field (plan, args, receipt, result...) with shuffled key order gives the same bytes."""
    fields = {f: getattr(event, f) for f in event.__struct_fields__}
    reordered = msgspec.structs.replace(
        event, **{f: shuffled(v, rnd) for f, v in fields.items() if isinstance(v, dict | list)}
    )
    assert ev.encode(event) == ev.encode(reordered)


def test_args_key_order_inside_a_plan_does_not_change_the_bytes() -> None:
    """Two plans that differ only in the key order of a step's args encode identically."""

    def started(args: dict[str, Any]) -> ev.RunStarted:
        return ev.RunStarted(run_id="r", seq=1, ts=0, plan={"steps": [{"id": "s", "args": args}]})

    a = started({"amount": 5, "to": {"iban": "X", "name": "Y"}})
    b = started({"to": {"name": "Y", "iban": "X"}, "amount": 5})
    assert ev.encode(a) == ev.encode(b)


def test_tags_are_the_published_ones() -> None:
    """Each event type keeps its explicit, published tag (never the class name)."""
    assert EXPECTED_TAGS == {tag: cls.__name__ for tag, cls in ev.TAGS.items()}


def test_tags_are_unique() -> None:
    """No two event types share a tag."""
    tags = [cls.__struct_config__.tag for cls in ev.EVENT_TYPES]
    assert len(set(tags)) == len(ev.EVENT_TYPES) == len(ev.TAGS)


@by_type
def test_tag_namespace_matches_the_kind_of_event(cls: type[ev.Event]) -> None:
    """Step events are tagged step.*, run events run.*."""
    tag = cls.__struct_config__.tag
    assert issubclass(cls, ev.StepEvent) == str(tag).startswith("step.")


@given(event=any_event)
def test_the_encoding_carries_the_tag_in_type(event: ev.Event) -> None:
    """The tag is written in the ``type`` field, the one the decoder dispatches on."""
    assert ev.tag_of(event) == json.loads(ev.encode(event))["type"]


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (
            ev.StepRequested(
                run_id="r",
                seq=2,
                ts=5,
                step_id="s0",
                adapter="a",
                idempotency_key="k",
                args_digest="x",
                idempotent=True,
            ),
            b'{"adapter":"a","args_digest":"x","idempotency_key":"k","idempotent":true,"run_id":"r","seq":2,'
            b'"step_id":"s0","ts":5,"type":"step.requested"}',
        ),
        (
            ev.RunStarted(
                run_id="r",
                seq=1,
                ts=0,
                plan={"steps": [{"id": "s0"}]},
                plan_digest="d",
                adapters={"a": ev.AdapterIdentity(type="noop", version="1", idempotent=False)},
            ),
            b'{"adapters":{"a":{"fingerprint":"","idempotent":false,"type":"noop","version":"1"}},'
            b'"plan":{"steps":[{"id":"s0"}]},"plan_digest":"d","run_id":"r","seq":1,"ts":0,"type":"run.started"}',
        ),
        (
            ev.StepReconciled(
                run_id="r", seq=9, ts=1, step_id="s0", attempt=2, outcome="applied", evidence="e", operator="o"
            ),
            b'{"attempt":2,"evidence":"e","operator":"o","outcome":"applied","run_id":"r","seq":9,"step_id":"s0",'
            b'"ts":1,"type":"step.reconciled"}',
        ),
    ],
    ids=["step.requested", "run.started", "step.reconciled"],
)
def test_encoding_is_byte_stable(event: ev.Event, expected: bytes) -> None:
    """Known events encode to exactly these bytes: the hash chain of existing journals depends on them."""
    assert expected == ev.encode(event)


def test_omitted_defaults_decode_to_the_defaults() -> None:
    """Bytes written without defaulted fields (older writers) decode with the defaults filled in."""
    data = b'{"type":"step.confirmed","run_id":"r","seq":3,"ts":0,"step_id":"s"}'
    assert ev.StepConfirmed(run_id="r", seq=3, ts=0, step_id="s", attempt=1, rebuilt=False) == ev.decode(data)


@pytest.mark.parametrize(
    "data",
    [
        b'{"type":"step.nonsense","run_id":"r","seq":1,"ts":0}',
        b'{"run_id":"r","seq":1,"ts":0}',
        b'{"type":"step.confirmed","run_id":"r","seq":1,"ts":0}',
        b'{"type":"step.reconciled","run_id":"r","seq":1,"ts":0,"step_id":"s","outcome":"maybe","evidence":"","operator":""}',
        b'{"type":"run.resumed","run_id":"r","seq":"1","ts":0}',
    ],
    ids=["unknown tag", "no tag", "missing step_id", "outcome outside its literal", "seq of wrong type"],
)
def test_decode_refuses_what_is_not_a_valid_event(data: bytes) -> None:
    """The typed decoder rejects unknown tags, missing required fields and wrongly typed values."""
    with pytest.raises(msgspec.ValidationError):
        ev.decode(data)


@given(event=any_event)
def test_events_are_frozen(event: ev.Event) -> None:
    """An event cannot be changed after it is built (it may already be hashed into the journal)."""
    with pytest.raises(AttributeError):
        event.seq = event.seq + 1  # type: ignore[misc]
    assert ev.decode(ev.encode(event)) == event


@by_type
@given(data=st.data())
def test_index_columns_are_the_properties(cls: type[ev.Event], data: st.DataObject) -> None:
    """The append path's ``index_columns`` gives exactly the row's dedup key the properties give
    (step key, phase, attempt), for every event type: the shortcut for plain step events never
    changes what the UNIQUE index sees, so a duplicate is refused as before."""
    event = data.draw(EVENT_STRATEGIES[cls])
    expected = (event.step_key, event.phase, event.attempt_no)
    assert expected == ev.index_columns(event)
    assert expected == ev.index_columns(event)  # the second call reads the per-type cache


@by_type
@given(data=st.data())
def test_plain_step_phase_gives_the_properties(cls: type[ev.Event], data: st.DataObject) -> None:
    """The SQLite append's inline form of ``index_columns`` (``PLAIN_STEP_PHASE``: a type's fixed phase,
    then the event's ``step_id`` and ``attempt``; else the properties) gives the row's dedup key the
    properties give, for every event type, and knows every type up front (no lazy fill on the hot path)."""
    event = data.draw(EVENT_STRATEGIES[cls])
    assert cls in ev.PLAIN_STEP_PHASE
    phase = ev.PLAIN_STEP_PHASE[cls]
    inline = (
        (event.step_id, phase, event.attempt)  # type: ignore[attr-defined]
        if phase is not None
        else (event.step_key, event.phase, event.attempt_no)
    )
    assert (event.step_key, event.phase, event.attempt_no) == inline
