"""The HTML report of a plan: one self-contained file (styles, script, data and the Graphviz
layout engine inline; nothing loaded over the network).

The page shows the primitive graph with each kernel as a coloured cluster (laid out in the
browser by Viz.js, Graphviz compiled to WebAssembly, vendored in ``vendor/``), a panel with the
clicked kernel's prims, source operators, schedule, costs and generated source, a table of kernels
sortable by any column, the three strategies side by side, the persistent kernels with their
simulated timelines (``gantt.py``) and a roofline chart (inline SVG).
Output is deterministic: the same plan gives byte-identical HTML (compile times are left out).
"""
from __future__ import annotations

import html
import json
import re
from importlib import resources
from pathlib import Path

from .gantt import persistent_section
from .graph import MAX_PRIM_NODES, expanded_count, family_colours, plan_dot
from .roofchart import Point, plottable, roofline_svg, si
from .snapshot import PlanSnapshot

VIZ_JS = "viz-global.js"       # @viz-js/viz 3.31.0 (Graphviz 16.1.0), see vendor/README.md
VIZ_NOTICE = ("Graph layout: Viz.js 3.31.0 (MIT, Copyright (c) 2023 Michael Daines), containing Graphviz 16.1.0 "
              "(Eclipse Public License 1.0, source at graphviz.org) and Expat (MIT); licence texts ship with "
              "tilefuse in tilefuse/report/vendor/.")
STRATEGY_ORDER = ("unfused", "greedy", "optimal")
_SLOT = re.compile(r"\{\{([A-Z_]+)\}\}")


def _asset(*parts: str) -> str:
    return resources.files(__package__).joinpath(*parts).read_text(encoding="utf-8")


def _e(s) -> str:
    return html.escape(str(s), quote=True)


def _json_for_script(data) -> str:
    """JSON that cannot end or confuse the <script> element holding it."""
    s = json.dumps(data, ensure_ascii=True, sort_keys=False, separators=(",", ":"))
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _us(v: float) -> str:
    return f"{v:,.3f}" if v >= 0.1 or v == 0 else f"{v:.3g}"     # a roofline bound may be 0.0004 µs


def _points(report) -> list[Point]:
    return [Point(i, k.name, k.family, k.flops, k.bytes, k.est_us * 1e-6, k.measured_us is not None)
            for i, k in enumerate(report.kernels)]


def _kernel_data(report, snap: PlanSnapshot) -> list[dict]:
    prims = {p.name: p for p in snap.prims}
    out = []
    for i, (k, v, p) in enumerate(zip(report.kernels, snap.kernels, _points(report))):
        ops = list(dict.fromkeys((prims[n].op, prims[n].node, prims[n].location) for n in v.prims))
        out.append({
            "index": i, "name": k.name, "family": k.family,
            "prims": [[n, prims[n].op, prims[n].node, prims[n].category, prims[n].type] for n in v.prims],
            "ops": [list(o) for o in ops],
            "inputs": list(v.inputs), "outputs": list(v.outputs),
            "schedule": v.schedule, "grid": k.grid, "warps": k.warps, "waves": k.waves, "occupancy": k.occupancy,
            "time_us": k.est_us, "measured_us": k.measured_us, "bytes": k.bytes, "l2_bytes": k.l2_bytes,
            "flops": k.flops, "bound": k.bound,
            "intensity": round(p.intensity, 4) if k.bytes else None,
            "attained": si(p.attained, "FLOP/s") if plottable(p) else None,
            "language": v.language, "source": v.source, "native": k.native,
        })
    return out


def _summary(report) -> str:
    measured = sum(k.measured_us is not None for k in report.kernels)
    solver = report.solver
    rows = [
        ("target", report.target), ("strategy", report.strategy), ("backend", report.backend),
        ("operators / prims / kernels", f"{report.num_ops} / {report.num_prims} / {report.num_kernels}"),
        ("total time (modelled)" if not measured else "total time (measured where measured)",
         f"{_us(report.est_total_us)} µs"),
        ("roofline bound (modelled)", f"{_us(report.roofline_us)} µs"),
        ("DRAM traffic (modelled) / compulsory", f"{report.traffic_bytes:,} B / {report.compulsory_bytes:,} B"),
        ("launches", "CUDA-graph nodes" if report.launch == "cuda_graph" else "one launch per kernel"),
        ("solver", f"{solver.get('status', '?')}, {solver.get('num_segments', '?')} segments, "
                   f"{solver.get('num_candidates', '?')} candidates"),
    ]
    if report.memory:
        rows.append(("intermediates arena / unplanned", f"{report.memory.get('intermediate_peak_bytes', 0):,} B / "
                                                         f"{report.memory.get('intermediate_total_bytes', 0):,} B"))
    return "\n".join(f"<tr><th>{_e(a)}</th><td>{_e(b)}</td></tr>" for a, b in rows)


def _provenance(report) -> str:
    measured = sum(k.measured_us is not None for k in report.kernels)
    text = (f"Times are <b>modelled</b> by tilefuse's analytic cost model for the {_e(report.target)} target "
            f"(docs/cost-model.md), not measured, unless marked <span class='badge measured'>measured</span>. "
            f"Bytes (DRAM and L2 traffic), flops, grid, warps, waves and the dominant bound are always the "
            f"model's. ")
    if measured:
        text += (f"{measured} of {len(report.kernels)} kernels were <b>measured</b> on the device with CUDA events "
                 f"(compile(measure=True)); their time is the measured one.")
    else:
        text += "No kernel was measured: compile with measure=True on the target GPU to measure them."
    return text


def _strategies(report) -> str:
    strategies = [(s, report.strategies[s]) for s in STRATEGY_ORDER if s in report.strategies]
    strategies += [(s, v) for s, v in report.strategies.items() if s not in STRATEGY_ORDER]
    worst = max([v["est_total_us"] for _, v in strategies] + [1e-9])
    base = report.strategies.get("unfused", {}).get("est_total_us")
    timed = "time (measured where measured)" if report.measurement else "time (modelled)"
    cards = []
    for s, v in strategies:
        chosen = " chosen" if s == report.strategy else ""
        speed = f"{base / v['est_total_us']:.2f}× vs unfused" if base and v["est_total_us"] else ""
        cards.append(
            f'<div class="strategy{chosen}" data-strategy="{_e(s)}"><h3>{_e(s)}{" (this plan)" if chosen else ""}</h3>'
            f'<div class="bar"><div style="width:{100 * v["est_total_us"] / worst:.1f}%"></div></div>'
            f'<table><tr><th>kernels</th><td class="num">{int(v["num_kernels"])}</td></tr>'
            f'<tr><th>{timed}</th><td class="num">{_us(v["est_total_us"])} µs</td></tr>'
            + (f'<tr><th>DRAM traffic (modelled)</th><td class="num">{int(v["traffic_bytes"]):,} B</td></tr>'
               if "traffic_bytes" in v else "")
            + f'<tr><th>speed-up</th><td class="num">{_e(speed)}</td></tr></table></div>')
    return "\n".join(cards)


def _apart(report) -> str:
    """Why adjacent kernels are apart (``CompiledModel.why_apart``), when asked for."""
    if not report.apart:
        return ""
    rows = "".join(f'<tr><td class="num">#{a["producer"]} → #{a["consumer"]}</td><td>{_e(a["tensor"])}</td>'
                   f'<td>{_e(a["reason"])}</td><td>{_e(a["detail"])}</td></tr>' for a in report.apart)
    return ('<div class="apart"><h3>why these kernels are not one</h3><table><thead><tr><th>kernels</th>'
            '<th>tensor</th><th>reason</th><th>detail (times modelled)</th></tr></thead><tbody>'
            + rows + "</tbody></table></div>")


# (header, sort type, cell value, cell text) per column of the kernel table.
_COLUMNS = (
    ("#", "num", lambda i, k: i, lambda i, k: str(i)),
    ("kernel", "str", lambda i, k: k.name, lambda i, k: k.name),
    ("family", "str", lambda i, k: k.family, lambda i, k: k.family),
    ("prims", "num", lambda i, k: len(k.prims), lambda i, k: str(len(k.prims))),
    ("time µs", "num", lambda i, k: k.est_us, lambda i, k: _us(k.est_us)),
    ("measured µs", "num", lambda i, k: -1 if k.measured_us is None else k.measured_us,
     lambda i, k: "—" if k.measured_us is None else _us(k.measured_us)),
    ("DRAM bytes", "num", lambda i, k: k.bytes, lambda i, k: f"{k.bytes:,}"),
    ("flops", "num", lambda i, k: k.flops, lambda i, k: f"{k.flops:,}"),
    ("flops/B", "num", lambda i, k: round(k.flops / k.bytes, 4) if k.bytes else 0,
     lambda i, k: f"{k.flops / k.bytes:.3g}" if k.bytes else "—"),
    ("bound", "str", lambda i, k: k.bound, lambda i, k: k.bound),
    ("grid", "num", lambda i, k: k.grid, lambda i, k: f"{k.grid:,}"),
    ("warps", "num", lambda i, k: k.warps, lambda i, k: str(k.warps)),
)


def _table(report, colours) -> str:
    head = "".join(f'<th data-sort="{t}" data-col="{c}" title="click to sort">{_e(h)}</th>'
                   for c, (h, t, _, _) in enumerate(_COLUMNS))
    rows = []
    for i, k in enumerate(report.kernels):
        cells = "".join(f'<td data-v="{_e(val(i, k))}"{" class=num" if t == "num" else ""}>{_e(txt(i, k))}</td>'
                        for _, t, val, txt in _COLUMNS)
        rows.append(f'<tr data-k="{i}" style="--fam:{colours[k.family][1]}">{cells}</tr>')
    return f"<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody>"


def _legend(families, colours) -> str:
    return " ".join(f'<span class="swatch" style="background:{colours[f][0]};border-color:{colours[f][1]}"></span>'
                    f"{_e(f)}" for f in dict.fromkeys(sorted(families)))


def render_html(report, snap: PlanSnapshot) -> str:
    """The page for a report and the snapshot of its plan (``snapshot.snapshot``)."""
    families = [k.family for k in report.kernels]
    colours = family_colours(families)
    labels = [f"#{i} {k.name} · {_us(k.est_us)} µs" for i, k in enumerate(report.kernels)]
    expand = expanded_count(snap, MAX_PRIM_NODES)
    collapsed = len(snap.kernels) - expand
    data = {
        "kernels": _kernel_data(report, snap),
        "dot": plan_dot(snap, labels, families, MAX_PRIM_NODES),
        "dot_full": plan_dot(snap, labels, families, None) if collapsed else None,
    }
    graph_note = ("Each kernel is a cluster of the prims it computes; arrows are the tensors kernels pass. "
                  "Click a kernel (or a row of the table, or a point of the roofline) for its details.")
    if collapsed:
        graph_note += (f" For a readable layout, prims are drawn for the first {expand} kernels only; the other "
                       f"{collapsed} are one node each with their prim count.")
    fill = {
        "TITLE": _e(f"tilefuse plan: {report.num_kernels} kernels on {report.target}"),
        "HEADING": _e(f"tilefuse plan — {report.target}, {report.strategy}: {report.num_kernels} kernels, "
                      f"{_us(report.est_total_us)} µs"),
        "PROVENANCE": _provenance(report),
        "SUMMARY": _summary(report),
        "STRATEGIES": _strategies(report) + _apart(report),
        "GRAPH_NOTE": _e(graph_note),
        "SHOW_ALL": "" if collapsed else " hidden",
        "LEGEND": _legend(families, colours),
        "TABLE": _table(report, colours),
        "PERSISTENT": persistent_section(report),
        "PERSISTENT_HIDDEN": "" if report.persistent else " hidden",
        "ROOFLINE": roofline_svg(_points(report), snap.roofs, colours),
        "ROOFLINE_NOTE": _e(_roofline_note(report)),
        "VIZ_NOTICE": _e(VIZ_NOTICE),
        "CSS": _asset("assets", "page.css"),
        "DATA": _json_for_script(data),
        "VIZ": _asset("vendor", VIZ_JS),
        "JS": _asset("assets", "page.js"),
    }
    # Split the template once, so text put into one slot (a kernel's source) is never read as a slot.
    parts = _SLOT.split(_asset("assets", "page.html"))
    parts[1::2] = [fill[key] for key in parts[1::2]]
    return "".join(parts)


def _roofline_note(report) -> str:
    skipped = [k.name for k in report.kernels if not (k.flops > 0 and k.bytes > 0 and k.est_us > 0)]
    note = ("Intensity: the kernel's flops over its DRAM bytes (both modelled); throughput: its flops over its "
            "time (modelled, or measured where measured). Roofs: the target's peak DRAM bandwidth and the "
            "vendor's peak FLOP/s of the units the model charges (cost/target.py).")
    if skipped:
        note += f" Not plotted (no arithmetic or no DRAM traffic): {', '.join(skipped)}."
    return note


def write_html(report, path) -> Path:
    """Write ``report``'s page to ``path``; the report must come from ``tilefuse.compile``."""
    from .report import ReportError
    snap = getattr(report, "_snapshot", None)
    if snap is None:
        raise ReportError("this report has no plan to draw (it was not made by tilefuse.compile or "
                          "compile_onnx); compile the model to get one with .report.to_html(path)")
    page = render_html(report, snap)
    path = Path(path)
    try:
        path.write_text(page, encoding="utf-8")
    except OSError as e:
        raise ReportError(f"cannot write the HTML report to {path}: {e.strerror or e}; "
                          f"give a path in an existing, writable folder") from None
    return path
