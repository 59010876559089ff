"""The attempt machine as the fleet uses it: every state set derived from ``specs/attempt.toml``.

Nothing here lists a state. ``QUEUED`` is the spec's initial state, ``FINAL`` its
terminal states, ``LIVE`` (holding a lease) the states the recovery service may take
an attempt out of, and ``OPEN`` everything not final (at most one open attempt per
request, enforced by the database). ``move`` checks a transition against the compiled
table and the actor the spec names for it, before anything is written.
"""

from __future__ import annotations

import re
from typing import Literal

from effectlog.errors import IllegalTransition, SpecError
from effectlog.spec import Transition, compiled

Actor = Literal["scheduler", "lease_owner", "recovery_service", "operator"]

MACHINE = compiled("attempt")
SPEC = MACHINE.spec
BY_TRIGGER: dict[str, Transition] = {t.trigger: t for t in SPEC.transitions}

QUEUED: str = SPEC.initial
FINAL: frozenset[str] = frozenset(SPEC.terminal)
LIVE: frozenset[str] = frozenset(s for t in SPEC.transitions if t.actor == "recovery_service" for s in t.source)
OPEN: frozenset[str] = frozenset(SPEC.states) - FINAL
# The triggers after which the request goes on with a new queued attempt (the old one ends
# without an outcome). Every other transition into a final state ends the request.
REQUEUES: frozenset[str] = frozenset({"lose", "requeue"})
# States an operator acts on (besides withdrawing a queued request).
AWAITING_OPERATOR: frozenset[str] = frozenset(
    s for t in SPEC.transitions if t.actor == "operator" for s in t.source
) - {QUEUED}

_NAME = re.compile(r"^[a-z_]+$")
for _state in SPEC.states:  # they are inlined into SQL (sql_list): refuse anything but plain names
    if not _NAME.match(_state):
        raise SpecError(f"specs/attempt.toml: state {_state!r} must be lower-case letters and underscores")


def move(state: str, trigger: str, actor: Actor) -> str:
    """The state after ``trigger`` from ``state``, made by ``actor``; ``IllegalTransition`` otherwise."""
    transition = BY_TRIGGER.get(trigger)
    if transition is None:
        raise IllegalTransition(f"the attempt machine has no trigger {trigger!r}")
    if transition.actor != actor:
        raise IllegalTransition(f"attempt: {trigger} is made by the {transition.actor}, not the {actor}")
    dest = MACHINE.next_state(state, transition.event)
    if dest is None:
        raise IllegalTransition(f"attempt: {trigger} is not allowed from {state}")
    return dest


def allowed(state: str, trigger: str) -> bool:
    transition = BY_TRIGGER.get(trigger)
    return transition is not None and MACHINE.next_state(state, transition.event) is not None


def event_of(trigger: str) -> str:
    return BY_TRIGGER[trigger].event


def sql_list(states: frozenset[str]) -> str:
    """``('a', 'b')`` for an SQL ``IN``: names checked above, sorted so the DDL is stable."""
    return "(" + ", ".join(f"'{s}'" for s in sorted(states)) + ")"


for _trigger in REQUEUES:  # a requeue ends the old attempt: the spec must send it to a final state
    if _trigger not in BY_TRIGGER or not set(BY_TRIGGER[_trigger].destinations().values()) <= FINAL:
        raise SpecError(f"specs/attempt.toml: {_trigger!r} must exist and lead to a final state")
