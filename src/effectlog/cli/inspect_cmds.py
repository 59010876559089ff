"""Commands that read and never write: verify, head, diagram."""

from __future__ import annotations

import argparse
import os
import re
from typing import Any

import msgspec

from effectlog.cli.output import emit_json, err, out
from effectlog.diagrams import render
from effectlog.errors import ExitStatus, IntegrityError, JournalUnreadable
from effectlog.integrity import check_orphan_seals, check_requests, verify_run
from effectlog.journal import chain_from_env, load_run, no_such_run, open_journal
from effectlog.journal.sidecars import is_postgres
from effectlog.spec import MACHINES


def add_journal_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--journal", required=True, metavar="J", help="journal file path or postgresql:// URL")
    p.add_argument("--key-file", metavar="F", help="HMAC key for the chain (else EFFECTLOG_JOURNAL_KEY)")


def run_or_step_id(text: str) -> str:
    """argparse type of --run-id and --step: an id as plans define it, or any id a durable or session run
    may have (``onboard/42``, ``order 42``, ``café``: their printed commands name them), the whole string.
    Refused: the empty string, control characters (a pasted trailing newline) and surrounding whitespace,
    which no command effectlog prints holds unescaped."""
    from effectlog.spelling import NAMEABLE, nameable

    if not nameable(text):
        shown = repr(text) if len(text) <= 64 else f"{text[:32]!r}... ({len(text)} characters)"
        raise argparse.ArgumentTypeError(
            f"{shown} is not a valid id (a plan's: letters, digits, . _ : @ -; a durable run's: {NAMEABLE})"
        )
    return text


def add_run_id_arg(p: argparse.ArgumentParser, *, required: bool = True, help: str = "the run") -> None:
    p.add_argument("--run-id", metavar="R", required=required, type=run_or_step_id, help=help)


def step_json(text: str) -> str:
    """argparse type of --step-json: a step named as a JSON string literal (``"order 42\\n"``), for a
    session's step key that ``--step`` cannot take (surrounding spaces, a tab, a newline, an invisible
    character: a model's tool-call id may hold any); the printed commands use it for such a step."""
    try:
        value = msgspec.json.decode(text.encode())
    except (msgspec.DecodeError, UnicodeError):
        value = None
    if not isinstance(value, str) or value == "":
        shown = repr(text) if len(text) <= 64 else f"{text[:32]!r}... ({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"{shown} is not a JSON string naming a step (as in '\"order 42\\n\"')")
    return value


def add_step_arg(p: argparse.ArgumentParser, help: str) -> None:
    named = p.add_mutually_exclusive_group(required=True)
    named.add_argument("--step", metavar="S", type=run_or_step_id, help=help)
    named.add_argument(
        "--step-json",
        metavar="JSON",
        dest="step",
        type=step_json,
        help="the step as a JSON string, for a step key --step cannot take (spaces around it, a newline)",
    )


def add_json_arg(p: argparse.ArgumentParser, help: str) -> None:
    p.add_argument("--json", action="store_true", help=help)


def existing_journal(location: str) -> None:
    """Refuse a journal file that does not exist, for commands that act on an existing run
    (approve, deny, reconcile): a mistyped --journal must not create an empty journal."""
    if is_postgres(location):
        return
    if not os.path.isfile(location):
        raise JournalUnreadable(f"--journal {location}: no journal file there")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify", help="replay runs and check chain, sequence, transitions, every stored column and seals"
    )
    add_journal_args(p)
    add_run_id_arg(p, required=False, help="only this run")
    p.add_argument(
        "--expect-head",
        metavar="HEX",
        help="the chain head kept outside the database: its hex, or the line 'head' prints (needs --run-id)",
    )
    add_json_arg(p, "the report as one JSON object")
    p.set_defaults(handler=cmd_verify)

    p = sub.add_parser("head", help="print a run's chain head, to keep outside the database")
    add_journal_args(p)
    add_run_id_arg(p)
    add_json_arg(p, "the head as JSON: run_id, seq, head")
    p.set_defaults(handler=cmd_head)

    p = sub.add_parser("diagram", help="print a state diagram generated from specs/")
    p.add_argument("machine", choices=MACHINES, help="which machine: " + ", ".join(MACHINES))
    p.add_argument("--format", choices=("mermaid", "dot"), default="mermaid", help="diagram language")
    p.set_defaults(handler=cmd_diagram)


def cmd_diagram(args: argparse.Namespace) -> int:
    out(render(args.machine, args.format))
    return 0


def cmd_head(args: argparse.Namespace) -> int:
    journal = open_journal(args.journal, writer=False, chain=chain_from_env(args.key_file))
    try:
        if args.run_id not in journal.runs():
            raise no_such_run(journal, args.run_id, args.journal, tagged=False)
        state = load_run(journal, args.run_id)
    finally:
        journal.close()
    if args.json:
        emit_json({"run_id": state.run_id, "seq": state.seq, "head": state.head.hex()})
    else:
        out(f"{state.run_id} {state.seq} {state.head.hex()}\n")
    return 0


_HEX_HEAD = re.compile(r"[0-9a-f]{64}")


def kept_head(text: str, run_id: str) -> tuple[int | None, str]:
    """``--expect-head``: the chain head's hex (``head --json``'s ``head``), or the line ``head`` prints,
    ``RUN SEQ HEX``, of run ``run_id``; as (the seq, or None, and the lower-case hex).

    Anything else is bad input: it was compared as it stood, so ``head``'s own line, or a value
    that is no head (``zz``), was an integrity failure (exit 7) of an untouched run, and an empty
    value (``--expect-head "$HEAD"``, ``HEAD`` unset) turned the check off and said ``ok``."""
    from effectlog.errors import BadInput

    fields = text.split()
    seq: int | None = None
    if len(fields) == 3:
        if fields[0] != run_id:
            raise BadInput(f"--expect-head {text!r}: a head of run {fields[0]!r}, not of --run-id {run_id!r}")
        if not (fields[1].isascii() and fields[1].isdigit()):
            raise BadInput(f"--expect-head {text!r}: {fields[1]!r} is not a seq (give the line 'head' prints)")
        seq = int(fields[1])
        fields = fields[2:]
    if len(fields) != 1 or not _HEX_HEAD.fullmatch(fields[0].lower()):
        raise BadInput(f"--expect-head {text!r}: not a chain head (64 hex digits, or the line 'effectlog head' prints)")
    return seq, fields[0].lower()


def cmd_verify(args: argparse.Namespace) -> int:
    if args.expect_head is not None and not args.run_id:
        from effectlog.errors import BadInput

        raise BadInput("verify: --expect-head needs --run-id")
    expected = kept_head(args.expect_head, args.run_id) if args.expect_head is not None else None
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
                raise no_such_run(journal, args.run_id, args.journal, tagged=False)
            runs = [args.run_id]
        for run_id in runs:
            try:
                state = verify_run(journal, run_id)
            except IntegrityError as exc:
                failure = exc
                break
            if expected is not None and (state.head.hex() != expected[1] or expected[0] not in (None, state.seq)):
                failure = IntegrityError(
                    f"chain head is {state.seq} {state.head.hex()}, expected {args.expect_head}",
                    run_id=run_id,
                    seq=state.seq,
                )
                break
            report.append({"run_id": run_id, "events": state.seq, "state": state.state, "head": state.head.hex()})
        if failure is None and args.run_id is None:
            try:
                check_requests(journal, runs)
            except IntegrityError as exc:
                failure = exc
    finally:
        journal.close()
    if args.json:
        emit_json({"ok": failure is None, "runs": report, "error": failure.as_dict() if failure else None})
    elif failure is None:
        out(f"ok: {len(report)} run(s), {sum(r['events'] for r in report)} event(s) verified\n")
    if failure is not None:
        err(f"effectlog: {failure.code}: {failure}\n")
        return int(ExitStatus.INTEGRITY)
    return 0
