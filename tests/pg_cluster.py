"""The throwaway cluster now ships in the package (``effectlog.pgcluster``); kept importable here."""

from effectlog.pgcluster import ClusterUnavailable, PgCluster, find_bindir, free_port

__all__ = ["ClusterUnavailable", "PgCluster", "find_bindir", "free_port"]
