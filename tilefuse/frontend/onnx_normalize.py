"""Normalization of ONNX nodes (opsets 6-21 and later) to the canonical op set.

Two steps per node: parameter inputs listed in ``LIFT`` become attributes named after the input
(they must be constants), then the operator's rule in ``RULES`` (if any) rewrites what changed
across opsets; everything else passes through with its attributes.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import onnx
import torch

from ..errors import UnsupportedAttribute, UnsupportedOperator
from ..ir.dtypes import DType
from .onnx_fold import np_dtype

_REDUCES = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
            "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")

# op -> ((input index, attribute name, kind), ...).  The inputs are removed from Node.inputs.
LIFT: dict[str, tuple[tuple[int, str, str], ...]] = {
    **{op: ((1, "axes", "ints"),) for op in _REDUCES},
    "Squeeze": ((1, "axes", "ints"),),
    "Unsqueeze": ((1, "axes", "ints"),),
    "Slice": ((1, "starts", "ints"), (2, "ends", "ints"), (3, "axes", "ints"), (4, "steps", "ints")),
    "Pad": ((1, "pads", "ints"), (3, "axes", "ints")),
    "Split": ((1, "split", "ints"),),
    "Tile": ((1, "repeats", "ints"),),
    "TopK": ((1, "k", "int"),),
    "Reshape": ((1, "shape", "ints"),),
    "Expand": ((1, "shape", "ints"),),
    "Resize": ((1, "roi", "floats"), (2, "scales", "floats"), (3, "sizes", "ints")),
    "Upsample": ((1, "scales", "floats"),),
    "Dropout": ((1, "ratio", "float"), (2, "training_mode", "int")),
    "CumSum": ((1, "axis", "int"),),
    "CumProd": ((1, "axis", "int"),),
    "Trilu": ((1, "k", "int"),),
    "OneHot": ((1, "depth", "int"),),
    "CenterCropPad": ((1, "shape", "ints"),),
    "Col2Im": ((1, "image_shape", "ints"), (2, "block_shape", "ints")),
    "DFT": ((1, "dft_length", "int"), (2, "axis", "int")),
    "STFT": ((1, "frame_step", "int"), (3, "frame_length", "int")),
    "AffineGrid": ((1, "size", "ints"),),
    "MaxUnpool": ((2, "output_shape", "ints"),),
}

# Older layouts of the same parameters: (op, since_version) -> spec.
_LIFT_BEFORE = {("Resize", 10): ((1, "scales", "floats"),)}


def lift_spec(op: str, since: int) -> tuple[tuple[int, str, str], ...]:
    """Which inputs of op (at the schema version since) are parameters."""
    return _LIFT_BEFORE.get((op, since), LIFT.get(op, ()))


_CONVERT = {"ints": lambda a: tuple(int(v) for v in a.reshape(-1)),
            "floats": lambda a: tuple(float(v) for v in a.reshape(-1)),
            "int": lambda a: int(a.reshape(-1)[0]),
            "float": lambda a: float(a.reshape(-1)[0])}

# Attributes of old opsets that mean nothing for inference.
_LEGACY_ATTRS = ("consumed_inputs", "is_test")

RULES: dict[str, Callable] = {}


def rule(*ops: str):
    def deco(fn):
        for op in ops:
            RULES[op] = fn
        return fn
    return deco


def check_params(cx, n) -> None:
    """Raise for a parameter input computed at run time (before anything needs its value)."""
    for idx, name, _ in lift_spec(n.op, n.since):
        cx.param(n, idx, name)


def normalize(cx, n) -> None:
    """Emit the canonical node(s) for the ONNX node n (its outputs are typed)."""
    for a in _LEGACY_ATTRS:
        n.attrs.pop(a, None)
    lifted = lift_spec(n.op, n.since)
    for idx, name, kind in lifted:
        v = cx.param(n, idx, name)
        if v is not None:
            n.attrs[name] = _CONVERT[kind](np.asarray(v))
    drop = {idx for idx, _, _ in lifted}
    n.inputs = [x for k, x in enumerate(n.inputs) if k not in drop]
    fn = RULES.get(n.op)
    if fn is None:
        cx.emit(n, n.op, n.inputs, n.outputs, n.attrs)
    else:
        fn(cx, n)


def _rank(cx, name: str) -> int:
    return len(cx.shape(name))


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _scalar_const(cx, n, value: float, like: str) -> str:
    dt = np_dtype(cx.vtype(like)[1])
    return cx.new_const(f"{n.name}_value", np.array(value, dtype=dt))


def _reshaped(cx, n, x: str, shape) -> str:
    """x reshaped (a new constant when x is one, else a Reshape node)."""
    shape = tuple(int(d) for d in shape)
    if x in cx.consts:
        return cx.new_const(x, cx.consts[x].reshape(shape))
    v = cx.new_value(x, shape, cx.vtype(x)[1])
    cx.emit(n, "Reshape", [x], [v])
    return v


# ---------------------------------------------------------------------- rules
# Reductions whose no-op (empty axes, noop_with_empty_axes=1) is the input itself; the others still
# apply their per-element part (|x|, x², sqrt(x²), log x), as onnxruntime and onnx's reference do.
_NOOP_IS_IDENTITY = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceLogSumExp"}


@rule(*_REDUCES)
def _reduce(cx, n):
    if not n.attrs.get("axes"):
        n.attrs.pop("axes", None)
        if n.attrs.get("noop_with_empty_axes", 0):
            if n.op in _NOOP_IS_IDENTITY:
                return cx.emit(n, "Identity", n.inputs[:1], n.outputs)
            return cx.emit(n, n.op, n.inputs[:1], n.outputs, n.attrs)
    n.attrs.pop("noop_with_empty_axes", None)
    cx.emit(n, n.op, n.inputs, n.outputs, n.attrs)


@rule("Softmax", "LogSoftmax", "Hardmax")
def _softmax(cx, n):
    """Before opset 13 these flatten the input to 2-D at ``axis`` (default 1)."""
    if n.since >= 13:
        return cx.emit(n, n.op, n.inputs, n.outputs, n.attrs)
    x, y = n.inputs[0], n.outputs[0]
    shape = cx.shape(x)
    axis = _axis(n.attrs.get("axis", 1), len(shape))
    if axis >= len(shape) - 1 or all(d == 1 for d in shape[axis:-1]):
        return cx.emit(n, n.op, [x], [y], {"axis": -1})
    flat = (math.prod(shape[:axis]), math.prod(shape[axis:]))
    x2 = _reshaped(cx, n, x, flat)
    y2 = cx.new_value(y, flat, cx.vtype(y)[1])
    cx.emit(n, n.op, [x2], [y2], {"axis": -1})
    cx.emit(n, "Reshape", [y2], [y])


@rule("Squeeze")
def _squeeze(cx, n):
    if "axes" not in n.attrs:
        n.attrs["axes"] = tuple(k for k, d in enumerate(cx.shape(n.inputs[0])) if d == 1)
    cx.emit(n, n.op, n.inputs, n.outputs, n.attrs)


@rule("DFT")
def _dft(cx, n):
    """Opset 17's axis attribute defaults to 1, opset 20's axis input to -2: made explicit."""
    n.attrs.setdefault("axis", 1 if n.since < 20 else -2)
    cx.emit(n, n.op, n.inputs, n.outputs, n.attrs)


@rule("RoiAlign")
def _roi_align(cx, n):
    """Opset 10 has no coordinate_transformation_mode: its boxes are 'output_half_pixel'."""
    n.attrs.setdefault("coordinate_transformation_mode", "output_half_pixel" if n.since < 16 else "half_pixel")
    cx.emit(n, n.op, n.inputs, n.outputs, n.attrs)


@rule("Slice")
def _slice(cx, n):
    count = len(n.attrs["starts"])
    n.attrs.setdefault("axes", tuple(range(count)))
    n.attrs.setdefault("steps", (1,) * count)
    cx.emit(n, n.op, n.inputs, n.outputs, n.attrs)


@rule("Pad")
def _pad(cx, n):
    a = n.attrs
    x = n.inputs[0]
    rank = _rank(cx, x)
    pads = a.pop("pads", None) or a.pop("paddings", None)
    if pads is None:
        raise UnsupportedOperator(n, "pads are missing")
    axes = a.pop("axes", None)
    if axes is not None:
        full = [0] * (2 * rank)
        for k, ax in enumerate(axes):
            ax = _axis(ax, rank)
            full[ax], full[rank + ax] = pads[k], pads[len(axes) + k]
        pads = tuple(full)
    inputs = list(n.inputs)
    value = a.pop("value", 0.0)
    if n.since < 11 and value != 0.0 and a.get("mode", "constant") == "constant":
        inputs = [x, _scalar_const(cx, n, value, x)]
    cx.emit(n, "Pad", inputs, n.outputs, {**a, "pads": tuple(pads)})


@rule("Clip")
def _clip(cx, n):
    """Before opset 11 min and max are attributes.  An omitted bound of a float Clip is the type's
    lowest (largest) finite value, as the spec says and onnxruntime does: -inf becomes lowest()
    (the canonical Clip's omitted bound is no bound, as torch.clamp's)."""
    x = n.inputs[0]
    if n.since >= 11:
        given = list(n.inputs[1:3]) + [""] * (3 - len(n.inputs))
    else:
        given = [_scalar_const(cx, n, n.attrs[k], x) if k in n.attrs else "" for k in ("min", "max")]
    dt = DType.from_onnx(cx.vtype(x)[1])
    if dt.is_float:
        top = float(torch.finfo(dt.to_torch()).max)
        given = [b or _scalar_const(cx, n, sign * top, x) for b, sign in zip(given, (-1, 1))]
    while given and not given[-1]:
        given.pop()
    cx.emit(n, "Clip", [x, *given], n.outputs)


@rule("Sign")
def _sign(cx, n):
    """ONNX's Sign of NaN is NaN (onnxruntime, numpy); the canonical Sign is torch's, which gives 0."""
    x, = n.inputs
    shape, elem = cx.vtype(x)
    if not DType.from_onnx(elem).is_float:
        return cx.emit(n, "Sign", [x], n.outputs)
    sign = cx.new_value(f"{n.name}_sign", shape, elem)
    nan = cx.new_value(f"{n.name}_isnan", shape, onnx.TensorProto.BOOL)
    cx.emit(n, "Sign", [x], [sign])
    cx.emit(n, "IsNaN", [x], [nan])
    cx.emit(n, "Where", [nan, x, sign], n.outputs)


@rule("Split")
def _split(cx, n):
    """Sizes always explicit, read off the (inferred) output types."""
    x = n.inputs[0]
    rank = _rank(cx, x)
    axis = n.attrs.get("axis", 0)
    sizes = tuple(cx.shape(o)[_axis(axis, rank)] for o in n.outputs)
    cx.emit(n, "Split", [x], n.outputs, {"axis": axis, "split": sizes})


@rule("Reshape", "Expand", "Flatten")
def _by_type(cx, n):
    """The output type says it all."""
    attrs = {"axis": n.attrs["axis"]} if n.op == "Flatten" and "axis" in n.attrs else {}
    cx.emit(n, n.op, n.inputs[:1], n.outputs, attrs)


@rule("Tile")
def _tile(cx, n):
    if n.since < 6:
        raise UnsupportedOperator(n, "the opset-1 form (tiles, axis inputs) is not supported")
    cx.emit(n, n.op, n.inputs, n.outputs, n.attrs)


@rule("Resize", "Upsample")
def _resize(cx, n):
    """Scales per axis (from scales, or sizes / input dims); defaults made explicit."""
    a = n.attrs
    x = n.inputs[0]
    shape = cx.shape(x)
    rank = len(shape)
    legacy = n.op == "Upsample" or n.since < 11
    mode = {"bilinear": "linear", "trilinear": "linear"}.get(a.get("mode", "nearest"), a.get("mode", "nearest"))
    axes = [_axis(v, rank) for v in a.get("axes", range(rank))]
    scales = [1.0] * rank
    if a.get("scales"):
        for ax, s in zip(axes, a["scales"]):
            scales[ax] = float(s)
    elif a.get("sizes"):
        sizes = dict(zip(axes, a["sizes"]))
        ratio = {ax: sizes[ax] / shape[ax] for ax in axes}
        policy = a.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            ratio = dict.fromkeys(axes, pick(ratio.values()))
        for ax in axes:
            scales[ax] = float(ratio[ax])
    else:
        raise UnsupportedOperator(n, "neither scales nor sizes is given")
    out = {"scales": tuple(scales), "mode": mode,
           "coordinate_transformation_mode": "asymmetric" if legacy else a.get("coordinate_transformation_mode",
                                                                                  "half_pixel"),
           "nearest_mode": "floor" if legacy else a.get("nearest_mode", "round_prefer_floor"),
           "cubic_coeff_a": a.get("cubic_coeff_a", -0.75), "exclude_outside": a.get("exclude_outside", 0),
           "extrapolation_value": a.get("extrapolation_value", 0.0), "antialias": a.get("antialias", 0)}
    if out["coordinate_transformation_mode"] == "tf_crop_and_resize":
        roi = list(a.get("roi", ()))
        if len(roi) != 2 * len(axes):
            raise UnsupportedOperator(n, "tf_crop_and_resize needs a constant roi")
        full = [0.0] * rank + [1.0] * rank
        for k, ax in enumerate(axes):
            full[ax], full[rank + ax] = roi[k], roi[len(axes) + k]
        out["roi"] = tuple(full)
    cx.emit(n, "Resize", [x], n.outputs, out)


@rule("Dropout")
def _dropout(cx, n):
    """Inference (or training with ratio 0): the identity; the mask output (if used) is all true."""
    if n.attrs.get("training_mode", 0) and n.attrs.get("ratio", 0.5) != 0:
        raise UnsupportedAttribute(n, "training_mode", 1, "training-mode dropout (random) is not supported")
    x, y = n.inputs[0], n.outputs[0]
    if len(n.outputs) > 1 and n.outputs[1]:
        shape, elem = cx.known[n.outputs[1]]
        cx._set_const(n.outputs[1], np.ones(shape, dtype=np_dtype(elem)))
    if y:
        cx.emit(n, "Dropout", [x], [y])


@rule("BatchNormalization")
def _batchnorm(cx, n):
    """Inference form: (X, scale, B, mean, var) -> Y with ``epsilon``."""
    if n.attrs.get("training_mode", 0):
        return _batchnorm_training(cx, n, n.attrs.get("epsilon", 1e-5), n.attrs.get("momentum", 0.9))
    if any(n.outputs[1:]):
        raise UnsupportedOperator(n, "the training outputs (running/saved mean and variance) are not supported")
    eps = n.attrs.get("epsilon", 1e-5)
    if n.since < 9 and n.attrs.get("spatial", 1) == 0:
        return _batchnorm_per_element(cx, n, eps)
    cx.emit(n, "BatchNormalization", n.inputs[:5], n.outputs[:1], {"epsilon": eps})


def _batchnorm_training(cx, n, eps: float, momentum: float):
    """Training mode (opset 14+): normalized by the batch's statistics (mean and population variance
    over every axis but the channels), the running statistics updated by ``momentum``."""
    x, scale, bias, mean, var = n.inputs[:5]
    shape, elem = cx.vtype(x)
    axes = tuple(k for k in range(len(shape)) if k != 1)
    kept = tuple(1 if k != 1 else d for k, d in enumerate(shape))

    def node(op, ins, out_shape, **attrs):
        v = cx.new_value(f"{n.name}_{op.lower()}", out_shape, elem)
        cx.emit(n, op, ins, [v], attrs)
        return v
    batch_mean = node("ReduceMean", [x], kept, axes=axes, keepdims=1)
    centered = node("Sub", [x, batch_mean], shape)
    batch_var = node("ReduceMean", [node("Mul", [centered, centered], shape)], kept, axes=axes, keepdims=1)
    stats = [_reshaped(cx, n, v, (shape[1],)) for v in (batch_mean, batch_var)]
    if n.outputs[0]:
        cx.emit(n, "BatchNormalization", [x, scale, bias, *stats], n.outputs[:1], {"epsilon": eps})
    for out, old, new in zip(n.outputs[1:3], (mean, var), stats):
        if out:
            keep = node("Mul", [old, _scalar_const(cx, n, momentum, old)], (shape[1],))
            cx.emit(n, "Add", [keep, node("Mul", [new, _scalar_const(cx, n, 1 - momentum, new)], (shape[1],))],
                    [out])


def _batchnorm_per_element(cx, n, eps: float):
    """spatial=0: statistics per (C, D1, ...) element, folded into a multiply-add."""
    x, scale, bias, mean, var = n.inputs[:5]
    vals = [cx.param(n, k, "per-element statistics") for k in range(1, 5)]
    s, b, m, v = (np.asarray(t, dtype=np.float64) for t in vals)
    mul = s / np.sqrt(v + eps)
    add = b - m * mul
    dt = cx.consts[scale].dtype
    y = n.outputs[0]
    t = cx.new_value(y, cx.shape(x), cx.vtype(x)[1])
    cx.emit(n, "Mul", [x, cx.new_const(f"{n.name}_mul", mul.astype(dt))], [t])
    cx.emit(n, "Add", [t, cx.new_const(f"{n.name}_add", add.astype(dt))], [y])


_LEGACY_BROADCAST = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"})


@rule(*_LEGACY_BROADCAST)
def _binary(cx, n):
    """Before opset 7, ``broadcast=1`` aligns B with A starting at ``axis`` (not numpy's rule)."""
    a = n.attrs
    if n.since < 7 and a.pop("broadcast", 0):
        ra, rb = _rank(cx, n.inputs[0]), _rank(cx, n.inputs[1])
        axis = _axis(a.pop("axis", ra - rb), ra)
        trailing = ra - axis - rb
        if trailing > 0:
            b = n.inputs[1]
            n.inputs = [n.inputs[0], _reshaped(cx, n, b, cx.shape(b) + (1,) * trailing)]
    a.pop("axis", None)
    a.pop("broadcast", None)
    cx.emit(n, n.op, n.inputs, n.outputs, a)


@rule("PRelu")
def _prelu(cx, n):
    """Before opset 7 a 1-D slope is per channel (axis 1), not numpy-broadcast."""
    x, slope = n.inputs[:2]
    xs, ss = cx.shape(x), cx.shape(slope)
    if n.since < 7 and len(ss) == 1 and len(xs) > 2 and ss[0] == xs[1] and ss[0] != 1:
        slope = _reshaped(cx, n, slope, (ss[0],) + (1,) * (len(xs) - 2))
    cx.emit(n, "PRelu", [x, slope], n.outputs)


@rule("Gemm")
def _gemm(cx, n):
    n.attrs.pop("broadcast", None)
    cx.emit(n, n.op, n.inputs, n.outputs, n.attrs)


@rule("Concat")
def _concat(cx, n):
    n.attrs.setdefault("axis", 1)   # only opset 1 lets it be omitted
    cx.emit(n, n.op, n.inputs, n.outputs, n.attrs)


@rule("Cast", "CastLike")
def _cast(cx, n):
    if n.op == "CastLike":
        to = cx.vtype(n.inputs[1])[1]
    else:
        to = n.attrs["to"]
        if isinstance(to, str):   # opset 1: the type's name
            to = onnx.TensorProto.DataType.Value(to.upper())
    try:
        DType.from_onnx(to)
    except TypeError:
        raise UnsupportedAttribute(n, "to", onnx.TensorProto.DataType.Name(to).lower(),
                                   "tilefuse does not support this element type") from None
    cx.emit(n, "Cast", n.inputs[:1], n.outputs, {"to": to})


@rule("Scatter")
def _scatter(cx, n):
    """Deprecated alias of ScatterElements."""
    cx.emit(n, "ScatterElements", n.inputs, n.outputs, n.attrs)


@rule("Compress")
def _compress(cx, n):
    """With a constant condition: a Gather of the selected positions."""
    x, y = n.inputs[0], n.outputs[0]
    cond = np.asarray(cx.param(n, 1, "condition")).astype(bool).reshape(-1)
    axis = n.attrs.get("axis")
    if axis is None:
        x = _reshaped(cx, n, x, (math.prod(cx.shape(x)),))
        axis = 0
    dim = cx.shape(x)[_axis(axis, _rank(cx, x))]
    idx = np.nonzero(cond[:dim])[0].astype(np.int64)
    cx.emit(n, "Gather", [x, cx.new_const(f"{n.name}_indices", idx)], [y], {"axis": axis})


@rule("GroupNormalization")
def _groupnorm(cx, n):
    """Opset 18 has one scale and bias per group; opset 21 one per channel."""
    if n.since >= 21:
        return cx.emit(n, n.op, n.inputs, n.outputs, n.attrs)
    x = n.inputs[0]
    channels, groups = cx.shape(x)[1], n.attrs["num_groups"]
    ins = [x] + [_per_channel(cx, n, v, groups, channels // groups) for v in n.inputs[1:3]]
    cx.emit(n, n.op, ins, n.outputs, n.attrs)


def _per_channel(cx, n, v: str, groups: int, size: int) -> str:
    """Each group's value repeated for the group's channels."""
    if v in cx.consts:
        return cx.new_const(v, np.repeat(cx.consts[v], size))
    elem = cx.vtype(v)[1]
    col = _reshaped(cx, n, v, (groups, 1))
    wide = cx.new_value(v, (groups, size), elem)
    cx.emit(n, "Expand", [col], [wide])
    return _reshaped(cx, n, wide, (groups * size,))


@rule("ConstantOfShape")
def _constant_of_shape(cx, n):
    """Reached only when folding would create a huge constant: an Expand of the scalar value."""
    shape, elem = cx.known[n.outputs[0]]
    value = n.attrs.get("value", np.zeros(1, dtype=np.float32))
    scalar = cx.new_const(f"{n.name}_value", np.asarray(value).reshape(1).astype(np_dtype(elem)))
    cx.emit(n, "Expand", [scalar], n.outputs)


_POOLS = frozenset({"Conv", "MaxPool", "AveragePool", "LpPool"})


@rule(*_POOLS)
def _pool(cx, n):
    """auto_pad resolved to explicit pads (the output type fixes the rest)."""
    auto = n.attrs.pop("auto_pad", "NOTSET")
    if auto not in ("NOTSET", ""):
        n.attrs["pads"] = _auto_pads(cx, n, auto)
    cx.emit(n, n.op, n.inputs, n.outputs, n.attrs)


def _auto_pads(cx, n, auto: str) -> tuple[int, ...]:
    spatial = cx.shape(n.inputs[0])[2:]
    k = n.attrs.get("kernel_shape") or cx.shape(n.inputs[1])[2:]
    strides = n.attrs.get("strides", (1,) * len(spatial))
    dil = n.attrs.get("dilations", (1,) * len(spatial))
    if auto == "VALID":
        return (0,) * (2 * len(spatial))
    begins, ends = [], []
    for d, (size, kk, s, dl) in enumerate(zip(spatial, k, strides, dil)):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (kk - 1) * dl + 1 - size)
        small, big = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else big)
        ends.append(total - begins[-1])
    return tuple(begins + ends)


@rule("TopK")
def _topk(cx, n):
    if "k" not in n.attrs:
        raise UnsupportedOperator(n, "k is missing")
    cx.emit(n, n.op, n.inputs, n.outputs, n.attrs)

