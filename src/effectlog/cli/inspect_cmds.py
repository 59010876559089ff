"""Commands that read and never write: verify, head, diagram."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from effectlog.cli.output import emit_json
from effectlog.diagrams import render
from effectlog.errors import ExitStatus, IntegrityError, UnknownRun
from effectlog.integrity import check_orphan_seals, verify_run
from effectlog.journal import chain_from_env, load_run, open_journal
from effectlog.spec import MACHINES


def add_journal_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--journal", required=True, metavar="J", help="journal file path or postgresql:// URL")
    p.add_argument("--key-file", metavar="F", help="HMAC key for the chain (else EFFECTLOG_JOURNAL_KEY)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify", help="replay runs and check chain, sequence, transitions, every stored column and seals"
    )
    add_journal_args(p)
    p.add_argument("--run-id", metavar="R")
    p.add_argument("--expect-head", metavar="HEX", help="the chain head kept outside the database (needs --run-id)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_verify)

    p = sub.add_parser("head", help="print a run's chain head, to keep outside the database")
    add_journal_args(p)
    p.add_argument("--run-id", metavar="R", required=True)
    p.set_defaults(handler=cmd_head)

    p = sub.add_parser("diagram", help="print a state diagram generated from specs/")
    p.add_argument("machine", choices=MACHINES)
    p.add_argument("--format", choices=("mermaid", "dot"), default="mermaid")
    p.set_defaults(handler=cmd_diagram)


def cmd_diagram(args: argparse.Namespace) -> int:
    sys.stdout.write(render(args.machine, args.format))
    return 0


def cmd_head(args: argparse.Namespace) -> int:
    journal = open_journal(args.journal, writer=False, chain=chain_from_env(args.key_file))
    try:
        if args.run_id not in journal.runs():
            raise UnknownRun(f"no run {args.run_id!r} in {args.journal}")
        state = load_run(journal, args.run_id)
    finally:
        journal.close()
    sys.stdout.write(f"{state.run_id} {state.seq} {state.head.hex()}\n")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    if args.expect_head and not args.run_id:
        from effectlog.errors import BadInput

        raise BadInput("verify: --expect-head needs --run-id")
    journal = open_journal(args.journal, writer=False, chain=chain_from_env(args.key_file))
    report: list[dict[str, Any]] = []
    failure: IntegrityError | None = None
    try:
        runs = journal.runs()
        try:
            check_orphan_seals(journal, runs, args.run_id)
        except IntegrityError as exc:
            failure, runs = exc, []
        if args.run_id is not None and failure is None:
            if args.run_id not in runs:
                raise UnknownRun(f"no run {args.run_id!r} in {args.journal}")
            runs = [args.run_id]
        for run_id in runs:
            try:
                state = verify_run(journal, run_id)
            except IntegrityError as exc:
                failure = exc
                break
            if args.expect_head and state.head.hex() != args.expect_head.lower():
                failure = IntegrityError(
                    f"chain head is {state.head.hex()}, expected {args.expect_head}", run_id=run_id, seq=state.seq
                )
                break
            report.append({"run_id": run_id, "events": state.seq, "state": state.state, "head": state.head.hex()})
    finally:
        journal.close()
    if args.json:
        emit_json({"ok": failure is None, "runs": report, "error": failure.as_dict() if failure else None})
    elif failure is None:
        sys.stdout.write(f"ok: {len(report)} run(s), {sum(r['events'] for r in report)} event(s) verified\n")
    if failure is not None:
        sys.stderr.write(f"effectlog: {failure.code}: {failure}\n")
        return int(ExitStatus.INTEGRITY)
    return 0
