"""``transitions`` machines built from the specs: the importable state-machine API.

``step_machine()``, ``run_machine()`` and ``attempt_machine()`` return a model whose
triggers are the spec's triggers. A legal trigger moves the model and queues the
event tag it emits (callbacks do no I/O: the caller decides what to append); an
illegal one raises ``IllegalTransition`` and changes nothing.

The runtime's hot path uses the same spec compiled to a dict
(``effectlog.spec.Compiled``): a ``transitions`` trigger costs tens of
microseconds, a dict lookup well under one. A stateful test proves both agree.
"""

from __future__ import annotations

from typing import Any

from transitions import Machine, MachineError

from effectlog.errors import IllegalTransition
from effectlog.spec import MachineSpec, load


class SpecModel:
    """A model driven by a spec-built ``transitions.Machine``."""

    state: str

    def __init__(self, spec: MachineSpec, initial: str | None = None) -> None:
        self.spec = spec
        self.emitted: list[tuple[str, dict[str, Any]]] = []
        self.machine = Machine(
            model=self,
            states=list(spec.states),
            transitions=_transitions_of(spec),
            initial=initial or spec.initial,
            auto_transitions=False,
            send_event=True,
            after_state_change=self._emit,
        )

    def _emit(self, event_data: Any) -> None:
        self.emitted.append((event_data.transition_event_tag, dict(event_data.kwargs)))

    def fire(self, trigger: str, **fields: Any) -> str:
        """Fire ``trigger`` with the event's ``fields``; returns the new state."""
        before = self.state
        if trigger not in self.machine.events:
            raise IllegalTransition(f"{self.spec.name} machine has no trigger {trigger!r}")
        try:
            moved = self.trigger(trigger, **fields)
        except MachineError:
            raise IllegalTransition(f"{self.spec.name}: {trigger} is not allowed from {before}") from None
        if not moved:
            raise IllegalTransition(f"{self.spec.name}: {trigger} from {before} has no destination for {fields}")
        return self.state

    def allowed(self) -> list[str]:
        """Triggers the spec allows from the current state."""
        return sorted(t.trigger for t in self.spec.transitions if self.state in t.source)

    trigger: Any  # added by transitions


def _transitions_of(spec: MachineSpec) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for t in spec.transitions:
        prepare = [_tagger(t.event)]
        if t.internal:  # dest None: keeps its state; after_state_change still queues its event
            out.append({"trigger": t.trigger, "source": list(t.source), "dest": None, "prepare": prepare})
            continue
        if t.by is None:
            out.append({"trigger": t.trigger, "source": list(t.source), "dest": t.dest, "prepare": prepare})
            continue
        for value, dest in t.destinations().items():
            out.append(
                {
                    "trigger": t.trigger,
                    "source": list(t.source),
                    "dest": dest,
                    "prepare": prepare,
                    "conditions": [_field_is(str(t.by), value)],
                }
            )
    return out


def _tagger(tag: str) -> Any:
    def prepare(event_data: Any) -> None:
        event_data.transition_event_tag = tag

    return prepare


def _field_is(field: str, value: Any) -> Any:
    def condition(event_data: Any) -> bool:
        return bool(event_data.kwargs.get(field) == value)

    condition.__name__ = f"{field}={value}"
    return condition


def step_machine(initial: str | None = None) -> SpecModel:
    return SpecModel(load("step"), initial)


def run_machine(initial: str | None = None) -> SpecModel:
    return SpecModel(load("run"), initial)


def attempt_machine(initial: str | None = None) -> SpecModel:
    return SpecModel(load("attempt"), initial)
