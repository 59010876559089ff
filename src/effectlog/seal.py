"""Seals: a closed run's summary, recorded with its closing event, so a re-run need not replay it.

A closed run (completed, failed, cancelled) never reopens, so when the runtime records
the closing event it also records, in the same transaction, a *seal*: every run-level
field of the state (except the pinned plan itself) and each step's id, state and attempt,
in order. The journal binds a seal to the run's chain head (``hash = H(head || seal)``)
and hands it back only while that head is still the run's last event.

Re-running a closed run then costs one seal instead of a replay of its whole history.
``load_run`` (the full replay, verifying the chain) is unchanged and stays the authority:
``effectlog verify``, the inspect commands and every open run use it. A seal that is
missing, or no longer bound to the head, is ignored and the run is replayed in full.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import immutables
import msgspec

from effectlog import events as ev
from effectlog.fold import Record, RunState, StepState

SealRow = tuple[str, int, bytes]  # (run id, seq of the closing event, encoded seal)


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
    steps: list[SealedStep] = []


_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(RunSeal)


@runtime_checkable
class SealingJournal(Protocol):
    """A journal that can store seals (the SQLite journal; other backends simply replay)."""

    def append_sealed(self, events: Sequence[ev.Event], seals: Sequence[SealRow]) -> list[Record]:
        """Append ``events`` and then ``seals`` in one transaction; each seal's seq is its run's last."""
        ...

    def sealed(self, run_id: str) -> tuple[bytes, bytes] | None:
        """``(seal, chain head)`` while the run's seal is bound to its last event, else ``None``."""
        ...


def seal_row(state: RunState) -> SealRow:
    """The seal of a closed run's state, compressed (step ids repeat a lot)."""
    seal = RunSeal(
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
        steps=[SealedStep(s.step_id, s.state, s.attempt) for s in state.ordered_steps()],
    )
    return state.run_id, state.seq, zlib.compress(_encoder.encode(seal), 6)


def state_from_seal(body: bytes, head: bytes) -> RunState:
    """The summary state a seal stands for (equal to ``sealed_view`` of the full replay)."""
    seal = _decoder.decode(zlib.decompress(body))
    steps = immutables.Map(
        {
            s.step_id: StepState(step_id=s.step_id, index=i, state=s.state, attempt=s.attempt)
            for i, s in enumerate(seal.steps)
        }
    )
    return RunState(
        run_id=seal.run_id,
        seq=seal.seq,
        head=head,
        state=seal.state,
        kind=seal.kind,
        plan_digest=seal.plan_digest,
        adapters=seal.adapters,
        steps=steps,
        result=seal.result,
        reason=seal.reason,
        blocked_step=seal.blocked_step,
        resumes=seal.resumes,
        started_ts=seal.started_ts,
        updated_ts=seal.updated_ts,
    )


def sealed_view(state: RunState) -> RunState:
    """What a seal keeps of ``state``: everything but the plan, and per step its id, index, state, attempt."""
    steps = immutables.Map(
        {
            s.step_id: StepState(step_id=s.step_id, index=s.index, state=s.state, attempt=s.attempt)
            for s in state.steps.values()
        }
    )
    return msgspec.structs.replace(state, plan=None, plan_steps=frozenset(), steps=steps)
