"""Commands that run plans and act on runs: run, status, timeline, reconcile, approve, deny, effects, schema."""

from __future__ import annotations

import argparse
import os
from typing import Any

import msgspec

from effectlog import spelling
from effectlog.cli.inspect_cmds import add_journal_args, add_json_arg, add_run_id_arg, add_step_arg, existing_journal
from effectlog.cli.notify_args import add_notify_args
from effectlog.cli.notify_args import hooks as notify_hooks
from effectlog.cli.output import emit_json, err, out, table, tools_write_to_stderr
from effectlog.cli.progress import add_progress_args, apply_progress_args, error_line
from effectlog.errors import BadInput
from effectlog.fold import RunState, replay_records
from effectlog.journal import chain_from_env, load_run, load_sealed, no_such_run, open_journal
from effectlog.journal.sidecars import refuse_shared
from effectlog.notify import marks, notify_new_waits
from effectlog.plan import MAX_ARGS_BYTES, MAX_PLAN_BYTES
from effectlog.summary import RUN_STATES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run (or resume) a plan durably")
    p.add_argument("plan", metavar="PLAN", help="plan JSON file (a regular file)")
    add_journal_args(p)
    p.add_argument("--effects", metavar="E", help="effect store file, for the effects.* adapters")
    p.add_argument(
        "--adapters",
        metavar="MODULE:ATTR",
        action="append",
        default=[],
        help="mapping of adapter type to factory, from your code (repeatable)",
    )
    p.add_argument("--trace", metavar="F", help="append a hash-chained JSON-lines trace to F")
    p.add_argument(
        "--max-args-bytes",
        metavar="N",
        type=_positive_int,
        default=MAX_ARGS_BYTES,
        help=f"largest canonical JSON of one step's args (default {MAX_ARGS_BYTES})",
    )
    p.add_argument(
        "--max-plan-bytes",
        metavar="N",
        type=_positive_int,
        default=MAX_PLAN_BYTES,
        help=f"largest plan file read (default {MAX_PLAN_BYTES}, 64 MiB)",
    )
    add_json_arg(p, "the run's outcome as one JSON object (tools' own stdout goes to stderr)")
    add_notify_args(p)
    add_progress_args(p)
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser("status", help="the state of every run (newest first), or of one")
    add_journal_args(p)
    add_run_id_arg(p, required=False, help="only this run")
    p.add_argument(
        "--state",
        metavar="S",
        action="append",
        default=[],
        choices=RUN_STATES,
        help=f"only runs in state S (repeatable; one of {', '.join(RUN_STATES)})",
    )
    p.add_argument("--limit", metavar="N", type=_positive_int, help="at most N runs (the newest)")
    add_json_arg(p, "as JSON: one object with --run-id, else a list")
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser("timeline", help="every event of one run, in order")
    add_journal_args(p)
    add_run_id_arg(p)
    add_json_arg(p, "the events as a JSON list")
    p.set_defaults(handler=cmd_timeline)

    p = sub.add_parser("reconcile", help="resolve an uncertain step with evidence (appends step.reconciled)")
    add_journal_args(p)
    add_run_id_arg(p)
    add_step_arg(p, "the uncertain step")
    p.add_argument("--outcome", choices=("applied", "not-applied"), help="what the evidence shows")
    p.add_argument("--evidence", metavar="TEXT", help="what you looked at (a ledger row, a statement)")
    p.add_argument("--operator", metavar="NAME", help="who decides (recorded)")
    p.add_argument(
        "--from-ledger", metavar="EFFECTS_DB", help="inspect the run's own effect store (read-only) instead of a person"
    )
    p.add_argument("--lookup", action="store_true", help="ask the step's own adapter (its lookup) instead of a person")
    p.add_argument(
        "--adapters",
        metavar="MODULE:ATTR",
        action="append",
        default=[],
        help="with --lookup: mapping of adapter type to factory, from your code (repeatable)",
    )
    p.add_argument("--effects", metavar="E", help="with --lookup: the run's effect store (default: the pinned path)")
    p.add_argument("--plan", metavar="PLAN", help="with --lookup: the run's plan file, for secret args' real values")
    p.add_argument(
        "--attempt",
        metavar="N",
        type=_positive_int,
        help="only if the uncertain attempt is N (as status shows it), the one your evidence is about; else exit 5",
    )
    add_json_arg(p, "the reconciled step as JSON")
    p.set_defaults(handler=cmd_reconcile)

    for name, helptext in (
        ("approve", "approve a held step (bound to its exact args)"),
        ("deny", "deny a held step (final: the run fails)"),
    ):
        p = sub.add_parser(name, help=helptext)
        add_journal_args(p)
        add_run_id_arg(p)
        add_step_arg(p, f"the held step to {name}")
        p.add_argument("--by", metavar="NAME", required=True, help="who decides (recorded)")
        p.add_argument("--reason", metavar="TEXT", default="", help="why (recorded)")
        if name == "approve":
            p.add_argument("--expires-in", metavar="SECONDS", type=float, help="the approval lapses after this")
            p.add_argument(
                "--expect-digest",
                metavar="D",
                help="approve only if the held call's args digest is D (shown by status/timeline); else exit 5",
            )
        p.add_argument(
            "--attempt",
            metavar="N",
            type=_positive_int,
            help=f"{name} only if the held call is attempt N (as status shows it), the one you looked at; else exit 5",
        )
        add_json_arg(p, "the decided step as JSON")
        p.set_defaults(handler=cmd_approve if name == "approve" else cmd_deny)

    p = sub.add_parser("effects", help="list the effect store's ledger")
    p.add_argument("--effects", metavar="E", required=True, help="effect store file")
    add_run_id_arg(p, required=False, help="only this run's effects")
    add_json_arg(p, "the ledger as a JSON list")
    p.set_defaults(handler=cmd_effects)

    p = sub.add_parser("schema", help="print a JSON Schema")
    p.add_argument("what", choices=("plan",), help="which schema: plan")
    p.set_defaults(handler=cmd_schema)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _writer(args: argparse.Namespace) -> Any:
    return open_journal(args.journal, writer=True, chain=chain_from_env(args.key_file))


def _existing_writer(args: argparse.Namespace) -> Any:
    """The journal of a command that acts on an existing run: it is never created here."""
    existing_journal(args.journal)
    return _writer(args)


def _reader(args: argparse.Namespace) -> Any:
    return open_journal(args.journal, writer=False, chain=chain_from_env(args.key_file))


def _state(journal: Any, run_id: str, location: str) -> RunState:
    if run_id not in journal.runs():
        raise no_such_run(journal, run_id, location, tagged=False)
    load_sealed(journal, run_id)  # as in the run list: a closed run's cut tail is Truncated, not a state
    return load_run(journal, run_id)


def cmd_run(args: argparse.Namespace) -> int:
    from effectlog.adapters.registry import Registry
    from effectlog.cli.signals import stop_on_signals
    from effectlog.plan import load_plan
    from effectlog.runtime import Runtime

    # Everything is checked before anything is created: plan, adapters, effect store, trace.
    plan = load_plan(args.plan, max_args_bytes=args.max_args_bytes, max_plan_bytes=args.max_plan_bytes)
    registry = Registry()
    for spec in args.adapters:
        registry.add_module(spec)
    check_adapters(plan, registry, args.plan, effects=args.effects)
    refuse_shared(
        [("--journal", args.journal, True), ("--effects", args.effects, True), ("--trace", args.trace, False)]
    )
    if args.effects is not None:
        check_effect_store(args.effects)
    if args.trace is not None:
        check_trace(args.trace)
    apply_progress_args(args)  # a line per step on stderr unless --quiet (docs/observability.md)
    notifiers = notify_hooks(args)
    journal = _writer(args)
    since = marks(journal, [plan.run_id]) if notifiers else {}
    runtime = Runtime(journal, adapters=registry, effects=args.effects, trace=args.trace)
    # SIGINT/SIGTERM: stop after the current step's commit (130/143). Tools' stdout goes to stderr.
    with runtime, stop_on_signals(runtime), tools_write_to_stderr():
        outcome = runtime.run(plan)
        notify_new_waits(notifiers, journal, args.journal, since)
    if args.json:
        emit_json(run_json(outcome, args.journal))
    else:
        rows = [(s.id, s.state, s.attempt) for s in outcome.steps]
        out(table(("step", "state", "attempt"), rows) + "\n")
        if outcome.exit_status == 0:
            out(f"{outcome.message}\n")
        else:
            err(error_line(outcome.message, logger="effectlog.run", exit_status=outcome.exit_status))
    return outcome.exit_status


def run_json(outcome: Any, journal: str) -> dict[str, Any]:
    """``run --json``: the outcome, and the command a stopped or suspended run needs next."""
    from effectlog.outcome import enc_hook, reconcile_hint
    from effectlog.stake import approve_command

    data: dict[str, Any] = msgspec.to_builtins(outcome, enc_hook=enc_hook)
    step = outcome.step_id
    stopped = outcome.state == "stopped" and step is not None
    suspended = outcome.state == "suspended" and step is not None
    attempt = next((s.attempt for s in outcome.steps if s.id == step), None) if stopped or suspended else None
    data["reconcile_command"] = reconcile_hint(journal, outcome.run_id, step, attempt) if stopped else None
    data["approve_command"] = approve_command(journal, outcome.run_id, step, attempt=attempt) if suspended else None
    return data


def check_adapters(plan: Any, registry: Any, origin: str, *, effects: str | None) -> None:
    """Every adapter type the plan names is registered (importing only those), and an effects.*
    adapter has its effect store."""
    from effectlog.errors import AdapterNotFound

    for name, decl in plan.adapters.items():
        if registry.factory(decl.type) is None:
            raise AdapterNotFound(f"{origin}: adapters.{name}: no adapter of type {decl.type!r} is registered")
        if decl.type.startswith("effects.") and effects is None:
            raise BadInput(f"{origin}: adapters.{name}: type {decl.type!r} needs an effect store: give --effects FILE")


def check_effect_store(path: str, flag: str = "--effects") -> None:
    """An effect store given by ``flag``: in an existing directory, and if the file exists, an
    effect store (a file of something else is refused, never given our tables)."""
    import sqlite3
    from pathlib import Path

    from effectlog.journal.sidecars import refuse_misleading

    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise BadInput(f"{flag} {path}: directory does not exist")
    refuse_misleading(path, "effect store")  # the read below is SQLite's, which would open another file
    if not os.path.exists(path):
        return
    if not os.path.isfile(path):
        raise BadInput(f"{flag} {path}: not a file")
    if os.path.getsize(path) == 0:
        return
    with open(path, "rb") as fh:
        header = fh.read(16)
    if header != b"SQLite format 3\x00":
        raise BadInput(f"{flag} {path}: not an effect store (not a SQLite file)")
    try:
        db = sqlite3.connect(Path(path).absolute().as_uri() + "?mode=ro", uri=True)
        try:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise BadInput(f"{flag} {path}: not a readable effect store ({exc})") from None
    if tables and "effects" not in tables:
        raise BadInput(f"{flag} {path}: a SQLite file of something else, not an effect store")


def check_trace(path: str) -> None:
    """``--trace``: a writable place, and if the file exists, a trace it can extend (read, never written).
    That it is none of the run's SQLite files (which may not exist yet) is ``refuse_shared``'s check."""
    from pathlib import Path

    from effectlog.trace import last_hash

    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise BadInput(f"--trace {path}: directory does not exist")
    if os.path.isdir(path):
        raise BadInput(f"--trace {path}: a directory, not a trace file")
    if os.path.exists(path):
        if not os.path.isfile(path):
            raise BadInput(f"--trace {path}: not a regular file")
        if not os.access(path, os.W_OK):
            raise BadInput(f"{path}: cannot open the trace file (Permission denied)")
        last_hash(Path(path))
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise BadInput(f"{path}: cannot open the trace file (Permission denied)")


def cmd_status(args: argparse.Namespace) -> int:
    from effectlog.cli.run_views import print_status_list, print_status_one
    from effectlog.summary import summaries

    if args.run_id and (args.state or args.limit):
        raise BadInput("status: --state and --limit list runs; do not combine them with --run-id")
    journal = _reader(args)
    try:
        if args.run_id:
            state = _state(journal, args.run_id, args.journal)  # one run: the full replay, every detail
            found = journal.owner(args.run_id)
        else:
            states = summaries(journal, journal.runs(), states=args.state, limit=args.limit)
            owners = {s.run_id: journal.owner(s.run_id) for s in states}
    finally:
        journal.close()
    if args.run_id:
        print_status_one(state, journal.location, args.json, found)
    else:
        print_status_list(states, journal.location, args.json, owners)
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    from effectlog.cli.run_views import print_timeline
    from effectlog.events import decode

    journal = _reader(args)
    try:
        if args.run_id not in journal.runs():
            raise no_such_run(journal, args.run_id, args.journal, tagged=False)
        records = list(journal.read(args.run_id))  # one snapshot: what is verified is what is printed
        state = replay_records(records, journal.chain, run_id=args.run_id)
        events = [decode(r.body) for r in records]
        found = journal.owner(args.run_id)
    finally:
        journal.close()
    print_timeline(state, events, journal.location, args.json, found)
    return 0


def cmd_reconcile(args: argparse.Namespace) -> int:
    from effectlog.reconcile import reconcile, reconcile_by_lookup, reconcile_from_ledger

    automated = [flag for flag, given in (("--from-ledger", args.from_ledger), ("--lookup", args.lookup)) if given]
    if len(automated) > 1:
        raise BadInput("reconcile: give --from-ledger or --lookup, not both")
    if automated:
        if args.outcome or args.evidence:
            raise BadInput(f"reconcile: {automated[0]} decides the outcome; do not also give --outcome/--evidence")
        if args.from_ledger:
            if not os.path.isfile(args.from_ledger):
                raise BadInput(f"--from-ledger {args.from_ledger}: no effect store there")
            check_effect_store(args.from_ledger, flag="--from-ledger")
    elif not (args.outcome and args.evidence and args.operator):
        empty = [flag for flag, given in (("--evidence", args.evidence), ("--operator", args.operator)) if given == ""]
        if empty and args.outcome:
            raise BadInput(
                f"reconcile: {' and '.join(empty)} given empty: say what the outcome rests on and who decided"
            )
        raise BadInput(
            "reconcile: give --outcome, --evidence and --operator (or --lookup, or --from-ledger EFFECTS_DB)"
        )
    if (args.adapters or args.effects or args.plan) and not args.lookup:
        raise BadInput("reconcile: --adapters, --effects and --plan go with --lookup")
    registry, plan = None, None
    if args.lookup:
        from effectlog.adapters.registry import Registry
        from effectlog.plan import load_plan

        registry = Registry()
        for spec in args.adapters:
            registry.add_module(spec)
        if args.effects is not None and not os.path.isfile(args.effects):
            raise BadInput(f"--effects {args.effects}: no effect store there")
        plan = load_plan(args.plan) if args.plan else None
    journal = _existing_writer(args)
    try:
        if args.from_ledger:
            state = reconcile_from_ledger(journal, args.run_id, args.step, args.from_ledger, attempt=args.attempt)
        elif registry is not None:
            state = reconcile_by_lookup(
                journal, args.run_id, args.step, registry, effects=args.effects, plan=plan, attempt=args.attempt
            )
        else:
            state = reconcile(
                journal,
                args.run_id,
                args.step,
                outcome=args.outcome.replace("-", "_"),
                evidence=args.evidence,
                operator=args.operator,
                about=args.attempt,
            )
    finally:
        journal.close()
    step = state.step(args.step)
    assert step is not None
    if args.json:
        emit_json(_step_json(state, args.step))
    else:
        out(f"step {args.step} reconciled: {step.outcome} (by {step.operator}); resume the run to continue\n")
    return 0


def _step_json(state: RunState, step_id: str) -> dict[str, Any]:
    """What approve, deny and reconcile report with --json: the run and the step they decided."""
    step = state.step(step_id)
    assert step is not None
    return {
        "run_id": state.run_id,
        "run_state": state.state,
        "events": state.seq,
        "step": {
            "id": step.step_id,
            "state": step.state,
            "attempt": step.attempt,
            "outcome": step.outcome,
            "operator": step.operator,
            "reason": step.reason,
        },
    }


def cmd_approve(args: argparse.Namespace) -> int:
    import math
    import time

    from effectlog.approvals import approve

    expires = None
    if args.expires_in is not None:
        nanoseconds = args.expires_in * 1e9
        # nan passes a "<= 0" check, and inf (or a number whose nanoseconds overflow to it) has no int
        if not (math.isfinite(nanoseconds) and nanoseconds > 0):
            raise BadInput(f"--expires-in {args.expires_in}: must be positive and finite (seconds)")
        expires = time.time_ns() + int(nanoseconds)
    journal = _existing_writer(args)
    try:
        state = approve(
            journal,
            args.run_id,
            args.step,
            by=args.by,
            reason=args.reason,
            expires_at=expires,
            expect_digest=args.expect_digest,
            attempt=args.attempt,
        )
    finally:
        journal.close()
    if args.json:
        emit_json(_step_json(state, args.step))
        return 0
    out(f"step {args.step} approved by {args.by}; resume the run to execute it once\n")
    return 0


def cmd_deny(args: argparse.Namespace) -> int:
    from effectlog.approvals import deny

    journal = _existing_writer(args)
    try:
        state = deny(journal, args.run_id, args.step, by=args.by, reason=args.reason, attempt=args.attempt)
    finally:
        journal.close()
    if args.json:
        emit_json(_step_json(state, args.step))
        return 0
    out(f"step {args.step} denied by {args.by}; the run has failed\n")
    return 0


def cmd_effects(args: argparse.Namespace) -> int:
    from effectlog.adapters.effects import EffectStore

    if not os.path.isfile(args.effects):
        raise BadInput(f"--effects {args.effects}: no effect store there")
    store = EffectStore(args.effects, read_only=True)  # a reader: never writes, refuses a non-store
    try:
        rows = store.rows(run_id=args.run_id)
        others = store.run_ids() if args.run_id is not None and not rows else []
    finally:
        store.close()
    if others:
        _no_effects_of(args.run_id, args.effects, others)
    if args.json:
        emit_json(rows)
        return 0
    out(
        table(
            ("effect", "kind", "run", "step", "attempt", "key"),
            [(r.effect_id, r.kind, r.run_id, r.step_id, r.attempt, r.idempotency_key[:16]) for r in rows],
        )
        + "\n"
    )
    return 0


def _no_effects_of(run_id: str, location: str, others: list[str]) -> None:
    """An empty ledger for ``--run-id`` while the store holds other runs' effects: a run with no effect
    yet, or a mistyped id. The same id in another Unicode spelling is refused (exit 2); otherwise stderr
    says how many runs the store does hold, so an empty table is not read as "nothing happened"."""
    other = spelling.twin(run_id, others)
    if other is not None:
        raise BadInput(
            f"--run-id {run_id!a}: no effects of that run in {location}, but {other!a} has some, the same id "
            "in another Unicode spelling: give it as that run has it (copy it from effectlog status)"
        )
    err(
        f"effectlog: no effects of run {run_id!r} in {location}; it holds effects of {len(others)} other "
        f"run(s) (a run with no effect yet, or a mistyped --run-id; effectlog status lists the runs)\n"
    )


def cmd_schema(args: argparse.Namespace) -> int:
    from effectlog.cli.output import emit_json
    from effectlog.plan import Plan

    emit_json(msgspec.json.schema(Plan))
    return 0
