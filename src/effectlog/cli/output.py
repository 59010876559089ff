"""Output helpers shared by the CLI commands: stable JSON and plain tables."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import msgspec

_json = msgspec.json.Encoder(order="sorted")


def emit_json(value: Any) -> None:
    sys.stdout.write(msgspec.json.format(_json.encode(value), indent=2).decode() + "\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
