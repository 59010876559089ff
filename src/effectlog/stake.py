"""What is at stake at a blocked step: what an operator must see to find evidence or to approve.

For a step that is ``uncertain`` (reconcile it) or ``awaiting_approval`` (approve or deny
it), ``at_stake`` gathers from a run's folded state: the adapter (plan) or tool (session),
the arguments as recorded (secret values only as ``{"$secret_sha256": ...}``), the digest
an approval binds to, the idempotency key, the attempt, and the exact command that
resolves it. Pure: a function of the state and the journal's location.
"""

from __future__ import annotations

import json
import shlex
from typing import Any, Literal

import msgspec

from effectlog import spelling
from effectlog.canonical import canonical_json, digest
from effectlog.fold import RunState, StepState

BLOCKED_STATES = ("uncertain", "awaiting_approval")
DIGEST_FIELD = "$secret_sha256"


class AtStake(msgspec.Struct, frozen=True, kw_only=True):
    """One blocked step, as an operator needs to see it."""

    step_id: str
    state: str  # uncertain | awaiting_approval
    kind: str  # tool | model
    adapter: str  # the plan's adapter name, or the session's tool name
    adapter_type: str | None  # the adapter's registered type (plans), None for sessions
    args: dict[str, Any] | None  # as recorded: secret values replaced by their digests; None if not recorded
    args_digest: str  # what an approval binds to (``approve --expect-digest``)
    idempotency_key: str  # "" while the step has not been requested (a held step gets its key when it runs)
    idempotent: bool
    attempt: int
    reason: str
    action: Literal["reconcile", "approve"]
    command: str  # the exact command line that resolves the step (fill in the capitalised words)


def redact_args(args: dict[str, Any], secret: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``args`` with each value named in ``secret`` replaced by ``{"$secret_sha256": digest}``."""
    return {k: ({DIGEST_FIELD: digest(v)} if k in secret else v) for k, v in args.items()}


def redact_text(text: str, args: dict[str, Any], secret: tuple[str, ...] | list[str]) -> str:
    """``text`` (a tool's error message, say) with each secret arg's value replaced by ``<secret NAME>``.

    The forms looked for are those a message may echo: each string or number inside the
    value, its canonical JSON and its repr; longest first, so a value inside another stays hidden.
    """
    for name in secret:
        if name not in args:
            continue
        forms: set[str] = set()
        _forms(args[name], forms)
        for form in sorted(forms, key=len, reverse=True):
            text = text.replace(form, f"<secret {name}>")
    return text


def _forms(value: Any, forms: set[str]) -> None:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, dict | list):
        forms.add(canonical_json(value).decode())
        for item in value.values() if isinstance(value, dict) else value:
            _forms(item, forms)
        return
    forms.update(f for f in (str(value), repr(value), canonical_json(value).decode()) if f)


def _word(value: str) -> str:
    """``value`` as one shell word that also survives being shown on one line with its whitespace folded
    (``str()`` of an error folds it): ``shlex.quote``, or bash's ``$'...'`` with escapes when the value
    holds a newline, a tab, a run of spaces or another character that does not print."""
    if value.isprintable() and "  " not in value:
        return shlex.quote(value)
    out = []
    for ch in value:
        code = ord(ch)
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch != " " and ch.isprintable():
            out.append(ch)
        else:
            out.append(f"\\x{code:02x}" if code < 0x80 else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
    return "$'" + "".join(out) + "'"


def shell_option(name: str, value: str) -> str:
    """``--name VALUE`` as one option with its value: ``--name=VALUE`` when the value starts with ``-``,
    which argparse would otherwise take for an option of its own ("expected one argument")."""
    return f"{name}={_word(value)}" if value.startswith("-") else f"{name} {_word(value)}"


def step_option(step_id: str) -> str:
    """The option naming ``step_id`` in a printed command: ``--step S``, or ``--step-json '"S"'`` (JSON's
    escapes, ASCII only) for a step key ``--step`` does not take (``spelling.nameable``): a session's step
    key may be any text, a model's tool-call id with a space around it or a newline in it."""
    if spelling.nameable(step_id):
        return shell_option("--step", step_id)
    return f"--step-json {shlex.quote(json.dumps(step_id))}"


def _where(location: str, run_id: str, step_id: str) -> str:
    return f"{shell_option('--journal', location)} {shell_option('--run-id', run_id)} {step_option(step_id)}"


def reconcile_command(location: str, run_id: str, step_id: str, attempt: int | None = None) -> str:
    """The reconcile command a stopped step needs; with ``attempt``, it is bound to that attempt, so a
    decision typed from this line is refused (exit 5) once the step has moved on to another one."""
    bound = f" --attempt {attempt}" if attempt is not None else ""
    return (
        f"effectlog reconcile {_where(location, run_id, step_id)}{bound} "
        "--outcome applied|not-applied --evidence TEXT --operator NAME"
    )


def approve_command(
    location: str,
    run_id: str,
    step_id: str,
    args_digest: str = "",
    attempt: int | None = None,
    *,
    verb: str = "approve",
) -> str:
    """The approve (or ``verb``: ``deny``, ``approve|deny``) command a held step needs. With the digest,
    it refuses if the held call changed; with ``attempt``, once the step has moved on to another attempt
    (exit 5 both): a decision typed from this line is about the call the person saw."""
    bound = f" --attempt {attempt}" if attempt is not None else ""
    pin = f" --expect-digest {args_digest}" if args_digest else ""
    return f"effectlog {verb} {_where(location, run_id, step_id)}{bound} --by NAME{pin}"


def at_stake(state: RunState, location: str) -> list[AtStake]:
    """Every step of the run that waits for a person, in step order."""
    return [_one(state, s, location) for s in state.ordered_steps() if s.state in BLOCKED_STATES]


def _one(state: RunState, step: StepState, location: str) -> AtStake:
    adapter, adapter_type, args = step.adapter, None, step.args
    decl = _plan_step(state, step.step_id)
    if decl is not None:  # a plan step: the pinned plan holds its (already redacted) args
        adapter = str(decl.get("adapter", adapter))
        pinned = state.adapters.get(adapter)
        plan_adapters = (state.plan or {}).get("adapters", {})
        adapter_type = pinned.type if pinned is not None else plan_adapters.get(adapter, {}).get("type")
        args = dict(decl.get("args") or {})
    if step.state == "uncertain":
        action: Literal["reconcile", "approve"] = "reconcile"
        command = reconcile_command(location, state.run_id, step.step_id, step.attempt)
    else:
        action = "approve"
        command = approve_command(location, state.run_id, step.step_id, step.args_digest, step.attempt)
    return AtStake(
        step_id=step.step_id,
        state=step.state,
        kind=step.kind,
        adapter=adapter,
        adapter_type=adapter_type,
        args=args,
        args_digest=step.args_digest,
        idempotency_key=step.idempotency_key,
        idempotent=step.idempotent,
        attempt=step.attempt,
        reason=step.reason,
        action=action,
        command=command,
    )


def _plan_step(state: RunState, step_id: str) -> dict[str, Any] | None:
    if state.kind != "plan" or not state.plan:
        return None
    for decl in state.plan.get("steps", []):
        if isinstance(decl, dict) and decl.get("id") == step_id:
            return decl
    return None
