"""effectlog: durable execution of AI-agent tool calls.

The public surface is small: ``Runtime`` runs plans (``load_plan``) durably;
``durable`` makes plain Python functions journaled steps (``@durable.tool``,
``durable.run``); ``effectlog.session`` runs agent loops; ``effectlog.testing``
ships the contract suites and the crash matrix for your own backends and adapters. Everything else
is importable but private by convention (modules named in docs/architecture.md).
"""

from __future__ import annotations

from effectlog import durable
from effectlog.adapters import Evidence, Receipt, Registry, Request
from effectlog.errors import EffectlogError, ExitStatus, NotApplied
from effectlog.fold import RunState, StepState, replay
from effectlog.plan import Plan, load_plan, parse_plan
from effectlog.runtime import RunOutcome, Runtime

__version__ = "0.1.0.dev0"
__all__ = [
    "EffectlogError",
    "Evidence",
    "ExitStatus",
    "NotApplied",
    "Plan",
    "Receipt",
    "Registry",
    "Request",
    "RunOutcome",
    "RunState",
    "Runtime",
    "StepState",
    "__version__",
    "durable",
    "load_plan",
    "parse_plan",
    "replay",
]
