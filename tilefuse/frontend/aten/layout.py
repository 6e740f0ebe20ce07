"""ATen converters: casts, copies, views (strided ones too) and other layout operators, and shape-only constants."""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from ...ir.dtypes import TensorType
from .common import norm_dim, norm_dims, py
from .emitter import Emitter, op_name
from .registry import Converter, converts
from .signal import to_pairs


INT64_MAX = 2**63 - 1
INT64_MIN = -2**63


@converts("aten.clone.default", "aten.alias.default", "aten.detach.default", "aten.contiguous.default",
          "aten.lift_fresh_copy.default")
def _identity(em, a):
    """Copies and aliases: the value itself (no node)."""
    return a.self


def _check_inference_dropout(em: Emitter, a) -> None:
    if a.train and a.p:
        raise em.bad_attr("train", True, "dropout in training mode (call model.eval())")


@converts("aten.dropout.default", "aten.feature_dropout.default")
def _dropout(em, a):
    _check_inference_dropout(em, a)
    return a.input


@converts("aten.native_dropout.default")
def _native_dropout(em, a):
    _check_inference_dropout(em, a)
    if 1 in em.used_outputs():
        raise em.unsupported("the dropout mask output is not supported")
    return (a.input, None)


@converts("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
          "aten.type_as.default", "aten._to_dim_order_copy.default")
def _to_copy(em, a):
    if em.fx.meta["val"].is_complex():
        return to_pairs(em, a.self)
    return em.cast(a.self, em.out_type().dtype)


@converts("aten.copy.default")
def _copy(em, a):
    out = em.out_type()
    src = em.cast(a.src, out.dtype)
    if em.shape(src) != out.shape:
        src = em.op("Expand", [src], out=out)
    return src


@converts("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.view_copy.default",
          "aten.flatten.using_ints", "aten.unflatten.int", "aten._reshape_alias.default")
def _reshape(em, a):
    return em.reshape(a.self, em.out_type().shape)


@converts("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")
def _squeeze(em, a):
    shape = em.shape(a.self)
    dims = norm_dims(getattr(a, "dim", None), len(shape)) if len(shape) else ()
    axes = tuple(d for d in dims if shape[d] == 1)
    if not axes:
        return a.self
    return em.op("Squeeze", [a.self], {"axes": axes})


@converts("aten.unsqueeze.default")
def _unsqueeze(em, a):
    d = norm_dim(a.dim, em.rank(a.self) + 1)
    return em.op("Unsqueeze", [a.self], {"axes": (d,)})


@converts("aten.expand.default", "aten.expand_copy.default", "aten.expand_as.default")
def _expand(em, a):
    out = em.out_type()
    if em.shape(a.self) == out.shape:
        return a.self
    return em.op("Expand", [a.self])


@converts("aten.permute.default", "aten.permute_copy.default")
def _permute(em, a):
    r = em.rank(a.self)
    return em.transpose(a.self, [norm_dim(d, r) for d in a.dims])


@converts("aten.transpose.int", "aten.transpose_copy.int")
def _transpose(em, a):
    r = em.rank(a.self)
    perm = list(range(r))
    if r:
        d0, d1 = norm_dim(a.dim0, r), norm_dim(a.dim1, r)
        perm[d0], perm[d1] = perm[d1], perm[d0]
    return em.transpose(a.self, perm)


@converts("aten.t.default", "aten.numpy_T.default")
def _t(em, a):
    return em.transpose(a.self, list(reversed(range(em.rank(a.self)))))


def _slice(em: Emitter, x: str, axes, starts, ends, steps, out: TensorType | None = None) -> str:
    return em.op("Slice", [x], {"starts": tuple(starts), "ends": tuple(ends), "axes": tuple(axes),
                                "steps": tuple(steps)}, out)


@converts("aten.slice.Tensor", "aten.slice_copy.Tensor")
def _slice_tensor(em, a):
    shape = em.shape(a.self)
    d = norm_dim(a.dim, len(shape))
    start = 0 if a.start is None else a.start
    end = INT64_MAX if a.end is None else a.end
    out = em.out_type()
    if a.step == 1 and out.shape == shape:
        return a.self
    return _slice(em, a.self, [d], [start], [min(end, INT64_MAX)], [a.step])


@converts("aten.narrow.default")
def _narrow(em, a):
    shape = em.shape(a.self)
    d = norm_dim(a.dim, len(shape))
    start = norm_dim(a.start, shape[d])
    return _slice(em, a.self, [d], [start], [start + a.length], [1])


@converts("aten.select.int", "aten.select_copy.int")
def _select(em, a):
    shape = em.shape(a.self)
    d = norm_dim(a.dim, len(shape))
    i = norm_dim(a.index, shape[d])
    t = em.type(a.self)
    sl = _slice(em, a.self, [d], [i], [i + 1], [1],
                TensorType(shape[:d] + (1,) + shape[d + 1:], t.dtype))
    return em.op("Squeeze", [sl], {"axes": (d,)})


def _split(em: Emitter, x: str, sizes: Sequence[int], dim: int):
    d = norm_dim(dim, em.rank(x))
    used = em.used_outputs()
    shape = em.shape(x)
    outs = [TensorType(shape[:d] + (s,) + shape[d + 1:], em.dtype(x)) if k in used else None
            for k, s in enumerate(sizes)]
    if len(sizes) == 1:
        return (x,)
    return em.op("Split", [x], {"axis": d, "split": tuple(sizes)}, outs=outs)


@converts("aten.split.Tensor", "aten.split_copy.Tensor")
def _split_tensor(em, a):
    n = em.shape(a.self)[norm_dim(a.dim, em.rank(a.self))]
    sizes = [min(a.split_size, n - s) for s in range(0, n, a.split_size)] or [0]
    return _split(em, a.self, sizes, a.dim)


@converts("aten.split_with_sizes.default", "aten.split_with_sizes_copy.default")
def _split_sizes(em, a):
    return _split(em, a.self, list(a.split_sizes), a.dim)


@converts("aten.chunk.default")
def _chunk(em, a):
    n = em.shape(a.self)[norm_dim(a.dim, em.rank(a.self))]
    size = -(-n // a.chunks)
    return _split(em, a.self, [min(size, n - s) for s in range(0, n, size)], a.dim)


@converts("aten.unbind.int")
def _unbind(em, a):
    shape = em.shape(a.self)
    d = norm_dim(a.dim, len(shape))
    used = em.used_outputs()
    outs = []
    for k in range(shape[d]):
        if k not in used:
            outs.append(None)
            continue
        sl = _slice(em, a.self, [d], [k], [k + 1], [1], TensorType(shape[:d] + (1,) + shape[d + 1:], em.dtype(a.self)))
        outs.append(em.op("Squeeze", [sl], {"axes": (d,)}, TensorType(shape[:d] + shape[d + 1:], em.dtype(a.self))))
    return tuple(outs)


@converts("aten.cat.default", "aten.concat.default")
def _cat(em, a):
    out = em.out_type()
    # Legacy torch accepts 1-D empty tensors of any shape in cat; they contribute nothing.
    xs = [em.cast(x, out.dtype) for x in a.tensors if not (em.shape(x) == (0,) and out.rank != 1)]
    if len(xs) == 1:
        return xs[0]
    return em.op("Concat", xs, {"axis": norm_dim(a.dim, out.rank)})


@converts("aten.stack.default")
def _stack(em, a):
    out = em.out_type()
    d = norm_dim(a.dim, out.rank)
    xs = []
    for x in a.tensors:
        s = em.shape(x)
        xs.append(em.op("Unsqueeze", [em.cast(x, out.dtype)], {"axes": (d,)},
                        TensorType(s[:d] + (1,) + s[d:], out.dtype)))
    return xs[0] if len(xs) == 1 else em.op("Concat", xs, {"axis": d})


def _torch_pads(pad: Sequence[int], rank: int) -> tuple[int, ...]:
    """torch's (last-dim-first begin/end pairs) -> ONNX pads (all begins, then all ends)."""
    begins, ends = [0] * rank, [0] * rank
    for k in range(len(pad) // 2):
        begins[rank - 1 - k] = pad[2 * k]
        ends[rank - 1 - k] = pad[2 * k + 1]
    return tuple(begins + ends)


@converts("aten.constant_pad_nd.default")
def _constant_pad(em, a):
    out = em.out_type()
    pads = _torch_pads(a.pad, em.rank(a.self))
    if not any(pads):
        return a.self
    return em.op("Pad", [a.self, em.scalar(py(a.value, out.dtype), out.dtype)],
                 {"pads": pads, "mode": "constant"})


def _mode_pad(mode: str) -> Converter:
    def convert(em: Emitter, a):
        return em.op("Pad", [a.self], {"pads": _torch_pads(a.padding, em.rank(a.self)), "mode": mode})
    return convert


for _nd in (1, 2, 3):
    converts(f"aten.reflection_pad{_nd}d.default")(_mode_pad("reflect"))
    converts(f"aten.replication_pad{_nd}d.default")(_mode_pad("edge"))


@converts("aten.repeat.default")
def _repeat(em, a):
    reps = tuple(a.repeats)
    x = a.self
    shape = em.shape(x)
    if len(reps) > len(shape):
        x = em.reshape(x, (1,) * (len(reps) - len(shape)) + shape)
    if all(r == 1 for r in reps):
        return x
    return em.op("Tile", [x], {"repeats": reps})


@converts("aten.flip.default")
def _flip(em, a):
    r = em.rank(a.self)
    axes = sorted({norm_dim(d, r) for d in a.dims})
    if not axes:
        return a.self
    return _slice(em, a.self, axes, [-1] * len(axes), [INT64_MIN] * len(axes), [-1] * len(axes))


@converts("aten.tril.default", "aten.triu.default")
def _trilu(em, a):
    upper = int(op_name(em.fx.target).startswith("aten.triu"))
    return em.op("Trilu", [a.self], {"upper": upper, "k": int(a.diagonal)})


# ----------------------------------------------------------------------------------------------
# Constants that depend only on the output's shape.

def _filled(value_of: Callable) -> Converter:
    def convert(em: Emitter, a):
        out = em.out_type()
        return em.const(torch.full(out.shape, value_of(a), dtype=out.dtype.to_torch()), em.fx.name)
    return convert


converts("aten.full_like.default", "aten.new_full.default")(_filled(lambda a: a.fill_value))
converts("aten.zeros_like.default", "aten.new_zeros.default", "aten.empty_like.default",
         "aten.new_empty.default")(_filled(lambda a: 0))
converts("aten.ones_like.default", "aten.new_ones.default")(_filled(lambda a: 1))


# ----------------------------------------------------------------------------------------------
# Strided views: index arithmetic (diagonal) or a gather through constant positions.

@converts("aten.diagonal.default", "aten.diagonal_copy.default")
def _diagonal(em, a):
    """The diagonal as a strided Slice of the two dims flattened (moved last): step n2 + 1."""
    shape = em.shape(a.self)
    d1, d2 = norm_dim(a.dim1, len(shape)), norm_dim(a.dim2, len(shape))
    rest = [d for d in range(len(shape)) if d not in (d1, d2)]
    n2, out = shape[d2], em.out_type()
    flat = em.reshape(em.transpose(a.self, rest + [d1, d2]), tuple(shape[d] for d in rest) + (shape[d1] * n2,))
    start = a.offset if a.offset >= 0 else -a.offset * n2
    end = start + (out.shape[-1] - 1) * (n2 + 1) + 1 if out.shape[-1] else start
    return _slice(em, flat, [len(rest)], [start], [end], [n2 + 1])


def contiguous_base(em: Emitter) -> None:
    """Raise unless the view's base (the first argument) is a contiguous tensor of its own."""
    base = em.fx.args[0].meta.get("val")
    if not base.is_contiguous() or base.storage_offset():
        raise em.unsupported("a strided view of a non-contiguous tensor (its strides address memory "
                             "tilefuse does not model)")


def _gather_positions(em: Emitter, x: str, positions: torch.Tensor) -> str:
    """x read at the row-major element positions of a constant tensor."""
    flat = em.reshape(x, (math.prod(em.shape(x)),))
    return em.op("Gather", [flat, em.const(positions)], {"axis": 0})


@converts("aten.as_strided.default", "aten.as_strided_copy.default")
def _as_strided(em, a):
    contiguous_base(em)
    n = math.prod(em.shape(a.self))
    return _gather_positions(em, a.self, torch.arange(n).as_strided(a.size, a.stride, a.storage_offset or 0))


@converts("aten.unfold.default", "aten.unfold_copy.default")
def _unfold(em, a):
    """Windows of ``size`` every ``step`` along ``dimension``, appended as the last dim."""
    shape = em.shape(a.self)
    if not shape:
        raise em.unsupported("unfold of a 0-d tensor")
    d = norm_dim(a.dimension, len(shape))
    windows = torch.arange(shape[d]).unfold(0, a.size, a.step)
    g = em.op("Gather", [a.self, em.const(windows)], {"axis": d},
              TensorType(shape[:d] + tuple(windows.shape) + shape[d + 1:], em.dtype(a.self)))
    r = len(shape) + 1
    return em.transpose(g, [k for k in range(r) if k != d + 1] + [d + 1])
