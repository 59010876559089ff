"""The console's step diagram: an SVG drawn on the server from specs/step.toml, the step's state marked (issue 15)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from effectlog.console.diagram import svg
from effectlog.diagrams import _edges
from effectlog.spec import load

NS = {"svg": "http://www.w3.org/2000/svg"}
STEP = load("step")


def parsed(current: str | None) -> ET.Element:
    return ET.fromstring(str(svg("step", current, ident="charge")))


@pytest.mark.parametrize("current", STEP.states)
def test_the_svgs_states_are_the_specs_states_and_only_the_current_one_is_marked(current: str) -> None:
    """Every state of specs/step.toml is drawn once, named as in the spec, in the spec's order; the
    step's current state (and no other) has class ``current`` and ``aria-current``."""
    root = parsed(current)
    groups = root.findall("svg:g[@data-state]", NS)
    marked = [g.get("data-state") for g in groups if "current" in (g.get("class") or "").split()]
    aria = [g.get("data-state") for g in groups if g.get("aria-current") == "step"]

    assert list(STEP.states) == [g.get("data-state") for g in groups]
    assert list(STEP.states) == [g.findtext("svg:text", namespaces=NS) for g in groups]
    assert ([current], [current]) == (marked, aria)


def test_every_transition_of_the_spec_is_an_arrow_with_its_trigger() -> None:
    """Each (source, destination) pair the spec allows is one arrow, and its label names every
    trigger between them: the same edges the docs' Mermaid diagram is drawn from."""
    root = parsed(None)
    drawn = {
        (g.get("data-from"), g.get("data-to")): g.findtext("svg:title", namespaces=NS) or ""
        for g in root.findall("svg:g[@data-from]", NS)
    }
    expected: dict[tuple[str, str], set[str]] = {}
    for source, dest, label in _edges(STEP):
        expected.setdefault((source, dest), set()).add(label.split(" ")[0])

    assert sorted(expected) == sorted(drawn)
    assert [] == [pair for pair, triggers in expected.items() if not all(t in drawn[pair] for t in triggers)]


def test_terminal_states_are_drawn_as_terminal_and_no_state_is_marked_without_a_current_one() -> None:
    """The spec's terminal states carry class ``terminal``; with no current state nothing is marked."""
    root = parsed(None)
    groups = root.findall("svg:g[@data-state]", NS)

    assert sorted(STEP.terminal) == sorted(g.get("data-state") for g in groups if "terminal" in g.get("class", ""))
    assert [] == [g for g in groups if "current" in g.get("class", "")]


def test_names_in_the_svg_are_escaped_and_arrowheads_of_two_diagrams_do_not_share_an_id() -> None:
    """A step id with markup goes into the diagram only escaped; two diagrams on one page use different
    marker ids, so a hidden one never takes the other's arrowheads with it."""
    one = str(svg("step", "pending", ident="<script>x</script>", title="<script>x</script>"))
    two = str(svg("step", "pending", ident="other"))
    marker = one.split('<marker id="')[1].split('"', maxsplit=1)[0]

    assert "<script>" not in one
    assert marker not in two


@pytest.mark.parametrize("current", STEP.states)
def test_the_arrows_leaving_the_current_state_are_marked_as_what_can_happen_next(current: str) -> None:
    """The arrows with class ``next`` are exactly the spec's transitions out of the current state
    (to another state): for an uncertain step, reconcile to reconciled or back to pending."""
    root = parsed(current)
    marked = {
        (g.get("data-from"), g.get("data-to"))
        for g in root.findall("svg:g[@data-from]", NS)
        if "next" in (g.get("class") or "").split()
    }
    expected = {(s, d) for s, d, _ in _edges(STEP) if s == current and d != current}

    assert expected == marked
    if current == "uncertain":
        assert {("uncertain", "reconciled"), ("uncertain", "pending")} == marked


def _runs(d: str) -> list[tuple[float, float, float, float]]:
    """The straight runs of a path made of M, H and V commands, as (x1, y1, x2, y2)."""
    runs, x, y = [], 0.0, 0.0
    for op, value in re.findall(r"([MHV])([-\d.,]+)", d):
        if op == "M":
            x, y = (float(v) for v in value.split(","))
            continue
        nx, ny = (float(value), y) if op == "H" else (x, float(value))
        runs.append((x, y, nx, ny))
        x, y = nx, ny
    return runs


def _boxes(root: ET.Element) -> dict[str, tuple[float, float, float, float]]:
    found = {}
    for g in root.findall("svg:g[@data-state]", NS):
        rect = g.find("svg:rect", NS)
        assert rect is not None
        x, y, w, h = (float(rect.get(k, "0")) for k in ("x", "y", "width", "height"))
        found[g.get("data-state", "")] = (x, y, x + w, y + h)
    return found


def test_no_long_arrow_runs_through_a_box_or_along_another_arrows_run() -> None:
    """The arrows that skip columns or lead back run in lanes and gaps: none of their straight runs
    passes through a state's box other than its own two ends, and no two of them share a
    horizontal lane (which made the labels pile up on each other)."""
    root = parsed(None)
    boxes = _boxes(root)
    through, lanes = [], []
    for g in root.findall("svg:g[@data-from]", NS):
        path = g.find("svg:path", NS)
        d = path.get("d", "") if path is not None else ""
        if path is None or "C" in d:  # straight lines between neighbours and curves are drawn otherwise
            continue
        ends = {g.get("data-from"), g.get("data-to")}
        for x1, y1, x2, y2 in _runs(d):
            if y1 == y2 and abs(x2 - x1) > 1:
                lanes.append(round(y1, 3))
            for state, (bx1, by1, bx2, by2) in boxes.items():
                inside = min(x1, x2) < bx2 and max(x1, x2) > bx1 and min(y1, y2) < by2 and max(y1, y2) > by1
                if inside and state not in ends:
                    through.append((g.get("data-from"), g.get("data-to"), state))
    horizontal_long = [y for y in lanes if y < min(b[1] for b in boxes.values())]  # the lanes above the boxes
    assert ([], len(horizontal_long)) == (through, len(set(horizontal_long)))
    assert len(horizontal_long) >= 5  # the step machine has that many arrows skipping columns


@pytest.mark.parametrize("current", STEP.states)
def test_with_a_state_marked_only_the_arrows_that_can_happen_next_are_loud(current: str) -> None:
    """Every arrow not leaving the current state is ``quiet`` (faint, its label in its tooltip), so the
    step's possible next moves read at a glance; they are drawn after the boxes, labels on top."""
    root = parsed(current)
    children = list(root)
    arrows = root.findall("svg:g[@data-from]", NS)
    loud = [g for g in arrows if "quiet" not in (g.get("class") or "").split()]
    last_box = max(i for i, el in enumerate(children) if el.get("data-state") is not None)

    assert all("next" in (g.get("class") or "").split() for g in loud)
    assert all(children.index(g) > last_box for g in loud)
    assert len(arrows) - len(loud) == len([g for g in arrows if "quiet" in (g.get("class") or "")])
