"""The matrix for a user's own adapter: does it really honour its idempotency contract?

Declaring ``idempotent`` proves nothing. Each case kills a real worker at one
boundary and counts effects through the user's ledger function; an adapter that
keeps its contract ends every case with exactly one effect and a completed run.
"""

from __future__ import annotations

from effectlog.crashmatrix.cases import Action, Case, Check, W, completed

USER_TYPE = "user"


def _w(arm: str) -> Action:
    return Action(do="worker", arm=arm)


USER_CASES: tuple[Case, ...] = (
    Case(
        name="user-no-crash",
        title="Your adapter: no crash",
        kind="idempotent",
        actions=(W,),
        effects=1,
        outcome="Completed",
    ),
    Case(
        name="user-after-request",
        title="Your adapter: after request",
        kind="idempotent",
        actions=(_w("after_request"), W),
        effects=1,
        outcome="Resumed with the same key",
    ),
    Case(
        name="user-after-effect",
        title="Your adapter: after effect",
        kind="idempotent",
        actions=(_w("after_effect"), W),
        effects=1,
        outcome="Existing effect recognised",
    ),
    Case(
        name="user-before-commit-effect",
        title="Your adapter: receipt written, not committed",
        kind="idempotent",
        actions=(_w("before_commit:step.effected"), W),
        effects=1,
        outcome="Existing effect recognised",
    ),
    Case(
        name="user-after-confirm",
        title="Your adapter: after confirmation",
        kind="idempotent",
        actions=(_w("after_confirm"), W),
        effects=1,
        outcome="Stored result rebuilt",
    ),
    Case(
        name="user-during-resend",
        title="Your adapter: crash again during the re-send",
        kind="idempotent",
        actions=(_w("after_request"), _w("after_resend"), W),
        effects=1,
        outcome="Re-sent twice with the same key",
    ),
)

USER_CHECKS: dict[str, tuple[Check, ...]] = {c.name: (completed,) for c in USER_CASES}
USER_BY_NAME = {c.name: c for c in USER_CASES}
