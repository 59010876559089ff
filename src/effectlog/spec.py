"""Load the machine specs in ``specs/`` and compile them into lookup tables.

The specs are data (TOML, read with the standard library's ``tomllib``: comments
allowed, no extra dependency). Everything that needs states or transitions gets
them from here: the ``transitions`` machines, the fold's legality check, the
diagrams and the CLI. Nothing else lists them.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path

import msgspec

from effectlog.errors import SpecError

MACHINES = ("step", "run", "attempt")


class Transition(msgspec.Struct, frozen=True, kw_only=True):
    """One declared transition.

    ``dest`` is a state name, or (with ``by``) a mapping from the value of the
    event field ``by`` to a state name. A transition without ``dest`` is *internal*:
    it records its event and keeps the state it fired in (an annotation such as
    ``run.repinned``); it may not leave a terminal state either, so none starts there.
    """

    trigger: str
    source: tuple[str, ...]
    event: str
    dest: str | dict[str, str] | None = None
    by: str | None = None
    actor: str | None = None

    @property
    def internal(self) -> bool:
        return self.dest is None

    def destinations(self) -> dict[str | None, str]:
        """Destination per value of the ``by`` field (key ``None`` when unconditional); empty when internal."""
        if self.dest is None:
            return {}
        if isinstance(self.dest, str):
            return {None: self.dest}
        return {key: state for key, state in self.dest.items()}

    def destinations_from(self, source: str) -> dict[str | None, str]:
        """Destination per value of ``by`` when fired in ``source`` (``source`` itself when internal)."""
        return {None: source} if self.dest is None else self.destinations()


class MachineSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    initial: str
    terminal: tuple[str, ...]
    states: tuple[str, ...]
    transitions: tuple[Transition, ...]
    admits: dict[str, tuple[str, ...]] = {}
    actors: tuple[str, ...] = ()

    @property
    def events(self) -> frozenset[str]:
        return frozenset(t.event for t in self.transitions)


def specs_dir() -> Path:
    """The specs shipped in the wheel, or the repository's ``specs/`` in a source checkout."""
    shipped = resources.files("effectlog").joinpath("specs")
    if shipped.is_dir():
        return Path(str(shipped))
    return Path(__file__).resolve().parents[2] / "specs"


def parse_spec(text: str, origin: str) -> MachineSpec:
    """Parse and check one spec; errors name the file and what is wrong."""
    try:
        raw = tomllib.loads(text)
        spec = msgspec.convert(raw, MachineSpec)
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise SpecError(f"{origin}: {exc}") from None
    _check(spec, origin)
    return spec


def _check(spec: MachineSpec, origin: str) -> None:
    states = set(spec.states)
    if len(states) != len(spec.states):
        raise SpecError(f"{origin}: duplicate state")
    if spec.initial not in states:
        raise SpecError(f"{origin}: initial state {spec.initial!r} is not a declared state")
    for term in spec.terminal:
        if term not in states:
            raise SpecError(f"{origin}: terminal state {term!r} is not a declared state")
    seen: dict[tuple[str, str], str] = {}
    triggers: set[str] = set()
    for i, t in enumerate(spec.transitions):
        where = f"{origin}: transitions[{i}] ({t.trigger})"
        if t.trigger in triggers:
            raise SpecError(f"{where}: trigger declared twice")
        triggers.add(t.trigger)
        if isinstance(t.dest, dict) and t.by is None:
            raise SpecError(f"{where}: a dest table needs `by` naming the event field")
        if not isinstance(t.dest, dict) and t.by is not None:
            raise SpecError(f"{where}: `by` needs a dest table")
        for s in (*t.source, *t.destinations().values()):
            if s not in states:
                raise SpecError(f"{where}: unknown state {s!r}")
        for s in t.source:
            if s in spec.terminal:
                raise SpecError(f"{where}: leaves terminal state {s!r}")
            key = (s, t.event)
            if key in seen:
                raise SpecError(f"{where}: event {t.event!r} from {s!r} already handled by {seen[key]}")
            seen[key] = t.trigger
        if spec.actors and t.actor not in spec.actors:
            raise SpecError(f"{where}: actor {t.actor!r} is not one of {list(spec.actors)}")
    for state, tags in spec.admits.items():
        if state not in states:
            raise SpecError(f"{origin}: admits names unknown state {state!r}")
        del tags


@cache
def load(name: str) -> MachineSpec:
    """The spec of machine ``name`` (``step``, ``run`` or ``attempt``)."""
    if name not in MACHINES:
        raise SpecError(f"unknown machine {name!r}; expected one of {', '.join(MACHINES)}")
    path = specs_dir() / f"{name}.toml"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"{path}: cannot read spec ({exc.strerror})") from None
    return parse_spec(text, str(path))


class Compiled:
    """A spec as a lookup table: ``(state, event tag) -> (by, destinations)``, O(1) per event."""

    __slots__ = ("admits", "spec", "table", "terminal")

    def __init__(self, spec: MachineSpec) -> None:
        self.spec = spec
        self.table: dict[tuple[str, str], tuple[str | None, dict[str | None, str]]] = {
            (s, t.event): (t.by, t.destinations_from(s)) for t in spec.transitions for s in t.source
        }
        self.terminal = frozenset(spec.terminal)
        self.admits: Mapping[str, frozenset[str]] = {k: frozenset(v) for k, v in spec.admits.items()}

    def next_state(self, state: str, tag: str, event: object = None) -> str | None:
        """The state after event ``tag`` from ``state``, or ``None`` when the spec forbids it.

        ``event`` supplies the field named by ``by`` (attribute or mapping key) when the
        transition's destination depends on it.
        """
        entry = self.table.get((state, tag))
        if entry is None:
            return None
        by, dests = entry
        if by is None:
            return dests[None]
        value = event.get(by) if isinstance(event, Mapping) else getattr(event, by, None)
        return dests.get(value)

    def admitted(self, state: str, tag: str) -> bool:
        allowed = self.admits.get(state)
        return allowed is not None and ("*" in allowed or tag in allowed)


@cache
def compiled(name: str) -> Compiled:
    return Compiled(load(name))
