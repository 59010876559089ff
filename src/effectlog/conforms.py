"""``isinstance`` against a runtime-checkable Protocol, answered once per class.

On Python 3.11 such a check walks the protocol's members on every call (~10-20 µs), and every run's
runtime, resume and re-run asks whether its journal seals and checkpoints (four checks per fleet run
were 11% of its instructions). Journals declare these methods on their class, so the answer is the
class's.
"""

from __future__ import annotations

_ANSWERS: dict[tuple[type, type], bool] = {}


def conforms(obj: object, protocol: type) -> bool:
    """``isinstance(obj, protocol)`` for a runtime-checkable ``protocol``, cached by ``type(obj)``."""
    key = (type(obj), protocol)
    known = _ANSWERS.get(key)
    if known is None:
        known = _ANSWERS[key] = isinstance(obj, protocol)
    return known
