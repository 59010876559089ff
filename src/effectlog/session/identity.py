"""Step identity: deterministic step ids, fingerprints, the approval hash and the provider key.

Everything here is a pure function of values the caller passes again on resume, so a
new process computes the same ids and keys without reading anything but the journal.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import quote

import msgspec

from effectlog.canonical import canonical_json, digest_bytes, non_finite
from effectlog.errors import BadInput

StepKind = Literal["tool", "model", "sleep"]

_POSITIONAL = re.compile(r"step-\d+")


def positional_id(position: int) -> str:
    """The id of the ``position``-th unkeyed step of a session (model and tool steps share one count)."""
    return f"step-{position}"


def is_positional(step_id: str) -> bool:
    """Whether ``step_id`` is a position's (keys never look like one: ``keyed_id`` refuses them)."""
    return _POSITIONAL.fullmatch(step_id) is not None


def keyed_id(key: str) -> str:
    """The id of a step the caller names: it does not depend on where the step falls."""
    if not key or not key.strip():
        raise BadInput("a step key must not be empty")
    if _POSITIONAL.fullmatch(key):
        raise BadInput(f"step key {key!r} looks like a positional id (step-N); choose another")
    return key


def canonical(value: Any, what: str) -> bytes:
    """Canonical JSON of ``value``, or ``BadInput`` naming what could not be encoded."""
    try:
        return canonical_json(value, what)
    except (TypeError, msgspec.EncodeError) as exc:
        raise BadInput(f"{what} is not JSON-encodable: {exc}") from None


def normalized(value: Any, what: str) -> Any:
    """``value`` as the journal gives it back (JSON types only), so a live pass sees what a replay sees."""
    return msgspec.json.decode(canonical(value, what))


def finite(value: Any, what: str) -> Any:
    """``value``, or ``BadInput`` if it holds a NaN or an infinity anywhere: canonical JSON writes them as
    ``null``, so ``f(inf)``, ``f(nan)`` and ``f(None)`` would be one step to the journal (one fingerprint,
    one approval, one key's body), and a later pass would be given another call's result."""
    problem = non_finite(value, what)
    if problem is not None:
        raise BadInput(problem)
    return value


def fingerprint(kind: StepKind, name: str, args: Any) -> str:
    """What a step is, for divergence checks: its kind, its tool or model name and its canonical args.

    A model step's args are ``None`` here: its request body is checked on its own, as
    the idempotency body digest (a different body is ``IdempotencyConflict``).
    """
    return digest_bytes(canonical({"kind": kind, "name": name, "args": args}, f"{kind} {name!r} args"))


def tool_call_hash(step_id: str, tool: str, args: Any) -> str:
    """What an approval is bound to: this step, this tool, these exact canonical args."""
    return digest_bytes(canonical({"step_id": step_id, "tool": tool, "args": args}, f"tool {tool!r} args"))


def body_digest(body: Any) -> str:
    """``sha256`` of the canonical request body."""
    return digest_bytes(canonical(body, "the model request body"))


def provider_key(run_id: str, step_id: str, body: Any) -> str:
    """The idempotency key a model call carries: ``(run_id, step_id, sha256(canonical body)[:16])``.

    Quoted so that any run id or step id is a valid HTTP header value.
    """
    return f"{quote(run_id, safe='')}/{quote(step_id, safe='')}/{body_digest(body)[:16]}"
