"""Materialized causal and sliding-window masks become index predicates (issue #22:
``transform/masks.py``), and boolean masks are composed into their readers
(``transform/vertical.py: _mask``), so attention reads no ``[S, S]`` mask and its chain kernel
stops each key loop at the diagonal.  Against eager torch."""
import math

import pytest
import torch

import tilefuse
from tilefuse import zoo
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.evaluate import eval_prim
from tilefuse.ir.prim import Constant, Prim, PrimGraph, TensorDecl
from tilefuse.ir.expr import Load, Var, binary
from tilefuse.transform.masks import masks_as_predicates


def _graph(mask: torch.Tensor) -> PrimGraph:
    """out = x & mask (or x + mask): a graph reading the constant ``mask``."""
    axes = tuple(Var(f"i{k}") for k in range(mask.dim()))
    dt = DType.from_torch(mask.dtype)
    t = TensorType(tuple(mask.shape), dt)
    x, m = Load(0, axes, dt), Load(1, axes, dt)
    body = binary("and", x, m) if dt is DType.bool else x + m
    return PrimGraph((TensorDecl("x", t),), (Constant("m", mask),), (Prim("out", ("x", "m"), axes, body, t),), ("out",))


def _band(lq, lk, c, w=None):
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    keep = j <= i + c
    return keep if w is None else keep & (j >= i - w)


@pytest.mark.parametrize("mask,what", [
    (_band(8, 8, 0).expand(2, 1, 8, 8), "causal"),
    (_band(6, 10, 4)[None], "causal"),                                   # bottom-right aligned, Lk > Lq
    (_band(8, 8, 0, 3), "sliding-window"),
    (~_band(8, 8, 0), "causal"),                                         # the positions to hide: ~tril
    (~_band(8, 8, 0, 3), "sliding-window"),                              # two regions to hide
    (torch.zeros(8, 8).masked_fill(~_band(8, 8, 0), -math.inf), "causal"),   # additive
    (torch.zeros(8, 8, dtype=torch.float16).masked_fill(~_band(8, 8, 1, 2), -math.inf), "sliding-window"),
])
def test_a_band_mask_becomes_the_predicate_that_computes_it(mask, what):
    pg = masks_as_predicates(_graph(mask.contiguous()))
    assert not pg.constants
    (p,) = [p for p in pg.prims if p.name == "m"]
    assert p.inputs == () and p.origin.op == f"{what} mask"
    assert torch.equal(eval_prim(p, []), mask)


@pytest.mark.parametrize("mask", [
    torch.rand(8, 8) < 0.5,                                              # no band
    torch.stack([_band(8, 8, 0), _band(8, 8, 1)]),                       # slices differ
    torch.ones(8, 8, dtype=torch.bool),                                  # all kept
    torch.where(_band(8, 8, 0), 1.0, 0.0),                               # a 0/1 float, not additive
    _band(8, 8, 0).to(torch.int64),
    _band(1, 8, 0),                                                      # one row
])
def test_other_constants_stay(mask):
    pg = _graph(mask)
    assert masks_as_predicates(pg) is pg


def _attention(mask):
    def fn(q, k, v):
        s = q @ k.transpose(-1, -2) / 4.0
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
        return torch.softmax(s, -1) @ v
    return fn


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_attention_with_a_constant_causal_mask_runs_as_a_causal_chain(kind):
    lq = lk = 40
    band = _band(lq, lk, 0)
    mask = band if kind == "bool" else torch.zeros(lq, lk).masked_fill(~band, -math.inf)
    q, k, v = (torch.randn(2, 3, lq, 16) for _ in range(3))
    fn = _attention(mask)
    cm = tilefuse.compile(fn, (q, k, v), target="h100")
    chains = [k.schedule for k in cm.plan.kernels if k.schedule.family == "chain"]
    assert len(chains) == 1 and chains[0].body.causal == 0
    assert all(cm.primgraph.types[n].rank < 2 or cm.primgraph.types[n].shape[-2:] != (lq, lk)
               for n in chains[0].body.inputs)                            # no [S, S] mask read
    torch.testing.assert_close(cm.emulate(q, k, v), fn(q, k, v), rtol=1e-4, atol=1e-4)


def test_llama_reads_no_mask_tensor_and_its_chains_are_causal():
    """transformers' LLaMA builds its causal mask from positions (folded to a constant) and ands
    it with the padding mask: the chain reads the padding row only and knows the band; the
    outputs match eager with a padded batch row."""
    model, inputs = zoo.build("llama", "tiny")
    ids, am = inputs[0]
    am = am.clone()
    am[0, :2] = 0                                                        # left padding
    # (time_limit 1.0 cuts the candidates short: the sets spanning attention's two contractions,
    # its rotary prologue included, are costed first, so the chains are there all the same)
    cm = tilefuse.compile(model, (ids, am), target="h100", time_limit=1.0)
    assert cm.report.solver["time_limit_cut"]
    chains = [k.schedule for k in cm.plan.kernels if k.schedule.family == "chain"]
    assert chains and all(s.body.causal == 0 for s in chains)
    seq = ids.shape[1]
    for s in chains:
        assert all(cm.primgraph.types[n].shape[-2:] != (seq, seq) for n in s.body.inputs
                   if cm.primgraph.types[n].dtype is DType.bool)
    with torch.no_grad():
        want = model(ids, attention_mask=am).logits
    got = cm.emulate(ids, am)
    got = got.logits if hasattr(got, "logits") else got[0]
    keep = am[0].bool()                  # padded positions' logits are not compared (eager's are
    torch.testing.assert_close(got[:, keep], want[:, keep], rtol=1e-4, atol=1e-4)   # of a masked row)


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_sliding_window_attention_walks_only_the_window(kind):
    """A causal window of 8 keys (a constant band, as Mistral-style models build it): the chain
    knows both edges, each row tile's key loop starts at the chunk of its first row - 7 and stops
    at its last row; the outputs match eager and the modelled work is a fraction of causal's."""
    lq = lk = 256
    band = _band(lq, lk, 0, 7)
    mask = band if kind == "bool" else torch.zeros(lq, lk).masked_fill(~band, -math.inf)
    q, k, v = (torch.randn(1, 2, lq, 16) for _ in range(3))
    fn = _attention(mask)
    cm = tilefuse.compile(fn, (q, k, v), target="h100")
    (s,) = [k.schedule for k in cm.plan.kernels if k.schedule.family == "chain"]
    assert (s.body.causal, s.body.window) == (0, 7)
    (built,) = [b for b in cm.kernels if b.family == "chain"]
    assert "tl.maximum(tl.program_id(0) * BLOCK_M - 7, 0) // BLOCK_N * BLOCK_N" in built.source
    torch.testing.assert_close(cm.emulate(q, k, v), fn(q, k, v), rtol=1e-4, atol=1e-4)
    causal = tilefuse.compile(_attention(_band(lq, lk, 0)), (q, k, v), target="h100")
    (c,) = [k.schedule for k in causal.plan.kernels if k.schedule.family == "chain"]
    from tilefuse.families.chain import _schedule
    from tilefuse.cost.target import H100
    from tilefuse.families.chain.space import ChainTile
    # at one tile of 32-key blocks (a coarse block walks much of the band's rows' keys either way)
    t = ChainTile(32, 32, 16, 16, 4, 2)
    assert _schedule(s.body, t, H100).work.flops < 0.6 * _schedule(c.body, t, H100).work.flops
