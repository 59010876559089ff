"""A machine from ``specs/`` drawn as SVG on the server, one state marked: the run page's step diagrams.

The states and arrows come from ``effectlog.spec`` (the same tables the fold checks and
``effectlog.diagrams`` draws the docs' diagrams from); nothing here lists a state. The
layout is plain: each state goes in the column of its longest path from the initial
state (arrows that lead back are left out of that count), top to bottom within a column.
Arrows between neighbouring columns are straight lines; an arrow that skips columns runs
up to a lane of its own above the boxes and down into its destination (by the gap beside
it when a box sits above); one that leads back over columns runs in a lane below them; a
transition that keeps its state is a small loop. With a step's state marked, only the
arrows leaving it are drawn loud and labelled; the others are faint, their triggers in
their tooltips. No script, no external asset.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import cache
from typing import NamedTuple

from markupsafe import Markup, escape

from effectlog.spec import MachineSpec, load

BOX_W, BOX_H = 130, 34
COL_W, ROW_H = 200, 80
MARGIN = 20
LANE = 10  # between two arrows' horizontal runs, above the boxes (forward) or below them (back)
CHANNEL = 8  # between two arrows' vertical runs down a gap between columns, into a lower box's left side


def _edges(spec: MachineSpec) -> dict[tuple[str, str], list[str]]:
    """Triggers per (source, destination), in the spec's order."""
    found: dict[tuple[str, str], list[str]] = {}
    for t in spec.transitions:
        for source in t.source:
            for value, dest in t.destinations_from(source).items():
                label = f"{t.trigger} [{value}]" if value is not None else t.trigger
                found.setdefault((source, dest), []).append(label)
    return found


class _Route(NamedTuple):
    """Where one arrow runs: ``lane`` is its horizontal run's index (above the boxes for an arrow
    that skips a column, below them for one that leads back over more than one column), ``exit``
    and ``entry`` its share of the source's and the destination's edge, ``channel`` the index
    of its vertical run down the gap left of a destination below the first row (-1: enters
    from above)."""

    lane: int = -1
    exit: float = 0.5
    entry: float = 0.5
    channel: int = -1


def _spread(pairs: list[tuple[str, str]], key: Callable[[tuple[str, str]], str]) -> dict[tuple[str, str], float]:
    """Each arrow's share (0..1) of the edge it leaves or enters by, evenly apart for the arrows sharing one."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for pair in pairs:
        groups.setdefault(key(pair), []).append(pair)
    return {pair: (i + 1) / (len(group) + 1) for group in groups.values() for i, pair in enumerate(group)}


@cache
def _layout(
    name: str,
) -> tuple[MachineSpec, dict[str, tuple[int, int]], frozenset[tuple[str, str]], dict[tuple[str, str], _Route]]:
    """Each state's (column, row), the arrows that lead back, and how the long arrows run."""
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
    return spec, place, frozenset(back), _routes(edges, place, frozenset(back))


def _routes(
    edges: dict[tuple[str, str], list[str]], place: dict[str, tuple[int, int]], back: frozenset[tuple[str, str]]
) -> dict[tuple[str, str], _Route]:
    """Lanes, exits, entries and channels, so that no two long arrows share a run and no label sits on another."""

    def span(pair: tuple[str, str]) -> int:
        return abs(place[pair[1]][0] - place[pair[0]][0])

    # The shorter an arrow, the nearer its lane to the boxes: fewer crossings.
    over = sorted(
        (p for p in edges if p[0] != p[1] and p not in back and span(p) > 1),
        key=lambda p: (span(p), place[p[0]][0], place[p[1]][1]),
    )
    under = sorted((p for p in edges if p in back and span(p) > 1), key=span)
    # A box's top edge is shared by the arrows leaving it upwards and those entering it from above;
    # a box below the first row is left by its right edge, into the gap (a box sits above it).
    top_ends = [(p, p[0]) for p in over if place[p[0]][1] == 0] + [(p, p[1]) for p in over if place[p[1]][1] == 0]
    share = _spread([(f"{p[0]}>{p[1]}", box) for p, box in top_ends], lambda end: end[1])
    exits = {p: share.get((f"{p[0]}>{p[1]}", p[0]), 0.5) for p in over}
    entries = {p: share.get((f"{p[0]}>{p[1]}", p[1]), 0.5) for p in over}
    side_exits = [p for p in over if place[p[0]][1] > 0]
    exits.update(_spread(side_exits, lambda p: p[0]))
    from_left = sorted((p for p in over if place[p[1]][1] > 0), key=lambda p: -over.index(p))
    entries.update(_spread(from_left, lambda p: p[1]))
    channels: dict[tuple[str, str], int] = {}
    for pair in from_left:  # the outer lanes take the outer channels: their runs do not cross
        column = place[pair[1]][0]
        channels[pair] = sum(1 for other in channels if place[other[1]][0] == column)
    routes = {p: _Route(i, exits[p], entries[p], channels.get(p, -1)) for i, p in enumerate(over)}
    under_exits = _spread(under, lambda p: p[0])
    under_entries = _spread(under, lambda p: p[1])
    routes.update({p: _Route(i, under_exits[p], under_entries[p]) for i, p in enumerate(under)})
    return routes


def svg(name: str, current: str | None = None, *, title: str = "", ident: str = "") -> Markup:
    """The machine ``name`` as an SVG element, ``current`` (if given) marked ``class="state current"``
    and the arrows leaving it ``class="arrow next"`` (what can happen to the step next).

    With a current state the other arrows are ``quiet``: drawn faint, their labels in their
    tooltips only, so what can happen next reads at a glance; without one every label shows.
    ``ident`` tells apart several diagrams on one page (their arrowheads' ids).
    """
    spec, place, back, routes = _layout(name)
    marker = "arrow-" + hashlib.sha256(f"{name}/{ident}".encode()).hexdigest()[:12]
    cols = 1 + max(c for c, _ in place.values())
    rows = 1 + max(r for _, r in place.values())
    over = sum(1 for p, r in routes.items() if p not in back)
    under = len(routes) - over
    top = MARGIN + 24 + over * LANE  # the first row's top edge: the forward lanes above it
    bottom = top + (rows - 1) * ROW_H + BOX_H  # the last row's bottom edge: the back lanes below it
    width, height = MARGIN * 2 + (cols - 1) * COL_W + BOX_W, bottom + 30 + under * LANE + MARGIN
    geometry = _Geometry(place, top, bottom)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="machine" data-machine="{escape(name)}"'
        f' viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img">',
        f"<title>{escape(title or f'the {name} machine (generated from specs/{name}.toml)')}</title>",
        f'<defs><marker id="{marker}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7"'
        ' orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#667"/></marker></defs>',
    ]
    nexts: list[str] = []
    for (source, dest), labels in _edges(spec).items():
        pair = (source, dest)
        drawn = _arrow(pair, ", ".join(labels), geometry, back=pair in back, route=routes.get(pair))
        ends = f'data-from="{escape(source)}" data-to="{escape(dest)}"'
        drawn = drawn.replace("url(#arrow)", f"url(#{marker})").replace("<g ", f"<g {ends} ", 1)
        if source == current and dest != current:  # what can happen next: drawn last, on top, in colour
            nexts.append(drawn.replace('class="arrow', 'class="arrow next', 1))
        elif current is not None:
            parts.append(drawn.replace('class="arrow', 'class="arrow quiet', 1))
        else:
            parts.append(drawn)
    for state in spec.states:
        x, y = geometry.centre(state)
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
    parts.extend(nexts)  # after the boxes: their labels are never hidden behind one
    parts.append("</svg>")
    return Markup("".join(parts))  # noqa: S704  # every name and label in it went through escape()


class _Geometry(NamedTuple):
    place: dict[str, tuple[int, int]]
    top: float  # the first row's top edge
    bottom: float  # the last row's bottom edge

    def centre(self, state: str) -> tuple[float, float]:
        col, row = self.place[state]
        return MARGIN + col * COL_W + BOX_W / 2, self.top + row * ROW_H + BOX_H / 2


def _group(kind: str, text: Markup, path: str, label: str) -> str:
    return f'<g class="{kind}"><title>{text}</title><path d="{path}" fill="none" marker-end="url(#arrow)"/>{label}</g>'


def _arrow(pair: tuple[str, str], label: str, at: _Geometry, *, back: bool, route: _Route | None) -> str:
    source, dest = pair
    (x1, y1), (x2, y2) = at.centre(source), at.centre(dest)
    text = escape(label)
    if source == dest:  # a transition that keeps its state: a small loop under the box
        low = y1 + BOX_H / 2
        return _group(
            "arrow loop",
            text,
            f"M{x1 - 18},{low} C{x1 - 26},{low + 24} {x1 + 26},{low + 24} {x1 + 18},{low}",
            f'<text x="{x1}" y="{low + 30}" text-anchor="middle">{text}</text>',
        )
    if route is not None and back:  # leads back over columns: down, along a lane under the boxes, up
        sx, ex = x1 - BOX_W / 2 + route.exit * BOX_W, x2 - BOX_W / 2 + route.entry * BOX_W
        sy, ey, lane = y1 + BOX_H / 2, y2 + BOX_H / 2, at.bottom + 24 + route.lane * LANE
        return _group(
            "arrow back",
            text,
            f"M{sx},{sy} V{lane} H{ex} V{ey}",
            f'<text x="{(sx + ex) / 2}" y="{lane - 3}" text-anchor="middle">{text}</text>',
        )
    if route is not None:  # skips a column: up, along a lane above the boxes, into the destination
        lane = at.top - 14 - route.lane * LANE
        if at.place[source][1] == 0:  # up from the source's top edge
            sx, sy = x1 - BOX_W / 2 + route.exit * BOX_W, y1 - BOX_H / 2
            path = f"M{sx},{sy} V{lane}"
        else:  # out of its right edge and up the gap beside it
            sx, sy = x1 + BOX_W / 2 + 8 + route.exit * (COL_W - BOX_W - 16), y1 - BOX_H / 2 + route.exit * BOX_H
            path = f"M{x1 + BOX_W / 2},{sy} H{sx} V{lane}"
        if route.channel < 0:  # into the destination's top edge
            ex = x2 - BOX_W / 2 + route.entry * BOX_W
            path += f" H{ex} V{y2 - BOX_H / 2}"
        else:  # down the gap left of it, into its left edge
            gap = x2 - BOX_W / 2 - 10 - route.channel * CHANNEL
            ey = y2 - BOX_H / 2 + route.entry * BOX_H
            path += f" H{gap} V{ey} H{x2 - BOX_W / 2}"
        return _group("arrow over", text, path, f'<text x="{sx + 6}" y="{lane - 3}" text-anchor="start">{text}</text>')
    if back:  # leads back to the next column: a curve below the boxes
        sx, sy, ex, ey = x1 - BOX_W / 4, y1 + BOX_H / 2, x2 + BOX_W / 4, y2 + BOX_H / 2  # clear of the loops
        low = max(sy, ey) + 34
        return _group(
            "arrow back",
            text,
            f"M{sx},{sy} C{sx},{low} {ex},{low} {ex},{ey}",
            f'<text x="{(sx + ex) / 2}" y="{0.125 * (sy + ey) + 0.75 * low + 12}" text-anchor="middle">{text}</text>',
        )
    sx = x1 + BOX_W / 2 if x2 > x1 else x1
    ex = x2 - BOX_W / 2 if x2 > x1 else x2
    sy = y1 if x2 > x1 else y1 + (BOX_H / 2 if y2 > y1 else -BOX_H / 2)
    ey = y2 if x2 > x1 else y2 + (-BOX_H / 2 if y2 > y1 else BOX_H / 2)
    return (
        f'<g class="arrow"><title>{text}</title><line x1="{sx}" y1="{sy}" x2="{ex}" y2="{ey}"'
        f' marker-end="url(#arrow)"/>'
        f'<text x="{(sx + ex) / 2}" y="{(sy + ey) / 2 - 4}" text-anchor="middle">{text}</text></g>'
    )
