"""A canonical operator graph run by eager PyTorch: the outside oracle of the kernel fuzzer
(``tests/test_fuzz.py``).

Every node is computed from its ONNX (opset 21) or extension semantics (``docs/canonical-ops.md``)
with plain torch calls, one node at a time, each result rounded to the node's declared output type,
and nothing here imports tilefuse's fission, prims or reference executor: a fission rule or a
reference that departs from the operator's meaning shows as a difference from this.  The table
``OPS`` holds the operators the fuzzer draws (``tests/strategies.py``); any other raises.

Where torch's eager operator and the canonical semantics differ, the canonical one is written out
(and says why): ONNX's Slice clamping and negative steps, asymmetric pads, empty reductions,
16-bit normalizations computed in fp32 (``stash_type``), attention as torch documents it rather
than as its CPU kernel computes it at non-finite inputs.  Where the meaning itself leaves the
result open (attention over non-finite values its mask drops), ``Undefined`` is raised.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F


class Undefined(Exception):
    """The operators' meaning does not decide the graph's result on these inputs (eager's
    answer is one of its kernels' choices): the case is compared with the reference only."""


def run_eager(graph, feeds: dict) -> list[torch.Tensor]:
    """The graph's outputs on ``feeds`` (name -> tensor), every node by eager torch."""
    env = dict(feeds)
    env.update({c.name: c.data for c in graph.constants})
    for node in graph.nodes:
        fn = OPS.get(node.op)
        if fn is None:
            raise NotImplementedError(f"{node}: no eager oracle for {node.op} (tests/eager.py)")
        ins = [env[i] if i else None for i in node.inputs]
        outs = [graph.types[o] for o in node.outputs]
        got = fn(ins, node.attrs, outs)
        got = got if isinstance(got, (list, tuple)) else [got]
        for name, t, v in zip(node.outputs, outs, got):
            v = v.to(t.dtype.to_torch())
            if tuple(v.shape) != tuple(t.shape):
                raise AssertionError(f"{node}: eager gives {tuple(v.shape)}, the graph declares {t.shape}")
            env[name] = v
    return [env[o] for o in graph.outputs]


def _dt(t) -> torch.dtype:
    return t.dtype.to_torch()


def _wide(x: torch.Tensor) -> torch.Tensor:
    """16-bit floats computed in fp32 (rounded once, to the output type, by ``run_eager``)."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _unary(fn):
    return lambda ins, a, outs: fn(_wide(ins[0]))


def _binary(fn):
    def go(ins, a, outs):
        x, y = ins
        if x.dtype.is_floating_point:
            return fn(_wide(x), _wide(y))
        return fn(x, y)
    return go


def _gelu(ins, a, outs):
    x = _wide(ins[0])
    y = F.gelu(x, approximate=a.get("approximate", "none"))
    # eager's vectorized fp32 CPU kernel gives NaN at +inf; its scalar and fp64 kernels, onnxruntime
    # and the formula x * Phi(x) give +inf (found by the kernel fuzzer, seed 67)
    return torch.where(x == math.inf, x, y)


def _clip(ins, a, outs):
    lo = ins[1] if len(ins) > 1 else None
    hi = ins[2] if len(ins) > 2 else None
    return ins[0] if lo is None and hi is None else torch.clamp(ins[0], lo, hi)


def _hard_sigmoid(ins, a, outs):
    return torch.clamp(a.get("alpha", 0.2) * _wide(ins[0]) + a.get("beta", 0.5), 0, 1)


def _shrink(ins, a, outs):
    x, lambd, bias = _wide(ins[0]), a.get("lambd", 0.5), a.get("bias", 0.0)
    return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, torch.zeros_like(x)))


def _thresholded_relu(ins, a, outs):
    x = _wide(ins[0])       # x > alpha ? x : 0, NaN to 0 (F.threshold keeps NaN)
    return torch.where(x > a.get("alpha", 1.0), x, 0.0)


def _prelu(ins, a, outs):
    x, slope = _wide(ins[0]), _wide(ins[1])
    return torch.where(x < 0, x * slope, x)


def _trilu(ins, a, outs):
    return (torch.triu if a.get("upper", 1) else torch.tril)(ins[0], a.get("k", 0))


def _cast(ins, a, outs):
    return ins[0].to(_dt(outs[0]))


def _where(ins, a, outs):
    return torch.where(ins[0], ins[1], ins[2])


def _axis(a, rank: int, name: str = "axis", default: int = 0) -> int:
    ax = a.get(name, default)
    return ax + rank if ax < 0 else ax


def _shaped(ins, a, outs):           # Reshape, Flatten, Squeeze, Unsqueeze: the output type decides
    return ins[0].reshape(outs[0].shape)


def _transpose(ins, a, outs):
    x = ins[0]
    return x.permute(a.get("perm", tuple(reversed(range(x.dim())))))


def _slice(ins, a, outs):
    x = ins[0]
    for start, end, axis, step in zip(a["starts"], a["ends"], a["axes"], a["steps"]):
        axis = axis + x.dim() if axis < 0 else axis
        n = x.shape[axis]
        start, end = start + n if start < 0 else start, end + n if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), n), min(max(end, 0), n)
        else:               # ONNX: clamped to [0, n - 1] and [-1, n - 1]
            start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
        x = x.index_select(axis, torch.tensor(list(range(start, end, step)), dtype=torch.long))
    return x


def _pad(ins, a, outs):
    x = ins[0]
    pads, mode, r = a["pads"], a.get("mode", "constant"), ins[0].dim()
    for d in range(r):      # negative pads crop first
        lo, hi = max(-pads[d], 0), max(-pads[d + r], 0)
        x = x.narrow(d, lo, x.shape[d] - lo - hi)
    grow = [(max(pads[d], 0), max(pads[d + r], 0)) for d in range(r)]
    if mode == "constant":
        value = ins[1] if len(ins) > 1 and ins[1] is not None else torch.zeros((), dtype=x.dtype)
        for d, (lo, hi) in enumerate(grow):
            shape = list(x.shape)
            parts = []
            for n in (lo, x, hi):
                if isinstance(n, int):
                    shape[d] = n
                    parts.append(value.to(x.dtype).expand(shape))
                else:
                    parts.append(n)
            x = torch.cat(parts, d)
        return x
    # reflect, edge, wrap: numpy.pad's modes (ONNX's reference implementation), on the positions
    idx = np.pad(np.arange(x.numel()).reshape(tuple(x.shape)), grow, mode={"edge": "edge", "reflect": "reflect",
                                                                           "wrap": "wrap"}[mode])
    return x.reshape(-1)[torch.from_numpy(idx.reshape(-1)).long()].reshape(idx.shape)


def _concat(ins, a, outs):
    return torch.cat(ins, _axis(a, ins[0].dim()))


def _split(ins, a, outs):
    return list(torch.split(ins[0], list(a["split"]), _axis(a, ins[0].dim())))


def _expand(ins, a, outs):
    return torch.broadcast_to(ins[0], outs[0].shape)


def _tile(ins, a, outs):
    return ins[0].repeat(a["repeats"]) if ins[0].dim() else ins[0]


def _reduce(kind: str):
    def go(ins, a, outs):
        x = ins[0]
        r = x.dim()
        axes = sorted({ax + r if ax < 0 else ax for ax in a.get("axes", ())}) or list(range(r))
        w = _wide(x)
        if not axes:                # a 0-d input: the reduction of one element
            w = w.reshape(1)
            axes = [0]
        empty = any(w.shape[d] == 0 for d in axes)
        if kind in ("max", "min") and empty:        # the identity of max / min (ONNX opset 18+)
            if x.dtype.is_floating_point:
                fill = -math.inf if kind == "max" else math.inf
            else:
                info = torch.iinfo(x.dtype)
                fill = info.min if kind == "max" else info.max
            shape = [1 if d in axes else n for d, n in enumerate(w.shape)]
            out = torch.full(shape, fill, dtype=w.dtype)
        elif kind == "max":
            out = torch.amax(w, axes, keepdim=True)
        elif kind == "min":
            out = torch.amin(w, axes, keepdim=True)
        elif kind == "sum":
            out = torch.sum(w, axes, keepdim=True)
        elif kind == "mean":
            out = torch.mean(w, axes, keepdim=True)
        elif kind == "prod":
            out = w
            for d in axes:
                out = torch.prod(out, d, keepdim=True)
        elif kind == "sumsquare":
            out = torch.sum(w * w, axes, keepdim=True)
        elif kind == "l1":
            out = torch.sum(w.abs(), axes, keepdim=True)
        elif kind == "l2":
            out = torch.sqrt(torch.sum(w * w, axes, keepdim=True))
        else:                       # logsumexp; over nothing, log(0) = -inf
            out = torch.logsumexp(w, axes, keepdim=True) if not empty else \
                torch.full([1 if d in axes else n for d, n in enumerate(w.shape)], -math.inf)
        return out.reshape(outs[0].shape)
    return go


def _argreduce(largest: bool):
    def go(ins, a, outs):
        x = ins[0]
        ax = _axis(a, x.dim())
        if x.shape[ax] == 0:        # torch refuses; tilefuse too, unless there is no index to give
            return torch.zeros(outs[0].shape, dtype=torch.long)
        if a.get("select_last_index", 0):
            n = x.shape[ax]
            i = n - 1 - (torch.argmax if largest else torch.argmin)(x.flip(ax), ax, keepdim=True)
        else:
            i = (torch.argmax if largest else torch.argmin)(x, ax, keepdim=True)
        return i if a.get("keepdims", 1) else i.squeeze(ax)
    return go


def _softmax(log: bool):
    def go(ins, a, outs):
        x = _wide(ins[0])
        ax = _axis(a, x.dim(), default=-1)
        return torch.log_softmax(x, ax) if log else torch.softmax(x, ax)
    return go


def _layer_norm(ins, a, outs):
    x = _wide(ins[0])
    inner = x.shape[_axis(a, x.dim(), default=-1):]
    scale = _wide(ins[1]) if len(ins) > 1 and ins[1] is not None else None
    bias = _wide(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    return F.layer_norm(x, inner, scale, bias, a.get("epsilon", 1e-5))


def _rms_norm(ins, a, outs):
    x = _wide(ins[0])
    dims = tuple(range(_axis(a, x.dim(), default=-1), x.dim()))
    return x * torch.rsqrt(torch.mean(x * x, dims, keepdim=True) + a.get("epsilon", 1e-5)) * _wide(ins[1])


def _cumulative(fn, identity: float):
    def go(ins, a, outs):
        x = ins[0]
        ax = _axis(a, x.dim())
        w = _wide(x.flip(ax) if a.get("reverse", 0) else x)
        if a.get("exclusive", 0) and w.shape[ax]:   # the elements before each: shifted, not divided out
            w = torch.cat([torch.full_like(w.narrow(ax, 0, 1), identity), w.narrow(ax, 0, w.shape[ax] - 1)], ax)
        s = fn(w, ax)
        return s.flip(ax) if a.get("reverse", 0) else s
    return go


def _group_norm(ins, a, outs):
    """GroupNormalization (opset 21), InstanceNormalization (a group a channel): the textbook form,
    ((x - mean) / sqrt(var + eps)) · scale + bias, in fp32 (F.group_norm folds scale into the
    deviation first, which differs at infinities, and refuses one spatial element)."""
    x, scale, bias = (_wide(t) for t in ins[:3])
    n, c = x.shape[:2]
    groups = a.get("num_groups", c)
    g = x.reshape(n, groups, (c // groups) * math.prod(x.shape[2:]))
    mean = g.mean(-1, keepdim=True)
    var = ((g - mean) ** 2).mean(-1, keepdim=True)
    y = ((g - mean) / torch.sqrt(var + a.get("epsilon", 1e-5))).reshape(x.shape)
    at = (1, c) + (1,) * (x.dim() - 2)
    return y * scale.reshape(at) + bias.reshape(at)


def _pool(kind: str):
    return lambda ins, a, outs: _pooled(kind, _wide(ins[0]), a)


def _pooled(kind: str, x: torch.Tensor, a) -> torch.Tensor:
    """MaxPool / AveragePool with ONNX's asymmetric pads: the input padded explicitly (-inf for
    max, zeros and a count of the window's real elements for average), then pooled unpadded."""
    nsp = x.dim() - 2
    k, s = tuple(a["kernel_shape"]), tuple(a.get("strides", (1,) * nsp))
    pads = a.get("pads", (0,) * 2 * nsp)
    flat = [p for d in reversed(range(nsp)) for p in (pads[d], pads[d + nsp])]     # F.pad's order
    if kind == "max":
        dil = tuple(a.get("dilations", (1,) * nsp))
        pool = F.max_pool1d if nsp == 1 else F.max_pool2d
        return pool(F.pad(x, flat, value=-math.inf), k, s, 0, dil)
    pool = F.avg_pool1d if nsp == 1 else F.avg_pool2d
    total = pool(F.pad(x, flat), k, s, 0)
    if a.get("count_include_pad", 0):
        return total
    real = pool(F.pad(torch.ones_like(x), flat), k, s, 0)
    return total / real


def _matmul(ins, a, outs):
    x, y = ins
    if x.dtype.is_floating_point:
        return torch.matmul(_wide(x), _wide(y))
    # integer products: exact in int64
    return torch.matmul(x.long(), y.long())


def _gemm(ins, a, outs):
    x, w = _wide(ins[0]), _wide(ins[1])
    x = x.t() if a.get("transA", 0) else x
    w = w.t() if a.get("transB", 0) else w
    if len(ins) < 3 or ins[2] is None:
        return a.get("alpha", 1.0) * (x @ w)
    # addmm: a beta of 0 ignores C, its NaN and infinities too
    c = torch.broadcast_to(_wide(ins[2]), (x.shape[0], w.shape[1]))
    return torch.addmm(c, x, w, beta=a.get("beta", 1.0), alpha=a.get("alpha", 1.0))


def _conv(ins, a, outs):
    x, w = _wide(ins[0]), _wide(ins[1])
    nsp = x.dim() - 2
    pads = a.get("pads", (0,) * 2 * nsp)
    flat = [p for d in reversed(range(nsp)) for p in (pads[d], pads[d + nsp])]
    conv = F.conv1d if nsp == 1 else F.conv2d
    bias = _wide(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    return conv(F.pad(x, flat), w, bias, tuple(a.get("strides", (1,) * nsp)), 0,
                tuple(a.get("dilations", (1,) * nsp)), a.get("group", 1))


def _sdpa(ins, a, outs):
    """torch's scaled_dot_product_attention as its documentation writes it out (the math
    backend), in fp32, where eager's CPU kernel has quirks of its own at non-finite inputs (a NaN
    query with no keys makes every head NaN): scores masked (a dropped key's score -inf), softmax,
    times the values; a row whose every score is -inf weighs each key 0 (eager's, since 2.5).
    Undefined (raised) where a row's answer depends on non-finite values the attention should not
    see: a dropped key whose score or value is not finite (eager adds -inf to the score, +inf
    gives NaN, and multiplies the value by its zero weight, inf gives NaN; tilefuse's masks
    select and its flash kernels skip masked blocks), or a row whose every score is -inf with a
    value that is not (0 · inf is NaN in eager; tilefuse's row is 0)."""
    q, k, v = (_wide(t) for t in ins[:3])
    if a.get("enable_gqa", 0):
        k, v = (t.repeat_interleave(q.shape[-3] // t.shape[-3], -3) for t in (k, v))
    scale = a.get("scale")
    scores = (q @ k.transpose(-1, -2)) * (scale if scale is not None else
                                          1 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0)
    keep = torch.ones(scores.shape, dtype=torch.bool)
    mask = ins[3] if len(ins) > 3 else None
    if a.get("is_causal", 0):
        keep = keep & torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    elif mask is not None and mask.dtype == torch.bool:
        keep = keep & mask
    elif mask is not None:
        scores = scores + _wide(mask)
    odd_value = (~torch.isfinite(v)).any(-1)[..., None, :]            # per key, seen from each row
    dropped = (~keep & (~torch.isfinite(scores) | odd_value)).any(-1)
    scores = torch.where(keep, scores, -math.inf)
    dead = (scores == -math.inf).all(-1, keepdim=True)
    if (dropped | (dead[..., 0] & odd_value.any(-1))).any():
        raise Undefined("attention over non-finite values it drops")
    return torch.where(dead, 0.0, torch.softmax(scores, -1)) @ v


def _gather(ins, a, outs):
    x, ind = ins
    ax = _axis(a, x.dim())
    n = x.shape[ax]
    i = torch.where(ind < 0, ind + n, ind).long()
    out = x.index_select(ax, i.reshape(-1))
    return out.reshape(tuple(x.shape[:ax]) + tuple(ind.shape) + tuple(x.shape[ax + 1:]))


def _gather_elements(ins, a, outs):
    x, ind = ins
    ax = _axis(a, x.dim())
    i = torch.where(ind < 0, ind + x.shape[ax], ind).long()
    return torch.gather(x, ax, i)


OPS = {
    "Relu": _unary(torch.relu), "Exp": _unary(torch.exp), "Neg": _unary(torch.neg), "Abs": _unary(torch.abs),
    "Sqrt": _unary(torch.sqrt), "Log": _unary(torch.log), "Tanh": _unary(torch.tanh),
    "Sigmoid": _unary(torch.sigmoid), "Erf": _unary(torch.erf), "Reciprocal": _unary(torch.reciprocal),
    "Floor": _unary(torch.floor), "Sin": _unary(torch.sin), "Sign": _unary(torch.sign), "Gelu": _gelu,
    "Silu": _unary(F.silu), "Softplus": _unary(F.softplus),
    "LeakyRelu": lambda ins, a, outs: F.leaky_relu(_wide(ins[0]), a.get("alpha", 0.01)),
    "Elu": lambda ins, a, outs: F.elu(_wide(ins[0]), a.get("alpha", 1.0)),
    "HardSigmoid": _hard_sigmoid, "Clip": _clip,
    "Mish": _unary(F.mish), "Selu": _unary(F.selu), "Softsign": _unary(F.softsign),
    "HardSwish": _unary(F.hardswish), "Ceil": _unary(torch.ceil), "Round": _unary(torch.round),
    "Celu": lambda ins, a, outs: F.celu(_wide(ins[0]), a.get("alpha", 1.0)),
    "ThresholdedRelu": _thresholded_relu,
    "Shrink": _shrink, "PRelu": _prelu,
    "IsNaN": _unary(torch.isnan), "IsInf": _unary(torch.isinf), "Not": _unary(torch.logical_not),
    "Cast": _cast,
    "Add": _binary(torch.add), "Sub": _binary(torch.sub), "Mul": _binary(torch.mul), "Div": _binary(torch.div),
    "Max": _binary(torch.maximum), "Min": _binary(torch.minimum), "Pow": _binary(torch.pow),
    "Greater": _binary(torch.gt), "Less": _binary(torch.lt), "Equal": _binary(torch.eq),
    "LessOrEqual": _binary(torch.le),
    "And": _binary(torch.logical_and), "Or": _binary(torch.logical_or), "Xor": _binary(torch.logical_xor),
    "Where": _where,
    "Trilu": _trilu, "Transpose": _transpose,
    "Reshape": _shaped, "Flatten": _shaped, "Squeeze": _shaped, "Unsqueeze": _shaped,
    "Slice": _slice, "Pad": _pad, "Concat": _concat, "Split": _split, "Expand": _expand, "Tile": _tile,
    "ReduceSum": _reduce("sum"), "ReduceMax": _reduce("max"), "ReduceMin": _reduce("min"),
    "ReduceMean": _reduce("mean"), "ReduceProd": _reduce("prod"), "ReduceSumSquare": _reduce("sumsquare"),
    "ReduceL1": _reduce("l1"), "ReduceL2": _reduce("l2"), "ReduceLogSumExp": _reduce("logsumexp"),
    "ArgMax": _argreduce(True), "ArgMin": _argreduce(False),
    "Softmax": _softmax(False), "LogSoftmax": _softmax(True),
    "LayerNormalization": _layer_norm, "RMSNormalization": _rms_norm,
    "GroupNormalization": _group_norm, "InstanceNormalization": _group_norm,
    "CumSum": _cumulative(torch.cumsum, 0.0), "CumProd": _cumulative(torch.cumprod, 1.0),
    "MaxPool": _pool("max"), "AveragePool": _pool("average"),
    "MatMul": _matmul, "Gemm": _gemm, "Conv": _conv, "ScaledDotProductAttention": _sdpa,
    "Gather": _gather, "GatherElements": _gather_elements,
}
