"""The per-run hash chain: ``hash = H(prev_hash || encoded_event)``.

Without a key ``H`` is SHA-256: it detects accidental change (a flipped byte, a
lost row), not a deliberate rewrite, since anyone can recompute it. With a key
``H`` is HMAC-SHA256, and a rewrite needs the key.

A keyed journal records its key's fingerprint (``Chain.fingerprint``) in its meta when it is
created, so a journal opened with another key is refused at open (``journal.keycheck``) instead of
being read as tampered with, or appended to under a key that can never verify it again.
"""

from __future__ import annotations

import hashlib
import hmac

GENESIS = bytes(32)
# What the fingerprint is the HMAC of: fixed, and never a chain link (a link's message is 32 bytes of
# previous hash and an encoded event, which never starts with these bytes).
FINGERPRINT_LABEL = b"effectlog journal key fingerprint v1"


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

    def fingerprint(self) -> str | None:
        """The key's name in the journal's meta, ``HMAC-SHA256(key, FINGERPRINT_LABEL)`` in hex; ``None``
        without a key. It tells keys apart without holding one: guessing a key from it is no easier than
        from any stored chain link."""
        if self.key is None:
            return None
        return hmac.new(self.key, FINGERPRINT_LABEL, hashlib.sha256).hexdigest()
