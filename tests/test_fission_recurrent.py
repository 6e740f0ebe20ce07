"""Fission of RNN, GRU and LSTM (unrolled) against onnxruntime."""
import pytest
import torch

from opcheck import check_op, onnxruntime_op

torch.manual_seed(0)
TOL = dict(rtol=1e-4, atol=1e-5)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _inputs(op, seq=4, batch=3, inp=5, hid=6, dirs=1, bias=True, lens=None, initial=False, peep=False):
    g = GATES[op]
    x = torch.randn(seq, batch, inp)
    ins = [x, torch.randn(dirs, g * hid, inp) * 0.5, torch.randn(dirs, g * hid, hid) * 0.5,
           torch.randn(dirs, 2 * g * hid) * 0.1 if bias else None, lens]
    state = (dirs, batch, hid)
    ins += [torch.randn(state) if initial else None]
    if op == "LSTM":
        ins += [torch.randn(state) if initial else None, torch.randn(dirs, 3 * hid) if peep else None]
    while ins[-1] is None:
        ins.pop()
    return ins


CASES = [
    ("RNN", {}, {}),
    ("RNN", {"dirs": 2}, {"direction": "bidirectional", "activations": ["Relu", "Tanh"]}),
    ("GRU", {}, {}),
    ("GRU", {"initial": True}, {"linear_before_reset": 1}),
    ("GRU", {"dirs": 2}, {"direction": "bidirectional"}),     # (layout=1: the backend cases; not in ORT)
    ("LSTM", {}, {}),
    ("LSTM", {"initial": True, "peep": True}, {"clip": 0.7}),
    ("LSTM", {"dirs": 1}, {"direction": "reverse", "input_forget": 1}),
    ("LSTM", {"lens": torch.tensor([4, 2, 1], dtype=torch.int32), "initial": True}, {}),
    ("LSTM", {"dirs": 2, "lens": torch.tensor([3, 4, 2], dtype=torch.int32)}, {"direction": "bidirectional"}),
]


@pytest.mark.parametrize("op,shape,attrs", CASES, ids=lambda v: str(v) if isinstance(v, str) else None)
def test_recurrent_matches_onnxruntime(op, shape, attrs):
    ins = _inputs(op, **shape)
    attrs = {"hidden_size": 6, **attrs}
    n_out = 3 if op == "LSTM" else 2
    want = onnxruntime_op(op, ins, n_out=n_out, **attrs)
    pg = check_op(op, ins, want, attrs={k: tuple(v) if isinstance(v, list) else v for k, v in attrs.items()}, **TOL)
    # the input projection is one contraction per direction, then one recurrent product per step
    contractions = sum(p.reduce is not None for p in pg.prims)
    per_step = {"RNN": 1, "GRU": 2, "LSTM": 1}[op]
    assert contractions == (1 + 4 * per_step) * (2 if attrs.get("direction") == "bidirectional" else 1)
