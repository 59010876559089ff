"""Adapters: how effectlog talks to tools."""

from effectlog.adapters.effects import ControlEffects, EffectRow, EffectStore, IdempotentEffects
from effectlog.adapters.protocol import (
    Adapter,
    Evidence,
    Receipt,
    Request,
    SupportsLookup,
    body_bound_key,
    body_digest,
    check_same_body,
    idempotency_key,
    implementation_fingerprint,
)
from effectlog.adapters.registry import AdapterContext, Registry, load_object

__all__ = [
    "Adapter",
    "AdapterContext",
    "ControlEffects",
    "EffectRow",
    "EffectStore",
    "Evidence",
    "IdempotentEffects",
    "Receipt",
    "Registry",
    "Request",
    "SupportsLookup",
    "body_bound_key",
    "body_digest",
    "check_same_body",
    "idempotency_key",
    "implementation_fingerprint",
    "load_object",
]
