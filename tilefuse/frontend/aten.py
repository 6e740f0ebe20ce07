"""ATen -> canonical operators (docs/canonical-ops.md): a table of converters, one per ATen overload.

A converter receives the ``Emitter`` and the ATen node's arguments bound by name from the
overload's schema (``a.self``, ``a.dim``, ...): tensors as value names (``str``), everything else
as the Python value.  A scalar may stand where the schema says Tensor (``add.Tensor(x, 2)``).  The
converter emits canonical nodes with ``em.op`` and returns the value name(s) of the result (a tuple
for ATen ops with several outputs, ``None`` for an output nobody uses).

``KEEP_WHOLE`` lists the ATen ops kept out of the decomposition table because a canonical node
says more than their decomposition (attention, linear, matmul, activations, norms).
"""
from __future__ import annotations

import math
import operator
from types import SimpleNamespace
from typing import Callable, Sequence

import torch
import torch.fx as fx

from ..errors import UnsupportedAttribute, UnsupportedOperator
from ..ir.dtypes import DType, TensorType
from ..ir.graph import Attrs, Graph, Node
from ..ir.prim import Constant, TensorDecl

aten = torch.ops.aten
INT64_MAX = 2**63 - 1
INT64_MIN = -2**63

# Composite ops kept whole when decomposing (see module docstring).
KEEP_WHOLE = (
    aten.scaled_dot_product_attention.default, aten.linear.default, aten.matmul.default,
    aten.einsum.default, aten.silu.default, aten.hardswish.default, aten.hardsigmoid.default,
    aten.mish.default, aten.softplus.default, aten.rms_norm.default, aten.adaptive_avg_pool2d.default,
    aten.adaptive_avg_pool1d.default, aten.tril.default, aten.triu.default,
    # Resize and Pad(reflect/edge) instead of gathers through computed index tensors:
    *(getattr(aten, f"{name}{nd}").vec for nd in ("1d", "2d", "3d")
      for name in ("upsample_nearest", "_upsample_nearest_exact")),
    aten.upsample_linear1d.vec, aten.upsample_bilinear2d.vec, aten.upsample_trilinear3d.vec,
    aten.upsample_bicubic2d.vec,
    *(getattr(aten, f"{name}{nd}").default for nd in ("1d", "2d", "3d")
      for name in ("reflection_pad", "replication_pad")),
)

Converter = Callable[["Emitter", SimpleNamespace], object]
CONVERTERS: dict[str, Converter] = {}


def converts(*names: str):
    """Register a converter for ATen overloads named like ``"aten.add.Tensor"``."""
    def deco(fn: Converter) -> Converter:
        for n in names:
            if n in CONVERTERS:
                raise RuntimeError(f"two converters for {n}")
            CONVERTERS[n] = fn
        return fn
    return deco


def op_name(target) -> str:
    """``aten.add.Tensor`` for an OpOverload, the qualified name for other callables."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__qualname__", None) or str(target)


# ----------------------------------------------------------------------------------------------
# The emitter: builds the canonical Graph node by node.

class Emitter:
    """Accumulates canonical nodes, value types and constants while an FX graph is converted.

    Every ATen node's own name is reserved up front: the last canonical node emitted for it (or
    the constant it folds to) takes that name, helper nodes get ``name.k``.
    """

    def __init__(self, reserved: set[str]):
        self.nodes: list[Node] = []
        self.types: dict[str, TensorType] = {}
        self.consts: dict[str, torch.Tensor] = {}
        self.inputs: list[TensorDecl] = []
        self._reserved = set(reserved)
        self._used: set[str] = set()
        self._scalars: dict[tuple, str] = {}
        self.fx: fx.Node | None = None
        self.location: str | None = None
        self._k = 0
        self._made_by: dict[str, int] = {}   # value -> index of the node producing it

    # -- names and values
    def fresh(self, stem: str) -> str:
        name, k = stem, 0
        while name in self._used or name in self._reserved:
            k += 1
            name = f"{stem}.{k}"
        self._used.add(name)
        return name

    def claim(self, name: str) -> str:
        """Use a reserved name (an FX node's own) exactly, or a fresh variant if already taken."""
        if name in self._used:
            return self.fresh(name)
        self._used.add(name)
        return name

    def add_input(self, name: str, t: TensorType) -> str:
        name = self.claim(name)
        self.types[name] = t
        self.inputs.append(TensorDecl(name, t))
        return name

    def type(self, v: str) -> TensorType:
        return self.types[v]

    def dtype(self, v: str) -> DType:
        return self.types[v].dtype

    def shape(self, v: str) -> tuple[int, ...]:
        return self.types[v].shape

    def rank(self, v: str) -> int:
        return self.types[v].rank

    def is_const(self, v) -> bool:
        return isinstance(v, str) and v in self.consts

    def const(self, data: torch.Tensor, name: str | None = None) -> str:
        """A constant; ``name`` (exact, if free) or a fresh name derived from the current node."""
        data = data.detach().cpu().contiguous()
        if name is not None:
            name = self.claim(name)
        else:
            name = self.fresh(f"{self.fx.name}.c" if self.fx is not None else "const")
        self.consts[name] = data
        self.types[name] = TensorType(tuple(data.shape), DType.from_torch(data.dtype))
        return name

    def scalar(self, value, dtype: DType) -> str:
        """A 0-d constant (shared between nodes)."""
        key = (repr(value), dtype)
        if key not in self._scalars:
            data = torch.tensor(value, dtype=dtype.to_torch())
            self.consts[name := self.fresh("scalar")] = data
            self.types[name] = TensorType((), dtype)
            self._scalars[key] = name
        return self._scalars[key]

    def operand(self, v, dtype: DType) -> str:
        """A tensor value cast to ``dtype``, or a Python scalar as a constant of ``dtype``."""
        if isinstance(v, str):
            return self.cast(v, dtype)
        return self.scalar(_py(v, dtype), dtype)

    def proto(self, v):
        """Something ``torch.result_type`` accepts: a meta tensor of v's type, or the scalar."""
        if isinstance(v, str):
            t = self.types[v]
            return torch.empty(t.shape, dtype=t.dtype.to_torch(), device="meta")
        return v

    # -- the ATen node being converted
    def begin(self, node: fx.Node, location: str | None) -> None:
        self.fx, self.location, self._k = node, location, 0

    def out_type(self, k: int = 0) -> TensorType:
        val = self.fx.meta.get("val")
        if isinstance(val, (tuple, list)):
            val = val[k]
        return tensor_type(val, self)

    def used_outputs(self) -> set[int]:
        """Indices of this multi-output node's results that something reads."""
        used: set[int] = set()
        for u in self.fx.users:
            if u.target is operator.getitem:
                if u.users:
                    used.add(u.args[1])
            else:
                used.update(range(len(self.fx.meta.get("val", ()))))
        return used

    # -- emitting
    def op(self, op: str, inputs: Sequence[str | None], attrs: dict | None = None,
           out: TensorType | None = None, outs: Sequence[TensorType | None] | None = None):
        """Emit one canonical node; returns its output name (a tuple of names with ``outs``,
        None where an output's type is None, i.e. nobody reads it)."""
        base = self.fresh(f"{self.fx.name}.{self._k}")
        self._k += 1
        types = list(outs) if outs is not None else [out or self.out_type()]
        names = []
        for k, t in enumerate(types):
            name = "" if t is None else (base if outs is None else self.fresh(f"{base}:{k}"))
            if name:
                self.types[name] = t
            names.append(name)
        self._made_by.update((n, len(self.nodes)) for n in names if n)
        self.nodes.append(Node(op, base, tuple(i or "" for i in inputs), tuple(names),
                               Attrs(attrs or {}), self.location))
        return tuple(n or None for n in names) if outs is not None else names[0]

    def cast(self, v: str, dtype: DType) -> str:
        if self.dtype(v) is dtype:
            return v
        if self.is_const(v):
            return self.const(self.consts[v].to(dtype.to_torch()))
        return self.op("Cast", [v], {"to": dtype.to_onnx()}, TensorType(self.shape(v), dtype))

    def reshape(self, v: str, shape: Sequence[int]) -> str:
        shape = tuple(shape)
        if self.shape(v) == shape:
            return v
        if self.is_const(v):
            return self.const(self.consts[v].reshape(shape))
        return self.op("Reshape", [v], None, TensorType(shape, self.dtype(v)))

    def transpose(self, v: str, perm: Sequence[int]) -> str:
        perm = tuple(perm)
        src = self._producer(v)
        if src is not None and src.op == "Transpose":  # compose; the first one may become dead
            v, perm = src.inputs[0], tuple(src.attrs["perm"][p] for p in perm)
        if perm == tuple(range(len(perm))):
            return v
        if self.is_const(v):
            return self.const(self.consts[v].permute(perm))
        shape = tuple(self.shape(v)[p] for p in perm)
        return self.op("Transpose", [v], {"perm": perm}, TensorType(shape, self.dtype(v)))

    def _producer(self, v: str) -> Node | None:
        k = self._made_by.get(v)
        return self.nodes[k] if k is not None else None

    def finish_node(self, result, start: int):
        """Give the last canonical node emitted for the current ATen node the ATen node's name."""
        if len(self.nodes) <= start:
            return result
        last = self.nodes[-1]
        outs = [o for o in (result if isinstance(result, tuple) else (result,)) if isinstance(o, str)]
        if not outs or not set(outs) <= set(last.outputs):
            return result
        name = self.claim(self.fx.name)
        if len(last.outputs) == 1:
            new = {last.outputs[0]: name}
        else:
            new = {o: f"{name}:{k}" for k, o in enumerate(last.outputs) if o}
        if any(n in self.types for n in new.values()):
            return result
        for old, n in new.items():
            self.types[n] = self.types.pop(old)
            self._made_by[n] = self._made_by.pop(old)
        self.nodes[-1] = Node(last.op, name, last.inputs, tuple(new.get(o, o) for o in last.outputs),
                              last.attrs, last.location)
        if isinstance(result, tuple):
            return tuple(new.get(o, o) if isinstance(o, str) else o for o in result)
        return new.get(result, result)

    # -- errors naming the ATen node and its source line
    def node_ref(self) -> Node:
        return Node(op_name(self.fx.target), self.fx.name, (), (), Attrs(), self.location)

    def unsupported(self, detail: str) -> UnsupportedOperator:
        return UnsupportedOperator(self.node_ref(), detail)

    def bad_attr(self, attr: str, value, detail: str) -> UnsupportedAttribute:
        return UnsupportedAttribute(self.node_ref(), attr, value, detail)

    def graph(self, outputs: Sequence[str], name: str) -> Graph:
        """The finished Graph without dead nodes, keeping only the constants something reads."""
        used = set(outputs)
        live = []
        for n in reversed(self.nodes):
            if any(o in used for o in n.outputs):
                live.append(n)
                used.update(n.inputs)
        nodes = tuple(reversed(live))
        consts = tuple(Constant(n, t) for n, t in self.consts.items() if n in used)
        keep = ({d.name for d in self.inputs} | {c.name for c in consts}
                | {o for n in nodes for o in n.outputs})
        types = {k: v for k, v in self.types.items() if k in keep}
        return Graph(tuple(self.inputs), tuple(outputs), nodes, consts, types, name)


def tensor_type(val, em: Emitter | None = None) -> TensorType:
    """The TensorType of an FX value's ``meta["val"]`` (a FakeTensor with static shape)."""
    if not isinstance(val, torch.Tensor):
        detail = f"expected a tensor, got {type(val).__name__}"
        raise em.unsupported(detail) if em is not None else TypeError(detail)
    shape = []
    for d in val.shape:
        try:
            shape.append(int(d))
        except Exception:
            detail = f"dynamic dimension {d} (tilefuse compiles for static shapes)"
            raise em.unsupported(detail) if em is not None else TypeError(detail) from None
    return TensorType(tuple(shape), DType.from_torch(val.dtype))


def _py(v, dtype: DType):
    """A Python scalar converted to the Python type of dtype."""
    if dtype is DType.bool:
        return bool(v)
    if dtype.is_int:
        return int(v)
    return float(v)


def bind(node: fx.Node, lookup: Callable) -> SimpleNamespace:
    """The node's arguments by schema name, with defaults; FX nodes mapped through ``lookup``."""
    schema = node.target._schema
    vals = {}
    for k, arg in enumerate(schema.arguments):
        if k < len(node.args) and not arg.kwarg_only:
            v = node.args[k]
        elif arg.name in node.kwargs:
            v = node.kwargs[arg.name]
        elif arg.has_default_value():
            v = arg.default_value
        else:
            v = None
        vals[arg.name] = fx.node.map_arg(v, lookup)
    return SimpleNamespace(**vals)


# ----------------------------------------------------------------------------------------------
# Small helpers shared by converters.

def _norm_dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _dims(dim, rank: int) -> tuple[int, ...]:
    """Reduction dims: None or [] = all."""
    if dim is None:
        return tuple(range(rank))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(rank))
    return tuple(sorted({_norm_dim(d, max(rank, 1)) for d in dim}))


def _tup(v, n: int) -> tuple:
    if isinstance(v, (list, tuple)):
        v = tuple(v)
        return v * n if len(v) == 1 else v
    return (v,) * n


def _bcast_shape(*shapes) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*[torch.Size(s) for s in shapes]))


def _reduce_type(shape, axes, keepdim, dtype: DType) -> TensorType:
    if keepdim:
        s = tuple(1 if d in axes else n for d, n in enumerate(shape))
    else:
        s = tuple(n for d, n in enumerate(shape) if d not in axes)
    return TensorType(s, dtype)


# ----------------------------------------------------------------------------------------------
# Elementwise operators.

def _unary(op: str, attrs: dict | None = None, cast_input: bool = True) -> Converter:
    def convert(em: Emitter, a):
        out = em.out_type()
        x = em.cast(a.self, out.dtype) if cast_input else a.self
        return em.op(op, [x], attrs)
    return convert


for _name, _op in {
    "abs": "Abs", "neg": "Neg", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "rsqrt": "Rsqrt",
    "reciprocal": "Reciprocal", "sin": "Sin", "cos": "Cos", "tan": "Tan", "tanh": "Tanh", "erf": "Erf",
    "sigmoid": "Sigmoid", "relu": "Relu", "floor": "Floor", "ceil": "Ceil", "sign": "Sign",
    "sgn": "Sign", "asin": "Asin", "acos": "Acos", "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh",
    "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh", "silu": "Silu", "mish": "Mish",
    "hardswish": "HardSwish",
}.items():
    converts(f"aten.{_name}.default")(_unary(_op))

converts("aten.hardsigmoid.default")(_unary("HardSigmoid", {"alpha": 1.0 / 6, "beta": 0.5}))
converts("aten.isnan.default")(_unary("IsNaN", cast_input=False))
converts("aten.isinf.default")(_unary("IsInf", cast_input=False))


@converts("aten.round.default")
def _round(em, a):
    return em.op("Round", [a.self])


@converts("aten.round.decimals")
def _round_decimals(em, a):
    if a.decimals == 0:
        return em.op("Round", [a.self])
    t = em.type(a.self)
    scale = em.scalar(10.0 ** a.decimals, t.dtype)
    scaled = em.op("Round", [em.op("Mul", [a.self, scale], out=t)], out=t)
    return em.op("Div", [scaled, scale])


@converts("aten.gelu.default")
def _gelu(em, a):
    return em.op("Gelu", [a.self], {"approximate": a.approximate})


@converts("aten.leaky_relu.default")
def _leaky_relu(em, a):
    return em.op("LeakyRelu", [a.self], {"alpha": float(a.negative_slope)})


@converts("aten.elu.default")
def _elu(em, a):
    if a.scale != 1 or a.input_scale != 1:
        raise em.bad_attr("scale", (a.scale, a.input_scale), "only scale=input_scale=1 (plain ELU) is supported")
    return em.op("Elu", [a.self], {"alpha": float(a.alpha)})


@converts("aten.softplus.default")
def _softplus(em, a):
    # torch switches to the identity above `threshold`; there log1p(exp(x)) equals x to fp32 precision.
    t = em.type(a.self)
    if a.beta == 1:
        return em.op("Softplus", [a.self])
    beta = em.scalar(float(a.beta), t.dtype)
    sp = em.op("Softplus", [em.op("Mul", [a.self, beta], out=t)], out=t)
    return em.op("Div", [sp, beta])


@converts("aten.log1p.default")
def _log1p(em, a):
    out = em.out_type()
    x = em.cast(a.self, out.dtype)
    return em.op("Log", [em.op("Add", [x, em.scalar(1.0, out.dtype)], out=out)])


@converts("aten.expm1.default")
def _expm1(em, a):
    out = em.out_type()
    x = em.cast(a.self, out.dtype)
    return em.op("Sub", [em.op("Exp", [x], out=out), em.scalar(1.0, out.dtype)])


@converts("aten.log2.default")
def _log2(em, a):
    out = em.out_type()
    x = em.cast(a.self, out.dtype)
    return em.op("Div", [em.op("Log", [x], out=out), em.scalar(math.log(2.0), out.dtype)])


@converts("aten.logical_not.default")
def _logical_not(em, a):
    return em.op("Not", [em.cast(a.self, DType.bool)])


@converts("aten.bitwise_not.default")
def _bitwise_not(em, a):
    return em.op("Not" if em.dtype(a.self) is DType.bool else "BitwiseNot", [a.self])


def _binary(op: str) -> Converter:
    """Arithmetic: both operands are cast to the result dtype (torch type promotion)."""
    def convert(em: Emitter, a):
        dt = em.out_type().dtype
        return em.op(op, [em.operand(a.self, dt), em.operand(a.other, dt)])
    return convert


for _name, _op in {"maximum": "Max", "minimum": "Min"}.items():
    converts(f"aten.{_name}.default")(_binary(_op))


@converts("aten.mul.Tensor", "aten.mul.Scalar")
def _mul(em, a):
    dt = em.out_type().dtype
    return em.op("And" if dt is DType.bool else "Mul", [em.operand(a.self, dt), em.operand(a.other, dt)])


@converts("aten.fmod.Tensor", "aten.fmod.Scalar")
def _fmod(em, a):
    """C-style remainder: the result takes the dividend's sign."""
    dt = em.out_type().dtype
    return em.op("Mod", [em.operand(a.self, dt), em.operand(a.other, dt)], {"fmod": 1})


def _with_alpha(em: Emitter, v, alpha, dt: DType) -> str:
    v = em.operand(v, dt)
    if alpha == 1:
        return v
    return em.op("Mul", [v, em.scalar(_py(alpha, dt), dt)], out=TensorType(em.shape(v), dt))


@converts("aten.add.Tensor", "aten.add.Scalar")
def _add(em, a):
    dt = em.out_type().dtype
    if dt is DType.bool:
        return em.op("Or", [em.operand(a.self, dt), em.operand(a.other, dt)])
    return em.op("Add", [em.operand(a.self, dt), _with_alpha(em, a.other, a.alpha, dt)])


@converts("aten.sub.Tensor", "aten.sub.Scalar")
def _sub(em, a):
    dt = em.out_type().dtype
    return em.op("Sub", [em.operand(a.self, dt), _with_alpha(em, a.other, a.alpha, dt)])


@converts("aten.rsub.Tensor", "aten.rsub.Scalar")
def _rsub(em, a):
    dt = em.out_type().dtype
    return em.op("Sub", [em.operand(a.other, dt), _with_alpha(em, a.self, a.alpha, dt)])


def _trunc(em: Emitter, q: str) -> str:
    """Round toward zero (ONNX has no Trunc): floor for q >= 0, ceil below."""
    t = em.type(q)
    neg = em.op("Less", [q, em.scalar(0.0, t.dtype)], out=TensorType(t.shape, DType.bool))
    return em.op("Where", [neg, em.op("Ceil", [q], out=t), em.op("Floor", [q], out=t)])


def _floor_div(em: Emitter, x: str, y: str) -> str:
    out = em.out_type()
    if out.dtype.is_float:
        return em.op("Floor", [em.op("Div", [x, y], out=out)])
    # Integers: x - mod(x, y) is an exact multiple of y, so the truncating Div is exact.
    m = em.op("Mod", [x, y], {"fmod": 0}, out=out)
    return em.op("Div", [em.op("Sub", [x, m], out=out), y])


@converts("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode",
          "aten.floor_divide.default", "aten.floor_divide.Scalar")
def _div(em, a):
    out = em.out_type()
    mode = getattr(a, "rounding_mode", None)
    if "floor_divide" in op_name(em.fx.target):
        mode = "floor"
    x, y = em.operand(a.self, out.dtype), em.operand(a.other, out.dtype)
    if mode == "floor":
        return _floor_div(em, x, y)
    if mode == "trunc" and out.dtype.is_float:
        return _trunc(em, em.op("Div", [x, y], out=out))
    return em.op("Div", [x, y])  # integer Div truncates (canonical semantics)


@converts("aten.remainder.Tensor", "aten.remainder.Scalar")
def _remainder(em, a):
    out = em.out_type()
    x, y = em.operand(a.self, out.dtype), em.operand(a.other, out.dtype)
    if not out.dtype.is_float:
        return em.op("Mod", [x, y], {"fmod": 0})
    # Python-style remainder for floats: x - floor(x / y) * y.
    q = em.op("Floor", [em.op("Div", [x, y], out=out)], out=out)
    return em.op("Sub", [x, em.op("Mul", [q, y], out=out)])


@converts("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(em, a):
    dt = em.out_type().dtype
    e = a.exponent
    if isinstance(a.self, str) and not isinstance(e, str):
        x = em.cast(a.self, dt)
        if e == 2:
            return em.op("Mul", [x, x])
        if e == 1:
            return x
        if e == 0.5 and dt.is_float:
            return em.op("Sqrt", [x])
    return em.op("Pow", [em.operand(a.self, dt), em.operand(e, dt)])


def _compare(op: str, negate: bool = False) -> Converter:
    def convert(em: Emitter, a):
        dt = DType.from_torch(torch.result_type(em.proto(a.self), em.proto(a.other)))
        ins = [em.operand(a.self, dt), em.operand(a.other, dt)]
        if not negate:
            return em.op(op, ins)
        return em.op("Not", [em.op(op, ins, out=em.out_type())])
    return convert


for _name, (_op, _neg) in {"eq": ("Equal", False), "ne": ("Equal", True), "lt": ("Less", False),
                           "le": ("LessOrEqual", False), "gt": ("Greater", False),
                           "ge": ("GreaterOrEqual", False)}.items():
    for _ov in ("Tensor", "Scalar"):
        converts(f"aten.{_name}.{_ov}")(_compare(_op, _neg))


def _logical(op: str) -> Converter:
    def convert(em: Emitter, a):
        return em.op(op, [em.operand(a.self, DType.bool), em.operand(a.other, DType.bool)])
    return convert


for _name, _op in {"and": "And", "or": "Or", "xor": "Xor"}.items():
    converts(f"aten.logical_{_name}.default")(_logical(_op))


def _bitwise(op: str) -> Converter:
    def convert(em: Emitter, a):
        dt = em.out_type().dtype
        name = {"BitwiseAnd": "And", "BitwiseOr": "Or", "BitwiseXor": "Xor"}[op] if dt is DType.bool else op
        return em.op(name, [em.operand(a.self, dt), em.operand(a.other, dt)])
    return convert


for _name, _op in {"and": "BitwiseAnd", "or": "BitwiseOr", "xor": "BitwiseXor"}.items():
    for _ov in ("Tensor", "Scalar"):
        converts(f"aten.bitwise_{_name}.{_ov}")(_bitwise(_op))


@converts("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(em, a):
    dt = em.out_type().dtype
    return em.op("Where", [em.cast(a.condition, DType.bool), em.operand(a.self, dt), em.operand(a.other, dt)])


@converts("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(em, a):
    dt = em.out_type().dtype
    return em.op("Where", [em.cast(a.mask, DType.bool), em.operand(a.value, dt), em.operand(a.self, dt)])


def _clip(em: Emitter, x, lo, hi) -> str:
    out = em.out_type()
    x = em.cast(x, out.dtype)
    tensor_bounds = isinstance(lo, str) or isinstance(hi, str)
    if not tensor_bounds:
        return em.op("Clip", [x, None if lo is None else em.scalar(_py(lo, out.dtype), out.dtype),
                              None if hi is None else em.scalar(_py(hi, out.dtype), out.dtype)])
    # Tensor bounds broadcast elementwise: Max then Min.
    if lo is not None:
        x = em.op("Max", [x, em.operand(lo, out.dtype)], out=out)
    if hi is not None:
        x = em.op("Min", [x, em.operand(hi, out.dtype)], out=out)
    return x


@converts("aten.clamp.default", "aten.clamp.Tensor")
def _clamp(em, a):
    return _clip(em, a.self, a.min, a.max)


@converts("aten.clamp_min.default", "aten.clamp_min.Tensor")
def _clamp_min(em, a):
    return _clip(em, a.self, a.min, None)


@converts("aten.clamp_max.default", "aten.clamp_max.Tensor")
def _clamp_max(em, a):
    return _clip(em, a.self, None, a.max)


@converts("aten.hardtanh.default")
def _hardtanh(em, a):
    return _clip(em, a.self, a.min_val, a.max_val)


# ----------------------------------------------------------------------------------------------
# Casts, copies, views and other layout operators.

@converts("aten.clone.default", "aten.alias.default", "aten.detach.default", "aten.contiguous.default",
          "aten.lift_fresh_copy.default")
def _identity(em, a):
    """Copies and aliases: the value itself (no node)."""
    return a.self


def _check_inference_dropout(em: Emitter, a) -> None:
    if a.train and a.p:
        raise em.bad_attr("train", True, "dropout in training mode (call model.eval())")


@converts("aten.dropout.default", "aten.feature_dropout.default")
def _dropout(em, a):
    _check_inference_dropout(em, a)
    return a.input


@converts("aten.native_dropout.default")
def _native_dropout(em, a):
    _check_inference_dropout(em, a)
    if 1 in em.used_outputs():
        raise em.unsupported("the dropout mask output is not supported")
    return (a.input, None)


@converts("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
          "aten.type_as.default", "aten._to_dim_order_copy.default")
def _to_copy(em, a):
    return em.cast(a.self, em.out_type().dtype)


@converts("aten.copy.default")
def _copy(em, a):
    out = em.out_type()
    src = em.cast(a.src, out.dtype)
    if em.shape(src) != out.shape:
        src = em.op("Expand", [src], out=out)
    return src


@converts("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.view_copy.default",
          "aten.flatten.using_ints", "aten.unflatten.int", "aten._reshape_alias.default")
def _reshape(em, a):
    return em.reshape(a.self, em.out_type().shape)


@converts("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")
def _squeeze(em, a):
    shape = em.shape(a.self)
    dims = _dims(getattr(a, "dim", None), len(shape)) if len(shape) else ()
    axes = tuple(d for d in dims if shape[d] == 1)
    if not axes:
        return a.self
    return em.op("Squeeze", [a.self], {"axes": axes})


@converts("aten.unsqueeze.default")
def _unsqueeze(em, a):
    d = _norm_dim(a.dim, em.rank(a.self) + 1)
    return em.op("Unsqueeze", [a.self], {"axes": (d,)})


@converts("aten.expand.default", "aten.expand_copy.default", "aten.expand_as.default")
def _expand(em, a):
    out = em.out_type()
    if em.shape(a.self) == out.shape:
        return a.self
    return em.op("Expand", [a.self])


@converts("aten.permute.default", "aten.permute_copy.default")
def _permute(em, a):
    r = em.rank(a.self)
    return em.transpose(a.self, [_norm_dim(d, r) for d in a.dims])


@converts("aten.transpose.int", "aten.transpose_copy.int")
def _transpose(em, a):
    r = em.rank(a.self)
    perm = list(range(r))
    if r:
        d0, d1 = _norm_dim(a.dim0, r), _norm_dim(a.dim1, r)
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return em.transpose(a.self, perm)


@converts("aten.t.default", "aten.numpy_T.default")
def _t(em, a):
    return em.transpose(a.self, list(reversed(range(em.rank(a.self)))))


def _slice(em: Emitter, x: str, axes, starts, ends, steps, out: TensorType | None = None) -> str:
    return em.op("Slice", [x], {"starts": tuple(starts), "ends": tuple(ends), "axes": tuple(axes),
                                "steps": tuple(steps)}, out)


@converts("aten.slice.Tensor", "aten.slice_copy.Tensor")
def _slice_tensor(em, a):
    shape = em.shape(a.self)
    d = _norm_dim(a.dim, len(shape))
    start = 0 if a.start is None else a.start
    end = INT64_MAX if a.end is None else a.end
    out = em.out_type()
    if a.step == 1 and out.shape == shape:
        return a.self
    return _slice(em, a.self, [d], [start], [min(end, INT64_MAX)], [a.step])


@converts("aten.narrow.default")
def _narrow(em, a):
    shape = em.shape(a.self)
    d = _norm_dim(a.dim, len(shape))
    start = _norm_dim(a.start, shape[d])
    return _slice(em, a.self, [d], [start], [start + a.length], [1])


@converts("aten.select.int", "aten.select_copy.int")
def _select(em, a):
    shape = em.shape(a.self)
    d = _norm_dim(a.dim, len(shape))
    i = _norm_dim(a.index, shape[d])
    t = em.type(a.self)
    sl = _slice(em, a.self, [d], [i], [i + 1], [1],
                TensorType(shape[:d] + (1,) + shape[d + 1:], t.dtype))
    return em.op("Squeeze", [sl], {"axes": (d,)})


def _split(em: Emitter, x: str, sizes: Sequence[int], dim: int):
    d = _norm_dim(dim, em.rank(x))
    used = em.used_outputs()
    shape = em.shape(x)
    outs = [TensorType(shape[:d] + (s,) + shape[d + 1:], em.dtype(x)) if k in used else None
            for k, s in enumerate(sizes)]
    if len(sizes) == 1:
        return (x,)
    return em.op("Split", [x], {"axis": d, "split": tuple(sizes)}, outs=outs)


@converts("aten.split.Tensor", "aten.split_copy.Tensor")
def _split_tensor(em, a):
    n = em.shape(a.self)[_norm_dim(a.dim, em.rank(a.self))]
    sizes = [min(a.split_size, n - s) for s in range(0, n, a.split_size)] or [0]
    return _split(em, a.self, sizes, a.dim)


@converts("aten.split_with_sizes.default", "aten.split_with_sizes_copy.default")
def _split_sizes(em, a):
    return _split(em, a.self, list(a.split_sizes), a.dim)


@converts("aten.chunk.default")
def _chunk(em, a):
    n = em.shape(a.self)[_norm_dim(a.dim, em.rank(a.self))]
    size = -(-n // a.chunks)
    return _split(em, a.self, [min(size, n - s) for s in range(0, n, size)], a.dim)


@converts("aten.unbind.int")
def _unbind(em, a):
    shape = em.shape(a.self)
    d = _norm_dim(a.dim, len(shape))
    used = em.used_outputs()
    outs = []
    for k in range(shape[d]):
        if k not in used:
            outs.append(None)
            continue
        sl = _slice(em, a.self, [d], [k], [k + 1], [1], TensorType(shape[:d] + (1,) + shape[d + 1:], em.dtype(a.self)))
        outs.append(em.op("Squeeze", [sl], {"axes": (d,)}, TensorType(shape[:d] + shape[d + 1:], em.dtype(a.self))))
    return tuple(outs)


@converts("aten.cat.default", "aten.concat.default")
def _cat(em, a):
    out = em.out_type()
    # Legacy torch accepts 1-D empty tensors of any shape in cat; they contribute nothing.
    xs = [em.cast(x, out.dtype) for x in a.tensors if not (em.shape(x) == (0,) and out.rank != 1)]
    if len(xs) == 1:
        return xs[0]
    return em.op("Concat", xs, {"axis": _norm_dim(a.dim, out.rank)})


@converts("aten.stack.default")
def _stack(em, a):
    out = em.out_type()
    d = _norm_dim(a.dim, out.rank)
    xs = []
    for x in a.tensors:
        s = em.shape(x)
        xs.append(em.op("Unsqueeze", [em.cast(x, out.dtype)], {"axes": (d,)},
                        TensorType(s[:d] + (1,) + s[d:], out.dtype)))
    return xs[0] if len(xs) == 1 else em.op("Concat", xs, {"axis": d})


def _torch_pads(pad: Sequence[int], rank: int) -> tuple[int, ...]:
    """torch's (last-dim-first begin/end pairs) -> ONNX pads (all begins, then all ends)."""
    begins, ends = [0] * rank, [0] * rank
    for k in range(len(pad) // 2):
        begins[rank - 1 - k] = pad[2 * k]
        ends[rank - 1 - k] = pad[2 * k + 1]
    return tuple(begins + ends)


@converts("aten.constant_pad_nd.default")
def _constant_pad(em, a):
    out = em.out_type()
    pads = _torch_pads(a.pad, em.rank(a.self))
    if not any(pads):
        return a.self
    return em.op("Pad", [a.self, em.scalar(_py(a.value, out.dtype), out.dtype)],
                 {"pads": pads, "mode": "constant"})


def _mode_pad(mode: str) -> Converter:
    def convert(em: Emitter, a):
        return em.op("Pad", [a.self], {"pads": _torch_pads(a.padding, em.rank(a.self)), "mode": mode})
    return convert


for _nd in (1, 2, 3):
    converts(f"aten.reflection_pad{_nd}d.default")(_mode_pad("reflect"))
    converts(f"aten.replication_pad{_nd}d.default")(_mode_pad("edge"))


@converts("aten.repeat.default")
def _repeat(em, a):
    reps = tuple(a.repeats)
    x = a.self
    shape = em.shape(x)
    if len(reps) > len(shape):
        x = em.reshape(x, (1,) * (len(reps) - len(shape)) + shape)
    if all(r == 1 for r in reps):
        return x
    return em.op("Tile", [x], {"repeats": reps})


@converts("aten.flip.default")
def _flip(em, a):
    r = em.rank(a.self)
    axes = sorted({_norm_dim(d, r) for d in a.dims})
    if not axes:
        return a.self
    return _slice(em, a.self, axes, [-1] * len(axes), [INT64_MIN] * len(axes), [-1] * len(axes))


@converts("aten.tril.default", "aten.triu.default")
def _trilu(em, a):
    upper = int(op_name(em.fx.target).startswith("aten.triu"))
    return em.op("Trilu", [a.self], {"upper": upper, "k": int(a.diagonal)})


# ----------------------------------------------------------------------------------------------
# Constants that depend only on the output's shape.

def _filled(value_of: Callable) -> Converter:
    def convert(em: Emitter, a):
        out = em.out_type()
        return em.const(torch.full(out.shape, value_of(a), dtype=out.dtype.to_torch()), em.fx.name)
    return convert


converts("aten.full_like.default", "aten.new_full.default")(_filled(lambda a: a.fill_value))
converts("aten.zeros_like.default", "aten.new_zeros.default", "aten.empty_like.default",
         "aten.new_empty.default")(_filled(lambda a: 0))
converts("aten.ones_like.default", "aten.new_ones.default")(_filled(lambda a: 1))


# ----------------------------------------------------------------------------------------------
# Contractions.

def _matmul(second: str) -> Converter:
    def convert(em: Emitter, a):
        return em.op("MatMul", [a.self, getattr(a, second)])
    return convert


converts("aten.mm.default", "aten.bmm.default")(_matmul("mat2"))
converts("aten.matmul.default")(_matmul("other"))
converts("aten.dot.default")(_matmul("tensor"))


@converts("aten.addmm.default")
def _addmm(em, a):
    return em.op("Gemm", [a.mat1, a.mat2, a.self], {"alpha": float(a.alpha), "beta": float(a.beta)})


@converts("aten.linear.default")
def _linear(em, a):
    x, w, b = a.input, a.weight, a.bias
    if em.rank(x) == 2:
        return em.op("Gemm", [x, w, b], {"transB": 1})
    out = em.out_type()
    wt = em.transpose(w, [1, 0]) if em.rank(w) == 2 else w
    if b is None:
        return em.op("MatMul", [x, wt])
    return em.op("Add", [em.op("MatMul", [x, wt], out=out), b])


def _scaled_sum(em: Emitter, base: str, beta, prod: str, alpha) -> str:
    """beta * base + alpha * prod (torch's addmm family; beta=0 ignores base entirely)."""
    out = em.out_type()
    if alpha != 1:
        prod = em.op("Mul", [prod, em.scalar(float(alpha), out.dtype)], out=em.type(prod))
    if beta == 0:
        return prod if em.shape(prod) == out.shape else em.op("Expand", [prod])
    if beta != 1:
        base = em.op("Mul", [base, em.scalar(float(beta), out.dtype)], out=em.type(base))
    return em.op("Add", [base, prod])


def _bmm_type(em: Emitter, b1: str, b2: str) -> TensorType:
    return TensorType(em.shape(b1)[:-1] + em.shape(b2)[-1:], em.dtype(b1))


@converts("aten.baddbmm.default")
def _baddbmm(em, a):
    prod = em.op("MatMul", [a.batch1, a.batch2], out=_bmm_type(em, a.batch1, a.batch2))
    return _scaled_sum(em, a.self, a.beta, prod, a.alpha)


@converts("aten.addbmm.default")
def _addbmm(em, a):
    t = _bmm_type(em, a.batch1, a.batch2)
    prod = em.op("MatMul", [a.batch1, a.batch2], out=t)
    prod = em.op("ReduceSum", [prod], {"axes": (0,), "keepdims": 0}, TensorType(t.shape[1:], t.dtype))
    return _scaled_sum(em, a.self, a.beta, prod, a.alpha)


@converts("aten.einsum.default")
def _einsum(em, a):
    dt = em.out_type().dtype
    return em.op("Einsum", [em.cast(x, dt) for x in a.tensors], {"equation": a.equation.replace(" ", "")})


# ----------------------------------------------------------------------------------------------
# Convolution, normalization, softmax, pooling, resize.

@converts("aten.convolution.default", "aten._convolution.default")
def _convolution(em, a):
    nd = em.rank(a.weight) - 2
    attrs = {"strides": _tup(a.stride, nd), "pads": _tup(a.padding, nd) * 2, "dilations": _tup(a.dilation, nd),
             "group": int(a.groups), "kernel_shape": tuple(em.shape(a.weight)[2:])}
    if a.transposed:
        attrs["output_padding"] = _tup(a.output_padding, nd)
        return em.op("ConvTranspose", [a.input, a.weight, a.bias], attrs)
    return em.op("Conv", [a.input, a.weight, a.bias], attrs)


@converts("aten.native_layer_norm.default")
def _layer_norm(em, a):
    used = em.used_outputs()
    outs = [em.out_type(0)] + [em.out_type(k) if k in used else None for k in (1, 2)]
    return em.op("LayerNormalization", [a.input, a.weight, a.bias],
                 {"axis": -len(a.normalized_shape), "epsilon": float(a.eps)}, outs=outs)


def _per_channel(em: Emitter, x: str, value: float) -> str:
    c = em.shape(x)[1]
    return em.const(torch.full((c,), value, dtype=em.dtype(x).to_torch()))


def _scale_shift(em: Emitter, a) -> tuple[str, str]:
    """A norm's weight and bias, ones and zeros per channel where absent."""
    w = a.weight if a.weight is not None else _per_channel(em, a.input, 1.0)
    b = a.bias if a.bias is not None else _per_channel(em, a.input, 0.0)
    return w, b


@converts("aten._native_batch_norm_legit_no_training.default")
def _batch_norm(em, a):
    if em.used_outputs() - {0}:
        raise em.unsupported("the saved mean/invstd outputs are not supported")
    w, b = _scale_shift(em, a)
    y = em.op("BatchNormalization", [a.input, w, b, a.running_mean, a.running_var],
              {"epsilon": float(a.eps), "momentum": float(a.momentum)})
    return (y, None, None)


@converts("aten.native_batch_norm.default")
def _native_batch_norm(em, a):
    if a.training:
        raise em.bad_attr("training", True, "batch norm in training mode (call model.eval())")
    return _batch_norm(em, a)


@converts("aten.native_group_norm.default")
def _group_norm(em, a):
    if em.used_outputs() - {0}:
        raise em.unsupported("the mean/rstd outputs are not supported")
    w, b = _scale_shift(em, a)
    y = em.op("GroupNormalization", [a.input, w, b], {"num_groups": int(a.group), "epsilon": float(a.eps)},
              out=em.out_type(0))
    return (y, None, None)


@converts("aten.rms_norm.default")
def _rms_norm(em, a):
    x = a.input
    t = em.type(x)
    n = len(a.normalized_shape)
    eps = a.eps if a.eps is not None else torch.finfo(t.dtype.to_torch()).eps
    w = a.weight if a.weight is not None else em.const(torch.ones(t.shape[-n:], dtype=t.dtype.to_torch()))
    return em.op("RMSNormalization", [x, w], {"axis": -n, "epsilon": float(eps)})


def _softmax(op: str) -> Converter:
    def convert(em: Emitter, a):
        out = em.out_type()
        x = em.cast(a.self, out.dtype)
        return em.op(op, [x], {"axis": _norm_dim(a.dim, max(out.rank, 1)) if out.rank else 0})
    return convert


converts("aten._softmax.default", "aten.softmax.int")(_softmax("Softmax"))
converts("aten._log_softmax.default", "aten.log_softmax.int")(_softmax("LogSoftmax"))


def _pool_nd(em: Emitter, x: str) -> int:
    """Spatial rank from the op name (max_pool2d -> 2); unbatched inputs are not supported."""
    nd = int(next(c for c in op_name(em.fx.target).split(".")[1] if c.isdigit()))
    if em.rank(x) != nd + 2:
        raise em.unsupported(f"pooling needs a batched (N, C, ...) input, got rank {em.rank(x)}")
    return nd


def _pool_attrs(em: Emitter, x: str, kernel, stride, padding, ceil_mode, dilation=None) -> dict:
    nd = _pool_nd(em, x)
    k = _tup(kernel, nd)
    attrs = {"kernel_shape": k, "strides": _tup(stride, nd) if stride else k,
             "pads": _tup(padding, nd) * 2, "ceil_mode": int(bool(ceil_mode))}
    if dilation is not None:
        attrs["dilations"] = _tup(dilation, nd)
    return attrs


def _whole_input_window(em: Emitter, x: str, attrs: dict) -> bool:
    """One unpadded window covering the whole input (e.g. EfficientNet's AvgPool2d(1280, ceil_mode=True)
    on a small map): torch clips the window to the input, so the pool is a global one."""
    spatial = em.shape(x)[2:]
    return (not any(attrs["pads"]) and all(k >= n for k, n in zip(attrs["kernel_shape"], spatial))
            and all(s == 1 for s in em.out_type(0).shape[2:]))


def _pool(em: Emitter, op: str, x: str, attrs: dict) -> str:
    if _whole_input_window(em, x, attrs):
        return em.op("Global" + op, [x], out=em.out_type(0))
    return em.op(op, [x], attrs, em.out_type(0))


@converts("aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default",
          "aten.max_pool1d_with_indices.default")
def _max_pool_indices(em, a):
    if 1 in em.used_outputs():
        raise em.unsupported("the indices output of max pooling is not supported")
    attrs = _pool_attrs(em, a.self, a.kernel_size, a.stride, a.padding, a.ceil_mode, a.dilation)
    return (_pool(em, "MaxPool", a.self, attrs), None)


@converts("aten.max_pool1d.default", "aten.max_pool2d.default", "aten.max_pool3d.default")
def _max_pool(em, a):
    return _pool(em, "MaxPool", a.self, _pool_attrs(em, a.self, a.kernel_size, a.stride, a.padding, a.ceil_mode,
                                                     a.dilation))


@converts("aten.avg_pool1d.default", "aten.avg_pool2d.default", "aten.avg_pool3d.default")
def _avg_pool(em, a):
    if getattr(a, "divisor_override", None) is not None:
        raise em.bad_attr("divisor_override", a.divisor_override, "average pooling with a custom divisor")
    attrs = _pool_attrs(em, a.self, a.kernel_size, a.stride, a.padding, a.ceil_mode)
    attrs["count_include_pad"] = int(bool(a.count_include_pad))
    return _pool(em, "AveragePool", a.self, attrs)


@converts("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default",
          "aten._adaptive_avg_pool3d.default", "aten.adaptive_avg_pool3d.default",
          "aten.adaptive_avg_pool1d.default")
def _adaptive_avg_pool(em, a):
    out = em.out_type()
    if all(s == 1 for s in out.shape[2:]):
        return em.op("GlobalAveragePool", [a.self])
    if out.shape == em.shape(a.self):
        return a.self
    return em.op("AdaptiveAveragePool", [a.self])


def _resize_scales(em: Emitter, x: str, out: TensorType, given) -> tuple[float, ...]:
    """One scale per axis: torch's scale factors where given (they fix the coordinate map), else out/in."""
    given = list(given or [])
    scales = [1.0, 1.0]
    for d in range(em.rank(x) - 2):
        s = given[d] if d < len(given) else None
        scales.append(float(s) if s else out.shape[2 + d] / em.shape(x)[2 + d])
    return tuple(scales)


def _resize(mode: str, ctm_of: Callable, nearest_mode: str = "floor") -> Converter:
    def convert(em: Emitter, a):
        x = a.input if hasattr(a, "input") else a.self
        if hasattr(a, "scale_factors"):  # the .vec overloads
            given = a.scale_factors
        else:
            given = [getattr(a, n) for n in ("scales_d", "scales_h", "scales_w", "scales") if hasattr(a, n)]
        ctm = ctm_of(a)
        if ctm == "align_corners":  # torch maps with (in-1)/(out-1) whatever the scale factor
            given = None
        attrs = {"mode": mode, "coordinate_transformation_mode": ctm,
                 "scales": _resize_scales(em, x, em.out_type(), given)}
        if mode == "nearest":
            attrs["nearest_mode"] = nearest_mode
        if mode == "cubic":
            attrs["cubic_coeff_a"] = -0.75
        return em.op("Resize", [x], attrs)
    return convert


def _linear_ctm(a) -> str:
    return "align_corners" if a.align_corners else "half_pixel"


for _nd in ("1d", "2d", "3d"):
    converts(f"aten.upsample_nearest{_nd}.vec", f"aten.upsample_nearest{_nd}.default")(
        _resize("nearest", lambda a: "asymmetric", "floor"))
    converts(f"aten._upsample_nearest_exact{_nd}.vec", f"aten._upsample_nearest_exact{_nd}.default")(
        _resize("nearest", lambda a: "half_pixel", "round_prefer_ceil"))
converts("aten.upsample_linear1d.vec", "aten.upsample_linear1d.default", "aten.upsample_bilinear2d.vec",
         "aten.upsample_bilinear2d.default", "aten.upsample_trilinear3d.vec",
         "aten.upsample_trilinear3d.default")(_resize("linear", _linear_ctm))
converts("aten.upsample_bicubic2d.vec", "aten.upsample_bicubic2d.default")(_resize("cubic", _linear_ctm))


# ----------------------------------------------------------------------------------------------
# Indexing.

@converts("aten.embedding.default")
def _embedding(em, a):
    return em.op("Gather", [a.weight, a.indices], {"axis": 0})


@converts("aten.index_select.default")
def _index_select(em, a):
    return em.op("Gather", [a.self, a.index], {"axis": _norm_dim(a.dim, max(em.rank(a.self), 1))})


@converts("aten.gather.default")
def _gather(em, a):
    return em.op("GatherElements", [a.self, a.index], {"axis": _norm_dim(a.dim, max(em.rank(a.self), 1))})


def _index_tensors(em: Emitter, indices) -> list:
    """Index list with constant boolean masks replaced by their nonzero coordinates."""
    out = []
    for i in indices:
        if i is not None and em.dtype(i) is DType.bool:
            if not em.is_const(i):
                raise em.unsupported("indexing with a boolean mask tensor (the result shape depends on data)")
            out.extend(em.const(t) for t in em.consts[i].nonzero(as_tuple=True))
        else:
            out.append(i)
    return out


def _iota_axes(em: Emitter, indices: Sequence[str], sizes: Sequence[int], b: tuple[int, ...]) -> list[int] | None:
    """For constant index tensors that are each a full ``arange`` along one distinct axis of the
    broadcast shape ``b`` (masks built as ``mask[batch_idx, kv_idx]``), those axes; else None."""
    axes: list[int] = []
    for i, n in zip(indices, sizes):
        if not em.is_const(i):
            return None
        t = torch.broadcast_to(em.consts[i].to(torch.int64), b)
        for k, size in enumerate(b):
            iota = torch.arange(n).view([n if j == k else 1 for j in range(len(b))])
            if size == n and k not in axes and torch.equal(t, torch.broadcast_to(iota, b)):
                axes.append(k)
                break
        else:
            return None
    return axes


def _index_by_layout(em: Emitter, x: str, dims: list[int], axes: list[int], b, rest: list[int]) -> str:
    """x[iota indices] as Transpose + Reshape + Expand, laid out as (b..., rest...)."""
    shape = em.shape(x)
    order = [d for _, d in sorted(zip(axes, dims))]
    xt = em.transpose(x, order + rest)
    tail = tuple(shape[d] for d in rest)
    xr = em.reshape(xt, tuple(b[k] if k in axes else 1 for k in range(len(b))) + tail)
    if em.shape(xr) == tuple(b) + tail:
        return xr
    return em.op("Expand", [xr], out=TensorType(tuple(b) + tail, em.dtype(x)))


def _index_by_gather_nd(em: Emitter, x: str, idx: list, dims: list[int], b, rest: list[int]) -> str:
    """Index tensors broadcast and stacked into (b..., k); GatherND on x with the indexed dims first."""
    cols = []
    for d in dims:
        i = em.cast(idx[d], DType.int64)
        if em.shape(i) != b:
            i = em.op("Expand", [i], out=TensorType(b, DType.int64))
        cols.append(em.op("Unsqueeze", [i], {"axes": (len(b),)}, TensorType(b + (1,), DType.int64)))
    stacked = em.op("Concat", cols, {"axis": len(b)}, TensorType(b + (len(dims),), DType.int64))
    xt = em.transpose(x, dims + rest)
    out = TensorType(b + tuple(em.shape(x)[d] for d in rest), em.dtype(x))
    return em.op("GatherND", [xt, stacked], {"batch_dims": 0}, out)


@converts("aten.index.Tensor")
def _index(em, a):
    x = a.self
    shape = em.shape(x)
    idx = _index_tensors(em, list(a.indices))
    idx += [None] * (len(shape) - len(idx))
    dims = [d for d, i in enumerate(idx) if i is not None]
    b = _bcast_shape(*[em.shape(idx[d]) for d in dims])
    rest = [d for d in range(len(shape)) if d not in dims]
    axes = _iota_axes(em, [idx[d] for d in dims], [shape[d] for d in dims], b)
    if axes is not None:
        g = _index_by_layout(em, x, dims, axes, b, rest)
    elif len(dims) == 1:
        return em.op("Gather", [x, idx[dims[0]]], {"axis": dims[0]})
    else:
        g = _index_by_gather_nd(em, x, idx, dims, b, rest)
    # g is (b..., rest...).  torch puts the index dims where the first indexed dim was when the
    # indexed dims are adjacent, in front otherwise.
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    if not adjacent or dims[0] == 0:
        return g
    nb, d0 = len(b), dims[0]
    return em.transpose(g, [nb + j for j in range(d0)] + list(range(nb)) + [nb + j for j in range(d0, len(rest))])


# ----------------------------------------------------------------------------------------------
# Reductions.

def _reduce(em: Emitter, op: str, x: str, dim, keepdim: bool, out: TensorType | None = None,
            dtype: DType | None = None) -> str:
    out = out or em.out_type()
    x = em.cast(x, dtype or out.dtype)
    axes = _dims(dim, em.rank(x))
    if em.rank(x) == 0:
        return x
    return em.op(op, [x], {"axes": axes, "keepdims": int(bool(keepdim))}, out)


def _simple_reduce(op: str) -> Converter:
    def convert(em: Emitter, a):
        return _reduce(em, op, a.self, getattr(a, "dim", None), getattr(a, "keepdim", False))
    return convert


converts("aten.sum.dim_IntList", "aten.sum.default")(_simple_reduce("ReduceSum"))
converts("aten.mean.dim", "aten.mean.default")(_simple_reduce("ReduceMean"))
converts("aten.prod.dim_int", "aten.prod.default")(_simple_reduce("ReduceProd"))
converts("aten.amax.default", "aten.max.default")(_simple_reduce("ReduceMax"))
converts("aten.amin.default", "aten.min.default")(_simple_reduce("ReduceMin"))
converts("aten.any.dim", "aten.any.dims", "aten.any.default")(_simple_reduce("ReduceMax"))
converts("aten.all.dim", "aten.all.dims", "aten.all.default")(_simple_reduce("ReduceMin"))


def _arg_reduce(op: str) -> Converter:
    def convert(em: Emitter, a):
        x, dim = a.self, a.dim
        if dim is None:
            x, dim = em.reshape(x, (em.type(x).numel,)), 0
        d = _norm_dim(dim, max(em.rank(x), 1))
        return em.op(op, [x], {"axis": d, "keepdims": int(bool(a.keepdim)), "select_last_index": 0})
    return convert


converts("aten.argmax.default")(_arg_reduce("ArgMax"))
converts("aten.argmin.default")(_arg_reduce("ArgMin"))


def _value_index(value_op: str, index_op: str) -> Converter:
    def convert(em: Emitter, a):
        used = em.used_outputs()
        d = _norm_dim(a.dim, max(em.rank(a.self), 1))
        values = indices = None
        if 0 in used:
            values = _reduce(em, value_op, a.self, [d], a.keepdim, em.out_type(0))
        if 1 in used:
            indices = em.op(index_op, [a.self], {"axis": d, "keepdims": int(bool(a.keepdim)), "select_last_index": 0},
                            em.out_type(1))
        return (values, indices)
    return convert


converts("aten.max.dim")(_value_index("ReduceMax", "ArgMax"))
converts("aten.min.dim")(_value_index("ReduceMin", "ArgMin"))


def _variance(em: Emitter, x: str, dim, correction, keepdim: bool, out: TensorType) -> tuple[str, str]:
    """(var, mean) with torch's correction: sum((x - mean)^2) / (N - correction); mean keeps dims."""
    shape = em.shape(x)
    axes = _dims(dim, len(shape))
    n = math.prod(shape[d] for d in axes)
    c = 1 if correction is None else correction
    kept = _reduce_type(shape, axes, True, out.dtype)
    mean = em.op("ReduceMean", [x], {"axes": axes, "keepdims": 1}, kept)
    diff = em.op("Sub", [x, mean], out=em.type(x))
    sq = em.op("Mul", [diff, diff], out=em.type(x))
    ss = em.op("ReduceSum", [sq], {"axes": axes, "keepdims": int(bool(keepdim))}, out)
    var = em.op("Div", [ss, em.scalar(float(max(n - c, 0)), out.dtype)], out=out)
    return var, mean


@converts("aten.var.correction", "aten.var.dim", "aten.var.default")
def _var(em, a):
    return _variance(em, a.self, getattr(a, "dim", None), _correction(a), getattr(a, "keepdim", False),
                     em.out_type())[0]


@converts("aten.std.correction", "aten.std.dim", "aten.std.default")
def _std(em, a):
    out = em.out_type()
    var = _variance(em, a.self, getattr(a, "dim", None), _correction(a), getattr(a, "keepdim", False), out)[0]
    return em.op("Sqrt", [var])


@converts("aten.var_mean.correction", "aten.var_mean.dim")
def _var_mean(em, a):
    var, mean = _variance(em, a.self, a.dim, _correction(a), a.keepdim, em.out_type(0))
    return var, em.reshape(mean, em.out_type(1).shape)


def _correction(a) -> float:
    if getattr(a, "correction", None) is not None:
        return a.correction
    return 1 if getattr(a, "unbiased", True) else 0


@converts("aten.linalg_vector_norm.default")
def _vector_norm(em, a):
    out = em.out_type()
    ops = {2: "ReduceL2", 1: "ReduceL1"}
    if a.ord in ops:
        return _reduce(em, ops[a.ord], a.self, a.dim, a.keepdim, out)
    if a.ord == math.inf:
        x = em.op("Abs", [em.cast(a.self, out.dtype)], out=TensorType(em.shape(a.self), out.dtype))
        return _reduce(em, "ReduceMax", x, a.dim, a.keepdim, out)
    raise em.bad_attr("ord", a.ord, "only the 1-, 2- and inf-norms are supported")


@converts("aten.cumsum.default")
def _cumsum(em, a):
    out = em.out_type()
    x = em.cast(a.self, out.dtype)
    return em.op("CumSum", [x], {"axis": _norm_dim(a.dim, max(out.rank, 1))})


@converts("aten.topk.default")
def _topk(em, a):
    d = _norm_dim(a.dim, max(em.rank(a.self), 1))
    return em.op("TopK", [a.self], {"k": int(a.k), "axis": d, "largest": int(a.largest), "sorted": int(a.sorted)},
                 outs=[em.out_type(0), em.out_type(1)])


# ----------------------------------------------------------------------------------------------
# Attention.

def _sdpa(em: Emitter, q, k, v, mask, dropout_p, is_causal, scale, enable_gqa=False) -> str:
    if dropout_p:
        raise em.bad_attr("dropout_p", dropout_p, "attention dropout (inference only: call model.eval())")
    attrs = {"is_causal": int(bool(is_causal)), "enable_gqa": int(bool(enable_gqa))}
    if scale is not None:
        attrs["scale"] = float(scale)
    return em.op("ScaledDotProductAttention", [q, k, v, mask] if mask is not None else [q, k, v], attrs,
                 em.out_type(0))


@converts("aten.scaled_dot_product_attention.default")
def _sdpa_default(em, a):
    return _sdpa(em, a.query, a.key, a.value, a.attn_mask, a.dropout_p, a.is_causal, a.scale, a.enable_gqa)


@converts("aten._scaled_dot_product_flash_attention_for_cpu.default",
          "aten._scaled_dot_product_flash_attention.default",
          "aten._scaled_dot_product_efficient_attention.default",
          "aten._scaled_dot_product_cudnn_attention.default")
def _sdpa_fused(em, a):
    if em.used_outputs() - {0}:
        raise em.unsupported("only the attention output is supported (not logsumexp or debug outputs)")
    mask = getattr(a, "attn_mask", None)
    if mask is None:
        mask = getattr(a, "attn_bias", None)
    n = len(em.fx.meta["val"])
    return (_sdpa(em, a.query, a.key, a.value, mask, a.dropout_p, a.is_causal, a.scale),) + (None,) * (n - 1)


# Ops that only check things at trace time; they produce nothing.
NO_OPS = frozenset({
    "aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten._assert_async.msg",
    "aten.sym_constrain_range_for_size.default", "aten.sym_constrain_range.default",
    "aten._assert_async.default", "aten._functional_assert_async.msg",
})
