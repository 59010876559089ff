"""Canonical JSON and digests: the same value always gives the same bytes.

Hashes (the journal chain, plan digests, argument digests, idempotency keys) are
computed over these bytes, so the encoder is built once with sorted keys.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

_encoder = msgspec.json.Encoder(order="sorted")


def canonical_json(value: Any) -> bytes:
    """Compact JSON with sorted object keys (struct fields sorted too)."""
    return _encoder.encode(value)


def digest(value: Any) -> str:
    """``sha256`` hex digest of the canonical JSON of ``value``."""
    return hashlib.sha256(_encoder.encode(value)).hexdigest()


def digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
