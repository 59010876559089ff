"""``noop``: an idempotent step that does nothing; the benchmark's unit of work."""

from __future__ import annotations

from effectlog.adapters.protocol import Receipt, Request


class NoopAdapter:
    blocking = False  # returns at once: called inline, no thread hop
    keeps_descriptors = True  # closes none it did not open (the actor need not look: effectlog.toolguard)

    def invoke(self, request: Request) -> Receipt:
        return Receipt(data={"key": request.idempotency_key})
