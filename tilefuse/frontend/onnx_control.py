"""Structure the canonical op set has no operators for, resolved at import time:

- sequences whose positions are constants are lists of tensor names (SequenceAt is an alias,
  ConcatFromSequence a Concat, SplitToSequence a Split);
- ``If`` with a constant condition is replaced by the branch it takes;
- functions (model-local ones, and ONNX operators defined by a function body when fission has no
  rule for them) are expanded into their body's nodes.
"""
from __future__ import annotations

import numpy as np
import onnx

from ..errors import UnsupportedOperator
from .onnx_proto import location as location_of

SEQUENCE_OPS = frozenset({"SequenceEmpty", "SequenceConstruct", "SequenceInsert", "SequenceErase", "SequenceAt",
                          "SequenceLength", "ConcatFromSequence", "SplitToSequence"})


def handles(cx, n) -> bool:
    return n.op in SEQUENCE_OPS or n.op == "If" or any(i in cx.seqs for i in n.inputs if i)


def convert(cx, n) -> None:
    if n.op == "If":
        return _inline_if(cx, n)
    rule = _SEQ_RULES.get(n.op)
    if rule is None:
        raise UnsupportedOperator(n, "sequence inputs are only supported by the Sequence* operators")
    rule(cx, n)


# ---------------------------------------------------------------------- sequences
def _seq(cx, n, k: int = 0) -> list[str]:
    return list(cx.seqs[n.inputs[k]])


def _position(cx, n, k: int, length: int, default: int, insert: bool = False) -> int:
    v = cx.param(n, k, "position")
    pos = default if v is None else int(np.asarray(v).reshape(-1)[0])
    hi = length if insert else length - 1
    if pos < 0:
        pos += length
    if not 0 <= pos <= hi:
        raise UnsupportedOperator(n, f"position {pos} is out of range for a sequence of {length}")
    return pos


def _seq_empty(cx, n):
    cx.seqs[n.outputs[0]] = []


def _seq_construct(cx, n):
    cx.seqs[n.outputs[0]] = list(n.inputs)


def _seq_insert(cx, n):
    s = _seq(cx, n)
    s.insert(_position(cx, n, 2, len(s), len(s), insert=True), n.inputs[1])
    cx.seqs[n.outputs[0]] = s


def _seq_erase(cx, n):
    s = _seq(cx, n)
    del s[_position(cx, n, 1, len(s), len(s) - 1)]
    cx.seqs[n.outputs[0]] = s


def _seq_at(cx, n):
    s = _seq(cx, n)
    cx.alias(n, s[_position(cx, n, 1, len(s), 0)], n.outputs[0])


def _seq_length(cx, n):
    cx._set_const(n.outputs[0], np.array(len(_seq(cx, n)), dtype=np.int64))


def _concat_from_seq(cx, n):
    items = _seq(cx, n)
    if not items:
        raise UnsupportedOperator(n, "concatenating an empty sequence")
    axis, new_axis = n.attrs.get("axis"), n.attrs.get("new_axis", 0)
    shape, elem = cx.vtype(items[0])
    rank = len(shape) + (1 if new_axis else 0)
    axis = axis + rank if axis < 0 else axis
    if new_axis:
        lifted = []
        for it in items:
            s = list(cx.shape(it))
            s.insert(axis, 1)
            v = cx.new_value(n.outputs[0], s, elem)
            cx.emit(n, "Unsqueeze", [it], [v], {"axes": (axis,)})
            lifted.append(v)
        items = lifted
    out = list(cx.shape(items[0]))
    out[axis] = sum(cx.shape(it)[axis] for it in items)
    cx.known[n.outputs[0]] = (tuple(out), elem)
    cx.emit(n, "Concat", items, [n.outputs[0]], {"axis": axis})


def _split_to_seq(cx, n):
    x = n.inputs[0]
    shape, elem = cx.vtype(x)
    axis = n.attrs.get("axis", 0)
    axis = axis + len(shape) if axis < 0 else axis
    dim = shape[axis]
    split = cx.param(n, 1, "split")
    keep = n.attrs.get("keepdims", 1) or split is not None
    if split is None:
        sizes = [1] * dim
    elif np.ndim(split) == 0:
        step = int(split)
        sizes = [step] * (dim // step) + ([dim % step] if dim % step else [])
    else:
        sizes = [int(s) for s in split]
    parts = []
    for sz in sizes:
        s = list(shape)
        s[axis] = sz
        parts.append(cx.new_value(n.outputs[0], s, elem))
    cx.emit(n, "Split", [x], parts, {"axis": axis, "split": tuple(sizes)})
    if not keep:
        squeezed = []
        for p in parts:
            s = [d for k, d in enumerate(cx.shape(p)) if k != axis]
            v = cx.new_value(n.outputs[0], s, elem)
            cx.emit(n, "Squeeze", [p], [v], {"axes": (axis,)})
            squeezed.append(v)
        parts = squeezed
    cx.seqs[n.outputs[0]] = parts


def _seq_identity(cx, n):
    cx.seqs[n.outputs[0]] = _seq(cx, n)


_SEQ_RULES = {"SequenceEmpty": _seq_empty, "SequenceConstruct": _seq_construct, "SequenceInsert": _seq_insert,
              "SequenceErase": _seq_erase, "SequenceAt": _seq_at, "SequenceLength": _seq_length,
              "ConcatFromSequence": _concat_from_seq, "SplitToSequence": _split_to_seq,
              "Identity": _seq_identity}


# ---------------------------------------------------------------------- If
def _inline_if(cx, n) -> None:
    cond = n.inputs[0]
    if cond not in cx.consts:
        raise UnsupportedOperator(n, "If with a condition computed at run time is not supported")
    branch = n.attrs["then_branch" if bool(np.asarray(cx.consts[cond]).reshape(-1)[0]) else "else_branch"]
    for t in branch.initializer:
        cx._set_const(t.name, onnx.numpy_helper.to_array(t))
    for k, nd in enumerate(branch.node):
        cx.visit(nd, n.opset, f"{n.name}/{nd.name or f'{nd.op_type}_{k}'}", n.location)
    for src, dst in zip(branch.output, n.outputs):
        if dst:
            cx.alias(n, src.name, dst)


# ---------------------------------------------------------------------- functions
def expand_local_function(cx, proto: onnx.NodeProto, opset: int, name: str, location: str | None) -> None:
    f = cx.functions[(proto.domain, proto.op_type)]
    _expand(cx, proto, f, _function_opset(f, opset), name, location_of(proto) or location)


def expand_schema_function(cx, n) -> bool:
    """Expand an ONNX operator into its function body when fission has no rule for it."""
    from ..fission import RULES, load_rules
    load_rules()
    if n.op in RULES or n.op in _NEVER_EXPAND:
        return False
    schema = onnx.defs.get_schema(n.op, n.opset, "")
    f = None
    versions = [v for v in schema.function_opset_versions if v <= n.opset]
    if versions:
        f = onnx.FunctionProto.FromString(schema.get_function_with_opset_version(max(versions)))
    else:
        versions = [v for v in schema.context_dependent_function_opset_versions if v <= n.opset]
        if versions:
            types = [_type_proto(cx, i) for i in n.inputs]
            node = _with_defaults(n.proto, schema)
            raw = schema.get_context_dependent_function_with_opset_version(
                max(versions), node.SerializeToString(), [t.SerializeToString() for t in types])
            f = onnx.FunctionProto.FromString(raw) if raw else None
    if f is None or not f.node:
        return False
    _expand(cx, _with_defaults(n.proto, schema), f, _function_opset(f, n.opset), n.name, n.location)
    return True


# Rewrites the normalizer makes itself (so a missing fission rule says the operator's own name).
_NEVER_EXPAND = frozenset({"If", "Loop", "Scan"})


def _function_opset(f: onnx.FunctionProto, default: int) -> int:
    for o in f.opset_import:
        if o.domain in ("", "ai.onnx"):
            return o.version
    return default


def _type_proto(cx, name: str) -> onnx.TypeProto:
    if not name:
        return onnx.TypeProto()
    shape, elem = cx.vtype(name)
    return onnx.helper.make_tensor_type_proto(elem, shape)


def _with_defaults(proto: onnx.NodeProto, schema) -> onnx.NodeProto:
    node = onnx.NodeProto()
    node.CopyFrom(proto)
    have = {a.name for a in node.attribute}
    for name, a in schema.attributes.items():
        if name not in have and a.default_value is not None and a.default_value.name:
            node.attribute.append(a.default_value)
    return node


def _expand(cx, call: onnx.NodeProto, f: onnx.FunctionProto, opset: int, name: str,
            location: str | None) -> None:
    """Visit the body of f with formal parameters bound to the call's values and attributes."""
    rename = dict(zip(f.input, call.input))
    rename.update(zip(f.output, call.output))
    attrs = {a.name: a for a in f.attribute_proto}
    attrs.update({a.name: a for a in call.attribute})
    for k in list(f.input)[len(call.input):]:
        rename[k] = ""
    for k, nd in enumerate(f.node):
        node = onnx.NodeProto()
        node.CopyFrom(nd)
        del node.input[:], node.output[:], node.attribute[:]
        for i in nd.input:
            node.input.append(_bind(cx, rename, i, name))
        for o in nd.output:
            node.output.append(_bind(cx, rename, o, name))
        for a in nd.attribute:
            if a.ref_attr_name:
                if a.ref_attr_name in attrs:
                    b = onnx.AttributeProto()
                    b.CopyFrom(attrs[a.ref_attr_name])
                    b.name = a.name
                    node.attribute.append(b)
            else:
                node.attribute.append(a)
                for g in _subgraphs(node.attribute[-1]):
                    _rename_outer(g, rename)
        cx.visit(node, opset, f"{name}/{nd.name or f'{nd.op_type}_{k}'}", location)


def _subgraphs(a: onnx.AttributeProto) -> list[onnx.GraphProto]:
    return [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)


def _rename_outer(g: onnx.GraphProto, rename: dict) -> None:
    """Rename, in place, the names a subgraph reads from the function body around it."""
    local = {i.name for i in g.input} | {t.name for t in g.initializer}
    for nd in g.node:
        for k, i in enumerate(nd.input):
            if i not in local and i in rename:
                nd.input[k] = rename[i]
        for a in nd.attribute:
            for sub in _subgraphs(a):
                _rename_outer(sub, {k: v for k, v in rename.items() if k not in local})
        local.update(nd.output)
    for o in g.output:
        if o.name not in local and o.name in rename:
            o.name = rename[o.name]


def _bind(cx, rename: dict, v: str, scope: str) -> str:
    if not v:
        return ""
    if v not in rename:
        rename[v] = cx.fresh(f"{scope}/{v}")
    return rename[v]
