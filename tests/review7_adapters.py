"""Adapters for tests/test_review_round7.py, named by ``--adapters review7_adapters:ADAPTERS``.

``test.heldlossy`` is ``test.lossy`` (lifecycle_adapters.py: an idempotent tool that makes its
effect in the effect store once per key and loses its answer unless ``answers`` exists) that
first says it was called (a file ``<sent>-<run id>``) and holds while ``hold`` exists, so a
test can kill the process, or release two processes at once, with the key in hand.
``test.lazylossy`` is ``test.lossy`` opening the effect store only when first called, as an
adapter may (the run then pins no store: a run pins the store its adapters opened when built).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lifecycle_adapters import ADAPTERS as LIFECYCLE
from lifecycle_adapters import Lossy


class HeldLossy(Lossy):
    def __init__(self, options: dict[str, Any], ctx: Any) -> None:
        super().__init__(options, ctx)
        self.sent, self.hold = str(options["sent"]), str(options["hold"])

    def invoke(self, request: Any) -> Any:
        Path(f"{self.sent}-{request.run_id}").touch()
        while Path(self.hold).exists():
            time.sleep(0.02)
        return super().invoke(request)


class LazyLossy(Lossy):
    def __init__(self, options: dict[str, Any], ctx: Any) -> None:
        self.answers, self.ctx = str(options["answers"]), ctx

    def invoke(self, request: Any) -> Any:
        self.store = self.ctx.effect_store()
        return super().invoke(request)


ADAPTERS = {
    **LIFECYCLE,
    "test.heldlossy": lambda decl, ctx: HeldLossy(decl.options, ctx),
    "test.lazylossy": lambda decl, ctx: LazyLossy(decl.options, ctx),
}
