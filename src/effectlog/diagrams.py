"""State diagrams (Mermaid or Graphviz dot) drawn from the specs, and only from them."""

from __future__ import annotations

from typing import Literal

from effectlog.spec import MachineSpec, load

Format = Literal["mermaid", "dot"]


def _edges(spec: MachineSpec) -> list[tuple[str, str, str]]:
    edges: list[tuple[str, str, str]] = []
    for t in spec.transitions:
        actor = f" ({t.actor})" if t.actor else ""
        if t.internal:  # keeps the state it fires in: a loop on each source
            edges.extend((source, source, f"{t.trigger} / {t.event}{actor}") for source in t.source)
            continue
        for value, dest in t.destinations().items():
            guard = f" [{t.by}={value}]" if t.by else ""
            for source in t.source:
                edges.append((source, dest, f"{t.trigger}{guard} / {t.event}{actor}"))
    return edges


def mermaid(spec: MachineSpec) -> str:
    lines = ["---", f"title: {spec.name} machine (generated from specs/{spec.name}.toml)", "---", "stateDiagram-v2"]
    lines.append(f"    [*] --> {spec.initial}")
    for source, dest, label in _edges(spec):
        lines.append(f"    {source} --> {dest}: {label}")
    lines.extend(f"    {state} --> [*]" for state in spec.terminal)
    return "\n".join(lines) + "\n"


def dot(spec: MachineSpec) -> str:
    lines = [f'digraph "{spec.name}" {{', "    rankdir=LR;", '    __start [shape=point, label=""];']
    for state in spec.states:
        shape = "doublecircle" if state in spec.terminal else "circle"
        lines.append(f'    "{state}" [shape={shape}];')
    lines.append(f'    __start -> "{spec.initial}";')
    for source, dest, label in _edges(spec):
        lines.append(f'    "{source}" -> "{dest}" [label="{label}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(machine: str, fmt: Format = "mermaid") -> str:
    spec = load(machine)
    return mermaid(spec) if fmt == "mermaid" else dot(spec)
