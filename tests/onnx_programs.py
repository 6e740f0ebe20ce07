"""Random ONNX programs for differential fuzzing against onnxruntime (``tests/test_fuzz_onnx.py``).

An ``OnnxProgram`` is an ONNX model built with ``onnx.helper`` (opset 11, 13, 17, 18 or 21), the
seed of its feeds and onnxruntime's outputs on them.  ``programs()`` draws one step at a time;
a step is one operator (or a few: ``Abs`` and ``Add`` before a ``Log`` keep it in its domain) on
the values so far, with its parameters drawn from their shapes:

- views and layouts: Reshape (0 and -1), Flatten, Transpose, Squeeze/Unsqueeze, Slice (negative,
  open and out-of-range bounds, negative steps, int32 or int64), Expand, Concat, Split (sizes,
  equal pieces, ``num_outputs`` chunks, unbind as Split then Squeeze), Gather, GatherElements,
  GatherND (negative indices), Tile, Pad (constant/reflect/edge/wrap), DepthToSpace, SpaceToDepth,
  Identity;
- elementwise: unary math, binary arithmetic (constants and values, broadcasting), Where, Cast,
  comparisons, logic, Pow, Min/Max/Sum/Mean, Mod, Clip;
- reductions: Reduce* with axes and keepdims, ArgMax/ArgMin, Softmax/LogSoftmax on any axis, CumSum;
  LayerNormalization;
- contractions: MatMul (batched, broadcast, vectors), Gemm, Conv and ConvTranspose 1-D/2-D;
- ScatterND and ScatterElements (with reductions from opset 16/18).

Each node's output type comes from onnx's shape inference for that node (so parameters are drawn
against the real shapes, and a node onnx refuses is never drawn: counted in ``STATS``).  The
finished model must pass ``onnx.checker`` (full check) and run in onnxruntime; a model that does
not is rejected and counted, so the test can check rejections stay rare and no operator vanishes.

Values carry a bound on their magnitude and whether they may hold NaN: an fp16 step that could
overflow is not drawn (onnxruntime and tilefuse may accumulate in different precisions), and
operators whose result onnxruntime leaves unspecified for NaN (ArgMax/ArgMin, a float cast to an
integer) get only NaN-free inputs.  Log, Sqrt, Div and Pow are drawn raw (NaN and infinities on
purpose) or on a shifted, positive input.
"""
from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import onnx
from hypothesis import assume
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

F32, F16, I64, I32, BOOL = TP.FLOAT, TP.FLOAT16, TP.INT64, TP.INT32, TP.BOOL
FLOATS = (F32, F16)
NP = {F32: np.float32, F16: np.float16, I64: np.int64, I32: np.int32, BOOL: np.bool_}
TYPE_STR = {F32: "tensor(float)", F16: "tensor(float16)", I64: "tensor(int64)", I32: "tensor(int32)",
            BOOL: "tensor(bool)"}
OPSETS = (11, 13, 17, 18, 21)
# Largest magnitude a value may reach without the risk of overflowing its type somewhere on the way.
LIMIT = {F32: 1e30, F16: 3e4, I64: 2.0 ** 40, I32: 2.0 ** 24, BOOL: 1.0}
MAX_NUMEL, MAX_RANK = 4096, 5
INT64_MAX, INT64_MIN = 2 ** 63 - 1, -2 ** 63
INPUT_MAG = 6.0      # |randn| over at most 4096 draws

# What the strategy did, for the test's rejection and coverage checks: "programs" (returned),
# "rejected" and "rejected <why>" (checker or onnxruntime refused a finished model), "refused <op>"
# (shape inference refused a step), "op <op>" (node types in returned programs).
STATS: Counter = Counter()
REJECTED: deque = deque(maxlen=20)      # (why, model) of the latest rejected models


@dataclass(frozen=True)
class Val:
    name: str
    shape: tuple
    dtype: int
    mag: float = INPUT_MAG     # bound on |value|; inf: may be infinite on purpose
    nan: bool = False          # may hold NaN
    exact: bool = True         # no rounding yet (a float Equal on it is meaningful)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS

    @property
    def finite(self) -> bool:
        return not self.nan and self.mag <= LIMIT[self.dtype]


class Refused(Exception):
    """onnx's shape inference refused a node, or gave a shape the programs do not use."""


@lru_cache(maxsize=None)
def allows(op: str, opset: int, dtype: int, slot: int = 0) -> bool:
    """Whether ``op``'s schema at ``opset`` exists and takes ``dtype`` in input ``slot``."""
    try:
        schema = onnx.defs.get_schema(op, opset)
    except onnx.defs.SchemaError:
        return False
    if schema.deprecated:
        return False
    param = schema.inputs[min(slot, len(schema.inputs) - 1)].type_str
    for c in schema.type_constraints:
        if c.type_param_str == param:
            return TYPE_STR[dtype] in c.allowed_type_strs
    return param == TYPE_STR[dtype]


# Element types onnxruntime's CPU kernels lack although the schema allows them (probed, 1.32):
# a model with one is refused when run.
ORT_LACKS = {"DepthToSpace": {I64, I32, BOOL}, "SpaceToDepth": {I64, I32, BOOL}, "Where": {BOOL}, "Relu": {I64}}


def runs(op: str, opset: int, dtype: int, slot: int = 0) -> bool:
    """Whether onnx's schema and onnxruntime's CPU kernels both take ``op`` on ``dtype`` (in ``slot``)."""
    return allows(op, opset, dtype, slot) and dtype not in ORT_LACKS.get(op, ())


class Builder:
    """The graph being drawn: inputs, initializers, nodes, and every value's type."""

    def __init__(self, opset: int, seed: int):
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.inputs: list[Val] = []
        self.vals: list[Val] = []          # inputs and node outputs, in order
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.consts: dict[str, onnx.TensorProto] = {}
        self.types: dict[str, onnx.TypeProto] = {}
        self._count = 0

    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def input(self, shape, dtype, mag=INPUT_MAG, nan=False) -> Val:
        v = Val(f"x{len(self.inputs)}", tuple(shape), dtype, mag, nan)
        self.types[v.name] = helper.make_tensor_type_proto(dtype, v.shape)
        self.inputs.append(v)
        self.vals.append(v)
        return v

    def const(self, array, dtype: int | None = None) -> str:
        arr = np.asarray(array, dtype=NP[dtype] if dtype is not None else None)
        name = self.fresh("c")
        t = numpy_helper.from_array(arr, name)
        self.inits.append(t)
        self.consts[name] = t
        self.types[name] = helper.make_tensor_type_proto(t.data_type, arr.shape)
        return name

    def const_val(self, array, dtype: int) -> Val:
        """A constant operand (an initializer) as a value: not in the pool (a node reading only
        constants is folded at import and tests nothing)."""
        arr = np.asarray(array, dtype=NP[dtype])
        mag = float(np.abs(arr.astype(np.float64)).max()) if arr.size else 0.0
        return Val(self.const(arr), arr.shape, dtype, mag)

    def randn(self, shape, dtype: int, scale: float = 1.0) -> Val:
        if dtype in FLOATS:
            return self.const_val(self.rng.standard_normal(shape) * scale, dtype)
        if dtype == BOOL:
            return self.const_val(self.rng.random(shape) < 0.5, dtype)
        return self.const_val(self.rng.integers(-3, 4, shape), dtype)

    def ints(self, values, dtype: int = I64) -> str:
        return self.const(np.array(values), dtype)

    def emit(self, op: str, inputs: list[str], n_out: int = 1, expect: tuple | None = None,
             **attrs) -> list[tuple[str, tuple, int]]:
        """Add a node; its outputs' (name, shape, dtype) from onnx's shape inference (``expect``:
        the first output's shape where inference leaves a scalar's shape out)."""
        attrs = {k: v for k, v in attrs.items() if v is not None}
        node = helper.make_node(op, inputs, [self.fresh("v") for _ in range(n_out)], name=self.fresh(f"{op}_"),
                                **attrs)
        try:
            schema = onnx.defs.get_schema(op, self.opset)
            got = onnx.shape_inference.infer_node_outputs(
                schema, node, {n: self.types[n] for n in inputs if n},
                {n: self.consts[n] for n in inputs if n in self.consts}, [helper.make_opsetid("", self.opset)])
        except Exception as e:      # noqa: BLE001 - any refusal of shape inference
            raise Refused(op) from e
        outs = []
        for o in node.output:
            if o not in got:
                raise Refused(op)
            if not got[o].tensor_type.HasField("shape") and expect is not None and o == node.output[0]:
                got[o].tensor_type.shape.dim.extend(
                    [onnx.TensorShapeProto.Dimension(dim_value=n) for n in expect])
                got[o].tensor_type.shape.SetInParent()
            if not got[o].tensor_type.HasField("shape"):
                raise Refused(op)
            dims = got[o].tensor_type.shape.dim
            if any(not dim.HasField("dim_value") for dim in dims):
                raise Refused(op)
            shape = tuple(dim.dim_value for dim in dims)
            if any(n < 1 for n in shape) or math.prod(shape) > MAX_NUMEL or len(shape) > MAX_RANK:
                raise Refused(op)
            outs.append((o, shape, got[o].tensor_type.elem_type))
        for (o, _, _), t in zip(outs, node.output):
            self.types[o] = got[t]
        self.nodes.append(node)
        return outs

    def val(self, out: tuple, mag: float, nan: bool = False, exact: bool = False) -> Val:
        name, shape, dtype = out
        if dtype not in FLOATS:
            mag, nan = min(mag, LIMIT[dtype]), False
        v = Val(name, shape, dtype, mag, nan, exact)
        self.vals.append(v)
        return v

    def like(self, out: tuple, x: Val, mag: float | None = None) -> Val:
        """An output with ``x``'s bounds (a layout or selection of ``x``)."""
        return self.val(out, x.mag if mag is None else mag, x.nan, x.exact)

    def mark(self) -> tuple:
        return len(self.nodes), len(self.inits), len(self.vals)

    def rollback(self, mark: tuple) -> None:
        n, i, v = mark
        del self.nodes[n:], self.inits[i:], self.vals[v:]

    def axes_input(self, op: str) -> bool:
        """Whether ``op`` takes its axes (Squeeze, Unsqueeze, Reduce*) or split as an input here."""
        if op in ("Squeeze", "Unsqueeze", "ReduceSum", "Split"):
            return self.opset >= 13
        return self.opset >= 18

    def model(self, outputs: list[Val]) -> onnx.ModelProto:
        ins = [helper.make_tensor_value_info(v.name, v.dtype, v.shape) for v in self.inputs]
        outs = [helper.make_tensor_value_info(v.name, v.dtype, v.shape) for v in outputs]
        graph = helper.make_graph(list(self.nodes), "program", ins, outs, list(self.inits))
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=8
                                 if self.opset <= 17 else 10)


def _pick(d, b: "Builder", seq):
    """One of ``seq``: ``sampled_from`` leans towards the first entries, so they come in an order
    of the program's seed (operators spread evenly over programs; a draw still shrinks)."""
    return d(st.sampled_from([seq[i] for i in b.rng.permutation(len(seq))]))


def _dim(d, rank: int) -> int:
    """An axis in [-rank, rank) (negative half the time)."""
    k = d(st.integers(0, rank - 1))
    return k - rank if d(st.booleans()) else k


def _axes(d, rank: int, min_size: int = 1) -> list[int]:
    """Distinct axes (each negative half the time), in drawn order."""
    ks = d(st.permutations(range(rank)))[:d(st.integers(min_size, rank))]
    return [k - rank if d(st.booleans()) else k for k in ks]


def _factor(n: int) -> list[tuple[int, int]]:
    """Ways to split n into two dims, proper splits first (draws lean towards the first)."""
    pairs = [(a, n // a) for a in range(1, n + 1) if n % a == 0]
    return sorted(pairs, key=lambda ab: min(ab) == 1)


def _broadcast(*shapes) -> tuple | None:
    try:
        out = tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        return None
    return out if math.prod(out) <= MAX_NUMEL and len(out) <= MAX_RANK else None


def _partner(d, b: Builder, x: Val, dtype: int | None = None) -> Val:
    """A second operand that broadcasts with ``x``: a value of the pool, or a constant of a shape
    that broadcasts (a scalar, a suffix of x's shape with 1s, an extra leading dim)."""
    dtype = x.dtype if dtype is None else dtype
    pool = [v for v in b.vals if v.dtype == dtype and _broadcast(x.shape, v.shape) is not None]
    if pool and d(st.booleans()):
        return d(st.sampled_from(pool))
    kind = d(st.sampled_from(["scalar", "suffix", "same", "lead"]))
    if kind == "scalar" or x.rank == 0:
        shape = () if d(st.booleans()) else (1,)
    else:
        shape = list(x.shape[d(st.integers(0, x.rank - 1)):] if kind == "suffix" else x.shape)
        shape = [1 if d(st.integers(0, 2)) == 0 else n for n in shape]
        if kind == "lead" and x.rank < MAX_RANK:
            shape = [d(st.sampled_from([1, 2]))] + list(x.shape)
    return b.randn(tuple(shape), dtype)


def _positive(b: Builder, x: Val) -> Val:
    """|x| + 0.5: the input of a Log, Sqrt, Reciprocal or Pow drawn inside its domain."""
    (a,) = b.emit("Abs", [x.name])
    (p,) = b.emit("Add", [a[0], b.const(np.array(0.5), x.dtype)])
    return Val(p[0], p[1], p[2], x.mag + 0.5, x.nan, False)


# ---------------------------------------------------------------- views and layouts

def _reshape(d, b, x):
    shape = list(x.shape)
    if not shape:
        new = [1] * d(st.integers(1, 2))
    else:
        kind = d(st.sampled_from(["split", "merge", "flat", "same"]))
        if kind == "split" and x.rank < MAX_RANK:
            k = d(st.integers(0, x.rank - 1))
            new = shape[:k] + list(d(st.sampled_from(_factor(shape[k])))) + shape[k + 1:]
        elif kind == "merge" and x.rank >= 2:
            k = d(st.integers(0, x.rank - 2))
            new = shape[:k] + [shape[k] * shape[k + 1]] + shape[k + 2:]
        elif kind == "flat":
            new = [x.numel]
        else:
            new = list(shape)
    spec = list(new)
    for k in range(min(len(new), len(shape))):    # 0 copies the input's dim there (allowzero=0)
        if new[k] == shape[k] and d(st.integers(0, 2)) == 0:
            spec[k] = 0
    free = [k for k, n in enumerate(spec) if n != 0]
    if free and d(st.booleans()):
        spec[d(st.sampled_from(free))] = -1
    (out,) = b.emit("Reshape", [x.name, b.ints(spec)])
    return [b.like(out, x)]


def _flatten(d, b, x):
    if x.rank == 0:
        return None
    (out,) = b.emit("Flatten", [x.name], axis=d(st.integers(-x.rank, x.rank)))
    return [b.like(out, x)]


def _transpose(d, b, x):
    if x.rank < 2:
        return None
    perm = list(d(st.permutations(range(x.rank)))) if d(st.integers(0, 3)) else None
    (out,) = b.emit("Transpose", [x.name], perm=perm)
    return [b.like(out, x)]


def _squeeze(d, b, x):
    ones = [k for k, n in enumerate(x.shape) if n == 1]
    if not ones:
        return None
    axes = None
    if d(st.integers(0, 2)):
        axes = [k - x.rank if d(st.booleans()) else k for k in d(st.permutations(ones))[:d(st.integers(1, len(ones)))]]
    if axes is not None and b.axes_input("Squeeze"):
        (out,) = b.emit("Squeeze", [x.name, b.ints(axes)])
    else:
        (out,) = b.emit("Squeeze", [x.name], axes=axes)
    return [b.like(out, x)]


def _unsqueeze(d, b, x):
    n = d(st.integers(1, 2))
    r = x.rank + n
    if r > MAX_RANK:
        return None
    axes = [k - r if d(st.booleans()) else k for k in d(st.permutations(range(r)))[:n]]
    if b.axes_input("Unsqueeze"):
        (out,) = b.emit("Unsqueeze", [x.name, b.ints(axes)])
    else:
        (out,) = b.emit("Unsqueeze", [x.name], axes=axes)
    return [b.like(out, x)]


def _slice_len(n: int, start: int, end: int, step: int) -> int:
    """Length of ONNX Slice's window (bounds made non-negative, then clamped per step sign)."""
    start, end = start + n if start < 0 else start, end + n if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), n), min(max(end, 0), n)
        return max(0, -(-(end - start) // step))
    start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
    return max(0, -(-(start - end) // -step))


def _slice(d, b, x):
    """Windows with negative, open (INT64_MAX/INT64_MIN) and out-of-range bounds, steps -2..3."""
    if x.rank == 0:
        return None
    axes = _axes(d, x.rank)
    starts, ends, steps = [], [], []
    for a in axes:
        n = x.shape[a]
        step = d(st.sampled_from([1, 1, 2, 3, -1, -2]))
        lo, hi = (INT64_MIN, INT64_MAX) if step > 0 else (INT64_MAX, INT64_MIN)
        start = d(st.one_of(st.integers(-n - 2, n + 2), st.just(lo)))
        end = d(st.one_of(st.integers(-n - 2, n + 2), st.just(hi)))
        if _slice_len(n, start, end, step) == 0:      # an empty window: open it at both ends
            start, end = lo, hi
        starts.append(start)
        ends.append(end)
        steps.append(step)
    ind = d(st.sampled_from([I64, I64, I32]))
    if ind == I32:
        starts = [min(max(s, -2 ** 31), 2 ** 31 - 1) for s in starts]
        ends = [min(max(e, -2 ** 31), 2 ** 31 - 1) for e in ends]
    ins = [x.name, b.ints(starts, ind), b.ints(ends, ind)]
    in_order = [a % x.rank for a in axes] == list(range(x.rank))
    if not (in_order and d(st.booleans())) or set(steps) != {1}:
        ins.append(b.ints(axes, ind))
        if set(steps) != {1} or d(st.booleans()):
            ins.append(b.ints(steps, ind))
    (out,) = b.emit("Slice", ins)
    return [b.like(out, x)]


def _expand(d, b, x):
    new = [d(st.sampled_from([1, 2, 3])) if n == 1 else d(st.sampled_from([n, n, 1])) for n in x.shape]
    lead = d(st.lists(st.integers(1, 3), max_size=2))
    spec = lead + new
    if len(spec) > 1 and d(st.integers(0, 3)) == 0:
        spec = spec[1:]          # fewer dims than x: the shape broadcasts into x's
    if _broadcast(x.shape, tuple(spec)) is None:
        return None
    (out,) = b.emit("Expand", [x.name, b.ints(spec)])
    return [b.like(out, x)]


def _concat(d, b, x):
    if x.rank == 0:
        return None
    k = _dim(d, x.rank)
    kk = k % x.rank
    same = [v for v in b.vals if v.dtype == x.dtype and v.rank == x.rank
            and all(v.shape[i] == x.shape[i] for i in range(x.rank) if i != kk)]
    parts = [x]
    for _ in range(d(st.integers(1, 2))):
        if d(st.booleans()):
            parts.append(d(st.sampled_from(same)))
        else:
            shape = list(x.shape)
            shape[kk] = d(st.integers(1, 3))
            parts.append(b.randn(tuple(shape), x.dtype))
    parts = d(st.permutations(parts))
    (out,) = b.emit("Concat", [p.name for p in parts], axis=k)
    return [b.val(out, max(p.mag for p in parts), any(p.nan for p in parts), all(p.exact for p in parts))]


def _split(d, b, x):
    """Split by sizes, in equal pieces, in ``num_outputs`` chunks (opset 18), or unbind (pieces of
    one, then Squeeze): every piece joins the pool, a drawn one last."""
    if x.rank == 0:
        return None
    k = _dim(d, x.rank)
    n = x.shape[k]
    kind = _pick(d, b, ["sizes", "equal", "chunk", "unbind"])
    ins, attrs = [x.name], {"axis": k}
    if kind == "sizes" or (kind == "unbind" and n > 6):
        cuts = sorted(set(d(st.lists(st.integers(1, n - 1), max_size=3)))) if n > 1 else []
        sizes = [e - s for s, e in zip([0] + cuts, cuts + [n])]
        if b.axes_input("Split"):
            ins.append(b.ints(sizes))
        else:
            attrs["split"] = sizes
        count = len(sizes)
    elif kind == "equal":
        count = d(st.sampled_from([m for m in range(1, n + 1) if n % m == 0]))
        if b.opset >= 18:
            attrs["num_outputs"] = count
    elif kind == "chunk":
        if b.opset < 18:
            return None
        # pieces of ceil(n / count), the last smaller, and none empty
        count = d(st.sampled_from([m for m in range(1, n + 1) if (m - 1) * -(-n // m) < n]))
        attrs["num_outputs"] = count
    else:
        count = n
        if b.opset >= 18:
            attrs["num_outputs"] = count
    outs = b.emit("Split", ins, count, **attrs)
    pieces = [b.like(o, x) for o in outs]
    i = d(st.integers(-count, count - 1))
    if kind == "unbind" and len(outs) == n:
        axes = [k]
        if b.axes_input("Squeeze"):
            (sq,) = b.emit("Squeeze", [outs[i][0], b.ints(axes)])
        else:
            (sq,) = b.emit("Squeeze", [outs[i][0]], axes=axes)
        return pieces + [b.like(sq, x)]
    chosen = pieces.pop(i)
    b.vals.remove(chosen)
    b.vals.append(chosen)
    return pieces + [chosen]


def _indices(b: Builder, shape, n: int, dtype: int) -> str:
    """Index constants in [-n, n) (negative ones count from the end)."""
    return b.const(b.rng.integers(-n, n, shape), dtype)


def _gather(d, b, x):
    if x.rank == 0:
        return None
    k = _dim(d, x.rank)
    shape = d(st.sampled_from([(), (1,), (3,), (2, 2), (1, 3)]))
    if x.rank - 1 + len(shape) > MAX_RANK:
        shape = (3,)
    (out,) = b.emit("Gather", [x.name, _indices(b, shape, x.shape[k], d(st.sampled_from([I64, I32])))], axis=k)
    return [b.like(out, x)]


def _gather_elements(d, b, x):
    if x.rank == 0:
        return None
    k = _dim(d, x.rank)
    shape = [d(st.integers(1, n)) for n in x.shape]
    shape[k] = d(st.integers(1, 4))
    idx = _indices(b, tuple(shape), x.shape[k], d(st.sampled_from([I64, I32])))
    (out,) = b.emit("GatherElements", [x.name, idx], axis=k)
    return [b.like(out, x)]


def _gather_nd(d, b, x):
    if x.rank == 0:
        return None
    bd = 1 if x.rank >= 2 and b.opset >= 12 and d(st.integers(0, 2)) == 0 else 0
    m = d(st.integers(1, x.rank - bd))
    q = d(st.lists(st.integers(1, 3), max_size=2))
    out = x.shape[:bd] + tuple(q) + x.shape[bd + m:]
    if math.prod(out) > MAX_NUMEL or len(out) > MAX_RANK:
        q = []
    shape = list(x.shape[:bd]) + q + [m]
    dims = x.shape[bd:bd + m]
    idx = np.stack([b.rng.integers(-n, n, shape[:-1]) for n in dims], axis=-1)
    (out,) = b.emit("GatherND", [x.name, b.const(idx, I64)], batch_dims=bd or None,
                    expect=x.shape[:bd] + tuple(q) + x.shape[bd + m:])
    return [b.like(out, x)]


def _tile(d, b, x):
    if x.rank == 0:
        return None
    reps = [d(st.sampled_from([1, 1, 2, 3])) for _ in x.shape]
    if x.numel * math.prod(reps) > MAX_NUMEL:
        return None
    (out,) = b.emit("Tile", [x.name, b.ints(reps)])
    return [b.like(out, x)]


def _pad(d, b, x):
    if x.rank == 0:
        return None
    modes = ["constant", "reflect", "edge"] + (["wrap"] if b.opset >= 19 else [])
    mode = _pick(d, b, modes)
    axes = list(range(x.rank))
    with_axes = b.opset >= 18 and d(st.booleans())
    if with_axes:
        axes = _axes(d, x.rank)
    begins, ends = [], []
    for a in axes:
        n = x.shape[a]
        top = {"reflect": min(2, n - 1), "wrap": min(2, n)}.get(mode, 2)
        low = -1 if mode == "constant" and n > 2 else 0        # a negative pad crops
        begins.append(d(st.integers(low, top)))
        ends.append(d(st.integers(low, top)))
    ins = [x.name, b.ints(begins + ends)]
    cv = None
    if mode == "constant" and d(st.booleans()):
        cv = d(st.sampled_from([0.0, 1.5, -2.0]))
        ins.append(b.const(np.array(cv), x.dtype))
    if with_axes:
        ins += [""] * (3 - len(ins)) + [b.ints(axes)]
    (out,) = b.emit("Pad", ins, mode=mode)
    return [b.val(out, max(x.mag, abs(cv or 0.0)), x.nan, x.exact)]


def _blocks(d, b: Builder, x: Val, block: int, depth: bool) -> Val | None:
    """x itself when it is [N, C, H, W] with C divisible by block² (``depth``) or H and W by
    block (else); otherwise x reshaped into such a shape, where its size allows."""
    if x.rank == 4 and (x.shape[1] % (block * block) == 0 if depth else
                        x.shape[2] % block == 0 and x.shape[3] % block == 0):
        return x
    if x.numel % (block * block):
        return None
    rest = x.numel // (block * block)
    h = d(st.sampled_from([k for k in range(1, rest + 1) if rest % k == 0 and k <= 4]))
    c = rest // h
    shape = (1, c * block * block, h, 1) if depth else (1, c, h * block, block)
    (out,) = b.emit("Reshape", [x.name, b.ints(shape)])
    return b.like(out, x)


def _depth_to_space(d, b, x):
    if not runs("DepthToSpace", b.opset, x.dtype):
        return None
    block = d(st.sampled_from([2, 3]))
    x = _blocks(d, b, x, block, True)
    if x is None:
        return None
    (out,) = b.emit("DepthToSpace", [x.name], blocksize=block, mode=d(st.sampled_from(["DCR", "CRD", None])))
    return [b.like(out, x)]


def _space_to_depth(d, b, x):
    if not runs("SpaceToDepth", b.opset, x.dtype):
        return None
    block = d(st.sampled_from([2, 3]))
    x = _blocks(d, b, x, block, False)
    if x is None:
        return None
    (out,) = b.emit("SpaceToDepth", [x.name], blocksize=block)
    return [b.like(out, x)]


def _identity(d, b, x):
    (out,) = b.emit("Identity", [x.name])
    return [b.like(out, x)]


# ---------------------------------------------------------------- elementwise

# Unary math: name -> bound of |f(x)| from the bound m of |x|.
UNARY = {
    "Abs": lambda m: m, "Neg": lambda m: m, "Sign": lambda m: 1.0, "Relu": lambda m: m,
    "Tanh": lambda m: 1.0, "Sigmoid": lambda m: 1.0, "Sin": lambda m: 1.0, "Cos": lambda m: 1.0,
    "Erf": lambda m: 1.0, "Floor": lambda m: m + 1, "Ceil": lambda m: m + 1, "Round": lambda m: m + 1,
    "Softplus": lambda m: m + 1, "LeakyRelu": lambda m: m, "Elu": lambda m: max(m, 1.0),
    "HardSigmoid": lambda m: 1.0, "Softsign": lambda m: 1.0, "HardSwish": lambda m: m, "Gelu": lambda m: m,
    "Exp": lambda m: math.exp(min(m, 700.0)),
}
DOMAIN = {"Log": lambda m: max(math.log(m), 0.7), "Sqrt": math.sqrt, "Reciprocal": lambda m: 2.0}
EXACT_UNARY = {"Abs", "Neg", "Sign", "Relu", "Floor", "Ceil", "Round"}


def _unary(d, b, x):
    if x.dtype == BOOL:
        return None
    name = _pick(d, b, sorted(UNARY) + sorted(DOMAIN))
    if not runs(name, b.opset, x.dtype) or (name not in EXACT_UNARY and not x.is_float):
        return None
    if name == "Sign" and x.dtype == F16 and x.nan:
        return None         # onnxruntime's fp16 Sign gives 0 for NaN (fp32, numpy and the spec's reference: NaN)
    if name in ("Floor", "Ceil", "Round") and x.dtype == F16 and not x.exact:
        return None         # a rounded fp16 value within an ulp of an integer steps either way (a sum
                            # of 2.0012 is 2.0 accumulated in fp32, 2.004 in onnxruntime's order)
    attrs = {"alpha": d(st.sampled_from([0.01, 0.2]))} if name == "LeakyRelu" else {}
    if name in DOMAIN:
        if d(st.booleans()):        # raw: NaN for negatives, infinities at 0
            (out,) = b.emit(name, [x.name])
            return [b.val(out, math.inf, True)]
        x = _positive(b, x)
        (out,) = b.emit(name, [x.name])
        return [b.val(out, DOMAIN[name](x.mag), x.nan)]
    mag = UNARY[name](x.mag)
    if mag > LIMIT[x.dtype] and x.mag != math.inf:
        return None
    (out,) = b.emit(name, [x.name], **attrs)
    return [b.val(out, mag, x.nan, x.exact and name in EXACT_UNARY)]


VARIADIC = ("Min", "Max", "Sum", "Mean")


def _binary(d, b, x):
    if x.dtype == BOOL:
        return None
    name = _pick(d, b, ["Add", "Sub", "Mul", "Div", "Pow", "Mod", "Add", "Mul"] + list(VARIADIC))
    if not runs(name, b.opset, x.dtype):
        return None
    if name == "Div":
        return _div(d, b, x)
    if name == "Pow":
        return _pow(d, b, x)
    if name == "Mod":
        return _mod(d, b, x)
    ys = [_partner(d, b, x) for _ in range(d(st.integers(1, 2)) if name in VARIADIC else 1)]
    operands = d(st.permutations([x] + ys))
    mags = [v.mag for v in operands]
    mag = {"Add": sum(mags), "Sub": sum(mags), "Sum": sum(mags), "Mul": math.prod(mags)}.get(name, max(mags))
    if mag > LIMIT[x.dtype] and math.inf not in mags:
        return None
    (out,) = b.emit(name, [v.name for v in operands])
    return [b.val(out, mag, any(v.nan for v in operands), name in ("Min", "Max") and all(v.exact for v in operands))]


def _divisor(d, b, x, values) -> np.ndarray:
    """A constant divisor without zeros: a scalar, or one drawn value per position of x's last dim."""
    if x.rank == 0 or d(st.booleans()):
        return np.array(d(st.sampled_from(values)))
    return b.rng.choice(values, x.shape[-1])


def _div(d, b, x):
    if not x.is_float:      # integer division truncates; a constant divisor never 0
        y = b.const_val(_divisor(d, b, x, [2, -3, 1]), x.dtype)
        (out,) = b.emit("Div", [x.name, y.name])
        return [b.val(out, x.mag)]
    y = _partner(d, b, x)
    if d(st.booleans()):        # raw: x / 0 gives infinities and NaN
        operands = d(st.permutations([x, y]))
        (out,) = b.emit("Div", [v.name for v in operands])
        return [b.val(out, math.inf, True)]
    (a,) = b.emit("Abs", [y.name])
    (den,) = b.emit("Add", [a[0], b.const(np.array(1.0), x.dtype)])
    (out,) = b.emit("Div", [x.name, den[0]])
    return [b.val(out, x.mag, x.nan or y.nan)]


def _pow(d, b, x):
    if not x.is_float:
        e = d(st.sampled_from([2, 3]))
        if _power(x.mag, e) > LIMIT[x.dtype]:
            return None
        (out,) = b.emit("Pow", [x.name, b.const(np.array(e), x.dtype)])
        return [b.val(out, _power(x.mag, e))]
    if d(st.integers(0, 3)) == 0:        # raw: negative bases to fractional powers are NaN
        y = _partner(d, b, x)
        (out,) = b.emit("Pow", [x.name, y.name])
        return [b.val(out, math.inf, True)]
    base = _positive(b, x)
    if d(st.booleans()):
        e = d(st.sampled_from([2.0, 3.0, 0.5, -1.0, -0.5]))
        exponent = b.const(np.array(e), d(st.sampled_from([x.dtype, x.dtype, I64])) if e in (2.0, 3.0) and b.opset >= 12 else x.dtype)
        bound = max(_power(base.mag, e), 0.5 ** e)   # (a magnitude near float's largest overflows)
    else:           # a bounded tensor exponent
        y = _partner(d, b, x)
        (t,) = b.emit("Tanh", [y.name])
        exponent = t[0]
        bound = max(base.mag, 2.0)
    if bound > LIMIT[x.dtype]:
        return None
    (out,) = b.emit("Pow", [base.name, exponent])
    return [b.val(out, bound, base.nan)]


def _mod(d, b, x):
    if x.is_float and not x.exact and x.mag > 8:
        return None     # fmod keeps a rounded value's absolute error and drops its magnitude: a sum
                        # of squares near 60 off by an fp32 ulp is 6e-5 off a remainder near 0.5
    fmod = 1 if x.is_float else d(st.sampled_from([0, 1]))       # onnxruntime: fmod=1 for floats
    y = b.const_val(_divisor(d, b, x, [1.5, -2.0, 0.75] if x.is_float else [3, -2, 5]), x.dtype)
    (out,) = b.emit("Mod", [x.name, y.name], fmod=fmod)
    return [b.val(out, y.mag, x.nan)]


def _where(d, b, x):
    if not runs("Where", b.opset, x.dtype, slot=1):
        return None
    kind = d(st.sampled_from(["compare", "pool", "const"]))
    bools = [v for v in b.vals if v.dtype == BOOL and _broadcast(v.shape, x.shape) is not None]
    if kind == "pool" and bools:
        cond = d(st.sampled_from(bools)).name
    elif kind == "compare" and x.dtype != BOOL:
        (c,) = b.emit("Greater", [x.name, b.const(np.array(d(st.sampled_from([0, 1]))), x.dtype)])
        cond = c[0]
    else:
        cond = b.randn(x.shape[d(st.integers(0, x.rank)):], BOOL).name
    y = _partner(d, b, x)
    a, c = d(st.permutations([x, y]))
    (out,) = b.emit("Where", [cond, a.name, c.name])
    return [b.val(out, max(x.mag, y.mag), x.nan or y.nan, x.exact and y.exact)]


def _compare(d, b, x):
    if x.dtype == BOOL:
        return None
    name = _pick(d, b, ["Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Equal"])
    if not runs(name, b.opset, x.dtype):
        return None
    y = _partner(d, b, x)
    if x.is_float and not (x.exact and y.exact):
        return None         # rounded values order by the order of operations near a tie (either side is right)
    operands = d(st.permutations([x, y]))
    # LessOrEqual and GreaterOrEqual are functions: inference for the node alone gives no shape
    (out,) = b.emit(name, [v.name for v in operands], expect=_broadcast(x.shape, y.shape))
    return [b.val(out, 1.0)]


def _logic(d, b, x):
    if x.dtype != BOOL:
        return None
    name = _pick(d, b, ["And", "Or", "Xor", "Not"])
    if name == "Not":
        (out,) = b.emit("Not", [x.name])
    else:
        (out,) = b.emit(name, [x.name, _partner(d, b, x).name])
    return [b.val(out, 1.0)]


def _cast(d, b, x):
    to = _pick(d, b, [F32, F16, I64, BOOL, I32])
    if to == x.dtype:
        return None
    if to in (I64, I32) and x.is_float and not (x.finite and x.mag < 2.0 ** 30):
        return None         # a cast of NaN, infinity or an out-of-range float to an integer is unspecified
    mag = min(x.mag, 1.0) if to == BOOL else x.mag
    if to == F16 and x.mag > LIMIT[F16]:
        mag = math.inf      # the cast itself rounds to infinity: defined
    like = to == F32 and d(st.integers(0, 3)) == 0 and runs("CastLike", b.opset, x.dtype)
    if like:
        (out,) = b.emit("CastLike", [x.name, b.const(np.zeros((1,)), to)])
    else:
        (out,) = b.emit("Cast", [x.name], to=to)
    return [b.val(out, mag, x.nan and to in FLOATS, x.exact and to != F16)]


def _clip(d, b, x):
    if x.dtype == BOOL or not runs("Clip", b.opset, x.dtype):
        return None
    # onnxruntime's fp16 Clip-11 leaves infinities where an omitted bound should clip them to ±65504
    omit = [None] if x.dtype != F16 or b.opset >= 12 else []
    lo = d(st.sampled_from([-1.0, -0.5] + omit)) if x.is_float else d(st.sampled_from([-2, 0, None]))
    hi = d(st.sampled_from([0.5, 1.0] + omit)) if x.is_float else d(st.sampled_from([1, 3, None]))
    ins = [x.name, "" if lo is None else b.const(np.array(lo), x.dtype)]
    if hi is not None:
        ins.append(b.const(np.array(hi), x.dtype))
    (out,) = b.emit("Clip", ins)
    bound = x.mag if lo is None or hi is None else max(abs(lo), abs(hi))
    return [b.val(out, bound, x.nan, x.exact)]


def _isnan(d, b, x):
    name = _pick(d, b, ["IsNaN", "IsInf"])
    if not x.is_float or not runs(name, b.opset, x.dtype):
        return None
    (out,) = b.emit(name, [x.name])
    return [b.val(out, 1.0)]


# ---------------------------------------------------------------- reductions, normalization

def _power(m: float, n: float) -> float:
    """m ** n of a magnitude m >= 0, infinite where it would overflow a float (or divide by 0)."""
    if m == 0:
        return 0.0 if n > 0 else math.inf
    return math.inf if n * math.log(m) > 700 else m ** n


# name -> bound of the result from (bound m, reduced count n)
REDUCE = {
    "ReduceSum": lambda m, n: m * n, "ReduceMean": lambda m, n: m, "ReduceMax": lambda m, n: m,
    "ReduceMin": lambda m, n: m, "ReduceProd": lambda m, n: _power(m, n), "ReduceL1": lambda m, n: m * n,
    "ReduceL2": lambda m, n: m * math.sqrt(n), "ReduceSumSquare": lambda m, n: m * m * n,
    "ReduceLogSumExp": lambda m, n: m + math.log(n) + 1,
}


def _reduce(d, b, x):
    name = _pick(d, b, sorted(REDUCE))
    if name in ("ReduceMax", "ReduceMin", "ReduceLogSumExp") and x.nan:
        return None         # onnxruntime's max over all axes skips NaN, over some axes it propagates;
                            # its LogSumExp over several axes gives inf for NaN and inf (spec, torch: NaN)
    if x.dtype == BOOL or not runs(name, b.opset, x.dtype) or (name == "ReduceLogSumExp" and not x.is_float):
        return None
    kind = d(st.sampled_from(["axes", "axes", "all", "noop"]))
    axes = _axes(d, x.rank) if kind == "axes" and x.rank else None
    keep = d(st.sampled_from([0, 1, None]))
    attrs = {"keepdims": keep}
    ins = [x.name]
    if kind == "noop":            # empty axes: reduce nothing (noop_with_empty_axes) or everything
        if not b.axes_input(name):
            return None
        attrs["noop_with_empty_axes"] = d(st.sampled_from([0, 1]))
        ins.append(b.ints(np.zeros((0,), np.int64)))
    elif axes is not None:
        if b.axes_input(name):
            ins.append(b.ints(axes))
        else:
            attrs["axes"] = axes
    count = math.prod(x.shape[a] for a in axes) if axes is not None else x.numel
    if kind == "noop" and attrs["noop_with_empty_axes"]:
        count = 1
    mag = REDUCE[name](x.mag, count) if x.mag != math.inf else math.inf
    if mag > LIMIT[x.dtype] and x.mag != math.inf:
        return None
    (out,) = b.emit(name, ins, **attrs)
    return [b.val(out, mag, x.nan, name in ("ReduceMax", "ReduceMin") and x.exact)]


def _argmax(d, b, x):
    if x.rank == 0 or x.nan or x.dtype == BOOL:       # onnxruntime's ArgMax over NaN is unspecified
        return None
    if x.is_float and not x.exact:
        return None     # rounded values: a near tie picks either index (onnxruntime's fp16 LogSoftmax of equal rows differs)
    name = _pick(d, b, ["ArgMax", "ArgMin"])
    if not runs(name, b.opset, x.dtype):
        return None
    k = _dim(d, x.rank)
    last = d(st.sampled_from([0, 1, None])) if b.opset >= 12 else None
    (out,) = b.emit(name, [x.name], axis=k, keepdims=d(st.sampled_from([0, 1, None])), select_last_index=last)
    return [b.val(out, x.shape[k])]


def _softmax(d, b, x):
    """Softmax/LogSoftmax on any axis (before opset 13: over the axes from ``axis`` on)."""
    if not x.is_float or x.rank == 0:
        return None
    name = _pick(d, b, ["Softmax", "LogSoftmax"])
    axis = _dim(d, x.rank) if d(st.integers(0, 3)) else None
    if axis is None and b.opset < 13 and x.rank < 2:
        return None
    (out,) = b.emit(name, [x.name], axis=axis)
    mag = 1.0 if name == "Softmax" else 2 * x.mag + math.log(x.numel) + 1
    return [b.val(out, mag if x.mag != math.inf else math.inf, x.nan or x.mag == math.inf)]


def _cumsum(d, b, x):
    if x.rank == 0 or x.dtype == BOOL or not runs("CumSum", b.opset, x.dtype):
        return None
    k = _dim(d, x.rank)
    mag = x.mag * x.shape[k]
    if mag > LIMIT[x.dtype] and x.mag != math.inf:
        return None
    axis = b.const(np.array(k), d(st.sampled_from([I64, I32])))
    (out,) = b.emit("CumSum", [x.name, axis], exclusive=d(st.sampled_from([0, 1, None])),
                    reverse=d(st.sampled_from([0, 1, None])))
    return [b.val(out, mag, x.nan)]


def _layer_norm(d, b, x):
    if not x.is_float or x.rank == 0 or b.opset < 17:
        return None
    axis = _dim(d, x.rank) if d(st.integers(0, 3)) else None
    norm = x.shape[(-1 if axis is None else axis) % x.rank:]
    scale = b.randn(norm, x.dtype)
    ins = [x.name, scale.name]
    bias = 0.0
    if d(st.booleans()):
        bv = b.randn(norm, x.dtype)
        ins.append(bv.name)
        bias = bv.mag
    eps = d(st.sampled_from([1e-5, 1e-3, None]))
    n_out = d(st.sampled_from([1, 1, 3]))
    if x.mag == math.inf:
        # a mean over a row that holds an infinity is NaN or the infinity by summation order
        # (onnxruntime's running mean gives the infinity only where it is the row's last element,
        # eager PyTorch fp32 and tilefuse NaN): Mean and InvStdDev are drawn of finite rows only
        n_out = 1
    outs = b.emit("LayerNormalization", ins, n_out, axis=axis, epsilon=eps)
    mag = math.sqrt(math.prod(norm)) * scale.mag + bias
    y = b.val(outs[0], mag, x.nan or x.mag == math.inf)
    if n_out == 1:
        return [y]
    extra = [b.val(outs[1], x.mag, x.nan), b.val(outs[2], 1 / math.sqrt(eps or 1e-5), x.nan)]
    b.vals.remove(y)
    b.vals.append(y)
    return extra + [y]


# ---------------------------------------------------------------- contractions

def _matmul_shape(a: tuple, c: tuple) -> tuple | None:
    if not a or not c:
        return None
    a2 = a if len(a) > 1 else (1,) + a
    c2 = c if len(c) > 1 else c + (1,)
    if a2[-1] != c2[-2]:
        return None
    batch = _broadcast(a2[:-2], c2[:-2])
    if batch is None:
        return None
    out = batch + a2[-2:-1] * (len(a) > 1) + c2[-1:] * (len(c) > 1)
    return out if math.prod(out) <= MAX_NUMEL and len(out) <= MAX_RANK else None


def _weight(b: Builder, shape, dtype, fan_in: int) -> Val:
    return b.randn(shape, dtype, 1 / math.sqrt(max(1, fan_in)))


def _matmul(d, b, x):
    """x @ y or y @ x: y a value of the pool or a constant (a vector, a matrix, a batch)."""
    if not x.is_float or x.rank == 0:
        return None
    left = d(st.booleans())
    pool = [v for v in b.vals if v.dtype == x.dtype and v.rank
            and _matmul_shape(*((x.shape, v.shape) if left else (v.shape, x.shape))) is not None]
    if pool and d(st.booleans()):
        y = d(st.sampled_from(pool))
    else:
        k = x.shape[-1] if left else x.shape[-2 if x.rank > 1 else -1]
        n = d(st.sampled_from([1, 3, 8, 16]))
        shape = d(st.sampled_from([(k,), (k, n), (k, n), (2, k, n)] if left else [(k,), (n, k), (n, k), (2, n, k)]))
        if len(shape) == 3 and x.rank >= 3 and x.shape[-3] != 1:
            shape = (x.shape[-3],) + shape[1:]
        y = _weight(b, shape, x.dtype, k)
    a, c = (x, y) if left else (y, x)
    if _matmul_shape(a.shape, c.shape) is None:
        return None
    k = a.shape[-1]
    mag = k * a.mag * c.mag
    if mag > LIMIT[x.dtype] and math.inf not in (a.mag, c.mag):
        return None
    (out,) = b.emit("MatMul", [a.name, c.name])
    return [b.val(out, mag, x.nan or y.nan or mag == math.inf)]


def _gemm(d, b, x):
    if not x.is_float or x.rank != 2:
        return None
    trans_a, trans_b = d(st.sampled_from([0, 1, None])), d(st.sampled_from([0, 1, None]))
    m, k = x.shape[::-1] if trans_a else x.shape
    n = d(st.sampled_from([1, 3, 8, 16]))
    pool = [v for v in b.vals if v.dtype == x.dtype and v.shape == ((n, k) if trans_b else (k, n))]
    bw = d(st.sampled_from(pool)) if pool and d(st.booleans()) else _weight(b, (n, k) if trans_b else (k, n), x.dtype, k)
    ins = [x.name, bw.name]
    alpha, beta = d(st.sampled_from([1.0, 0.5, -2.0, None])), d(st.sampled_from([1.0, 0.5, -2.0, None]))
    cmag = 0.0
    if d(st.integers(0, 3)):
        cv = b.randn(d(st.sampled_from([(), (n,), (1, n), (m, 1), (m, n)])), x.dtype)
        ins.append(cv.name)
        cmag = cv.mag
    mag = abs(alpha or 1.0) * k * x.mag * bw.mag + abs(beta or 1.0) * cmag
    if mag > LIMIT[x.dtype] and math.inf not in (x.mag, bw.mag):
        return None
    (out,) = b.emit("Gemm", ins, alpha=alpha, beta=beta, transA=trans_a, transB=trans_b)
    return [b.val(out, mag, x.nan or bw.nan or mag == math.inf)]


def _conv(d, b, x):
    """Conv or ConvTranspose over x's last 1 or 2 dims (pads, strides, dilations, groups, bias)."""
    if not x.is_float or x.rank not in (3, 4):
        return None
    transpose = d(st.integers(0, 2)) == 0
    nd, c = x.rank - 2, x.shape[1]
    groups = d(st.sampled_from([g for g in (1, 1, 2, 3, c) if c % g == 0]))
    per = d(st.integers(1, 2))
    cout = groups * per
    kernel = [d(st.integers(1, 3)) for _ in range(nd)]
    strides = [d(st.integers(1, 2)) for _ in range(nd)]
    dil = [d(st.integers(1, 2)) for _ in range(nd)]
    pads = [d(st.integers(0, min(2, k - 1) if transpose else 2)) for k in kernel * 2]
    attrs = dict(kernel_shape=kernel if d(st.booleans()) else None, group=groups if groups > 1 or d(st.booleans()) else None,
                 strides=strides if strides != [1] * nd or d(st.booleans()) else None,
                 dilations=dil if dil != [1] * nd or d(st.booleans()) else None)
    if not transpose and d(st.integers(0, 4)) == 0:      # onnxruntime: SAME only without dilation
        attrs["auto_pad"] = d(st.sampled_from(["SAME_UPPER", "SAME_LOWER", "VALID"] if dil == [1] * nd else ["VALID"]))
    else:
        attrs["pads"] = pads
    if not transpose and attrs.get("auto_pad", "SAME")[:4] != "SAME":     # the window must fit
        pads_ = attrs.get("pads", [0] * 2 * nd)
        if any(n + pads_[i] + pads_[i + nd] < (k - 1) * dl + 1
               for i, (n, k, dl) in enumerate(zip(x.shape[2:], kernel, dil))):
            return None
    fan = (c // groups) * math.prod(kernel)
    wshape = (c, per, *kernel) if transpose else (cout, c // groups, *kernel)
    w = _weight(b, wshape, x.dtype, fan)
    ins = [x.name, w.name]
    bias = 0.0
    if d(st.booleans()):
        bv = b.randn((cout,), x.dtype)
        ins.append(bv.name)
        bias = bv.mag
    if transpose:
        op = [d(st.integers(0, s - 1)) for s in strides]      # onnxruntime: below the stride
        if any(op):
            attrs["output_padding"] = op
    mag = fan * x.mag * w.mag + bias
    if mag > LIMIT[x.dtype] and x.mag != math.inf:
        return None
    (out,) = b.emit("ConvTranspose" if transpose else "Conv", ins, **attrs)
    return [b.val(out, mag, x.nan or mag == math.inf)]


# ---------------------------------------------------------------- scatters

# Reductions onnxruntime's CPU kernels lack for fp16 (it refuses them when run: probed, 1.32).
ORT_FP16_LACKS = {"ScatterND": {"add", "mul", "max", "min"}, "ScatterElements": {"add", "mul"}}


def _scatter_reduction(d, b, op: str, dtype: int, nan: bool = False) -> str | None:
    # onnxruntime's scatter max/min keeps the update over a NaN already in the data (the spec's
    # reference and torch: NaN): not over a value that may hold NaN
    minmax = ["max", "min"] if b.opset >= 18 and not nan else []
    choices = [None] + (["none", "add", "mul"] if b.opset >= 16 else []) + minmax
    if dtype == F16:
        choices = [c for c in choices if c not in ORT_FP16_LACKS[op]]
    return d(st.sampled_from(choices))


def _scatter_mag(data: Val, upd: Val, reduction, count: int) -> float:
    if reduction == "add":
        return data.mag + count * upd.mag
    if reduction == "mul":
        return data.mag * _power(max(upd.mag, 1.0), count)
    return max(data.mag, upd.mag)


def _scatter_nd(d, b, x):
    """x written at index tuples (unique unless reduced) with constant updates, or a constant
    written with x as the updates."""
    if x.rank == 0 or x.dtype == BOOL:
        return None
    reduction = _scatter_reduction(d, b, "ScatterND", x.dtype, x.nan)
    unique = reduction in (None, "none")
    if d(st.booleans()):            # data = x
        data, m = x, d(st.integers(1, x.rank))
        slots = math.prod(x.shape[:m])
        q = [d(st.integers(1, 3)) for _ in range(d(st.integers(0, 2)))]
        count = math.prod(q)
        if unique and count > slots:
            return None
        upd = b.randn(tuple(q) + x.shape[m:], x.dtype)
    else:                           # updates = x
        j = d(st.integers(0, x.rank))
        q, rest = list(x.shape[:j]), x.shape[j:]
        count = math.prod(q)
        m = d(st.integers(1, 2))
        lead = [d(st.integers(1, 4)) for _ in range(m)]
        if unique:
            while math.prod(lead) < count:
                lead[0] += 1
        if math.prod(lead) * math.prod(rest) > MAX_NUMEL or m + len(rest) > MAX_RANK:
            return None
        data, upd, slots = b.randn(tuple(lead) + rest, x.dtype), x, math.prod(lead)
    flat = b.rng.choice(slots, count, replace=False) if unique else b.rng.integers(0, slots, count)
    idx = np.stack(np.unravel_index(flat, data.shape[:m]), axis=-1).reshape(tuple(q) + (m,))
    idx = np.where(b.rng.random(idx.shape) < 0.3, idx - np.array(data.shape[:m]), idx)      # some negative
    mag = _scatter_mag(data, upd, reduction, count)
    if mag > LIMIT[x.dtype] and x.mag != math.inf:
        return None
    (out,) = b.emit("ScatterND", [data.name, b.const(idx, I64), upd.name], reduction=reduction)
    return [b.val(out, mag, x.nan)]


def _scatter_elements(d, b, x):
    if x.rank == 0 or x.dtype == BOOL:
        return None
    reduction = _scatter_reduction(d, b, "ScatterElements", x.dtype, x.nan)
    k = _dim(d, x.rank)
    kk = k % x.rank
    if d(st.booleans()):            # data = x, constant updates
        data = x
        ishape = [d(st.integers(1, n)) for n in x.shape]
        upd = b.randn(tuple(ishape), x.dtype)
    else:                           # updates = x into a constant at least as large along the axis
        ishape = list(x.shape)
        dshape = list(x.shape)
        dshape[kk] += d(st.integers(0, 2))
        if math.prod(dshape) > MAX_NUMEL:
            return None
        data, upd = b.randn(tuple(dshape), x.dtype), x
    n = data.shape[kk]
    # distinct positions along the axis for every other coordinate (a write without reduction
    # to one position twice is unspecified)
    order = np.argsort(b.rng.random(ishape[:kk] + [n] + ishape[kk + 1:]), axis=kk)
    idx = np.take(order, np.arange(ishape[kk]), axis=kk)
    idx = np.where(b.rng.random(idx.shape) < 0.3, idx - n, idx)
    mag = _scatter_mag(data, upd, reduction, 1)
    (out,) = b.emit("ScatterElements", [data.name, b.const(idx, I64), upd.name], axis=k, reduction=reduction)
    return [b.val(out, mag, x.nan)]


# ---------------------------------------------------------------- drawing programs

OPS = {
    "reshape": _reshape, "flatten": _flatten, "transpose": _transpose, "squeeze": _squeeze,
    "unsqueeze": _unsqueeze, "slice": _slice, "expand": _expand, "concat": _concat, "split": _split,
    "gather": _gather, "gather_elements": _gather_elements, "gather_nd": _gather_nd, "tile": _tile,
    "pad": _pad, "depth_to_space": _depth_to_space, "space_to_depth": _space_to_depth, "identity": _identity,
    "unary": _unary, "binary": _binary, "where": _where, "compare": _compare, "logic": _logic, "cast": _cast,
    "clip": _clip, "isnan": _isnan, "reduce": _reduce, "argmax": _argmax, "softmax": _softmax,
    "cumsum": _cumsum, "layer_norm": _layer_norm, "matmul": _matmul, "gemm": _gemm, "conv": _conv,
    "scatter_nd": _scatter_nd, "scatter_elements": _scatter_elements,
}
SPLITS = ["reshape", "unsqueeze", "flatten", "split", "expand"]
PICKS = ["slice", "gather", "gather_elements", "gather_nd", "split", "squeeze", "slice"]
MOVES = ["transpose", "reshape", "depth_to_space", "space_to_depth", "tile", "pad", "concat", "unsqueeze"]
VIEWS = ["reshape", "flatten", "transpose", "squeeze", "unsqueeze", "slice", "expand", "concat", "split",
         "gather", "gather_elements", "gather_nd", "tile", "pad", "depth_to_space", "space_to_depth", "identity"]
ELEMENTWISE = ["unary", "unary", "unary", "binary", "binary", "where", "compare", "logic", "cast", "clip", "isnan"]
REDUCTIONS = ["reduce", "reduce", "argmax", "softmax", "cumsum", "layer_norm"]
CONTRACTIONS = ["matmul", "matmul", "gemm", "conv", "conv"]
SCATTERS = ["scatter_nd", "scatter_elements"]
ARITH = ELEMENTWISE + REDUCTIONS + CONTRACTIONS + SCATTERS
# Mixed programs draw a family, then an operator of it (a draw over all operators would leave
# each unary function to one step in a thousand).
FAMILIES = [VIEWS, VIEWS, VIEWS, ELEMENTWISE, ELEMENTWISE, ELEMENTWISE, REDUCTIONS, REDUCTIONS, CONTRACTIONS,
            SCATTERS]
assert set(VIEWS + ARITH) == set(OPS)


def make_feeds(inputs, seed: int, special: bool) -> dict[str, np.ndarray]:
    """Normal floats (with a few NaN, infinities and signed zeros when ``special``), integers in
    [-4, 4], fair bools."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, shape, dtype in inputs:
        if dtype in FLOATS:
            a = rng.standard_normal(shape)
            if special and a.size:
                flat = a.reshape(-1)
                for i in rng.choice(a.size, min(a.size, 3), replace=False):
                    flat[i] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0])
        elif dtype == BOOL:
            a = rng.random(shape) < 0.5
        else:
            a = rng.integers(-4, 5, shape)
        feeds[name] = np.asarray(a, dtype=NP[dtype])
    return feeds


def run_onnxruntime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    """onnxruntime's outputs, graph optimizations off (its kernels as written, one thread)."""
    import onnxruntime as ort
    ort.set_default_logger_severity(3)      # a refused model is counted, not logged
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@dataclass(frozen=True)
class OnnxProgram:
    model: onnx.ModelProto = field(compare=False)
    inputs: tuple            # (name, shape, onnx dtype) per graph input
    seed: int
    special: bool            # NaN, infinities and signed zeros among the float inputs
    expected: tuple = field(compare=False)     # onnxruntime's outputs on feeds()
    given: tuple | None = field(default=None, compare=False)     # (name, array) feeds of a hand-built case

    def feeds(self) -> dict[str, np.ndarray]:
        if self.given is not None:
            return {n: a.copy() for n, a in self.given}
        return make_feeds(self.inputs, self.seed, self.special)

    def source(self) -> str:
        return onnx.printer.to_text(self.model) + f"\n# feeds: make_feeds(inputs, seed={self.seed}, special={self.special})"

    def __repr__(self) -> str:
        return f"OnnxProgram(\n{self.source()}\n)"


def program(model: onnx.ModelProto, seed: int = 0, special: bool = False, feeds: dict | None = None) -> OnnxProgram:
    """A hand-built model as a program (regression tests): checked, and run by onnxruntime on
    ``feeds`` (default: ``make_feeds`` of ``seed`` and ``special``)."""
    onnx.checker.check_model(model, full_check=True)
    inputs = tuple((i.name, tuple(d.dim_value for d in i.type.tensor_type.shape.dim), i.type.tensor_type.elem_type)
                   for i in model.graph.input)
    given = tuple((n, np.asarray(a)) for n, a in feeds.items()) if feeds is not None else None
    p = OnnxProgram(model, inputs, seed, special, (), given)
    return OnnxProgram(model, inputs, seed, special, tuple(run_onnxruntime(model, p.feeds())), given)


def _reject(why: str, model: onnx.ModelProto):
    REJECTED.append((why, model))
    STATS["rejected"] += 1
    STATS[f"rejected {why}"] += 1
    assume(False)


@st.composite
def programs(draw, max_steps: int = 8, dtypes=(F32, F32, F16)) -> OnnxProgram:
    """A random program: 1-2 float inputs of rank 0-4 (dims 1-8; sometimes an int64 input too),
    2-``max_steps`` steps, 1-3 outputs.  Half are chains of views ending in arithmetic (where
    composed index maps go wrong); the others mix every kind of operator."""
    d = draw
    opset = d(st.sampled_from(OPSETS))
    dtype = d(st.sampled_from(dtypes))
    seed = d(st.integers(0, 2 ** 16))
    special = d(st.integers(0, 4)) == 0
    b = Builder(opset, seed)
    for _ in range(d(st.integers(1, 2))):
        rank = d(st.sampled_from([2, 3, 4, 1, 3, 4, 0]))
        shape = d(st.lists(st.sampled_from([4, 6, 2, 3, 8, 1, 5, 7]), min_size=rank, max_size=rank))
        b.input(shape, dtype, math.inf if special else INPUT_MAG, special)
    if d(st.integers(0, 5)) == 0:
        b.input(d(st.lists(st.sampled_from([4, 3, 1, 6]), min_size=1, max_size=3)), I64, 8.0)
    n_inputs = len(b.vals)
    views = d(st.booleans())
    want = d(st.integers(4 if views else 2, max_steps))
    steps = 0
    for _ in range(4 * want):          # draws that do not apply are retried, a bounded number of times
        if steps == want:
            break
        if views:   # split a dim, move dims or pick from them, pick, more views, then compute
            names = ([SPLITS, PICKS + MOVES, PICKS][steps] if steps < 3 else
                     ARITH if steps >= want - 2 else VIEWS)
        else:
            names = _pick(d, b, FAMILIES)
        k = d(st.integers(0, len(b.vals) - 1))
        x = b.vals[-1] if views or d(st.booleans()) else b.vals[k]
        name = _pick(d, b, names)
        mark = b.mark()
        try:
            got = OPS[name](d, b, x)
        except Refused as e:
            STATS[f"refused {e.args[0]}"] += 1
            got = None
        if not got:
            b.rollback(mark)
            continue
        steps += 1
    assume(steps)
    made = b.vals[n_inputs:]
    outs = [made[-1]]
    for _ in range(d(st.integers(0, 2))):
        v = d(st.sampled_from(b.vals))
        if v not in outs and (v not in b.inputs or d(st.integers(0, 3)) == 0):
            outs.append(v)
    model = b.model(d(st.permutations(outs)))
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:      # noqa: BLE001
        _reject(f"checker: {str(e).splitlines()[0][:120]}", model)
    inputs = tuple((v.name, v.shape, v.dtype) for v in b.inputs)
    feeds = make_feeds(inputs, seed, special)
    try:
        expected = run_onnxruntime(model, feeds)
    except Exception as e:      # noqa: BLE001
        _reject(f"onnxruntime: {str(e).splitlines()[0][:160]}", model)
    declared = [tuple(d.dim_value for d in o.type.tensor_type.shape.dim) for o in model.graph.output]
    if [tuple(e.shape) for e in expected] != declared:
        _reject(f"onnxruntime's shapes {[e.shape for e in expected]} differ from onnx's {declared}", model)
    STATS["programs"] += 1
    for n in model.graph.node:
        STATS[f"op {n.op_type}"] += 1
    return OnnxProgram(model, inputs, seed, special, tuple(expected))
