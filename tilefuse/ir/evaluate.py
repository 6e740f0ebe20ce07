"""The reference executor: the exact semantics of prims, evaluated prim by prim with vectorized torch.

Every prim is evaluated from its expression alone.  A body is evaluated over the index grid of
its variables, each variable an ``arange`` broadcast along its own dimension, so loads become
advanced indexing and ``Select`` becomes ``torch.where``.  Sum-reductions whose body is a
product of factors over different variables (matmul, conv, bmm) are evaluated as ``einsum`` of
the factors, each materialized over its own variables only; other reductions are evaluated in
chunks along the output's leading axis so memory stays bounded.  Opaque prims call their torch
implementation (``ir/opaque.py``).  ``Grid`` alone evaluates expressions: constant folding
(``transform/simplify.py``) and the library kernels' gathered factors use it, so they agree exactly.

Semantics fixed here (and shared by every backend):
- integer ``div`` truncates toward zero; ``floordiv``/``mod`` round toward -inf (Python);
  ``fmod`` takes the dividend's sign;
- a reduce prim whose output is fp16/bf16 evaluates its body and accumulates in fp32, rounding
  once to the output type;
- a load must be in bounds wherever its value is used; a ``Select`` branch that is not taken may
  index out of bounds (padding).  Violations raise, naming the prim's source operator.
"""
from __future__ import annotations

import math
from typing import Mapping

import torch

from .opaque import OPAQUE
from .dtypes import DType
from .expr import Binary, Cast, Const, Expr, Load, Select, Unary, Var, cast, transform, walk
from .prim import Prim, PrimGraph, reduce_init

# Above this many grid elements a prim is evaluated in chunks of its leading output axis.
CHUNK_ELEMS = 1 << 23


class ReferenceError(RuntimeError):
    pass


_UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "asin": torch.asin,
    "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh,
    "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "erf": torch.erf,
    "sigmoid": torch.sigmoid, "floor": torch.floor, "ceil": torch.ceil, "round": torch.round,
    "trunc": torch.trunc, "sign": torch.sign, "not": torch.logical_not, "reciprocal": torch.reciprocal,
    "isnan": torch.isnan, "isinf": torch.isinf, "log1p": torch.log1p, "expm1": torch.expm1, "exp2": torch.exp2,
}


def _div(a, b):
    if a.dtype.is_floating_point:
        return a / b
    return torch.div(a, b, rounding_mode="trunc")


def _floordiv(a, b):
    return torch.div(a, b, rounding_mode="floor")


def _pow(a, b):
    if not a.dtype.is_floating_point and a.dtype is not torch.bool:
        # torch refuses negative integer powers of integers; match numpy (x ** -n == 0 except 1, -1)
        b = b.clamp(min=0) if (b < 0).any() and ((a.abs() != 1) | (b >= 0)).all() else b
    return torch.pow(a, b).to(a.dtype)


_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": _div, "floordiv": _floordiv,
    "mod": torch.remainder, "fmod": torch.fmod, "pow": _pow, "max": torch.maximum, "min": torch.minimum,
    "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge, "eq": torch.eq, "ne": torch.ne,
    "and": torch.logical_and, "or": torch.logical_or, "xor": torch.logical_xor,
    "bitand": torch.bitwise_and, "bitor": torch.bitwise_or, "bitxor": torch.bitwise_xor,
    "shl": torch.bitwise_left_shift, "shr": torch.bitwise_right_shift,
}

def _prod(t: torch.Tensor, dims: tuple) -> torch.Tensor:
    for d in sorted(dims, reverse=True):  # torch.prod takes one dim at a time
        t = t.prod(d)
    return t


_INT_DIVISION = frozenset({"div", "floordiv", "mod", "fmod"})

_COMBINE = {"sum": lambda t, d: t.sum(d), "prod": _prod,
            "max": lambda t, d: t.amax(d), "min": lambda t, d: t.amin(d)}


class Grid:
    """Evaluates expressions over a grid: var -> broadcastable arange tensor (or a fixed tensor)."""

    def __init__(self, prim: Prim, inputs: list[torch.Tensor], env: Mapping[Var, torch.Tensor]):
        self.prim, self.inputs, self.env = prim, inputs, env
        self.memo: dict[tuple[int, int], torch.Tensor] = {}
        self.guards: list[torch.Tensor] = []  # keeps guards alive so their ids in memo keys stay unique
        self.device = inputs[0].device if inputs else torch.device("cpu")

    def eval(self, e: Expr, guard: torch.Tensor | None = None) -> torch.Tensor:
        key = (id(e), id(guard))
        got = self.memo.get(key)
        if got is None:
            got = self.memo[key] = self._eval(e, guard)
        return got

    def _eval(self, e: Expr, guard) -> torch.Tensor:
        if isinstance(e, Var):
            return self.env[e]
        if isinstance(e, Const):
            return torch.tensor(e.value, dtype=e.dtype.to_torch(), device=self.device)
        if isinstance(e, Load):
            return self._load(e, guard)
        if isinstance(e, Unary):
            x = self.eval(e.x, guard)
            if e.op in ("floor", "ceil", "round", "trunc") and not x.dtype.is_floating_point:
                return x
            return _UNARY[e.op](x)
        if isinstance(e, Binary):
            a, b = self.eval(e.a, guard), self.eval(e.b, guard)
            if guard is not None and e.op in _INT_DIVISION and not b.dtype.is_floating_point:
                # an untaken Select branch may divide by zero (its value is discarded): divide by 1 there
                b = torch.where(guard | (b != 0), b, torch.ones((), dtype=b.dtype, device=b.device))
            return _BINARY[e.op](a, b)
        if isinstance(e, Select):
            c = self.eval(e.cond, guard)
            ga = c if guard is None else (guard & c)
            gb = ~c if guard is None else (guard & ~c)
            self.guards += (ga, gb)
            return torch.where(c, self.eval(e.a, ga), self.eval(e.b, gb))
        if isinstance(e, Cast):
            x = self.eval(e.x, guard)
            t = e.dtype.to_torch()
            if e.dtype.is_int and x.dtype.is_floating_point:
                # float -> int truncates; NaN/inf have no defined value, keep torch's
                return torch.trunc(x).to(t)
            return x.to(t)
        raise TypeError(f"unknown expression node {type(e).__name__}")

    def _load(self, e: Load, guard) -> torch.Tensor:
        src = self.inputs[e.tensor]
        idx = [self.eval(i, guard) for i in e.index]
        shape = torch.broadcast_shapes(*(t.shape for t in idx)) if idx else ()
        fixed = []
        for d, t in enumerate(idx):
            n = src.shape[d]
            ok = (t >= 0) & (t < n)
            bad = ~ok if guard is None else (~ok & guard)
            if bool(bad.any()):
                value = int(torch.broadcast_to(t, bad.shape)[bad].flatten()[0])
                raise ReferenceError(
                    f"prim {self.prim.name} ({self.prim.origin}): index {value} out of bounds for dim {d} "
                    f"(size {n}) of input {self.prim.inputs[e.tensor]}")
            fixed.append(t.clamp(0, max(n - 1, 0)) if guard is not None else t)
        if not fixed:
            return src.reshape(())
        if src.numel() == 0:     # no position reads it (checked above): a padded empty axis
            return torch.zeros(shape, dtype=src.dtype, device=src.device)
        out = src[tuple(fixed)]
        return out.expand(shape) if out.shape != shape else out


def var_env(vars_: list[Var], extents: Mapping[Var, int], device, offset: dict[Var, int] | None = None,
            size: dict[Var, int] | None = None) -> dict[Var, torch.Tensor]:
    """The grid of ``vars_``: each an int64 ``arange`` along its own dimension (of a broadcastable
    tensor with one dimension per variable), over ``offset`` .. ``offset + size`` (default: the
    whole extent)."""
    env = {}
    n = len(vars_)
    for k, v in enumerate(vars_):
        lo = (offset or {}).get(v, 0)
        ext = (size or {}).get(v, extents[v])
        shape = [1] * n
        shape[k] = ext
        env[v] = torch.arange(lo, lo + ext, dtype=torch.int64, device=device).reshape(shape)
    return env


def retype(n: Expr, to: DType = DType.float32) -> Expr | None:
    """A ``transform`` callback widening a narrower float node to ``to`` (how a reduction into
    fp16/bf16 is evaluated: accumulated in fp32, rounded once; verify's float64 re-evaluation)."""
    if isinstance(n, Load):
        return Cast(n, to)
    if isinstance(n, Const):  # the narrower constant's value, exactly representable in ``to``
        return Const(torch.tensor(n.value, dtype=n.dtype.to_torch()).item(), to)
    if isinstance(n, Cast):
        return cast(n.x, to)
    return None  # inner nodes are rebuilt from widened children and come out widened already


def _factors(body: Expr) -> list[Expr]:
    if isinstance(body, Binary) and body.op == "mul":
        return _factors(body.a) + _factors(body.b)
    return [body]


def letters(n: int) -> list[str]:
    """``n`` distinct einsum subscripts (at most 52)."""
    return [chr(ord("a") + k) if k < 26 else chr(ord("A") + k - 26) for k in range(n)]


def _einsum(prim: Prim, body: Expr, inputs, device) -> torch.Tensor | None:
    """sum over r of f1 * f2 * ... with factors over (partly) different variables."""
    facs = _factors(body)
    if len(facs) < 2:
        return None
    allv = list(prim.axes) + list(prim.reduce.axes)
    if len(allv) > 52:
        return None
    letter = dict(zip(allv, letters(len(allv))))
    groups: dict[frozenset, list[Expr]] = {}
    for f in facs:
        vs = frozenset(n for n in walk(f) if isinstance(n, Var))
        groups.setdefault(vs, []).append(f)
    if len(groups) < 2 or set().union(*groups) != set(allv):
        return None  # einsum would neither sum over nor broadcast along a variable no factor reads
    ext = prim.extents
    operands, specs = [], []
    summed = set(prim.reduce.axes)
    for vs, fs in groups.items():
        # every operand spans every summed variable: einsum would sum a factor's partners first
        # and multiply once (x * sum c for sum c*x), which is not eager's result for inf/NaN x
        order = [v for v in allv if v in vs or v in summed]
        if math.prod(ext[v] for v in order) > CHUNK_ELEMS * 4:
            return None
        g = Grid(prim, inputs, var_env(order, ext, device))
        val = g.eval(fs[0])
        for f in fs[1:]:
            val = val * g.eval(f)
        val = val.expand(*[ext[v] for v in order]) if order else val.reshape(())
        operands.append(val)
        specs.append("".join(letter[v] for v in order))
    out_spec = "".join(letter[v] for v in prim.axes)
    dt = operands[0].dtype
    if dt in (torch.bool,) or not (dt.is_floating_point or dt in (torch.int64, torch.int32)):
        return None
    return torch.einsum(",".join(specs) + "->" + out_spec, *operands)


def eval_prim(prim: Prim, inputs: list[torch.Tensor]) -> torch.Tensor:
    """Value of one prim given its input tensors (in ``prim.inputs`` order)."""
    out_t = prim.out.dtype.to_torch()
    device = inputs[0].device if inputs else torch.device("cpu")
    if prim.is_opaque:
        res = OPAQUE[prim.body.fn](*inputs, **dict(prim.body.attrs))
        if tuple(res.shape) != prim.out.shape or res.dtype != out_t:
            raise ReferenceError(f"opaque {prim.body.fn} for {prim.origin} returned "
                                 f"{res.dtype}{list(res.shape)}, expected {prim.out}")
        return res
    body = prim.body
    ext = prim.extents
    red = prim.reduce
    if red is not None and prim.out.dtype in (DType.float16, DType.bfloat16):
        body = transform(body, lambda n: retype(n) if n.dtype in (DType.float16, DType.bfloat16) else None)
    if red is not None and any(e == 0 for e in red.extents):
        return torch.full(prim.out.shape, reduce_init(red.combiner, prim.out.dtype), dtype=out_t, device=device)
    if prim.out.numel == 0:
        return torch.empty(prim.out.shape, dtype=out_t, device=device)
    if red is not None and red.combiner == "sum":
        res = _einsum(prim, body, inputs, device)
        if res is not None:
            return res.to(out_t)
    allv = list(prim.axes) + (list(red.axes) if red else [])
    total = math.prod(ext[v] for v in allv)
    lead = prim.axes[0] if prim.axes else None
    if total <= CHUNK_ELEMS or lead is None or ext[lead] == 1:
        return _eval_block(prim, body, inputs, allv, ext, {}, {}, device).to(out_t)
    step = max(1, CHUNK_ELEMS // (total // ext[lead]))
    parts = [
        _eval_block(prim, body, inputs, allv, ext, {lead: s}, {lead: min(step, ext[lead] - s)}, device).to(out_t)
        for s in range(0, ext[lead], step)
    ]
    return torch.cat(parts, 0)


def _eval_block(prim, body, inputs, allv, ext, offset, size, device) -> torch.Tensor:
    g = Grid(prim, inputs, var_env(allv, ext, device, offset, size))
    val = g.eval(body)
    shape = [size.get(v, ext[v]) for v in allv]
    val = val.expand(shape)
    red = prim.reduce
    if red is None:
        return val
    dims = tuple(range(len(prim.axes), len(allv)))
    if red.combiner in ("sum", "prod") and val.dtype is torch.bool:
        val = val.to(torch.int64)
        return (_COMBINE[red.combiner](val, dims) != 0)
    return _COMBINE[red.combiner](val, dims)


def run_reference(pg: PrimGraph, feeds: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """Evaluate the whole graph; returns the graph outputs in order."""
    env: dict[str, torch.Tensor] = {c.name: c.data for c in pg.constants}
    for d in pg.inputs:
        env[d.name] = feeds[d.name]
    # Free each intermediate after its last use to keep memory bounded on big models.
    last_use: dict[str, int] = {}
    for k, p in enumerate(pg.prims):
        for n in p.inputs:
            last_use[n] = k
    keep = set(pg.outputs) | {c.name for c in pg.constants} | {d.name for d in pg.inputs}
    for k, p in enumerate(pg.prims):
        env[p.name] = eval_prim(p, [env[n] for n in p.inputs])
        for n in dict.fromkeys(p.inputs):
            if last_use.get(n) == k and n not in keep:
                del env[n]
    return [env[o] for o in pg.outputs]
