"""The report's persistent kernels (issue #25): per run, its phases, tasks and how each phase waits
for the one before, and the simulated timeline of its tasks per SM as inline SVG (a Gantt chart).

The timeline is the schedule the cost model simulated (``cost/persistent.schedule``), redrawn from
the phases the report records: MODELLED, never measured.
"""
from __future__ import annotations

import html

from ..cost.persistent import Phase, schedule

W, ROW, LEFT, TOP, BOTTOM = 720, 2, 54, 8, 34
# phases alternate through these fills (a phase's tasks share one)
FILLS = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f")


def _e(s) -> str:
    return html.escape(str(s), quote=True)


def timeline(row: dict) -> list:
    """The simulated tasks of a report's persistent row (``cost/persistent.Task``, seconds)."""
    phases = [Phase(p["tasks"], p["task_us"] * 1e-6, p["warm_us"] * 1e-6 if "warm_us" in p else None,
                    p.get("prefetch_bytes", 0), tuple((q, b) for q, b in p.get("prefetch_for", ())),
                    p.get("dram_bytes", 0), p.get("fetched_bytes", 0), solo_rate=p.get("solo_rate", 0.0),
                    after=tuple(p["after"]) if "after" in p else None,
                    needs=tuple(tuple(u for a, b in runs for u in range(a, b + 1)) for runs in p.get("needs", ())))
              for p in row["phases"]]
    return schedule(phases, row["programs"], row["atomic_us"] * 1e-6, row.get("dram_rate", 0.0))


def gantt_svg(row: dict) -> str:
    """Tasks per SM against time; back-to-back tasks of one phase on one SM drawn as one bar."""
    tasks = timeline(row)
    end = max((t.end for t in tasks), default=0.0) or 1.0
    programs = row["programs"]
    height = TOP + programs * ROW + BOTTOM
    scale = (W - LEFT - 10) / end
    bars: dict[tuple, list] = {}             # (worker, phase) -> merged [start, end] intervals
    for t in tasks:
        runs = bars.setdefault((t.worker, t.phase), [])
        if runs and t.start - runs[-1][1] <= 1e-12 + row["atomic_us"] * 1e-6:
            runs[-1][1] = t.end
        else:
            runs.append([t.start, t.end])
    names = [p["kernel"] for p in row["phases"]]
    out = [f'<svg class="gantt" viewBox="0 0 {W} {height}" width="{W}" height="{height}" '
           f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="simulated schedule of the persistent kernel '
           f'at #{row["first"]}">']
    for (worker, phase), runs in sorted(bars.items()):
        for a, b in runs:
            out.append(f'<rect x="{LEFT + a * scale:.1f}" y="{TOP + worker * ROW}" width="{max((b - a) * scale, 0.5):.1f}" '
                       f'height="{ROW}" fill="{FILLS[phase % len(FILLS)]}"><title>phase {phase}: {_e(names[phase])}'
                       f'</title></rect>')
    axis = TOP + programs * ROW
    out.append(f'<line x1="{LEFT}" y1="{axis}" x2="{W - 10}" y2="{axis}" stroke="#555"/>')
    for k in range(5):
        x, us = LEFT + k * (W - LEFT - 10) / 4, end * 1e6 * k / 4
        anchor = "end" if k == 4 else "middle"
        out.append(f'<text x="{x:.1f}" y="{axis + 14}" font-size="10" text-anchor="{anchor}">{us:.1f} µs</text>')
    out.append(f'<text x="4" y="{TOP + 10}" font-size="10">SM 0</text>'
               f'<text x="4" y="{axis - 2}" font-size="10">SM {programs - 1}</text>'
               f'<text x="{(W + LEFT) / 2:.0f}" y="{axis + 30}" font-size="10" text-anchor="middle">'
               f'simulated time (modelled)</text></svg>')
    return "".join(out)


def persistent_section(report) -> str:
    """The section's HTML: a table of the candidate runs and, per run launched as one, its phases and
    its simulated timeline; empty without persistent kernels."""
    if not report.persistent:
        return ""
    rows = "".join(
        f'<tr><td class="num">#{r["first"]}–#{r["first"] + len(r["kernels"]) - 1}</td>'
        f'<td class="num">{len(r["phases"])}</td><td class="num">{r["tasks"]:,}</td>'
        f'<td class="num">{r["programs"]}</td><td class="num">{r["apart_us"]:.1f}</td>'
        f'<td class="num">{r["persistent_us"]:.1f}</td><td>{"yes" if r["launched_as_one"] else "no"}</td></tr>'
        for r in report.persistent)
    parts = ['<p class="note">Runs of consecutive generated kernels that can be the phases of one persistent '
             'kernel: its programs (one per SM) take tasks (one per program of every phase) from a counter; a '
             'phase waits for the phase before it (a phase barrier). Times are MODELLED: the kernels launched one '
             'by one, and the simulated schedule of the persistent kernel.</p>',
             '<table class="kernels"><thead><tr><th>kernels</th><th>phases</th><th>tasks</th><th>programs</th>'
             '<th>apart µs</th><th>persistent µs</th><th>one launch</th></tr></thead><tbody>' + rows + '</tbody></table>']
    for r in report.persistent:
        if not r["launched_as_one"]:
            continue
        kinds = sorted({e["kind"] for e in r["edges"]})
        phases = "".join(f'<li><span class="swatch" style="background:{FILLS[p % len(FILLS)]}"></span>'
                         f'{_e(ph["kernel"])}: {ph["tasks"]} tasks × {ph["task_us"]:.3g} µs</li>'
                         for p, ph in enumerate(r["phases"]))
        parts.append(f'<h3>persistent kernel at #{r["first"]}: {len(r["phases"])} phases, '
                     f'{_e(", ".join(kinds) or "no edge")}</h3><div class="roofwrap">{gantt_svg(r)}</div>'
                     f'<details><summary>phases</summary><ol start="0">{phases}</ol></details>')
    return "\n".join(parts)
