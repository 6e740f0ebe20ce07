"""ONNX frontend: a model file, bytes or ModelProto -> an operator Graph in the canonical op set.

    load (onnx_load) -> static input shapes -> whole-model shape inference
    -> for each node in order:  fold (onnx_fold)  |  sequences / If / functions (onnx_control)
                                |  normalize to the canonical op set (onnx_normalize)
    -> Graph (inputs, constants, canonical nodes, a static TensorType for every value)

Folding evaluates every node whose inputs are all constants (and Shape/Size/EyeLike, which only
need types) with onnx's reference implementation; what remains is translated to opset-21
semantics with structure-fixing parameter inputs turned into attributes (docs/canonical-ops.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import onnx

from ..errors import InputError, ModelLoadError, TilefuseError, UnsupportedAttribute, UnsupportedOperator
from ..ir.dtypes import DType, TensorType
from ..ir.graph import Attrs, Graph, Node
from ..ir.prim import Constant, TensorDecl
from . import onnx_control, onnx_fold, onnx_proto
from .common import Imported
from .onnx_load import DEFAULT_DOMAINS, default_opset, load_model
from .onnx_normalize import RULES as NORMALIZE_RULES
from .onnx_normalize import check_params, normalize
from .onnx_unsupported import UNSUPPORTED

Shape = tuple  # of ints; None for an unknown dim


def import_onnx(model_or_path, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
                dims: Mapping[str, int] | None = None, initializers_as_inputs: bool = False) -> Imported:
    """Import an ONNX model (path, bytes or ``onnx.ModelProto``).

    ``dims`` binds named (symbolic) dims wherever they occur, as onnxruntime's free dimension
    overrides do ({"batch": 2, "sequence": 128}); ``input_shapes`` fixes the whole shape of inputs
    ({name: shape}: where a dim has no name, or one input differs).  Every dim left unbound is
    named in one error.  Graph inputs that also have an initializer are constants (ONNX IR < 4
    semantics) unless ``initializers_as_inputs`` is set, in which case they stay inputs and the
    initializer is ignored.
    """
    model, _ = load_model(model_or_path)
    return Imported(Converter(model, dict(input_shapes or {}), initializers_as_inputs, dict(dims or {})).run())


def open_inputs(model: onnx.ModelProto, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
                dims: Mapping[str, int] | None = None,
                initializers_as_inputs: bool = False) -> dict[str, tuple | None]:
    """The tensor inputs whose shape is not static once ``dims`` and ``input_shapes`` are applied,
    each with its declared dims: a size, a dim's name (a free named dim) or None (a free dim with
    no name); None for an input with no declared rank.  Empty when every input is static."""
    input_shapes, dims = dict(input_shapes or {}), dict(dims or {})
    inits = {t.name for t in model.graph.initializer} | {sp.values.name for sp in model.graph.sparse_initializer}
    out = {}
    for vi in model.graph.input:
        if vi.name in input_shapes or vi.type.WhichOneof("value") != "tensor_type" \
                or vi.name in inits and not initializers_as_inputs:
            continue
        if not vi.type.tensor_type.HasField("shape"):
            out[vi.name] = None
            continue
        declared = tuple(d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, d.dim_param or None)
                         for d in vi.type.tensor_type.shape.dim)
        if any(not isinstance(d, int) for d in declared):
            out[vi.name] = declared
    return out


def unsupported_nodes(model_or_path, *, input_shapes: Mapping[str, Sequence[int]] | None = None,
                      dims: Mapping[str, int] | None = None) -> tuple[list[TilefuseError], list[str]]:
    """Every node the ONNX frontend refuses, one error each (``tilefuse inspect``), and the
    operator types of the nodes not looked at because they read what a refused node makes, untyped:
    the import goes on past a refused node, its outputs typed by shape inference where it can."""
    model, _ = load_model(model_or_path)
    return Converter(model, dict(input_shapes or {}), False, dict(dims or {})).refused()


@dataclass
class ONode:
    """An ONNX node being imported: python attributes, its schema version and a display name."""
    op: str
    name: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any]
    since: int              # since_version of the schema the node's opset selects
    opset: int
    location: str | None
    proto: onnx.NodeProto

    def __str__(self) -> str:
        return f"{self.op} '{self.name}'"


class Converter:
    def __init__(self, model: onnx.ModelProto, input_shapes: dict, initializers_as_inputs: bool,
                 dims: dict | None = None):
        self.model = model
        self.graph = model.graph
        self.opset = default_opset(model) or onnx.defs.onnx_opset_version()
        self.input_shapes = input_shapes
        self.dims = dims or {}
        self.initializers_as_inputs = initializers_as_inputs
        self.known: dict[str, tuple[Shape, int]] = {}      # value -> (shape, onnx elem type)
        self.consts: dict[str, np.ndarray] = {}
        self.seqs: dict[str, list[str]] = {}                # static sequences: lists of tensor names
        self.inferred: dict[str, tuple[Shape, int]] = {}    # whole-model shape inference
        self.nodes: list[Node] = []
        self.functions = {(f.domain, f.name): f for f in model.functions}
        self.taken = _all_names(model)
        self._emitted: dict[int, tuple] = {}    # id(ONNX node) -> (node, canonical nodes emitted)
        self.decls: list[str] = []
        self.non_tensors: dict[str, str] = {}               # sequence/optional/map graph inputs
        self.folded_by: dict[str, ONode] = {}               # folded constant -> its node

    # ------------------------------------------------------------------ the import
    def run(self) -> Graph:
        self._read_inputs()
        self._infer_model()
        nodes = _needed(self.graph, self.functions)
        for idx, proto in nodes:
            self.visit(proto, self.opset, proto.name or f"{proto.op_type}_{idx}")
        return self._graph()

    def refused(self) -> tuple[list[TilefuseError], list[str]]:
        """``unsupported_nodes``: the import, collecting refusals instead of stopping at the first."""
        self._read_inputs()
        self._infer_model()
        errors, untyped, skipped = [], set(), []
        for idx, proto in _needed(self.graph, self.functions):
            if any(i in untyped for i in proto.input):
                untyped.update(o for o in proto.output if o)
                skipped.append(proto.op_type)
                continue
            try:
                self.visit(proto, self.opset, proto.name or f"{proto.op_type}_{idx}")
            except (UnsupportedOperator, UnsupportedAttribute) as e:
                errors.append(e)
                for o in filter(None, proto.output):
                    t = self.inferred.get(o)
                    if t is not None and None not in t[0]:
                        self.known[o] = t        # (its readers go on as if it had been imported)
                    else:
                        untyped.add(o)
        return errors, skipped

    def _read_inputs(self) -> None:
        inits = {t.name: t for t in self.graph.initializer}
        for sp in self.graph.sparse_initializer:
            inits[sp.values.name] = sp
        unknown = set(self.input_shapes) - {i.name for i in self.graph.input}
        if unknown:
            raise InputError(f"input_shapes names {sorted(unknown)}, which are not inputs of the model; "
                             f"its inputs are {[i.name for i in self.graph.input if i.name not in inits]}")
        for name, t in inits.items():
            if self.initializers_as_inputs and any(i.name == name for i in self.graph.input):
                continue
            self._set_const(name, onnx_proto.tensor_value(t))
        inputs = [vi for vi in self.graph.input if vi.name not in self.consts]
        named = {d.dim_param for vi in inputs if vi.type.WhichOneof("value") == "tensor_type"
                 for d in vi.type.tensor_type.shape.dim if not d.HasField("dim_value") and d.dim_param}
        for name, n in self.dims.items():
            if name not in named:
                raise InputError(f"dims binds {name!r}, which no input of the model has; its named dims are "
                                 f"{sorted(named) or 'none'}")
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
                raise InputError(f"dims gives {name!r} the size {n!r}; a size is a non-negative integer")
        unbound = []
        for vi in inputs:
            if vi.type.WhichOneof("value") != "tensor_type":
                self.non_tensors[vi.name] = str(vi.type.WhichOneof("value")).replace("_type", "")
                continue
            shape, elem = self._input_type(vi)
            if shape is None or None in shape:
                unbound.append(vi)
                continue
            self.known[vi.name] = (shape, elem)
            self.decls.append(vi.name)
        if unbound:
            raise InputError(_unbound_message(unbound, self.dims))

    def _input_type(self, vi: onnx.ValueInfoProto) -> tuple[tuple | None, int]:
        """(shape, elem type); the shape has None where a dim is still unbound (None: unknown rank)."""
        elem = vi.type.tensor_type.elem_type
        given = self.input_shapes.get(vi.name)
        declared = [d.dim_value if d.HasField("dim_value") else self.dims.get(d.dim_param) if d.dim_param else None
                    for d in vi.type.tensor_type.shape.dim] if vi.type.tensor_type.HasField("shape") else None
        if given is not None:
            given = _static_shape(vi.name, given)
            if declared is not None and (len(declared) != len(given)
                                         or any(d is not None and d != g for d, g in zip(declared, given))):
                raise InputError(f"input_shapes gives input '{vi.name}' the shape {list(given)}, "
                                 f"the model declares {onnx_proto.fmt_shape(vi)}"
                                 + (f" with dims {self.dims}" if self.dims else ""))
            return given, elem
        return (tuple(declared) if declared is not None else None), elem

    def _infer_model(self) -> None:
        """Whole-model ONNX shape inference with the static input shapes (best effort: nodes it
        leaves untyped are typed one at a time later)."""
        m = self._model_for_inference()
        g = m.graph
        changed = False
        for vi in g.input:
            if vi.name in self.known and vi.type.WhichOneof("value") == "tensor_type":
                changed |= onnx_fold.type_of(vi.type) != self.known[vi.name]
                shape = vi.type.tensor_type.shape
                shape.Clear()
                for d in self.known[vi.name][0]:
                    shape.dim.add().dim_value = d
        if changed:     # declared shapes of other values may contradict the new input shapes
            del g.value_info[:]
            for o in g.output:
                o.type.tensor_type.ClearField("shape")
        for strict in (True, False):
            try:
                m2 = onnx.shape_inference.infer_shapes(m, check_type=False, strict_mode=strict, data_prop=True)
                break
            except Exception:   # noqa: BLE001 - inference is only a first guess
                m2 = None
        if m2 is None:
            return
        for v in list(m2.graph.value_info) + list(m2.graph.output):
            t = onnx_fold.type_of(v.type)
            if t is not None and None not in t[0]:
                self.inferred[v.name] = t

    def _model_for_inference(self) -> onnx.ModelProto:
        """A copy of the model whose big initializers are typed inputs (inference needs only the
        values of small, shape-like ones; copying weights would double the memory)."""
        src = self.model
        m = onnx.ModelProto(ir_version=src.ir_version, opset_import=src.opset_import, functions=src.functions)
        g = m.graph
        g.node.extend(self.graph.node)
        g.output.extend(self.graph.output)
        g.value_info.extend(self.graph.value_info)
        g.input.extend(i for i in self.graph.input if i.name not in self.consts)
        for name, arr in self.consts.items():      # (initializers only, at this point)
            vi = onnx.helper.make_tensor_value_info(name, onnx_fold.elem_of(arr), arr.shape)
            if arr.size <= _INFER_VALUES and arr.dtype != object:
                g.initializer.append(onnx.numpy_helper.from_array(arr, name))
                if m.ir_version < 4:
                    g.input.append(vi)
            else:
                g.input.append(vi)
        return m

    # ------------------------------------------------------------------ one node
    def visit(self, proto: onnx.NodeProto, opset: int, name: str, location: str | None = None) -> None:
        """Import one node; ``location`` is the caller's, for nodes of an expanded function or branch."""
        if (proto.domain, proto.op_type) in self.functions:
            return onnx_control.expand_local_function(self, proto, opset, name, location)
        n = self.onode(proto, opset, name)
        n.location = n.location or location
        for i in n.inputs:
            if i in self.non_tensors:
                raise UnsupportedOperator(n, f"input '{i}' is a graph input of {self.non_tensors[i]} type; "
                                             "only tensor inputs are supported")
            if i and i not in self.known and i not in self.consts and i not in self.seqs:
                raise ModelLoadError(f"{n.op} (node '{n.name}'): input '{i}' is not produced by any node "
                                     "before it; the model is malformed")
        if onnx_control.handles(self, n):
            return onnx_control.convert(self, n)
        if any(isinstance(v, onnx.GraphProto) or (isinstance(v, tuple) and v and isinstance(v[0], onnx.GraphProto))
               for v in n.attrs.values()):
            raise UnsupportedOperator(n, "control flow with subgraphs is not supported (only If with a "
                                         "condition known at import time)")
        if self.fold(n):
            return
        if n.op in UNSUPPORTED:
            raise UnsupportedOperator(n, UNSUPPORTED[n.op])
        check_params(self, n)
        self.type_outputs(n)
        if onnx_control.expand_schema_function(self, n):
            return
        normalize(self, n)

    def onode(self, proto: onnx.NodeProto, opset: int, name: str) -> ONode:
        stub = ONode(proto.op_type, name, list(proto.input), list(proto.output), {}, 0, opset,
                     onnx_proto.location(proto), proto)
        if proto.domain not in DEFAULT_DOMAINS:
            raise UnsupportedOperator(stub, f"operators of domain '{proto.domain}' are not supported")
        try:
            schema = onnx.defs.get_schema(proto.op_type, opset, "")
        except onnx.defs.SchemaError:
            raise UnsupportedOperator(stub, f"not an ONNX operator at opset {opset}") from None
        if schema.deprecated and proto.op_type not in NORMALIZE_RULES:    # (those the rules translate)
            raise UnsupportedOperator(stub, f"deprecated at opset {opset}")
        stub.since = schema.since_version
        stub.attrs = {a.name: onnx_proto.attr_value(a) for a in proto.attribute}
        return stub

    def fold(self, n: ONode) -> bool:
        """Evaluate n at import time if its result is known now; True if it was folded."""
        ins = [i for i in n.inputs if i]
        vals = [self.consts.get(i) if i else None for i in n.inputs]
        if n.op in _TYPE_ONLY:
            if not self.static(ins[0]):
                return False
            shape = self.shape(ins[0])
            if n.op == "Shape":
                self._set_const(n.outputs[0], onnx_fold.shape_of(n.proto, n.opset, shape))
                return True
            if n.op == "Size":
                self._set_const(n.outputs[0], np.array(math.prod(shape), dtype=np.int64))
                return True
            vals = [np.zeros(shape, dtype=onnx_fold.np_dtype(self.vtype(ins[0])[1]))]
        elif n.op in onnx_fold.NONDETERMINISTIC or not all(i in self.consts for i in ins):
            return False
        limited = n.op not in _ALWAYS_FOLD
        if limited and self._too_big(n, ins, self._output_types(n)):
            return False
        try:
            outs = onnx_fold.evaluate(n.proto, n.opset, vals)
        except Exception as e:  # noqa: BLE001 - the reference implementation raises anything
            if n.op in _ALWAYS_FOLD:
                raise UnsupportedOperator(n, f"cannot be evaluated at import time ({e})") from None
            return False        # leave it to fission, with constant inputs
        if limited and self._too_big(n, ins, [(o.shape, onnx_fold.elem_of(o)) for o in outs
                                              if isinstance(o, np.ndarray)]):
            return False
        for o, v in zip(n.outputs, outs):
            if o:
                if not isinstance(v, np.ndarray):
                    raise UnsupportedOperator(n, f"output '{o}' is not a tensor")
                self._set_const(o, v)
                self.folded_by[o] = n
        return True

    def _output_types(self, n: ONode) -> list:
        """Output types before evaluating (whole-model inference, else the node alone), or []."""
        typed = [self.inferred.get(o) for o in n.outputs if o]
        if any(t is None for t in typed):
            got = onnx_fold.infer_node(n.proto, n.opset, {i: self.vtype(i) for i in n.inputs if i}, self.consts)
            typed = [got.get(o) for o in n.outputs if o]
        return [] if any(t is None or None in t[0] for t in typed) else typed

    def _too_big(self, n: ONode, ins: list[str], typed: list) -> bool:
        size = sum(int(np.prod(s, dtype=np.int64)) * onnx_proto.itemsize(e) for s, e in typed)
        # Growth, not size, is what the limit is about: a Cast or DequantizeLinear of big weights
        # only replaces them, an Expand or Tile multiplies them.
        grown = size > onnx_fold.FOLD_GROWTH * sum(self.consts[i].nbytes for i in ins)
        return size > onnx_fold.FOLD_LIMIT_BYTES and grown

    def type_outputs(self, n: ONode) -> None:
        """Give every output of n a static type (whole-model inference, else this node alone)."""
        missing = [o for o in n.outputs if o and o not in self.known]
        for o in list(missing):
            if o in self.inferred:
                self.known[o] = self.inferred[o]
                missing.remove(o)
        if not missing:
            return
        in_types = {i: self.vtype(i) for i in n.inputs if i}
        if any(s is None or None in s for s, _ in in_types.values()):
            raise UnsupportedOperator(n, "an input has no static shape")
        got = onnx_fold.infer_node(n.proto, n.opset, in_types, self.consts)
        for o in missing:
            t = got.get(o)
            if t is None or None in t[0]:
                t = self._type_by_running(n, o, in_types)
            self.known[o] = t

    def _type_by_running(self, n: ONode, out: str, in_types: dict) -> tuple:
        """Last resort: run the node on two random inputs; the shapes must not depend on values."""
        shapes = []
        for seed in (0, 1):
            rng = np.random.default_rng(seed)
            vals = [self.consts.get(i, onnx_proto.random_like(rng, *in_types[i])) if i else None for i in n.inputs]
            try:
                outs = onnx_fold.evaluate(n.proto, n.opset, vals)
            except Exception:   # noqa: BLE001
                raise UnsupportedOperator(n, f"cannot determine a static shape for output '{out}'") from None
            v = outs[n.outputs.index(out)]
            shapes.append((tuple(v.shape), onnx_fold.elem_of(v)))
        if shapes[0] != shapes[1]:
            raise UnsupportedOperator(n, f"the shape of output '{out}' depends on input values")
        return shapes[0]

    # ------------------------------------------------------------------ helpers for rules
    def vtype(self, name: str) -> tuple[Shape, int]:
        if name in self.consts:
            v = self.consts[name]
            return tuple(v.shape), onnx_fold.elem_of(v)
        return self.known[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.vtype(name)[0])

    def static(self, name: str) -> bool:
        if name in self.consts:
            return True
        t = self.known.get(name)
        return t is not None and None not in t[0]

    def param(self, n: ONode, idx: int, what: str) -> np.ndarray | None:
        """The constant value of parameter input idx (None if omitted); raise if computed at run time."""
        if idx >= len(n.inputs) or not n.inputs[idx]:
            return None
        name = n.inputs[idx]
        if name not in self.consts:
            raise UnsupportedOperator(n, f"dynamic {what} is not supported (input '{name}' is computed at "
                                         "run time; make it a constant)")
        return self.consts[name]

    def fresh(self, stem: str) -> str:
        k = 0
        while f"{stem}__{k}" in self.taken:
            k += 1
        name = f"{stem}__{k}"
        self.taken.add(name)
        return name

    def new_value(self, stem: str, shape: Sequence[int], elem: int) -> str:
        name = self.fresh(stem)
        self.known[name] = (tuple(int(d) for d in shape), elem)
        return name

    def new_const(self, stem: str, value: np.ndarray) -> str:
        name = self.fresh(stem)
        self._set_const(name, np.asarray(value))
        return name

    def _set_const(self, name: str, value: np.ndarray) -> None:
        self.consts[name] = value
        self.known.pop(name, None)

    def alias(self, n: ONode, src: str, dst: str) -> None:
        """Make dst the same value as src (an Identity node unless src is a constant or sequence)."""
        if src in self.seqs:
            self.seqs[dst] = list(self.seqs[src])
        elif src in self.consts:
            self._set_const(dst, self.consts[src])
        else:
            self.known[dst] = self.vtype(src)
            self.emit(n, "Identity", [src], [dst])

    def emit(self, n: ONode, op: str, inputs: Sequence[str], outputs: Sequence[str],
             attrs: Mapping[str, Any] | None = None) -> Node:
        """Append one canonical node for the ONNX node n (the first one keeps n's name)."""
        for v in list(inputs) + list(outputs):
            if v:
                self._check_value(n, v)
        # keyed by identity; the node is kept in the entry so its id cannot be reused by a new node
        k = self._emitted.get(id(n), (n, 0))[1]
        self._emitted[id(n)] = (n, k + 1)
        name = n.name if k == 0 else f"{n.name}/{op}_{k}"
        attrs = {a: onnx_proto.py_value(v) for a, v in (attrs or {}).items()}
        node = Node(op, name, tuple(inputs), tuple(outputs), Attrs(attrs), n.location)
        self.nodes.append(node)
        return node

    def _check_value(self, n: ONode, v: str) -> None:
        if v in self.seqs:
            raise UnsupportedOperator(n, f"'{v}' is a sequence; sequences are only supported by the "
                                         "Sequence* operators with positions known at import time")
        shape, elem = self.vtype(v)
        if shape is None or None in shape:
            raise UnsupportedOperator(n, f"'{v}' has no static shape")
        try:
            DType.from_onnx(elem)
        except TypeError:
            raise UnsupportedOperator(n, f"'{v}' has element type {onnx_fold.elem_name(elem)}, which "
                                         "tilefuse does not support") from None

    def tensor_type(self, name: str) -> TensorType:
        shape, elem = self.vtype(name)
        return TensorType(tuple(shape), DType.from_onnx(elem))

    # ------------------------------------------------------------------ the result
    def _graph(self) -> Graph:
        outputs = [o.name for o in self.graph.output]
        for o in outputs:
            if o in self.seqs or o in self.non_tensors:
                raise ModelLoadError(f"graph output '{o}' is a sequence; only tensor outputs are supported")
            if o not in self.known and o not in self.consts:
                raise ModelLoadError(f"graph output '{o}' is not produced by any node; the model is malformed")
        decls = []
        for name in self.decls:
            shape, elem = self.known[name]
            try:
                decls.append(TensorDecl(name, TensorType(tuple(shape), DType.from_onnx(elem))))
            except TypeError:
                raise ModelLoadError(f"input '{name}' has element type {onnx_fold.elem_name(elem)}, which "
                                     "tilefuse does not support") from None
        self.nodes = _live(self.nodes, outputs)
        used = {v for nd in self.nodes for v in nd.inputs + nd.outputs if v} | set(outputs)
        constants = []
        for name in sorted(used & set(self.consts)):
            arr = self.consts[name]
            try:
                DType.from_onnx(onnx_fold.elem_of(arr))
            except TypeError:
                what = f"'{name}' has element type {onnx_fold.elem_name(onnx_fold.elem_of(arr))}, which tilefuse " \
                       "does not support"
                if name in self.folded_by:
                    raise UnsupportedOperator(self.folded_by[name], what) from None
                raise ModelLoadError(f"constant {what}") from None
            constants.append(Constant(name, onnx_fold.to_torch(arr)))
        types = {d.name: d.type for d in decls}
        types.update((c.name, c.type) for c in constants)
        for nd in self.nodes:
            for o in nd.outputs:
                if o:
                    types[o] = self.tensor_type(o)
        return Graph(tuple(decls), tuple(outputs), tuple(self.nodes), tuple(constants), types,
                     name=self.graph.name or "model")


# Initializers up to this many elements keep their values in whole-model shape inference.
_INFER_VALUES = 4096
# Operators the canonical set does not have: evaluated whatever the size of the result.
_ALWAYS_FOLD = frozenset({"Constant", "Shape", "Size", "Range", "EyeLike"})
# Folded from the input's type alone.
_TYPE_ONLY = frozenset({"Shape", "Size", "EyeLike"})


def _unbound_message(unbound: list, dims: dict) -> str:
    """Every input whose shape is still open, and how to bind it: the named dims once for all
    inputs (``dims``, ``--dim``), else whole shapes (``input_shapes``, ``--input-shape``), with
    an example of the right rank built from the model's own declared dims."""
    names = list(dict.fromkeys(d.dim_param for vi in unbound for d in vi.type.tensor_type.shape.dim
                               if not d.HasField("dim_value") and d.dim_param and d.dim_param not in dims))
    anonymous = [vi for vi in unbound if not vi.type.tensor_type.HasField("shape")
                 or any(not d.HasField("dim_value") and not d.dim_param for d in vi.type.tensor_type.shape.dim)]
    lines = [f"{len(unbound)} input{'s' if len(unbound) > 1 else ''} with dynamic dims: "
             + ", ".join(f"'{vi.name}' {onnx_proto.fmt_shape(vi)}" for vi in unbound)]
    if names:
        lines.append("bind the named dims once for every input: dims={" + ", ".join(f"{n!r}: 1" for n in names)
                     + "} (command line: " + " ".join(f"--dim {n}=1" for n in names) + ")")
    for vi in anonymous:
        if not vi.type.tensor_type.HasField("shape"):
            lines.append(f"'{vi.name}' has no declared rank: give its shape with input_shapes={{'{vi.name}': (...)}} "
                         f"(command line: --input-shape {vi.name}=DIMS)")
            continue
        ex = [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 1) for d in vi.type.tensor_type.shape.dim]
        lines.append(f"'{vi.name}' has unnamed dims: give its shape with input_shapes={{'{vi.name}': {tuple(ex)}}} "
                     f"(command line: --input-shape {vi.name}={'x'.join(map(str, ex))})")
    return "; ".join(lines)


def _static_shape(name: str, given) -> tuple[int, ...]:
    """``input_shapes[name]`` as a tuple of non-negative ints, else a clear InputError."""
    try:
        dims = tuple(given)
        if all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in dims):
            return tuple(int(d) for d in dims)
    except TypeError:
        pass
    raise InputError(f"input_shapes gives input '{name}' the shape {given!r}; a shape is a sequence of "
                     f"non-negative integers, e.g. (1, 3, 224, 224)")


def _needed(graph: onnx.GraphProto, functions) -> list[tuple[int, onnx.NodeProto]]:
    """The nodes the graph outputs depend on (index in the graph, node), in a topological order."""
    producer = {o: k for k, nd in enumerate(graph.node) for o in nd.output if o}
    need, stack = set(), [o.name for o in graph.output]
    while stack:
        k = producer.get(stack.pop())
        if k is None or k in need:
            continue
        need.add(k)
        stack.extend(_reads(graph.node[k]))
    order, done = [], {i.name for i in graph.input} | {t.name for t in graph.initializer}
    done |= {t.values.name for t in graph.sparse_initializer}
    pending = sorted(need)
    while pending:
        rest = []
        for k in pending:      # one pass when the graph is already in order, as ONNX requires
            if all(i in done or i not in producer for i in _reads(graph.node[k])):
                order.append((k, graph.node[k]))
                done.update(graph.node[k].output)
            else:
                rest.append(k)
        if len(rest) == len(pending):
            nd = graph.node[rest[0]]
            raise ModelLoadError(f"{nd.op_type} (node '{nd.name or nd.op_type}'): the graph has a cycle "
                                 "through its inputs; the model is malformed")
        pending = rest
    return order


def _live(nodes: list[Node], outputs: list[str]) -> list[Node]:
    """The canonical nodes the outputs depend on (normalization can leave some unused)."""
    need, keep = set(outputs), []
    for nd in reversed(nodes):
        if any(o in need for o in nd.outputs):
            keep.append(nd)
            need.update(nd.inputs)
    return keep[::-1]


def _reads(node: onnx.NodeProto) -> list[str]:
    """Inputs of a node, including outer-scope names its subgraphs read."""
    names = [i for i in node.input if i]
    for a in node.attribute:
        for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
            inner = {i.name for i in g.input} | {t.name for t in g.initializer}
            for nd in g.node:
                names.extend(i for i in _reads(nd) if i not in inner)
                inner.update(nd.output)
            names.extend(o.name for o in g.output if o.name not in inner)
    return names


def _all_names(model: onnx.ModelProto) -> set[str]:
    names = set()

    def walk(g: onnx.GraphProto):
        names.update(v.name for v in list(g.input) + list(g.output) + list(g.value_info))
        names.update(t.name for t in g.initializer)
        for nd in g.node:
            names.update(nd.input)
            names.update(nd.output)
            for a in nd.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    walk(sub)
    walk(model.graph)
    return names
