"""Running the matrix: one fresh directory per case, real processes, real SIGKILL.

For every case and journal backend the parent starts the case's processes in
order (a worker with one crash point armed, fresh workers that resume, the
reconcile and approve commands), then collects the evidence from the journal and
from the independent effect store, never from the worker's own account.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from effectlog.adapters.effects import EffectStore
from effectlog.adapters.registry import load_object
from effectlog.crashmatrix.cases import BY_NAME, CASES, Case, plan_for
from effectlog.crashmatrix.processes import ProcessRecord, effectlog_argv, run_process
from effectlog.crashmatrix.report import CaseResult, Report, StoredEvent, environment, judge
from effectlog.crashmatrix.usercases import USER_TYPE, user_cases
from effectlog.errors import BadInput, JournalUnreadable
from effectlog.journal import open_journal
from effectlog.journal.sidecars import is_postgres

Progress = Callable[[str], None]
Ledger = Callable[[str, str], int]


class Target(msgspec.Struct, frozen=True, kw_only=True):
    """Where a case's journal lives."""

    backend: str  # "sqlite", "postgres" or "none"
    url: str | None = None  # for postgres

    def journal(self, case_dir: Path) -> str:
        return self.url if self.backend == "postgres" and self.url else str(case_dir / "journal.db")


def _events(location: str, run_id: str) -> list[StoredEvent]:
    if not is_postgres(location) and not Path(location).exists():
        return []
    try:
        journal = open_journal(location, writer=False)
    except JournalUnreadable:  # nothing written yet (a PostgreSQL database before its first writer)
        return []
    try:
        return [StoredEvent(seq=r.seq, hash=r.hash.hex(), body=r.body.decode()) for r in journal.read(run_id)]
    finally:
        journal.close()


def _effect_rows(effects: Path, run_id: str) -> list[dict[str, Any]]:
    if not effects.exists():
        return []
    store = EffectStore(effects)
    try:
        return [msgspec.to_builtins(r) for r in store.rows(run_id=run_id)]
    finally:
        store.close()


# ``reconcile --lookup`` takes a mapping of adapter type to factory; a user matrix names a factory.
_SHIM = """from effectlog.adapters.registry import load_object

ADAPTERS = {{{user_type!r}: load_object({spec!r})}}
"""


def _lookup_env(case_dir: Path, user_adapter: str) -> dict[str, str]:
    """The environment of a ``reconcile --lookup`` process: a module mapping the user type to the factory."""
    (case_dir / "cm_user_adapters.py").write_text(_SHIM.format(user_type=USER_TYPE, spec=user_adapter))
    path = os.pathsep.join(filter(None, [str(case_dir), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def run_case(
    case: Case,
    target: Target,
    workdir: Path,
    *,
    user_adapter: str | None = None,
    ledger: Ledger | None = None,
    args: dict[str, Any] | None = None,
) -> CaseResult:
    case_dir = workdir / f"{target.backend}-{case.name}"
    case_dir.mkdir(parents=True, exist_ok=True)
    run_id = f"cm-{case.name}-{secrets.token_hex(3)}"
    plan_path, effects = case_dir / "plan.json", case_dir / "effects.db"
    plan_path.write_text(json.dumps(plan_for(case, run_id, USER_TYPE if user_adapter else None, args), indent=1))
    journal = target.journal(case_dir)
    processes: list[ProcessRecord] = []
    ledger_counts: list[int] | None = [] if ledger is not None else None
    for action in case.actions:
        env: dict[str, str] | None = None
        if action.do in ("worker", "blind"):
            argv = effectlog_argv("crash-matrix", "worker", "--plan", str(plan_path), "--effects", str(effects))
            if action.do == "blind":
                argv += ["--blind", str(case_dir / "blind-results.json")]
            else:
                argv += ["--journal", journal]
            if user_adapter:
                argv += ["--user-adapter", user_adapter]
        elif action.do == "reconcile-lookup" and user_adapter:
            argv = effectlog_argv(
                "reconcile", "--journal", journal, "--run-id", run_id, "--step", "pay", "--lookup",
                "--adapters", "cm_user_adapters:ADAPTERS",
            )  # fmt: skip
            env = _lookup_env(case_dir, user_adapter)
        elif action.do == "reconcile-ledger":
            argv = effectlog_argv(
                "reconcile", "--journal", journal, "--run-id", run_id, "--step", "pay", "--from-ledger", str(effects)
            )
        else:
            argv = effectlog_argv(
                "approve",
                "--journal",
                journal,
                "--run-id",
                run_id,
                "--step",
                "pay",
                "--by",
                "crash-matrix",
                "--reason",
                "approved by the crash matrix",
            )
        record = run_process(action.do, argv, action.arm, env=env)
        if case.journal:
            record.events_after = len(_events(journal, run_id))
        record.effects_after = len(_effect_rows(effects, run_id))
        if ledger is not None and ledger_counts is not None:
            ledger_counts.append(int(ledger(run_id, "pay")))
        processes.append(record)
    result = CaseResult(
        name=case.name,
        title=case.title,
        backend=target.backend if case.journal else "none",
        run_id=run_id,
        published=case.published,
        processes=processes,
        events=_events(journal, run_id) if case.journal else [],
        effect_rows=_effect_rows(effects, run_id),
        ledger_counts=ledger_counts,
        outcome=case.outcome,
    )
    effects_found, problems = judge(result, user_cases(case.kind == "idempotent") if user_adapter else BY_NAME)
    result.effects, result.problems, result.ok = effects_found, problems, not problems
    return result


def run_matrix(
    workdir: Path,
    targets: Iterable[Target],
    *,
    jobs: int = 1,
    progress: Progress | None = None,
    user_adapter: str | None = None,
    ledger_spec: str | None = None,
    args: dict[str, Any] | None = None,
    idempotent: bool = True,
) -> Report:
    """Run every case against every target; the report is evidence, verified separately.

    A user matrix (``user_adapter``) runs the idempotent cases, or with ``idempotent=False``
    the cases reconciled through the adapter's own ``lookup``; ``args`` are the step's args.
    """
    targets = list(targets)
    ledger: Ledger | None = None
    if user_adapter:
        if not ledger_spec:
            raise BadInput("crash-matrix: --adapter needs --ledger module:counter to count effects")
        ledger = load_object(ledger_spec)
        if not callable(ledger):
            raise BadInput(f"--ledger {ledger_spec}: not a callable counter(run_id, step_id) -> int")
        load_object(user_adapter)  # fail early, in the parent, on a bad spec
    cases = tuple(user_cases(idempotent).values()) if user_adapter else CASES
    plan: list[tuple[Case, Target]] = []
    for case in cases:
        if case.journal:
            plan += [(case, t) for t in targets]
        else:
            plan.append((case, Target(backend="none")))
    total = len(plan)
    done = 0

    def one(item: tuple[Case, Target]) -> CaseResult:
        nonlocal done
        case, target = item
        started = time.monotonic()
        result = run_case(case, target, workdir, user_adapter=user_adapter, ledger=ledger, args=args)
        done += 1
        if progress is not None:
            verdict = "ok" if result.ok else "FAIL: " + "; ".join(result.problems)
            progress(
                f"[{done:2d}/{total}] {result.backend:8s} {case.title:52s} "
                f"{result.effects} effect(s)  {verdict}  ({time.monotonic() - started:.1f}s)"
            )
        return result

    if jobs <= 1:
        results = [one(item) for item in plan]
    else:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(one, plan))
    return Report(
        kind="user" if user_adapter else "builtin",
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        environment=environment(),
        backends=[t.backend for t in targets],
        cases=results,
        adapter=user_adapter,
        ledger=ledger_spec,
        args=args,
        idempotent=idempotent,
    )
