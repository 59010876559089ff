"""The crash-matrix report: evidence, not verdicts.

A report holds, per case, every event (bytes and chain hash), every effect-store
row, and each process's exit status or signal; plus the environment and digests
of the runtime's source. ``verify`` recomputes every expectation from that
evidence with the expectations in ``cases.py``: a count edited by hand, an event
removed or a row dropped makes it fail. It never trusts a stored pass flag.
"""

from __future__ import annotations

import hashlib
import os
import platform
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec

from effectlog import events as ev
from effectlog.chain import GENESIS, Chain
from effectlog.crashmatrix.cases import BY_NAME, CASES, Case, Evidence
from effectlog.crashmatrix.processes import ProcessRecord
from effectlog.errors import BadInput, EffectlogError

REPORT_VERSION = 1


class StoredEvent(msgspec.Struct, frozen=True, kw_only=True):
    seq: int
    hash: str  # hex of the journal's chain hash
    body: str  # the exact encoded event (UTF-8 JSON)


class CaseResult(msgspec.Struct, kw_only=True):
    name: str
    title: str
    backend: str
    run_id: str
    published: bool
    processes: list[ProcessRecord]
    events: list[StoredEvent] = []
    effect_rows: list[dict[str, Any]] = []
    ledger_counts: list[int] | None = None  # user matrices: counts from the user's ledger function
    # Summaries for people; verify recomputes each of them from the evidence above.
    effects: int = 0
    outcome: str = ""
    ok: bool = False
    problems: list[str] = []


class Environment(msgspec.Struct, frozen=True, kw_only=True):
    python: str
    sqlite: str
    platform: str
    cpu: str
    memory: str
    revision: str
    source_sha256: dict[str, str]
    runtime_sha256: str


class Report(msgspec.Struct, kw_only=True):
    version: int = REPORT_VERSION
    kind: str = "builtin"  # or "user": a matrix over a user's adapter
    created_at: str = ""
    environment: Environment | None = None
    backends: list[str] = []
    cases: list[CaseResult] = []
    adapter: str | None = None
    ledger: str | None = None
    args: dict[str, Any] | None = None  # user matrices: the step's args (None: the built-in payment)
    idempotent: bool = True  # user matrices: the contract the adapter declared (which cases ran)


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory() -> str:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                kib = int(line.split()[1])
                return f"{kib / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError):
        pass
    return "unknown"


def _revision() -> str:
    here = Path(__file__).resolve().parent
    try:
        git = ["git", "rev-parse", "HEAD"]  # git from PATH, as a person would run it
        out = subprocess.run(git, cwd=here, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def source_digests() -> dict[str, str]:
    root = Path(__file__).resolve().parents[1]
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def environment() -> Environment:
    digests = source_digests()
    combined = hashlib.sha256("".join(f"{k}:{v}\n" for k, v in digests.items()).encode()).hexdigest()
    return Environment(
        python=sys.version.split()[0],
        sqlite=sqlite3.sqlite_version,
        platform=platform.platform(),
        cpu=f"{_cpu()} ({os.cpu_count()} cores)",
        memory=_memory(),
        revision=_revision(),
        source_sha256=digests,
        runtime_sha256=combined,
    )


# -- verification -------------------------------------------------------------------


def evidence_of(result: CaseResult, case: Case) -> tuple[Evidence, list[str]]:
    """Decode and chain-check a case's events; build the evidence the case's checks read."""
    problems: list[str] = []
    decoded: list[ev.AnyEvent] = []
    chain, prev, expect_seq = Chain(), GENESIS, 1
    for stored in result.events:
        body = stored.body.encode()
        if chain.link(prev, body).hex() != stored.hash:
            problems.append(f"event seq {stored.seq}: chain hash does not match its bytes")
            break
        if stored.seq != expect_seq:
            problems.append(f"event seq {stored.seq}: expected seq {expect_seq} (an event is missing)")
            break
        try:
            event = ev.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            problems.append(f"event seq {stored.seq}: does not decode ({exc})")
            break
        if event.run_id != result.run_id or event.seq != stored.seq:
            problems.append(f"event seq {stored.seq}: belongs to another run or position")
            break
        decoded.append(event)
        prev, expect_seq = bytes.fromhex(stored.hash), expect_seq + 1
    if not problems and decoded:
        from effectlog.fold import replay

        try:
            replay(decoded)
        except EffectlogError as exc:
            problems.append(f"the events do not replay: {exc}")
    if result.ledger_counts is not None:
        effects = result.ledger_counts[-1] if result.ledger_counts else 0
    else:
        effects = sum(1 for row in result.effect_rows if row.get("run_id") == result.run_id)
        receipts_ids = {row.get("effect_id") for row in result.effect_rows}
        for event in decoded:
            if (
                isinstance(event, ev.StepEffected)
                and isinstance(event.receipt, dict)
                and event.receipt.get("effect_id") not in receipts_ids
            ):
                problems.append(
                    f"seq {event.seq}: receipt names effect {event.receipt.get('effect_id')}, "
                    "which is not in the effect store"
                )
    if case.journal:
        counts = [p.events_after for p in result.processes]
        if counts and (counts != sorted(counts) or counts[-1] != len(result.events)):
            problems.append("per-process event counts do not match the stored events")
    evidence = Evidence(
        events=decoded,
        effects=effects,
        exits=[p.exit_status for p in result.processes],
        signals=[p.signal for p in result.processes],
        reached=[p.reached for p in result.processes],
        receipts=[e.receipt for e in decoded if isinstance(e, ev.StepEffected)],
    )
    if len(result.processes) != len(case.actions):
        problems.append(f"expected {len(case.actions)} processes, the report has {len(result.processes)}")
    return evidence, problems


def judge(result: CaseResult, cases: dict[str, Case]) -> tuple[int, list[str]]:
    """Recompute a case from its evidence: (effects found, problems)."""
    case = cases.get(result.name)
    if case is None:
        return 0, [f"unknown case {result.name!r}"]
    evidence, problems = evidence_of(result, case)
    if not problems and len(result.processes) == len(case.actions):
        problems = case.check(evidence)
    return evidence.effects, problems


def verify(report: Report, cases: dict[str, Case] | None = None) -> list[str]:
    """Every problem found, recomputed from the evidence; empty when the report holds."""
    from effectlog.crashmatrix.usercases import user_cases

    if report.version != REPORT_VERSION:
        return [f"report version {report.version} is not {REPORT_VERSION}"]
    table = cases or (user_cases(report.idempotent) if report.kind == "user" else BY_NAME)
    problems: list[str] = []
    expected = {(c.name, b) for c in table.values() for b in report.backends if c.journal or b == "none"}
    expected |= {(c.name, "none") for c in table.values() if not c.journal}
    present = {(r.name, r.backend) for r in report.cases}
    for name, backend in sorted(expected - present):
        problems.append(f"{backend} {name}: case missing from the report")
    for result in report.cases:
        where = f"{result.backend} {result.name}"
        effects, found = judge(result, table)
        problems.extend(f"{where}: {p}" for p in found)
        if effects != result.effects:
            problems.append(f"{where}: the report says {result.effects} effect(s); its evidence shows {effects}")
        case = table.get(result.name)
        if case is not None and result.outcome != case.outcome:
            problems.append(f"{where}: outcome {result.outcome!r} is not the case's {case.outcome!r}")
        if result.ok != (not found):
            problems.append(f"{where}: the stored pass flag disagrees with the evidence")
    return problems


class _Shape(msgspec.Struct):
    """What a file must name to be a report at all: every field of ``Report`` has a default, so a
    plan or ``{}`` would decode as an empty report and fail verification as one (exit 7)."""

    version: int
    backends: list[Any]
    cases: list[Any]


def load_report(path: str | Path) -> Report:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the report ({exc.strerror})") from None
    try:
        msgspec.json.decode(data, type=_Shape)
        return msgspec.json.decode(data, type=Report)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadInput(f"{path}: not a crash-matrix report ({exc})") from None


def save_report(report: Report, path: str | Path) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_bytes(msgspec.json.format(msgspec.json.encode(report), indent=1) + b"\n")
    os.replace(tmp, target)


def failure_of(result: CaseResult, width: int = 110) -> str:
    """What really happened in a failed case, for the table: the run's own failure reason when it
    recorded one, else the error line of an operator command (reconcile, approve) that failed,
    else the first problem verification found."""
    reason = ""
    for stored in result.events:
        try:
            event = ev.decode(stored.body.encode())
        except (msgspec.DecodeError, msgspec.ValidationError):
            break
        if isinstance(event, ev.RunFailed) and event.reason:
            reason = f"run failed: {event.reason}"
    for p in result.processes:
        lines = [x.strip() for x in p.stderr_tail.splitlines() if x.strip()]
        if not reason and p.do not in ("worker", "blind") and p.exit_status not in (None, 0) and lines:
            reason = f"{p.do} exited {p.exit_status}: {lines[-1]}"
    if not reason:
        reason = result.problems[0] if result.problems else "failed"
    text = " ".join(f"FAILED: {reason}".replace("|", "/").split())
    return text if len(text) <= width else text[: width - 3] + "..."


def render_table(report: Report) -> str:
    """The table of the published crash matrix effectlog reproduces: case, final effects, result."""
    lines = []
    for backend in [*report.backends, "none"]:
        rows = [r for r in report.cases if r.backend == backend]
        if not rows:
            continue
        label = "no journal (reference)" if backend == "none" else f"journal: {backend}"
        lines += [f"\n{label}", "", "| Case | Final effects | Result | Verdict |", "|---|---|---|---|"]
        order = {c.name: i for i, c in enumerate(CASES)}
        for r in sorted(rows, key=lambda r: order.get(r.name, 99)):
            mark = "" if r.published else " *"
            result = r.outcome if r.ok else failure_of(r)
            lines.append(f"| {r.title}{mark} | {r.effects} | {result} | {'ok' if r.ok else 'FAIL'} |")
    lines.append("\n* beyond the eight cases of the published crash matrix effectlog reproduces")
    return "\n".join(lines).lstrip("\n") + "\n"
