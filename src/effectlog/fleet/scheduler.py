"""The scheduler: a pure function from queued requests and one runner's offer to what it should claim.

No I/O, no clock, no randomness. Compatibility is decided by capabilities, never by
runner names: a request fits when every capability it requires is one the runner
declares. The runner then tries to claim the picks in order; the store decides who
wins a request two runners picked at once.
"""

from __future__ import annotations

from collections.abc import Sequence

from effectlog.fleet.model import Candidate, Offer


def fits(candidate: Candidate, offer: Offer) -> bool:
    return offer.capabilities.issuperset(candidate.requires)


def waiting(candidates: Sequence[Candidate], offer: Offer) -> bool:
    """Whether any candidate fits the runner, due now or backing off (work it should stay for)."""
    return any(fits(c, offer) for c in candidates)


def schedule(candidates: Sequence[Candidate], offer: Offer) -> list[int]:
    """The request ids to claim, in the candidates' order (oldest first): each due and fits, at most ``offer.free``."""
    picks: list[int] = []
    if offer.free <= 0:
        return picks
    for candidate in candidates:
        if candidate.due and fits(candidate, offer):
            picks.append(candidate.request_id)
            if len(picks) == offer.free:
                break
    return picks
