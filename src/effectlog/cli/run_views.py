"""What ``status`` and ``timeline`` print: run summaries, events, and what is at stake at a blocked step.

Reading only: nothing here writes. ``status`` lists runs from their summaries
(``effectlog.summary``: seals for closed runs), newest first; ``status --run-id`` and
``timeline`` replay the run in full. For a step that waits for a person (uncertain, or
held for approval) both show the adapter or tool, the recorded args (secrets as
digests), the args digest, the idempotency key, the attempt and the exact command.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from effectlog import events as ev
from effectlog.cli.output import emit_json, out, table
from effectlog.fold import RunState
from effectlog.journal.ownership import OwnerStatus
from effectlog.stake import AtStake, at_stake

HELD = "held for approval"


def when(ts: int) -> str:
    return datetime.fromtimestamp(ts / 1e9, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") if ts else ""


def condition(state: RunState, found: OwnerStatus | None) -> str:
    """What a person should read for the run's state: a "running" run is ``running (pid N)`` only while
    its owner lives, ``interrupted`` once the last owner is gone (a successor takes it over at once)."""
    if state.state != "running" or found is None:
        return state.state
    if not found.live:
        return "interrupted"
    who = found.owner
    if who is None:
        return "running"
    return f"running (runner {who.runner})" if who.runner else f"running (pid {who.pid} on {who.host})"


def status_dict(state: RunState, location: str, found: OwnerStatus | None = None) -> dict[str, Any]:
    """One run as ``status --json`` gives it: ``state`` is the run machine's, ``condition`` what it means now."""
    data: dict[str, Any] = {
        "run_id": state.run_id,
        "state": state.state,
        "condition": condition(state, found),
        "owner": msgspec.to_builtins(found.owner) if found is not None and found.owner is not None else None,
        "live": bool(found is not None and found.live),
        "events": state.seq,
        "blocked_step": state.blocked_step,
        "reason": state.reason,
        "started_ts": state.started_ts,
        "updated_ts": state.updated_ts,
        "steps": [{"id": s.step_id, "state": s.state, "attempt": s.attempt} for s in state.ordered_steps()],
        "at_stake": [msgspec.to_builtins(a) for a in at_stake(state, location)],
    }
    return data


def print_status_list(
    states: list[RunState], location: str, as_json: bool, owners: dict[str, OwnerStatus] | None = None
) -> None:
    owners = owners or {}
    if as_json:
        emit_json([status_dict(s, location, owners.get(s.run_id)) for s in states])
        return
    rows = [
        (s.run_id, condition(s, owners.get(s.run_id)), s.seq, s.blocked_step or "", when(s.started_ts)) for s in states
    ]
    out(table(("run", "state", "events", "blocked on", "started"), rows) + "\n")


def print_status_one(state: RunState, location: str, as_json: bool, found: OwnerStatus | None = None) -> None:
    if as_json:
        emit_json(status_dict(state, location, found))
        return
    out(f"run {state.run_id}: {condition(state, found)} ({state.seq} events)\n")
    rows = [(x.step_id, x.state, x.attempt, x.reason) for x in state.ordered_steps()]
    out(table(("step", "state", "attempt", "note"), rows) + "\n")
    out(render_at_stake(at_stake(state, location)))


def _field(label: str, value: str) -> str:
    """One ``  label:  value`` line of a waiting step's block, every value in one column (each line
    spaced by hand put ``reconcile:`` one column left and a session's ``tool:`` five)."""
    return f"  {label + ':':<18}{value}"


def render_at_stake(items: list[AtStake]) -> str:
    """Each blocked step as an indented block an operator can act on."""
    out = []
    for a in items:
        what = "uncertain: reconcile it with evidence" if a.state == "uncertain" else f"{HELD}: approve or deny it"
        adapter = f"{a.adapter} ({a.adapter_type})" if a.adapter_type else a.adapter
        args = "(not recorded)" if a.args is None else msgspec.json.encode(a.args).decode()
        lines = [
            f"\nstep {a.step_id}: {what}",
            _field("tool" if a.adapter_type is None else "adapter", adapter)
            + ("" if a.idempotent else "  (not idempotent)"),
            _field("args", args),
            _field("args digest", a.args_digest),
            _field("idempotency key", a.idempotency_key or "(none yet: assigned when the step is requested)"),
            _field("attempt", str(a.attempt)),
        ]
        if a.reason:
            lines.append(_field("reason", a.reason))
        lines.append(_field(a.action, a.command))
        out.append("\n".join(lines) + "\n")
    return "".join(out)


def _label(event: ev.Event) -> str:
    if isinstance(event, ev.StepDenied) and event.decision == "require_approval":
        return HELD
    return ev.tag_of(event)


def _blocking_seqs(events: list[ev.AnyEvent], items: list[AtStake]) -> dict[int, AtStake]:
    """For each blocked step, the seq of the event that put it where it waits."""
    waiting = {a.step_id: a for a in items}
    found: dict[int, AtStake] = {}
    for e in reversed(events):
        if not waiting:
            break
        sid = getattr(e, "step_id", None)
        if sid in waiting and isinstance(e, ev.StepUncertain | ev.StepDenied):
            found[e.seq] = waiting.pop(sid)
    return found


def print_timeline(
    state: RunState, events: list[ev.AnyEvent], location: str, as_json: bool, found: OwnerStatus | None = None
) -> None:
    items = at_stake(state, location)
    blocking = _blocking_seqs(events, items)
    if as_json:
        entries = []
        for e in events:
            entry = msgspec.to_builtins(e)
            if _label(e) == HELD:
                entry["label"] = HELD
            if e.seq in blocking:
                entry["at_stake"] = msgspec.to_builtins(blocking[e.seq])
            entries.append(entry)
        emit_json(entries)
        return
    rows = []
    for e in events:
        detail = {
            k: v
            for k, v in msgspec.structs.asdict(e).items()
            if k in ("decision", "outcome", "operator", "reason", "resend", "by", "pid") and v not in ("", None)
        }
        if _label(e) == HELD:
            detail.pop("decision", None)
        rows.append(
            (
                e.seq,
                when(e.ts),
                _label(e),
                getattr(e, "step_id", "") or "",
                getattr(e, "attempt", "") or "",
                " ".join(f"{k}={v}" for k, v in detail.items()),
            )
        )
    out(table(("seq", "time", "event", "step", "attempt", "detail"), rows) + "\n")
    if state.state == "running":
        out(f"now: {condition(state, found)}\n")
    out(render_at_stake(items))
