"""Test helper: evaluate a fused schedule's inlined expressions with torch.

It follows the schedule exactly as a generated kernel must: reduction instances computed per row
over their own reduced extents, then every store evaluated over the anchor space (masked where the
store would repeat).  Comparing it with the reference executor checks the inlining, the row/inner
split and the store maps of the fused family independently of any code generator.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from opcheck import one_node_graph

from tilefuse.fission import fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.evaluate import Grid, retype, run_reference, var_env
from tilefuse.ir.expr import Load, Value, transform
from tilefuse.ir.prim import PrimGraph

_COMBINE = {"sum": lambda t, d: t.sum(d), "max": lambda t, d: t.amax(d), "min": lambda t, d: t.amin(d),
            "prod": lambda t, d: t.prod(d)}


def _rowwise(e, nin: int, xvars):
    """Instance references (``Value(slot)``) become loads of the per-row tensor at the row vars."""
    return transform(e, lambda n: Load(n.slot, xvars, n.dtype) if isinstance(n, Value) else None)


def evaluate_schedule(s, inputs: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    nin = len(s.body.inputs)
    vals = list(inputs)
    ext = dict(zip(s.body.xvars, s.body.xext)) | dict(zip(s.body.ivars, s.body.iext))
    dummy = SimpleNamespace(name="fused", origin="fused schedule", inputs=list(s.body.inputs) + ["instance"] * 64)
    for inst in s.body.instances:
        body = _rowwise(inst.body, nin, s.body.xvars)
        if inst.dtype.value in ("float16", "bfloat16"):  # the executor's rule: 16-bit reductions run in fp32
            body = transform(body, lambda n: retype(n) if n.dtype.value in ("float16", "bfloat16") else None)
        allv = list(s.body.xvars) + list(inst.rvars)
        e = dict(ext) | dict(zip(inst.rvars, inst.rext))
        g = Grid(dummy, vals, var_env(allv, e, torch.device("cpu")))
        wide = inst.dtype.to_torch()
        if inst.dtype.value in ("float16", "bfloat16"):
            wide = torch.float32
        v = g.eval(body).to(wide).expand(*[e[x] for x in allv])
        red = tuple(range(len(s.body.xvars), len(allv)))
        v = _COMBINE[inst.combiner](v, red) if red else v
        vals.append(v.to(inst.dtype.to_torch()).reshape(tuple(s.body.xext)))
    out = {}
    allv = list(s.body.xvars) + list(s.body.ivars)
    anchor_order = sorted(allv, key=lambda v: int(v.name[1:]))
    for st in s.body.stores:
        t = s.group.types[st.tensor]
        g = Grid(dummy, vals, var_env(anchor_order, ext, torch.device("cpu")))
        shape = [ext[v] for v in anchor_order]
        keep = torch.ones(shape, dtype=torch.bool)
        for v in st.mask_vars:
            keep &= (g.env[v] == 0).expand(shape)
        for v, n in st.limits:
            keep &= (g.env[v] < n).expand(shape)
        val = g.eval(_rowwise(st.value, nin, s.body.xvars), keep).expand(shape)   # reads may leave their
        idx = [g.eval(i, keep).expand(shape) for i in st.index]              # tensors where not kept
        res = torch.full(t.shape, float("nan"), dtype=t.dtype.to_torch()) if t.dtype.is_float else \
            torch.zeros(t.shape, dtype=t.dtype.to_torch())
        res[tuple(i[keep] for i in idx)] = val[keep].to(res.dtype)
        out[st.tensor] = res
    return out


def all_values(pg, feeds):
    """Every tensor of the graph, by name (the reference executor on a graph exposing all prims)."""
    full = PrimGraph(pg.inputs, pg.constants, pg.prims, tuple(p.name for p in pg.prims))
    env = {c.name: c.data for c in pg.constants} | dict(feeds)
    env.update(zip(full.outputs, run_reference(full, feeds)))
    return env


def op_graph(op, inputs, out_shape, attrs, dtype=DType.float32):
    """A one-operator graph, fissioned, and its feeds (inputs named x0, x1, ...)."""
    g = one_node_graph(op, inputs, [TensorType(out_shape, dtype)], attrs)
    pg = fission(g)
    feeds = {d.name: inputs[int(d.name[1:])] for d in g.inputs}
    return pg, feeds


def layernorm_group():
    """LayerNormalization with its mean and inverse-std outputs, as one group, and every value."""
    from tilefuse.families.base import Group
    x, w, b = torch.randn(4, 5, 24), torch.randn(24), torch.randn(24)
    g = one_node_graph("LayerNormalization", [x, w, b],
                       [TensorType((4, 5, 24), DType.float32), TensorType((4, 5, 1), DType.float32),
                        TensorType((4, 5, 1), DType.float32)], {"axis": -1})
    pg = fission(g)
    return Group(pg.prims, ("x0", "x1", "x2"), pg.outputs, dict(pg.types)), all_values(pg, {"x0": x, "x1": w, "x2": b})


def transpose_scale_group():
    """A transpose and twice its value, both outputs (two layouts of one tile), and every value."""
    from tilefuse.families.base import Group
    from tilefuse.fission.registry import Fission
    pg, feeds = op_graph("Transpose", [torch.randn(3, 7)], (7, 3), {"perm": (1, 0)})
    fx = Fission({p.name for p in pg.prims} | {"x0"})
    t = fx.ref(pg.prims[0].name, pg.prims[0].out)
    y = fx.compute((7, 3), lambda i: t[i] * 2.0)
    env = all_values(pg, feeds)
    env[y.name] = env[t.name] * 2
    types = dict(pg.types) | {y.name: y.type}
    return Group(pg.prims + tuple(fx.prims), ("x0",), (t.name, y.name), types), env
