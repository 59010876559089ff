"""Adapters for the life-cycle tests (tests/test_lifecycle.py), named by ``--adapters lifecycle_adapters:ADAPTERS``.

``test.slow`` says it started (a file per run) and then holds while the file named by
its ``hold`` option exists; it has no effect of its own, so it may be declared
idempotent. ``test.gate`` raises ``NotApplied`` until the file named by its ``open``
option exists (a known "not applied" failure). ``test.unsure`` always raises a
connection error: its outcome is unknown. ``test.lossy`` is an idempotent tool whose answers
are lost: it makes its effect in the effect store under the request's key (deduplicated by
the key), then raises a connection error unless the file named by its ``answers`` option
exists.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from effectlog.errors import NotApplied


class Slow:
    def __init__(self, options: dict[str, Any]) -> None:
        self.hold, self.started = options.get("hold"), options.get("started")

    def invoke(self, request: Any) -> dict[str, Any]:
        if self.started:
            Path(f"{self.started}-{request.run_id}").touch()
        while self.hold and Path(self.hold).exists():
            time.sleep(0.02)
        return {"slow": request.step_id}


class Gate:
    def __init__(self, options: dict[str, Any]) -> None:
        self.open = str(options["open"])

    def invoke(self, request: Any) -> dict[str, Any]:
        if not Path(self.open).exists():
            raise NotApplied("the gate is closed")
        return {"passed": request.idempotency_key}


class Unsure:
    def invoke(self, request: Any) -> Any:
        raise ConnectionError("no answer from the endpoint")


class Lossy:
    def __init__(self, options: dict[str, Any], ctx: Any) -> None:
        self.answers, self.store = str(options["answers"]), ctx.effect_store()

    def invoke(self, request: Any) -> Any:
        receipt = self.store.apply_idempotent(request)
        if not Path(self.answers).exists():
            raise ConnectionError("the answer was lost on the way back")
        return receipt


ADAPTERS = {
    "test.slow": lambda decl, ctx: Slow(decl.options),
    "test.gate": lambda decl, ctx: Gate(decl.options),
    "test.unsure": lambda decl, ctx: Unsure(),
    "test.lossy": lambda decl, ctx: Lossy(decl.options, ctx),
}
