"""The plan's primitive graph as Graphviz DOT: one cluster per kernel holding its prims, edges
along the tensors kernels read.  The browser lays it out (Viz.js, ``html.py``)."""
from __future__ import annotations

from .snapshot import PlanSnapshot

# Above this many prim nodes a layout takes seconds and the picture stops being readable, so
# kernels past the budget (plan order) are drawn as one node each, with their prim count.
MAX_PRIM_NODES = 400
LARGE_GRAPH = 150           # nodes above which the layout trades straightness for time

# Fill and border per family, in the registry's order; unknown families cycle through the rest.
_PALETTE = (("#e5e7eb", "#6b7280"), ("#d1fae5", "#059669"), ("#fef3c7", "#d97706"),
            ("#fce7f3", "#db2777"), ("#dbeafe", "#2563eb"), ("#ede9fe", "#7c3aed"), ("#ccfbf1", "#0d9488"))


def family_colours(families: list[str]) -> dict[str, tuple[str, str]]:
    """(fill, stroke) for each family: registered families first, in registry order."""
    from ..families import FAMILIES
    order = list(dict.fromkeys([f.name for f in FAMILIES] + sorted(families)))
    return {f: _PALETTE[k % len(_PALETTE)] for k, f in enumerate(order)}


_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int64": "i64",
          "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8"}


def short_type(t: str) -> str:
    dt, _, shape = t.partition("[")
    return _SHORT.get(dt, dt) + "[" + shape.replace(", ", ",")


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def expanded_count(snap: PlanSnapshot, budget: int | None) -> int:
    """How many kernels, from the first, are drawn with their prims within ``budget`` prim nodes."""
    if budget is None:
        return len(snap.kernels)
    used = 0
    for i, k in enumerate(snap.kernels):
        used += len(k.prims)
        if used > budget:
            return i
    return len(snap.kernels)


def plan_dot(snap: PlanSnapshot, labels: list[str], families: list[str], budget: int | None = MAX_PRIM_NODES) -> str:
    """DOT text of the plan: kernel ``i`` is ``subgraph cluster_k<i>`` (SVG id ``k<i>``, labelled
    ``labels[i]``); its prim nodes have SVG ids ``k<i>-<prim>``, or one node ``k<i>-all`` when
    collapsed (past ``budget`` prim nodes)."""
    colours = family_colours(families)
    prims = {p.name: p for p in snap.prims}
    expand = expanded_count(snap, budget)
    nodes = sum(len(k.prims) for k in snap.kernels[:expand]) + len(snap.kernels) - expand
    # Network-simplex placement dominates the layout of large graphs (BERT-base, 376 nodes: 9 s in
    # the browser); a few passes (nslimit) keep it under a second at a small cost in straightness.
    limit = ", nslimit=2" if nodes > LARGE_GRAPH else ""
    lines = ["digraph plan {",
             f'  graph [rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.2, ranksep=0.3, newrank=true{limit}];',
             '  node [shape=box, style="rounded,filled", fillcolor="#ffffff", color="#9ca3af", fontname="Helvetica", '
             'fontsize=9, height=0.3, margin="0.06,0.03"];',
             '  edge [color="#9ca3af", arrowsize=0.5];']
    inputs = {n for n, _ in snap.graph_inputs}
    for name, t in snap.graph_inputs:
        lines.append(f'  {_q("in/" + name)} [id={_q("in-" + name)}, label={_q(name + chr(10) + short_type(t))}, '
                     f'shape=ellipse, fillcolor="#f3f4f6"];')

    def node(i: int, prim: str) -> str:
        return f"k{i}/{prim}" if i < expand else f"k{i}/*"

    edges: list[tuple[str, str]] = []
    writer: dict[str, int] = {}       # tensor -> the last kernel so far that wrote it
    for i, (k, label, fam) in enumerate(zip(snap.kernels, labels, families)):
        fill, stroke = colours[fam]
        lines.append(f"  subgraph cluster_k{i} {{")
        lines.append(f'    id="k{i}"; class="kernel"; label={_q(label)}; labeljust=l; '
                     f'style="filled,rounded"; fillcolor={_q(fill)}; color={_q(stroke)}; penwidth=1.5;')
        members = set(k.prims)
        if i < expand:
            for pn in k.prims:
                p = prims[pn]
                text = f"{pn} {p.op}\n{short_type(p.type)}"
                lines.append(f'    {_q(node(i, pn))} [id={_q(f"k{i}-{pn}")}, label={_q(text)}];')
                edges += [(node(i, src), node(i, pn)) for src in p.inputs if src in members]
        else:
            text = f"{len(k.prims)} prim{'s' * (len(k.prims) != 1)}"
            lines.append(f'    {_q(node(i, "*"))} [id={_q(f"k{i}-all")}, label={_q(text)}, shape=note];')
        lines.append("  }")
        for t in k.inputs:
            src = "in/" + t if t in inputs else (node(writer[t], t) if t in writer else None)
            if src is None:
                continue       # a weight: not drawn
            readers = [pn for pn in k.prims if t in prims[pn].inputs] if i < expand else ["*"]
            edges += [(src, node(i, pn)) for pn in readers]
        for t in k.outputs:
            writer[t] = i
    for t in dict.fromkeys(snap.outputs):
        if t in writer:
            lines.append(f'  {_q("out/" + t)} [id={_q("out-" + t)}, label={_q("output " + t)}, shape=ellipse, '
                         f'fillcolor="#f3f4f6"];')
            edges.append((node(writer[t], t), "out/" + t))
    lines += [f"  {_q(a)} -> {_q(b)};" for a, b in dict.fromkeys(edges)]
    lines.append("}")
    return "\n".join(lines) + "\n"
