"""Every error effectlog raises, under one base class.

Each error carries a stable ``code`` (for logs and JSON output), the CLI exit
status it maps to, and structured fields (run id, step id, seq) so callers never
parse messages. ``str(error)`` is one line that names what is wrong and where.
"""

from __future__ import annotations

import asyncio
from enum import IntEnum
from typing import Any, ClassVar


class ExitStatus(IntEnum):
    """CLI exit statuses. Fixed: scripts depend on them (documented in README)."""

    DONE = 0
    RUN_FAILED = 1
    BAD_INPUT = 2
    STOPPED_UNCERTAIN = 3
    SUSPENDED = 4
    CONFLICT = 5
    LOCKED = 6
    INTEGRITY = 7
    # Stopped by a signal after the current step's durable commit; the run is resumable.
    INTERRUPTED = 130  # SIGINT (128 + 2), as shells report it
    TERMINATED = 143  # SIGTERM (128 + 15)


class EffectlogError(Exception):
    """Base of every effectlog error."""

    code: ClassVar[str] = "error"
    exit_status: ClassVar[ExitStatus] = ExitStatus.BAD_INPUT

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        step_id: str | None = None,
        seq: int | None = None,
        **fields: Any,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.run_id = run_id
        self.step_id = step_id
        self.seq = seq
        self.fields = fields

    def where(self) -> str:
        parts = []
        if self.run_id is not None:
            parts.append(f"run {self.run_id!r}")
        if self.seq is not None:
            parts.append(f"seq {self.seq}")
        if self.step_id is not None:
            parts.append(f"step {self.step_id!r}")
        return ", ".join(parts)

    def __str__(self) -> str:
        where = self.where()
        text = f"{where}: {self.message}" if where else self.message
        return " ".join(text.split())  # always one line

    def as_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "run_id": self.run_id,
            "step_id": self.step_id,
            "seq": self.seq,
            **{k: v for k, v in self.fields.items() if isinstance(v, str | int | float | bool | None)},
        }


# -- bad input (exit 2) -------------------------------------------------------


class BadInput(EffectlogError):
    """A plan, argument, file or value that cannot be used as given."""

    code = "bad_input"


class SpecError(BadInput):
    """A machine spec in specs/ is malformed or inconsistent."""

    code = "bad_spec"


class PlanError(BadInput):
    """A plan file failed validation; the message starts with the JSON path."""

    code = "bad_plan"


class UnknownRun(BadInput):
    code = "unknown_run"


class UnknownStep(BadInput):
    code = "unknown_step"


class NotReconcilable(BadInput):
    """Reconcile/approve/deny asked of a step that is not in the state that allows it."""

    code = "wrong_state"


class JournalUnreadable(BadInput):
    """The journal file is not an effectlog journal (not SQLite, wrong schema, too new)."""

    code = "journal_unreadable"


class WrongKey(JournalUnreadable):
    """A keyed journal opened with another key than its own (its recorded key fingerprint, or its last
    event's chain link, says so): refused before anything is read or written (exit 2)."""

    code = "wrong_key"


class AdapterNotFound(BadInput):
    code = "adapter_not_found"


# -- machines and fold --------------------------------------------------------


class IntegrityError(EffectlogError):
    """The recorded history does not hold together (exit 7)."""

    code = "integrity"
    exit_status = ExitStatus.INTEGRITY


class IllegalTransition(IntegrityError):
    """A trigger or event that the spec does not allow from the current state."""

    code = "illegal_transition"


class SequenceGap(IntegrityError):
    code = "sequence_gap"


class ChainBroken(IntegrityError):
    """A stored hash does not match the hash recomputed over the stored bytes."""

    code = "chain_broken"


class CorruptEvent(IntegrityError):
    code = "corrupt_event"


class JournalDamaged(IntegrityError):
    """The journal file itself is damaged (SQLite reports a malformed database image)."""

    code = "journal_damaged"


# -- conflicts (exit 5) -------------------------------------------------------


class Conflict(EffectlogError):
    code = "conflict"
    exit_status = ExitStatus.CONFLICT


class EventConflict(Conflict):
    """An event with the same identity but different bytes is already in the journal."""

    code = "event_conflict"


class PlanMismatch(Conflict):
    """A run id reused with another plan or another adapter identity."""

    code = "plan_mismatch"


class IdempotencyConflict(Conflict):
    """An idempotency key reused with a different request body."""

    code = "idempotency_conflict"


class StaleLease(Conflict):
    """A runner's write carried a lease (attempt, runner, fencing token) that is no longer current."""

    code = "stale_lease"


class ReplayDivergence(Conflict):
    """On resume, the step at a position differs from the one the journal recorded."""

    code = "replay_divergence"


# -- storage ------------------------------------------------------------------


class JournalLocked(EffectlogError):
    """Another process holds the journal's writer lock (exit 6)."""

    code = "journal_locked"
    exit_status = ExitStatus.LOCKED


class RunOwned(JournalLocked):
    """A live owner (another process, another actor, a runner's lease) drives this run (exit 6).

    ``owner`` names it (pid and host, or runner id); nothing was written.
    """

    code = "run_owned"


class JournalAliased(JournalLocked):
    """The journal file has another name (a hard link): SQLite would keep a second WAL beside it (exit 6)."""

    code = "journal_aliased"


class StorageError(EffectlogError):
    """A backend failure translated at the boundary (disk full, read-only, I/O)."""

    code = "storage"
    exit_status = ExitStatus.BAD_INPUT


# -- run outcomes that stop a run --------------------------------------------


class UncertainEffect(EffectlogError):
    """A non-idempotent step was requested and its outcome is unknown: we stop, never guess."""

    code = "uncertain_effect"
    exit_status = ExitStatus.STOPPED_UNCERTAIN


class ApprovalRequired(EffectlogError):
    code = "approval_required"
    exit_status = ExitStatus.SUSPENDED


class RunFailed(EffectlogError):
    code = "run_failed"
    exit_status = ExitStatus.RUN_FAILED


class ToolDenied(EffectlogError):
    """A policy denied a tool call before it ran: a known outcome of the step, never an uncertain one."""

    code = "tool_denied"
    exit_status = ExitStatus.RUN_FAILED


class RunBound(Conflict):
    """The run belongs to a fleet request: it is written only under that request's lease (exit 5)."""

    code = "run_bound"


class RunClosed(Conflict):
    """A new step or a different result asked of a closed run: a closed run never reopens."""

    code = "run_closed"


# -- signals from adapters ----------------------------------------------------


class NotApplied(Exception):
    """Raised by an adapter to say the effect was definitely NOT applied.

    Anything else an adapter raises (or a timeout, or a crash) means "outcome unknown".
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- branch fleetops (issues 12.7, 13.12) ---------------------------------------------


class SecretUnavailable(BadInput):
    """A fleet runner cannot supply a secret arg (the store keeps only its digest), or its value is another one."""

    code = "secret_unavailable"


# -- branch `evidence` (issue 12): evidence sources a run pins -----------------


class LedgerMismatch(Conflict):
    """An effect store that is not the one the run pinned (another store id): its answer is no evidence."""

    code = "ledger_mismatch"


class LedgerBehind(Conflict):
    """An effect store older than the journal: a copy of the run's store beside it, or one that lacks the
    effect of a step the journal recorded as done through it (restored from a backup). A row's absence
    there is no evidence that an effect did not happen (exit 5)."""

    code = "ledger_behind"


class LookupUndecided(EffectlogError):
    """An adapter's ``lookup`` cannot tell whether the effect exists: the step stays uncertain (exit 3)."""

    code = "lookup_undecided"
    exit_status = ExitStatus.STOPPED_UNCERTAIN


# -- branch `tools` (issue 13): tools that misbehave, inputs that hurt -----------------


class ToolAborted(Exception):
    """A tool ended its call with something other than a return or an ``Exception``
    (``sys.exit``, ``KeyboardInterrupt``, a bare ``BaseException``): its outcome is unknown."""

    def __init__(self, reason: str, *, interrupted: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.interrupted = interrupted  # a KeyboardInterrupt: stop instead of re-sending


class UnusableResult(Exception):
    """A tool returned a value the journal cannot record: the effect may have happened, its result is lost."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class MissingDependency(BadInput):
    """An optional dependency (psycopg for ``postgresql://``) is not installed."""

    code = "missing_dependency"


# -- branch visibility (issue 12 items 4-6, 8; issue 13 item 17) ---------------


class Truncated(IntegrityError):
    """A run's seal names a last event the journal no longer ends with: the tail was cut (or edited)."""

    code = "truncated"


class DigestMismatch(Conflict):
    """``approve --expect-digest D``: the held call's args digest is not the one the approver saw."""

    code = "digest_mismatch"


# -- branch durabletool (issue 14.1) -------------------------------------------------


class NotInRun(BadInput):
    """A durable tool called outside a ``durable.run`` block (or a run used outside its block)."""

    code = "not_in_run"


class RunUnfinished(Conflict):
    """A run asked to complete while one of its steps has no recorded outcome (exit 5)."""

    code = "run_unfinished"


# -- branch lifecycle (issue 17) --------------------------------------------------------


class ForkRefused(Conflict):
    """A fork or retry that could repeat or guess an effect: an open parent, an uncertain or unknown step (exit 5)."""

    code = "fork_refused"


class RepinRefused(Conflict):
    """A repin while a step's outcome is open, or one that would change more than implementations (exit 5)."""

    code = "repin_refused"


# -- branch lifecycle2 (issue 17 items 4-6) ----------------------------------------------


class DeadlinePassed(RunFailed):
    """A step or run deadline passed before the step began: the step failed by contract, nothing ran (exit 1)."""

    code = "deadline_passed"


class ModelUnavailable(EffectlogError):
    """A model call kept failing (429, 5xx, no connection) past its retry limit.

    The step's intent stays in the journal: the run is open, and a later pass sends the
    same request again with the same idempotency key. Exit 130, as for an interrupted run.
    """

    code = "model_unavailable"
    exit_status = ExitStatus.INTERRUPTED


class ModelRefused(EffectlogError):
    """The provider refused a model request for good (400, 401, 404...): another try would not help (exit 2).

    The step's intent stays in the journal (the run is open): fix the cause, run it again.
    """

    code = "model_refused"


# -- branch attack4 (round-4 attacks) ------------------------------------------------


class JournalInherited(JournalLocked):
    """A journal opened before ``fork()``, used in the child (the child shares the parent's open file
    description and run locks), or a SQLite file the parent had open at the fork, opened in the child
    (SQLite's lock records came with the fork): exit 6."""

    code = "journal_inherited"


class EvidenceStale(Conflict):
    """Evidence gathered about one attempt of a step that moved on while it was gathered (exit 5):
    recorded on the step as it is now, it would decide an attempt it says nothing about."""

    code = "evidence_stale"


class StoreAliased(JournalLocked):
    """The effect store's file has another name (a hard link): SQLite keeps its WAL beside the name it
    is opened by, so effects committed under the other name would be missed (exit 6)."""

    code = "store_aliased"


class JournalWalLost(JournalLocked):
    """The WAL this process writes the journal through was removed or replaced by another process: this
    process's SQLite locks on the file were dropped (something in it closed a descriptor of the file), so
    its later commits would be lost; nothing more is written by it (exit 6)."""

    code = "journal_wal_lost"


class JournalRemoved(JournalLocked):
    """The journal file lost its name while this process had it open (removed, or another file renamed
    over it): its history is saved (put back at the name where nothing is there, else beside it, the
    message says where) and nothing more is written by this process (exit 6)."""

    code = "journal_removed"


class DescriptorsClosed(JournalLocked):
    """A tool closed descriptors of this process that effectlog's open files use (``os.closerange``, as
    daemonising helpers do): SQLite's connections can no longer be trusted (their descriptor numbers
    may name other files by now), so nothing more is written or closed through them by this process
    (exit 6); the next run finds the step as the journal left it."""

    code = "descriptors_closed"


# -- branch leftovers (round-4 leftovers) ----------------------------------------------


class StoreRemoved(JournalLocked):
    """The effect store file lost its name while this process had it open (removed, or another file renamed
    over it): its effects are saved (put back at the name where nothing is there, else beside it, the
    message says where); the effect is not committed and nothing more is written by it (exit 6)."""

    code = "store_removed"


class StoreWalLost(JournalLocked):
    """The WAL this process writes the effect store through was removed or replaced by another process:
    this process's SQLite locks on the store file were dropped (something in it closed a descriptor of
    the file), so its later effects would be lost and their keys applied again; the effect is not
    committed and nothing more is written by it (exit 6)."""

    code = "store_wal_lost"


# -- branch attack6 (round-6 attacks) ------------------------------------------------


class SidecarClash(BadInput):
    """A journal, fleet store or effect store named as another SQLite file's WAL, shared-memory index or
    rollback journal (its name + ``-wal``, ``-shm``, ``-journal``), or one whose sidecar name holds a
    database of its own: SQLite would overwrite or delete one with the other's commits (exit 2, nothing
    written)."""

    code = "sidecar_clash"


# -- branch attack7 (round-7 attacks) ------------------------------------------------


class TraceUnwritable(BadInput):
    """The ``--trace`` file could not take the next record (a full disk, a file size limit): the run stops
    after the journal commit the record was for, resumable, and the file is cut back to its last whole
    record so that the same ``--trace`` can extend it (exit 2)."""

    code = "trace_unwritable"


class OutputUnwritable(BadInput):
    """The command's own output could not be written to stdout (a full disk, an I/O error): what it did is
    done (a run's commits stand), but its output is lost, so it does not exit 0 (exit 2). A reader that went
    away (``| head -1``) is not this: that output was not wanted, and the command's status stays."""

    code = "output_unwritable"


class DecisionStale(Conflict):
    """An approval or denial made on a page that showed one attempt of a held step, posted after the
    step was held again at a later attempt with the same args (exit 5, nothing written): the later
    attempt follows an uncertain send and is a call nobody has looked at. Also a decision (approve, deny,
    reconcile) that lost a race: the run was written after it read the step (another person's decision,
    a resume), so it is about a step that is not as it was seen (``operator.append``)."""

    code = "decision_stale"


# -- branch attack10 (round-10 attacks) ----------------------------------------------


class NotARegularFile(BadInput):
    """A journal, fleet store or effect store path naming a device, FIFO or socket (``/dev/null``, a
    symlink to it): SQLite would open it and make its ``-journal`` beside it before failing (exit 2,
    nothing written)."""

    code = "not_a_file"


class FileBindMounted(JournalAliased, StoreAliased):
    """A journal, fleet store or effect store file that is a mount point of its own (a bind mount of the
    file, as ``docker run -v /srv/j.db:/data/j.db`` makes): SQLite keeps the WAL in the directory of the
    name it opens, so the file would have one WAL per place it is mounted, and commits left in one (a
    killed process) would be missing under the others (exit 6, nothing written). A second name of the file,
    so both ``JournalAliased`` and (for an effect store) ``StoreAliased``."""

    code = "file_bind_mounted"


class LocationAmbiguous(BadInput):
    """A journal or store location that is a PostgreSQL connection string in ``keyword=value`` form
    (``host=db dbname=effectlog``), which was taken for the name of a SQLite file in the working
    directory: hosts meant to share one database each wrote a file of their own; or one written as a URL
    or a SQLite URI (``file:j.db``, ``sqlite:///j.db``), which was a file of that name, a second journal
    beside ``j.db`` for the same run; or a new file's name that is not the one meant (edge whitespace or an
    invisible character, another Unicode spelling of a file there: ``journal.sidecars.new_name_refusal``)
    (exit 2, nothing written)."""

    code = "location_ambiguous"


class RunIdAmbiguous(BadInput):
    """A new durable or session run whose id no operator could tell from another's: it begins or ends with
    whitespace, holds a control or invisible character (``order-42\\n``, a zero-width space: no command can
    name it), or is another Unicode spelling of a run already in the journal (``café`` composed against
    decomposed), so the program run again under the other spelling sent every step again in a second run
    (exit 2, nothing written; ``effectlog.spelling``). A run already recorded under such an id resumes."""

    code = "run_id_ambiguous"


# -- branch attack11 (round-11 attacks) ----------------------------------------------


def printable(text: object) -> str:
    """Text a tool or a user's hook handed us (an exception's message, a ``NotApplied`` reason, a lookup's
    detail) as text the journal can record: a ``str()`` that raises is named instead of ending the run with
    a traceback, a str subclass becomes a plain str, and lone surrogates (``os.fsdecode`` of a file name
    that is not UTF-8) become ``\\udcff`` escapes, which UTF-8 can hold."""
    try:
        plain = str.__str__(text) if isinstance(text, str) else str(text)
    except Exception as exc:  # a user's __str__ may raise anything
        return f"<its str() raised {type(exc).__name__}>"
    if not isinstance(plain, str):  # a __str__ returning a subclass's object passes str() as is
        plain = str.__str__(plain)
    return plain if plain.isascii() else plain.encode("utf-8", "backslashreplace").decode("utf-8")


def describe(exc: BaseException) -> str:
    """``Type: message`` of a tool's exception, ``printable``."""
    return f"{type(exc).__name__}: {printable(exc)}"


def tool_ending(exc: BaseException) -> str:
    """How a tool's call ended with a ``BaseException`` instead of an answer (an outcome unknown), said the
    same by the plan runtime and by sessions."""
    if isinstance(exc, KeyboardInterrupt):
        return "the tool was interrupted (KeyboardInterrupt)"
    if isinstance(exc, asyncio.CancelledError):
        return "the tool's call was cancelled (CancelledError)"
    if isinstance(exc, SystemExit):
        return f"the tool called sys.exit({exc.code!r})"
    return f"the tool raised {describe(exc)}"


# -- a timed-out call still running in this process -------------------------------------------


class CallStillRunning(RunOwned):
    """A call of this run timed out (its outcome unknown) and is still running in this process: until it
    ends, what any ledger or lookup says of it may change, so nothing about the run is decided and the
    run stays claimed (exit 6; nothing written)."""

    code = "call_still_running"


# -- branch attack14 (round-14 attacks on the fleet) -----------------------------------------


class RequestServedTwice(IntegrityError):
    """Two runs of one journal name the same fleet request in their ``run.started`` (exit 7). A request
    owns one run: a second one means its steps were started again under a new run id (the request's row
    re-pointed by hand, a restore script), so each run verifying on its own no longer says the request's
    effects happened once."""

    code = "request_served_twice"


# -- branch attack16 (round-16 attacks: descriptors closed under SQLite's locks) ----------------------


class FileInUse(BadInput):
    """A plan or trace path naming a file this process has open as a journal, fleet store or effect store
    (exit 2, nothing read or written): reading it would open and close a descriptor of the file, and the
    close drops every POSIX lock the process holds on it, SQLite's included."""

    code = "file_in_use"


# -- branch attack17 (round-17 attacks on storage and ownership) ----------------------------------------


class LocationMisleads(BadInput):
    """A journal, fleet store or effect store path whose text, resolved as SQLite resolves it, names
    another file than the one the kernel reaches by it: ``/proc/PID/root/...``, ``/proc/PID/cwd/...`` or
    ``/proc/PID/fd/N`` of a process in another mount namespace (a container's), whose link text is a
    path of this namespace. The file of that text would be used, or made, instead (exit 2, nothing
    written)."""

    code = "location_misleads"
