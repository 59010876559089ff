"""Names a person cannot tell apart: the same text in another Unicode spelling, or with invisible edges.

Linux keeps a file name, and a journal keeps a run id, as the exact code points it was given, so
``café`` composed (NFC) and decomposed (NFD), ``order-42`` and ``order-42 `` (read with what surrounded
it), or a name with a zero-width space or a byte-order mark in it are two names that every listing,
``status`` and message shows alike. Effectlog refuses to *make* a second such name (a file, a run): the
same run given later under the name meant would run every step again in it. One name already there
is used as it is.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable

NAMEABLE = "printable text without surrounding spaces"


def nameable(text: str) -> bool:
    """A run id or step name a person can give back to the CLI (``--run-id``, ``--step``): a plan's id, or any
    printable text without surrounding spaces (``onboard/42``, ``order 42``, ``café``). A new durable or
    session run takes only these (``new_id_refusal``): a run named otherwise could never be reconciled or
    approved."""
    return text != "" and text.isprintable() and text.strip() == text


def invisible(char: str) -> bool:
    """Whitespace, or a format character (Unicode's ``Cf``: a byte-order mark, a zero-width space, a word
    joiner, a direction mark): nothing a listing or a message shows."""
    return char.isspace() or unicodedata.category(char) == "Cf"


def trimmed(name: str) -> str:
    """``name`` without the whitespace and format characters it begins or ends with."""
    start, end = 0, len(name)
    while start < end and invisible(name[start]):
        start += 1
    while end > start and invisible(name[end - 1]):
        end -= 1
    return name[start:end]


def seen_as(name: str) -> str:
    """``name`` as every listing shows it: its canonical composition (NFC: ``e`` and a combining accent are
    ``é``), without its format characters."""
    if name.isascii():
        return name
    return unicodedata.normalize("NFC", "".join(char for char in name if unicodedata.category(char) != "Cf"))


def twin(name: str, others: Iterable[str]) -> str | None:
    """The first of ``others`` (in sorted order) that is not ``name`` but is shown as ``name`` is, if any."""
    seen = seen_as(name)
    return next((other for other in sorted(others) if other != name and seen_as(other) == seen), None)


def look_alike(text: str, recorded: Callable[[], Iterable[str]]) -> str | None:
    """The first of ``recorded`` (sorted) that is not ``text`` but is shown as it is (``seen_as``, edges of
    whitespace and format characters trimmed), if any. Asked only of a ``text`` that may have one: ASCII
    text without such edges is its only spelling among ids made since they are refused (``new_id_refusal``)."""
    if text.isascii() and trimmed(text) == text:
        return None
    shown = trimmed(seen_as(text))
    return next((other for other in sorted(recorded()) if other != text and trimmed(seen_as(other)) == shown), None)


def new_id_refusal(
    text: str, what: str, recorded: Callable[[], Iterable[str]], *, must_be_nameable: bool = True
) -> str | None:
    """The message for a new ``what`` (a run id, a step key) that an operator could not tell from another,
    else ``None``: it is another spelling of one of ``recorded`` (``look_alike``); or, when
    ``must_be_nameable`` (a run id, which every command that names a run takes), it is not ``nameable``: it
    begins or ends with whitespace or holds a character no listing shows (a control or format character:
    ``order-42\\n``, a zero-width space), or is shown as an ASCII id it is not (the Kelvin sign for
    ``K``). A step key from a model's tool call id may be any text, and is refused only as another spelling
    of a recorded step. Shown with ``ascii()``: the two spellings print alike otherwise."""
    if must_be_nameable and not nameable(text):
        return (
            f"{what} {text!a} begins or ends with whitespace or holds a control or invisible character (read "
            f"with its newline, pasted with a zero-width space?): every listing shows it as "
            f"{trimmed(seen_as(text))!r}, and no command can name it; give it without; nothing was written"
        )
    other = look_alike(text, recorded)
    if other is None and must_be_nameable and not text.isascii() and seen_as(text).isascii():
        other = seen_as(text)
    if other is None:
        return None
    return (
        f"{what} {text!a} is {other!a} in another Unicode spelling (composed against decomposed accents, "
        f"or a look-alike character such as the Kelvin sign), which every listing shows alike, as {other!r}: "
        f"a new {what.split(maxsplit=1)[0]} of this spelling would be apart from that one and make its effects "
        "again; give it as that one is spelled; nothing was written"
    )
