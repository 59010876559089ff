"""Commands that run plans and act on runs: run, status, timeline, reconcile, approve, deny, effects, schema."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import msgspec

from effectlog.cli.inspect_cmds import add_journal_args
from effectlog.cli.output import emit_json, table
from effectlog.errors import BadInput, UnknownRun
from effectlog.fold import RunState, replay_records
from effectlog.journal import chain_from_env, load_run, load_sealed, open_journal
from effectlog.plan import MAX_ARGS_BYTES
from effectlog.summary import RUN_STATES


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help="run (or resume) a plan durably")
    p.add_argument("plan", metavar="PLAN", help="plan JSON file")
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
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser("status", help="the state of every run (newest first), or of one")
    add_journal_args(p)
    p.add_argument("--run-id", metavar="R")
    p.add_argument(
        "--state",
        metavar="S",
        action="append",
        default=[],
        choices=RUN_STATES,
        help=f"only runs in state S (repeatable; one of {', '.join(RUN_STATES)})",
    )
    p.add_argument("--limit", metavar="N", type=_positive_int, help="at most N runs (the newest)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser("timeline", help="every event of one run, in order")
    add_journal_args(p)
    p.add_argument("--run-id", metavar="R", required=True)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_timeline)

    p = sub.add_parser("reconcile", help="resolve an uncertain step with evidence (appends step.reconciled)")
    add_journal_args(p)
    p.add_argument("--run-id", metavar="R", required=True)
    p.add_argument("--step", metavar="S", required=True)
    p.add_argument("--outcome", choices=("applied", "not-applied"))
    p.add_argument("--evidence", metavar="TEXT")
    p.add_argument("--operator", metavar="NAME")
    p.add_argument("--from-ledger", metavar="EFFECTS_DB", help="inspect the effect store instead of a person")
    p.set_defaults(handler=cmd_reconcile)

    for name, helptext in (
        ("approve", "approve a held step (bound to its exact args)"),
        ("deny", "deny a held step (final: the run fails)"),
    ):
        p = sub.add_parser(name, help=helptext)
        add_journal_args(p)
        p.add_argument("--run-id", metavar="R", required=True)
        p.add_argument("--step", metavar="S", required=True)
        p.add_argument("--by", metavar="NAME", required=True)
        p.add_argument("--reason", metavar="TEXT", default="")
        if name == "approve":
            p.add_argument("--expires-in", metavar="SECONDS", type=float, help="the approval lapses after this")
            p.add_argument(
                "--expect-digest",
                metavar="D",
                help="approve only if the held call's args digest is D (shown by status/timeline); else exit 5",
            )
        p.set_defaults(handler=cmd_approve if name == "approve" else cmd_deny)

    p = sub.add_parser("effects", help="list the effect store's ledger")
    p.add_argument("--effects", metavar="E", required=True)
    p.add_argument("--run-id", metavar="R")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_effects)

    p = sub.add_parser("schema", help="print a JSON Schema")
    p.add_argument("what", choices=("plan",))
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


def _reader(args: argparse.Namespace) -> Any:
    return open_journal(args.journal, writer=False, chain=chain_from_env(args.key_file))


def _state(journal: Any, run_id: str, location: str) -> RunState:
    if run_id not in journal.runs():
        raise UnknownRun(f"no run {run_id!r} in {location}")
    load_sealed(journal, run_id)  # as in the run list: a closed run's cut tail is Truncated, not a state
    return load_run(journal, run_id)


def cmd_run(args: argparse.Namespace) -> int:
    from effectlog.adapters.registry import Registry
    from effectlog.cli.signals import stop_on_signals
    from effectlog.errors import AdapterNotFound
    from effectlog.plan import load_plan
    from effectlog.runtime import Runtime

    plan = load_plan(args.plan, max_args_bytes=args.max_args_bytes)  # validate before touching the journal
    registry = Registry()
    for spec in args.adapters:
        registry.add_module(spec)
    for name, decl in plan.adapters.items():
        if decl.type not in registry.factories:
            raise AdapterNotFound(f"{args.plan}: adapters.{name}: no adapter of type {decl.type!r} is registered")
    for flag, path in (("--effects", args.effects), ("--trace", args.trace)):
        if path is not None and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            raise BadInput(f"{flag} {path}: directory does not exist")
    runtime = Runtime(_writer(args), adapters=registry, effects=args.effects, trace=args.trace)
    with runtime, stop_on_signals(runtime):  # SIGINT/SIGTERM: stop after the current step's commit (130/143)
        outcome = runtime.run(plan)
    if args.json:
        emit_json(outcome)
    else:
        rows = [(s.id, s.state, s.attempt) for s in outcome.steps]
        sys.stdout.write(table(("step", "state", "attempt"), rows) + "\n")
        stream = sys.stdout if outcome.exit_status == 0 else sys.stderr
        stream.write(f"{outcome.message}\n")
    return outcome.exit_status


def cmd_status(args: argparse.Namespace) -> int:
    from effectlog.cli.run_views import print_status_list, print_status_one
    from effectlog.summary import summaries

    if args.run_id and (args.state or args.limit):
        raise BadInput("status: --state and --limit list runs; do not combine them with --run-id")
    journal = _reader(args)
    try:
        if args.run_id:
            state = _state(journal, args.run_id, args.journal)  # one run: the full replay, every detail
        else:
            states = summaries(journal, journal.runs(), states=args.state, limit=args.limit)
    finally:
        journal.close()
    if args.run_id:
        print_status_one(state, journal.location, args.json)
    else:
        print_status_list(states, journal.location, args.json)
    return 0


def cmd_timeline(args: argparse.Namespace) -> int:
    from effectlog.cli.run_views import print_timeline
    from effectlog.events import decode

    journal = _reader(args)
    try:
        if args.run_id not in journal.runs():
            raise UnknownRun(f"no run {args.run_id!r} in {args.journal}")
        records = list(journal.read(args.run_id))  # one snapshot: what is verified is what is printed
        state = replay_records(records, journal.chain, run_id=args.run_id)
        events = [decode(r.body) for r in records]
    finally:
        journal.close()
    print_timeline(state, events, journal.location, args.json)
    return 0


def cmd_reconcile(args: argparse.Namespace) -> int:
    from effectlog.adapters.effects import EffectStore
    from effectlog.reconcile import reconcile, reconcile_from_lookup

    if args.from_ledger:
        if args.outcome or args.evidence:
            raise BadInput("reconcile: --from-ledger decides the outcome; do not also give --outcome/--evidence")
        if not os.path.isfile(args.from_ledger):
            raise BadInput(f"--from-ledger {args.from_ledger}: no effect store there")
    elif not (args.outcome and args.evidence and args.operator):
        raise BadInput("reconcile: give --outcome, --evidence and --operator (or --from-ledger EFFECTS_DB)")
    journal = _writer(args)
    try:
        if args.from_ledger:
            store = EffectStore(args.from_ledger)
            try:
                state = reconcile_from_lookup(journal, args.run_id, args.step, store)
            finally:
                store.close()
        else:
            state = reconcile(
                journal,
                args.run_id,
                args.step,
                outcome=args.outcome.replace("-", "_"),
                evidence=args.evidence,
                operator=args.operator,
            )
    finally:
        journal.close()
    step = state.step(args.step)
    assert step is not None
    sys.stdout.write(f"step {args.step} reconciled: {step.outcome} (by {step.operator}); resume the run to continue\n")
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    import time

    from effectlog.approvals import approve

    expires = None
    if args.expires_in is not None:
        if args.expires_in <= 0:
            raise BadInput("--expires-in must be positive")
        expires = time.time_ns() + int(args.expires_in * 1e9)
    journal = _writer(args)
    try:
        approve(
            journal,
            args.run_id,
            args.step,
            by=args.by,
            reason=args.reason,
            expires_at=expires,
            expect_digest=args.expect_digest,
        )
    finally:
        journal.close()
    sys.stdout.write(f"step {args.step} approved by {args.by}; resume the run to execute it once\n")
    return 0


def cmd_deny(args: argparse.Namespace) -> int:
    from effectlog.approvals import deny

    journal = _writer(args)
    try:
        deny(journal, args.run_id, args.step, by=args.by, reason=args.reason)
    finally:
        journal.close()
    sys.stdout.write(f"step {args.step} denied by {args.by}; the run has failed\n")
    return 0


def cmd_effects(args: argparse.Namespace) -> int:
    from effectlog.adapters.effects import EffectStore

    if not os.path.isfile(args.effects):
        raise BadInput(f"--effects {args.effects}: no effect store there")
    store = EffectStore(args.effects)
    try:
        rows = store.rows(run_id=args.run_id)
    finally:
        store.close()
    if args.json:
        emit_json(rows)
        return 0
    sys.stdout.write(
        table(
            ("effect", "kind", "run", "step", "attempt", "key"),
            [(r.effect_id, r.kind, r.run_id, r.step_id, r.attempt, r.idempotency_key[:16]) for r in rows],
        )
        + "\n"
    )
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from effectlog.cli.output import emit_json
    from effectlog.plan import Plan

    emit_json(msgspec.json.schema(Plan))
    return 0
