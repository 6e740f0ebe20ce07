"""Layouts composed into their readers (``transform/vertical.py``) against eager PyTorch.

A composed index map used to be wrong when rebuilding it folded an expression into one of the
variables being substituted (``transform`` offered the folded ``i2`` to the substitution
``{i2: i1, i3: i2}`` a second time): ``p.unflatten(-1, (3, 8)).transpose(0, 2)[0]`` read
``p[i1, 0, i1]`` instead of ``p[i1, 0, i2]``.  ``nn.MultiheadAttention``'s packed in-projection,
torchvision's ViT (built on it) and Swin's ``qkv[0]`` hit it.  Every case here is compared with
eager PyTorch through both backends.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tilefuse
from tilefuse.ir.expr import INDEX, Const, Var, substitute, transform
from tilefuse.transform.vertical import vertical

BACKENDS = ("reference", "triton")
ATOL = 1e-5


class Fn(torch.nn.Module):
    def __init__(self, fn, **mods):
        super().__init__()
        self.fn = fn
        for k, v in mods.items():
            setattr(self, k, v)

    def forward(self, *args):
        return self.fn(self, *args)


def assert_matches_eager(model, args, backend, atol=ATOL):
    model = model.eval()
    with torch.no_grad():
        want = model(*args)
    got = tilefuse.compile(model, args, backend=backend, time_limit=1.0)(*args)
    want = want if isinstance(want, tuple) else (want,)
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        err = (g - w).abs().max().item()
        assert err <= atol + 1e-5 * w.abs().max().item(), f"max abs error {err} (eager max {w.abs().max().item()})"


def test_a_substitution_is_simultaneous_even_when_rebuilding_folds_to_a_substituted_variable():
    i0, i1, i2, i3 = (Var(f"i{k}") for k in range(4))
    e = i0 * 8 + i3
    zero = Const(0, INDEX)
    assert substitute(e, {i0: zero, i1: zero, i2: i1, i3: i2}) is i2
    # the same through transform: the folded node is not offered to fn again
    seen = []
    transform(e, lambda n: seen.append(n) or {i0: zero, i3: i2}.get(n))
    assert i2 not in seen


# The minimal case and its relatives: selects after transposing an unflattened dimension, at
# every index, through movedim, permute, unsqueeze/squeeze and a second composed view.
VIEWS = {
    "transpose_select": lambda p, i: p.unflatten(-1, (3, 8)).transpose(0, 2)[i],
    "movedim_select": lambda p, i: p.unflatten(-1, (3, 8)).movedim(2, 0)[i],
    "permute_select": lambda p, i: p.unflatten(-1, (3, 8)).permute(2, 0, 3, 1)[i],
    "mha_in_projection": lambda p, i: p.unflatten(-1, (3, 8)).unsqueeze(0).transpose(0, -2).squeeze(-2)[i],
    "select_then_reshape": lambda p, i: p.unflatten(-1, (3, 8)).transpose(0, 2)[i].reshape(-1, 4),
    "narrow_after_transpose": lambda p, i: p.unflatten(-1, (3, 8)).transpose(0, 2).narrow(0, i, 1).squeeze(0),
    "select_last_dim": lambda p, i: p.unflatten(-1, (3, 8)).transpose(-1, -2)[..., i],
    "two_unflattens": lambda p, i: p.reshape(4, 4, 24).unflatten(-1, (2, 3, 4)).permute(3, 2, 0, 1, 4)[i % 2, 0],
}


@pytest.mark.parametrize("backend,index", [("reference", 0), ("reference", 1), ("reference", 2), ("triton", 0)])
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_selects_after_transposing_an_unflattened_dimension(view, index, backend):
    fn = VIEWS[view]
    model = Fn(lambda m, p: fn(p, index) + 0.5)
    assert_matches_eager(model, (torch.randn(16, 1, 24),), backend)


def test_the_minimal_case_composes_to_the_right_index_map():
    from tilefuse.fission import fission
    from tilefuse.frontend.torch import import_torch
    from tilefuse.ir.evaluate import run_reference
    from tilefuse.transform.simplify import simplify_graph
    p = torch.randn(16, 1, 24)
    graph = import_torch(Fn(lambda m, p: p.unflatten(-1, (3, 8)).transpose(0, 2)[0] + 0.5), (p,)).graph
    pg = simplify_graph(fission(graph))
    composed = simplify_graph(vertical(pg))
    assert len(composed.prims) == 1         # one add reading p through the composed map
    feeds = {pg.inputs[0].name: p}
    want = p.unflatten(-1, (3, 8)).transpose(0, 2)[0] + 0.5
    for g in (pg, composed):
        torch.testing.assert_close(run_reference(g, feeds)[0], want)


MHA = [  # embed, heads, batch_first, need_weights, kdim (None: self-attention with packed weights)
    (32, 1, True, True, None),
    (32, 2, False, False, None),
    (32, 4, True, False, None),
    (64, 4, False, True, None),
    (16, 2, True, True, 12),     # separate q/k/v projections
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("embed,heads,batch_first,need_weights,kdim", MHA)
def test_multihead_attention(embed, heads, batch_first, need_weights, kdim, backend):
    torch.manual_seed(embed + heads)
    mha = torch.nn.MultiheadAttention(embed, heads, batch_first=batch_first, kdim=kdim, vdim=kdim)
    x = torch.randn(3, 5, embed)
    kv = torch.randn(3, 5, kdim) if kdim else x

    def forward(m, x, kv):
        out, w = m.mha(x, kv, kv, need_weights=need_weights)
        return (out, w) if need_weights else out
    assert_matches_eager(Fn(forward, mha=mha), (x, kv), backend)


def test_multihead_attention_with_a_key_padding_mask():
    torch.manual_seed(1)
    mha = torch.nn.MultiheadAttention(32, 4, batch_first=True)
    x = torch.randn(2, 6, 32)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    assert_matches_eager(Fn(lambda m, x, pad: m.mha(x, x, x, key_padding_mask=pad, need_weights=False)[0], mha=mha),
                         (x, pad), "triton")


class _TorchvisionViTBlock(torch.nn.Module):
    """torchvision's ``VisionTransformer``: conv patches, class token, position embedding, encoder
    blocks of ``nn.MultiheadAttention`` (which the bug broke: error 1.93 of 2.02) and an MLP."""

    def __init__(self, dim=32, heads=2, layers=2, patch=8):
        super().__init__()
        self.proj = torch.nn.Conv2d(3, dim, patch, stride=patch)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, dim))
        self.pos = torch.nn.Parameter(torch.randn(1, 17, dim) * 0.2)
        self.blocks = torch.nn.ModuleList(
            torch.nn.ModuleDict(dict(ln1=torch.nn.LayerNorm(dim), attn=torch.nn.MultiheadAttention(dim, heads, batch_first=True),
                                     ln2=torch.nn.LayerNorm(dim), fc1=torch.nn.Linear(dim, 2 * dim), fc2=torch.nn.Linear(2 * dim, dim)))
            for _ in range(layers))
        self.head = torch.nn.Linear(dim, 10)

    def forward(self, img):
        x = self.proj(img).reshape(img.shape[0], self.cls.shape[-1], -1).permute(0, 2, 1)
        x = torch.cat([self.cls.expand(img.shape[0], -1, -1), x], dim=1) + self.pos
        for b in self.blocks:
            y = b.ln1(x)
            x = x + b.attn(y, y, y, need_weights=False)[0]
            x = x + b.fc2(F.gelu(b.fc1(b.ln2(x))))
        return self.head(x[:, 0])


class _SwinWindowAttention(torch.nn.Module):
    """torchvision's ``shifted_window_attention``: a packed qkv projection reshaped to
    ``[3, windows, heads, N, head_dim]`` and split with ``qkv[0]``, ``qkv[1]``, ``qkv[2]``."""

    def __init__(self, dim=16, heads=2, window=4, shift=2):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.heads, self.window, self.shift = heads, window, shift
        self.bias = torch.nn.Parameter(torch.randn(heads, window * window, window * window) * 0.2)

    def forward(self, x):                       # [B, H, W, C]
        B, H, W, C = x.shape
        w, s = self.window, self.shift
        x = torch.roll(x, shifts=(-s, -s), dims=(1, 2))
        x = x.view(B, H // w, w, W // w, w, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, C)
        qkv = self.qkv(x).reshape(x.size(0), x.size(1), 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * (C // self.heads) ** -0.5).matmul(k.transpose(-2, -1)) + self.bias
        x = attn.softmax(dim=-1).matmul(v).transpose(1, 2).reshape(x.size(0), x.size(1), C)
        x = self.proj(x).view(B, H // w, W // w, w, w, C).permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, C)
        return torch.roll(x, shifts=(s, s), dims=(1, 2))


def _randomized(m):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    return m


@pytest.mark.parametrize("backend", BACKENDS)
def test_torchvision_style_vit(backend):
    assert_matches_eager(_randomized(_TorchvisionViTBlock()), (torch.randn(2, 3, 32, 32),), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_torchvision_style_swin_window_attention(backend):
    assert_matches_eager(_randomized(_SwinWindowAttention()), (torch.randn(1, 8, 8, 16),), backend)
