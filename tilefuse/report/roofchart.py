"""The roofline chart as inline SVG: each kernel's arithmetic intensity (flops per DRAM byte)
against its attained throughput (flops per second of its time), log-log, under the target's DRAM
roof and compute ceilings.  Drawn in Python so the page needs no script for it."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .snapshot import Roofs

W, H = 720, 440
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 20, 50


@dataclass(frozen=True)
class Point:
    index: int
    name: str
    family: str
    flops: int
    bytes: int
    seconds: float
    measured: bool

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def attained(self) -> float:
        return self.flops / self.seconds


def plottable(p: Point) -> bool:
    return p.flops > 0 and p.bytes > 0 and p.seconds > 0


def si(v: float, unit: str) -> str:
    """``1.5e12, "FLOP/s"`` -> ``"1.5 TFLOP/s"``."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= scale:
            return f"{v / scale:.4g} {prefix}{unit}"
    return f"{v:.4g} {unit}"


def _decade(e: int) -> str:
    return f"{10.0 ** e:g}" if -3 <= e <= 3 else f"1e{e}"


def roofline_svg(points: list[Point], roofs: Roofs, colours: dict[str, tuple[str, str]]) -> str:
    pts = [p for p in points if plottable(p)]
    bw = roofs.dram_bw
    ridges = [peak / bw for _, peak in roofs.ceilings]
    top = max(peak for _, peak in roofs.ceilings)
    xlo = math.floor(math.log10(min([p.intensity for p in pts] + [min(ridges) / 100])))
    xhi = math.ceil(math.log10(max([p.intensity for p in pts] + [max(ridges) * 10])))
    ylo = math.floor(math.log10(min([p.attained for p in pts] + [10.0 ** xlo * bw])))
    yhi = math.ceil(math.log10(top * 1.5))
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def x(v: float) -> float:
        return LEFT + (math.log10(v) - xlo) / (xhi - xlo) * pw

    def y(v: float) -> float:
        return TOP + (yhi - math.log10(v)) / (yhi - ylo) * ph

    out = [f'<svg id="roofline" xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="Helvetica, Arial, sans-serif" font-size="11">',
           f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#ffffff" stroke="#d1d5db"/>']
    for e in range(xlo, xhi + 1):          # decades: grid lines and labels
        out.append(f'<line x1="{x(10.0 ** e):.1f}" y1="{TOP}" x2="{x(10.0 ** e):.1f}" y2="{TOP + ph}" stroke="#f3f4f6"/>')
        out.append(f'<text x="{x(10.0 ** e):.1f}" y="{TOP + ph + 15}" text-anchor="middle">{_decade(e)}</text>')
    for e in range(ylo, yhi + 1):
        out.append(f'<line x1="{LEFT}" y1="{y(10.0 ** e):.1f}" x2="{LEFT + pw}" y2="{y(10.0 ** e):.1f}" stroke="#f3f4f6"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(10.0 ** e) + 4:.1f}" text-anchor="end">{si(10.0 ** e, "")}</text>')
    out.append(f'<text x="{LEFT + pw / 2:.1f}" y="{H - 10}" text-anchor="middle">'
               f'arithmetic intensity (flops / DRAM byte, modelled)</text>')
    out.append(f'<text transform="translate(14 {TOP + ph / 2:.1f}) rotate(-90)" text-anchor="middle">'
               f'attained FLOP/s (flops / kernel time)</text>')
    # The DRAM roof up to the highest ceiling's ridge, then each ceiling from its own ridge.
    x0 = 10.0 ** xlo
    out.append(f'<polyline class="roof" points="{x(x0):.1f},{y(x0 * bw):.1f} {x(top / bw):.1f},{y(top):.1f}" '
               f'fill="none" stroke="#111827" stroke-width="2"/>')
    angle = -math.degrees(math.atan2(y(x0) - y(x0 * 10), x(x0 * 10) - x(x0)))
    out.append(f'<text x="{x(x0 * 1.5):.1f}" y="{y(x0 * 1.5 * bw) - 6:.1f}" '
               f'transform="rotate({angle:.1f} {x(x0 * 1.5):.1f} {y(x0 * 1.5 * bw) - 6:.1f})">'
               f'DRAM {si(bw, "B/s")}</text>')
    for k, (label, peak) in enumerate(roofs.ceilings):
        dash = "" if k == 0 else ' stroke-dasharray="6 3"'
        out.append(f'<line class="roof" x1="{x(peak / bw):.1f}" y1="{y(peak):.1f}" x2="{LEFT + pw}" y2="{y(peak):.1f}" '
                   f'stroke="#111827" stroke-width="{2 if k == 0 else 1.2}"{dash}/>')
        out.append(f'<text x="{LEFT + pw - 4}" y="{y(peak) - 5:.1f}" text-anchor="end">'
                   f'{_esc(label)}: {si(peak, "FLOP/s")}</text>')
    for p in sorted(pts, key=lambda p: p.index):
        fill, stroke = colours[p.family]
        kind = "measured" if p.measured else "modelled"
        title = (f"#{p.index} {p.name} ({p.family}): {p.intensity:.3g} flops/B, {si(p.attained, 'FLOP/s')} "
                 f"in {p.seconds * 1e6:.3f} µs {kind}")
        out.append(f'<circle class="pt" data-k="{p.index}" cx="{x(p.intensity):.1f}" cy="{y(p.attained):.1f}" r="5.5" '
                   f'fill="{stroke}" fill-opacity="0.75" stroke="#111827" stroke-width="0.8">'
                   f'<title>{_esc(title)}</title></circle>')
    for j, fam in enumerate(sorted({p.family for p in pts})):    # legend, top left: above the DRAM roof
        fill, stroke = colours[fam]
        out.append(f'<circle cx="{LEFT + 14}" cy="{TOP + 14 + 16 * j}" r="5" fill="{stroke}" fill-opacity="0.75" '
                   f'stroke="#111827" stroke-width="0.8"/><text x="{LEFT + 24}" y="{TOP + 18 + 16 * j}">{_esc(fam)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
