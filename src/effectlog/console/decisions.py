"""The console's reads and decisions: each one opens the journal (or store), does the CLI's own operation, closes it.

A decision is the function the CLI calls (``approvals.approve`` with ``expect_digest``,
``approvals.deny``, ``reconcile.reconcile``, ``reconcile.reconcile_from_ledger``, the fleet's
``fleet.decisions.operate``) with the authenticated user's name: the pages and the JSON
API both call these, so there is one code path. Nothing is held open between requests,
so the console never holds a run that another process drives.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from effectlog.cli.inspect_cmds import existing_journal
from effectlog.console.users import User
from effectlog.errors import BadInput
from effectlog.fleet import open_store
from effectlog.fleet.decisions import FLEET_DECISIONS
from effectlog.fleet.protocol import FleetStore
from effectlog.journal import Journal, chain_from_env, open_journal

if TYPE_CHECKING:
    from effectlog.adapters.registry import Registry

T = TypeVar("T")
DECISIONS = ("approve", "deny", "reconcile", "reconcile-from-ledger", "reconcile-by-lookup")


@dataclass
class Config:
    journal: str
    users: dict[str, User]
    store: str | None = None
    effects: str | None = None  # the effect store runs pinned: offers reconcile from it (as --from-ledger)
    adapters: tuple[str, ...] = ()  # MODULE:ATTR adapter factories: offers reconcile by the step's own lookup
    key_file: str | None = None  # the chain's HMAC key (else EFFECTLOG_JOURNAL_KEY), as the CLI's --key-file
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    https_only: bool = False  # the cookie's Secure flag, for a console behind TLS


def reading(config: Config, fn: Callable[[Journal], T]) -> T:
    journal = open_journal(config.journal, writer=False, chain=chain_from_env(config.key_file))
    try:
        return fn(journal)
    finally:
        journal.close()


def with_store(config: Config, fn: Callable[[FleetStore], T]) -> T:
    if config.store is None:
        raise BadInput("no fleet store: start the console with --store S")
    # Never created or given the fleet's tables here: the console shows and decides requests already there.
    store = open_store(config.store, chain=chain_from_env(config.key_file), create=False)
    try:
        return fn(store)
    finally:
        store.close()


def operate(
    store: FleetStore, request_id: int, action: str, *, by: str, reason: str, attempt: int | None = None
) -> None:
    """A fleet decision, as ``effectlog operator requeue|fail|cancel`` makes it, under the operator's name."""
    from effectlog.fleet.decisions import operate as decide

    if action not in FLEET_DECISIONS:
        raise BadInput(f"no fleet decision {action!r}: requeue, fail or cancel")
    if not reason.strip():
        raise BadInput(f"{action}: give a reason")
    decide(store, request_id, action, by=by, reason=reason, attempt=attempt)


def decide(config: Config, action: str, run_id: str, step_id: str, *, by: str, form: Mapping[str, str]) -> None:
    """One decision, by the CLI's own function, under the operator's name."""
    from effectlog.approvals import approve, deny
    from effectlog.reconcile import reconcile, reconcile_by_lookup, reconcile_from_ledger

    if action not in DECISIONS:
        raise BadInput(f"no decision {action!r}: approve, deny, reconcile or reconcile-from-ledger")
    if action == "reconcile-from-ledger" and config.effects is None:
        raise BadInput("reconcile-from-ledger: the console was started without --effects")
    if action == "reconcile-by-lookup" and not config.adapters:
        raise BadInput("reconcile-by-lookup: the console was started without --adapters")
    # A writer's open creates a missing SQLite file: a journal moved away since the console started must
    # be refused, as `effectlog approve` refuses it, not replaced by an empty one at its old path.
    existing_journal(config.journal)
    journal = open_journal(config.journal, writer=True, chain=chain_from_env(config.key_file))
    try:
        if action == "approve":
            digest = form.get("digest", "").strip()
            if not digest:
                raise BadInput("approve: give the args digest of the call you saw (digest)")
            approve(
                journal,
                run_id,
                step_id,
                by=by,
                reason=form.get("reason", ""),
                expect_digest=digest,
                attempt=attempt_of(form),
            )
        elif action == "deny":
            if not form.get("reason", "").strip():
                raise BadInput("deny: give a reason")
            deny(journal, run_id, step_id, by=by, reason=form["reason"], attempt=attempt_of(form))
        elif action == "reconcile-by-lookup":
            reconcile_by_lookup(journal, run_id, step_id, adapter_registry(config.adapters), effects=config.effects)
        elif action == "reconcile-from-ledger":
            assert config.effects is not None
            reconcile_from_ledger(journal, run_id, step_id, config.effects)
        else:
            outcome = form.get("outcome", "").replace("-", "_")
            reconcile(
                journal,
                run_id,
                step_id,
                outcome=outcome,  # type: ignore[arg-type]  # reconcile refuses anything else
                evidence=form.get("evidence", ""),
                operator=by,
                about=attempt_of(form),
            )
    finally:
        journal.close()


def attempt_of(form: Mapping[str, Any]) -> int | None:
    """The attempt the page showed (its decision forms' hidden field): the one the person's decision is about."""
    given = str(form.get("attempt", "")).strip()
    if not given:
        return None
    # isdigit() alone is true of superscripts and circled digits, which int() refuses
    if not (given.isascii() and given.isdigit()) or not 0 < int(given) < 2**31:
        raise BadInput(f"attempt: a whole number above 0, not {given[:20]!r}")
    return int(given)


def adapter_registry(specs: tuple[str, ...]) -> Registry:
    """The adapters as ``reconcile --lookup --adapters`` builds them: built-ins plus each MODULE:ATTR."""
    from effectlog.adapters.registry import Registry

    registry = Registry()
    for spec in specs:
        registry.add_module(spec)
    return registry
