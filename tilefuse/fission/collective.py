"""Fission rules: collectives (``AllReduce``, ``AllGather``, ``ReduceScatter``, ``AllToAll``).

Each is one opaque prim run through torch.distributed's functional collectives (``ir/opaque.py``)
and planned as a kernel of the collective family (``families/collective.py``): a segment boundary
for fusion, costed by the target's interconnect.
"""
from __future__ import annotations

from .registry import rule

_FN = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
       "AllToAll": "all_to_all"}
_ATTRS = {"all_reduce": ("reduce", "group", "group_size"), "all_gather": ("group", "group_size"),
          "reduce_scatter": ("reduce", "group", "group_size"),
          "all_to_all": ("group", "group_size", "output_split_sizes", "input_split_sizes")}


@rule(*_FN)
def _collective(fx, node, ins):
    """One collective over the node's process group: an opaque prim of the collective family."""
    fn = _FN[node.op]
    return fx.opaque(fn, [ins[0]], fx.out_type(), **{k: node.attrs[k] for k in _ATTRS[fn]})
