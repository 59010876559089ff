"""The run page's step diagram: an SVG drawn on the server from specs/step.toml, the step's state marked (issue 15)."""

from __future__ import annotations

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
