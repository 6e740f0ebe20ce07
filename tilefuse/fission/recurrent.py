"""Fission rules: recurrent layers (RNN, GRU, LSTM), unrolled over their static sequence length.

The input projection of every step is one contraction ``X · Wᵀ`` over the whole sequence; each step
then adds the recurrent contraction ``H_{t-1} · Rᵀ`` and applies the gates elementwise (one prim per
new state).  ``sequence_lens`` masks the steps past a batch entry's length: the state is carried
and the output is zero there.  Outputs are stacked from the per-step states by nested selects
(as Concat is).  Unrolling makes the prim count linear in the sequence length: right for the short
fixed sequences of exported inference graphs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import UnsupportedAttribute
from ..ir.dtypes import DType
from ..ir.expr import Const, Expr, cast, maximum, minimum, select, unary
from ..ir.graph import Node
from .common import acc_dtype
from .elementwise import hard_sigmoid, softplus
from .registry import Fission, TensorRef, rule

# activation -> (fn(x, alpha, beta), default alpha, default beta)
ACTIVATIONS: dict[str, tuple[Callable[[Expr, float, float], Expr], float, float]] = {
    "Sigmoid": (lambda x, a, b: unary("sigmoid", x), 0.0, 0.0),
    "Tanh": (lambda x, a, b: unary("tanh", x), 0.0, 0.0),
    "Relu": (lambda x, a, b: maximum(x, 0.0), 0.0, 0.0),
    "Affine": (lambda x, a, b: x * a + b, 1.0, 0.0),
    "LeakyRelu": (lambda x, a, b: select(x.lt(0.0), x * a, x), 0.01, 0.0),
    "ThresholdedRelu": (lambda x, a, b: select(x.gt(a), x, Const(0.0, x.dtype)), 1.0, 0.0),
    "ScaledTanh": (lambda x, a, b: unary("tanh", x * b) * a, 1.0, 1.0),
    "HardSigmoid": (lambda x, a, b: hard_sigmoid(x, a, b), 0.2, 0.5),
    "Elu": (lambda x, a, b: select(x.lt(0.0), (unary("exp", x) - 1.0) * a, x), 1.0, 0.0),
    "Softsign": (lambda x, a, b: x / (unary("abs", x) + 1.0), 0.0, 0.0),
    "Softplus": (lambda x, a, b: softplus(x), 0.0, 0.0),
}

# op -> (gates, default activations per direction)
CELLS = {"RNN": (1, ("Tanh",)), "GRU": (3, ("Sigmoid", "Tanh")), "LSTM": (4, ("Sigmoid", "Tanh", "Tanh"))}
DIRECTIONS = {"forward": (False,), "reverse": (True,), "bidirectional": (False, True)}


@dataclass
class Layer:
    """What every step of one direction reads."""
    d: int                      # direction index in W, R, B, ...
    xw: TensorRef               # [S, B, gates*H]: X · Wᵀ for every step
    r: TensorRef                # R
    bias: TensorRef | None      # B: [D, 2·gates·H]
    peep: TensorRef | None      # P (LSTM): [D, 3H]
    acts: list[Callable[[Expr], Expr]]
    clip: float | None
    hidden: int
    ft: DType

    def gate(self, t: int, g: int, i: tuple, rec: Expr | None) -> Expr:
        """Pre-activation of gate g at [batch, j]: input projection, input bias, and (when given)
        the recurrent term with its bias."""
        h, b, j = self.hidden, i[0], i[1]
        v = cast(self.xw[(t, b, g * h + j)], self.ft)
        if self.bias is not None:
            v = v + cast(self.bias[(self.d, g * h + j)], self.ft)
        if rec is not None:
            v = v + cast(rec, self.ft) + self.rbias(g, j)
        return v

    def rbias(self, g: int, j: Expr) -> Expr | float:
        if self.bias is None:
            return 0.0
        return cast(self.bias[(self.d, self.bias.shape[1] // 2 + g * self.hidden + j)], self.ft)

    def rec(self, ref: TensorRef, g: int, i: tuple) -> Expr:
        """The recurrent term of gate g from a [B, gates·H] contraction."""
        return ref[(i[0], g * self.hidden + i[1])]

    def act(self, k: int, v: Expr, clip: bool = True) -> Expr:
        """Activation k; ``clip`` bounds its input (gate pre-activations, not LSTM's cell state)."""
        if clip and self.clip is not None:
            v = minimum(maximum(v, -self.clip), self.clip)
        return self.acts[k](v)


def _recurrent(fx: Fission, layer: Layer, h: TensorRef, rows: range) -> TensorRef:
    """[B, len(rows)]: H · R[d, rows]ᵀ."""
    batch, hid = h.shape
    return fx.reduce((batch, len(rows)), (hid,), "sum",
                     lambda i, r: cast(h[(i[0], r[0])], layer.ft) * cast(layer.r[(layer.d, rows.start + i[1], r[0])],
                                                                        layer.ft))


def _carry(new: Expr, old: Expr, valid: Expr | None) -> Expr:
    return new if valid is None else select(valid, new, old)


def _rnn_step(fx, node, layer, t, h, c, valid):
    rec = _recurrent(fx, layer, h, range(0, layer.hidden))
    h_new = fx.compute(h.shape, lambda i: cast(_carry(layer.act(0, layer.gate(t, 0, i, layer.rec(rec, 0, i))),
                                                      cast(h[i], layer.ft), valid(i)), h.dtype))
    return h_new, None


def _gru_step(fx, node, layer, t, h, c, valid):
    hid, ft = layer.hidden, layer.ft
    zr = _recurrent(fx, layer, h, range(0, 2 * hid))
    z = lambda i: layer.act(0, layer.gate(t, 0, i, layer.rec(zr, 0, i)))   # noqa: E731
    r = lambda i: layer.act(0, layer.gate(t, 1, i, layer.rec(zr, 1, i)))   # noqa: E731
    if int(node.attrs.get("linear_before_reset", 0)):
        hh = _recurrent(fx, layer, h, range(2 * hid, 3 * hid))

        def cand(i):
            return layer.act(1, layer.gate(t, 2, i, None) + r(i) * (cast(hh[i], ft) + layer.rbias(2, i[1])))
    else:       # the reset gate scales H before its product with R
        rh = fx.compute(h.shape, lambda i: cast(r(i) * cast(h[i], ft), h.dtype))
        hh = _recurrent(fx, layer, rh, range(2 * hid, 3 * hid))

        def cand(i):
            return layer.act(1, layer.gate(t, 2, i, hh[i]))

    def new(i):
        old = cast(h[i], ft)
        return cast(_carry((1.0 - z(i)) * cand(i) + z(i) * old, old, valid(i)), h.dtype)
    return fx.compute(h.shape, new), None


def _lstm_step(fx, node, layer, t, h, c, valid):
    hid, ft = layer.hidden, layer.ft
    rec = _recurrent(fx, layer, h, range(0, 4 * hid))

    def pre(g: int, i: tuple, peep: int | None = None, state: TensorRef | None = None) -> Expr:
        v = layer.gate(t, g, i, layer.rec(rec, g, i))
        if layer.peep is not None and peep is not None:
            v = v + cast(layer.peep[(layer.d, peep * hid + i[1])], ft) * cast(state[i], ft)
        return v

    def gate_i(i):
        return layer.act(0, pre(0, i, 0, c))

    def gate_f(i):
        if int(node.attrs.get("input_forget", 0)):
            return 1.0 - gate_i(i)
        return layer.act(0, pre(2, i, 2, c))

    def new_c(i):
        old = cast(c[i], ft)
        return cast(_carry(gate_f(i) * old + gate_i(i) * layer.act(1, pre(3, i)), old, valid(i)), c.dtype)
    c_new = fx.compute(c.shape, new_c)

    def new_h(i):
        o = layer.act(0, pre(1, i, 1, c_new))
        return cast(_carry(o * layer.act(2, cast(c_new[i], ft), clip=False), cast(h[i], ft), valid(i)), h.dtype)
    return fx.compute(h.shape, new_h), c_new


STEPS = {"RNN": _rnn_step, "GRU": _gru_step, "LSTM": _lstm_step}


def _activations(node: Node, dirs: int) -> list[list[Callable[[Expr], Expr]]]:
    names = list(node.attrs.get("activations", CELLS[node.op][1] * dirs))
    alphas, betas = list(node.attrs.get("activation_alpha", ())), list(node.attrs.get("activation_beta", ()))
    per = len(CELLS[node.op][1])
    if len(names) != per * dirs:
        raise UnsupportedAttribute(node, "activations", tuple(names), f"expected {per * dirs} names")
    fns = []
    for k, name in enumerate(names):
        if name not in ACTIVATIONS:
            raise UnsupportedAttribute(node, "activations", name, f"expected one of {', '.join(ACTIVATIONS)}")
        fn, a, b = ACTIVATIONS[name]
        a = alphas[k] if k < len(alphas) else a
        b = betas[k] if k < len(betas) else b
        fns.append(lambda x, fn=fn, a=a, b=b: fn(x, a, b))
    return [fns[d * per:(d + 1) * per] for d in range(dirs)]


@rule("RNN", "GRU", "LSTM")
def recurrent(fx: Fission, node: Node, ins: list) -> list:
    """Unrolled over the sequence: one X·Wᵀ contraction per direction, then per step an H·Rᵀ
    contraction and the gates (``sequence_lens`` masks, ``layout``, ``direction``, ``clip``, peepholes)."""
    x, w, r, bias, lens, h0, c0, peep = (list(ins) + [None] * 8)[:8]
    gates = CELLS[node.op][0]
    direction = node.attrs.get("direction", "forward")
    if direction not in DIRECTIONS:
        raise UnsupportedAttribute(node, "direction", direction, "expected forward, reverse or bidirectional")
    batchwise = bool(node.attrs.get("layout", 0))
    if batchwise:       # [B, S, I] -> [S, B, I] (composed into the readers by the vertical pass)
        x = fx.compute((x.shape[1], x.shape[0], x.shape[2]), lambda i, x=x: x[(i[1], i[0], i[2])])
    seq, batch, _ = x.shape
    hid = int(node.attrs.get("hidden_size", r.shape[-1]))
    dtype = x.dtype
    ft = acc_dtype(dtype)
    clip = node.attrs.get("clip")
    acts = _activations(node, len(DIRECTIONS[direction]))

    def valid_for(t):
        if lens is None:
            return lambda i: None
        return lambda i: Const(t, DType.int64).lt(cast(lens[(i[0],)], DType.int64))

    def state0(s: TensorRef | None, d: int) -> TensorRef:
        if s is None:
            return fx.constant(torch.zeros(batch, hid, dtype=dtype.to_torch()), "h0")
        pick = (lambda i: s[(i[0], d, i[1])]) if batchwise else (lambda i: s[(d, i[0], i[1])])
        return fx.compute((batch, hid), pick)

    outs_h, finals = [], []
    for d, backward in enumerate(DIRECTIONS[direction]):
        xw = fx.reduce((seq, batch, gates * hid), (x.shape[2],), "sum",
                       lambda i, rr, d=d: cast(x[(i[0], i[1], rr[0])], ft) * cast(w[(d, i[2], rr[0])], ft))
        layer = Layer(d, xw, r, bias, peep, acts[d], clip, hid, ft)
        h, c = state0(h0, d), state0(c0, d) if node.op == "LSTM" else None
        hs = [None] * seq
        for t in (reversed(range(seq)) if backward else range(seq)):
            h, c = STEPS[node.op](fx, node, layer, t, h, c, valid_for(t))
            hs[t] = h
        outs_h.append(hs)
        finals.append((h, c))
    return _outputs(fx, node, outs_h, finals, batchwise, lens, dtype)


def _choose(values: list[Expr], k: Expr) -> Expr:
    """values[k] for an index expression k, by nested selects."""
    v = values[-1]
    for n in range(len(values) - 2, -1, -1):
        v = select(k.eq(n), values[n], v)
    return v


def _outputs(fx, node, outs_h, finals, batchwise, lens, dtype) -> list:
    seq = len(outs_h[0])
    want = list(node.outputs) + [""] * (3 - len(node.outputs))
    res: list = [None, None, None]
    if want[0]:
        def y(i):
            t, d, b, j = (i[1], i[2], i[0], i[3]) if batchwise else i
            v = _choose([_choose([hs[s][(b, j)] for s in range(seq)], t) for hs in outs_h], d)
            if lens is None:
                return v
            return select(t.lt(cast(lens[(b,)], DType.int64)), v, Const(0, dtype))
        res[0] = fx.compute(fx.out_type(0).shape, y)
    for k, which in ((1, 0), (2, 1)):
        if want[k]:
            parts = [f[which] for f in finals]
            res[k] = fx.compute(fx.out_type(k).shape, lambda i, parts=parts: (
                _choose([p[(i[0], i[2])] for p in parts], i[1]) if batchwise
                else _choose([p[(i[1], i[2])] for p in parts], i[0])))
    return res[:len(node.outputs)]
