"""Kernel names: one name per planned kernel, used as the Triton function's name, in the report
and therefore in profiler traces.

A name says what the kernel really computes: ``<family>_<words>``, a word per source operator it
implements in order: the operator's type when the kernel holds all of that operator's prims, else
what the prims it holds do (a GEMM's bias add alone is ``add``, not ``gemm``).  Kernels with the
same structure (schedule key) share a name, and so share one compiled function; different
kernels that would read alike are numbered.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

from ..analysis.classify import Category, classify
from ..ir.expr import Binary, Cast, Const, Load, Select, Unary
from ..ir.prim import Prim

MAX_WORDS = 4


def kernel_names(schedules: Sequence, prims: Sequence[Prim]) -> list[str]:
    """Names of the planned kernels' ``schedules`` (plan order); ``prims``: every prim of the
    program (to tell a whole operator from a part of one)."""
    per_node = Counter(p.origin.name for p in prims)
    by_key: dict[str, str] = {}
    taken: set[str] = set()
    out = []
    for s in schedules:
        key = s.key()
        name = by_key.get(key)
        if name is None:
            base = f"{s.family}_{describe(s.group.prims, per_node)}"
            name, n = base, 1
            while name in taken:
                n += 1
                name = f"{base}_{n}"
            by_key[key] = name
            taken.add(name)
        out.append(name)
    return out


def describe(prims: Sequence[Prim], per_node: Counter | None = None) -> str:
    """Words for what ``prims`` compute (see the module docstring); without ``per_node`` every
    operator counts as whole."""
    held = Counter(p.origin.name for p in prims)
    words: list[str] = []
    for p in prims:
        whole = per_node is None or held[p.origin.name] >= per_node[p.origin.name]
        for w in ([_word(p.origin.op)] if whole else [_prim_word(p)]):
            if w and w not in words:
                words.append(w)
    tail = "_".join(words[:MAX_WORDS]) + ("_etc" if len(words) > MAX_WORDS else "")
    return tail or "kernel"


def _word(text: str) -> str:
    return re.sub(r"[^0-9a-z]+", "", str(text).lower())


def _prim_word(p: Prim) -> str:
    """What one prim does, in a word."""
    if p.is_opaque:
        return _word(p.body.fn)
    if p.reduce is not None:
        if classify(p) is Category.contraction:
            return "conv" if "conv" in _word(p.origin.op) else "gemm"
        return p.reduce.combiner
    b = p.body
    while isinstance(b, Cast) and not isinstance(b.x, (Load, Const)):
        b = b.x
    if isinstance(b, (Binary, Unary)):
        return _word(b.op)
    return {Select: "where", Cast: "cast", Load: "copy", Const: "fill"}.get(type(b), "op")
