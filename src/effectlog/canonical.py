"""Canonical JSON and digests: the same value always gives the same bytes.

Hashes (the journal chain, plan digests, argument digests, idempotency keys) are
computed over these bytes, so the encoder is built once with sorted keys.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import msgspec

from effectlog.errors import BadInput


def _plain(value: Any) -> Any:
    """A str, int or float subclass (``numpy.float64``, ``numpy.str_``, ``markupsafe.Markup``, a user's
    ``class Cents(int)``), which msgspec refuses, as the plain value it holds, read through the base type's
    own slot (never the subclass's ``__str__``/``__int__``/``__float__``, which may say anything)."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    raise TypeError(f"Encoding objects of type {type(value).__qualname__} is unsupported")


# Called only for types msgspec cannot encode itself: every value it could encode before keeps its bytes.
_encoder = msgspec.json.Encoder(order="sorted", enc_hook=_plain)
# The encoder's own method, for a hot path that makes ``canonical_json``'s checks itself (no frame).
encode_sorted = _encoder.encode


def canonical_json(value: Any, where: str = "value") -> bytes:
    """Compact JSON with sorted object keys (struct fields sorted too).

    A value nested deeper than the encoder goes is ``BadInput`` too. NaN and the infinities are refused
    (``BadInput`` naming the place under ``where``): the encoder
    writes each as ``null``, so their bytes, digests and records would be ``None``'s. Only an encoding
    holding a ``null`` can hide one, so the walk is skipped for nearly every value."""
    try:
        data = _encoder.encode(value)
    except RecursionError:
        raise BadInput(f"{where}: nested too deep to encode (JSON here goes about 1,000 levels down)") from None
    except UnicodeEncodeError:  # a str with a lone surrogate (os.fsdecode of a non-UTF-8 name, a "\ud800" escape)
        raise BadInput(_lone_surrogate(value, where)) from None
    # (``data.find``, not ``in``: ``bytes.__contains__`` first tries the needle as an int, and for bytes
    # formats a TypeError it then drops, about 2k instructions each time: twice per step)
    if data.find(b"null") >= 0 and _may_hold_non_finite(value):
        problem = non_finite(value, where)
        if problem is not None:
            raise BadInput(problem)
    return data


# In msgpack a float is 0xcb and its 8 big-endian IEEE bytes; NaN and the infinities (and only they,
# besides bytes inside other values) have an exponent of all ones: 0x7ff or 0xfff, then 0xf or more.
_MSGPACK_NON_FINITE = re.compile(rb"\xcb[\x7f\xff][\xf0-\xff]")
_msgpack = msgspec.msgpack.Encoder()


def _may_hold_non_finite(value: Any) -> bool:
    """False only if ``value`` surely holds no NaN or infinity: its msgpack form has no float with an
    all-ones exponent. One C encode and one C search (a 700 KB model request body: ~1.5 ms against ~20
    ms for the walk); a hit (or a value msgpack cannot encode) sends it to the walk, which decides."""
    try:
        return _MSGPACK_NON_FINITE.search(_msgpack.encode(value)) is not None
    except (Exception, RecursionError):
        return True


def trusted_json(value: Any) -> bytes:
    """``canonical_json`` without the NaN walk, for values whose floats were checked where they were
    made (a ``Plan``'s pinned form: ``Plan.digest`` checks the plan's own values first). A 66k-step
    plan's pinned form holds nulls (``retry``, ``timeout_s``), and walking it costs 40x encoding it."""
    return _encoder.encode(value)


def digest(value: Any, where: str = "value") -> str:
    """``sha256`` hex digest of the canonical JSON of ``value``."""
    try:  # (``canonical_json``, inline: a step's args digest; its checks when the encoding has a null or fails)
        data: bytes | None = _encoder.encode(value)
    except (Exception, RecursionError):
        data = None
    if data is None or data.find(b"null") >= 0:
        data = canonical_json(value, where)
    return hashlib.sha256(data).hexdigest()


def digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def non_finite(value: Any, where: str = "value") -> str | None:
    """Where ``value`` holds a NaN or an infinity (``where.key[i]: nan is not a finite number ...``), or None."""
    try:
        plain = msgspec.to_builtins(value)  # structs, dataclasses, enums: as the encoder sees them
    except (Exception, RecursionError):
        plain = value
    return _non_finite(plain, where)


def _non_finite(value: Any, where: str) -> str | None:
    """Depth first, in order, with no depth limit and no recursion: the encoder goes down to Python's
    recursion limit (~1000 levels), so a NaN below a cut-off of the walk's would be written as null
    unseen. The path is spelled out only for the value found (``_path``)."""
    stack: list[tuple[Any, Any]] = [(value, None)]  # (a value, its place: (its parent's place, key or index))
    pop, push = stack.pop, stack.append
    while stack:
        item, place = pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return (
                    f"{_path(where, place)}: {item!r} is not a finite number; JSON has no NaN or infinity "
                    "(it would be recorded as null, the same as None)"
                )
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                push((child, (place, str(key))))
        elif isinstance(item, list | tuple | set | frozenset):
            children = item if isinstance(item, list | tuple) else list(item)
            for i in range(len(children) - 1, -1, -1):
                push((children[i], (place, i)))
    return None


def _lone_surrogate(value: Any, where: str) -> str:
    """Where ``value`` holds a str (a dict key included) that UTF-8 cannot hold, said in one line."""
    try:
        plain = msgspec.to_builtins(value)
    except (Exception, RecursionError):
        plain = value
    stack: list[tuple[Any, Any]] = [(plain, None)]
    while stack:
        item, place = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return (
                    f"{_path(where, place)}: a str with a lone surrogate (character {exc.start}), which UTF-8 "
                    "cannot hold (a name decoded from bytes that are not UTF-8?)"
                )
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                stack.append((child, (place, str(key).encode("utf-8", "backslashreplace").decode())))
                stack.append((key, (place, "(a key)")))
        elif isinstance(item, list | tuple | set | frozenset):
            children = item if isinstance(item, list | tuple) else list(item)
            stack.extend((children[i], (place, i)) for i in range(len(children) - 1, -1, -1))
    return f"{where}: a str with a lone surrogate, which UTF-8 cannot hold"


def _path(where: str, place: Any) -> str:
    """``where.key[i]...`` for a place of ``_non_finite``'s walk."""
    parts: list[str] = []
    while place is not None:
        place, part = place
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
    return where + "".join(reversed(parts))
