"""torch.distributed's functional collectives (``_c10d_functional``) as canonical collective nodes.

A tensor-parallel model traced by ``torch.compile`` (``torch.distributed.tensor.parallel``) reaches
the backend with ``all_reduce``/``all_gather_into_tensor``/``reduce_scatter_tensor``/
``all_to_all_single`` nodes, each followed by a ``wait_tensor``.  Each becomes one canonical node
(``AllReduce``, ``AllGather``, ``ReduceScatter``, ``AllToAll``) carrying its process group's name
and size; ``wait_tensor`` is the identity (tilefuse's collective kernel waits for its own result).
The group must exist when the graph is converted: its size is read from it.
"""
from __future__ import annotations

from ...ir.dtypes import TensorType
from .registry import converts

# torch.distributed's reduce ops as the functional collectives spell them
REDUCE_OPS = ("sum", "avg", "product", "min", "max")


def _group_size(em, group_name: str, declared: int | None = None) -> int:
    """The process group's size; ``declared``: the size the op was traced with, which must agree."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise em.unsupported("a collective needs torch.distributed's process group, and none is initialized")
    from torch.distributed.distributed_c10d import _resolve_process_group
    try:
        size = _resolve_process_group(group_name).size()
    except (KeyError, ValueError, RuntimeError) as e:
        raise em.bad_attr("group_name", group_name, f"no such process group ({e})") from None
    if declared is not None and int(declared) != size:
        raise em.bad_attr("group_size", declared, f"process group {group_name!r} has {size} ranks")
    return size


def _reduce(em, op: str) -> str:
    op = str(op).lower()
    if op not in REDUCE_OPS:
        raise em.bad_attr("reduce_op", op, f"supported: {', '.join(REDUCE_OPS)}")
    return op


@converts("_c10d_functional.all_reduce.default")
def _all_reduce(em, a):
    size = _group_size(em, a.group_name)
    return em.op("AllReduce", [a.input], {"reduce": _reduce(em, a.reduce_op), "group": a.group_name,
                                          "group_size": size}, em.type(a.input))


@converts("_c10d_functional.all_gather_into_tensor.default")
def _all_gather(em, a):
    size = _group_size(em, a.group_name, a.group_size)
    t = em.type(a.input)
    out = TensorType((t.shape[0] * size, *t.shape[1:]), t.dtype)
    return em.op("AllGather", [a.input], {"group": a.group_name, "group_size": size}, out)


@converts("_c10d_functional.reduce_scatter_tensor.default")
def _reduce_scatter(em, a):
    size = _group_size(em, a.group_name, a.group_size)
    t = em.type(a.input)
    if t.rank == 0 or t.shape[0] % size:
        raise em.bad_attr("group_size", size, f"the first dim ({t.shape[:1]}) must divide evenly")
    out = TensorType((t.shape[0] // size, *t.shape[1:]), t.dtype)
    return em.op("ReduceScatter", [a.input], {"reduce": _reduce(em, a.reduce_op), "group": a.group_name,
                                              "group_size": size}, out)


@converts("_c10d_functional.all_to_all_single.default")
def _all_to_all(em, a):
    size = _group_size(em, a.group_name)
    t = em.type(a.input)
    outs, ins = [int(s) for s in a.output_split_sizes], [int(s) for s in a.input_split_sizes]
    if len(outs) != size or len(ins) != size or sum(ins) != (t.shape[0] if t.rank else 0):
        raise em.bad_attr("split_sizes", (outs, ins), f"one split per rank of {size}, the input's adding up to "
                                                      f"its first dim")
    out = TensorType((sum(outs), *t.shape[1:]), t.dtype)
    return em.op("AllToAll", [a.input], {"group": a.group_name, "group_size": size,
                                         "output_split_sizes": tuple(outs), "input_split_sizes": tuple(ins)}, out)


@converts("_c10d_functional.wait_tensor.default")
def _wait_tensor(em, a):
    return a.tensor         # the collective's kernel returns when its result is there
