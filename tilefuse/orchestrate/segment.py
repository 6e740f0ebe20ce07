"""Segments: the pieces of a PrimGraph that are orchestrated one at a time.

A ``Segment`` is a run of consecutive prims of the graph's topological order.  Its ``inputs`` are
the tensors its prims read that are produced outside it (graph inputs, constants, prims of earlier
segments), in order of first use; its ``outputs`` are the prims whose values are read by later
segments or are graph outputs.  Tensors crossing a cut are always materialized, so every segment
is solved on its own and the plans stitch by name.

``split_segments`` works from the front: the next cut is the position, among the next
``caps.max_prims``, outside attention's two contractions (a softmax's probabilities and the
product that reads them on either side would keep the chain family from the pair), leaving no
segment shorter than ``SHORT`` prims where the window allows, where the fewest tensors are live
(see ``crossing``; a value live over more than ``max_prims`` prims, an attention mask every layer
reads, is not counted: it crosses every cut), then outside a normalized operand (between a row
reduction, an RMSNorm's or LayerNorm's, and the contraction reading only what it normalized: the
gemm family reduces such rows in its prologue), then the fewest bytes, then one where the values
made in the segment and read after the cut feed contractions (``_Readers.fed``), then the latest.
If the piece's execution states or convex sets overflow the caps (``TooManyStates``) the window
is halved and the cut chosen again; a single prim always fits, so splitting never fails.
Preferring the latest of equal cuts packs segments full, and on a stack of identical layers the
cuts settle into the same phase of every layer, so the segments repeat and are solved once.

``Segment.canonical_key()`` is a name-free structural key: identical layers give equal keys and
are solved once; a solution of one maps onto the other by position (``candidates.remap``).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Mapping

from ..ir.dtypes import TensorType
from ..ir.prim import Prim, PrimGraph
from .states import DEFAULT_CAPS, Caps, TooManyStates, bits, convex_sets, execution_states, successors


@dataclass(frozen=True, eq=False)
class Segment:
    prims: tuple[Prim, ...]                 # topological order; position = bit in every mask
    inputs: tuple[str, ...]                 # tensors read from outside, in order of first use
    input_types: tuple[TensorType, ...]
    input_is_const: tuple[bool, ...]
    outputs: tuple[str, ...]                # prims read after the segment or graph outputs
    start: int = 0                          # position of prims[0] in the PrimGraph
    states: tuple[int, ...] | None = field(default=None, repr=False)
    convex: frozenset[int] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.prims)

    @cached_property
    def index(self) -> Mapping[str, int]:
        """Prim name -> position."""
        return {p.name: k for k, p in enumerate(self.prims)}

    @cached_property
    def preds(self) -> tuple[int, ...]:
        idx = self.index
        out = []
        for p in self.prims:
            m = 0
            for n in p.inputs:
                if n in idx:
                    m |= 1 << idx[n]
            out.append(m)
        return tuple(out)

    @cached_property
    def succs(self) -> tuple[int, ...]:
        return tuple(successors(self.preds))

    @cached_property
    def out_mask(self) -> int:
        m = 0
        for n in self.outputs:
            m |= 1 << self.index[n]
        return m

    def mask(self, names) -> int:
        """Bitset of the named prims."""
        m = 0
        for n in names:
            m |= 1 << self.index[n]
        return m

    def names(self, mask: int) -> tuple[str, ...]:
        return tuple(self.prims[k].name for k in bits(mask))

    def enumerate(self, caps: Caps = DEFAULT_CAPS) -> tuple[tuple[int, ...], frozenset[int]]:
        """(execution states, convex sets): computed when the segment was made with caps (as
        ``split_segments`` makes them), else now."""
        if self.states is not None and self.convex is not None:
            return self.states, self.convex
        states = tuple(execution_states(self.preds, caps.max_states))
        return states, frozenset(convex_sets(states, caps.max_convex, caps.max_members))

    def canonical_key(self) -> tuple:
        """Name-free structure: prim signatures, input wiring (positions), input types, outputs.

        Equal keys mean the segments are the same computation up to names, so one selection serves
        both (mapped by position).  The key is exact (no hashing collisions); ``digest`` is a short
        stable string of it for caches.
        """
        idx = self.index
        ext = {n: k for k, n in enumerate(self.inputs)}
        prims = tuple(
            (p.signature, tuple(("p", idx[n]) if n in idx else ("x", ext[n]) for n in p.inputs))
            for p in self.prims)
        return (prims, self.input_types, self.input_is_const,
                tuple(idx[n] for n in self.outputs))

    def digest(self) -> str:
        return hashlib.sha256(repr(self.canonical_key()).encode()).hexdigest()[:16]


def make_segment(pg: PrimGraph, lo: int, hi: int, *, caps: Caps | None = None,
                 last_use: Mapping[str, int] | None = None) -> Segment:
    """The segment of prims ``pg.prims[lo:hi]``; with ``caps``, states and convex sets are filled in
    (raising ``TooManyStates`` when they do not fit).  ``last_use``: see ``last_uses``."""
    prims = pg.prims[lo:hi]
    inside = {p.name for p in prims}
    inputs = list(dict.fromkeys(n for p in prims for n in p.inputs if n not in inside))
    last_use = last_uses(pg) if last_use is None else last_use
    outputs = tuple(p.name for p in prims if last_use.get(p.name, -1) >= hi)
    consts = pg.constant_map
    seg = Segment(prims, tuple(inputs), tuple(pg.types[n] for n in inputs),
                  tuple(n in consts for n in inputs), outputs, lo)
    if caps is None:
        return seg
    states = tuple(execution_states(seg.preds, caps.max_states))
    return replace(seg, states=states, convex=frozenset(convex_sets(states, caps.max_convex, caps.max_members)))


def last_uses(pg: PrimGraph) -> dict[str, int]:
    """Tensor name -> position of its last reader; graph outputs are read at ``len(pg.prims)``."""
    last = {}
    for k, p in enumerate(pg.prims):
        for name in p.inputs:
            last[name] = k
    for name in pg.outputs:
        last[name] = len(pg.prims)
    return last


def crossing(pg: PrimGraph, longest: int | None = None) -> tuple[list[int], list[int]]:
    """For each cut k (between prims k-1 and k): how many tensors are live across it, and their bytes.

    A prim's value is live from its producer to its last reader.  Graph inputs and constants count
    from their first reader: cutting across them costs nothing, but counting them keeps the profile
    of a repeated layer the same whether its input is the graph input or the previous layer.
    Graph outputs with no later reader do not count: they are written whatever the cut.  With
    ``longest``, neither do values live over more than that many prims (an attention mask every
    layer reads): they cross whichever cuts a segment of that size makes, so they decide none.
    """
    n = len(pg.prims)
    first: dict[str, int] = {p.name: k for k, p in enumerate(pg.prims)}
    last: dict[str, int] = {}
    for k, p in enumerate(pg.prims):
        for name in p.inputs:
            first.setdefault(name, k)
            last[name] = k
    count = [0] * (n + 1)
    nbytes = [0] * (n + 1)
    for name, j in last.items():
        i = first[name]
        if longest is not None and j - i > longest:
            continue
        size = pg.types[name].nbytes
        count[i + 1] += 1          # live over the cuts i+1..j
        count[j + 1] -= 1
        nbytes[i + 1] += size
        nbytes[j + 1] -= size
    for k in range(1, n + 1):
        count[k] += count[k - 1]
        nbytes[k] += nbytes[k - 1]
    return count, nbytes


def split_segments(pg: PrimGraph, caps: Caps = DEFAULT_CAPS) -> list[Segment]:
    """Cut ``pg`` into segments that fit ``caps`` (see the module docstring)."""
    n = len(pg.prims)
    count, nbytes = crossing(pg, caps.max_prims)
    readers = _Readers(pg)
    last_use = last_uses(pg)
    out: list[Segment] = []
    start = 0
    while start < n:
        span = caps.max_prims
        while True:
            end = n if n - start <= span else _best_cut(start, start + span, count, nbytes, readers)
            try:
                out.append(make_segment(pg, start, end, caps=caps, last_use=last_use))
                break
            except TooManyStates:       # a single prim always fits, so this ends
                span = max(1, (end - start) // 2)
        start = end
    return out


SHORT = 4       # prims: a shorter segment (a transpose on its own) is cut only where no other fits


class _Readers:
    """Which prims read each prim's value, and which prims are contractions (for cut choice)."""

    def __init__(self, pg: PrimGraph):
        from ..analysis.classify import Category, classify
        pos = {p.name: k for k, p in enumerate(pg.prims)}
        self.readers: list[list[int]] = [[] for _ in pg.prims]
        for k, p in enumerate(pg.prims):
            for name in dict.fromkeys(p.inputs):
                if name in pos:
                    self.readers[pos[name]].append(k)
        self.gemm = [classify(p) is Category.contraction for p in pg.prims]
        # attention: the cuts between a contraction and the contraction reading what a softmax (a
        # row max) made of its value; a normalized operand: the cuts between a reduction and the
        # contraction reading what the reduction scaled, with no contraction between, where only
        # contractions read it (a pre-norm projection's input, not a post-norm residual); each as
        # (first, last) of the cut positions
        source, softmax = [-1] * len(pg.prims), [False] * len(pg.prims)
        reduced = [-1] * len(pg.prims)      # the latest reduction since the last contraction
        self.attention: list[tuple[int, int]] = []
        self.normalized: list[tuple[int, int]] = []
        for k, p in enumerate(pg.prims):
            ins = [pos[n] for n in p.inputs if n in pos]
            if self.gemm[k]:
                self.attention += [(source[i] + 1, k) for i in ins if softmax[i] and source[i] >= 0]
                self.normalized += [(reduced[i] + 1, k) for i in ins
                                    if reduced[i] >= 0 and all(self.gemm[r] for r in self.readers[i])]
                source[k] = k
                continue
            source[k] = max((source[i] for i in ins), default=-1)
            reduced[k] = k if p.reduce is not None else max((reduced[i] for i in ins), default=-1)
            softmax[k] = any(softmax[i] for i in ins) or (p.reduce is not None and p.reduce.combiner == "max"
                                                          and source[k] >= 0)

    def fed(self, lo: int, k: int, hi: int) -> bool:
        """Whether every value made in [lo, k) and read after cut k is read there by a
        contraction: a GEMM's or convolution's operand, which it loads from memory anyway.
        Cutting elsewhere (between a GEMM's residual add and its LayerNorm) splits a kernel the
        planner would fuse (a two-phase LayerNorm epilogue).  A value read over more than a
        segment's span (``hi - lo``) after the cut, such as an attention mask every layer reads,
        crosses later cuts anyway and does not count."""
        for j in range(lo, k):
            later = [r for r in self.readers[j] if r >= k]
            if later and max(later) - k <= hi - lo and not any(self.gemm[r] for r in later):
                return False
        return True

    def inside_attention(self, k: int) -> bool:
        """Whether cut ``k`` falls between attention's two contractions (the first before it,
        the one reading the softmax of its value after it): the chain family's kernel needs both."""
        return any(a <= k <= b for a, b in self.attention)

    def inside_normalized(self, k: int) -> bool:
        """Whether cut ``k`` falls between a reduction and the contraction reading what it
        normalized (an RMSNorm before a projection): the gemm family's prologue needs both."""
        return any(a <= k <= b for a, b in self.normalized)


def _best_cut(lo: int, hi: int, count: list[int], nbytes: list[int], readers: _Readers) -> int:
    """The cut in (lo, hi] outside attention's contractions (``_Readers.inside_attention``), not
    leaving a segment shorter than ``SHORT`` where the window allows, with the fewest live
    tensors, then outside a normalized operand (``_Readers.inside_normalized``), then the fewest
    bytes, then one whose values made in the segment all feed contractions after it
    (``_Readers.fed``), then the latest."""
    return min(range(lo + 1, hi + 1), key=lambda k: (readers.inside_attention(k), k - lo < SHORT < hi - lo,
                                                     count[k], readers.inside_normalized(k), nbytes[k],
                                                     not readers.fed(lo, k, hi), -k))
