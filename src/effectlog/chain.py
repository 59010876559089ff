"""The per-run hash chain: ``hash = H(prev_hash || encoded_event)``.

Without a key ``H`` is SHA-256: it detects accidental change (a flipped byte, a
lost row), not a deliberate rewrite, since anyone can recompute it. With a key
``H`` is HMAC-SHA256, and a rewrite needs the key.
"""

from __future__ import annotations

import hashlib
import hmac

GENESIS = bytes(32)


class Chain:
    """Computes chain links; one instance per journal, keyed or not."""

    __slots__ = ("key", "name")

    def __init__(self, key: bytes | None = None) -> None:
        self.key = key or None
        self.name = "hmac-sha256" if self.key else "sha256"

    def link(self, prev: bytes, body: bytes) -> bytes:
        if self.key is None:
            return hashlib.sha256(prev + body).digest()
        return hmac.new(self.key, prev + body, hashlib.sha256).digest()
