"""The blind-retry reference: what happens without write-ahead and deduplication.

It records a step's result only after the tool returns (nothing before), and on
resume re-runs every step without a recorded result. With a tool that does not
deduplicate, a crash between the effect and the record duplicates the effect.
It exists to be measured against, never to be used.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from effectlog.adapters.protocol import Request
from effectlog.adapters.registry import AdapterContext, Registry
from effectlog.plan import Plan


def blind_run(
    plan: Plan,
    results_path: str | Path,
    *,
    effects: str | None = None,
    crash_hook: Callable[[str, str], None] | None = None,
) -> int:
    """Run (or re-run) the plan blindly; returns the number of adapter calls made."""
    path = Path(results_path)
    done: dict[str, object] = json.loads(path.read_text()) if path.exists() else {}
    context = AdapterContext(effects=effects)
    adapters = Registry(entry_point_group=False).build(plan, context).adapters
    calls = 0
    try:
        for step in plan.steps:
            if step.id in done:
                continue
            request = Request(run_id=plan.run_id, step_id=step.id, attempt=1, idempotency_key="", args=step.args)
            calls += 1
            receipt = adapters[step.adapter].invoke(request)
            if crash_hook is not None:
                crash_hook("after_effect", step.id)
            done[step.id] = getattr(receipt, "data", receipt)
            path.write_text(json.dumps(done))
    finally:
        context.close()
    return calls
