"""ATen converters: the scatters functionalization makes of in-place updates.

``x[:, 1:3] = y``, ``x[..., 0] = 0`` and ``x.diagonal().copy_(d)`` reach the frontend as
``slice_scatter``/``select_scatter``/``diagonal_scatter``/``as_strided_scatter``: static
positions, canonical ``SliceScatter``/``DiagonalScatter``/``AsStridedScatter`` (index arithmetic,
``fission/scatter.py``).  ``index_put`` writes through index tensors: ``ScatterND`` (opaque; with
``accumulate`` the reduction "add", which sums duplicate indices), or a ``Where`` when the index
is one boolean mask and the values are the same for every masked element; into a model input the
caller overwrites with the result (a KV cache), ``IndexPut``: written in place at run time.  Without
``accumulate``, duplicate indices keep what torch's CPU ``index_put_`` keeps (the last write);
torch leaves that order undefined on GPUs.
"""
from __future__ import annotations

import torch

from ...ir.dtypes import DType, TensorType
from .common import bcast_shape, norm_dim
from .emitter import Emitter
from .indirect import index_tensors, stack_indices
from .layout import INT64_MAX, contiguous_base
from .registry import converts


def _slice_scatter_op(em: Emitter, x: str, src: str, d: int, start: int, end: int, step: int) -> str:
    return em.op("SliceScatter", [x, em.cast(src, em.dtype(x))],
                 {"starts": (start,), "ends": (min(end, INT64_MAX),), "axes": (d,), "steps": (step,)})


@converts("aten.slice_scatter.default")
def _slice_scatter(em, a):
    d = norm_dim(a.dim, em.rank(a.self))
    start = 0 if a.start is None else a.start
    end = INT64_MAX if a.end is None else a.end
    return _slice_scatter_op(em, a.self, a.src, d, start, end, a.step)


@converts("aten.select_scatter.default")
def _select_scatter(em, a):
    shape = em.shape(a.self)
    d = norm_dim(a.dim, len(shape))
    i = norm_dim(a.index, shape[d])
    src = em.op("Unsqueeze", [a.src], {"axes": (d,)},
                TensorType(shape[:d] + (1,) + shape[d + 1:], em.dtype(a.src)))
    return _slice_scatter_op(em, a.self, src, d, i, i + 1, 1)


@converts("aten.diagonal_scatter.default")
def _diagonal_scatter(em, a):
    r = em.rank(a.self)
    return em.op("DiagonalScatter", [a.self, em.cast(a.src, em.dtype(a.self))],
                 {"offset": int(a.offset), "dim1": norm_dim(a.dim1, r), "dim2": norm_dim(a.dim2, r)})


@converts("aten.as_strided_scatter.default")
def _as_strided_scatter(em, a):
    contiguous_base(em)
    return em.op("AsStridedScatter", [a.self, em.cast(a.src, em.dtype(a.self))],
                 {"size": tuple(a.size), "stride": tuple(a.stride), "storage_offset": int(a.storage_offset or 0)})


# ----------------------------------------------------------------------------------------------
# index_put

def _as_masks(em: Emitter, indices: list) -> list:
    """uint8 indices are (deprecated) masks in torch: as bool."""
    return [em.cast(i, DType.bool) if i is not None and em.dtype(i) is DType.uint8 else i for i in indices]


def _masked_put(em: Emitter, x: str, d0: int, mask: str, values: str, accumulate: bool) -> str | None:
    """``x[.., mask] = values`` as Where(mask, values, x) when every masked element gets the same
    values (values broadcast over the masked count); None when they do not."""
    shape, k = em.shape(x), em.rank(mask)
    after = len(shape) - d0 - k
    vshape = em.shape(values)
    p = len(vshape) - 1 - after           # the values' axis over the masked elements, if any
    if p >= 0 and vshape[p] != 1:
        return None
    dtype = em.dtype(x)
    m = em.reshape(mask, em.shape(mask) + (1,) * after)
    v = em.reshape(values, vshape[:p] + (1,) * k + vshape[p + 1:]) if p >= 0 else values
    if em.rank(v) > len(shape):          # leading 1s torch broadcasting allows
        v = em.reshape(v, em.shape(v)[em.rank(v) - len(shape):])
    if accumulate:
        v = em.op("Add", [x, v], out=TensorType(bcast_shape(shape, em.shape(v)), dtype))
    return em.op("Where", [m, v, x], out=TensorType(shape, dtype))


def _scatter_nd(em: Emitter, x: str, idx: list, values: str, accumulate: bool) -> str:
    """``x[idx] = values`` as ScatterND on x with the indexed dims first (index tensors stacked)."""
    shape = em.shape(x)
    dims = [d for d, i in enumerate(idx) if i is not None]
    rest = [d for d in range(len(shape)) if d not in dims]
    b = bcast_shape(*[em.shape(idx[d]) for d in dims])
    # torch lays the indexed result out as x[idx]: the index dims where the first indexed dim
    # was when the indexed dims are adjacent, in front otherwise; ScatterND wants them in front.
    d0, nb = dims[0], len(b)
    moved = dims == list(range(d0, d0 + len(dims))) and d0 > 0
    lead = tuple(shape[d] for d in rest[:d0]) if moved else ()
    tail = tuple(shape[d] for d in rest[len(lead):])
    target = lead + b + tail
    v = values if em.shape(values) == target else em.op("Expand", [values], out=TensorType(target, em.dtype(x)))
    if moved:
        v = em.transpose(v, list(range(d0, d0 + nb)) + list(range(d0)) + list(range(d0 + nb, len(target))))
    perm = dims + rest
    xt = em.transpose(x, perm)
    out = em.op("ScatterND", [xt, stack_indices(em, idx, dims, b), v], {"reduction": "add" if accumulate else "none"},
                TensorType(em.shape(xt), em.dtype(x)))
    return em.transpose(out, [perm.index(d) for d in range(len(shape))])


@converts("aten.index_put.default", "aten._unsafe_index_put.default")
def _index_put(em, a):
    x = a.self
    values = em.operand(a.values, em.dtype(x))
    idx = _as_masks(em, list(a.indices))
    idx += [None] * (em.rank(x) - len(idx))
    masks = [d for d, i in enumerate(idx) if i is not None and em.dtype(i) is DType.bool]
    if len(masks) == 1 and sum(i is not None for i in idx) == 1:
        out = _masked_put(em, x, masks[0], idx[masks[0]], values, bool(a.accumulate))
        if out is not None:
            return out
    if any(not em.is_const(idx[d]) for d in masks):
        raise em.unsupported("index_put through a boolean mask with one value per masked element (or with "
                             "other indices): how many elements are written depends on data")
    # A constant mask expands to the coordinates of its True elements, one index per dim it covers.
    expanded = index_tensors(em, idx)
    if all(i is None for i in expanded):
        raise em.unsupported("index_put without an index tensor")
    if not a.accumulate and not masks and _written_back(em):
        dims = [d for d, i in enumerate(expanded) if i is not None]
        return em.op("IndexPut", [x, values, *(expanded[d] for d in dims)], {"dims": dims, "inplace": 1},
                     TensorType(em.shape(x), em.dtype(x)))
    return _scatter_nd(em, x, expanded, values, bool(a.accumulate))


def _written_back(em: Emitter) -> bool:
    """The tensor written is a model input that the caller overwrites with the result (a KV cache
    a torch.compile'd graph updates) and nothing else reads: the write may go into its memory,
    touching only the rows it changes (``IndexPut``, ``fission/indirect.py``)."""
    target = em.fx.args[0]
    return target.op == "placeholder" and target in em.updated and len(target.users) == 1


# ----------------------------------------------------------------------------------------------
# In-place forms: the functional form where nothing could see the mutation.

def _unobserved_target(em: Emitter) -> None:
    """Raise unless the tensor written in place is a fresh intermediate nothing reads afterwards."""
    node, target = em.fx, em.fx.args[0]
    if target.op == "placeholder":
        raise em.unsupported("writes into a model input in place; tilefuse compiles pure functions")
    if isinstance(target.target, torch._ops.OpOverload) and target.target.is_view:
        raise em.unsupported(f"writes in place through a view ({target.target}); export the model "
                             f"with torch.export, which functionalizes it into a scatter")
    later, n = set(), node.next
    while n.op != "root":
        later.add(n)
        n = n.next
    if any(u in later for u in target.users):
        raise em.unsupported("the tensor written in place is read again afterwards")


@converts("aten.copy_.default")
def _copy_(em, a):
    _unobserved_target(em)
    out = em.out_type()
    src = em.cast(a.src, out.dtype)
    return src if em.shape(src) == out.shape else em.op("Expand", [src], out=out)


@converts("aten.index_put_.default")
def _index_put_(em, a):
    _unobserved_target(em)
    return _index_put(em, a)


# ----------------------------------------------------------------------------------------------
# scatter along a dim: ScatterElements (opaque, torch scatter)

# torch's scatter_reduce modes as ScatterElements reductions ("mean" has none).
_REDUCE = {"sum": "add", "prod": "mul", "amax": "max", "amin": "min"}


def _scatter_elements(em: Emitter, a, updates, reduction: str) -> str:
    x, index = a.self, a.index
    out = TensorType(em.shape(index), em.dtype(x))
    if isinstance(updates, str) and em.shape(updates) != out.shape:   # torch reads src[:index.shape] only
        updates = em.op("Slice", [updates], {"starts": (0,) * out.rank, "ends": out.shape,
                                              "axes": tuple(range(out.rank)), "steps": (1,) * out.rank}, out)
    upd = em.operand(updates, out.dtype)
    if em.shape(upd) != out.shape:
        upd = em.op("Expand", [upd], out=out)
    return em.op("ScatterElements", [x, index, upd], {"axis": norm_dim(a.dim, max(em.rank(x), 1)),
                                                      "reduction": reduction})


@converts("aten.scatter.src", "aten.scatter.value")
def _scatter(em, a):
    return _scatter_elements(em, a, a.src if hasattr(a, "src") else a.value, "none")


@converts("aten.scatter_add.default")
def _scatter_add(em, a):
    return _scatter_elements(em, a, a.src, "add")


@converts("aten.scatter_reduce.two")
def _scatter_reduce(em, a):
    if a.reduce not in _REDUCE:
        raise em.bad_attr("reduce", a.reduce, f"supported: {', '.join(_REDUCE)}")
    if not a.include_self:
        raise em.bad_attr("include_self", False, "only include_self=True is supported")
    return _scatter_elements(em, a, a.src, _REDUCE[a.reduce])
