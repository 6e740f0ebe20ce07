"""Test helper: plan one operator for a GPU target and look at what the planner chose."""
from __future__ import annotations

import torch

from opcheck import one_node_graph

from tilefuse.api import orchestrate
from tilefuse.cost.target import Target
from tilefuse.fission import fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.transform.simplify import simplify_graph


def meta(*shape, dtype=torch.float16) -> torch.Tensor:
    """Shape and dtype only: planning never reads values, so no memory is spent."""
    return torch.empty(shape, dtype=dtype, device="meta")


def plan_op(op, inputs, out_shape, attrs=None, *, target="h100", dtype=DType.float16, n_out=1, cuda_graph=False):
    """(plan, coster) of the optimal strategy for a one-operator graph."""
    g = one_node_graph(op, inputs, [TensorType(out_shape, dtype)] * n_out, attrs or {})
    pg = simplify_graph(fission(g))
    plans, coster = orchestrate(pg, Target.get(target), cuda_graph=cuda_graph)
    return plans["optimal"], coster


def chosen(plan, coster, family):
    """The (cost, schedule) of every kernel of ``family`` in the plan."""
    out = [coster.best(k.candidate) for k in plan.kernels]
    return [(c, s) for c, s in out if s.family == family]
