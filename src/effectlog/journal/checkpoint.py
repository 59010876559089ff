"""Open-run checkpoints: resume loads a summary bound to the chain plus the events after it.

A run that is still open is resumed from its state; replaying 100k events for it cost
~1 s of CPU. So, every ``EVERY_EVENTS`` events, the run actor hands the journal a
*checkpoint segment* with a batch, written in the same transaction as the batch (as a
seal is for a closed run): the run-level fields of the state after that batch and the
full state of every step changed since the run's previous segment. Segments are
append-only rows ``(run_id, seq, prev, body, hash)``:

- ``seq`` is the run's last event in the batch, and ``hash = H(event_hash(seq) + prev, body)``
  binds the segment to that event of the chain (the run's head when it was written);
- ``prev`` is the hash of the run's previous segment (``GENESIS`` for the first), so the
  segments form their own chain and a removed or reordered segment is seen.

Resume (``load``) folds the segments of a run into a state and replays the events after
the last one (checking their chain from the segment's bound event). A segment that is not
bound (its event is gone or differs, its hash or ``prev`` does not link, its body does not
decode) is never used: the run is replayed in full instead, which checks the whole chain
and stops on real damage. ``verify`` checks every column of every segment against the
full replay at that seq (``check_segments``).

Derived data, not part of the event schema: writers add the table if it is missing,
readers of older journals find no segments and replay, the schema version does not change.
"""

from __future__ import annotations

import operator
import os
import zlib
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat, starmap
from typing import Any, Protocol, TypeVar, runtime_checkable

import immutables
import msgspec
from msgspec.structs import astuple

from effectlog import events as ev
from effectlog.chain import GENESIS, Chain
from effectlog.conforms import conforms
from effectlog.errors import ChainBroken, CorruptEvent, EventConflict, Truncated
from effectlog.fold import Record, RunState, StepState, identical, same_step, state_from_summary
from effectlog.journal import frontier as fr

DEFAULT_EVERY = 512
SETTING = "EFFECTLOG_CHECKPOINT_EVERY"


def _cadence(text: str | None, default: int = DEFAULT_EVERY) -> int:
    return int(text) if text is not None and text.isascii() and text.isdigit() else default


def check_setting() -> None:
    """Refuse a malformed ``EFFECTLOG_CHECKPOINT_EVERY`` before a journal is opened (nothing written)."""
    text = os.environ.get(SETTING)
    if text is not None and not (text.isascii() and text.isdigit()):
        from effectlog.errors import BadInput

        raise BadInput(f"{SETTING}={text!r}: expected a whole number of events (0 turns checkpoint segments off)")


# The cadence: a segment with the batch that brings a run EVERY_EVENTS (or more) events past
# its previous segment. A segment costs O(steps changed since the last one), so the per-step
# path pays about a microsecond per event; a resume replays at most about this many events.
# 0: no segments. ``EFFECTLOG_CHECKPOINT_EVERY`` sets it (tests/test_checkpoints.py kills real runs with 1 and 2).
EVERY_EVENTS = _cadence(os.environ.get(SETTING))

CheckpointRow = tuple[str, int, bytes]  # (run id, seq of the batch's last event, encoded segment)
StoredSegment = tuple[str, int, bytes, bytes, bytes]  # (run id, seq, prev, body, hash) as stored


class Segment(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The run-level fields of the state at ``seq`` (all but the plan, its step ids and the head),
    and the full state of each step changed since the previous segment."""

    run_id: str
    seq: int
    state: str
    kind: str = "plan"
    plan_digest: str = ""
    adapters: dict[str, ev.AdapterIdentity] = {}
    effect_store: ev.EffectStoreIdentity | None = None
    result: Any = None
    reason: str = ""
    blocked_step: str | None = None
    deadline: int | None = None
    resumes: int = 0
    traceparent: str = ""
    started_ts: int = 0
    updated_ts: int = 0
    steps: list[StepState] = []
    # What a resume needs up front (journal/frontier.py); absent in segments written before it and
    # in those of a run that is not driven from a plan by its actor: those resume from every segment.
    frontier: fr.Frontier | None = None


@runtime_checkable
class CheckpointJournal(Protocol):
    """A journal that stores checkpoint segments (SQLite and PostgreSQL; a fleet's fenced view replays)."""

    def append_checkpointed(
        self,
        events: Sequence[ev.Event],
        seals: Sequence[tuple[str, int, bytes]],
        checkpoints: Sequence[CheckpointRow],
    ) -> list[Record]:
        """Append ``events``, then ``seals`` and ``checkpoints`` (each at its run's last seq), in one transaction."""
        ...

    def checkpoint_rows(self, run_id: str) -> list[tuple[int, bytes, bytes, bytes, bytes | None]]:
        """The run's segments with their events' hashes (``select_sql``), for ``load``; unchecked."""
        ...

    def stored_checkpoints(self, run_id: str) -> list[StoredSegment]:
        """The run's segment rows as stored, ``(run id, seq, prev, body, hash)``; unchecked."""
        ...

    def checkpointed_runs(self) -> list[tuple[str, int]]:
        """Each run that has segments, with its last segment's seq (for ``verify``: a run whose events are all gone)."""
        ...


def is_checkpointing(journal: object) -> bool:
    """``isinstance(journal, CheckpointJournal)``, answered once per class (``effectlog.conforms``)."""
    return conforms(journal, CheckpointJournal)


_F = TypeVar("_F", bound=Callable[..., Any])


def forwards(method: _F) -> _F:
    """Marks a journal's ``append`` or ``append_sealed`` that is ``append_checkpointed`` with nothing
    extra, so the journal writer may call ``append_checkpointed`` for it directly (``forwarding``)."""
    method.__effectlog_forwards__ = True  # type: ignore[attr-defined]
    return method


def forwarding(journal: object) -> bool:
    """Whether ``journal``'s own ``append`` (and ``append_sealed``, when it has one) are marked
    ``forwards``: a subclass or another backend that does more in them is always called through them."""
    cls = type(journal)
    names = ("append", "append_sealed") if hasattr(cls, "append_sealed") else ("append",)
    return all(getattr(getattr(cls, name, None), "__effectlog_forwards__", False) for name in names)


def _twin(cls: type[Any], name: str, types: dict[str, Any], **config: Any) -> type[Any]:
    """A struct with ``cls``'s fields in the same order with the same defaults, their types replaced
    by ``types`` (``Any`` for those it does not name when ``loose``): it encodes as ``cls`` would
    encode the same values.

    ``fresh``: each non-empty str default is an equal copy of ``cls``'s, never the same object.
    ``omit_defaults`` leaves a str out only when it *is* the default object, which a str decoded
    from JSON never is while a live state's may be: so the twin of a struct whose values used to
    reach it through JSON in full (a ``StepState``: it does not omit defaults) writes such a field
    always, as it did then, and its bytes do not depend on where a value came from."""
    loose = config.pop("loose", False)
    fresh = config.pop("fresh", False)
    fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
    for f in msgspec.structs.fields(cls):
        typ = types.get(f.name, Any if loose else f.type)
        if f.required:
            fields.append((f.name, typ))
        elif f.default is not msgspec.NODEFAULT:
            default = f.default
            if fresh and type(default) is str and len(default) > 1:
                default = "".join(list(default))  # (equal, never the same object)
            fields.append((f.name, typ, default))
        else:
            fields.append((f.name, typ, msgspec.field(default_factory=f.default_factory)))
    return msgspec.defstruct(name, fields, **config)


def _slim_type() -> type[Any]:
    """A twin of ``StepState`` with the same fields in the same order and ``omit_defaults``: a step is
    encoded with the fields it has set only (about a third), and decodes back as a ``StepState``
    (a missing key is its default). Half the bytes to read, hash and decode on every resume."""
    return _twin(StepState, "SlimStep", {}, loose=True, fresh=True, omit_defaults=True, gc=False)


_SlimStep = _slim_type()
# The segment as written: ``Segment`` and ``Frontier`` with their steps as ``_SlimStep`` (same fields,
# order and options, so the same bytes as ``Segment`` with slim steps), built by ``segment_row``.
_SlimFrontier = _twin(fr.Frontier, "SlimFrontier", {"open": list[_SlimStep]}, frozen=True, kw_only=True)  # type: ignore[valid-type]
_SlimSegment = _twin(
    Segment,
    "SlimSegment",
    {"steps": list[_SlimStep], "frontier": _SlimFrontier | None},  # type: ignore[valid-type]
    frozen=True,
    kw_only=True,
    omit_defaults=True,
)
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Segment)
_json_encoder = msgspec.json.Encoder()
_any_json_decoder = msgspec.json.Decoder()


def _inflate(body: bytes) -> bytes:
    """A segment body's msgpack: zlib over msgpack (``0x78``, written since the frontier made a resume read
    one segment), or plain msgpack (a map: ``0x80``-``0x8f``/``0xde``/``0xdf``) as earlier journals hold it."""
    if body[:1] == b"\x78":
        try:
            return zlib.decompress(body)
        except zlib.error as exc:
            raise msgspec.DecodeError(f"compressed checkpoint body: {exc}") from None
    return body


def _decode(body: bytes) -> Segment:
    """A segment body (``_inflate``) decoded."""
    return _decoder.decode(_inflate(body))


# ``Segment`` with its ``steps`` left as the stored msgpack array (``verify``'s quick path in
# ``check_segments``): every other field decoded and validated as ``Segment``'s.
_RawStepsSegment = _twin(Segment, "RawStepsSegment", {"steps": msgspec.Raw}, frozen=True, kw_only=True)
_raw_steps_decoder = msgspec.msgpack.Decoder(_RawStepsSegment)


SQLITE_DDL: tuple[str, ...] = (
    """CREATE TABLE checkpoints (
        run_id TEXT NOT NULL,
        seq INTEGER NOT NULL CHECK (seq > 0),
        prev BLOB NOT NULL,
        body BLOB NOT NULL,
        hash BLOB NOT NULL,
        PRIMARY KEY (run_id, seq)
    ) WITHOUT ROWID""",
    """CREATE TRIGGER checkpoints_append_only_update BEFORE UPDATE ON checkpoints
       BEGIN SELECT RAISE(ABORT, 'effectlog: checkpoints are append-only'); END""",
    """CREATE TRIGGER checkpoints_append_only_delete BEFORE DELETE ON checkpoints
       BEGIN SELECT RAISE(ABORT, 'effectlog: checkpoints are append-only'); END""",
)


def postgres_ddl(schema: str) -> tuple[str, ...]:
    """The PostgreSQL table (``schema.checkpoints``), append-only by the events' own trigger function."""
    return (
        f"""CREATE TABLE IF NOT EXISTS {schema}.checkpoints (
            run_id TEXT NOT NULL,
            seq BIGINT NOT NULL CHECK (seq > 0),
            prev BYTEA NOT NULL,
            body BYTEA NOT NULL,
            hash BYTEA NOT NULL CHECK (octet_length(hash) = 32),
            CONSTRAINT checkpoints_pkey PRIMARY KEY (run_id, seq)
        )""",
        f"""CREATE TRIGGER checkpoints_append_only BEFORE UPDATE OR DELETE OR TRUNCATE ON {schema}.checkpoints
            FOR EACH STATEMENT EXECUTE FUNCTION {schema}.refuse_change()""",
        f"ALTER TABLE {schema}.checkpoints ENABLE ALWAYS TRIGGER checkpoints_append_only",
    )


def due(state: RunState, last_seq: int) -> bool:
    """Whether a batch that brings the run to ``state`` should carry a segment."""
    return EVERY_EVENTS > 0 and state.seq - last_seq >= EVERY_EVENTS and not state.closed  # cheapest test first


def segment_row(state: RunState, changed: Iterable[str], frontier: fr.Frontier | None = None) -> CheckpointRow:
    """The segment of ``state``: its run-level fields, the steps named in ``changed`` and ``frontier``."""
    steps = state.steps
    # Each step as its slim twin (same fields, same values; C loops, no frame per step).
    chosen: list[Any] = list(
        starmap(_SlimStep, map(astuple, sorted((steps[s] for s in changed if s in steps), key=_index)))
    )
    opened: list[Any] = [] if frontier is None else list(starmap(_SlimStep, map(astuple, frontier.open)))
    both = chosen + opened
    # The live state was built from the event objects before the journal encoded them as JSON, which
    # keeps some values otherwise (bytes in a receipt become base64 text, a tuple a list): the segment
    # must hold what the replay of the journal gives, so those values take the same way through JSON
    # first. Only the fields that hold arbitrary values can change on that way (a step's ``args`` and
    # ``receipt``, the run's ``result``; every other field of a step and of the run is a str, int, bool
    # or None, or a struct or list of those, which JSON gives back as they are), so
    # only they make the round trip, all in one: the bytes are those of the whole segment's round trip
    # (what this did until issue 18 measured it: 5.6M instructions per 171-step segment, now 3.6M;
    # tests/test_checkpoints.py compares the two).
    result, args, receipts = _any_json_decoder.decode(
        _json_encoder.encode((state.result, list(map(_args, both)), list(map(_receipt, both))))
    )
    list(map(setattr, both, repeat("args"), args))
    list(map(setattr, both, repeat("receipt"), receipts))
    slim = _SlimSegment(
        run_id=state.run_id,
        seq=state.seq,
        state=state.state,
        kind=state.kind,
        plan_digest=state.plan_digest,
        adapters=state.adapters,
        effect_store=state.effect_store,
        result=result,
        reason=state.reason,
        blocked_step=state.blocked_step,
        deadline=state.deadline,
        resumes=state.resumes,
        traceparent=state.traceparent,
        started_ts=state.started_ts,
        updated_ts=state.updated_ts,
        steps=chosen,
        frontier=None
        if frontier is None
        else _SlimFrontier(prefix=frontier.prefix, count=frontier.count, done_after=frontier.done_after, open=opened),
    )
    # Compressed (zlib level 1, like a seal): a resume reads only the last segment (journal/frontier.py),
    # so inflating costs it one segment's worth, while every segment's bytes stay in the file for good.
    return state.run_id, state.seq, zlib.compress(_encoder.encode(slim), 1)


_args = operator.attrgetter("args")
_receipt = operator.attrgetter("receipt")


def _index(step: StepState) -> int:
    return step.index


def link(chain: Chain, event_hash: bytes, prev: bytes, body: bytes) -> bytes:
    """A segment's hash: bound to its event's chain hash and to the previous segment."""
    return chain.link(event_hash + prev, body)


# The SQL, with the backend's placeholder and table name; run inside the batch's transaction.
def insert(
    query: Callable[[str, tuple[Any, ...]], list[tuple[Any, ...]]],
    table: str,
    mark: str,
    *,
    chain: Chain,
    row: CheckpointRow,
    event_hash: bytes,
) -> None:
    """Append one segment after the run's last one (the caller has checked ``seq`` is the run's head).

    The same segment again (a batch re-appended whole) is a no-op, like its events; another
    segment at that seq is an ``EventConflict``.
    """
    run_id, seq, body = row
    last = query(
        f"SELECT seq, hash, body = {mark} FROM {table} WHERE run_id = {mark} ORDER BY seq DESC LIMIT 1", (body, run_id)
    )
    if last and last[0][0] == seq:
        if last[0][2]:
            return
        raise EventConflict("a different checkpoint is already recorded at this seq", run_id=run_id, seq=seq)
    prev = bytes(last[0][1]) if last else GENESIS
    query(
        f"INSERT INTO {table} (run_id, seq, prev, body, hash) VALUES ({mark}, {mark}, {mark}, {mark}, {mark})",
        (run_id, seq, prev, body, link(chain, event_hash, prev, body)),
    )


def check_not_cut(rows: Sequence[tuple[Any, ...]], head: tuple[int, bytes], run_id: str) -> None:
    """A segment is written in the transaction of its event, so one naming a seq past the run's last
    event is evidence that the run's tail was cut: ``Truncated`` (exit 7), the run is not driven on
    from what is left (a cut ``step.requested`` would be sent again)."""
    if rows and rows[-1][0] > head[0]:
        raise Truncated(
            f"the run's checkpoint was written with its event seq {rows[-1][0]}, the journal's last is seq "
            f"{head[0]}: events were cut from the end of the run",
            run_id=run_id,
            seq=head[0],
            column="checkpoints.seq",
        )


def select_sql(table: str, events: str, mark: str, *, last: bool = False, join: str | None = None) -> str:
    """A run's segments (or only its ``last``), each with its event's hash (NULL when that event is gone), in order.
    ``join``: how a segment ``c`` finds its event ``e`` when the events are not keyed ``(run_id, seq)``
    (the SQLite journal's schema v2)."""
    join = join or f"LEFT JOIN {events} e ON e.run_id = c.run_id AND e.seq = c.seq"
    return (
        f"SELECT c.seq, c.prev, c.body, c.hash, e.hash FROM {table} c {join} "
        f"WHERE c.run_id = {mark} ORDER BY c.seq" + (" DESC LIMIT 1" if last else "")
    )


def load_last(rows: Sequence[tuple[Any, ...]], chain: Chain, run_id: str) -> tuple[Segment, bytes] | None:
    """The run's last segment and its event's hash, from ``rows`` (``select_sql(last=True)``), when it
    is bound to its event (its hash links that event's hash, its stored ``prev`` and its body) and
    decodes; else ``None``. The segments before it are checked when a step is loaded from them."""
    if not rows:
        return None
    seq, stored_prev, raw, stored_hash, event_hash = rows[-1]
    if event_hash is None or link(chain, bytes(event_hash), bytes(stored_prev), bytes(raw)) != bytes(stored_hash):
        return None
    try:
        segment = _decode(bytes(raw))
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if segment.run_id != run_id or segment.seq != seq:
        return None
    return segment, bytes(event_hash)


def state_at(segment: Segment, head: bytes, steps: Any) -> RunState:
    """The state at ``segment`` (no plan) with ``steps`` (a ``frontier.LazySteps`` or a map)."""
    return state_from_summary(segment, head=head, steps=steps)


def load(rows: Sequence[tuple[Any, ...]], chain: Chain, run_id: str) -> RunState | None:
    """The state at the last segment, from ``rows`` of ``select_sql``; ``None`` when any segment is
    not bound to its event and its predecessor (the caller then replays in full).

    The state has no ``plan``/``plan_steps`` (the caller fills them from the run's ``Plan`` whose
    digest matches) and its ``head`` is the bound event's hash, so the events after it are
    replayed with their chain checked from there.
    """
    if not rows:
        return None
    prev = GENESIS
    steps: dict[str, StepState] = {}
    segment: Segment | None = None
    head = GENESIS
    for seq, stored_prev, raw, stored_hash, event_hash in rows:
        body, digest = bytes(raw), bytes(stored_hash)
        if event_hash is None or bytes(stored_prev) != prev or link(chain, bytes(event_hash), prev, body) != digest:
            return None
        try:
            segment = _decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        if segment.run_id != run_id or segment.seq != seq:
            return None
        for step in segment.steps:
            steps[step.step_id] = step
        prev, head = digest, bytes(event_hash)
    assert segment is not None
    return _state(segment, immutables.Map(steps), head)


def _state(segment: Segment, steps: immutables.Map[str, StepState], head: bytes) -> RunState:
    return state_from_summary(segment, head=head, steps=steps)


def without_plan(state: RunState) -> RunState:
    """What a segment records of ``state`` (the plan is the run's own ``Plan``, given on resume)."""
    return msgspec.structs.replace(state, plan=None, plan_steps=frozenset())


def check_segments(
    stored: Sequence[StoredSegment],
    advance: Callable[[int], tuple[RunState, set[str]] | None],
    chain: Chain,
) -> None:
    """Every column of every segment of one run (for ``verify``).

    ``advance(seq)`` replays the run's events up to ``seq`` and gives the state there and the
    ids of the steps those events touched (``None`` when the run has no event ``seq``). Each
    segment's ``prev`` must link to the previous segment, its ``hash`` to the event at ``seq``,
    its body must decode and name its row, its run-level fields must equal the replay's, its
    steps must be the replay's, and together with the earlier segments it must hold every step
    the replay has, each as the replay has it (checked for the steps touched since the last
    segment: the others are unchanged since they were checked).

    A segment as a run actor writes it carries exactly the steps touched since the previous one:
    its steps are then compared as stored bytes with the replay's touched steps encoded as
    ``segment_row`` encodes them (``_quick``), not decoded one by one; any other segment is decoded
    in full and compared step by step (issue 18: the steps' decode, comparison and freeing were most
    of the check beside inflating and hashing the body).
    """
    prev = GENESIS
    steps: dict[str, StepState | None] = {}  # per step id a segment carried: the replay's step there
    plan_ids: list[str] | None = None
    positions: dict[str, int] = {}
    proved = 0  # the plan's first ``proved`` steps are done (a frontier's prefix, checked once)
    for run_id, seq, stored_prev, body, digest in stored:
        where: dict[str, Any] = {"run_id": run_id, "seq": seq}
        found = advance(seq)
        if found is None:
            raise Truncated(
                f"the run's checkpoint was written with its event seq {seq}, which the journal no longer has: "
                "events were cut from the end of the run",
                **where,
                column="checkpoints.seq",
            )
        state, touched = found
        if stored_prev != prev:
            raise ChainBroken(
                "a checkpoint does not follow the run's previous checkpoint (one was removed or edited)",
                **where,
                column="checkpoints.prev",
            )
        if link(chain, state.head, prev, body) != digest:
            raise ChainBroken(
                "a checkpoint's stored hash does not link to its event (the checkpoint or that event was edited)",
                **where,
                column="checkpoints.hash",
            )
        # The quick path: the segment's steps as stored, compared byte for byte with the replay's steps
        # changed since the previous segment encoded as ``segment_row`` writes them (``_quick``); any
        # other segment (a step left out, added or altered, another order, another encoding, a body
        # that does not decode) is decoded in full and checked step by step below, which names it.
        quick = _quick(body, state, touched)
        segment: Any
        if quick is not None:
            segment, chosen = quick
        else:
            chosen = None
            try:
                segment = _decode(body)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise CorruptEvent(f"a checkpoint does not decode: {exc}", **where, column="checkpoints.body") from None
        for column, value, derived in (("run_id", run_id, segment.run_id), ("seq", seq, segment.seq)):
            if value != derived:
                raise CorruptEvent(
                    f"stored column checkpoints.{column} is {value!r}, the checkpoint body says {derived!r}",
                    **where,
                    column=f"checkpoints.{column}",
                )
        # (The per-step work as ``map``s and one list comparison: no Python frame per step, as in
        # ``fold.fold_rows``; about a third of what a segment's check costs beside its decode.)
        replayed = state.steps.get
        at_replay: list[Any]
        if chosen is not None:  # the segment's steps are ``chosen``'s bytes: ``at_replay == segment.steps`` holds
            at_replay = chosen
            ids = list(map(_step_id, chosen))
        else:
            ids = list(map(_step_id, segment.steps))
            at_replay = list(map(replayed, ids))
        # ``steps`` keeps the replay's step for each id a segment carried, not the segment's own: the two are
        # compared equal just below (or the check raises), and the decoded steps are then freed with their
        # segment instead of staying alive to the end (a second copy of every step of the run).
        steps.update(zip(ids, at_replay, strict=True))
        empty: immutables.Map[str, StepState] = immutables.Map()
        agrees = _state(segment, empty, state.head) == msgspec.structs.replace(without_plan(state), steps=empty)
        agrees = agrees and identical(segment.result, state.result)  # (``==`` holds ``1`` and ``true`` equal)
        agrees = agrees and len(steps) == len(state.steps)
        agrees = agrees and (chosen is not None or all(map(same_step, at_replay, segment.steps)))  # (likewise)
        # A touched step the segment carries is ``steps``' entry just compared: only the others are asked.
        rest = touched.difference(ids) if agrees else ()
        agrees = agrees and all(steps.get(sid) == replayed(sid) for sid in rest if sid)
        if not agrees:
            raise CorruptEvent(
                "a checkpoint disagrees with the replay of its run's events", **where, column="checkpoints.body"
            )
        if segment.frontier is not None:
            if plan_ids is None:
                plan_ids = _plan_ids(state)
            if segment.frontier.done_after and not positions:  # (only ``done_after``'s ids are looked up in it)
                positions = {sid: i for i, sid in enumerate(plan_ids)}
            proved = fr.check(segment.frontier, state, plan_ids, positions, proved)
        prev = digest


_step_id = operator.attrgetter("step_id")


def _quick(body: bytes, state: RunState, touched: set[str]) -> tuple[Any, list[StepState]] | None:
    """The segment decoded with its steps left as stored, and the replay's steps changed since the
    previous segment (``touched``) in index order, when the stored steps are exactly those steps as
    ``segment_row`` encodes them (same bytes, so the same values: the msgpack of the replay's values,
    which came from JSON, decodes back to them); else ``None`` (the caller decodes the segment in full)."""
    steps = state.steps
    try:
        segment = _raw_steps_decoder.decode(_inflate(body))
        stored = segment.steps
        if type(stored) is not msgspec.Raw:
            return None
        step_of: Callable[[str], StepState] = steps.__getitem__  # (a KeyError: a touched step it lacks)
        chosen = sorted(map(step_of, touched), key=_index)
        expected = bytearray(len(stored))  # (the stored size up front: the encoder's buffer never grows)
        _encoder.encode_into(list(starmap(_SlimStep, map(astuple, chosen))), expected)
    except (msgspec.MsgspecError, LookupError, ValueError, TypeError, ArithmeticError):
        return None  # (whatever stops the quick path: the full decode and comparison decide, and name it)
    return (segment, chosen) if expected == memoryview(stored) else None


def _plan_ids(state: RunState) -> list[str]:
    """The step ids of the run's pinned plan, in order (a session has none)."""
    raw = (state.plan or {}).get("steps", []) if state.kind == "plan" else []
    try:  # read by ``map`` in C when every entry is a dict with an id (a plan as effectlog writes it)
        ids = list(map(_plan_id, raw))
        if set(map(type, ids)) <= {str}:
            return ids
    except (KeyError, TypeError):  # an entry without an id, or not a dict
        pass
    return [s["id"] for s in raw if isinstance(s, dict) and isinstance(s.get("id"), str)]


_plan_id = operator.itemgetter("id")
