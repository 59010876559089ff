"""Is the journal opened with its own key? Checked at every open, reader or writer, before anything
is read or written (``SqliteJournal`` and ``PostgresJournal`` fetch what is stored, this decides).

A keyed journal records its key's fingerprint (``Chain.fingerprint``) in ``meta`` when it is created.
Journals from before the fingerprint have none: there the key is checked against the journal's last
event's chain link (recomputed from the event before it, or genesis), and a writer then records the
fingerprint (one meta row added, nothing changed). A fingerprint that is not the key's, where the key
does link the last event, is the meta row edited (``chain_broken``), not a wrong key.

Without the check ``verify`` with another key reported ``chain_broken`` (exit 7, "altered") and a
writer appended runs chained with that key, which the journal's own key can never verify.
"""

from __future__ import annotations

from typing import NamedTuple

from effectlog.chain import GENESIS, Chain
from effectlog.errors import ChainBroken, JournalUnreadable, WrongKey

FINGERPRINT_KEY = "key_fingerprint"  # the meta row's key


class LastLink(NamedTuple):
    """The journal's last event (by its storage order) and the hash it is chained from, if stored."""

    run_id: str
    seq: int
    prev: bytes | None  # the hash of the event at seq - 1 (None when that row is not there)
    body: bytes
    hash: bytes


def check_key(
    location: str, chain: Chain, recorded: str | None, fingerprint: str | None, last: LastLink | None
) -> bool:
    """Refuse ``chain`` for a journal whose chain kind is ``recorded`` (``None``: no meta row, sha256) and
    whose meta fingerprint is ``fingerprint``; ``last`` is needed only when the fingerprint is not this
    key's (absent: the journal is from before it; another: a wrong key, or an edited meta row). True
    when a writer should record the fingerprint (a keyed journal from before it whose key checked out)."""
    kind = recorded or "sha256"
    if kind != chain.name:
        hint = "set EFFECTLOG_JOURNAL_KEY or --key-file" if kind != "sha256" else "this journal has no key"
        raise JournalUnreadable(f"{location}: journal chain is {kind}, opened as {chain.name} ({hint})")
    if chain.key is None:
        return False
    if fingerprint is not None:
        if fingerprint == chain.fingerprint():
            return False
        if last is not None and _links(chain, last):
            # The key chains the journal's last event: the key is right and the recorded fingerprint is not.
            raise ChainBroken(
                f"{location}: the journal's recorded key fingerprint (meta key_fingerprint) was changed: the key "
                f"given links its last event (run {last.run_id!r} seq {last.seq}); nothing was read or written",
                column="meta.key_fingerprint",
            )
        raise WrongKey(
            f"{location}: the key given is not this journal's key (the journal records another key's "
            "fingerprint); nothing was read or written: give the key it was written with"
        )
    if last is None:
        return True  # no event yet: nothing chained under any key, this one becomes the journal's
    if last.seq > 1 and last.prev is None:
        return False  # the event before the last is not there: verify reports that; no fingerprint recorded
    if not _links(chain, last):
        raise WrongKey(
            f"{location}: the key given is not this journal's key (its last event, run {last.run_id!r} seq "
            f"{last.seq}, does not link under it; if the key is right, that event was edited: verify with the "
            "journal's key); nothing was read or written"
        )
    return True


def _links(chain: Chain, last: LastLink) -> bool:
    """Whether ``chain`` computes the last event's stored hash (from genesis, or the event before it)."""
    prev = GENESIS if last.seq == 1 else last.prev
    return prev is not None and chain.link(prev, last.body) == last.hash
