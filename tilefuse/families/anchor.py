"""A contraction as the anchor of a kernel (Hidet §2.5): what the gemm and chain families share.

The members a contraction reads through (its prologue) are inlined into its body, which splits
into the two operand expressions of a matrix product (``split_operands``); 16-bit operands widened
to fp32 only for the product run as 16-bit dot operands with fp32 accumulation, which is exact
(``dot_operands``).  The members that read the contraction (its epilogue) are inlined at the
accumulator's coordinates, and each output is stored through the inverse of the map it reads the
accumulator by (``epilogue_store``: the attention heads' transpose becomes a store order).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..analysis.index import linear_form
from ..analysis.inline import Inliner
from ..ir.dtypes import DType
from ..ir.expr import Binary, Cast, Const, Expr, Load, Value, Var, binary, free_vars, substitute, transform, walk

HALF = (DType.float16, DType.bfloat16)


@dataclass(frozen=True)
class AccStore:
    """An output of an anchored kernel, stored from the accumulator's coordinates."""
    tensor: str
    index: tuple[Expr, ...]       # over the accumulator's variables
    value: Expr                   # over them; the contraction read as Load(acc slot, ())


def upstream(c, members) -> set[str]:
    """Members the contraction reads through (transitively)."""
    seen: set[str] = set()
    stack = [c]
    while stack:
        for n in stack.pop().inputs:
            if n in members and n not in seen:
                seen.add(n)
                stack.append(members[n])
    return seen


def downstream(c, members) -> set[str]:
    """Members that read the contraction (transitively)."""
    down = {c.name}
    for p in members.values():           # members are in topological order
        if any(n in down for n in p.inputs):
            down.add(p.name)
    return down - {c.name}


def split_operands(body: Expr, a_vars: set, b_vars: set, m: set, n: set) -> tuple[Expr, Expr] | None:
    """Split the contraction's body (a product, perhaps rounded per product: the dot rounds its
    sum once instead) into the A and B operand expressions: factors reading M go to A, factors
    reading N to B; a factor reading neither (a scale, a K-only vector, or the second operand of a
    contraction without N axes) goes to B when B has none, else to A."""
    while isinstance(body, Cast):
        body = body.x
    facs: list[Expr] = []
    stack = [body]
    while stack:
        e = stack.pop()
        if isinstance(e, Binary) and e.op == "mul":
            stack += [e.b, e.a]
        else:
            facs.append(e)
    a = [f for f in facs if free_vars(f) & m]
    b = [f for f in facs if free_vars(f) & n and f not in a]
    rest = [f for f in facs if f not in a and f not in b]
    if not b:
        loaded = [f for f in rest if any(isinstance(x, Load) for x in walk(f))]
        if not loaded:
            return None
        b = [loaded[-1]]
        rest.remove(loaded[-1])
    a += rest
    if not a:
        return None
    fa, fb = a[0], b[0]
    for f in a[1:]:
        fa = binary("mul", fa, f)
    for f in b[1:]:
        fb = binary("mul", fb, f)
    if not (free_vars(fa) <= a_vars and free_vars(fb) <= b_vars):
        return None
    return fa, fb


def dot_operands(a: Expr, b: Expr, dtype: DType) -> tuple[Expr, Expr, DType]:
    """(A, B, operand type) of the dot: two 16-bit values of one type widened to fp32 for their
    product (attention's scores) multiply exactly as 16-bit tensor-core operands accumulating in
    fp32; otherwise the operands are the contraction's type."""
    if (dtype is DType.float32 and isinstance(a, Cast) and isinstance(b, Cast) and a.x.dtype in HALF
            and a.x.dtype is b.x.dtype):
        return a.x, b.x, a.x.dtype
    return a, b, dtype


def epilogue_store(o, einl: Inliner, acc: int, c, avars, ext) -> AccStore | None:
    """Output ``o`` of the epilogue, stored at the accumulator's coordinates: where it has the
    accumulator's shape and reads it at the same position, directly (row reductions allowed);
    otherwise through the inverse of the map it reads the accumulator by (no reductions)."""
    dt = c.out.dtype
    if o.out.shape == c.out.shape:
        value = einl.value_at(o.name, avars)
        if acc_reads(value, acc) <= {avars} and not isinstance(value, Value):   # (not a row reduction itself)
            return AccStore(o.name, avars, acc_at(value, acc, avars, dt, {}))
    ovars = tuple(Var(f"o{j}") for j in range(o.out.rank))
    value = einl.value_at(o.name, ovars)
    reads = acc_reads(value, acc)
    if einl.instances or len(reads) != 1 or o.out.numel != c.out.numel:
        return None
    (index,) = reads
    store = inverse_store(index, ovars, o.out.shape, avars, c.out.shape)
    if store is None:
        return None
    return AccStore(o.name, store, acc_at(value, acc, index, dt, dict(zip(ovars, store))))


def unravel(pos: Expr, vs, ext) -> dict:
    """The variables ``vs`` (row-major, extents ``ext``) at linear position ``pos``: a split's
    local position made global (split-K's K, flash-decoding's keys) and read back as the
    contraction's own variables."""
    out, inner = {}, 1
    for j in range(len(vs) - 1, -1, -1):
        e = pos if inner == 1 else binary("floordiv", pos, inner)
        out[vs[j]] = e if j == 0 else binary("mod", e, ext[j])
        inner *= ext[j]
    return out


def acc_reads(value: Expr, acc: int) -> set:
    """The indices ``value`` reads the accumulator (input slot ``acc``) at."""
    return {ld.index for ld in walk(value) if isinstance(ld, Load) and ld.tensor == acc}


def acc_at(value: Expr, acc: int, index, dtype: DType, mapping) -> Expr:
    """``value`` with its reads of the accumulator at ``index`` made the Dot's result, and its
    variables replaced by ``mapping``."""
    tile = Value(acc, dtype)
    out = transform(value, lambda e: tile if isinstance(e, Load) and e.tensor == acc and e.index == index else None)
    return substitute(out, mapping)


def _digit(atom: Expr, ovars, oshape) -> tuple[Var, int, int] | None:
    """``(v, weight, size)`` when ``atom`` is a digit of output variable v: ``v``, ``v // s``,
    ``v % n`` or ``v // s % n`` (weight s, size n or what the floordiv leaves of v's extent)."""
    n = None
    if isinstance(atom, Binary) and atom.op == "mod" and isinstance(atom.b, Const):
        atom, n = atom.a, atom.b.value
    s = 1
    if isinstance(atom, Binary) and atom.op == "floordiv" and isinstance(atom.b, Const):
        atom, s = atom.a, atom.b.value
    if atom not in ovars:
        return None
    extent = oshape[ovars.index(atom)]
    if n is None and extent % s:
        return None
    return atom, s, extent // s if n is None else n


def inverse_store(index, ovars, oshape, avars, ashape) -> tuple[Expr, ...] | None:
    """The output position of each accumulator element, when the output reads the accumulator at
    ``index`` (over ``ovars``), every accumulator dim is a row-major number in digits of output
    variables (``_digit``) and each output variable's digits make it up exactly (a permutation
    and reshape: heads split, merged or transposed; a grouped conv's ``[N, G, F]`` read as
    ``[N, G*F]``), else None."""
    digits: dict[Var, list[tuple[int, int, Expr]]] = {}   # v: (weight in v, size, value) per digit
    for e, a, n in zip(index, avars, ashape):
        lin = linear_form(e)
        if lin.const != 0:
            return None
        stride = 1
        for atom, coeff in sorted(lin.terms.items(), key=lambda t: t[1]):
            d = _digit(atom, ovars, oshape)
            if d is None or coeff != stride:
                return None
            v, weight, size = d
            digit = a if stride == 1 else binary("floordiv", a, stride)
            digits.setdefault(v, []).append((weight, size, digit if stride * size == n else binary("mod", digit, size)))
            stride *= size
        if stride != n:
            return None
    out = []
    for v, size in zip(ovars, oshape):
        value, weight = Const(0, v.dtype), 1
        for w, k, digit in sorted(digits.get(v, ()), key=lambda t: t[0]):
            if w != weight:
                return None   # a gap or an overlap between v's digits
            value, weight = value + digit * w, weight * k
        if weight != size and (size != 1 or v in digits):
            return None
        out.append(value)
    return tuple(out)
