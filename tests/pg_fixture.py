"""Pytest fixtures for the throwaway PostgreSQL cluster. Use from a test module with::

    pytest_plugins = ["pg_fixture"]

``pg_cluster`` starts one server per session; ``pg_url`` gives each test a fresh
database. When the server cannot start the tests skip with the reason, except
under ``CI=true``, where they fail: CI must never pass by skipping PostgreSQL.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NoReturn
from urllib.parse import urlsplit

import pytest

from effectlog.pgcluster import ClusterUnavailable, PgCluster


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required when CI=true and could not start: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL unavailable: {reason}")


def started_cluster() -> PgCluster:
    """A throwaway server of its own, started (the caller stops it); unavailable: skip, or fail under CI."""
    cluster = PgCluster()
    reason = ""
    try:
        cluster.start()
    except ClusterUnavailable as exc:
        reason = str(exc)
    if reason:  # outside the except block, so the report is the reason alone
        cluster.stop()
        unavailable(reason)
    return cluster


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    """One throwaway server for the whole session, stopped (and its data removed) at the end."""
    cluster = started_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> Iterator[str]:
    """A fresh, empty database for one test; dropped afterwards."""
    url = pg_cluster.create_database()
    yield url
    pg_cluster.drop_database(urlsplit(url).path.lstrip("/"))
