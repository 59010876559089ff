"""Fleet commands: submit, runner, operator, recovery, requests.

``--store`` is a file path (a SQLite fleet store: runner processes on one host) or a
``postgresql://`` URL (runners on many hosts). The runs' journal lives in the same
store, so ``effectlog status|timeline|reconcile --journal STORE`` work on it too.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from effectlog.cli.notify_args import add_notify_args
from effectlog.cli.output import emit_json, out, table, tools_write_to_stderr
from effectlog.cli.progress import add_runner_args, runner_log
from effectlog.cli.run_cmds import _positive_int
from effectlog.errors import BadInput
from effectlog.fleet import FleetStore, limits, open_store
from effectlog.fleet.decisions import operate
from effectlog.fleet.model import RequestView
from effectlog.journal import chain_from_env
from effectlog.observe import requests_gauge


def _request_id(text: str) -> int:
    """A request id as the stores hold it (a signed 64-bit INTEGER / bigint): a larger number reached the
    driver, which raised OverflowError (a traceback, exit 1) instead of naming the argument."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not -(2**63) <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{text} is not a request id (too large)")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("submit", help="create a durable execution request (idempotent by --scope and --key)")
    p.add_argument("plan", metavar="PLAN", help="plan JSON file")
    _store_args(p)
    p.add_argument("--scope", required=True, metavar="S", help="namespace of the idempotency key")
    p.add_argument("--key", required=True, metavar="K", help="idempotency key, unique within the scope")
    p.add_argument("--requires", default="", metavar="CAP,...", help="capabilities a runner must declare")
    p.add_argument(
        "--max-requeues",
        type=int,
        default=limits.DEFAULT_MAX_REQUEUES,
        metavar="N",
        help="automatic requeues of attempts lost before any step; past N it needs an operator "
        f"(default {limits.DEFAULT_MAX_REQUEUES})",
    )
    p.add_argument(
        "--requeue-backoff-s",
        type=float,
        default=limits.DEFAULT_REQUEUE_BACKOFF_S,
        metavar="S",
        help="wait before the first automatic requeue is claimed, doubled for each next one "
        f"(default {limits.DEFAULT_REQUEUE_BACKOFF_S:g})",
    )
    p.add_argument("--json", action="store_true", help="the request as JSON, with created true or false")
    p.set_defaults(handler=cmd_submit)

    p = sub.add_parser("runner", help="pull requests from a store and run them (the store never calls a runner)")
    _store_args(p)
    p.add_argument("--capabilities", default="", metavar="A,B", help="what this runner offers")
    p.add_argument("--capacity", type=int, default=1, metavar="N", help="attempts run at once")
    p.add_argument("--runner-id", default="", metavar="ID", help="default: host:pid")
    p.add_argument("--lease-s", type=float, default=30.0, metavar="S", help="lease duration (default 30)")
    p.add_argument("--heartbeat-s", type=float, metavar="S", help="heartbeat interval (default: lease / 3)")
    p.add_argument("--poll-s", type=float, default=0.5, metavar="S", help="pause between idle polls")
    p.add_argument("--effects", metavar="E", help="effect store file, for the effects.* adapters")
    p.add_argument("--adapters", metavar="MODULE:ATTR", action="append", default=[], help="adapter factories")
    p.add_argument(
        "--secrets",
        metavar="MODULE:ATTR",
        help="secrets provider for plans' secret args (default: EFFECTLOG_SECRET_<NAME> in this runner's environment)",
    )
    p.add_argument("--max-attempts", type=int, metavar="N", help="exit after N attempts have ended")
    p.add_argument("--exit-when-idle", action="store_true", help="exit when nothing it can take is queued")
    p.add_argument("--no-recovery", action="store_true", help="do not run recovery passes (run `effectlog recovery`)")
    p.add_argument("--json", action="store_true", help="log as newline-delimited JSON on stdout, one object per event")
    # Test hooks: stop at a point once, say so on a pipe, block (or wait for a byte on --resume-fd).
    p.add_argument("--arm", metavar="POINT", help="test hook: stop once at POINT (needs --notify-fd)")
    p.add_argument("--notify-fd", type=int, metavar="FD", help="test hook: report the point reached on FD")
    p.add_argument("--resume-fd", type=int, metavar="FD", help="test hook: go on when a byte arrives on FD")
    add_notify_args(p)
    add_runner_args(p)
    p.set_defaults(handler=cmd_runner)

    p = sub.add_parser("operator", help="decide a request that needs an operator (audited)")
    p.add_argument("action", choices=("requeue", "fail", "cancel"), help="the decision")
    _store_args(p)
    p.add_argument("--request", type=_request_id, required=True, metavar="ID", help="the request to decide")
    p.add_argument("--reason", required=True, metavar="TEXT", help="why (recorded)")
    p.add_argument("--by", required=True, metavar="NAME", help="who decides (recorded)")
    p.add_argument(
        "--attempt",
        metavar="N",
        type=_positive_int,
        help="only if the request is at attempt N (as requests shows it), the one you looked at; else exit 5",
    )
    p.add_argument("--json", action="store_true", help="the request after the decision, as JSON")
    p.set_defaults(handler=cmd_operator)

    p = sub.add_parser("recovery", help="run the recovery service: decide what each expired lease means")
    _store_args(p)
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between passes")
    p.set_defaults(handler=cmd_recovery)

    p = sub.add_parser("requests", help="execution requests, or one request's attempts and history")
    _store_args(p)
    p.add_argument("--request", type=_request_id, metavar="ID", help="one request, with its attempts and history")
    p.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(handler=cmd_requests)


def _store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", required=True, metavar="URL", help="fleet store: file path or postgresql:// URL")
    p.add_argument("--key-file", metavar="F", help="HMAC key for the journal chain (else EFFECTLOG_JOURNAL_KEY)")


def _open(args: argparse.Namespace, *, create: bool = True) -> FleetStore:
    """``create=False`` for the commands about requests already there (``requests``, ``operator``): a
    mistyped ``--store`` made an empty store, which ``requests`` listed as an empty queue (exit 0), and a
    plain journal named as the store was given the fleet's tables. ``submit``, ``runner`` and ``recovery``
    create the store (the first of them to start may come before any other)."""
    return open_store(args.store, chain=chain_from_env(args.key_file), create=create)


def _caps(text: str) -> list[str]:
    return [c.strip() for c in text.split(",") if c.strip()]


def _show(view: RequestView) -> str:
    text = f"request {view.request_id} ({view.scope}/{view.key}, run {view.run_id}): {view.state}"
    if view.requeues:
        text += f", automatic requeues {view.requeues} of {view.max_requeues}"
    return text


def cmd_submit(args: argparse.Namespace) -> int:
    from effectlog.plan import load_plan

    plan = load_plan(args.plan)  # validate before touching the store
    limits.count("--max-requeues", args.max_requeues, low=0, high=limits.MAX_REQUEUES)
    limits.seconds("--requeue-backoff-s", args.requeue_backoff_s, high=limits.MAX_BACKOFF_S, zero=True)
    store = _open(args)
    try:
        done = store.submit(
            args.scope,
            args.key,
            plan,
            _caps(args.requires),
            max_requeues=args.max_requeues,
            requeue_backoff_s=args.requeue_backoff_s,
        )
    finally:
        store.close()
    if args.json:
        emit_json({"created": done.created, "request": done.request})
    else:
        out(f"{_show(done.request)}{'' if done.created else ' (already submitted)'}\n")
    return 0


def cmd_runner(args: argparse.Namespace) -> int:
    from effectlog.fleet.runner import RunnerConfig, run_runner

    if (args.arm is None) != (args.notify_fd is None):
        raise BadInput("--arm and --notify-fd go together")
    if args.effects is not None:
        from effectlog.cli.run_cmds import check_effect_store
        from effectlog.journal.sidecars import refuse_shared

        # As `run` does, before anything: found by each attempt instead, after its claim, a mistyped
        # path sent every request of the queue in turn to needs_operator (or failed).
        refuse_shared([("--store", args.store, True), ("--effects", args.effects, True)])
        check_effect_store(args.effects)
    config = RunnerConfig(
        store=args.store,
        capabilities=frozenset(_caps(args.capabilities)),
        capacity=args.capacity,
        runner_id=args.runner_id,
        lease_s=args.lease_s,
        heartbeat_s=args.heartbeat_s,
        poll_s=args.poll_s,
        effects=args.effects,
        adapters=tuple(args.adapters),
        secrets=args.secrets,
        max_attempts=args.max_attempts,
        exit_when_idle=args.exit_when_idle,
        recover=not args.no_recovery,
        arm=args.arm,
        notify_fd=args.notify_fd,
        resume_fd=args.resume_fd,
        notify_command=args.notify_command,
        notify_url=args.notify_url,
    )
    chain = chain_from_env(args.key_file)
    with tools_write_to_stderr() as stdout:  # tools' own stdout never mixes with the --json events
        return run_runner(
            config,
            lambda location: open_store(location, chain=chain, pool_size=args.capacity + 2),
            log=runner_log(args, stdout),  # --json, --quiet, --log-format json
        )


def cmd_operator(args: argparse.Namespace) -> int:
    store = _open(args, create=False)
    try:
        view = operate(store, args.request, args.action, by=args.by, reason=args.reason, attempt=args.attempt)
    finally:
        store.close()
    if args.json:
        emit_json(view)
    else:
        out(f"{_show(view)} (attempt {view.attempt_no}); recorded: {args.action} by {args.by}\n")
    return 0


def cmd_recovery(args: argparse.Namespace) -> int:
    from effectlog.fleet.recovery import recover_once

    limits.seconds("--interval", args.interval, high=limits.MAX_POLL_S)
    store = _open(args)
    try:
        with requests_gauge(store):  # the recovery service reports requests by state too (docs/observability.md)
            while True:
                for done in recover_once(store):
                    out(f"request {done.request_id} attempt {done.attempt_no}: {done.state}: {done.reason}\n")
                    sys.stdout.flush()
                if args.once:
                    return 0
                time.sleep(args.interval)
    finally:
        store.close()


def cmd_requests(args: argparse.Namespace) -> int:
    store = _open(args, create=False)
    try:
        if args.request is None:
            views = store.requests()
            if args.json:
                emit_json(views)
            else:
                listed = [
                    (v.request_id, v.scope, v.key, v.run_id, v.state, v.attempt_no, f"{v.requeues}/{v.max_requeues}")
                    for v in views
                ]
                header = ("request", "scope", "key", "run", "state", "attempt", "requeues")
                out(table(header, listed) + "\n")
            return 0
        view = store.request(args.request)
        attempts = store.attempts(args.request)
        history = store.history(args.request)
    finally:
        store.close()
    if args.json:
        emit_json({"request": view, "attempts": attempts, "history": history})
        return 0
    out(_show(view) + "\n")
    rows: list[Any] = [(a.attempt_no, a.state, a.runner_id or "", a.token or "") for a in attempts]
    out(table(("attempt", "state", "runner", "token"), rows) + "\n")
    by_id: dict[int, Any] = {a.attempt_id: a.attempt_no for a in attempts}
    rows = [
        (by_id.get(h.attempt_id, "?"), h.transition, f"{h.from_state} -> {h.to_state}", h.actor, h.actor_name, h.reason)
        for h in history
    ]
    out(table(("attempt", "transition", "states", "actor", "by", "reason"), rows) + "\n")
    return 0
