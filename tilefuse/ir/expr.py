"""Scalar and index expressions: immutable, hashable, structurally interned nodes.

Two structurally equal expressions are the same Python object, so equality is identity and
hashing is cheap.  Smart constructors fold constants and apply the local identity rules of
``_FOLD`` (x+0, x*1, ...); range-aware simplification lives in ``transform/simplify.py``.

Loads name their tensor by *slot*: the position in the owning prim's ``inputs``.  A prim's body
is therefore independent of tensor names, and structurally identical prims hash alike.
"""
from __future__ import annotations

import functools
import weakref
from typing import Any, Callable, Iterator

from .dtypes import DType

INDEX = DType.int64

UNARY_OPS = frozenset({
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
    "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "sigmoid", "floor", "ceil", "round", "trunc",
    "sign", "not", "reciprocal", "isnan", "isinf", "log1p", "expm1", "exp2",
})
# Unary ops whose result is bool regardless of the operand.
UNARY_BOOL = frozenset({"isnan", "isinf", "not"})
ARITH_OPS = frozenset({"add", "sub", "mul", "div", "floordiv", "mod", "fmod", "pow", "max", "min"})
COMPARE_OPS = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
LOGIC_OPS = frozenset({"and", "or", "xor"})
BITWISE_OPS = frozenset({"bitand", "bitor", "bitxor", "shl", "shr"})
BINARY_OPS = ARITH_OPS | COMPARE_OPS | LOGIC_OPS | BITWISE_OPS

_TABLE: "weakref.WeakValueDictionary[tuple, Expr]" = weakref.WeakValueDictionary()


class Expr:
    """Base of all expression nodes.  Subclasses list their fields in ``_fields``."""

    __slots__ = ("dtype", "_hash", "__weakref__")
    _fields: tuple[str, ...] = ()

    @classmethod
    def _intern(cls, key: tuple, dtype: DType, **fields) -> "Expr":
        found = _TABLE.get(key)
        if found is not None:
            return found
        obj = object.__new__(cls)
        for k, v in fields.items():
            object.__setattr__(obj, k, v)
        object.__setattr__(obj, "dtype", dtype)
        object.__setattr__(obj, "_hash", hash(key))
        _TABLE[key] = obj
        return obj

    def __setattr__(self, k, v):
        raise AttributeError("expressions are immutable")

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:  # interned: structural equality is identity
        return self is other

    def __ne__(self, other) -> bool:
        return self is not other

    def __reduce__(self):
        return (_rebuild, (type(self).__name__, tuple(getattr(self, f) for f in self._fields)))

    def __bool__(self):
        raise TypeError("an Expr has no truth value; compare with `is` or use .eq()/.lt() for expressions")

    def children(self) -> tuple["Expr", ...]:
        return ()

    def with_children(self, kids: tuple["Expr", ...]) -> "Expr":
        return self

    def __repr__(self) -> str:
        from .printer import format_expr
        return format_expr(self)

    # Operator sugar; Python scalars take the other operand's dtype.
    def __add__(self, o): return binary("add", self, o)
    def __radd__(self, o): return binary("add", o, self)
    def __sub__(self, o): return binary("sub", self, o)
    def __rsub__(self, o): return binary("sub", o, self)
    def __mul__(self, o): return binary("mul", self, o)
    def __rmul__(self, o): return binary("mul", o, self)
    def __truediv__(self, o): return binary("div", self, o)
    def __rtruediv__(self, o): return binary("div", o, self)
    def __floordiv__(self, o): return binary("floordiv", self, o)
    def __rfloordiv__(self, o): return binary("floordiv", o, self)
    def __mod__(self, o): return binary("mod", self, o)
    def __rmod__(self, o): return binary("mod", o, self)
    def __pow__(self, o): return binary("pow", self, o)
    def __rpow__(self, o): return binary("pow", o, self)
    def __neg__(self): return unary("neg", self)
    def lt(self, o): return binary("lt", self, o)
    def le(self, o): return binary("le", self, o)
    def gt(self, o): return binary("gt", self, o)
    def ge(self, o): return binary("ge", self, o)
    def eq(self, o): return binary("eq", self, o)
    def ne(self, o): return binary("ne", self, o)


class Var(Expr):
    """An index variable (output axis or reduction axis); always int64."""
    __slots__ = ("name",)
    _fields = ("name",)

    def __new__(cls, name: str):
        return cls._intern((Var, name), INDEX, name=name)


class Const(Expr):
    __slots__ = ("value",)
    _fields = ("value", "dtype")

    def __new__(cls, value, dtype: DType):
        if dtype is DType.bool:
            value = bool(value)
        elif dtype.is_int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"non-integral constant {value} for {dtype.value}")
            value = int(value)
        else:
            value = float(value)
        return cls._intern((Const, repr(value), dtype), dtype, value=value)


class Load(Expr):
    """Element of the prim's input ``tensor`` (a slot index) at ``index`` (one int64 expr per dim)."""
    __slots__ = ("tensor", "index")
    _fields = ("tensor", "index", "dtype")

    def __new__(cls, tensor: int, index: tuple, dtype: DType):
        index = tuple(as_index(i) for i in index)
        return cls._intern((Load, tensor, index, dtype), dtype, tensor=tensor, index=index)

    def children(self):
        return self.index

    def with_children(self, kids):
        return Load(self.tensor, tuple(kids), self.dtype)


class Value(Expr):
    """A value a kernel computed earlier, by ``slot``: a reduction instance's, a product's, a loop
    state's.  Kernel-level only (templates and inlined kernel bodies): prims read tensors with
    ``Load``, a 0-d tensor as ``Load(t, ())``, never a ``Value``."""
    __slots__ = ("slot",)
    _fields = ("slot", "dtype")

    def __new__(cls, slot: int, dtype: DType):
        return cls._intern((Value, slot, dtype), dtype, slot=slot)


class Unary(Expr):
    __slots__ = ("op", "x")
    _fields = ("op", "x")

    def __new__(cls, op: str, x: Expr):
        if op not in UNARY_OPS:
            raise ValueError(f"unknown unary op {op!r}")
        dtype = DType.bool if op in UNARY_BOOL else x.dtype
        if op == "not" and x.dtype is not DType.bool:
            raise TypeError("'not' needs a bool operand")
        return cls._intern((Unary, op, x), dtype, op=op, x=x)

    def children(self):
        return (self.x,)

    def with_children(self, kids):
        return unary(self.op, kids[0])


class Binary(Expr):
    __slots__ = ("op", "a", "b")
    _fields = ("op", "a", "b")

    def __new__(cls, op: str, a: Expr, b: Expr):
        if op not in BINARY_OPS:
            raise ValueError(f"unknown binary op {op!r}")
        if a.dtype is not b.dtype:
            raise TypeError(f"{op}: operand dtypes differ ({a.dtype.value} vs {b.dtype.value}); insert a Cast")
        if op in LOGIC_OPS and a.dtype is not DType.bool:
            raise TypeError(f"{op} needs bool operands")
        dtype = DType.bool if op in COMPARE_OPS else a.dtype
        return cls._intern((Binary, op, a, b), dtype, op=op, a=a, b=b)

    def children(self):
        return (self.a, self.b)

    def with_children(self, kids):
        return binary(self.op, kids[0], kids[1])


class Select(Expr):
    """``a if cond else b``; only the taken branch is required to be in bounds."""
    __slots__ = ("cond", "a", "b")
    _fields = ("cond", "a", "b")

    def __new__(cls, cond: Expr, a: Expr, b: Expr):
        if cond.dtype is not DType.bool:
            raise TypeError("Select condition must be bool")
        if a.dtype is not b.dtype:
            raise TypeError(f"Select branches differ ({a.dtype.value} vs {b.dtype.value})")
        return cls._intern((Select, cond, a, b), a.dtype, cond=cond, a=a, b=b)

    def children(self):
        return (self.cond, self.a, self.b)

    def with_children(self, kids):
        return select(*kids)


class Cast(Expr):
    __slots__ = ("x",)
    _fields = ("x", "dtype")

    def __new__(cls, x: Expr, dtype: DType):
        return cls._intern((Cast, x, dtype), dtype, x=x)

    def children(self):
        return (self.x,)

    def with_children(self, kids):
        return cast(kids[0], self.dtype)


_CLASSES = {c.__name__: c for c in (Var, Const, Load, Value, Unary, Binary, Select, Cast)}


def _rebuild(name: str, args: tuple):
    return _CLASSES[name](*args)


# ---------------------------------------------------------------- smart constructors

def as_index(x) -> Expr:
    if isinstance(x, Expr):
        if x.dtype is not INDEX:
            raise TypeError(f"index expressions must be int64, got {x.dtype.value}")
        return x
    if isinstance(x, (int,)) and not isinstance(x, bool):
        return Const(x, INDEX)
    raise TypeError(f"not an index expression: {x!r}")


def _lift(x, like: Expr) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, (bool, int, float)):
        return Const(x, like.dtype)
    raise TypeError(f"cannot use {x!r} in an expression")


def _cval(e: Expr):
    return e.value if isinstance(e, Const) else None


def _fold_const(op: str, a, b):
    """Python semantics matching the expression semantics (see ir/evaluate.py)."""
    if op == "add": return a + b
    if op == "sub": return a - b
    if op == "mul": return a * b
    if op == "max": return a if (a != a or a >= b) else b  # NaN propagates, as in torch.maximum
    if op == "min": return a if (a != a or a <= b) else b
    if op == "floordiv" and b != 0: return a // b
    if op == "mod" and b != 0: return a % b
    if op in COMPARE_OPS:
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b, "eq": a == b, "ne": a != b}[op]
    if op == "and": return a and b
    if op == "or": return a or b
    if op == "xor": return a != b
    return None


def _is_exact(dtype: DType) -> bool:
    # Folding floats in Python (binary64) would not round like float32/float16 arithmetic.
    return dtype.is_int or dtype is DType.bool or dtype is DType.float64


# Local identities: (op, which operand is the constant, constant value) -> result selector.
_FOLD: dict[tuple[str, str, Any], Callable[[Expr, Expr], Expr]] = {
    ("add", "b", 0): lambda a, b: a,
    ("add", "a", 0): lambda a, b: b,
    ("sub", "b", 0): lambda a, b: a,
    ("mul", "b", 1): lambda a, b: a,
    ("mul", "a", 1): lambda a, b: b,
    ("div", "b", 1): lambda a, b: a,
    ("and", "b", True): lambda a, b: a,
    ("and", "a", True): lambda a, b: b,
    ("or", "b", False): lambda a, b: a,
    ("or", "a", False): lambda a, b: b,
}
# Integer-only identities (x*0 = 0 is false for floats: NaN, inf; x // 1.0 is floor(x)).
_FOLD_INT: dict[tuple[str, str, Any], Callable[[Expr, Expr], Expr]] = {
    ("floordiv", "b", 1): lambda a, b: a,
    ("mul", "b", 0): lambda a, b: b,
    ("mul", "a", 0): lambda a, b: a,
    ("mod", "b", 1): lambda a, b: Const(0, a.dtype),
}


def binary(op: str, a, b) -> Expr:
    if not isinstance(a, Expr):
        a = _lift(a, b)
    elif not isinstance(b, Expr):
        b = _lift(b, a)
    ca, cb = _cval(a), _cval(b)
    if ca is not None and cb is not None and _is_exact(a.dtype) and a.dtype is b.dtype:
        v = _fold_const(op, ca, cb)
        if v is not None:
            return Const(v, DType.bool if op in COMPARE_OPS else a.dtype)
    for table in ((_FOLD, _FOLD_INT) if a.dtype.is_int else (_FOLD,)):
        if cb is not None and (op, "b", cb) in table and a.dtype is b.dtype:
            return table[(op, "b", cb)](a, b)
        if ca is not None and (op, "a", ca) in table and a.dtype is b.dtype:
            return table[(op, "a", ca)](a, b)
    if a is b and op == "sub" and a.dtype.is_int:
        return Const(0, a.dtype)
    return Binary(op, a, b)


def unary(op: str, x: Expr) -> Expr:
    if op == "neg" and isinstance(x, Const) and _is_exact(x.dtype) and x.dtype is not DType.bool:
        return Const(-x.value, x.dtype)
    if op == "not" and isinstance(x, Const):
        return Const(not x.value, DType.bool)
    if op == "neg" and isinstance(x, Unary) and x.op == "neg":
        return x.x
    return Unary(op, x)


def select(cond: Expr, a, b) -> Expr:
    if not isinstance(a, Expr):
        a = _lift(a, b)
    elif not isinstance(b, Expr):
        b = _lift(b, a)
    if isinstance(cond, Const):
        return a if cond.value else b
    if a is b:
        return a
    return Select(cond, a, b)


def cast(x, dtype: DType) -> Expr:
    if not isinstance(x, Expr):
        return Const(x, dtype)
    if x.dtype is dtype:
        return x
    if isinstance(x, Const) and (dtype.is_int or dtype is DType.bool or dtype is DType.float64):
        v = x.value
        if dtype is DType.bool:
            return Const(bool(v), dtype)
        if dtype.is_int and (isinstance(v, bool) or float(v).is_integer()) and _fits(int(v), dtype):
            return Const(int(v), dtype)
    return Cast(x, dtype)


def _fits(v: int, dtype: DType) -> bool:
    # Out-of-range conversions wrap (or are undefined for floats): leave them to the executor.
    import torch
    info = torch.iinfo(dtype.to_torch())
    return info.min <= v <= info.max


def maximum(a, b) -> Expr:
    return binary("max", a, b)


def minimum(a, b) -> Expr:
    return binary("min", a, b)


def logical_and(*xs: Expr) -> Expr:
    out = Const(True, DType.bool)
    for x in xs:
        out = binary("and", out, x)
    return out


# ---------------------------------------------------------------- traversal

def walk(e: Expr, into: Callable[[Expr], bool] | None = None) -> Iterator[Expr]:
    """Pre-order traversal visiting each distinct node once; ``into(n)`` False skips n's children."""
    seen: set[int] = set()
    stack = [e]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        if into is None or into(n):
            stack.extend(reversed(n.children()))


def transform(e: Expr, fn: Callable[[Expr], Expr | None]) -> Expr:
    """Bottom-up rewrite: ``fn`` may return a replacement for a node (None keeps it).

    ``fn`` sees each node of ``e`` with its children already rewritten, and never a node the
    rewrite itself produced: when rebuilding a node over its new children collapses it (the smart
    constructors fold ``0 * 8 + i3`` to ``i3``, ``x if c else x`` to ``x``), the result is made of
    rewritten parts and is not offered to ``fn`` again.  Otherwise a substitution ``{i2: i1,
    i3: i2}`` would map a collapsed ``i2`` on to ``i1`` a second time."""
    memo: dict[int, Expr] = {}

    def go(n: Expr) -> Expr:
        got = memo.get(id(n))
        if got is not None:
            return got
        kids = n.children()
        if kids:
            new_kids = tuple(go(k) for k in kids)
            if all(x is y for x, y in zip(new_kids, kids)):
                m = n
            else:
                m = n.with_children(new_kids)
                if not _rebuilt(n, m, new_kids):
                    memo[id(n)] = m
                    return m
        else:
            m = n
        r = fn(m)
        out = m if r is None else r
        memo[id(n)] = out
        return out

    return go(e)


def _rebuilt(n: Expr, m: Expr, kids: tuple[Expr, ...]) -> bool:
    """Whether ``m`` is node ``n`` over the children ``kids`` (not folded into something else)."""
    if type(m) is not type(n) or len(m.children()) != len(kids):
        return False
    if not all(x is y for x, y in zip(m.children(), kids)):
        return False
    return all(getattr(m, f) == getattr(n, f) for f in type(n)._fields
               if f not in ("a", "b", "x", "cond", "index"))


def substitute(e: Expr, mapping: dict[Expr, Expr]) -> Expr:
    """Replace sub-expressions (typically Vars) by other expressions."""
    if not mapping:
        return e
    return transform(e, lambda n: mapping.get(n))


@functools.lru_cache(maxsize=1 << 16)
def free_vars(e: Expr) -> frozenset[Var]:
    """(Cached: planning asks for the same interned index expressions many times over.)"""
    return frozenset(n for n in walk(e) if isinstance(n, Var))


def loads(e: Expr) -> list[Load]:
    return list(load_nodes(e))


@functools.lru_cache(maxsize=1 << 14)
def load_nodes(e: Expr) -> tuple[Load, ...]:
    """The distinct ``Load`` nodes of ``e`` in ``walk`` order (cached: the cost model and the
    templates look for the loads of one expression several times)."""
    return tuple(n for n in walk(e) if isinstance(n, Load))


def node_count(e: Expr) -> int:
    """How many distinct nodes ``e`` has (``walk``'s count, without a generator's overhead)."""
    seen: set[int] = set()
    stack = [e]
    while stack:
        n = stack.pop()
        if id(n) not in seen:
            seen.add(id(n))
            stack.extend(n.children())
    return len(seen)
