"""What an adapter is: ``invoke(request) -> receipt``, and optionally ``lookup(request)``.

An adapter raises ``effectlog.errors.NotApplied`` to say "definitely not applied".
Anything else it raises, a timeout, or a crash means "outcome unknown".
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any, Protocol, runtime_checkable

import msgspec


class Request(msgspec.Struct, frozen=True, kw_only=True):
    """One call of one attempt of one step. The key is stable across crashes and processes."""

    run_id: str
    step_id: str
    attempt: int
    idempotency_key: str
    args: dict[str, Any]
    timeout_s: float | None = None


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
    """Deterministic from (run id, step id, attempt): the same after any crash, in any process."""
    material = f"{run_id}\x00{step_id}\x00{attempt}".encode()
    return "el1-" + hashlib.sha256(material).hexdigest()[:40]


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
