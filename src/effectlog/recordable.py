"""Can a tool's answer be recorded? The journal stores canonical JSON; anything else is refused
before a batch is built, with the type and place that could not be encoded.

The actor asks this of every receipt *before* it records the step's result, so an
unencodable answer never reaches ``events.encode`` half-way through a commit.
"""

from __future__ import annotations

from typing import Any

import msgspec

from effectlog.canonical import canonical_json, encode_sorted
from effectlog.errors import BadInput, printable

_MAX_DEPTH = 256  # deeper than this, the encoder itself would give up


def why_unrecordable(value: Any, where: str = "result") -> str | None:
    """``None`` if ``value`` encodes as canonical JSON; else what in it does not, and where."""
    return as_recorded(value, where)[1]


_decoder = msgspec.json.Decoder()
_encode = encode_sorted  # canonical JSON's encoder itself (sorted keys, the same bytes)


def as_recorded(value: Any, where: str = "result") -> tuple[Any, str | None]:
    """``(value as the journal gives it back, None)`` from ONE reading of ``value``, or ``(None, what in it
    does not encode, and where)``.

    A tool's answer may answer anew each time it is read (a field read through a property, a dict a
    thread of the tool still edits): the event, a checkpoint segment and the live state are all taken
    from this one reading, so they never disagree with each other (``verify``) and a second reading
    that raises cannot lose the answer after it was checked."""
    try:  # (``canonical_json``'s encode, inline: once per tool call; its checks below when they can apply)
        data: bytes | None = _encode(value)
    except (Exception, RecursionError):
        data = None
    # no NaN or infinity can hide in it: canonical as is (``find``, not ``in``: see ``canonical_json``)
    if data is not None and data.find(b"null") < 0:
        return _decoder.decode(data), None
    try:
        data = canonical_json(value, where)
    except BadInput as exc:  # a NaN or an infinity, or nested too deep: the walk names a cycle more precisely
        return None, _walked(value, where) or exc.message
    except (Exception, RecursionError) as exc:  # TypeError, UnicodeEncodeError, OverflowError, msgspec's, a user's
        return None, _walked(value, where) or f"{where}: {type(exc).__name__}: {' '.join(printable(exc).split())}"
    return _decoder.decode(data), None


def _walked(value: Any, where: str) -> str | None:
    """``_first_problem``, or None when the walk itself raises: it reads the value again (a key's ``str()``,
    a set's order, a ``repr``), and a hostile value may raise there too. What raised is the reading of the
    tool's answer, not the tool: escaping from here, it was recorded as the tool's own exception."""
    try:
        return _first_problem(value, where, set(), 0)
    except (Exception, RecursionError):
        return None


def _kind(value: Any) -> str:
    return type(value).__qualname__


def _first_problem(value: Any, where: str, path: set[int], depth: int) -> str | None:
    if depth > _MAX_DEPTH:
        return f"{where}: nested deeper than {_MAX_DEPTH} levels"
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"{where}: a str with a lone surrogate (character {exc.start})"
        return None
    if value is None or isinstance(value, bool | int | float | bytes):
        return None
    if id(value) in path:
        return f"{where}: a self-referencing {_kind(value)}"
    if isinstance(value, dict):
        path.add(id(value))
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{where}: a dict key of type {_kind(key)} ({key!r:.40}); only str keys can be recorded"
            found = _first_problem(key, f"{where} key", path, depth + 1) or _first_problem(
                item, f"{where}.{key}", path, depth + 1
            )
            if found:
                return found
        path.discard(id(value))
        return None
    if isinstance(value, list | tuple):
        path.add(id(value))
        for i, item in enumerate(value):
            found = _first_problem(item, f"{where}[{i}]", path, depth + 1)
            if found:
                return found
        path.discard(id(value))
        return None
    if isinstance(value, set | frozenset):
        kinds = sorted({_kind(item) for item in value})
        try:
            sorted(value)
        except TypeError:
            return f"{where}: a {_kind(value)} mixing {' and '.join(kinds)} (it has no canonical order)"
        for item in value:
            found = _first_problem(item, f"{where}[...]", path, depth + 1)
            if found:
                return found
        return None
    try:
        canonical_json(value)
    except (Exception, RecursionError):
        return f"{where}: a value of type {_kind(value)}"
    return None
