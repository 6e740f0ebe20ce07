"""ATen converters: indexing (embedding, gather, advanced indexing) and resampling (Resize, GridSample)."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from ...ir.dtypes import DType, TensorType
from .common import bcast_shape, norm_dim
from .emitter import Emitter
from .registry import Converter, converts


@converts("aten.embedding.default")
def _embedding(em, a):
    return em.op("Gather", [a.weight, a.indices], {"axis": 0})


@converts("aten.index_select.default")
def _index_select(em, a):
    return em.op("Gather", [a.self, a.index], {"axis": norm_dim(a.dim, max(em.rank(a.self), 1))})


@converts("aten.gather.default")
def _gather(em, a):
    return em.op("GatherElements", [a.self, a.index], {"axis": norm_dim(a.dim, max(em.rank(a.self), 1))})


def index_tensors(em: Emitter, indices) -> list:
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


def stack_indices(em: Emitter, idx: list, dims: list[int], b: tuple[int, ...]) -> str:
    """The index tensors of ``dims`` broadcast to ``b`` and stacked into (b..., len(dims)): GatherND/ScatterND form."""
    cols = []
    for d in dims:
        i = em.cast(idx[d], DType.int64)
        if em.shape(i) != b:
            i = em.op("Expand", [i], out=TensorType(b, DType.int64))
        cols.append(em.op("Unsqueeze", [i], {"axes": (len(b),)}, TensorType(b + (1,), DType.int64)))
    return em.op("Concat", cols, {"axis": len(b)}, TensorType(b + (len(dims),), DType.int64))


def _index_by_gather_nd(em: Emitter, x: str, idx: list, dims: list[int], b, rest: list[int]) -> str:
    """Index tensors broadcast and stacked into (b..., k); GatherND on x with the indexed dims first."""
    stacked = stack_indices(em, idx, dims, b)
    xt = em.transpose(x, dims + rest)
    out = TensorType(b + tuple(em.shape(x)[d] for d in rest), em.dtype(x))
    return em.op("GatherND", [xt, stacked], {"batch_dims": 0}, out)


@converts("aten.index.Tensor")
def _index(em, a):
    x = a.self
    shape = em.shape(x)
    idx = index_tensors(em, list(a.indices))
    idx += [None] * (len(shape) - len(idx))
    dims = [d for d, i in enumerate(idx) if i is not None]
    b = bcast_shape(*[em.shape(idx[d]) for d in dims])
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
# Resampling.

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


# torch's grid_sampler enums, as GridSample's attribute values.
_GRID_MODES = ("linear", "nearest", "cubic")
_GRID_PADDING = ("zeros", "border", "reflection")


@converts("aten.grid_sampler_2d.default", "aten.grid_sampler_3d.default")
def _grid_sampler(em, a):
    if _GRID_MODES[a.interpolation_mode] == "cubic" and _GRID_PADDING[a.padding_mode] == "border":
        # torch clamps each of the 4 taps, GridSample the coordinate: they differ near the border
        raise em.bad_attr("padding_mode", "border", "bicubic sampling with border padding is not supported")
    return em.op("GridSample", [a.input, em.cast(a.grid, em.dtype(a.input))],
                 {"mode": _GRID_MODES[a.interpolation_mode], "padding_mode": _GRID_PADDING[a.padding_mode],
                  "align_corners": int(a.align_corners)})
