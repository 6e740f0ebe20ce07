"""torch.compile(backend="tilefuse") on inputs whose shapes change between calls (issue #13, item 4).

Dynamo compiles a static graph for the first shape; on a new shape (or from the start with
``dynamic=True`` / ``mark_dynamic``) it hands over a graph with symbolic sizes, which the backend runs
through one plan per power-of-two bucket of its sizes (issue #24), planned at the bucket's largest
sizes and carried to each size in it, at most ``max_specializations`` plans.
"""
import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse.frontend.dynamo as dynamo_backend
from tilefuse.errors import OptionError
from tilefuse.frontend.dynamo import TilefuseFallbackWarning

FAST = {"time_limit": 1.0, "interpreter": True,   # (tilefuse's kernels, not PyTorch, on this CPU)
        "check_buckets": False}                   # (the bound check plans each bucket twice: one test has it)


class Block(nn.Module):
    """A pre-norm causal attention + MLP block over (batch, seq, 16); ``scale`` and the LayerNorm's
    eps are Python floats, which dynamo passes as tensors under ``dynamic=True``."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads, self.scale = heads, 1.0 / math.sqrt(d // heads)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


@pytest.fixture
def compiles(monkeypatch):
    """The graphs tilefuse has planned so far (``[0]``) and the plans it has carried to other
    sizes (``["carried"]``)."""
    import torch._dynamo
    count = {0: 0, "carried": 0}
    compile_forward = dynamo_backend._compile_forward

    def counted(*args, **kwargs):
        count["carried" if kwargs.get("template") is not None else 0] += 1
        return compile_forward(*args, **kwargs)
    monkeypatch.setattr(dynamo_backend, "_compile_forward", counted)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TilefuseFallbackWarning)  # a silent fallback fails the test
        yield count
    torch._dynamo.reset()


def block():
    torch.manual_seed(0)
    return Block().eval()


def run(compiled, model, seq, *, mark_dynamic=False):
    x = torch.randn(2, seq, 16)
    if mark_dynamic:
        torch._dynamo.mark_dynamic(x, 1)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-5)


def test_sequence_lengths_in_buckets(compiles):
    """(The zoo's BERT, GPT-2 and LLaMA across a bucket: tests/test_buckets.py, --runslow.)"""
    import tilefuse
    model = block()
    compiled = torch.compile(model, backend="tilefuse", options=FAST)
    # 5: a static graph; 9: dynamo recompiles with the sequence dynamic: the bucket 9..16 is planned
    # at 15 (its largest size but one), carried to 11 and 13 to make its kernels size-generic and to
    # 9 to serve it; 12: carried from the bucket's plan, no planning; 9 again: its plan.
    served = {}
    for seq, planned, carried in ((5, 1, 0), (9, 2, 3), (12, 2, 4), (9, 2, 4)):
        run(compiled, model, seq)
        assert (compiles[0], compiles["carried"]) == (planned, carried), (seq, compiles)
        served.setdefault(seq, tilefuse.compiled_graphs()[-1])
    # the sizes of a bucket run the same size-generic kernels (one compile for the bucket on a GPU)
    nine, twelve = served[9], served[12]
    generic = [k for k, b in enumerate(nine.kernels) if b.size_arg is not None]
    assert len(generic) == nine.report.specialization["generic_kernels"] >= len(nine.kernels) // 2, generic
    assert all(twelve.kernels[k].source == nine.kernels[k].source for k in generic)
    assert all((nine.kernels[k].size_arg, twelve.kernels[k].size_arg) == (9, 12) for k in generic)


def test_dynamic_true_hands_over_symbolic_inputs(compiles):
    seen = []

    def backend(gm, example_inputs):
        seen.append(example_inputs)
        return dynamo_backend.tilefuse_backend(gm, example_inputs, **FAST)
    model = block()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for seq, total in ((5, 1), (7, 2), (5, 2)):
        run(compiled, model, seq)
        assert compiles[0] == total
    assert len(seen) == 1, "one symbolic graph serves every length"
    assert any(isinstance(x, torch.SymInt) for x in seen[0]), "dynamo passes the sizes as SymInt inputs"


def test_dynamic_false_compiles_each_length(compiles):
    model = block()
    compiled = torch.compile(model, backend="tilefuse", dynamic=False, options=FAST)
    for seq, total in ((5, 1), (7, 2), (9, 3), (5, 3)):
        run(compiled, model, seq)
        assert compiles[0] == total


def test_mark_dynamic(compiles):
    """A dim marked dynamic is bucketed from the first call: 5 is served by the plan of 5..8 (made
    at 7), and so are 7 and 6."""
    model = block()
    compiled = torch.compile(model, backend="tilefuse", options=FAST)
    for seq, total in ((5, 1), (7, 1), (6, 1)):
        run(compiled, model, seq, mark_dynamic=True)
        assert compiles[0] == total


def test_gradients_enabled_with_symbolic_shapes(compiles):
    model = block()
    compiled = torch.compile(model, backend="tilefuse", dynamic=True, options=FAST)
    x = torch.randn(2, 6, 16)
    out = compiled(x)
    torch.testing.assert_close(out.detach(), model(x).detach(), rtol=1e-4, atol=1e-5)
    out.sum().backward()  # the backward graph runs eagerly
    assert model.qkv.weight.grad is not None


def test_beyond_the_bound_runs_eagerly_after_one_warning(compiles):
    model = block()
    compiled = torch.compile(model, backend="tilefuse", dynamic=True, options={**FAST, "max_specializations": 2})
    run(compiled, model, 5)
    run(compiled, model, 7)
    with pytest.warns(TilefuseFallbackWarning, match="max_specializations"):
        run(compiled, model, 9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        run(compiled, model, 11)
        run(compiled, model, 7)  # a compiled length keeps its plan
    assert compiles[0] == 2


def test_bound_from_the_environment(compiles, monkeypatch):
    monkeypatch.setenv("TILEFUSE_MAX_SPECIALIZATIONS", "1")
    model = block()
    compiled = torch.compile(model, backend="tilefuse", dynamic=True, options=FAST)
    run(compiled, model, 5)
    with pytest.warns(TilefuseFallbackWarning, match="compiled 1 plans"):
        run(compiled, model, 7)
    assert compiles[0] == 1


@pytest.mark.parametrize("options, env, expected", [
    ({}, None, dynamo_backend.DEFAULT_MAX_SPECIALIZATIONS),
    ({}, "3", 3),
    ({"max_specializations": 5}, "3", 5),  # the option wins
])
def test_max_specializations_sources(options, env, expected, monkeypatch):
    if env is None:
        monkeypatch.delenv("TILEFUSE_MAX_SPECIALIZATIONS", raising=False)
    else:
        monkeypatch.setenv("TILEFUSE_MAX_SPECIALIZATIONS", env)
    assert dynamo_backend._max_specializations(options) == expected


@pytest.mark.parametrize("options, env", [
    ({"max_specializations": 0}, None), ({"max_specializations": 2.5}, None), ({"max_specializations": True}, None),
    ({}, "many"), ({}, "-1"),
])
def test_max_specializations_rejects_bad_values(options, env, monkeypatch):
    if env is None:
        monkeypatch.delenv("TILEFUSE_MAX_SPECIALIZATIONS", raising=False)
    else:
        monkeypatch.setenv("TILEFUSE_MAX_SPECIALIZATIONS", env)
    with pytest.raises(OptionError, match="positive integer"):
        dynamo_backend._max_specializations(options)


def test_each_new_plan_says_which_input_dimension_caused_it(compiles, caplog):
    import logging

    import tilefuse
    model = block()
    compiled = torch.compile(model, backend="tilefuse", dynamic=True, options=FAST)
    with caplog.at_level(logging.INFO, logger="tilefuse.recompile"):
        run(compiled, model, 5)
        run(compiled, model, 7)
        run(compiled, model, 5)           # a known signature: no new plan, nothing logged
    lines = [r.getMessage() for r in caplog.records if r.name == "tilefuse.recompile"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("plan 1 of at most 8") and "the first call: " in lines[0]
    assert "'l_x_' [2, 5, 16] (symbolic dims 0, 1, 2)" in lines[0], lines[0]      # dynamic=True: every dim
    assert lines[1].startswith("plan 2 of at most 8") and "dim 1: 5 -> 7" in lines[1], lines[1]
    spec = tilefuse.compiled_graphs()[-1].report.specialization
    assert spec["plan"] == 2 and spec["limit"] == 8 and "dim 1: 5 -> 7" in spec["cause"]
    assert compiles[0] == 2


def test_sizes_that_cannot_be_bucketed_are_planned_each_on_its_own_within_the_bound(compiles, monkeypatch):
    """Where the graph cannot be traced at a bucket's made-up sizes, each signature gets a plan of
    its own (as before buckets), counted against ``max_specializations``."""
    import tilefuse.orchestrate.buckets as buckets

    def untraceable(ranges, compile_at, check=True):
        raise dynamo_backend._Unplanned("made-up sizes")
    monkeypatch.setattr(buckets, "plan_bucket", untraceable)
    model = block()
    compiled = torch.compile(model, backend="tilefuse", dynamic=True, options={**FAST, "max_specializations": 2})
    run(compiled, model, 5)
    run(compiled, model, 7)
    run(compiled, model, 5)
    assert compiles[0] == 2 and compiles["carried"] == 0
    with pytest.warns(TilefuseFallbackWarning, match="max_specializations"):
        run(compiled, model, 9)
    assert compiles[0] == 2
