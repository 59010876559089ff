"""Commands for the life of a run after things go wrong: recover, fork, retry, repin, lineage (docs/lifecycle.md)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import msgspec

from effectlog.cli.inspect_cmds import add_journal_args
from effectlog.cli.notify_args import add_notify_args
from effectlog.cli.notify_args import hooks as notify_hooks
from effectlog.cli.output import emit_json, out, table, tools_write_to_stderr
from effectlog.cli.progress import add_progress_args, apply_progress_args, error_line
from effectlog.errors import BadInput
from effectlog.journal.sidecars import is_postgres, refuse_shared
from effectlog.notify import marks, notify_new_waits


def _add_runtime_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--effects", metavar="E", help="effect store file, for the effects.* adapters")
    p.add_argument(
        "--adapters",
        metavar="MODULE:ATTR",
        action="append",
        default=[],
        help="mapping of adapter type to factory, from your code (repeatable)",
    )


def _add_secrets_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--secrets",
        metavar="MODULE:ATTR",
        help="provider of the values of secret args, which the journal keeps only as digests "
        "(default: EFFECTLOG_SECRET_<NAME> in the environment)",
    )


def _add_audit_args(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--by", metavar="NAME", required=True, help=f"who {what} (recorded)")
    p.add_argument("--reason", metavar="TEXT", required=True, help="why, for the audit record (recorded)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("recover", help="resume every interrupted run nobody drives, from the plan its journal pinned")
    add_journal_args(p)
    _add_runtime_args(p)
    _add_secrets_arg(p)
    p.add_argument("--json", action="store_true", help="one JSON object per run, in a list")
    add_notify_args(p)
    add_progress_args(p)
    p.set_defaults(handler=cmd_recover)

    for name, helptext in (
        ("fork", "start a new run carrying a closed run's results before a step, and run the rest"),
        ("retry", "fork a closed run from its first unfinished step (the one it failed on)"),
    ):
        p = sub.add_parser(name, help=helptext)
        add_journal_args(p)
        p.add_argument("--run-id", metavar="R", required=True, help="the closed run to fork")
        p.add_argument(
            "--new-run-id",
            metavar="R2",
            required=name == "fork",
            help="the new run's id" + (" (default: R.retryN, the first free N)" if name == "retry" else ""),
        )
        if name == "fork":
            p.add_argument(
                "--from-step",
                metavar="S",
                help="the first step to run again; earlier steps carry R's results (default: R's first unfinished)",
            )
        _add_audit_args(p, "forks it")
        _add_runtime_args(p)
        _add_secrets_arg(p)
        p.add_argument("--json", action="store_true", help="print the new run's outcome as JSON")
        add_progress_args(p)
        p.set_defaults(handler=cmd_fork if name == "fork" else cmd_retry)

    p = sub.add_parser("repin", help="accept upgraded adapter implementations for an open run (audited)")
    add_journal_args(p)
    p.add_argument("--run-id", metavar="R", required=True, help="the open run to repin")
    _add_audit_args(p, "accepts the new implementations")
    _add_runtime_args(p)
    p.add_argument("--plan", metavar="PLAN", help="the plan file, checked to be exactly the pinned plan")
    p.add_argument("--json", action="store_true", help="print what was accepted as JSON")
    p.set_defaults(handler=cmd_repin)

    p = sub.add_parser("lineage", help="a run's parent and the runs forked from it")
    add_journal_args(p)
    p.add_argument("--run-id", metavar="R", required=True, help="the run to show")
    p.add_argument("--json", action="store_true", help="print the lineage as JSON")
    p.set_defaults(handler=cmd_lineage)


def _runtime(args: argparse.Namespace) -> Any:
    from effectlog.adapters.registry import Registry
    from effectlog.journal import chain_from_env, open_journal
    from effectlog.runtime import Runtime

    registry = Registry()
    for spec in getattr(args, "adapters", []):
        registry.add_module(spec)
    effects = getattr(args, "effects", None)
    refuse_shared([("--journal", args.journal, True), ("--effects", effects, True)])
    if effects is not None and not os.path.isdir(os.path.dirname(os.path.abspath(effects))):
        raise BadInput(f"--effects {effects}: directory does not exist")
    if not is_postgres(args.journal) and not os.path.exists(args.journal):
        raise BadInput(f"--journal {args.journal}: no such journal (nothing to recover, fork or repin)")
    journal = open_journal(args.journal, writer=True, chain=chain_from_env(args.key_file))
    return Runtime(journal, adapters=registry, effects=effects)


def _secrets(args: argparse.Namespace) -> Any:
    from effectlog.adapters.registry import load_object

    if not getattr(args, "secrets", None):
        return None
    provider = load_object(args.secrets)
    if not callable(provider):
        raise BadInput(f"--secrets {args.secrets}: expected a callable")
    return provider


def cmd_recover(args: argparse.Namespace) -> int:
    from effectlog.cli.signals import stop_on_signals

    secrets = _secrets(args)
    runtime = _runtime(args)
    notifiers = notify_hooks(args)
    apply_progress_args(args)  # a line per step on stderr unless --quiet, once the input is checked
    # Tools' stdout goes to stderr, as for `run`: --json is effectlog's alone.
    with runtime, stop_on_signals(runtime), tools_write_to_stderr():
        since = marks(runtime.journal, runtime.journal.runs()) if notifiers else {}
        report = runtime.recover(secrets=secrets)
        notify_new_waits(notifiers, runtime.journal, args.journal, since)
    if args.json:
        emit_json(report)
    elif report:
        rows = [(r.run_id, r.action, r.state, r.message) for r in report]
        out(table(("run", "action", "state", "detail"), rows) + "\n")
    else:
        out("no open run waits for recovery\n")
    if runtime.stop_signal is not None:  # stopped by SIGINT/SIGTERM after the runs' last commits: resumable
        return 128 + int(runtime.stop_signal)
    refused = [r for r in report if r.action == "refused"]
    return refused[0].exit_status if refused else 0


def _emit_outcome(args: argparse.Namespace, outcome: Any) -> int:
    if args.json:
        emit_json(outcome)
    else:
        rows = [(s.id, s.state, s.attempt) for s in outcome.steps]
        out(table(("step", "state", "attempt"), rows) + "\n")
        if outcome.exit_status == 0:
            out(f"{outcome.message}\n")
        else:
            sys.stderr.write(error_line(outcome.message, logger="effectlog.run", exit_status=outcome.exit_status))
    return int(outcome.exit_status)


def cmd_fork(args: argparse.Namespace) -> int:
    from effectlog.cli.signals import stop_on_signals

    secrets = _secrets(args)
    runtime = _runtime(args)
    apply_progress_args(args)
    with runtime, stop_on_signals(runtime), tools_write_to_stderr():
        outcome = runtime.fork(
            args.run_id, args.new_run_id, by=args.by, reason=args.reason, from_step=args.from_step, secrets=secrets
        )
    return _emit_outcome(args, outcome)


def cmd_retry(args: argparse.Namespace) -> int:
    from effectlog.cli.signals import stop_on_signals

    secrets = _secrets(args)
    runtime = _runtime(args)
    apply_progress_args(args)
    with runtime, stop_on_signals(runtime), tools_write_to_stderr():
        outcome = runtime.retry(
            args.run_id, new_run_id=args.new_run_id, by=args.by, reason=args.reason, secrets=secrets
        )
    return _emit_outcome(args, outcome)


def cmd_repin(args: argparse.Namespace) -> int:
    from effectlog.plan import load_plan

    plan = load_plan(args.plan) if args.plan else None
    runtime = _runtime(args)
    with runtime:
        done = runtime.repin(args.run_id, by=args.by, reason=args.reason, plan=plan)
    if args.json:
        emit_json(done)
    elif done.changed:
        rows = [(name, old[:12], new[:12]) for name, (old, new) in sorted(done.changed.items())]
        out(table(("adapter", "pinned", "accepted"), rows) + "\n")
        out(f"run {done.run_id} repinned ({done.state}); resume it to continue\n")
    else:
        out(f"run {done.run_id}: every adapter is the pinned one; nothing to repin, nothing written\n")
    return 0


def cmd_lineage(args: argparse.Namespace) -> int:
    from effectlog import events as ev
    from effectlog.errors import CorruptEvent
    from effectlog.journal import chain_from_env, no_such_run, open_journal
    from effectlog.lifecycle import forks_of

    journal = open_journal(args.journal, writer=False, chain=chain_from_env(args.key_file))
    try:
        first = next(iter(journal.read(args.run_id)), None)
        if first is None:
            raise no_such_run(journal, args.run_id, args.journal)
        try:
            started = ev.decode(first.body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:  # lineage reads, it does not verify
            raise CorruptEvent(f"event does not decode: {exc}", run_id=args.run_id, seq=first.seq) from None
        parent = started.forked_from if isinstance(started, ev.RunStarted) else ""
        from_step = started.from_step if isinstance(started, ev.RunStarted) else ""
        children = forks_of(journal, args.run_id)
    finally:
        journal.close()
    if args.json:
        emit_json(
            {
                "run_id": args.run_id,
                "forked_from": parent or None,
                "from_step": from_step or None,
                "forks": [msgspec.to_builtins(c) for c in children],
            }
        )
        return 0
    if parent:
        out(f"run {args.run_id} was forked from {parent} at step {from_step}\n")
    rows = [(c.run_id, c.from_step, c.by, c.reason) for c in children]
    if rows:
        out(table(("fork", "from step", "by", "reason"), rows) + "\n")
    elif not parent:
        out(f"run {args.run_id}: no parent, no forks\n")
    return 0
