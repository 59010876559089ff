"""Where a session's steps are recorded: the run's journal, shared with the harness and the CLI.

A checkpointer is the run's journal, not a private store of the framework: the loop
appends its steps, and a person (``approve``, ``deny``, ``reconcile``) appends
decisions while the loop is not running. Any ``Journal`` backend works
(``JournalCheckpointer``); ``SqliteCheckpointer(path)`` is the default.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import msgspec

from effectlog import events as ev
from effectlog.chain import Chain
from effectlog.fold import RunState, StepState, replay_records
from effectlog.journal import Journal, chain_from_env, load_run, load_sealed, no_such_run
from effectlog.journal.ownership import Claim
from effectlog.journal.sqlite import SqliteJournal
from effectlog.recorder import Clock


class Timeline(msgspec.Struct, frozen=True, kw_only=True):
    """A run as recorded: its folded state and every event, in order."""

    run: RunState
    events: list[ev.AnyEvent]

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def state(self) -> str:
        return self.run.state

    @property
    def closed(self) -> bool:
        return self.run.closed

    @property
    def result(self) -> Any:
        return self.run.result

    @property
    def steps(self) -> list[StepState]:
        """Each step's recorded state, in the order the steps first appeared."""
        return self.run.ordered_steps()


@runtime_checkable
class Checkpointer(Protocol):
    """The journal of a session's runs, as a session needs it."""

    location: str

    def state(self, run_id: str) -> RunState:
        """The run replayed and verified (an empty state for a run never recorded)."""
        ...

    def append(self, events: Sequence[ev.Event]) -> None:
        """Append one atomic batch, durable when this returns."""
        ...

    def load(self, run_id: str) -> Timeline:
        """The run's timeline; ``UnknownRun`` when nothing was recorded."""
        ...

    def claim(self, run_id: str) -> Claim:
        """Own the run while a pass writes it (``Journal.claim``): ``RunOwned`` if another drives it."""
        ...

    def release(self, claim: Claim) -> None: ...

    def close(self) -> None: ...


class JournalCheckpointer:
    """A checkpointer over any ``Journal`` (SQLite, PostgreSQL, or yours)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.location = journal.location

    def state(self, run_id: str) -> RunState:
        load_sealed(self.journal, run_id)  # a sealed run whose tail was cut raises Truncated: nothing re-runs
        return load_run(self.journal, run_id)

    def append(self, events: Sequence[ev.Event]) -> None:
        self.journal.append(events)

    def claim(self, run_id: str) -> Claim:
        return self.journal.claim(run_id, "session")

    def release(self, claim: Claim) -> None:
        self.journal.release(claim)

    def load(self, run_id: str) -> Timeline:
        records = list(self.journal.read(run_id))
        if not records:
            raise no_such_run(self.journal, run_id, self.location)
        state = replay_records(records, self.journal.chain, run_id=run_id)
        return Timeline(run=state, events=[ev.decode(r.body) for r in records])

    # -- what the harness writes while the loop is not running (each only appends) ----------

    def approve(
        self,
        run_id: str,
        step_id: str,
        *,
        by: str,
        reason: str = "",
        expires_at: int | None = None,
        expect_digest: str | None = None,
        clock: Clock = time.time_ns,
    ) -> RunState:
        """Approve the held call at ``step_id``: bound to its tool call hash, used once.

        ``expect_digest``: the tool call hash the approver saw; another one raises ``DigestMismatch``.
        """
        from effectlog.approvals import approve

        return approve(
            self.journal,
            run_id,
            step_id,
            by=by,
            reason=reason,
            expires_at=expires_at,
            expect_digest=expect_digest,
            clock=clock,
        )

    def deny(self, run_id: str, step_id: str, *, by: str, reason: str = "", clock: Clock = time.time_ns) -> RunState:
        """A person's "no": final, the run fails."""
        from effectlog.approvals import deny

        return deny(self.journal, run_id, step_id, by=by, reason=reason, clock=clock)

    def reconcile(
        self,
        run_id: str,
        step_id: str,
        *,
        outcome: Literal["applied", "not_applied"],
        evidence: str,
        operator: str,
        clock: Clock = time.time_ns,
    ) -> RunState:
        """Resolve an uncertain tool step with evidence."""
        from effectlog.reconcile import reconcile

        return reconcile(
            self.journal, run_id, step_id, outcome=outcome, evidence=evidence, operator=operator, clock=clock
        )

    def close(self) -> None:
        self.journal.close()

    def __enter__(self) -> JournalCheckpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SqliteCheckpointer(JournalCheckpointer):
    """The default store: a SQLite journal file.

    A pass owns its run only while it writes it (``Session``): the CLI's ``approve``,
    ``deny`` and ``reconcile`` of a run no pass drives succeed while this store stays open.
    """

    def __init__(self, path: str | os.PathLike[str], *, chain: Chain | None = None) -> None:
        super().__init__(SqliteJournal(path, chain=chain if chain is not None else chain_from_env()))
