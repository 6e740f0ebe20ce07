"""Welder's tile graph: propagate an output tile back through a group of prims; memory traffic.

Given the tile of a group's output (a range per output axis) and optional reduction chunks
(``rstep``), every prim's input tile follows from its index maps (``analysis.index.input_boxes``),
processed from the outputs back to the inputs with boxes of shared tensors united.  Tensors read
from outside the group are loaded from DRAM once per tile; tiles of intermediates stay on chip.
Traffic = per-tile loads + stores, times the number of tiles (Welder §3, ``MemTraffic``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..analysis.index import Interval, box_shape, input_boxes
from ..ir.dtypes import TensorType
from ..ir.prim import Prim


@dataclass(frozen=True)
class TilePlan:
    boxes: Mapping[str, tuple[Interval, ...]]   # every tensor the group touches -> its tile
    tiles: int                                   # how many output tiles cover the output
    load_bytes: int                              # per tile, from DRAM
    store_bytes: int                             # per tile, to DRAM

    @property
    def traffic(self) -> int:
        return (self.load_bytes + self.store_bytes) * self.tiles

    def shape(self, name: str) -> tuple[int, ...]:
        return box_shape(self.boxes[name])


def _union(a: Sequence[Interval] | None, b: Sequence[Interval]) -> tuple[Interval, ...]:
    if a is None:
        return tuple(b)
    return tuple((min(x[0], y[0]), max(x[1], y[1])) for x, y in zip(a, b))


def propagate(prims: Sequence[Prim], types: Mapping[str, TensorType], output: str,
              tile: Sequence[int], rstep: Mapping[str, Sequence[int]] | None = None) -> TilePlan:
    """Tiles of every tensor when ``output`` is computed in tiles of shape ``tile`` (first tile).

    ``rstep[prim]`` chunks that prim's reduction axes (Welder's reduction-axis tiles); by default
    a reduction reads its whole reduced extent per tile.
    """
    members = {p.name: p for p in prims}
    out_t = types[output]
    boxes: dict[str, tuple[Interval, ...]] = {output: tuple((0, t - 1) for t in tile)}
    for p in reversed(prims):
        if p.name not in boxes:
            continue
        ranges = dict(zip(p.axes, boxes[p.name]))
        if p.reduce is not None:
            steps = (rstep or {}).get(p.name, p.reduce.extents)
            ranges.update((v, (0, s - 1)) for v, s in zip(p.reduce.axes, steps))
        shapes = [types[n].shape for n in p.inputs]
        for slot, box in input_boxes(p, ranges, shapes).items():
            name = p.inputs[slot]
            boxes[name] = _union(boxes.get(name), box)
    tiles = math.prod(-(-n // t) for n, t in zip(out_t.shape, tile))
    loads = sum(math.prod(box_shape(b)) * types[n].dtype.itemsize for n, b in boxes.items() if n not in members)
    store = math.prod(tile) * out_t.dtype.itemsize
    return TilePlan(boxes, tiles, loads, store)
