"""The life of a run after things go wrong: recover at start-up, fork or retry, repin after an upgrade.

See docs/lifecycle.md. Every operation here only appends events (to the run it
creates or the run it repins), and drives runs through the runtime's actors under the
ownership rule of ``effectlog.journal.ownership``.
"""

from __future__ import annotations

from effectlog.lifecycle.fork import ForkPoint, ForkRecord, afork, fork_point, forks_of, retry_run_id
from effectlog.lifecycle.pinned import pinned_plan
from effectlog.lifecycle.recover import PendingRun, Recovered, arecover, pending
from effectlog.lifecycle.repin import Repinned, repin

__all__ = [
    "ForkPoint",
    "ForkRecord",
    "PendingRun",
    "Recovered",
    "Repinned",
    "afork",
    "arecover",
    "fork_point",
    "forks_of",
    "pending",
    "pinned_plan",
    "repin",
    "retry_run_id",
]
