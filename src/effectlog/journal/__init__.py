"""Journals: the storage Protocol and its backends, opened by location."""

from __future__ import annotations

import os

from effectlog.chain import Chain
from effectlog.fold import RunState, replay_records
from effectlog.journal.protocol import SCHEMA_VERSION, Journal
from effectlog.journal.sqlite import SqliteJournal

__all__ = ["SCHEMA_VERSION", "Journal", "SqliteJournal", "chain_from_env", "load_run", "open_journal"]


def chain_from_env(key_file: str | None = None) -> Chain:
    """The chain to use: HMAC with ``EFFECTLOG_JOURNAL_KEY`` or a key file, plain SHA-256 otherwise."""
    from effectlog.errors import BadInput

    if key_file:
        try:
            with open(key_file, "rb") as fh:
                key = fh.read().strip()
        except OSError as exc:
            raise BadInput(f"--key-file {key_file}: {exc.strerror}") from None
        if not key:
            raise BadInput(f"--key-file {key_file}: the key file is empty")
        return Chain(key)
    env = os.environ.get("EFFECTLOG_JOURNAL_KEY", "")
    return Chain(env.encode() if env else None)


def open_journal(location: str, *, writer: bool = True, chain: Chain | None = None) -> Journal:
    """Open the journal at ``location``: a file path, or a ``postgresql://`` URL."""
    if location.startswith(("postgresql://", "postgres://")):
        from effectlog.journal.postgres import PostgresJournal  # optional backend

        return PostgresJournal(location, writer=writer, chain=chain)
    return SqliteJournal(location, writer=writer, chain=chain)


def load_run(journal: Journal, run_id: str) -> RunState:
    """Replay one run from the journal, checking chain, sequence and legality."""
    return replay_records(journal.read(run_id), journal.chain, run_id=run_id)
