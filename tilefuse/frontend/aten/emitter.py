"""The Emitter, which builds the canonical Graph node by node, and binding FX nodes' arguments."""
from __future__ import annotations

import operator
from types import SimpleNamespace
from typing import Callable, Sequence

import torch
import torch.fx as fx

from ...errors import UnsupportedAttribute, UnsupportedOperator
from ...ir.dtypes import DType, TensorType
from ...ir.graph import Attrs, Graph, Node
from ...ir.prim import COPY_LIMIT, Constant, TensorDecl
from .common import py


def op_name(target) -> str:
    """``aten.add.Tensor`` for an OpOverload, the qualified name for other callables."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__qualname__", None) or str(target)


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
        # placeholders whose new value the caller writes back into them (an input a torch.compile'd
        # graph updates: a KV cache): a converter may write that value into the input's memory
        self.updated: frozenset = frozenset()

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
        try:
            dtype = DType.from_torch(data.dtype)
        except TypeError:       # complex rotary tables (LLaMA 4), quantized buffers...
            detail = f"a constant of dtype {str(data.dtype).replace('torch.', '')} is not supported"
            if self.fx is not None:
                raise self.unsupported(detail) from None
            raise UnsupportedOperator(Node("constant", name, (), (), Attrs()), detail) from None
        self.consts[name] = data
        self.types[name] = TensorType(tuple(data.shape), dtype)
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
        return self.scalar(py(v, dtype), dtype)

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
        if self.is_const(v) and self.consts[v].numel() <= COPY_LIMIT:     # larger: a Transpose node
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
    try:
        dtype = DType.from_torch(val.dtype)
    except TypeError:
        detail = f"dtype {val.dtype} is not supported"
        raise em.unsupported(detail) if em is not None else TypeError(detail) from None
    return TensorType(tuple(shape), dtype)


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
