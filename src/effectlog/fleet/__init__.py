"""The runner fleet: durable execution requests, pull-based runners, leases with fencing tokens.

``open_store(location)`` opens a fleet store: a file path is a SQLite store (many
runner processes on one host), a ``postgresql://`` URL a PostgreSQL store (many
hosts). The runs' journal lives in the same store. See docs/fleet.md.
"""

from __future__ import annotations

from effectlog.chain import Chain
from effectlog.fleet.model import AttemptView, Candidate, HistoryRow, Lease, Offer, RequestView, Submitted
from effectlog.fleet.protocol import FleetStore
from effectlog.fleet.scheduler import schedule
from effectlog.journal.sidecars import is_postgres

__all__ = [
    "AttemptView",
    "Candidate",
    "FleetStore",
    "HistoryRow",
    "Lease",
    "Offer",
    "RequestView",
    "Submitted",
    "is_postgres",
    "open_store",
    "schedule",
]


def open_store(location: str, *, chain: Chain | None = None, pool_size: int = 4, create: bool = True) -> FleetStore:
    """Open (creating if needed) the fleet store at ``location``.

    ``create=False`` is for callers that look at or decide on requests already there (``requests``,
    ``operator``): a journal, or a database, without the fleet's tables is refused
    (``JournalUnreadable``) instead of being given them.
    """
    if is_postgres(location):
        from effectlog.fleet.postgres_store import PostgresFleetStore  # optional backend

        return PostgresFleetStore(location, chain=chain, pool_size=pool_size, create=create)
    from effectlog.fleet.sqlite_store import SqliteFleetStore

    return SqliteFleetStore(location, chain=chain, create=create)
