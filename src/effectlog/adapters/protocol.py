"""What an adapter is: ``invoke(request) -> receipt``, and optionally ``lookup(request)``.

An adapter raises ``effectlog.errors.NotApplied`` to say "definitely not applied".
``effectlog.errors.IdempotencyConflict`` says "this key already names another request"
(definitely not applied for this body, and no retry will change that). Anything
else it raises, a timeout, or a crash means "outcome unknown".

A key names ONE request: (run, step, attempt) and the body sent with it. A tool that
remembers keys must remember the body too (``body_digest``) and refuse a known key
with another body (``check_same_body``), as Stripe's ``Idempotency-Key`` does; a tool
that dedups by key alone and cannot compare bodies should be sent ``body_bound_key``.
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any, Protocol, runtime_checkable

import msgspec

from effectlog.canonical import digest
from effectlog.errors import IdempotencyConflict


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """One call of one attempt of one step. The key is stable across crashes and processes."""

    run_id: str
    step_id: str
    attempt: int
    idempotency_key: str
    args: dict[str, Any]
    timeout_s: float | None = None
    # The journal's digest of the real args, set on a request rebuilt from the journal (a reconcile's
    # lookup) whose secret args are only placeholders: ``body_digest`` answers it, so a ledger or a tool
    # still compares the body its key was used with. None: the args are the real ones.
    args_digest: str | None = None


class Receipt(msgspec.Struct, frozen=True, kw_only=True):
    """What the tool answered. ``ok=False``: it ran and reported failure (a known outcome)."""

    data: Any = None
    ok: bool = True


class Evidence(msgspec.Struct, frozen=True, kw_only=True):
    """External evidence of whether an effect exists, e.g. from inspecting a ledger."""

    applied: bool
    detail: str


@runtime_checkable
class Adapter(Protocol):
    def invoke(self, request: Request) -> Receipt | Any: ...


@runtime_checkable
class SupportsLookup(Protocol):
    def lookup(self, request: Request) -> Evidence | None: ...


def idempotency_key(run_id: str, step_id: str, attempt: int) -> str:
    """Deterministic from (run id, step id, attempt): the same after any crash, in any process.

    NUL separates the parts, which is unambiguous only while neither id holds one (plan ids cannot;
    a session's run id or step id, such as a model's tool call id, may): ids holding a NUL are
    length-prefixed instead. Their material has more than two NULs, so it never meets the material
    of ids without one, whose keys (every recorded key of a plan run) are unchanged.
    """
    if "\x00" in run_id or "\x00" in step_id:
        material = f"{len(run_id)}:{run_id}\x00{len(step_id)}:{step_id}\x00{attempt}".encode()
    else:
        material = f"{run_id}\x00{step_id}\x00{attempt}".encode()
    return "el1-" + hashlib.sha256(material).hexdigest()[:40]


def body_digest(request: Request) -> str:
    """sha256 of the canonical JSON of the request's args: the body a key is bound to.

    The same digest the journal records as the step's ``args_digest`` (sorted keys,
    compact JSON), so a tool's record and the journal can be compared directly. A request
    rebuilt from the journal with secret placeholders carries that digest (``args_digest``).
    """
    return request.args_digest or digest(request.args)


def check_same_body(request: Request, recorded_digest: str, *, where: str) -> None:
    """Raise ``IdempotencyConflict`` when a known key arrives with another body.

    ``recorded_digest`` is the ``body_digest`` stored with the key when it was first
    used; ``where`` names the tool or ledger in the message. Same body: returns, and
    the caller answers with the stored result (a replay).
    """
    given = body_digest(request)
    if recorded_digest != given:
        raise IdempotencyConflict(
            f"{where}: idempotency key {request.idempotency_key} was first used with another request body "
            f"(args digest {recorded_digest[:12]}, this request {given[:12]}); a key names one request, "
            "so this one was not applied (a run id reused with other arguments?)",
            run_id=request.run_id,
            step_id=request.step_id,
        )


def body_bound_key(request: Request) -> str:
    """The request's key with its body digest folded in, for a tool that dedups by key alone.

    Such a tool cannot refuse another body under a known key; this key differs as soon
    as the body does, so it never answers one request with another's result.
    """
    material = f"{request.idempotency_key}\x00{body_digest(request)}".encode()
    return "el1b-" + hashlib.sha256(material).hexdigest()[:40]


def implementation_fingerprint(adapter: object) -> str:
    """sha256 of the adapter class's name and source file (or an explicit ``fingerprint`` attribute).

    The class name is part of it: two classes in one module (``effects.idempotent`` and
    ``effects.control``) are different implementations.
    """
    explicit = getattr(adapter, "fingerprint", None)
    if isinstance(explicit, str) and explicit:
        return explicit
    cls = type(adapter)
    name = f"{cls.__module__}.{cls.__qualname__}".encode()
    try:
        source = inspect.getsource(inspect.getmodule(cls) or cls).encode()
    except (OSError, TypeError):
        source = b""
    return hashlib.sha256(name + b"\x00" + source).hexdigest()
