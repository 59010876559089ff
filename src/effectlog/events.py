"""The events: frozen, tagged msgspec Structs, the only things the journal stores.

Rules (schema evolution): a tag never changes; a new field always has a default;
an existing field never changes type. One encoder and one typed decoder, built
once here and reused everywhere. Encoding is canonical (sorted keys), because
the hash chain is computed over these bytes.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import msgspec

from effectlog.canonical import _encoder


class AdapterIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """What a run pins about an adapter: a change of any field is a different adapter."""

    type: str
    version: str
    idempotent: bool
    fingerprint: str = ""


class EffectStoreIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """The effect store a run uses: the id written into the store when it was created, and its path."""

    store_id: str
    path: str = ""


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=True):
    """Fields every event carries."""

    run_id: str
    seq: int
    ts: int  # nanoseconds since the epoch, from the runtime's injectable clock

    # The event's identity beyond (run_id, seq): the database makes it unique.
    repeatable: ClassVar[bool] = False

    @property
    def step_key(self) -> str:
        return ""

    @property
    def phase(self) -> str:
        tag: str = self.__struct_config__.tag  # type: ignore[assignment]
        return f"{tag}#{self.seq}" if self.repeatable else tag

    @property
    def attempt_no(self) -> int:
        return 0


# -- run events ---------------------------------------------------------------


class RunStarted(Event, frozen=True, kw_only=True, tag="run.started"):
    """Pins what the run is: its plan (or session), the plan's digest and each adapter's identity."""

    kind: Literal["plan", "session"] = "plan"
    plan: dict[str, Any] | None = None
    plan_digest: str = ""
    adapters: dict[str, AdapterIdentity] = {}
    effect_store: EffectStoreIdentity | None = None  # the store evidence may be read from (issue 12)
    # The plan's adapters whose factory asked for that store: their effects are its rows, so only their
    # steps may be reconciled from its ledger (empty in runs older than this field: not known).
    store_adapters: tuple[str, ...] = ()
    # A fork (`effectlog fork`/`retry`): the parent run, the step it runs again from, who and why.
    forked_from: str = ""
    from_step: str = ""
    by: str = ""
    reason: str = ""
    deadline: int | None = None  # the run's deadline (ns since the epoch): a step not begun by then fails
    # The W3C traceparent of the process's `effectlog.run` span when tracing was on (issue 16),
    # so that a later process driving the run links its span to this one.
    traceparent: str = ""
    # The fleet request the run serves (its id in the fleet store; 0: none, or a run older than this
    # field): a request owns one run, so ``verify`` names two runs that serve one request (attack14).
    request: int = 0


class RunResumed(Event, frozen=True, kw_only=True, tag="run.resumed"):
    pid: int = 0
    traceparent: str = ""  # as on run.started
    # The effect store this resume was given, for a run that pinned none until now (it started without
    # one): from here on it is the run's, as if run.started had named it.
    effect_store: EffectStoreIdentity | None = None
    repeatable: ClassVar[bool] = True


class RunSuspended(Event, frozen=True, kw_only=True, tag="run.suspended"):
    step_id: str
    reason: str = ""
    repeatable: ClassVar[bool] = True


class RunStopped(Event, frozen=True, kw_only=True, tag="run.stopped"):
    step_id: str
    reason: str = ""
    repeatable: ClassVar[bool] = True


class RunRepinned(Event, frozen=True, kw_only=True, tag="run.repinned"):
    """An operator accepted new adapter implementations (an upgrade) for an open run; its plan is unchanged."""

    adapters: dict[str, AdapterIdentity]  # the identities pinned from now on
    previous: dict[str, AdapterIdentity] = {}  # those they replace (only the changed ones)
    version: str = ""  # the effectlog version that accepted them
    by: str
    reason: str
    repeatable: ClassVar[bool] = True


class RunCompleted(Event, frozen=True, kw_only=True, tag="run.completed"):
    result: Any = None


class RunFailed(Event, frozen=True, kw_only=True, tag="run.failed"):
    step_id: str | None = None
    reason: str = ""


class RunCancelled(Event, frozen=True, kw_only=True, tag="run.cancelled"):
    by: str = ""
    reason: str = ""


# -- step events ----------------------------------------------------------------


class StepEvent(Event, frozen=True, kw_only=True):
    step_id: str
    attempt: int = 1

    @property
    def step_key(self) -> str:
        return self.step_id

    @property
    def attempt_no(self) -> int:
        return self.attempt


class StepRequested(StepEvent, frozen=True, kw_only=True, tag="step.requested"):
    """Write-ahead: durable before the tool is invoked."""

    adapter: str
    idempotency_key: str
    args_digest: str
    idempotent: bool = False
    kind: Literal["tool", "model"] = "tool"
    fingerprint: str = ""  # sessions: digest of (kind, name, canonical args) for divergence checks
    args: dict[str, Any] | None = None  # sessions' tool steps: the args, secret values as their digests
    # A fork's step that failed with an unknown outcome in its parent, on an idempotent tool: the
    # fork sends it again under the parent's key (this field names the parent), never a new one.
    key_from: str = ""


class StepResent(StepEvent, frozen=True, kw_only=True, tag="step.resent"):
    """The same idempotency key sent again (after a crash or a retryable error)."""

    resend: int
    reason: str = ""

    @property
    def phase(self) -> str:
        return f"step.resent#{self.resend}"


class StepEffected(StepEvent, frozen=True, kw_only=True, tag="step.effected"):
    """The tool's receipt, durable."""

    receipt: Any = None
    ok: bool = True


class StepConfirmed(StepEvent, frozen=True, kw_only=True, tag="step.confirmed"):
    """The result is accepted and the run moves past the step."""

    rebuilt: bool = False  # True when confirmed on resume from an already recorded receipt


class StepUncertain(StepEvent, frozen=True, kw_only=True, tag="step.uncertain"):
    reason: str = ""


class StepReconciled(StepEvent, frozen=True, kw_only=True, tag="step.reconciled"):
    """A claim backed by evidence: who asserted what, and whether a person or an automated check."""

    outcome: Literal["applied", "not_applied"]
    evidence: str
    operator: str
    automated: bool = False
    adapter_identity: AdapterIdentity | None = None  # reconcile --lookup: the adapter whose lookup answered


class StepDenied(StepEvent, frozen=True, kw_only=True, tag="step.denied"):
    """Denied before execution. ``deny`` is final; ``require_approval`` waits for a person."""

    decision: Literal["deny", "require_approval"]
    by: str = "policy"
    reason: str = ""
    args_digest: str = ""
    adapter: str = ""  # sessions: the held tool, so a divergence can name what was recorded
    fingerprint: str = ""  # sessions: digest of (kind, name, canonical args), as on step.requested
    args: dict[str, Any] | None = None  # sessions: the held call's args, secret values as their digests
    repeatable: ClassVar[bool] = True


class StepApproved(StepEvent, frozen=True, kw_only=True, tag="step.approved"):
    """Bound to the digest of the step's exact args; used once."""

    by: str
    args_digest: str
    reason: str = ""
    expires_at: int | None = None
    repeatable: ClassVar[bool] = True


class StepCarried(StepEvent, frozen=True, kw_only=True, tag="step.carried"):
    """A fork's step before its fork point: the parent run's recorded result, not executed again."""

    from_run: str
    from_seq: int  # the parent's event that made the step done (its step.confirmed or step.reconciled)
    from_attempt: int = 1
    from_state: Literal["confirmed", "reconciled"] = "confirmed"
    adapter: str = ""
    idempotency_key: str = ""  # the parent's key: the effect was made under it
    args_digest: str = ""
    receipt: Any = None


class StepFailed(StepEvent, frozen=True, kw_only=True, tag="step.failed"):
    reason: str = ""
    applied: bool | None = None  # False: the tool said "not applied"; None: it ran and reported failure


class StepSleeping(StepEvent, frozen=True, kw_only=True, tag="step.sleeping"):
    """A durable sleep: the wake-up time, durable before the process waits (a resume waits the remainder)."""

    wake_at: int = 0  # ns since the epoch
    fingerprint: str = ""  # digest of the step's kind, as on step.requested, for divergence checks


class StepWoke(StepEvent, frozen=True, kw_only=True, tag="step.woke"):
    """The sleep's wake-up time passed; the step is done."""


class StepExpired(StepEvent, frozen=True, kw_only=True, tag="step.expired"):
    """A deadline passed before the step's intent was written: failed by contract, never applied."""

    deadline: int = 0  # ns since the epoch
    scope: Literal["step", "run"] = "step"
    adapter: str = ""  # the tool or model the step would have called
    kind: str = "tool"
    fingerprint: str = ""


AnyEvent = (
    RunStarted
    | RunResumed
    | RunSuspended
    | RunStopped
    | RunRepinned
    | RunCompleted
    | RunFailed
    | RunCancelled
    | StepRequested
    | StepResent
    | StepEffected
    | StepConfirmed
    | StepUncertain
    | StepReconciled
    | StepDenied
    | StepApproved
    | StepFailed
    | StepCarried
    | StepSleeping
    | StepWoke
    | StepExpired
)

EVENT_TYPES: tuple[type[Event], ...] = AnyEvent.__args__
TAGS: dict[str, type[Event]] = {t.__struct_config__.tag: t for t in EVENT_TYPES}  # type: ignore[misc]

_decoder: msgspec.json.Decoder[AnyEvent] = msgspec.json.Decoder(AnyEvent)


def encode(event: Event) -> bytes:
    """Canonical bytes of an event (the same event always gives the same bytes)."""
    return _encoder.encode(event)


# ``encode`` itself, the encoder's bound method: what the append paths ``map`` over a batch (no Python frame per event).
encode_direct = _encoder.encode


def decode(data: bytes) -> AnyEvent:
    """Typed decode; raises ``msgspec.ValidationError``/``DecodeError`` on bad bytes."""
    return _decoder.decode(data)


# A row's index columns (step key, phase, attempt) by event type, for the append path: the three
# properties cost about a microsecond an event there. None: the type overrides one of them, or
# its phase depends on the event (repeatable), so its properties are asked.
_PLAIN_STEP_ROW: dict[type[Event], str | None] = {}


def _plain_step_phase(cls: type[Event]) -> str | None:
    plain = (
        issubclass(cls, StepEvent)
        and not cls.repeatable
        and cls.step_key is StepEvent.step_key
        and cls.attempt_no is StepEvent.attempt_no
        and cls.phase is Event.phase
    )
    tag = str(cls.__struct_config__.tag) if plain else None
    _PLAIN_STEP_ROW[cls] = tag
    return tag


def index_columns(event: Event) -> tuple[str, str, int]:
    """``(event.step_key, event.phase, event.attempt_no)``, the same values, without the property
    calls for the step events every step writes (requested, effected, confirmed)."""
    cls = type(event)
    tag = _PLAIN_STEP_ROW[cls] if cls in _PLAIN_STEP_ROW else _plain_step_phase(cls)
    if tag is not None:
        return event.step_id, tag, event.attempt  # type: ignore[attr-defined]
    return event.step_key, event.phase, event.attempt_no


# ``_PLAIN_STEP_ROW`` filled for every event type up front: the append path looks a type up in it inline
# (one dict lookup instead of a call of ``index_columns``); a type not in it (a subclass) asks its properties.
PLAIN_STEP_PHASE: dict[type[Event], str | None] = {cls: _plain_step_phase(cls) for cls in EVENT_TYPES}


def tag_of(event: Event) -> str:
    return event.__struct_config__.tag  # type: ignore[return-value]
