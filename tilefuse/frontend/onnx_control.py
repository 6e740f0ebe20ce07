"""Structure the canonical op set has no operators for, resolved at import time:

- sequences whose positions are constants are lists of tensor names (SequenceAt is an alias,
  ConcatFromSequence a Concat, SplitToSequence a Split);
- ``If`` with a constant condition is replaced by the branch it takes, with a condition computed at
  run time by both branches and a Where;
- ``Scan`` is unrolled over its (static) number of iterations, ``Loop`` while its trip count and
  condition are known at import time;
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


# Control flow resolved at import time: If with a constant condition, Scan and Loop unrolled.
CONTROL_OPS = frozenset({"If", "Scan", "Loop"})
# Loops longer than this are refused rather than unrolled.
MAX_UNROLL = 4096


def handles(cx, n) -> bool:
    return n.op in SEQUENCE_OPS or n.op in CONTROL_OPS or any(i in cx.seqs for i in n.inputs if i)


def convert(cx, n) -> None:
    if n.op == "If":
        return _inline_if(cx, n)
    if n.op == "Scan":
        return _unroll_scan(cx, n)
    if n.op == "Loop":
        return _unroll_loop(cx, n)
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
    """The branch a constant condition takes; with a condition computed at run time, both branches
    and a Where per output (their outputs must have the same types: a static graph)."""
    cond = n.inputs[0]
    if cond in cx.consts:
        branch = n.attrs["then_branch" if bool(np.asarray(cx.consts[cond]).reshape(-1)[0]) else "else_branch"]
        for src, dst in zip(_visit_branch(cx, n, branch), n.outputs):
            if dst:
                cx.alias(n, src, dst)
        return
    taken = _visit_branch(cx, n, n.attrs["then_branch"])
    other = _visit_branch(cx, n, n.attrs["else_branch"])
    for a, b, dst in zip(taken, other, n.outputs):
        if not dst:
            continue
        if a in cx.seqs or b in cx.seqs or cx.vtype(a) != cx.vtype(b):
            raise UnsupportedOperator(n, "If with a condition computed at run time needs branches whose outputs "
                                         f"have the same tensor type ('{a}', '{b}')")
        cx.known[dst] = cx.vtype(a)
        cx.emit(n, "Where", [cond, a, b], [dst])


def _visit_branch(cx, n, branch: onnx.GraphProto) -> list[str]:
    for t in branch.initializer:
        cx._set_const(t.name, onnx.numpy_helper.to_array(t))
    for k, nd in enumerate(branch.node):
        cx.visit(nd, n.opset, f"{n.name}/{nd.name or f'{nd.op_type}_{k}'}", n.location)
    return [o.name for o in branch.output]


# ---------------------------------------------------------------------- Scan
def _unroll_scan(cx, n) -> None:
    """Scan (opset 9+) unrolled: its iteration count is the (static) length of the scan inputs, so
    the body is inlined once per iteration on slices of them, and the per-iteration outputs are
    stacked."""
    if n.since < 9:
        raise UnsupportedOperator(n, "Scan before opset 9 (with sequence_lens) is not supported")
    body, m = n.attrs["body"], int(n.attrs["num_scan_inputs"])
    states, scans = list(n.inputs[:len(n.inputs) - m]), list(n.inputs[len(n.inputs) - m:])
    k_out = len(body.output) - len(states)
    in_axes = _axes(cx, scans, n.attrs.get("scan_input_axes"), 0)
    in_rev = list(n.attrs.get("scan_input_directions", [0] * m))
    steps = {cx.shape(x)[a] for x, a in zip(scans, in_axes)}
    if len(steps) != 1:
        raise UnsupportedOperator(n, f"scan inputs of different lengths {sorted(steps)}")
    steps = steps.pop()
    stacked: list[list[str]] = [[] for _ in range(k_out)]
    for t in range(steps):
        bound = dict(zip((i.name for i in body.input), states))
        for j, (x, axis) in enumerate(zip(scans, in_axes)):
            bound[body.input[len(states) + j].name] = _take(cx, n, x, axis, steps - 1 - t if in_rev[j] else t)
        outs = _inline_graph(cx, n, body, bound, f"{n.name}/{t}")
        states = outs[:len(states)]
        for k in range(k_out):
            stacked[k].append(outs[len(states) + k])
    for dst, src in zip(n.outputs, states):
        if dst:
            cx.alias(n, src, dst)
    out_axes = n.attrs.get("scan_output_axes", [0] * k_out)
    out_rev = n.attrs.get("scan_output_directions", [0] * k_out)
    for k, dst in enumerate(n.outputs[len(states):]):
        if dst:
            _stack(cx, n, stacked[k][::-1] if out_rev[k] else stacked[k], out_axes[k], dst)


def _unroll_loop(cx, n) -> None:
    """Loop unrolled while its trip count and condition are known at import time: the body is
    inlined per iteration and must leave its condition a constant each time."""
    body = n.attrs["body"]
    trip = cx.param(n, 0, "trip count (M)")
    cond = cx.param(n, 1, "condition")
    if trip is None and cond is None:
        raise UnsupportedOperator(n, "a Loop without trip count or condition never ends")
    trip = MAX_UNROLL + 1 if trip is None else int(np.asarray(trip).reshape(-1)[0])
    if trip > MAX_UNROLL:
        raise UnsupportedOperator(n, f"more than {MAX_UNROLL} iterations are not unrolled")
    running = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
    states = list(n.inputs[2:])
    k_out = len(body.output) - 1 - len(states)
    stacked: list[list[str]] = [[] for _ in range(k_out)]
    it = 0
    while running and it < trip:
        names = [i.name for i in body.input]
        bound = {names[0]: cx.new_const(f"{n.name}_iter", np.array(it, dtype=np.int64)),
                 names[1]: cx.new_const(f"{n.name}_cond", np.array(True))}
        bound.update(zip(names[2:], states))
        outs = _inline_graph(cx, n, body, bound, f"{n.name}/{it}")
        if outs[0] not in cx.consts:
            raise UnsupportedOperator(n, "the loop condition is computed at run time; only loops whose trip "
                                         "count and condition are known at import time are unrolled")
        running = bool(np.asarray(cx.consts[outs[0]]).reshape(-1)[0])
        states = outs[1:1 + len(states)]
        for k in range(k_out):
            stacked[k].append(outs[1 + len(states) + k])
        it += 1
    for dst, src in zip(n.outputs, states):
        if dst:
            cx.alias(n, src, dst)
    for k, dst in enumerate(n.outputs[len(states):]):
        if dst:
            if not stacked[k]:
                raise UnsupportedOperator(n, "a scan output of a loop that runs no iteration has no static shape")
            _stack(cx, n, stacked[k], 0, dst)


def _axes(cx, xs: list[str], given, default: int) -> list[int]:
    axes = list(given) if given is not None else [default] * len(xs)
    return [a + len(cx.shape(x)) if a < 0 else a for a, x in zip(axes, xs)]


def _take(cx, n, x: str, axis: int, pos: int) -> str:
    """x at position pos of axis (the axis removed): a Gather with a constant scalar index."""
    shape, elem = cx.vtype(x)
    v = cx.new_value(f"{n.name}_slice", [d for k, d in enumerate(shape) if k != axis], elem)
    cx.emit(n, "Gather", [x, cx.new_const(f"{n.name}_pos", np.array(pos, dtype=np.int64))], [v], {"axis": axis})
    return v


def _stack(cx, n, items: list[str], axis: int, dst: str) -> None:
    shape, elem = cx.vtype(items[0])
    axis = axis + len(shape) + 1 if axis < 0 else axis
    lifted = []
    for it in items:
        s = list(cx.shape(it))
        s.insert(axis, 1)
        v = cx.new_value(f"{dst}_item", s, elem)
        cx.emit(n, "Unsqueeze", [it], [v], {"axes": (axis,)})
        lifted.append(v)
    out = list(shape)
    out.insert(axis, len(items))
    cx.known[dst] = (tuple(out), elem)
    cx.emit(n, "Concat", lifted, [dst], {"axis": axis})


def _inline_graph(cx, n, g: onnx.GraphProto, bound: dict[str, str], scope: str) -> list[str]:
    """Visit the nodes of subgraph g with its inputs bound to values; the values of its outputs.
    Names the body reads from the enclosing scope pass through; everything it defines is renamed."""
    rename = dict(bound)
    for t in g.initializer:
        rename[t.name] = cx.new_const(f"{scope}/{t.name}", onnx.numpy_helper.to_array(t))
    for k, nd in enumerate(g.node):
        node = onnx.NodeProto()
        node.CopyFrom(nd)
        del node.input[:], node.output[:]
        node.input.extend(rename.get(i, i) for i in nd.input)
        for o in nd.output:
            node.output.append(_bind(cx, rename, o, scope))
        for a in node.attribute:
            for sub in _subgraphs(a):
                _rename_outer(sub, rename)
        cx.visit(node, n.opset, f"{scope}/{nd.name or f'{nd.op_type}_{k}'}", n.location)
    return [rename.get(o.name, o.name) for o in g.output]


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
