"""Library kernels: one contraction prim run through torch (cuBLAS/cuDNN on a GPU, BLAS on CPU).

``library_kernel(prim)`` plans once and returns ``run(inputs, out)``, which writes the prim's value
into the preallocated contiguous ``out``.  Factors are built by factors.py; convolutions are
recognized by conv.py.  The body ``sum_r f1 * f2 * ... (* constants)`` (under at
most one Cast to the output type) is split into its factors, and each factor becomes a tensor over
its own variables:

- **strided**: ``Load(slot, index)`` (under Casts only) whose every index term is affine in the
  prim's variables with non-negative integer coefficients becomes a ``torch.as_strided`` view of
  the input: element offset = Σ_d stride_d·index_d, so variable v gets stride Σ_d stride_d·coef_{d,v}
  and the view starts at Σ_d stride_d·const_d.  Transposes, broadcasts (stride 0), constant-offset
  slices, diagonals and conv windows (``o*s + k*d``: overlapping, read-only) cost no copy.  The
  input's own strides are used, so a non-contiguous input needs no ``.contiguous()`` either.  Each
  call checks the input's shape against the exact bounds of the affine index; a violation falls
  back to the reference (which names the bad index), never to a silent out-of-bounds read.
- **gathered**: any other factor (div/mod reshapes, grouped-conv channel maps, data-dependent
  loads, ``Select`` padding, negative coefficients, arithmetic) is evaluated by the reference
  executor's ``Grid`` over its own variables only, as the reference's einsum does.
- constant factors (no load, no variable: attention's 1/sqrt(d)) multiply the result once.

Paths (``run.path``; ``conv`` is tried before ``gemm`` and ``einsum``):
- ``"conv"``: a float product of two factors that is an N-d convolution (N = 1, 2, 3) without
  padding inside the prim (fission pads in a separate prim): output axes ``(n, f, o_1..o_N)`` in
  that order, reduced axes ``c, k_1..k_N`` in any order, input ``x[n, chan, o_j*s_j + k_j*d_j +
  const_j]`` (a Load under Casts; s, d > 0, const >= 0) and weight any Load indexed by f, c, k only
  that is a strided view (any layout: ``w[f, c, k]``, ``w[c, f, k]``, ... are views of one
  ``[F, C, K...]`` tensor).  The channel map ``chan`` is ``c`` (one group), ``f`` (depthwise, as
  simplify leaves it) or ``(f // fpg) * C + c`` (grouped).  Fission's grouped form, output axes
  ``(n, g, f, o_1..o_N)`` with ``chan = g * C + c`` and the weight indexed by g, f, c, k only, is
  the same conv with output channel ``(g, f)``: the weight view ``[G, F, C, K...]`` is flattened
  to ``[G*F, C, K...]`` and the conv's ``[N, G*F, ...]`` output copied as ``[N, G, F, ...]``.
  Extent-1 variables are ignored wherever they appear (always 0), so axes simplify dropped or
  turned into constants still match.  It runs
  ``torch.nn.functional.conv{N}d(x_view, w_view, stride=s, dilation=d, groups=G)`` (cuDNN on a
  GPU, no im2col) with ``x_view`` a strided view ``[N, G*C, span...]`` of the input at the
  constant offsets (a slice), then scales and ``out.copy_()``s (conv has no ``out=``).  Any
  mismatch (negative or zero coefficients, a kernel axis in two dims, overlapping channel
  windows, a weight reading n or o, other output axis orders, integers, ConvTranspose's
  Select-guarded ``(o + p - k*d) // s`` input) leaves the prim to the paths below.
- ``"gemm"``: exactly two non-constant factors and every reduced variable read by both: variables
  are batch (both operands + output), M/N (one operand + output) and K (reduced), and the product
  is ``mm``/``bmm`` of ``[Bt, M, K] @ [Bt, K, N]`` (reshape may copy, e.g. an im2col window).  When the
  output's axes are batch…, M…, N… (or batch…, N…, M…: the operands swap) it is written with
  ``out=`` straight into ``out`` (``run.direct``); otherwise it is permuted into ``out``.
- ``"einsum"``: other products (a reduced variable read by one factor, three factors):
  ``torch.einsum`` on the (strided) factors.
- ``"reference"``: ``eval_prim`` on the whole prim: not a sum of products, bool, an integer product
  whose type differs from the output's, a variable (of extent > 1) no factor reads, or a gathered
  factor too large to materialize.  (Integer GEMMs run on the CPU: cuBLAS has none.)
- ``"fill"``: zero-size extents: ``out`` filled with the sum's init (0) or left empty, as eval_prim.

Numerics: the GEMM runs in the product's type (promoted with the output's for floats) and rounds
once to the output type.  fp32/fp64 match the reference to summation order (1e-5); fp16/bf16 GEMMs
run in 16-bit with the library's accumulation (fp32 on cuBLAS; within 1e-2 relative of the
reference's fp32 accumulation on CPU, 2e-2 for bf16); integers are exact (same wrap-around).  The
conv path likewise: fp32 on CUDA is forced to IEEE fp32 (cuDNN's default is TF32); fp16/bf16 run
natively on CUDA (cuDNN accumulates in fp32) and, on CPU, in fp32 rounded once (as the reference).
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import torch

from ..ir.dtypes import DType, promote
from ..ir.evaluate import CHUNK_ELEMS, eval_prim, letters
from ..ir.expr import Binary, Cast, Expr, Load, Var, free_vars, walk
from ..ir.prim import Prim, reduce_init
from .conv import CONV, Conv, conv_plan, ieee_fp32
from .factors import cast_to, constant, factor, mul_leaves

# A gathered factor above this many elements is not materialized: the whole prim goes to eval_prim,
# which chunks (the reference's own einsum limit).
GATHER_LIMIT = CHUNK_ELEMS * 4

Run = Callable[[list[torch.Tensor], torch.Tensor], None]




class LibraryKernel:
    """``run(inputs, out)``; ``path``, ``factors`` ("strided"/"gathered" per non-constant factor, in
    body order), ``direct`` (the GEMM writes ``out`` in place), ``conv`` (the conv path's stride,
    dilation, groups) and ``reason`` (why a fallback) say what it does."""

    path: str = "reference"
    factors: tuple[str, ...] = ()
    direct: bool = False
    conv: Conv | None = None
    reason: str = ""

    def __init__(self, prim: Prim):
        self.prim = prim
        self._factors: list = []
        self._plan()

    def __repr__(self) -> str:
        extra = f", reason={self.reason!r}" if self.reason else ""
        return (f"LibraryKernel({self.prim.name}: path={self.path}, factors={self.factors}, "
                f"direct={self.direct}{extra})")

    # -- planning
    def _fallback(self, reason: str) -> None:
        self.path, self.reason = "reference", reason

    def _plan(self) -> None:
        p = self.prim
        if p.is_opaque or p.reduce is None or p.reduce.combiner != "sum":
            return self._fallback("not a sum reduction")
        if any(e == 0 for e in p.extents.values()):
            self.path = "fill"
            return
        body = p.body
        if isinstance(body, Cast) and isinstance(body.x, Binary) and body.x.op == "mul":
            body = body.x  # one rounding to the output type, done by the final copy
        prod_t, out_t = body.dtype, p.out.dtype
        if DType.bool in (prod_t, out_t):
            return self._fallback("bool contraction")
        if (prod_t.is_int or out_t.is_int) and prod_t is not out_t:
            return self._fallback("integer product of another type than the output")
        self.compute = prod_t if prod_t.is_int else promote(prod_t, out_t)
        terms, scale = [], 1
        for f in mul_leaves(body):
            if any(isinstance(n, (Load, Var)) for n in walk(f)):
                terms.append(f)
            else:
                scale = scale * constant(f)
        self.scale = scale
        if len(terms) < 2:
            return self._fallback("fewer than two non-constant factors")
        allv = list(p.axes) + list(p.reduce.axes)
        # An extent-1 variable is a size-1 dim any factor may carry (stride irrelevant): give it to
        # every factor, so it never blocks the GEMM form nor leaves an output dim unread.
        ones = frozenset(v for v in allv if p.extents[v] == 1)
        var_sets = [free_vars(f) | ones for f in terms]
        if set().union(*var_sets) != set(allv):
            return self._fallback("a variable no factor reads")
        rvars = set(p.reduce.axes)
        conv = conv_plan(p, terms) if self.compute.is_float else None
        if conv is not None:
            self._plan_conv(conv)
        elif len(terms) == 2 and all(rvars <= vs for vs in var_sets):
            self._plan_gemm(terms, var_sets)
        else:
            self._plan_einsum(terms, var_sets, allv)
        self.factors = tuple(f.kind for f in self._factors)
        big = [f for f in self._factors if f.kind == "gathered" and math.prod(f.sizes) > GATHER_LIMIT]
        if big:
            self.factors = ()
            return self._fallback("a gathered factor too large to materialize")

    def _plan_conv(self, conv: Conv) -> None:
        self.conv = conv
        self._factors = [conv.x, conv.w] if conv.which == 0 else [conv.w, conv.x]
        self.path = "conv"

    def _plan_gemm(self, terms: list[Expr], var_sets: list[frozenset]) -> None:
        p = self.prim
        ext = p.extents
        li, ri, group, self.direct = self._roles(var_sets)
        batch, rows, cols = ([v for v in p.axes if group[v] == g] for g in (0, 1, 2))
        k = list(p.reduce.axes)
        size = lambda vs: math.prod(ext[v] for v in vs)  # noqa: E731
        self.bt, self.m, self.k, self.n = size(batch), size(rows), size(k), size(cols)
        full = batch + rows + cols
        self.full_sizes = tuple(ext[v] for v in full)
        self.perm = tuple(full.index(v) for v in p.axes)
        made = {li: factor(p, terms[li], batch + rows + k), ri: factor(p, terms[ri], batch + k + cols)}
        self._factors = [made[0], made[1]]
        self._order = (li, ri)  # which factor is the left and which the right operand
        self.path = "gemm"

    def _roles(self, var_sets: list[frozenset]) -> tuple:
        """(left, right, GEMM group of each output axis, direct).  The left operand's own output
        axes are the GEMM's rows (group 1), the right's its columns (2), shared ones the batch (0);
        the operands swap when only that order lets the GEMM write ``out`` in place."""
        p, first = self.prim, None
        for li, ri in ((0, 1), (1, 0)):
            lv, rv = var_sets[li], var_sets[ri]
            group = {v: (0 if v in lv and v in rv else 1 if v in lv else 2) for v in p.axes}
            seq = [group[v] for v in p.axes if p.extents[v] != 1]  # size-1 axes do not change the layout
            if seq == sorted(seq):
                return li, ri, group, True
            first = first or (li, ri, group, False)
        return first

    def _plan_einsum(self, terms: list[Expr], var_sets: list[frozenset], allv: list[Var]) -> None:
        if len(allv) > 52:
            return self._fallback("more variables than einsum letters")
        letter = dict(zip(allv, letters(len(allv))))
        orders = [[v for v in allv if v in vs] for vs in var_sets]
        self._factors = [factor(self.prim, f, o) for f, o in zip(terms, orders)]
        specs = ",".join("".join(letter[v] for v in o) for o in orders)
        self.equation = specs + "->" + "".join(letter[v] for v in self.prim.axes)
        self.path = "einsum"

    # -- running
    def operands(self, inputs: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """The non-constant factors as tensors over their variables, in the compute type (strided
        ones are views of the inputs unless a cast copies); None if an index would leave its input."""
        ts = [f.tensor(inputs) for f in self._factors]
        if any(t is None for t in ts):
            return None
        ts = [cast_to(t, self.compute) for t in ts]
        if self.compute.is_int:  # cuBLAS has no integer GEMM: integer contractions run on the CPU
            ts = [t.cpu() for t in ts]
        return ts

    def __call__(self, inputs: list[torch.Tensor], out: torch.Tensor) -> None:
        if self.path == "fill":
            if out.numel():
                out.fill_(reduce_init("sum", self.prim.out.dtype))
            return
        if self.path == "reference":
            out.copy_(eval_prim(self.prim, inputs))
            return
        ts = self.operands(inputs)
        if ts is None:
            out.copy_(eval_prim(self.prim, inputs))  # raises, naming the out-of-bounds index
            return
        if self.path == "conv":
            self._conv(ts, out)
        elif self.path == "gemm":
            self._gemm(ts, out)
        else:
            res = torch.einsum(self.equation, *ts)
            out.copy_(res.mul_(self.scale) if self.scale != 1 else res)

    def _conv(self, ts: list[torch.Tensor], out: torch.Tensor) -> None:
        c = self.conv
        x, w = ts[c.which], ts[1 - c.which]
        if c.grouped:
            w = w.flatten(0, 1)  # [G, F, C, K...] -> the conv's [G*F, C, K...] (a view unless permuted)
        if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16):
            x, w = x.float(), w.float()  # CPU: accumulate in fp32 like the reference, round once below
        conv = functools.partial(CONV[len(c.stride)], x, w, stride=c.stride, dilation=c.dilation, groups=c.groups)
        res = ieee_fp32(conv) if x.is_cuda and x.dtype == torch.float32 else conv()
        if self.scale != 1:
            res.mul_(self.scale)
        out.copy_(res.reshape(out.shape))  # grouped: [N, G*F, ...] is [N, G, F, ...]

    def _gemm(self, ts: list[torch.Tensor], out: torch.Tensor) -> None:
        left, right = (ts[i] for i in self._order)
        batched = self.bt != 1
        mm = torch.bmm if batched else torch.mm
        shape_l, shape_r, shape_o = ((self.bt, self.m, self.k), (self.bt, self.k, self.n),
                                     (self.bt, self.m, self.n))
        if not batched:
            shape_l, shape_r, shape_o = shape_l[1:], shape_r[1:], shape_o[1:]
        a, b = left.reshape(shape_l), right.reshape(shape_r)
        if self.direct and out.dtype == a.dtype and out.device == a.device and out.is_contiguous():
            mm(a, b, out=out.view(shape_o))
            if self.scale != 1:
                out.mul_(self.scale)
            return
        res = mm(a, b)
        if self.scale != 1:
            res.mul_(self.scale)
        out.copy_(res.reshape(self.full_sizes).permute(self.perm))


def library_kernel(prim: Prim) -> Run:
    """Plan a library kernel for one contraction prim: ``run(inputs, out)`` writes its value into
    ``out`` (contiguous, ``prim.out`` shape and dtype; inputs in ``prim.inputs`` order)."""
    return LibraryKernel(prim)
