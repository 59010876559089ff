"""A resume that does not grow with history: the frontier of an open plan run, and a lazy step map.

A checkpoint segment (``journal/checkpoint.py``) holds the steps changed since the previous
segment, so the state at the last segment is the union of every segment: reading, hashing and
decoding all of them grew with the run (155 ms at 100k events). A resume only needs the steps
it may still act on. So the actor writes, in each segment, the run's *frontier*:

- ``prefix``: the plan's first ``prefix`` steps (in plan order) are all done (``confirmed`` or
  ``reconciled``: terminal states, so they stay done for ever);
- ``done_after``: the ids of the other done steps;
- ``open``: the full state of every step that is not done;
- ``count``: how many steps the run has.

Every step the run has is in exactly one of the three, and ``prefix + len(done_after) +
len(open) == count`` (checked on resume and by ``verify``). So the state at the segment is
known *completely* from the last segment alone: a step is open (its state is right there),
done (its state is loaded on demand from all segments, or the full replay when a segment does
not link), or it does not exist. ``LazySteps`` is that map: it answers ``get`` for open and
changed steps at once, loads the done ones when one of them is asked for (or the whole map is
iterated), and never answers "no state" for a step the journal has.

Resume then reads one segment and the events after it, and the actor starts its walk over the
plan at ``prefix`` instead of step 0 (the steps before it are done, so they would be skipped).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

import immutables
import msgspec

from effectlog.errors import CorruptEvent
from effectlog.fold import DONE_STATES, RunState, StepState, all_done, same_step

_T = TypeVar("_T")
_MISSING: Any = object()


class Frontier(msgspec.Struct, frozen=True, kw_only=True):
    """What a resume needs of a plan run's steps (see the module docstring)."""

    prefix: int
    count: int
    done_after: list[str] = []
    open: list[StepState] = []

    def consistent(self) -> bool:
        """The three parts are disjoint and account for every step (cheap: ``done_after`` and
        ``open`` are small; a frontier that fails this is not used)."""
        open_ids = {s.step_id for s in self.open}
        after = set(self.done_after)
        return (
            self.prefix >= 0
            and len(after) == len(self.done_after)
            and len(open_ids) == len(self.open)
            and not (after & open_ids)
            and all(s.state not in DONE_STATES for s in self.open)
            and self.prefix + len(after) + len(open_ids) == self.count
        )


class Tracker:
    """The frontier the actor keeps up to date, one segment at a time (immutable: ``advance`` gives a new one).

    ``advance`` looks only at the steps changed since the previous segment, plus the steps the
    prefix moves over: O(changes), not O(steps).
    """

    __slots__ = ("_done_after", "_ids", "_open", "prefix")

    def __init__(
        self,
        ids: Sequence[str],
        prefix: int = 0,
        done_after: frozenset[str] = frozenset(),
        open_ids: frozenset[str] = frozenset(),
    ) -> None:
        self._ids = ids
        self.prefix = prefix
        self._done_after = done_after
        self._open = open_ids

    @classmethod
    def of(cls, ids: Sequence[str], frontier: Frontier) -> Tracker:
        return cls(ids, frontier.prefix, frozenset(frontier.done_after), frozenset(s.step_id for s in frontier.open))

    def advance(self, state: RunState, changed: set[str]) -> tuple[Tracker, Frontier]:
        """The tracker and the frontier of ``state``, given the steps changed since the last call."""
        steps = state.steps
        done_after, open_ids = set(self._done_after), set(self._open)
        for sid in changed:
            step = steps.get(sid) if sid else None
            if step is None:
                continue
            if step.state in DONE_STATES:
                open_ids.discard(sid)
                done_after.add(sid)
            else:
                open_ids.add(sid)
        ids, prefix = self._ids, self.prefix
        count = len(ids)
        if type(ids) is PlanIds:  # (the actor's: each id read from its decl here, no two calls of its own per step)
            decls = ids._decls
            while prefix < count and decls[prefix].id in done_after:
                done_after.remove(decls[prefix].id)
                prefix += 1
        else:
            while prefix < count and ids[prefix] in done_after:
                done_after.remove(ids[prefix])
                prefix += 1
        frontier = Frontier(
            prefix=prefix,
            count=len(steps),
            done_after=sorted(done_after),
            open=sorted((steps[s] for s in open_ids), key=_index),
        )
        return Tracker(ids, prefix, frozenset(done_after), frozenset(open_ids)), frontier


class PlanIds(Sequence[str]):
    """A plan's step ids in order, read from its ``StepDecl``s on access (a list of 66k ids cost a
    resume ~10 ms; a resume reads a handful of them)."""

    __slots__ = ("_decls",)

    def __init__(self, decls: Sequence[Any]) -> None:
        self._decls = decls

    def __len__(self) -> int:
        return len(self._decls)

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [d.id for d in self._decls[i]]
        return str(self._decls[i].id)


def _index(step: StepState) -> int:
    return step.index


class _Hidden:
    """The done steps a ``LazySteps`` family has not loaded yet (shared: they never change)."""

    __slots__ = ("ids", "load", "loaded")

    def __init__(self, ids: Callable[[], list[str]], load: Callable[[], Mapping[str, StepState]]) -> None:
        self.ids, self.load = ids, load
        self.loaded: immutables.Map[str, StepState] | None = None

    def states(self) -> immutables.Map[str, StepState]:
        if self.loaded is None:
            found = self.load()
            hidden: dict[str, StepState] = {}
            for sid in self.ids():
                step = found.get(sid)
                if step is None or step.state not in DONE_STATES:
                    raise CorruptEvent(
                        f"the run's checkpoint names step {sid!r} done, its segments and events say "
                        f"{'nothing of it' if step is None else step.state}",
                        step_id=sid,
                        column="checkpoints.body",
                    )
                hidden[sid] = step
            self.loaded = immutables.Map(hidden)
        return self.loaded


class LazySteps:
    """A run's step map (the ``immutables.Map`` interface the fold and the actor use) whose done
    steps are loaded on first need. ``known``: every open step and every step changed since the
    segment; ``positions``: the plan's step id -> position; a step is hidden (done, not loaded)
    when it is not known and it is in ``done_after`` or at a position below ``prefix``."""

    __slots__ = ("_after", "_count", "_full", "_hidden", "_known", "_positions", "_prefix")

    def __init__(
        self,
        known: immutables.Map[str, StepState],
        hidden_count: int,
        *,
        prefix: int,
        done_after: frozenset[str],
        positions: Mapping[str, int],
        hidden: _Hidden,
    ) -> None:
        self._known, self._count = known, hidden_count
        self._prefix, self._after, self._positions, self._hidden = prefix, done_after, positions, hidden
        self._full: immutables.Map[str, StepState] | None = None

    @classmethod
    def at(
        cls,
        frontier: Frontier,
        ids: Sequence[str],
        positions: Mapping[str, int],
        load: Callable[[], Mapping[str, StepState]],
    ) -> LazySteps:
        """The steps of the state at a segment with ``frontier``; ``load()`` gives (at least) every done step."""
        after = frozenset(frontier.done_after)
        known = immutables.Map({s.step_id: s for s in frontier.open})
        hidden = _Hidden(lambda: [*ids[: frontier.prefix], *frontier.done_after], load)
        count = frontier.prefix + len(after)
        return cls(known, count, prefix=frontier.prefix, done_after=after, positions=positions, hidden=hidden)

    def _is_hidden(self, sid: str) -> bool:
        return sid in self._after or self._positions.get(sid, self._prefix) < self._prefix

    def _force(self) -> immutables.Map[str, StepState]:
        if self._full is None:
            hidden = self._hidden.states()
            self._full = hidden.update(self._known) if self._known else hidden
        return self._full

    # -- read without loading -------------------------------------------------------------

    def get(self, sid: str, default: _T | None = None) -> StepState | _T | None:
        step = self._known.get(sid)
        if step is not None:
            return step
        if self._full is not None:
            return self._full.get(sid, default)
        if self._is_hidden(sid):
            return self._force().get(sid, default)
        return default

    def done(self, sid: str) -> bool:
        """Whether the step is done (``confirmed``/``reconciled``), without loading a hidden one."""
        step = self._known.get(sid)
        if step is not None:
            return step.state in DONE_STATES
        if self._full is not None:
            return _done(self._full.get(sid))
        return self._is_hidden(sid)

    def __len__(self) -> int:
        return self._count + len(self._known)

    def __contains__(self, sid: object) -> bool:
        return isinstance(sid, str) and self.get(sid) is not None

    def __getitem__(self, sid: str) -> StepState:
        step = self.get(sid)
        if step is None:
            raise KeyError(sid)
        return step

    # -- persistent updates ------------------------------------------------------------------

    def set(self, sid: str, step: StepState) -> LazySteps:
        count = self._count - 1 if sid not in self._known and self._is_hidden(sid) else self._count
        return self._with(self._known.set(sid, step), count)

    def update(self, changes: Mapping[str, StepState]) -> LazySteps:
        known = self._known
        count = self._count - sum(1 for sid in changes if sid not in known and self._is_hidden(sid))
        return self._with(known.update(changes), count)

    def _with(self, known: immutables.Map[str, StepState], count: int) -> LazySteps:
        return LazySteps(
            known, count, prefix=self._prefix, done_after=self._after, positions=self._positions, hidden=self._hidden
        )

    # -- everything else loads the done steps -------------------------------------------------

    def keys(self) -> Any:
        return self._force().keys()

    def values(self) -> Any:
        return self._force().values()

    def items(self) -> Any:
        return self._force().items()

    def __iter__(self) -> Iterator[str]:
        return iter(self._force())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazySteps):
            other = other._force()
        return self._force() == other

    def __hash__(self) -> int:
        return hash(self._force())

    def __repr__(self) -> str:
        return f"LazySteps({len(self)} steps, {len(self._known)} loaded)"


def _done(step: StepState | None) -> bool:
    return step is not None and step.state in DONE_STATES


def loaded(state: RunState) -> RunState:
    """``state`` with its step map loaded in full (an ``immutables.Map``): for a state that must
    outlive the journal its done steps are loaded from."""
    steps: Any = state.steps
    return msgspec.structs.replace(state, steps=steps._force()) if isinstance(steps, LazySteps) else state


def is_done(steps: Any, sid: str) -> bool:
    """Whether step ``sid`` is done in ``steps`` (a ``LazySteps`` or an ``immutables.Map``), loading nothing."""
    if isinstance(steps, LazySteps):
        return steps.done(sid)
    return _done(steps.get(sid))


def check(frontier: Frontier, state: RunState, ids: Sequence[str], positions: Mapping[str, int], checked: int) -> int:
    """``frontier`` against the full replay ``state`` at its seq (for ``verify``); ``ids``/``positions``:
    the plan's step ids in order; ``checked``: how much of the prefix an earlier segment already proved
    done (done is terminal). Returns the new ``checked``; raises ``CorruptEvent`` on any disagreement."""
    steps = state.steps
    ok = frontier.consistent() and frontier.count == len(steps) and frontier.prefix <= len(ids)
    ok = ok and all_done(steps, ids[checked : frontier.prefix])  # (no Python frame per step)
    ok = ok and all(same_step(steps.get(s.step_id), s) for s in frontier.open)  # (``==`` and the values' types)
    after = frontier.prefix
    ok = ok and all(positions.get(sid, -1) >= after and _done(steps.get(sid)) for sid in frontier.done_after)
    if not ok:
        raise CorruptEvent(
            "a checkpoint's frontier (done prefix, done and open steps) disagrees with the replay of its run's events",
            run_id=state.run_id,
            seq=state.seq,
            column="checkpoints.body",
        )
    return max(checked, frontier.prefix)
