"""ATen converters: layer, batch (with running or batch statistics), group and RMS normalization."""
from __future__ import annotations

import torch

from .emitter import Emitter
from .registry import converts


@converts("aten.native_layer_norm.default")
def _layer_norm(em, a):
    used = em.used_outputs()
    outs = [em.out_type(0)] + [em.out_type(k) if k in used else None for k in (1, 2)]
    return em.op("LayerNormalization", [a.input, a.weight, a.bias],
                 {"axis": -len(a.normalized_shape), "epsilon": float(a.eps)}, outs=outs)


@converts("aten.layer_norm.default")
def _layer_norm_as_written(em, a):
    """What ``native_layer_norm``'s first output is, which it decomposes to."""
    return em.op("LayerNormalization", [a.input, a.weight, a.bias],
                 {"axis": -len(a.normalized_shape), "epsilon": float(a.eps)}, outs=[em.out_type(), None, None])[0]


def _per_channel(em: Emitter, x: str, value: float) -> str:
    c = em.shape(x)[1]
    return em.const(torch.full((c,), value, dtype=em.dtype(x).to_torch()))


def _scale_shift(em: Emitter, a) -> tuple[str, str]:
    """A norm's weight and bias, ones and zeros per channel where absent."""
    w = a.weight if a.weight is not None else _per_channel(em, a.input, 1.0)
    b = a.bias if a.bias is not None else _per_channel(em, a.input, 0.0)
    return w, b


@converts("aten._native_batch_norm_legit_no_training.default")
def _batch_norm(em, a):
    if em.used_outputs() - {0}:
        raise em.unsupported("the saved mean/invstd outputs are not supported")
    return (_by_running_stats(em, a), None, None)


def _by_running_stats(em: Emitter, a) -> str:
    w, b = _scale_shift(em, a)
    return em.op("BatchNormalization", [a.input, w, b, a.running_mean, a.running_var],
                 {"epsilon": float(a.eps), "momentum": float(a.momentum)})


@converts("aten.native_batch_norm.default")
def _native_batch_norm(em, a):
    if a.training:
        raise em.bad_attr("training", True, "batch norm in training mode (call model.eval())")
    return _batch_norm(em, a)


@converts("aten.batch_norm.default")
def _batch_norm_as_written(em, a):
    """What it decomposes to: the running statistics where not training, the batch's own where
    there are none (``track_running_stats=False``); training with running statistics updates
    them, which a pure function cannot."""
    if not a.training:
        return _by_running_stats(em, a)
    if a.running_mean is None and a.running_var is None:
        return _by_batch_stats(em, a)
    raise em.bad_attr("training", True, "batch norm in training mode (call model.eval())")


@converts("aten._native_batch_norm_legit.no_stats")
def _batch_stats_norm(em, a):
    """Normalization by the batch's own statistics per channel (instance norm decomposes to it, on
    a batch of one): InstanceNormalization with the batch moved behind the channels."""
    if em.used_outputs() - {0}:
        raise em.unsupported("the saved mean/invstd outputs are not supported")
    return (_by_batch_stats(em, a), None, None)


def _by_batch_stats(em: Emitter, a) -> str:
    x = a.input
    shape = em.shape(x)
    w, b = _scale_shift(em, a)
    perm = [1, 0] + list(range(2, len(shape)))
    moved = x if shape[0] == 1 else em.reshape(em.transpose(x, perm), (1, shape[1], shape[0]) + shape[2:])
    y = em.op("InstanceNormalization", [moved, w, b], {"epsilon": float(a.eps)}, out=em.type(moved))
    if shape[0] != 1:
        y = em.transpose(em.reshape(y, (shape[1], shape[0]) + shape[2:]), perm)
    return y


@converts("aten.native_group_norm.default")
def _group_norm(em, a):
    if em.used_outputs() - {0}:
        raise em.unsupported("the mean/rstd outputs are not supported")
    w, b = _scale_shift(em, a)
    y = em.op("GroupNormalization", [a.input, w, b], {"num_groups": int(a.group), "epsilon": float(a.eps)},
              out=em.out_type(0))
    return (y, None, None)


@converts("aten.rms_norm.default")
def _rms_norm(em, a):
    x = a.input
    t = em.type(x)
    n = len(a.normalized_shape)
    eps = a.eps if a.eps is not None else torch.finfo(t.dtype.to_torch()).eps
    w = a.weight if a.weight is not None else em.const(torch.ones(t.shape[-n:], dtype=t.dtype.to_torch()))
    return em.op("RMSNormalization", [x, w], {"axis": -n, "epsilon": float(eps)})
