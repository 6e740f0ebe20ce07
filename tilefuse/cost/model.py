"""The analytic cost model (documented in docs/cost-model.md).

    t = launch + max(bytes / BW, flops / peak) × α,     α = (blocks + SMs) / blocks

``bytes`` is the DRAM traffic implied by a schedule (Welder: per-tile loads and stores × tiles,
with coalescing penalties), ``flops`` counts arithmetic including recomputation, and α is MCFuser's
parallelism factor: a grid of few blocks leaves SMs idle (8 blocks on 108 SMs: α = 14.5; α → 1 as
the grid grows).  Every number here is modelled, never measured.
"""
from __future__ import annotations

from ..ir.expr import Binary, Expr, Load, Select, Unary, walk
from .target import Target

# Relative cost of one evaluation of an op, in FMA-equivalents: special functions run on the
# SFU at a quarter of the FMA rate or need several instructions (erf, pow).
OP_WEIGHT = {
    "exp": 4, "log": 4, "sin": 4, "cos": 4, "tan": 8, "tanh": 6, "sigmoid": 6, "erf": 8, "pow": 8,
    "sqrt": 4, "rsqrt": 4, "div": 4, "reciprocal": 4, "asin": 8, "acos": 8, "atan": 8, "sinh": 8,
    "cosh": 8, "asinh": 8, "acosh": 8, "atanh": 8, "log1p": 4, "expm1": 4, "fmod": 4, "mod": 2,
    "floordiv": 2,
}


def expr_flops(e: Expr) -> int:
    """Weighted arithmetic operations to evaluate e once (index arithmetic inside loads excluded)."""
    total = 0
    for n in walk(e, into=lambda n: not isinstance(n, Load)):
        if isinstance(n, (Unary, Binary)):
            total += OP_WEIGHT.get(n.op, 1)
        elif isinstance(n, Select):
            total += 1
    return total


def parallelism(blocks: int, target: Target) -> float:
    """MCFuser's α = (blocks + SMs) / blocks."""
    blocks = max(int(blocks), 1)
    return (blocks + target.sm_count) / blocks


def kernel_seconds(bytes_: float, flops: float, peak: float, blocks: int, target: Target,
                   cuda_graph: bool = False) -> float:
    launch = target.launch_graph_s if cuda_graph else target.launch_s
    return launch + max(bytes_ / target.dram_bw, flops / peak) * parallelism(blocks, target)


def coalesced_elems(sub: tuple[int, ...], full: tuple[int, ...], elem_bytes: int, target: Target) -> float:
    """Elements actually transferred to read a sub-box of a row-major tensor (Welder's rule).

    A transaction moves ``transaction_bytes``; the contiguous run of a box is the product of its
    trailing dims while they equal the tensor's, times the first dim that differs.  Runs shorter
    than a transaction waste the rest of it.
    """
    n = 1
    for s in sub:
        n *= s
    if n == 0:
        return 0.0
    run = 1
    for s, f in zip(reversed(sub), reversed(full)):
        run *= s
        if s != f:
            break
    per_tx = max(target.transaction_bytes // max(elem_bytes, 1), 1)
    return n * per_tx / min(per_tx, run)
