"""Readable text for expressions, prims and graphs.

Expressions print in a Python-evaluable syntax: evaluating the text in ``expr_namespace`` gives
back the identical (interned) expression, which the property tests check.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from .dtypes import DType
from .expr import INDEX, Binary, Cast, Const, Expr, Load, Select, Unary, Value, Var, binary, cast, select, unary

_INFIX = {"add": ("+", 1), "sub": ("-", 1), "mul": ("*", 2), "div": ("/", 2), "floordiv": ("//", 2),
          "mod": ("%", 2), "pow": ("**", 4)}
_ATOM_PREC = 9
# Ops whose names are Python keywords print (and parse) with a trailing underscore.
_KEYWORD_FN = {"and": "and_", "or": "or_", "not": "not_"}
# Short dtype names used as cast/constant functions in printed text.
DTYPE_FN = {DType.float64: "f64", DType.float32: "f32", DType.float16: "f16", DType.bfloat16: "bf16",
            DType.int64: "i64", DType.int32: "i32", DType.int16: "i16", DType.int8: "i8",
            DType.uint8: "u8", DType.bool: "b1"}


def _fmt_const(c: Const) -> str:
    v = c.value
    if c.dtype is DType.bool:
        return repr(v)
    if c.dtype is INDEX:
        return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        v = "inf" if v > 0 else ("-inf" if v < 0 else "nan")
        return f"{DTYPE_FN[c.dtype]}({v})"
    return f"{DTYPE_FN[c.dtype]}({v!r})"


def format_expr(e: Expr, names: Sequence[str] | None = None) -> str:
    """``names[slot]`` labels loads (default ``in{slot}``)."""
    memo: dict[int, tuple[str, int]] = {}

    def tname(slot: int) -> str:
        return names[slot] if names is not None else f"in{slot}"

    def go(n: Expr) -> tuple[str, int]:
        got = memo.get(id(n))
        if got is None:
            got = memo[id(n)] = fmt(n)
        return got

    def wrap(n: Expr, min_prec: int) -> str:
        s, p = go(n)
        return f"({s})" if p < min_prec else s

    def lit(n: Expr) -> str:
        # int64 and bool constants print as bare Python literals; where no sibling Expr gives
        # them a dtype (unary/cast operand, two constant operands) they need an explicit one.
        if isinstance(n, Const) and (n.dtype is INDEX or n.dtype is DType.bool):
            return f"{DTYPE_FN[n.dtype]}({n.value!r})"
        return go(n)[0]

    def fmt(n: Expr) -> tuple[str, int]:
        if isinstance(n, Var):
            return n.name, _ATOM_PREC
        if isinstance(n, Const):
            s = _fmt_const(n)
            return s, (3 if s.startswith("-") else _ATOM_PREC)
        if isinstance(n, Load):
            idx = ", ".join(go(i)[0] for i in n.index) if n.index else "()"
            return f"{tname(n.tensor)}[{idx}]", _ATOM_PREC
        if isinstance(n, Value):
            return f"value{n.slot}", _ATOM_PREC
        if isinstance(n, Unary):
            if n.op == "neg":
                return "-" + (lit(n.x) if isinstance(n.x, Const) else wrap(n.x, 4)), 3
            return f"{_KEYWORD_FN.get(n.op, n.op)}({lit(n.x)})", _ATOM_PREC
        if isinstance(n, Binary):
            if isinstance(n.a, Const) and isinstance(n.b, Const):  # unfolded, e.g. 7 // 0
                a = lit(n.a)
                return (f"({a} {_INFIX[n.op][0]} {go(n.b)[0]})" if n.op in _INFIX else
                        f"{_KEYWORD_FN.get(n.op, n.op)}({a}, {go(n.b)[0]})"), _ATOM_PREC
            if n.op in _INFIX:
                sym, prec = _INFIX[n.op]
                if n.op == "pow":  # right-associative, binds tighter than unary minus on its left
                    return f"{wrap(n.a, prec + 1)} {sym} {wrap(n.b, prec)}", prec
                return f"{wrap(n.a, prec)} {sym} {wrap(n.b, prec + 1)}", prec
            return f"{_KEYWORD_FN.get(n.op, n.op)}({go(n.a)[0]}, {go(n.b)[0]})", _ATOM_PREC
        if isinstance(n, Select):
            a = lit(n.a) if isinstance(n.b, Const) else go(n.a)[0]
            return f"where({go(n.cond)[0]}, {a}, {go(n.b)[0]})", _ATOM_PREC
        if isinstance(n, Cast):
            return f"{DTYPE_FN[n.dtype]}({lit(n.x)})", _ATOM_PREC
        raise TypeError(f"unknown expression node {type(n).__name__}")

    return go(e)[0]


class _Tensor:
    def __init__(self, slot: int, dtype: DType):
        self.slot, self.dtype = slot, dtype

    def __getitem__(self, idx):
        return Load(self.slot, idx if isinstance(idx, tuple) else (idx,), self.dtype)


def expr_namespace(var_names: Sequence[str], input_dtypes: Sequence[DType]) -> dict[str, object]:
    """Names under which printed expression text evaluates back to expressions."""
    ns: dict[str, object] = {v: Var(v) for v in var_names}
    ns.update({f"in{k}": _Tensor(k, dt) for k, dt in enumerate(input_dtypes)})
    for dt, fn in DTYPE_FN.items():
        ns[fn] = (lambda dt: lambda x: cast(float(x) if isinstance(x, str) else x, dt))(dt)
    for op in ("max", "min", "fmod", "xor", "lt", "le", "gt", "ge", "eq", "ne", "bitand", "bitor",
               "bitxor", "shl", "shr"):
        ns[op] = (lambda op: lambda a, b: binary(op, a, b))(op)
    ns["and_"] = lambda a, b: binary("and", a, b)
    ns["or_"] = lambda a, b: binary("or", a, b)
    from .expr import UNARY_OPS
    for op in UNARY_OPS:
        ns[_KEYWORD_FN.get(op, op)] = (lambda op: lambda x: unary(op, x))(op)
    ns["where"] = select
    ns["inf"], ns["nan"] = math.inf, math.nan
    return ns


def parse_expr(text: str, var_names: Sequence[str], input_dtypes: Sequence[DType]) -> Expr:
    """Inverse of ``format_expr`` (with default load names)."""
    v = eval(text, {"__builtins__": {}}, expr_namespace(var_names, input_dtypes))  # noqa: S307 - own syntax
    if isinstance(v, bool):
        return Const(v, DType.bool)
    return v if isinstance(v, Expr) else Const(v, INDEX)


def format_prim(p) -> str:
    names = [f"%{n}" for n in p.inputs]
    axes = ", ".join(v.name for v in p.axes)
    if p.is_opaque:
        rhs = f"opaque {p.body.fn}({', '.join(names)}{''.join(f', {k}={v!r}' for k, v in p.body.attrs)})"
    else:
        rhs = format_expr(p.body, names)
        if p.reduce:
            over = ", ".join(f"{v.name}<{e}" for v, e in zip(p.reduce.axes, p.reduce.extents))
            rhs = f"{p.reduce.combiner}[{over}]({rhs})"
    return f"%{p.name}[{axes}]: {p.out} = {rhs}    # {p.origin}"


def format_primgraph(g, classify: Callable | None = None) -> str:
    lines = [f"inputs: {', '.join(f'%{d.name}: {d.type}' for d in g.inputs)}"]
    if g.constants:
        lines.append(f"constants: {', '.join(f'%{c.name}: {c.type}' for c in g.constants)}")
    for p in g.prims:
        line = format_prim(p)
        if classify is not None:
            line = f"{classify(p):<12} {line}"
        lines.append(line)
    lines.append(f"outputs: {', '.join('%' + o for o in g.outputs)}")
    return "\n".join(lines)


def format_graph(g) -> str:
    lines = [f"graph {g.name}", f"inputs: {', '.join(f'%{d.name}: {d.type}' for d in g.inputs)}"]
    if g.constants:
        lines.append(f"constants: {len(g.constants)} tensors")
    for n in g.nodes:
        outs = ", ".join(f"%{o}: {g.types[o]}" for o in n.outputs if o)
        ins = ", ".join(f"%{i}" if i else "_" for i in n.inputs)
        attrs = f" {n.attrs!r}" if len(n.attrs) else ""
        loc = f"    # {n.location}" if n.location else ""
        lines.append(f"{outs} = {n.op}({ins}){attrs}  '{n.name}'{loc}")
    lines.append(f"outputs: {', '.join('%' + o for o in g.outputs)}")
    return "\n".join(lines)
