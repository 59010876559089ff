"""A machine from ``specs/`` drawn as SVG on the server, one state marked: the run page's step diagrams.

The states and arrows come from ``effectlog.spec`` (the same tables the fold checks and
``effectlog.diagrams`` draws the docs' diagrams from); nothing here lists a state. The
layout is plain: each state goes in the column of its longest path from the initial
state (arrows that lead back are left out of that count), top to bottom within a column;
arrows are straight lines labelled with their triggers, those that lead back curve below,
a transition that keeps its state is a small loop. No script, no external asset.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import cache

from markupsafe import Markup, escape

from effectlog.spec import MachineSpec, load

BOX_W, BOX_H = 130, 34
COL_W, ROW_H = 200, 80
MARGIN = 20
ARC_ROOM = 110  # above the boxes, for the arrows that skip a column


def _edges(spec: MachineSpec) -> dict[tuple[str, str], list[str]]:
    """Triggers per (source, destination), in the spec's order."""
    found: dict[tuple[str, str], list[str]] = {}
    for t in spec.transitions:
        for source in t.source:
            for value, dest in t.destinations_from(source).items():
                label = f"{t.trigger} [{value}]" if value is not None else t.trigger
                found.setdefault((source, dest), []).append(label)
    return found


@cache
def _layout(name: str) -> tuple[MachineSpec, dict[str, tuple[int, int]], frozenset[tuple[str, str]]]:
    """Each state's (column, row), and the arrows that lead back (drawn curved)."""
    spec = load(name)
    edges = _edges(spec)
    nexts: dict[str, list[str]] = {s: [] for s in spec.states}
    for source, dest in edges:
        if source != dest:
            nexts[source].append(dest)
    back: set[tuple[str, str]] = set()
    on_path: set[str] = set()
    seen: set[str] = set()

    def walk(state: str) -> None:  # depth first: an arrow to a state on the current path leads back
        seen.add(state)
        on_path.add(state)
        for dest in nexts[state]:
            if dest in on_path:
                back.add((state, dest))
            elif dest not in seen:
                walk(dest)
        on_path.discard(state)

    walk(spec.initial)
    for state in spec.states:
        if state not in seen:
            walk(state)
    column = dict.fromkeys(spec.states, 0)
    for _ in spec.states:  # longest path over the forward arrows (a DAG): at most len(states) rounds
        for (source, dest), _labels in edges.items():
            if source != dest and (source, dest) not in back:
                column[dest] = max(column[dest], column[source] + 1)
    rows: dict[int, int] = {}
    place: dict[str, tuple[int, int]] = {}
    for state in spec.states:
        col = column[state]
        place[state] = (col, rows.get(col, 0))
        rows[col] = rows.get(col, 0) + 1
    return spec, place, frozenset(back)


def svg(name: str, current: str | None = None, *, title: str = "", ident: str = "") -> Markup:
    """The machine ``name`` as an SVG element, ``current`` (if given) marked ``class="state current"``
    and the arrows leaving it ``class="arrow next"`` (what can happen to the step next).

    ``ident`` tells apart several diagrams on one page (their arrowheads' ids).
    """
    spec, place, back = _layout(name)
    marker = "arrow-" + hashlib.sha256(f"{name}/{ident}".encode()).hexdigest()[:12]
    cols = 1 + max(c for c, _ in place.values())
    rows = 1 + max(r for _, r in place.values())
    width, height = MARGIN * 2 + (cols - 1) * COL_W + BOX_W, MARGIN * 2 + ARC_ROOM + rows * ROW_H + 20

    def centre(state: str) -> tuple[float, float]:
        col, row = place[state]
        return MARGIN + col * COL_W + BOX_W / 2, MARGIN + ARC_ROOM + row * ROW_H + BOX_H / 2

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="machine" data-machine="{escape(name)}"'
        f' viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">',
        f"<title>{escape(title or f'the {name} machine (generated from specs/{name}.toml)')}</title>",
        f'<defs><marker id="{marker}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7"'
        ' orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#667"/></marker></defs>',
    ]
    nexts: list[str] = []
    for (source, dest), labels in _edges(spec).items():
        drawn = _arrow(source, dest, ", ".join(labels), centre, back=(source, dest) in back, height=height)
        ends = f'data-from="{escape(source)}" data-to="{escape(dest)}"'
        drawn = drawn.replace("url(#arrow)", f"url(#{marker})").replace("<g ", f"<g {ends} ", 1)
        if source == current and dest != current:  # what can happen next: drawn last, on top, in colour
            nexts.append(drawn.replace('class="arrow', 'class="arrow next', 1))
        else:
            parts.append(drawn)
    parts.extend(nexts)
    for state in spec.states:
        x, y = centre(state)
        classes = ["state"]
        if state == current:
            classes.append("current")
        if state in spec.terminal:
            classes.append("terminal")
        if state == spec.initial:
            classes.append("initial")
        mark = ' aria-current="step"' if state == current else ""
        parts.append(
            f'<g class="{" ".join(classes)}" data-state="{escape(state)}"{mark}>'
            f'<rect x="{x - BOX_W / 2}" y="{y - BOX_H / 2}" width="{BOX_W}" height="{BOX_H}" rx="8"/>'
            f'<text x="{x}" y="{y + 5}" text-anchor="middle">{escape(state)}</text></g>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704  # every name and label in it went through escape()


def _arrow(
    source: str, dest: str, label: str, centre: Callable[[str], tuple[float, float]], *, back: bool, height: float
) -> str:
    (x1, y1), (x2, y2) = centre(source), centre(dest)
    text = escape(label)
    if source == dest:  # a transition that keeps its state: a loop above the box
        top = y1 - BOX_H / 2
        return (
            f'<g class="arrow loop"><title>{text}</title><path d="M{x1 - 20},{top} C{x1 - 30},{top - 28} '
            f'{x1 + 30},{top - 28} {x1 + 20},{top}" fill="none" marker-end="url(#arrow)"/>'
            f'<text x="{x1}" y="{top - 24}" text-anchor="middle">{text}</text></g>'
        )
    if back:  # leads back to an earlier column: a curve below the boxes, the longer the lower
        sx, sy, ex, ey = x1, y1 + BOX_H / 2, x2, y2 + BOX_H / 2
        low = max(sy, ey) + 30 + abs(x1 - x2) / COL_W * 22
        return (
            f'<g class="arrow back"><title>{text}</title><path d="M{sx},{sy} C{sx},{low} {ex},{low} {ex},{ey}"'
            f' fill="none" marker-end="url(#arrow)"/>'
            f'<text x="{(sx + ex) / 2}" y="{0.125 * (sy + ey) + 0.75 * low + 12}" text-anchor="middle">'
            f"{text}</text></g>"
        )
    span = round(abs(x2 - x1) / COL_W)
    if span > 1:  # skips a column: an arc above the boxes, the longer the higher
        sx, sy, ex, ey = x1 + 12, y1 - BOX_H / 2, x2 - 12, y2 - BOX_H / 2
        high = MARGIN + ARC_ROOM - 10 - span * (ARC_ROOM - 30) / 5
        return (
            f'<g class="arrow over"><title>{text}</title><path d="M{sx},{sy} C{sx},{high} {ex},{high} {ex},{ey}"'
            f' fill="none" marker-end="url(#arrow)"/>'
            f'<text x="{(sx + ex) / 2}" y="{0.25 * (sy + ey) / 2 + 0.75 * high - 2}" text-anchor="middle">{text}</text>'
            "</g>"
        )
    sx = x1 + BOX_W / 2 if x2 > x1 else x1
    ex = x2 - BOX_W / 2 if x2 > x1 else x2
    sy = y1 if x2 > x1 else y1 + (BOX_H / 2 if y2 > y1 else -BOX_H / 2)
    ey = y2 if x2 > x1 else y2 + (-BOX_H / 2 if y2 > y1 else BOX_H / 2)
    at = 0.5 if abs(x2 - x1) <= COL_W else 0.3  # a long arrow's label near its start, clear of the others
    return (
        f'<g class="arrow"><title>{text}</title><line x1="{sx}" y1="{sy}" x2="{ex}" y2="{ey}"'
        f' marker-end="url(#arrow)"/>'
        f'<text x="{sx + (ex - sx) * at}" y="{sy + (ey - sy) * at - 4}" text-anchor="middle">{text}</text></g>'
    )
