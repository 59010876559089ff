"""Seals: a closed run's summary, recorded with its closing event, so a re-run need not replay it.

A closed run (completed, failed, cancelled) never reopens, so when the runtime records
the closing event it also records, in the same transaction, a *seal*: every run-level
field of the state (except the pinned plan itself) and each step's id, state and attempt,
in order. The journal binds a seal to the run's chain head (``hash = H(head || seal)``)
and hands it back only while that head is still the run's last event.

Re-running a closed run then costs one seal instead of a replay of its whole history.
``load_run`` (the full replay, verifying the chain) is unchanged and stays the authority:
``effectlog verify``, the inspect commands and every open run use it. A run without a
seal is replayed in full. A seal that is no longer bound to the head is evidence, not a
cache miss: the run's tail was cut or its last event (or the seal) edited, so
``check_bound`` raises ``Truncated`` or ``ChainBroken`` and nothing runs.

A seal's body is two zlib streams, one after the other: the run-level fields, with ``steps``
the number of steps, then the steps as ``[id, state, attempt]`` rows. A re-run inflates the
first alone and hands the second, still compressed, to the outcome's ``StepRows``, which
builds the rows if and when they are read: a re-run's cost does not grow with the run's
length. (The whole body is still hashed against the chain head before anything is read.)
A seal written before this layout is one stream whose ``steps`` is the list of rows; it is
read as before. An older effectlog reading a two-stream seal finds ``steps`` a number where it
expects a list, so it treats the seal as unusable and replays the run in full.
"""

from __future__ import annotations

import operator
import zlib
from collections.abc import Sequence
from functools import partial
from typing import Any, Protocol, runtime_checkable

import immutables
import msgspec

from effectlog import events as ev
from effectlog.chain import Chain
from effectlog.conforms import conforms
from effectlog.errors import ChainBroken, CorruptEvent, Truncated
from effectlog.fold import Record, RunState, StepState, state_from_summary
from effectlog.outcome import StepRows, StepSummary

SealRow = tuple[str, int, bytes]  # (run id, seq of the closing event, encoded seal)
StoredSeal = tuple[str, int, bytes, bytes]  # a seals row: (run id, seq, encoded seal, hash)


class SealedStep(msgspec.Struct, frozen=True, array_like=True):
    """What a seal keeps of a step: enough to report it, nothing to re-drive it."""

    step_id: str
    state: str
    attempt: int


class RunSeal(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The run-level fields of a closed run's state, and its steps in order of first appearance."""

    run_id: str
    seq: int
    state: str
    kind: str = "plan"
    plan_digest: str = ""
    adapters: dict[str, ev.AdapterIdentity] = {}
    result: Any = None
    reason: str = ""
    blocked_step: str | None = None
    resumes: int = 0
    started_ts: int = 0
    updated_ts: int = 0
    effect_store: ev.EffectStoreIdentity | None = None
    deadline: int | None = None  # the run's deadline (issue 17.4)
    steps: list[SealedStep] = []


class _SummaryRow(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A sealed step read for a report (``gc=False``: strings and an int cannot form a cycle)."""

    step_id: str
    state: str
    attempt: int


class _SealHeader(RunSeal, frozen=True, kw_only=True, omit_defaults=True):
    """A seal's first stream as written: the run-level fields, and how many rows the second holds."""

    steps: int = 0  # type: ignore[assignment]


class _SealHead(RunSeal, frozen=True, kw_only=True, omit_defaults=True):
    """A seal's first stream as read: ``steps`` left undecoded (a count, or a one-stream seal's rows)."""

    steps: msgspec.Raw = msgspec.Raw()  # type: ignore[assignment]


_RUN_LEVEL = tuple(name for name in RunSeal.__struct_fields__ if name != "steps")
_encoder = msgspec.json.Encoder(order="sorted")
_head_decoder = msgspec.json.Decoder(_SealHead)
_count_decoder = msgspec.json.Decoder(int)
_steps_decoder = msgspec.json.Decoder(list[SealedStep])
_rows_decoder = msgspec.json.Decoder(list[_SummaryRow])


@runtime_checkable
class SealingJournal(Protocol):
    """A journal that can store seals (the SQLite journal; other backends simply replay)."""

    def append_sealed(self, events: Sequence[ev.Event], seals: Sequence[SealRow]) -> list[Record]:
        """Append ``events`` and then ``seals`` in one transaction; each seal's seq is its run's last."""
        ...

    def sealed(self, run_id: str) -> tuple[bytes, bytes] | None:
        """``(seal, chain head)`` while the run's seal is bound to its last event, else ``None``."""
        ...

    def stored_seals(self, run_id: str | None = None) -> list[StoredSeal]:
        """The seal rows as stored, ``(run id, seq, body, hash)``, of one run or of all; unchecked."""
        ...


def is_sealing(journal: object) -> bool:
    """``isinstance(journal, SealingJournal)``, answered once per class (``effectlog.conforms``)."""
    return conforms(journal, SealingJournal)


def seal_row(state: RunState) -> SealRow:
    """The seal of a closed run's state: its run-level fields and its rows, each compressed (step ids
    repeat a lot), as two streams (see the module docstring)."""
    rows = [SealedStep(s.step_id, s.state, s.attempt) for s in state.ordered_steps()]
    header = _SealHeader(
        run_id=state.run_id,
        seq=state.seq,
        state=state.state,
        kind=state.kind,
        plan_digest=state.plan_digest,
        adapters=state.adapters,
        result=state.result,
        reason=state.reason,
        blocked_step=state.blocked_step,
        resumes=state.resumes,
        started_ts=state.started_ts,
        updated_ts=state.updated_ts,
        effect_store=state.effect_store,
        deadline=state.deadline,
        steps=len(rows),
    )
    body = zlib.compress(_encoder.encode(header), 6) + zlib.compress(_encoder.encode(rows), 6)
    return state.run_id, state.seq, body


def _open(body: bytes) -> tuple[_SealHead, bytes | None, int | None]:
    """A seal's run-level fields, its rows' stream (``None``: a one-stream seal, whose rows are in
    ``head.steps``) and their count (``None`` for a one-stream seal). Inflates the first stream only."""
    inflater = zlib.decompressobj()
    first = inflater.decompress(body)
    if not inflater.eof:
        raise zlib.error("the seal ends inside its first stream")
    head = _head_decoder.decode(first)
    rest = inflater.unused_data
    if not rest:
        return head, None, None
    count = _count_decoder.decode(head.steps) if len(head.steps) else 0
    if count < 0:
        raise msgspec.ValidationError(f"the seal says it has {count} steps")
    return head, rest, count


def _rows_text(head: _SealHead, rest: bytes | None) -> bytes | msgspec.Raw:
    """The rows' JSON: inflated from the second stream, which must end the body exactly."""
    if rest is None:
        return head.steps if len(head.steps) else b"[]"
    inflater = zlib.decompressobj()
    text = inflater.decompress(rest)
    if not inflater.eof or inflater.unused_data:
        raise zlib.error("the seal's rows do not end the seal")
    return text


def _decoded(body: bytes) -> RunSeal:
    """The whole seal, rows included (its number of rows checked against its count)."""
    head, rest, count = _open(body)
    steps = _steps_decoder.decode(_rows_text(head, rest))
    if count is not None and len(steps) != count:
        raise msgspec.ValidationError(f"the seal says it has {count} steps and holds {len(steps)}")
    return RunSeal(**{name: getattr(head, name) for name in _RUN_LEVEL}, steps=steps)


def state_from_seal(body: bytes, head: bytes) -> RunState:
    """The summary state a seal stands for (equal to ``sealed_view`` of the full replay)."""
    seal = _decoded(body)
    return _run_fields(seal, head, _seal_steps(seal))


def closed_summary(body: bytes, head: bytes) -> tuple[RunState, StepRows]:
    """What a re-run of a closed run reports, in time that does not grow with the run.

    The run-level fields of ``state_from_seal`` (its ``steps`` map left empty: a closed run is
    only reported, never driven) and the outcome's step rows, built from the seal's second
    stream, held compressed in memory, when first read (``outcome.StepRows``). Rows that do not
    decode then raise ``CorruptEvent`` on ``seals.body``.
    """
    seal, rest, count = _open(body)
    rows = StepRows(partial(_summary_rows, seal, rest, count), count)
    return _run_fields(seal, head, immutables.Map()), rows


def _summary_rows(seal: _SealHead, rest: bytes | None, count: int | None) -> list[StepSummary]:
    try:
        rows = _rows_decoder.decode(_rows_text(seal, rest))
    except (zlib.error, msgspec.DecodeError) as exc:
        raise CorruptEvent(
            f"the run's seal's step rows do not decode: {exc}", run_id=seal.run_id, seq=seal.seq, column="seals.body"
        ) from None
    if count is not None and len(rows) != count:
        raise CorruptEvent(
            f"the run's seal says it has {count} steps and holds {len(rows)}",
            run_id=seal.run_id,
            seq=seal.seq,
            column="seals.body",
        )
    return [StepSummary(id=r.step_id, state=r.state, attempt=r.attempt) for r in rows]


def _seal_steps(seal: RunSeal) -> immutables.Map[str, StepState]:
    return immutables.Map(
        {
            s.step_id: StepState(step_id=s.step_id, index=i, state=s.state, attempt=s.attempt)
            for i, s in enumerate(seal.steps)
        }
    )


def _run_fields(seal: RunSeal, head: bytes, steps: immutables.Map[str, StepState]) -> RunState:
    return state_from_summary(seal, head=head, steps=steps)


def sealed_view(state: RunState) -> RunState:
    """What a seal keeps of ``state``: everything but the plan and the traceparent, and per step its id,
    index, state, attempt."""
    steps = immutables.Map(
        {
            s.step_id: StepState(step_id=s.step_id, index=s.index, state=s.state, attempt=s.attempt)
            for s in state.steps.values()
        }
    )
    # The traceparent only links a later drive's span (issue 16); a closed run is never driven again.
    return msgspec.structs.replace(state, plan=None, plan_steps=frozenset(), steps=steps, traceparent="")


def check_bound(stored: StoredSeal, head: tuple[int, bytes], chain: Chain) -> None:
    """The seal names the run's last event and its hash links to it; else an integrity error.

    ``head`` is the run's ``(last seq, last hash)`` as the journal holds it now.
    """
    run_id, seq, body, digest = stored
    if seq != head[0]:
        raise Truncated(
            f"the run's seal says its last event is seq {seq}, the journal's last is seq {head[0]}: "
            "events were cut from (or added to) the end of a closed run",
            run_id=run_id,
            seq=head[0],
            sealed_seq=seq,
        )
    if chain.link(head[1], body) != digest:
        raise ChainBroken(
            "the seal's stored hash does not link to the run's last event (the seal or that event was edited)",
            run_id=run_id,
            seq=seq,
            column="seals.hash",
        )


def check_seal(stored: StoredSeal, state: RunState, chain: Chain) -> None:
    """Every column of a seals row against the full replay ``state`` of its run (for ``verify``)."""
    check_bound(stored, (state.seq, state.head), chain)
    run_id, seq, body, _ = stored
    try:
        seal = _decoded(body)
    except (zlib.error, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise CorruptEvent(
            f"the run's seal does not decode: {exc}", run_id=run_id, seq=seq, column="seals.body"
        ) from None
    for column, stored_value, derived in (("run_id", run_id, seal.run_id), ("seq", seq, seal.seq)):
        if stored_value != derived:
            raise CorruptEvent(
                f"stored column seals.{column} is {stored_value!r}, the seal body says {derived!r}",
                run_id=run_id,
                seq=seq,
                column=f"seals.{column}",
            )
    if not _agrees(seal, state):
        raise CorruptEvent(
            "the run's seal disagrees with the replay of its events", run_id=run_id, seq=seq, column="seals.body"
        )


def _agrees(seal: RunSeal, state: RunState) -> bool:
    """``state_from_seal(seal) == sealed_view(state)``, without building either's step states and maps
    (at 33k steps that was most of ``verify``'s time on a closed run): the run-level fields compared
    whole, then each sealed step against the replayed step at its position, and the counts."""
    empty: immutables.Map[str, StepState] = immutables.Map()
    run_level = msgspec.structs.replace(state, plan=None, plan_steps=frozenset(), steps=empty, traceparent="")
    if _run_fields(seal, state.head, empty) != run_level or len(seal.steps) != len(state.steps):
        return False
    # Each sealed step's (position, state, attempt) against the replayed step's (index, state, attempt),
    # read by ``map`` and compared as two lists in C: no Python frame per step.
    sealed = seal.steps
    try:
        replayed = list(map(_placed, map(state.steps.get, map(_sealed_id, sealed))))
    except AttributeError:  # a sealed step the replay does not have (``None`` has no index)
        return False
    expected = zip(range(len(sealed)), map(_sealed_state, sealed), map(_sealed_attempt, sealed), strict=True)
    return replayed == list(expected)


_placed = operator.attrgetter("index", "state", "attempt")
_sealed_id, _sealed_state, _sealed_attempt = (operator.attrgetter(name) for name in ("step_id", "state", "attempt"))
