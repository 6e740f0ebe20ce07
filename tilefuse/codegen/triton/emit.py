"""Triton source for a fused schedule (families/fused.py): one ``@triton.jit`` kernel as text.

Layout of the kernel: one program per XBLOCK consecutive rows of the linearized row space; each
reduction instance is a loop over its linearized reduced space in chunks of RBLOCK, reduced along
axis 1 into a per-row accumulator; then a loop over the linearized inner space (one iteration of
width 1 when there is none) evaluates and stores every output.  Values are 2-D tiles: row
variables are ``[XBLOCK, 1]``, loop variables ``[1, BLOCK]``, constants ``[1, 1]``; Triton
broadcasts.  Semantics follow runtime/reference.py (the ``_UNARY``/``_BINARY`` tables below
mirror its tables op for op).
"""
from __future__ import annotations

import math
import re
import struct

import torch

from ...analysis.index import bounds
from ...ir.dtypes import DType
from ...ir.expr import Binary, Cast, Const, Expr, Load, Select, Unary, Var, cast, substitute, transform
from ...ir.prim import reduce_init

_TL = {DType.float64: "tl.float64", DType.float32: "tl.float32", DType.float16: "tl.float16",
       DType.bfloat16: "tl.bfloat16", DType.int64: "tl.int64", DType.int32: "tl.int32",
       DType.int16: "tl.int16", DType.int8: "tl.int8", DType.uint8: "tl.uint8", DType.bool: "tl.int1"}
_HALF = (DType.float16, DType.bfloat16)
# Same-width integer types for bit patterns of non-finite float constants.
_BITS = {DType.float64: ("<d", "<q", "tl.int64"), DType.float32: ("<f", "<i", "tl.int32"),
         DType.float16: ("<e", "<h", "tl.int16")}

LIBDEVICE = "from triton.language.extra import libdevice"

# Unary ops on floats.  ``{x}`` is the operand; 16-bit floats are computed in fp32 and rounded
# back (what torch does on CPU), since libdevice has no 16-bit entry points.
_UNARY = {
    "neg": "-{x}", "abs": "tl.abs({x})", "exp": "tl.exp({x})", "log": "tl.log({x})",
    "sqrt": "tl.sqrt({x})", "rsqrt": "tl.rsqrt({x})", "sin": "tl.sin({x})", "cos": "tl.cos({x})",
    "tan": "libdevice.tan({x})", "asin": "libdevice.asin({x})", "acos": "libdevice.acos({x})",
    "atan": "libdevice.atan({x})", "sinh": "libdevice.sinh({x})", "cosh": "libdevice.cosh({x})",
    "tanh": "libdevice.tanh({x})", "asinh": "libdevice.asinh({x})", "acosh": "libdevice.acosh({x})",
    "atanh": "libdevice.atanh({x})", "erf": "libdevice.erf({x})", "sigmoid": "1.0 / (1.0 + tl.exp(-{x}))",
    "floor": "tl.floor({x})", "ceil": "tl.ceil({x})",
    "round": "libdevice.rint({x})",          # half to even, as torch.round
    "trunc": "libdevice.trunc({x})",
    "sign": "tl.where({x} != {x}, {x}, tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, 0.0)))",
    "reciprocal": "1.0 / {x}", "isnan": "{x} != {x}", "isinf": "({x} == {x}) & ({x} - {x} != {x} - {x})",
    "log1p": "libdevice.log1p({x})", "expm1": "libdevice.expm1({x})",
    "not": "{x} == 0",
}
_UNARY_NATIVE_HALF = frozenset({"neg", "abs", "isnan", "isinf", "sign", "not"})
# Unary ops on integers (and bool) where they differ from the float rule.
_UNARY_INT = {
    "floor": "{x}", "ceil": "{x}", "round": "{x}", "trunc": "{x}",
    "sign": "tl.where({x} > 0, 1, tl.where({x} < 0, -1, 0))",
    "isnan": "{x} != {x}", "isinf": "{x} != {x}",
}

# Binary ops: (float rule, integer rule).  Integer division floors/truncates as Python/C would.
_BINARY = {
    "add": ("{a} + {b}",) * 2, "sub": ("{a} - {b}",) * 2, "mul": ("{a} * {b}",) * 2,
    "div": ("{a} / {b}", "{a} // {b}"),                   # Triton's integer // truncates, like C
    "floordiv": ("tl.floor({a} / {b})",
                 "{a} // {b} - ((({a} % {b}) != 0) & (({a} < 0) != ({b} < 0))).to({t})"),
    "mod": ("tl.where(({f} != 0) & (({f} < 0) != ({b} < 0)), {f} + {b}, {f})",   # {f}: fmod(a, b); exact,
                                                                              # and right for b = ±inf
            "{a} % {b} + tl.where((({a} % {b}) != 0) & (({a} % {b} < 0) != ({b} < 0)), {b}, 0)"),
    "fmod": ("libdevice.fmod({a}, {b})", "{a} % {b}"),     # dividend's sign
    "pow": ("libdevice.pow({a}, {b})",
            "libdevice.pow({a}.to(tl.float64), {b}.to(tl.float64)).to({t})"),
    "max": ("tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)", "tl.maximum({a}, {b})"),
    "min": ("tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)", "tl.minimum({a}, {b})"),
    "lt": ("{a} < {b}",) * 2, "le": ("{a} <= {b}",) * 2, "gt": ("{a} > {b}",) * 2,
    "ge": ("{a} >= {b}",) * 2, "eq": ("{a} == {b}",) * 2, "ne": ("{a} != {b}",) * 2,
    "and": ("{a} & {b}",) * 2, "or": ("{a} | {b}",) * 2, "xor": ("{a} ^ {b}",) * 2,
    "bitand": ("{a} & {b}",) * 2, "bitor": ("{a} | {b}",) * 2, "bitxor": ("{a} ^ {b}",) * 2,
    "shl": ("{a} << {b}",) * 2, "shr": ("{a} >> {b}",) * 2,
}
_BINARY_F32 = frozenset({"fmod", "pow", "mod"})          # libdevice: no 16-bit entry points
_BOOL_BINARY = {"max": "{a} | {b}", "min": "{a} & {b}"}
_INT_DIVISION = frozenset({"div", "floordiv", "mod", "fmod"})
_COMPARE = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})

# Combiners: (per-chunk reduction of a tile along axis 1, accumulate into acc).
_COMBINE = {
    "sum": ("tl.sum({v}, 1)", "{acc} + {r}"),
    "max": ("tl.max({v}, 1)", "tl.maximum({acc}, {r})"),
    "min": ("tl.min({v}, 1)", "tl.minimum({acc}, {r})"),
    "prod": ("tl.reduce({v}, 1, _mul)", "{acc} * {r}"),
}
# bool sum/prod are any/all (the reference reduces as int64 and compares with 0).
_BOOL_COMBINER = {"sum": "max", "prod": "min", "max": "max", "min": "min"}

_HELPERS = '''
@triton.jit
def _mul(a, b):
    return a * b
'''


def num_warps(schedule) -> int:
    """Warps per program: the schedule's choice (the cost model ranked tile and warps together)."""
    return schedule.num_warps


def kernel_name(schedule) -> str:
    """``fused_<ops>``: the source operator types the kernel implements, in order."""
    ops = dict.fromkeys(re.sub(r"\W+", "", p.origin.op).lower() or "op" for p in schedule.group.prims)
    return "fused_" + "_".join(list(ops)[:6])


def emit_fused(schedule, name: str | None = None) -> str:
    """Triton source text of one kernel computing ``schedule`` (deterministic for a schedule)."""
    return _Kernel(schedule, name or kernel_name(schedule)).source()


def _const_text(c: Const, shape: str = "[1, 1]") -> str:
    """A typed constant tile; non-finite floats by bit pattern (no inf/nan literals in Triton)."""
    dt, v = c.dtype, c.value
    if dt is DType.bool:
        return f"tl.full({shape}, {int(v)}, tl.int1)"
    if dt.is_int:
        return f"tl.full({shape}, {v}, {_TL[dt]})"
    if math.isfinite(v):
        return f"tl.full({shape}, {v!r}, {_TL[dt]})"
    if dt is DType.bfloat16:  # bf16 has no struct code: take fp32's and convert (exact for inf/nan)
        return f"{_const_text(Const(v, DType.float32), shape)}.to(tl.bfloat16)"
    fmt, ifmt, it = _BITS[dt]
    bits = struct.unpack(ifmt, struct.pack(fmt, v))[0]
    return f"tl.full({shape}, {bits}, {it}).to({_TL[dt]}, bitcast=True)"


def _widen(n: Expr) -> Expr | None:
    """fp16/bf16 reduction bodies evaluate in fp32, as the reference does (reference._retype)."""
    if n.dtype not in _HALF:
        return None
    if isinstance(n, Load):
        return Cast(n, DType.float32)
    if isinstance(n, Const):
        return Const(torch.tensor(n.value, dtype=n.dtype.to_torch()).item(), DType.float32)
    if isinstance(n, Cast):
        return cast(n.x, DType.float32)
    return None


class _Scope:
    """One loop body: bound variables, common subexpressions and the lines written so far."""

    def __init__(self, kernel: "_Kernel", names: dict, dims: dict, ranges: dict, masks: dict, indent: str):
        self.k, self.names, self.dims, self.ranges, self.masks = kernel, dict(names), dict(dims), ranges, masks
        self.indent = indent
        self.lines: list[str] = []
        self.memo: dict[int, str] = {}

    def line(self, text: str):
        self.lines.append(self.indent + text)

    def tmp(self, text: str, dims: frozenset) -> str:
        t = self.k.fresh()
        self.line(f"{t} = {text}")
        self.dims[t] = dims
        return t

    def dims_of(self, names) -> frozenset:
        out = frozenset()
        for n in names:
            out |= self.dims[n]
        return out

    def expr(self, e: Expr) -> str:
        got = self.memo.get(id(e))
        if got is None:
            got = self.memo[id(e)] = self._expr(e)
        return got

    def _expr(self, e: Expr) -> str:
        if isinstance(e, Var):
            return self.names[e]
        if isinstance(e, Const):
            return self.tmp(_const_text(e), frozenset())
        if isinstance(e, Load):
            return self._load(e)
        if isinstance(e, Cast):
            x = self.expr(e.x)
            return self.tmp(f"{x}.to({_TL[e.dtype]})", self.dims[x])
        if isinstance(e, Select):
            c, a, b = (self.expr(k) for k in (e.cond, e.a, e.b))
            return self.tmp(f"tl.where({c}, {a}, {b})", self.dims_of((c, a, b)))
        if isinstance(e, Unary):
            return self._unary(e)
        if isinstance(e, Binary):
            return self._binary(e)
        raise TypeError(f"cannot emit {type(e).__name__}")

    def index(self, e: Expr) -> str:
        """An index term; constants stay literals so offsets fold."""
        return str(e.value) if isinstance(e, Const) else self.expr(e)

    def _unary(self, e: Unary) -> str:
        x = self.expr(e.x)
        dt = e.x.dtype
        if dt.is_float:
            rule = _UNARY[e.op]
            if dt in _HALF and e.op not in _UNARY_NATIVE_HALF:
                w = self.tmp(f"{x}.to(tl.float32)", self.dims[x])
                text = f"({rule.format(x=w)}).to({_TL[dt]})"
            else:
                text = rule.format(x=x)
                if e.op == "sign" or e.op == "reciprocal":
                    text = f"({text}).to({_TL[dt]})"
        else:
            rule = _UNARY_INT.get(e.op, _UNARY[e.op])
            text = rule.format(x=x)
            if e.dtype is not DType.bool and _may_retype(rule, e.dtype):
                text = f"({text}).to({_TL[e.dtype]})"
        return self.tmp(text, self.dims[x])

    def _binary(self, e: Binary) -> str:
        a, b = self.expr(e.a), self.expr(e.b)
        dt = e.a.dtype
        dims = self.dims_of((a, b))
        if dt is DType.bool and e.op in _BOOL_BINARY:
            return self.tmp(_BOOL_BINARY[e.op].format(a=a, b=b), dims)
        if not dt.is_float and e.op in _INT_DIVISION and not isinstance(e.b, Const):
            # an untaken Select branch (or a masked lane) may divide by zero: divide by 1 there
            b = self.tmp(f"tl.where({b} == 0, 1, {b}).to({_TL[dt]})", self.dims[b])
        rule = _BINARY[e.op][0 if dt.is_float else 1]
        if dt in _HALF and e.op in _BINARY_F32:
            wa = self.tmp(f"{a}.to(tl.float32)", self.dims[a])
            wb = self.tmp(f"{b}.to(tl.float32)", self.dims[b])
            a, b = wa, wb
        f = self.tmp(f"libdevice.fmod({a}, {b})", dims) if "{f}" in rule else None
        text = rule.format(a=a, b=b, t=_TL[dt], f=f)
        if e.op not in _COMPARE and e.dtype is not DType.bool and _may_retype(rule, e.dtype):
            text = f"({text}).to({_TL[e.dtype]})"
        return self.tmp(text, dims)

    def _load(self, e: Load) -> str:
        k = self.k
        if e.tensor >= k.nin:  # a reduction instance's per-row value
            return k.inst_name[e.tensor]
        shape = k.shapes[e.tensor]
        idx = [self.index(i) for i in e.index]
        dims = self.dims_of(i for i in idx if i in self.dims)
        checks = []
        for d, (i, n) in enumerate(zip(idx, shape)):
            lo, hi = bounds(e.index[d], self.ranges)
            if lo < 0:
                checks.append(f"({i} >= 0)")
            if hi > n - 1:
                checks.append(f"({i} < {n})")
        off = _offset(idx, shape)
        mask = [self.masks[d] for d in sorted(dims, reverse=True)] + checks
        m = f", mask={' & '.join(mask)}, other=0" if mask else ""
        return self.tmp(f"tl.load(in{e.tensor} + ({off}){m})", dims)


class _Kernel:
    def __init__(self, s, name: str):
        self.s, self.name = s, name
        self.nin = len(s.inputs)
        self.shapes = [s.group.types[n].shape for n in s.inputs]
        self.inst_name = {inst.slot: f"inst{inst.slot}" for inst in s.instances}
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"t{self.count}"

    def source(self) -> str:
        s = self.s
        outs = ", ".join(f"out{k}" for k in range(len(s.stores)))
        ins = ", ".join(f"in{k}" for k in range(self.nin))
        params = ", ".join(p for p in (ins, outs, "XBLOCK: tl.constexpr, RBLOCK: tl.constexpr") if p)
        body = [f"def {self.name}({params}):", *self._rows()]
        if self._one_pass():
            body += self._single_pass()
        else:
            for inst in s.instances:
                body += self._instance(inst)
            body += self._stores()
        return "\n".join(self._header() + ["import triton", "import triton.language as tl", LIBDEVICE,
                                            _HELPERS, "", "@triton.jit"] + body) + "\n"

    def _header(self) -> list[str]:
        s = self.s
        origins = dict.fromkeys(str(p.origin) for p in s.group.prims)
        out = [f"# {self.name}: fused kernel (tilefuse), anchor {s.anchor}, "
               f"XBLOCK={s.xblock} RBLOCK={s.rblock} num_warps={num_warps(s)}", "# implements:"]
        out += [f"#   {o}" for o in origins]
        out += [f"# inputs:  {', '.join(f'in{k}={n}' for k, n in enumerate(s.inputs))}",
                f"# outputs: {', '.join(f'out{k}={st.tensor}' for k, st in enumerate(s.stores))}"]
        return out

    def _rows(self) -> list[str]:
        s = self.s
        xn = math.prod(s.xext)
        return ["    pid = tl.program_id(0)"] + self._axis(
            "    ", "x", "(pid.to(tl.int64) * XBLOCK + tl.arange(0, XBLOCK).to(tl.int64))[:, None]", xn,
            s.xvars, s.xext)

    @staticmethod
    def _var(v: Var) -> str:
        return f"v_{v.name}"

    def _scope(self, loop_vars, loop_ext, indent: str) -> _Scope:
        s = self.s
        names = {v: self._var(v) for v in s.xvars} | {v: self._var(v) for v in loop_vars}
        dims = {self._var(v): frozenset("x") for v in s.xvars} | {self._var(v): frozenset("r") for v in loop_vars}
        dims |= {n: frozenset("x") for n in self.inst_name.values()}
        ranges = {v: (0, n - 1) for v, n in zip(s.xvars, s.xext)}
        ranges |= {v: (0, n - 1) for v, n in zip(loop_vars, loop_ext)}
        return _Scope(self, names, dims, ranges, {"x": "xmask", "r": "rmask"}, indent)

    def _axis(self, ind: str, axis: str, tile: str, n: int, vars_, ext) -> list[str]:
        """``xs``/``rs`` = the linear index tile, its mask (< n), and the variables unravelled from it."""
        lin = f"{axis}s"
        return ([f"{ind}{lin} = {tile}", f"{ind}{axis}mask = {lin} < {n}"]
                + [f"{ind}{self._var(v)} = {_unravel(lin, ext, k)}" for k, v in enumerate(vars_)])

    def _loop_head(self, ind: str, rn: int, block: str, vars_, ext) -> list[str]:
        return [f"{ind}for r0 in range(0, {rn}, {block}):"] + self._axis(
            ind + "    ", "r", f"(r0 + tl.arange(0, {block})).to(tl.int64)[None, :]", rn, vars_, ext)

    def _reduction(self, inst):
        """(body, accumulator dtype, combiner, identity) of an instance's reduction."""
        body = transform(inst.body, _widen) if inst.dtype in _HALF else inst.body
        acc_dt = DType.float32 if inst.dtype in _HALF else inst.dtype
        combiner = inst.combiner
        init_value = reduce_init(combiner, acc_dt)
        if inst.dtype is DType.bool:  # any/all as a max/min over int32, starting from False/True
            acc_dt, combiner, body = DType.int32, _BOOL_COMBINER[combiner], cast(body, DType.int32)
            init_value = int(init_value)
        return body, acc_dt, combiner, init_value

    def _reduce_tile(self, sc: _Scope, body: Expr, acc_dt: DType, combiner: str, init_value) -> str:
        """Text of the tile's values reduced along axis 1 (masked lanes hold the identity)."""
        v = sc.expr(body)
        tile = sc.tmp(f"tl.where(xmask & rmask, {v}, {_const_text(Const(init_value, acc_dt))})", frozenset("xr"))
        return f"{_COMBINE[combiner][0].format(v=tile)}.to({_TL[acc_dt]})"

    def _final(self, inst, acc: str) -> str:
        out = f"{acc}[:, None]"
        return f"({out} != 0)" if inst.dtype is DType.bool else f"{out}.to({_TL[inst.dtype]})"

    def _instance(self, inst) -> list[str]:
        body, acc_dt, combiner, init_value = self._reduction(inst)
        acc = f"acc{inst.slot}"
        rn = math.prod(inst.rext)
        lines = [f"    # reduction {inst.prim} ({combiner}) over {rn} per row",
                 f"    {acc} = {_const_text(Const(init_value, acc_dt), '[XBLOCK]')}"]
        lines += self._loop_head("    ", rn, "RBLOCK", inst.rvars, inst.rext)
        sc = self._scope(inst.rvars, inst.rext, "        ")
        r = self._reduce_tile(sc, body, acc_dt, combiner, init_value)
        sc.line(f"{acc} = " + _COMBINE[combiner][1].format(acc=acc, r=r))
        return lines + sc.lines + [f"    {self.inst_name[inst.slot]} = {self._final(inst, acc)}"]

    def _one_pass(self) -> bool:
        """The schedule says whether the reductions and the outputs share one tile of loads (one
        pass: whole rows fit the tile and every reduction runs over the inner extents)."""
        return self.s.one_pass

    def _single_pass(self) -> list[str]:
        s = self.s
        inner = math.prod(s.iext)
        lines = ["    # one pass: each row is one tile, shared by the reductions and the outputs"] + self._axis(
            "    ", "r", "tl.arange(0, RBLOCK).to(tl.int64)[None, :]", inner, s.ivars, s.iext)
        sc = self._scope(s.ivars, s.iext, "    ")
        for inst in s.instances:
            body, acc_dt, combiner, init_value = self._reduction(inst)
            body = substitute(body, dict(zip(inst.rvars, s.ivars)))
            sc.line(f"# reduction {inst.prim} ({combiner}) over {inner} per row")
            r = self._reduce_tile(sc, body, acc_dt, combiner, init_value)
            sc.line(f"{self.inst_name[inst.slot]} = {self._final(inst, r)}")
        self._store_lines(sc, "RBLOCK")
        return lines + sc.lines

    def _stores(self) -> list[str]:
        s = self.s
        inner = math.prod(s.iext)
        block = "RBLOCK" if s.ivars else "1"
        lines = ["    # outputs"] + self._loop_head("    ", inner, block, s.ivars, s.iext)
        sc = self._scope(s.ivars, s.iext, "        ")
        self._store_lines(sc, block)
        return lines + sc.lines

    def _store_lines(self, sc: _Scope, block: str) -> None:
        """Every output computed and stored in scope ``sc``."""
        s = self.s
        for k, st in enumerate(s.stores):
            shape = s.group.types[st.tensor].shape
            v = sc.expr(st.value)
            idx = [sc.index(i) for i in st.index]
            off = _offset(idx, shape)
            mask = " & ".join(["xmask", "rmask"] + [f"({sc.names[m]} == 0)" for m in st.mask_vars]
                              + [f"({sc.names[v]} < {n})" for v, n in st.limits])
            dt = _TL[s.group.types[st.tensor].dtype]
            full = f"[XBLOCK, {block}]"
            sc.line(f"tl.store(out{k} + tl.broadcast_to({off}, {full}), "
                    f"tl.broadcast_to({v}, {full}).to({dt}), mask={mask})")


def _offset(idx: list[str], shape: tuple[int, ...]) -> str:
    """Row-major element offset of index terms; a tile even when every term is a literal."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    if all(re.fullmatch(r"-?\d+", i) for i in idx):   # literals only (or a 0-d tensor)
        return f"tl.full([1, 1], {sum(int(i) * st for i, st in zip(idx, strides))}, tl.int64)"
    return " + ".join(i if st == 1 else f"{i} * {st}" for i, st in zip(idx, strides))


def _may_retype(rule: str, dtype: DType) -> bool:
    """Whether Triton's promotion could change the result type (literals, narrow types)."""
    return dtype not in (DType.float32, DType.int64) or re.search(r"\b\d", rule) is not None


def _unravel(lin: str, ext: tuple[int, ...], k: int) -> str:
    """Coordinate k of a row-major linear index over ``ext``."""
    inner = math.prod(ext[k + 1:])
    text = lin if inner == 1 else f"({lin} // {inner})"
    return text if k == 0 else f"{text} % {ext[k]}"
