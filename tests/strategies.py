"""Hypothesis strategies for well-typed expressions, shared by the IR, simplifier and analysis tests,
and for operator graphs (the fuzzing of generated kernels, ``tests/test_fuzz.py``).

Expressions are built through the smart constructors (the form every pass produces), so printing
and parsing them back must give the identical interned node.

- ``index_exprs()``: int64 index expressions over ``VARS`` with small constants, + - *, floordiv /
  mod / truncating div / fmod by constants (and floordiv/mod by expressions kept >= 1), min/max,
  abs, and ``where`` on comparisons;
- ``bool_exprs()``: comparisons of index expressions joined by and/or/not;
- ``value_exprs()``: float32 expressions over loads of ``INPUTS`` with math ops, casts and selects.

``eval_on_grid`` and ``eval_value`` evaluate them with the reference executor (a one-prim body).

- ``op_graphs()``: canonical operator graphs (``OpGraph``: the graph and its random feeds) of a
  few operators from every category, built with ``GraphBuilder`` (which tests also use by hand).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

import torch
from hypothesis import strategies as st

from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.evaluate import eval_prim
from tilefuse.ir.expr import (INDEX, Const, Expr, Load, Var, binary, cast, maximum, minimum, select,
                              substitute, unary)
from tilefuse.ir.graph import Attrs, Graph, Node
from tilefuse.ir.prim import Constant, Prim, TensorDecl

VARS = (Var("i"), Var("j"), Var("k"))
VAR_NAMES = tuple(v.name for v in VARS)

F32, F16 = DType.float32, DType.float16
# Slot -> (dtype, shape) of the tensors value expressions load; loads index them with VARS.
INPUTS = ((F32, (3, 4)), (F32, (4,)), (F16, (3,)), (INDEX, (4,)))
INPUT_DTYPES = tuple(dt for dt, _ in INPUTS)
# Extent of each var in value expressions (loads must stay in bounds).
VALUE_EXTENTS = (3, 4)

small_ints = st.integers(-8, 8)
divisors = st.integers(1, 9)


_CMP_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
# Index operators: name -> builder from (draw, recurse).
_INDEX_OPS = {
    "add": lambda d, g: g() + g(),
    "sub": lambda d, g: g() - g(),
    "mul_const": lambda d, g: g() * d(small_ints),
    "mul": lambda d, g: g() * g(),
    "floordiv": lambda d, g: g() // d(divisors),
    "mod": lambda d, g: g() % d(divisors),
    "div": lambda d, g: binary("div", g(), Const(d(divisors), INDEX)),
    "fmod": lambda d, g: binary("fmod", g(), Const(d(divisors), INDEX)),
    "floordiv_neg": lambda d, g: g() // -d(divisors),
    "mod_neg": lambda d, g: g() % -d(divisors),
    "floordiv_var": lambda d, g: g() // maximum(g(), Const(1, INDEX)),   # divisor >= 1, not constant
    "mod_var": lambda d, g: g() % maximum(g(), Const(1, INDEX)),
    "max": lambda d, g: maximum(g(), g()),
    "min": lambda d, g: minimum(g(), g()),
    "abs": lambda d, g: unary("abs", g()),
    "neg": lambda d, g: -g(),
    "where": lambda d, g: select(binary(d(st.sampled_from(_CMP_OPS)), g(), g()), g(), g()),
    # padding-like conditions on one variable: the simplifier refines ranges inside the branches
    "where_var": lambda d, g: select(binary(d(st.sampled_from(_CMP_OPS)), d(st.sampled_from(VARS)) * d(small_ints),
                                            Const(d(small_ints), INDEX)), g(), g()),
}
# Linear-ish operators are drawn more often: they are what fission produces.
_INDEX_WEIGHTED = ("add", "add", "sub", "mul_const", "mul_const", "floordiv", "floordiv", "mod", "mod",
                   "div", "mul", "max", "min", "abs", "neg", "where", "where_var", "where_var", "fmod", "floordiv_neg", "mod_neg",
                   "floordiv_var", "mod_var")


def _index_leaf(draw) -> Expr:
    if draw(st.integers(0, 2)):
        return draw(st.sampled_from(VARS))
    return Const(draw(small_ints), INDEX)


@st.composite
def index_exprs(draw, depth: int = 5) -> Expr:
    """Trees of up to ``depth`` levels of index operators."""
    def gen(d: int) -> Expr:
        if d == 0 or draw(st.integers(0, 5)) == 0:
            return _index_leaf(draw)
        op = draw(st.sampled_from(_INDEX_WEIGHTED))
        return _INDEX_OPS[op](draw, lambda: gen(d - 1))
    return gen(depth)


@st.composite
def bool_exprs(draw, depth: int = 3) -> Expr:
    """Comparisons of index expressions joined by and/or/xor/not/where."""
    def gen(d: int) -> Expr:
        if d == 0 or draw(st.integers(0, 2)) == 0:
            return binary(draw(st.sampled_from(_CMP_OPS)), draw(index_exprs(2)), draw(index_exprs(2)))
        op = draw(st.sampled_from(("and", "or", "xor", "not", "where")))
        if op == "not":
            return unary("not", gen(d - 1))
        if op == "where":
            return select(gen(d - 1), gen(d - 1), gen(d - 1))
        return binary(op, gen(d - 1), gen(d - 1))
    return gen(depth)


def ranges() -> st.SearchStrategy:
    """Inclusive ranges for VARS: small, possibly negative, at most 8 values each."""
    one = st.tuples(st.integers(-6, 8), st.integers(0, 7)).map(lambda p: (p[0], p[0] + p[1]))
    return st.tuples(one, one, one).map(lambda rs: dict(zip(VARS, rs)))


# ---------------------------------------------------------------- float32 value expressions

_F32_CONSTS = st.one_of(st.floats(-4, 4, width=32), st.sampled_from([0.0, -0.0, 1.0, math.inf, -math.inf]))
_UNARY_F = ("neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "floor", "reciprocal", "erf")
_BINARY_F = ("add", "sub", "mul", "div", "max", "min", "pow")


def _value_leaf(draw) -> Expr:
    i, j = VARS[0], VARS[1]
    got = draw(st.sampled_from((
        Load(0, (i, j), F32),
        Load(1, (j,), F32),
        Load(0, (i, Const(0, INDEX)), F32),
        cast(Load(2, (i,), F16), F32),
        cast(Load(3, (j,), INDEX), F32),
        cast(i - j, F32),
        None,
    )))
    return Const(draw(_F32_CONSTS), F32) if got is None else got


@st.composite
def value_exprs(draw, depth: int = 4) -> Expr:
    """float32 expressions over loads of INPUTS, constants and casts."""
    def cond(d: int) -> Expr:
        kind = draw(st.integers(0, 2))
        if kind == 0:
            return binary(draw(st.sampled_from(("lt", "le", "eq", "ne"))), gen(d - 1), gen(d - 1))
        return unary("isnan", gen(d - 1)) if kind == 1 else VARS[0].lt(VARS[1])

    def gen(d: int) -> Expr:
        if d == 0 or draw(st.integers(0, 4)) == 0:
            return _value_leaf(draw)
        kind = draw(st.integers(0, 5))
        if kind == 0:
            return unary(draw(st.sampled_from(_UNARY_F)), gen(d - 1))
        if kind in (1, 2):
            return binary(draw(st.sampled_from(_BINARY_F)), gen(d - 1), gen(d - 1))
        if kind == 3:
            return select(cond(d), gen(d - 1), gen(d - 1))
        return cast(cast(gen(d - 1), draw(st.sampled_from((F16, DType.float64)))), F32)
    return gen(depth)


def any_exprs() -> st.SearchStrategy:
    return st.one_of(index_exprs(), bool_exprs(), value_exprs())


def tree_size(e: Expr, memo: dict | None = None) -> int:
    """Nodes of the expression tree (shared sub-expressions counted at every use)."""
    memo = {} if memo is None else memo
    if e not in memo:
        memo[e] = 1 + sum(tree_size(k, memo) for k in e.children())
    return memo[e]


# ---------------------------------------------------------------- evaluation with the reference executor

def eval_on_grid(e: Expr, rng: dict) -> torch.Tensor:
    """Value of an index/bool expression at every point of the inclusive ranges ``rng`` of VARS
    (a tensor indexed by the offsets from each range's start), computed by the reference executor."""
    axes = tuple(Var(f"_g{k}") for k in range(len(VARS)))
    body = substitute(e, {v: a + rng[v][0] for v, a in zip(VARS, axes)})
    shape = tuple(rng[v][1] - rng[v][0] + 1 for v in VARS)
    return eval_prim(Prim("grid", (), axes, body, TensorType(shape, e.dtype)), [])


def value_inputs(seed: int) -> list:
    """Random tensors for INPUTS, with a NaN and an inf among the floats."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for dt, shape in INPUTS:
        if dt is INDEX:
            out.append(torch.randint(-3, 4, shape, generator=g))
            continue
        t = torch.randn(shape, generator=g) * 2
        t.view(-1)[0] = math.nan if seed % 3 == 0 else t.view(-1)[0]
        t.view(-1)[-1] = math.inf if seed % 5 == 0 else t.view(-1)[-1]
        out.append(t.to(dt.to_torch()))
    return out


def eval_value(e: Expr, inputs: list) -> torch.Tensor:
    """A float value expression over (i, j) in VALUE_EXTENTS, by the reference executor."""
    names = tuple(f"x{k}" for k in range(len(INPUTS)))
    return eval_prim(Prim("v", names, VARS[:2], e, TensorType(VALUE_EXTENTS, e.dtype)), inputs)


# ---------------------------------------------------------------- operator graphs

BF16, I32, I64, BOOL = DType.bfloat16, DType.int32, DType.int64, DType.bool
FLOAT_DTYPES = (F32, F16, BF16)
INT_DTYPES = (I32, I64)
# Small int inputs keep products, sums and matmuls of ints far from overflow.
INT_RANGE = (-5, 6)
MAX_ELEMS = 96          # largest tensor a generated op makes (the interpreter runs every element)


def random_tensor(gen: torch.Generator, tt: TensorType, bound: int | None = None,
                  specials: bool = False) -> torch.Tensor:
    """Values for a tensor of type ``tt``: normal floats (with NaN, +inf and -inf at about one
    position in eight when ``specials``), ints in INT_RANGE, or indices in [-bound, bound)."""
    shape, dt = tt.shape, tt.dtype
    if bound is not None:
        return torch.randint(-bound, max(bound, 1), shape, generator=gen).to(dt.to_torch())
    if dt.is_int:
        return torch.randint(*INT_RANGE, shape, generator=gen).to(dt.to_torch())
    if dt is BOOL:
        return torch.randint(0, 2, shape, generator=gen).bool()
    t = torch.randn(shape, generator=gen) * 1.5
    if specials and t.numel():
        pick = torch.randint(0, 24, shape, generator=gen)
        t = torch.where(pick == 0, math.nan, torch.where(pick == 1, math.inf, torch.where(pick == 2, -math.inf, t)))
    return t.to(dt.to_torch())


@dataclass(frozen=True, eq=False)
class OpGraph:
    """A generated operator graph and how to feed it: ``bounds`` gives the index inputs' ranges
    (values in [-n, n)), ``specials`` puts NaN and infinities into float inputs."""
    graph: Graph
    bounds: Mapping[str, int]
    seed: int
    specials: bool

    def feeds(self) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed)
        return {d.name: random_tensor(gen, d.type, self.bounds.get(d.name), self.specials)
                for d in self.graph.inputs}

    def __repr__(self) -> str:
        return f"OpGraph(seed={self.seed}, specials={self.specials}, bounds={dict(self.bounds)})\n{self.graph}"


def pick(draw, b: "GraphBuilder", options):
    """One of ``options``, drawn so that each is as likely: hypothesis collapses draws to their
    simplest choice (the first) as an example nears its size limit, which made the first entry
    of a long tuple (Relu) 100 times as common as a late one (Erf); the drawn index is turned by
    the graph's seed and by how many choices the graph has made, so that collapse lands on a
    different entry each time, and a failure still shrinks (to index 0: that choice's own first)."""
    b.picks += 1
    turn = (b.seed * 2654435761 + b.picks * 40503) >> 7
    return options[(draw(st.integers(0, len(options) - 1)) + turn) % len(options)]


class GraphBuilder:
    """Builds a canonical operator ``Graph`` (``tilefuse/ir/graph.py``) node by node; every value's
    type is declared by the caller, so fission checks its rules against types computed here."""

    def __init__(self, seed: int = 0, specials: bool = False):
        self.seed, self.specials = seed, specials
        self.picks = 0                  # choices ``pick`` has made
        self.gen = torch.Generator().manual_seed(seed + 1)
        self.inputs: list[TensorDecl] = []
        self.constants: list[Constant] = []
        self.nodes: list[Node] = []
        self.types: dict[str, TensorType] = {}
        self.bounds: dict[str, int] = {}
        self.used: set[str] = set()

    def _new(self, tt: TensorType, prefix: str) -> str:
        name = f"{prefix}{len(self.types)}"
        self.types[name] = tt
        return name

    def input(self, shape, dtype: DType, bound: int | None = None) -> str:
        name = self._new(TensorType(tuple(shape), dtype), "x")
        self.inputs.append(TensorDecl(name, self.types[name]))
        if bound is not None:
            self.bounds[name] = bound
        return name

    def const(self, shape, dtype: DType, bound: int | None = None) -> str:
        """A constant of random values (as ``random_tensor``)."""
        tt = TensorType(tuple(shape), dtype)
        name = self._new(tt, "c")
        self.constants.append(Constant(name, random_tensor(self.gen, tt, bound, self.specials)))
        return name

    def constant(self, data: torch.Tensor) -> str:
        """A constant of the given values (a failure's, pinned in a regression test)."""
        name = self._new(TensorType(tuple(data.shape), DType.from_torch(data.dtype)), "c")
        self.constants.append(Constant(name, data))
        return name

    def node(self, op: str, inputs, *outs: TensorType, **attrs):
        """Appends a node; returns its output's name (a tuple of names for several outputs)."""
        names = tuple(self._new(t, "v") for t in outs)
        self.used.update(n for n in inputs if n)
        self.nodes.append(Node(op, f"n{len(self.nodes)}", tuple(inputs), names, Attrs(attrs)))
        return names[0] if len(names) == 1 else names

    def build(self, outputs=None) -> OpGraph:
        """The graph; its outputs are ``outputs``, by default every node output no node reads."""
        made = [o for n in self.nodes for o in n.outputs]
        outs = tuple(outputs) if outputs is not None else tuple(o for o in made if o not in self.used)
        graph = Graph(tuple(self.inputs), outs, tuple(self.nodes), tuple(self.constants), dict(self.types))
        return OpGraph(graph, dict(self.bounds), self.seed, self.specials)


# Dims of generated tensors: small, odd and even, 1 often, 0 about one time in sixteen.
DIMS = st.sampled_from((1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 7, 9, 0))


def _numel(shape) -> int:
    return math.prod(shape)


def _fits(shape) -> bool:
    return _numel(shape) <= 2 * MAX_ELEMS


def _bshape(*shapes) -> tuple[int, ...]:
    """numpy broadcasting (the generator only makes compatible shapes)."""
    rank = max(map(len, shapes))
    return tuple(max({s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0} - {1}, default=1)
                 for d in range(rank))


@st.composite
def shapes(draw, min_rank: int = 0, max_rank: int = 3) -> tuple[int, ...]:
    """A shape of at most MAX_ELEMS elements (dims past the budget become 1)."""
    dims = []
    for _ in range(draw(st.integers(min_rank, max_rank))):
        d = draw(DIMS)
        dims.append(d if _numel(dims) * d <= MAX_ELEMS else 1)
    return tuple(dims)


def _partner(draw, shape) -> tuple[int, ...]:
    """A shape broadcasting with ``shape``: dims kept, set to 1 or (where 1) widened, leading
    dims dropped or one added."""
    dims = []
    for d in shape:
        k = draw(st.integers(0, 3))
        dims.append(1 if k == 2 else draw(DIMS) if k == 3 and d == 1 else d)
    lead = draw(st.integers(-len(dims), 1))
    dims = dims[-lead:] if lead < 0 else [draw(DIMS)] + dims if lead and len(dims) < 4 else dims
    return tuple(dims) if _fits(_bshape(shape, dims)) else tuple(shape)


def _operand(draw, b: GraphBuilder, ok, fresh) -> str:
    """A value of the graph whose type satisfies ``ok`` (the latest first, so chains form), or
    ``fresh()``, a new input or constant."""
    got = [n for n in reversed(list(b.types)) if ok(b.types[n])]
    if got and draw(st.integers(0, 3)):
        return draw(st.sampled_from(got))
    return fresh()


def _fresh(draw, b: GraphBuilder, shape, dtype) -> str:
    """A new graph input, or (weights) a constant, of the given type."""
    if not draw(st.integers(0, 4)):
        return b.const(shape, dtype)
    return b.input(shape, dtype)


def _of_type(draw, b: GraphBuilder, shape, dtype) -> str:
    shape = tuple(shape)
    return _operand(draw, b, lambda t: t.shape == shape and t.dtype is dtype, lambda: _fresh(draw, b, shape, dtype))


def _value(draw, b: GraphBuilder, dtypes, min_rank: int = 0, max_rank: int = 3) -> str:
    """A value of one of ``dtypes`` and rank in [min_rank, max_rank]."""
    return _operand(draw, b, lambda t: t.dtype in dtypes and min_rank <= t.rank <= max_rank,
                    lambda: _fresh(draw, b, draw(shapes(min_rank, max_rank)), draw(st.sampled_from(dtypes))))


def _tt(shape, dtype) -> TensorType:
    return TensorType(tuple(shape), dtype)


ANY = FLOAT_DTYPES + INT_DTYPES + (BOOL,)
NUMERIC = FLOAT_DTYPES + INT_DTYPES

# ---- elementwise and broadcast

UNARY_FLOAT = ("Relu", "Exp", "Neg", "Abs", "Sqrt", "Log", "Tanh", "Sigmoid", "Erf", "Reciprocal", "Floor",
               "Sin", "Sign", "Gelu", "Silu", "LeakyRelu", "Elu", "HardSigmoid", "Softplus", "Clip", "IsNaN", "IsInf",
               "Mish", "Selu", "Celu", "Softsign", "HardSwish", "ThresholdedRelu", "Shrink", "Ceil", "Round")
UNARY_INT = ("Abs", "Neg", "Sign", "Relu", "Clip")
ARITH_FLOAT = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow")
ARITH_INT = ("Add", "Sub", "Mul", "Max", "Min")     # no Div: an int divisor may be 0
COMPARE = ("Greater", "Less", "Equal", "LessOrEqual")
LOGIC = ("And", "Or", "Xor")


def _unary(draw, b):
    x = _value(draw, b, ANY)
    t = b.types[x]
    if t.dtype is BOOL:
        b.node("Not", [x], t)
        return
    op = pick(draw, b, UNARY_FLOAT if t.dtype.is_float else UNARY_INT)
    ins, attrs = [x], {}
    if op == "Gelu":
        attrs["approximate"] = draw(st.sampled_from(("none", "tanh")))
    elif op in ("LeakyRelu", "Elu", "Celu", "ThresholdedRelu"):
        attrs["alpha"] = draw(st.sampled_from((0.1, 1.0, 2.5)))
    elif op == "Shrink":
        attrs.update(lambd=draw(st.sampled_from((0.0, 0.5, 1.5))), bias=draw(st.sampled_from((0.0, 0.5))))
    elif op == "Clip":      # min and max: optional scalar inputs
        ins += [b.const((), t.dtype) if draw(st.booleans()) else "" for _ in range(2)]
    b.node(op, ins, _tt(t.shape, BOOL if op in ("IsNaN", "IsInf") else t.dtype), **attrs)


def _cast(draw, b):
    x = _value(draw, b, ANY)
    t = b.types[x]
    # never float -> int: NaN, inf and out-of-range values have no defined integer
    to = draw(st.sampled_from(FLOAT_DTYPES + (BOOL,) if t.dtype.is_float else NUMERIC if t.dtype is BOOL else ANY))
    b.node("Cast", [x], _tt(t.shape, to), to=to.to_onnx())


def _binary(draw, b):
    x = _value(draw, b, ANY)
    t = b.types[x]
    y = _of_type(draw, b, _partner(draw, t.shape), t.dtype)
    a, c = (x, y) if draw(st.booleans()) else (y, x)
    if t.dtype is BOOL:
        op, out = draw(st.sampled_from(LOGIC)), BOOL
    elif draw(st.integers(0, 3)):
        op, out = pick(draw, b, ARITH_FLOAT if t.dtype.is_float else ARITH_INT), t.dtype
    else:
        op, out = draw(st.sampled_from(COMPARE)), BOOL
    b.node(op, [a, c], _tt(_bshape(b.types[a].shape, b.types[c].shape), out))


def _prelu(draw, b):
    """PRelu: a float value and a slope broadcast to it (numpy rules, as opset 21)."""
    x = _value(draw, b, FLOAT_DTYPES)
    t = b.types[x]
    slope = _of_type(draw, b, draw(st.sampled_from((t.shape, t.shape[-1:], (1,) * min(t.rank, 1)))), t.dtype)
    b.node("PRelu", [x, slope], t)


def _where(draw, b):
    x = _value(draw, b, ANY)
    t = b.types[x]
    cond = _of_type(draw, b, _partner(draw, t.shape), BOOL)
    y = _of_type(draw, b, _partner(draw, _bshape(t.shape, b.types[cond].shape)), t.dtype)
    shape = _bshape(t.shape, b.types[cond].shape, b.types[y].shape)
    if _fits(shape):
        b.node("Where", [cond, x, y], _tt(shape, t.dtype))


# ---- layout

def _transpose(draw, b):
    x = _value(draw, b, ANY, 1, 4)
    t = b.types[x]
    perm = draw(st.permutations(range(t.rank)))
    b.node("Transpose", [x], _tt([t.shape[p] for p in perm], t.dtype), perm=tuple(perm))


def _factor(draw, n: int, rank: int) -> tuple[int, ...]:
    """A random shape of ``rank`` with ``n`` elements."""
    if n == 0:
        dims = [draw(DIMS) for _ in range(max(rank, 1))]
        dims[draw(st.integers(0, len(dims) - 1))] = 0
        return tuple(dims)
    dims, rest = [], n
    for _ in range(rank - 1):
        d = draw(st.sampled_from([k for k in range(1, rest + 1) if rest % k == 0]))
        dims.append(d)
        rest //= d
    return tuple(dims + [rest]) if rank else ()


def _reshape(draw, b):
    x = _value(draw, b, ANY)
    t = b.types[x]
    n = _numel(t.shape)
    shape = _factor(draw, n, draw(st.integers(0 if n == 1 else 1, 4)))
    b.node("Reshape", [x], _tt(shape, t.dtype))


def _flatten(draw, b):
    x = _value(draw, b, ANY)
    t = b.types[x]
    axis = draw(st.integers(-t.rank, t.rank))
    a = axis + t.rank if axis < 0 else axis
    b.node("Flatten", [x], _tt((_numel(t.shape[:a]), _numel(t.shape[a:])), t.dtype), axis=axis)


def _squeeze(draw, b):
    x = _value(draw, b, ANY)
    t = b.types[x]
    ones = [d for d, n in enumerate(t.shape) if n == 1]
    if ones and draw(st.booleans()):
        axes = sorted(draw(st.sets(st.sampled_from(ones), min_size=1)))
        b.node("Squeeze", [x], _tt([n for d, n in enumerate(t.shape) if d not in axes], t.dtype), axes=tuple(axes))
    elif t.rank < 4:
        at = draw(st.integers(0, t.rank))
        b.node("Unsqueeze", [x], _tt(t.shape[:at] + (1,) + t.shape[at:], t.dtype), axes=(at,))


def _slice_len(dim: int, start: int, end: int, step: int) -> int:
    """Elements an ONNX Slice keeps of a dim (the opset-21 text: negative values count from the
    end, then start and end are clamped to [0, dim] ([0, dim - 1] and [-1, dim - 1] for a
    negative step))."""
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return max(0, -(-(end - start) // step))


def _slice(draw, b):
    x = _value(draw, b, ANY, 1, 4)
    t = b.types[x]
    axes = draw(st.permutations(range(t.rank)))[:draw(st.integers(1, t.rank))]
    shape = list(t.shape)
    starts, ends, steps = [], [], []
    for a in axes:
        n = t.shape[a]
        step = draw(st.sampled_from((1, 2, -1, 3, -2)))
        start, end = draw(st.integers(-n - 2, n + 2)), draw(st.integers(-n - 2, n + 2))
        starts.append(start)
        ends.append(end)
        steps.append(step)
        shape[a] = _slice_len(n, start, end, step)
    if draw(st.booleans()):          # negative axes
        axes = [a - t.rank for a in axes]
    b.node("Slice", [x], _tt(shape, t.dtype), starts=tuple(starts), ends=tuple(ends), axes=tuple(axes),
           steps=tuple(steps))


def _pad(draw, b):
    x = _value(draw, b, ANY, 1, 4)
    t = b.types[x]
    mode = draw(st.sampled_from(("constant", "reflect", "edge", "wrap")))
    pads = [draw(st.integers(-1, 3)) for _ in range(2 * t.rank)]
    kept = [n - max(-pads[d], 0) - max(-pads[d + t.rank], 0) for d, n in enumerate(t.shape)]
    for d, k in enumerate(kept):
        if k < 0:                   # cannot crop more than the axis has
            pads[d] = pads[d + t.rank] = 0
            kept[d] = t.shape[d]
    if mode != "constant" and any(kept[d] == 0 and (pads[d] > 0 or pads[d + t.rank] > 0) for d in range(t.rank)):
        mode = "constant"           # only a constant pads an empty axis
    shape = [k + max(pads[d], 0) + max(pads[d + t.rank], 0) for d, k in enumerate(kept)]
    if not _fits(shape):
        return
    ins = [x]
    if mode == "constant" and draw(st.booleans()):
        ins.append(b.const((), t.dtype))
    b.node("Pad", ins, _tt(shape, t.dtype), pads=tuple(pads), mode=mode)


def _concat(draw, b):
    x = _value(draw, b, ANY, 1, 4)
    t = b.types[x]
    axis = draw(st.integers(-t.rank, t.rank - 1))
    a = axis % t.rank
    parts = [x]
    for _ in range(draw(st.integers(1, 2))):
        shape = t.shape[:a] + (draw(DIMS),) + t.shape[a + 1:]
        parts.append(_of_type(draw, b, shape, t.dtype))
    parts = [parts[k] for k in draw(st.permutations(range(len(parts))))]
    shape = t.shape[:a] + (sum(b.types[p].shape[a] for p in parts),) + t.shape[a + 1:]
    if _fits(shape):
        b.node("Concat", parts, _tt(shape, t.dtype), axis=axis)


def _split(draw, b):
    x = _value(draw, b, ANY, 1, 4)
    t = b.types[x]
    a = draw(st.integers(0, t.rank - 1))
    n = t.shape[a]
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=1, max_size=2)))
    sizes = [hi - lo for lo, hi in zip([0] + cuts, cuts + [n])]
    outs = [_tt(t.shape[:a] + (s,) + t.shape[a + 1:], t.dtype) for s in sizes]
    b.node("Split", [x], *outs, axis=a, split=tuple(sizes))


def _expand(draw, b):
    x = _value(draw, b, ANY)
    t = b.types[x]
    target = [draw(DIMS) if n == 1 and draw(st.booleans()) else n for n in t.shape]
    if len(target) < 4 and draw(st.booleans()):
        target.insert(0, draw(DIMS))
    shape = _bshape(t.shape, target)
    if _fits(shape):
        b.node("Expand", [x], _tt(shape, t.dtype))


def _trilu(draw, b):
    x = _value(draw, b, ANY, 2, 4)
    t = b.types[x]
    b.node("Trilu", [x], t, upper=int(draw(st.booleans())), k=draw(st.integers(-3, 3)))


def _tile(draw, b):
    x = _value(draw, b, ANY, 1, 4)
    t = b.types[x]
    reps = tuple(draw(st.sampled_from((1, 2, 3, 0))) for _ in t.shape)
    shape = tuple(n * r for n, r in zip(t.shape, reps))
    if _fits(shape):
        b.node("Tile", [x], _tt(shape, t.dtype), repeats=reps)


# ---- reductions and normalizations

REDUCE_FLOAT = ("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean", "ReduceProd", "ReduceSumSquare",
                "ReduceL1", "ReduceL2", "ReduceLogSumExp")
REDUCE_INT = ("ReduceSum", "ReduceMax", "ReduceMin")   # no int products: they overflow


def _reduce(draw, b):
    x = _value(draw, b, NUMERIC)
    t = b.types[x]
    op = pick(draw, b, REDUCE_FLOAT if t.dtype.is_float else REDUCE_INT)
    axes = sorted(draw(st.sets(st.integers(0, t.rank - 1)))) if t.rank else []
    keep = draw(st.booleans())
    every = axes or range(t.rank)       # no axes: all of them
    shape = [1 if d in every else n for d, n in enumerate(t.shape) if keep or d not in every]
    if axes and draw(st.booleans()):
        axes = [a - t.rank for a in axes]
    b.node(op, [x], _tt(shape, t.dtype), keepdims=int(keep), **({"axes": tuple(axes)} if axes else {}))


def _argreduce(draw, b):
    x = _value(draw, b, NUMERIC, 1, 4)
    t = b.types[x]
    a = draw(st.integers(0, t.rank - 1))
    keep = draw(st.booleans())
    shape = [1 if d == a else n for d, n in enumerate(t.shape) if keep or d != a]
    if t.shape[a] == 0 and _numel(shape):       # no index to give: refused (as by torch and onnxruntime)
        return
    b.node(draw(st.sampled_from(("ArgMax", "ArgMin"))), [x], _tt(shape, I64), axis=a, keepdims=int(keep),
           select_last_index=int(draw(st.booleans())))


def _softmax(draw, b):
    x = _value(draw, b, FLOAT_DTYPES, 1, 4)
    t = b.types[x]
    b.node(draw(st.sampled_from(("Softmax", "LogSoftmax"))), [x], t, axis=draw(st.integers(-t.rank, t.rank - 1)))


def _norm(draw, b):
    """LayerNormalization (scale and bias optional) or RMSNormalization over the axes from ``axis``."""
    x = _value(draw, b, FLOAT_DTYPES, 1, 4)
    t = b.types[x]
    axis = draw(st.integers(-t.rank, t.rank - 1))
    inner = t.shape[axis:]
    eps = draw(st.sampled_from((1e-5, 0.1)))
    if draw(st.booleans()):
        scale = _of_type(draw, b, inner, t.dtype)
        b.node("RMSNormalization", [x, scale], t, axis=axis, epsilon=eps)
        return
    ins = [x] + [_of_type(draw, b, inner, t.dtype) if draw(st.booleans()) else "" for _ in range(2)]
    b.node("LayerNormalization", ins, t, axis=axis, epsilon=eps)


def _channel_norm(draw, b):
    """GroupNormalization (opset 21: per-channel scale and bias) or InstanceNormalization over an
    [N, C, ...] value."""
    x = _value(draw, b, FLOAT_DTYPES, 3, 4)
    t = b.types[x]
    c = t.shape[1]
    if not c:
        return
    scale, bias = (_of_type(draw, b, (c,), t.dtype) for _ in range(2))
    eps = draw(st.sampled_from((1e-5, 0.1)))
    if draw(st.booleans()):
        groups = draw(st.sampled_from([g for g in range(1, c + 1) if c % g == 0]))
        b.node("GroupNormalization", [x, scale, bias], t, num_groups=groups, epsilon=eps)
    else:
        b.node("InstanceNormalization", [x, scale, bias], t, epsilon=eps)


def _cumsum(draw, b):
    """CumSum, or CumProd of floats (an integer product overflows)."""
    x = _value(draw, b, NUMERIC, 1, 4)
    t = b.types[x]
    op = "CumProd" if t.dtype.is_float and draw(st.integers(0, 2)) == 0 else "CumSum"
    b.node(op, [x], t, axis=draw(st.integers(-t.rank, t.rank - 1)), exclusive=int(draw(st.booleans())),
           reverse=int(draw(st.booleans())))


def _pool(draw, b):
    """MaxPool or AveragePool over 1-d or 2-d windows: strides, dilations, pads up to half the window."""
    nsp = draw(st.integers(1, 2))
    sizes = tuple(draw(st.integers(1, 6)) for _ in range(nsp))
    x = _of_type(draw, b, (draw(st.integers(1, 2)), draw(st.integers(1, 3))) + sizes,
                 draw(st.sampled_from(FLOAT_DTYPES)))
    kernel = [draw(st.integers(1, 3)) for _ in range(nsp)]
    strides = [draw(st.integers(1, 2)) for _ in range(nsp)]
    op = draw(st.sampled_from(("MaxPool", "AveragePool")))
    # AveragePool's dilations are opset 19+
    dil = [draw(st.integers(1, 2)) if op == "MaxPool" else 1 for _ in range(nsp)]
    pads = [draw(st.integers(0, kernel[i % nsp] // 2)) for i in range(2 * nsp)]
    for i in range(nsp):
        if sizes[i] + pads[i] + pads[i + nsp] < dil[i] * (kernel[i] - 1) + 1:     # one window must fit
            kernel[i], dil[i], pads[i], pads[i + nsp] = 1, 1, 0, 0
    out = [(n + pads[i] + pads[i + nsp] - dil[i] * (kernel[i] - 1) - 1) // strides[i] + 1
           for i, n in enumerate(sizes)]
    t = b.types[x]
    attrs = dict(kernel_shape=tuple(kernel), strides=tuple(strides), pads=tuple(pads))
    attrs |= dict(dilations=tuple(dil)) if op == "MaxPool" else dict(count_include_pad=int(draw(st.booleans())))
    b.node(op, [x], _tt(t.shape[:2] + tuple(out), t.dtype), **attrs)


# ---- contractions

def _maybe_transposed(draw, b, shape, dtype) -> str:
    """A fresh operand of ``shape``, or one of its last two dims swapped then transposed back."""
    if len(shape) < 2 or draw(st.booleans()):
        return _fresh(draw, b, shape, dtype)
    swapped = tuple(shape[:-2]) + (shape[-1], shape[-2])
    perm = tuple(range(len(shape) - 2)) + (len(shape) - 1, len(shape) - 2)
    return b.node("Transpose", [_fresh(draw, b, swapped, dtype)], _tt(shape, dtype), perm=perm)


def _matmul(draw, b):
    """numpy matmul: 1-D operands, broadcast batch dims, transposed operands, int too."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES + FLOAT_DTYPES + INT_DTYPES))
    a = _operand(draw, b, lambda t: t.dtype is dtype and 1 <= t.rank <= 3,
                 lambda: _maybe_transposed(draw, b, draw(shapes(1, 3)), dtype))
    ashape = b.types[a].shape
    k, abatch = ashape[-1], ashape[:-2]
    brank = draw(st.integers(1, 3))
    bbatch = _partner(draw, abatch)[-(brank - 2):] if brank == 3 else ()
    bshape = (k,) if brank == 1 else bbatch + (k, draw(DIMS))
    c = _maybe_transposed(draw, b, bshape, dtype)
    out = _bshape(abatch, bbatch) + ashape[-2:-1] + bshape[-1:] * (brank > 1)
    if _fits(out):
        b.node("MatMul", [a, c], _tt(out, dtype))


def _gemm(draw, b):
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    m, k, n = draw(DIMS), draw(DIMS), draw(DIMS)
    ta, tb = draw(st.booleans()), draw(st.booleans())
    a = _of_type(draw, b, (k, m) if ta else (m, k), dtype)
    w = _fresh(draw, b, (n, k) if tb else (k, n), dtype)
    ins = [a, w]
    if draw(st.booleans()):
        ins.append(_fresh(draw, b, draw(st.sampled_from(((n,), (m, 1), (1, n), (m, n), ()))), dtype))
    b.node("Gemm", ins, _tt((m, n), dtype), transA=int(ta), transB=int(tb),
           alpha=draw(st.sampled_from((1.0, 0.5))), beta=draw(st.sampled_from((1.0, 2.0, 0.0))))


def _conv(draw, b):
    """1-d or 2-d convolution: strides, dilations, pads, groups (depthwise too), optional bias."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    nsp = draw(st.integers(1, 2))
    group = draw(st.sampled_from((1, 2, 3)))
    cin, per = group * draw(st.integers(1, 2)), draw(st.integers(1, 2))
    sizes = [draw(st.integers(1, 6)) for _ in range(nsp)]
    kernel = [draw(st.integers(1, 3)) for _ in range(nsp)]
    strides = [draw(st.integers(1, 2)) for _ in range(nsp)]
    dil = [draw(st.integers(1, 2)) for _ in range(nsp)]
    pads = [draw(st.integers(0, 1)) for _ in range(2 * nsp)]
    span = [d * (k - 1) + 1 for d, k in zip(dil, kernel)]
    for i in range(nsp):
        if sizes[i] + pads[i] + pads[i + nsp] < span[i]:     # the window must fit once
            kernel[i], dil[i], span[i] = 1, 1, 1
    out = [(s + pads[i] + pads[i + nsp] - span[i]) // strides[i] + 1 for i, s in enumerate(sizes)]
    n = draw(st.integers(1, 2))
    x = _of_type(draw, b, (n, cin) + tuple(sizes), dtype)
    w = _fresh(draw, b, (group * per, cin // group) + tuple(kernel), dtype)
    ins = [x, w] + ([_fresh(draw, b, (group * per,), dtype)] if draw(st.booleans()) else [])
    b.node("Conv", ins, _tt((n, group * per) + tuple(out), dtype), group=group, kernel_shape=tuple(kernel),
           strides=tuple(strides), dilations=tuple(dil), pads=tuple(pads))


def _sdpa(draw, b):
    """ScaledDotProductAttention: a bool or additive mask, or causal; a scale; grouped KV heads."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    bs, hk, gq = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    lq, s, e, ev = draw(DIMS), draw(DIMS), draw(DIMS), draw(DIMS)
    q = _of_type(draw, b, (bs, hk * gq, lq, e), dtype)
    k, v = b.input((bs, hk, s, e), dtype), b.input((bs, hk, s, ev), dtype)
    ins, attrs = [q, k, v], {"enable_gqa": int(gq > 1)}
    mask = draw(st.sampled_from(("none", "causal", "bool", "float")))
    if mask == "causal":
        attrs["is_causal"] = 1
    elif mask != "none":
        ins.append(_fresh(draw, b, draw(st.sampled_from(((lq, s), (bs, 1, lq, s)))), BOOL if mask == "bool" else dtype))
    if draw(st.booleans()):
        attrs["scale"] = 0.5
    b.node("ScaledDotProductAttention", ins, _tt((bs, hk * gq, lq, ev), dtype), **attrs)


def _attention(draw, b):
    """Attention written out: MatMul(Q, Kᵀ), scale, Softmax, MatMul with V (a chain)."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    bs, lq, s, e, ev = draw(st.integers(1, 2)), draw(DIMS), draw(DIMS), draw(DIMS), draw(DIMS)
    q = _of_type(draw, b, (bs, lq, e), dtype)
    kt = _maybe_transposed(draw, b, (bs, e, s), dtype)
    scores = b.node("MatMul", [q, kt], _tt((bs, lq, s), dtype))
    scores = b.node("Mul", [scores, b.const((), dtype)], _tt((bs, lq, s), dtype))
    p = b.node("Softmax", [scores], _tt((bs, lq, s), dtype), axis=-1)
    b.node("MatMul", [p, _fresh(draw, b, (bs, s, ev), dtype)], _tt((bs, lq, ev), dtype))


def _mlp(draw, b):
    """MatMul, an activation, MatMul (a GEMM chain)."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    m, k, f, n = draw(DIMS), draw(DIMS), draw(DIMS), draw(DIMS)
    x = _of_type(draw, b, (m, k), dtype)
    h = b.node("MatMul", [x, _maybe_transposed(draw, b, (k, f), dtype)], _tt((m, f), dtype))
    h = b.node(draw(st.sampled_from(("Relu", "Gelu", "Silu"))), [h], _tt((m, f), dtype))
    b.node("MatMul", [h, _maybe_transposed(draw, b, (f, n), dtype)], _tt((m, n), dtype))


# ---- indirect

def _indices(draw, b, shape, bound: int) -> str:
    """Fresh int32/int64 indices in [-bound, bound), an input or a constant."""
    dtype = draw(st.sampled_from(INT_DTYPES))
    return b.const(shape, dtype, bound) if draw(st.booleans()) else b.input(shape, dtype, bound)


def _index_shape(draw, bound: int, min_rank: int = 0) -> tuple[int, ...]:
    shape = draw(shapes(min_rank, 2))
    return shape if bound or 0 in shape else (0,) + shape[1:]     # no index into an empty axis


def _gather(draw, b):
    x = _value(draw, b, ANY, 1, 3)
    t = b.types[x]
    a = draw(st.integers(0, t.rank - 1))
    ind = _indices(draw, b, _index_shape(draw, t.shape[a]), t.shape[a])
    shape = t.shape[:a] + b.types[ind].shape + t.shape[a + 1:]
    if _fits(shape):
        b.node("Gather", [x, ind], _tt(shape, t.dtype), axis=a - t.rank if draw(st.booleans()) else a)


def _gather_elements(draw, b):
    x = _value(draw, b, ANY, 1, 3)
    t = b.types[x]
    a = draw(st.integers(0, t.rank - 1))
    shape = tuple(draw(st.integers(1, 4)) if d == a else draw(st.integers(0, n)) for d, n in enumerate(t.shape))
    if not t.shape[a]:
        shape = shape[:a] + (0,) + shape[a + 1:]
    b.node("GatherElements", [x, _indices(draw, b, shape, t.shape[a])], _tt(shape, t.dtype), axis=a)


def _embedding(draw, b):
    """A constant table gathered by token ids (axis 0)."""
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    vocab, dim = draw(st.integers(1, 9)), draw(DIMS)
    ids = _indices(draw, b, _index_shape(draw, vocab, 1), vocab)
    b.node("Gather", [b.const((vocab, dim), dtype), ids], _tt(b.types[ids].shape + (dim,), dtype), axis=0)


# Operator builders by the category of the prims they make (analysis/classify.py's names).
OP_BUILDERS = {
    "elementwise": (_unary, _cast),
    "broadcast": (_binary, _where, _prelu),
    "layout": (_transpose, _reshape, _flatten, _squeeze, _slice, _pad, _concat, _split, _expand, _tile, _trilu),
    "reduce": (_reduce, _argreduce, _softmax, _norm, _channel_norm, _cumsum, _pool),
    "contraction": (_matmul, _gemm, _conv, _sdpa, _attention, _mlp),
    "indirect": (_gather, _gather_elements, _embedding),
}


@st.composite
def op_graphs(draw, max_ops: int = 5) -> OpGraph:
    """Random operator graphs: 1 to ``max_ops`` operators of every category, each reading
    earlier values (the latest most often) or new inputs and constants; outputs are the values
    no operator reads and a few others (kernels with several outputs)."""
    b = GraphBuilder(seed=draw(st.integers(0, 2 ** 16)), specials=draw(st.booleans()))
    for _ in range(draw(st.integers(1, max_ops))):
        build = pick(draw, b, OP_BUILDERS[pick(draw, b, tuple(OP_BUILDERS))])
        build(draw, b)
    made = [o for n in b.nodes for o in n.outputs]
    if not made:                     # every drawn operator would have been too large
        _unary(draw, b)
        made = list(b.nodes[-1].outputs)
    extra = draw(st.sets(st.sampled_from(made), max_size=2))
    return b.build([o for o in made if o not in b.used or o in extra])
