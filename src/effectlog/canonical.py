"""Canonical JSON and digests: the same value always gives the same bytes.

Hashes (the journal chain, plan digests, argument digests, idempotency keys) are
computed over these bytes, so the encoder is built once with sorted keys.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import msgspec

from effectlog.errors import BadInput

_encoder = msgspec.json.Encoder(order="sorted")
_MAX_DEPTH = 256  # deeper than this, the encoder itself gives up


def canonical_json(value: Any, where: str = "value") -> bytes:
    """Compact JSON with sorted object keys (struct fields sorted too).

    NaN and the infinities are refused (``BadInput`` naming the place under ``where``): the encoder
    writes each as ``null``, so their bytes, digests and records would be ``None``'s. Only an encoding
    holding a ``null`` can hide one, so the walk is skipped for nearly every value."""
    data = _encoder.encode(value)
    if b"null" in data:
        problem = non_finite(value, where)
        if problem is not None:
            raise BadInput(problem)
    return data


def trusted_json(value: Any) -> bytes:
    """``canonical_json`` without the NaN walk, for values whose floats were checked where they were
    made (a ``Plan``'s pinned form: ``Plan.digest`` checks the plan's own values first). A 66k-step
    plan's pinned form holds nulls (``retry``, ``timeout_s``), and walking it costs 40x encoding it."""
    return _encoder.encode(value)


def digest(value: Any, where: str = "value") -> str:
    """``sha256`` hex digest of the canonical JSON of ``value``."""
    return hashlib.sha256(canonical_json(value, where)).hexdigest()


def digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def non_finite(value: Any, where: str = "value") -> str | None:
    """Where ``value`` holds a NaN or an infinity (``where.key[i]: nan is not a finite number ...``), or None."""
    try:
        plain = msgspec.to_builtins(value)  # structs, dataclasses, enums: as the encoder sees them
    except (Exception, RecursionError):
        plain = value
    return _non_finite(plain, where, 0)


def _non_finite(value: Any, where: str, depth: int) -> str | None:
    if isinstance(value, float):
        if math.isfinite(value):
            return None
        return (
            f"{where}: {value!r} is not a finite number; JSON has no NaN or infinity "
            "(it would be recorded as null, the same as None)"
        )
    if depth > _MAX_DEPTH:
        return None
    if isinstance(value, dict):
        items: Any = ((f"{where}.{k}", v) for k, v in value.items())
    elif isinstance(value, list | tuple | set | frozenset):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for place, item in items:
        found = _non_finite(item, place, depth + 1)
        if found:
            return found
    return None
