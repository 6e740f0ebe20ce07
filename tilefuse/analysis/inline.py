"""Inlining a group of prims into expressions over one anchor's iteration space (Welder's tile
graph, composed through every layout prim).

``Inliner(group).value_at(anchor, vars)`` is the anchor's value at ``vars``: every member prim
that is not a reduction is substituted into its consumers through its index map, so layout prims
become index arithmetic on loads; each use of a member reduction becomes an ``Instance`` (the
reduction's own body at the index where it is used, one value per row) referenced in expressions
as ``Load(instance slot, ())``.  The anchor is any member and its variables any ``Var``s: the fused
family anchors on its largest output; a GEMM accumulator or an attention tile can be the anchor of
a prologue/epilogue the same way.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..ir.dtypes import DType
from ..ir.expr import Const, Expr, Load, Value, Var
from ..ir.prim import Prim


@dataclass(frozen=True)
class Instance:
    """One use of a member reduction: its body at a row-dependent index, reduced per row."""
    slot: int                     # referenced in kernel expressions as Value(slot, dtype)
    prim: str
    index: tuple[Expr, ...]       # where the reduction's output is read, over anchor row vars
    body: Expr                    # over row vars and ``rvars``; loads use kernel input slots/instances
    rvars: tuple[Var, ...]
    rext: tuple[int, ...]
    combiner: str
    dtype: DType


class Inliner:
    """Values of a group's members as kernel-level expressions: loads read kernel input slots
    (``inputs`` order) or reduction instances (slots after the inputs, in dependency order)."""

    def __init__(self, members: Mapping[str, Prim], inputs: Sequence[str]):
        self.member = members
        self.nin = len(inputs)
        self.in_slot = {n: k for k, n in enumerate(inputs)}
        self.instances: list[Instance] = []
        self.inst_key: dict[tuple, int] = {}
        self.pending: set[tuple] = set()        # instances whose bodies are being inlined
        self.refs: dict[str, list[tuple[Expr, ...]]] = {}   # member -> indices it was used at
        self.memo: dict[tuple, Expr] = {}

    def value_at(self, name: str, idx: tuple[Expr, ...]) -> Expr:
        key = (name, idx)
        got = self.memo.get(key)
        if got is not None:
            return got
        p = self.member[name]
        self.refs.setdefault(name, []).append(idx)
        if p.reduce is not None:
            out = self._instance(p, idx)
        else:
            out = self.resolve(p, dict(zip(p.axes, idx)))
        self.memo[key] = out
        return out

    def resolve(self, p: Prim, mapping: Mapping[Var, Expr]) -> Expr:
        """p's body with its variables replaced by ``mapping`` and its loads made kernel-level.

        One pass over p's own nodes in post-order does both (a member's loads are resolved in the
        order a depth-first walk finishes them, which numbers the reduction instances); results are
        never visited again, so index expressions coming in through ``mapping`` (already
        kernel-level) or produced by folding are never re-read in p's slot numbering.
        """
        done: list[Expr] = []
        for n, kids in _postorder(p.body):
            if type(n) is Load:                 # (a 0-d tensor's too: no index, still a load)
                idx = tuple(done[k] for k in kids)
                src = p.inputs[n.tensor]
                out = self.value_at(src, idx) if src in self.member else Load(self.in_slot[src], idx, n.dtype)
            elif type(n) is Var:
                out = mapping.get(n, n)
            else:
                out = n.with_children(tuple(done[k] for k in kids)) if kids else n
            done.append(out)
        return done[-1]

    def _instance(self, p: Prim, idx: tuple[Expr, ...]) -> Expr:
        key = (p.name, idx)
        if key not in self.inst_key:
            tag = len(self.inst_key) + len(self.pending)
            self.pending.add(key)
            rvars = tuple(Var(f"r{tag}_{k}") for k in range(len(p.reduce.axes)))
            mapping = dict(zip(p.axes, idx))
            mapping.update(zip(p.reduce.axes, rvars))
            body = self.resolve(p, mapping)  # registers the instances it uses first
            self.pending.discard(key)
            slot = self.nin + len(self.instances)
            self.inst_key[key] = slot
            self.instances.append(Instance(slot, p.name, idx, body, rvars, p.reduce.extents, p.reduce.combiner,
                                           p.out.dtype))
        slot = self.inst_key[key]
        return Value(slot, p.out.dtype)


@functools.lru_cache(maxsize=4096)
def _postorder(body: Expr) -> tuple[tuple[Expr, tuple[int, ...]], ...]:
    """A prim body's distinct nodes, each after its children (left to right, depth first), with
    its children's positions in the list: the inliner resolves a prim's body once per index it
    is used at, so the walk is made once per body."""
    order: list = []
    pos: dict[int, int] = {}
    stack: list = [(body, False)]
    while stack:
        n, expanded = stack.pop()
        if id(n) in pos:
            continue
        kids = n.children()
        if expanded or not kids:
            pos[id(n)] = len(order)
            order.append((n, tuple(pos[id(k)] for k in kids)))
            continue
        stack.append((n, True))
        stack.extend((k, False) for k in reversed(kids))
    return tuple(order)


def injective_store(idx: tuple[Expr, ...], shape: tuple[int, ...], ext: Mapping[Var, int], partial=False):
    """Vars used if idx maps them injectively onto the whole tensor (else None); ``partial``: a var
    may range beyond its dim (the store is then limited to the dim)."""
    used = []
    for e, n in zip(idx, shape):
        if isinstance(e, Const):
            if e.value != 0 or n != 1:
                return None
        elif isinstance(e, Var) and e in ext and e not in used and (ext[e] == n or partial and ext[e] > n):
            used.append(e)
        else:
            return None
    return tuple(used)
