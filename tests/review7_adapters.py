"""Adapters for tests/test_review_round7.py, named by ``--adapters review7_adapters:ADAPTERS``.

``test.heldlossy`` is ``test.lossy`` (lifecycle_adapters.py: an idempotent tool that makes its
effect in the effect store once per key and loses its answer unless ``answers`` exists) that
first says it was called (a file ``<sent>-<run id>``) and holds while ``hold`` exists, so a
test can kill the process, or release two processes at once, with the key in hand.
``test.ownstorelossy`` is ``test.lossy`` keeping its keys in an effect store it opens itself (its
``store`` option), not the run's: the run pins no store, as a run recorded before stores were pinned.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from effectlog.adapters.effects import EffectStore
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


class OwnStoreLossy(Lossy):
    def __init__(self, options: dict[str, Any], ctx: Any) -> None:
        self.answers, self.store = str(options["answers"]), EffectStore(str(options["store"]))


ADAPTERS = {
    **LIFECYCLE,
    "test.heldlossy": lambda decl, ctx: HeldLossy(decl.options, ctx),
    "test.ownstorelossy": lambda decl, ctx: OwnStoreLossy(decl.options, ctx),
}
