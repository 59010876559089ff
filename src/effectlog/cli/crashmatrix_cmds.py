"""``effectlog crash-matrix run|verify|soak`` (and the hidden ``worker`` they start)."""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from pathlib import Path
from typing import Any

from effectlog.cli.output import err, out
from effectlog.cli.progress import add_line_args, error_line, line_sink
from effectlog.errors import BadInput, ExitStatus
from effectlog.journal.sidecars import is_postgres, masked


def register(sub: Any) -> None:
    cm = sub.add_parser("crash-matrix", help="kill real workers at every boundary and count effects")
    cms = cm.add_subparsers(dest="cm_command", metavar="ACTION", parser_class=type(cm))
    cms.required = True

    p = cms.add_parser("run", help="run the matrix and write a report")
    p.add_argument("--output", metavar="F", required=True, help="report JSON to write")
    p.add_argument("--jobs", metavar="N", type=int, default=1, help="cases in parallel (separate files)")
    p.add_argument(
        "--backend",
        action="append",
        choices=("sqlite", "postgres"),
        default=None,
        help="journal backend(s) to run every case against (default: sqlite)",
    )
    p.add_argument(
        "--postgres-url",
        metavar="URL",
        help="postgresql:// URL for --backend postgres (default: start a throwaway local cluster)",
    )
    p.add_argument("--adapter", metavar="MODULE:FACTORY", help="run the matrix against your own adapter")
    p.add_argument("--ledger", metavar="MODULE:COUNTER", help="counter(run_id, step_id) -> effects in your ledger")
    p.add_argument(
        "--args",
        metavar="JSON",
        help='with --adapter: the step\'s args, a JSON object (default {"amount_cents": 1250, "to": "acct-42"})',
    )
    p.add_argument(
        "--not-idempotent",
        action="store_true",
        help="with --adapter: your adapter is not idempotent; crashes are reconciled through its lookup",
    )
    p.add_argument("--workdir", metavar="DIR", help="where case files go (default: a temporary directory)")
    add_line_args(p)
    p.set_defaults(handler=cmd_run)

    p = cms.add_parser("verify", help="recompute every expectation of a report from its evidence")
    p.add_argument("report", metavar="F", help="report JSON written by crash-matrix run")
    p.set_defaults(handler=cmd_verify)

    p = cms.add_parser("soak", help="SIGKILL a worker at random moments until its runs complete")
    p.add_argument("--kills", metavar="N", type=int, default=50, help="SIGKILLs to deliver (default 50)")
    p.add_argument("--seed", metavar="S", type=int, default=1, help="random seed of the kill moments")
    p.add_argument("--steps", metavar="K", type=int, default=12, help="steps per run")
    p.add_argument("--output", metavar="F", help="soak report JSON")
    p.add_argument("--workdir", metavar="DIR", help="where run files go (default: a temporary directory)")
    add_line_args(p)
    p.set_defaults(handler=cmd_soak)

    # Internal: the process the matrix starts and kills. Not listed (no help= on the parser).
    p = cms.add_parser("worker", description="internal: one crash-matrix worker process")
    p.add_argument("--plan", required=True, help="plan JSON file")
    p.add_argument("--journal", help="journal file path or postgresql:// URL")
    p.add_argument("--effects", help="effect store file")
    p.add_argument("--arm", help="the boundary to stop at and report")
    p.add_argument("--notify-fd", type=int, help="pipe to report the boundary reached on")
    p.add_argument("--blind", help="run blind (no journal) against this effect store")
    p.add_argument("--user-adapter", help="MODULE:FACTORY of the adapter under test")
    p.add_argument("--adapters", action="append", default=[], help="MODULE:ATTR of more adapters (repeatable)")
    p.set_defaults(handler=cmd_worker)


def _workdir(arg: str | None) -> Path:
    if arg:
        path = Path(arg)
        path.mkdir(parents=True, exist_ok=True)
        return path
    return Path(tempfile.mkdtemp(prefix="effectlog-crash-matrix-"))


def cmd_run(args: argparse.Namespace) -> int:
    from effectlog.crashmatrix.report import render_table, save_report, verify
    from effectlog.crashmatrix.runner import Target, run_matrix

    if args.jobs < 1:
        raise BadInput("--jobs must be at least 1")
    if args.adapter and not args.ledger:
        raise BadInput("crash-matrix run: --adapter needs --ledger MODULE:COUNTER")
    if (args.args is not None or args.not_idempotent) and not args.adapter:
        raise BadInput("crash-matrix run: --args and --not-idempotent go with --adapter MODULE:FACTORY")
    step_args = _step_args(args.args) if args.args is not None else None
    backends = args.backend or ["sqlite"]
    if args.postgres_url is not None and not is_postgres(args.postgres_url):
        # Refused now: each case's workers would fail to open it, one case after another.
        raise BadInput(
            f"crash-matrix run: --postgres-url {masked(args.postgres_url)!r}: not a postgresql:// URL "
            "(write a keyword=value connection string as postgresql://USER@HOST:PORT/DBNAME)"
        )
    report_path = Path(args.output)
    report_path.parent.mkdir(parents=True, exist_ok=True)

    progress = line_sink(args, "effectlog.crashmatrix")  # --quiet, --log-format json

    with contextlib.ExitStack() as stack:
        url = args.postgres_url
        if "postgres" in backends and not url:
            from effectlog.pgcluster import ClusterUnavailable, PgCluster

            cluster = PgCluster(durable=True)
            try:
                cluster.start()
            except ClusterUnavailable as exc:
                raise BadInput(f"crash-matrix: --backend postgres: {exc}") from None
            stack.callback(cluster.stop)
            url = cluster.create_database()
            progress(f"started a throwaway PostgreSQL cluster on 127.0.0.1:{cluster.port}")
        targets = [Target(backend=b, url=url if b == "postgres" else None) for b in backends]
        report = run_matrix(
            _workdir(args.workdir),
            targets,
            jobs=args.jobs,
            progress=progress,
            user_adapter=args.adapter,
            ledger_spec=args.ledger,
            args=step_args,
            idempotent=not args.not_idempotent,
        )
    save_report(report, report_path)
    problems = verify(report)
    out(render_table(report))
    if problems:
        for p in problems:
            err(error_line(f"effectlog: crash-matrix: {p}", logger="effectlog.crashmatrix"))
        return int(ExitStatus.RUN_FAILED)
    out(f"\nreport written to {report_path}; every case verified from its evidence\n")
    return 0


def _step_args(text: str) -> dict[str, Any]:
    import msgspec

    from effectlog.plan import MAX_ARGS_BYTES

    try:
        value = msgspec.json.decode(text.encode())
    except msgspec.DecodeError as exc:
        raise BadInput(f"crash-matrix run: --args is not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise BadInput(f"crash-matrix run: --args must be a JSON object, not {type(value).__name__}")
    if len(text.encode()) > MAX_ARGS_BYTES:
        raise BadInput(f"crash-matrix run: --args is larger than {MAX_ARGS_BYTES} bytes")
    return value


def cmd_verify(args: argparse.Namespace) -> int:
    from effectlog.crashmatrix.report import load_report, render_table, verify

    report = load_report(args.report)
    problems = verify(report)
    if problems:
        for p in problems:
            err(f"effectlog: crash-matrix verify: {p}\n")
        return int(ExitStatus.INTEGRITY)
    out(render_table(report))
    out(f"\nok: {len(report.cases)} case(s) recomputed from their evidence\n")
    return 0


def cmd_soak(args: argparse.Namespace) -> int:
    from effectlog.crashmatrix.soak import render_soak, run_soak, save_soak

    if args.kills < 1 or args.steps < 2:
        raise BadInput("soak: --kills must be >= 1 and --steps >= 2")
    result = run_soak(
        _workdir(args.workdir),
        kills=args.kills,
        seed=args.seed,
        steps=args.steps,
        progress=line_sink(args, "effectlog.crashmatrix"),
    )
    if args.output:
        save_soak(result, args.output)
    out(render_soak(result))
    return 0 if result.violations == 0 else int(ExitStatus.RUN_FAILED)


def cmd_worker(args: argparse.Namespace) -> int:
    from effectlog.crashmatrix.worker import work

    return work(
        args.plan,
        args.journal,
        args.effects,
        arm=args.arm,
        notify_fd=args.notify_fd,
        blind=args.blind,
        user_adapter=args.user_adapter,
        adapters=args.adapters,
    )
