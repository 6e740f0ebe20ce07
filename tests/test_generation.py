"""transformers' ``generate()`` with the model's forward under ``torch.compile(backend="tilefuse")``
(issue #24, item 2), greedy, tokens equal to eager's and no graph run eagerly.  With a static KV
cache every decode step has the same shapes: a prefill plan and one decode plan.  With the default
(dynamic) cache every step has a new key length: dynamo makes it a symbol, and the backend plans
one power-of-two bucket of key lengths at a time (``orchestrate/buckets.py``), carrying the
bucket's plan to each length in it: at most ⌈log2(max length)⌉ + 1 plans.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import tilefuse
from tilefuse.frontend.dynamo import TilefuseFallbackWarning

NEW_TOKENS = 6


def _llama(positions=64):
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2,
                                        max_position_embeddings=positions, bos_token_id=0, eos_token_id=None,
                                        pad_token_id=0))


def _gpt2(positions=64):
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=32, n_layer=1, n_head=4, n_positions=positions,
                                      bos_token_id=0, eos_token_id=None, pad_token_id=0))


MODELS = {"llama": _llama, "gpt2": _gpt2}


def _generate(name: str, batch: int, *, new_tokens: int = NEW_TOKENS, cache: str | None = "static",
              batches: tuple[int, ...] = (), **options):
    """(eager's tokens, tilefuse's, the plans made) of greedy generation; ``batches``: more batch
    sizes generated with the same compiled forward afterwards (their tokens checked here)."""
    torch.manual_seed(0)
    model = MODELS[name](positions=max(64, 8 + new_tokens)).eval()
    prompts = [torch.randint(1, 128, (b, 5), generator=torch.Generator().manual_seed(b)) for b in (batch, *batches)]
    kw = dict(max_new_tokens=new_tokens, do_sample=False, cache_implementation=cache)
    with torch.no_grad():
        wants = [model.generate(ids, **kw) for ids in prompts]
    planned = _Planned()
    model.forward = torch.compile(model.forward, backend="tilefuse",
                                  options={"interpreter": True, "time_limit": 1.0, **options})
    with warnings.catch_warnings(), torch.no_grad(), planned:
        warnings.simplefilter("error", TilefuseFallbackWarning)      # no graph runs eagerly
        gots = [model.generate(ids, **kw) for ids in prompts]
    for want, got in zip(wants[1:], gots[1:]):
        assert torch.equal(got, want), (got.shape, want.shape)
    return wants[0], gots[0], planned.reports


class _Planned:
    """The reports of the plans the backend makes (not those carried to other sizes) while open."""

    def __enter__(self):
        import tilefuse.frontend.dynamo as dynamo
        self.reports, self._dynamo, self._was = [], dynamo, dynamo._compile_forward

        def counted(*args, **kwargs):
            fn = self._was(*args, **kwargs)
            if kwargs.get("template") is None and kwargs.get("keep", True):
                self.reports.append(tilefuse.compiled_graphs()[-1].report)
            return fn
        dynamo._compile_forward = counted
        return self

    def __exit__(self, *exc):
        self._dynamo._compile_forward = self._was


@pytest.mark.slow       # (the default run has the dynamic cache's test below)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_static_cache_generation_is_two_plans_and_eager_tokens(name):
    torch._dynamo.reset()
    want, got, plans = _generate(name, 1)
    assert got.shape == (1, 5 + NEW_TOKENS)
    assert torch.equal(got, want), (got.tolist(), want.tolist())
    assert len(plans) == 2, [p.num_kernels for p in plans]     # the prefill, then every decode step
    assert all(p.num_kernels > 0 for p in plans)


def _bucketed(plans, max_length: int) -> None:
    """At most ⌈log2(max length)⌉ + 1 plans; each bucket's plan says which sizes it serves."""
    assert len(plans) <= math.ceil(math.log2(max_length)) + 1, [p.specialization.get("sizes") for p in plans]
    buckets = [p.specialization["bucket"] for p in plans if p.specialization.get("bucket")]
    assert buckets, "no plan serves a bucket of key lengths"
    for b in buckets:
        assert all(first <= b["planned_at"][s] <= last for s, (first, last) in b["ranges"].items()), b


def test_dynamic_cache_generation_plans_buckets_of_key_lengths():
    """Key lengths 6..8 (a prompt of 5, 3 new tokens): the prefill, dynamo's first (static) decode
    graph, then the bucket 5..8 of the symbolic one: 3 plans, the other lengths carried (the
    256-token runs below cross 7 buckets)."""
    torch._dynamo.reset()
    want, got, plans = _generate("llama", 1, new_tokens=3, cache=None, check_buckets=False)
    assert torch.equal(got, want), (got.tolist(), want.tolist())
    _bucketed(plans, 5 + 3)
    assert len(plans) == 3, [p.specialization.get("sizes") for p in plans]
    assert list(plans[2].specialization["bucket"]["ranges"].values())[0] == [5, 8]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_dynamic_cache_generation_of_256_tokens(name):
    torch._dynamo.reset()
    want, got, plans = _generate(name, 1, new_tokens=256, cache=None)
    assert got.shape == (1, 5 + 256) and torch.equal(got, want)
    _bucketed(plans, 5 + 256)


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["static", None])
def test_generation_at_changing_batch_sizes(cache):
    """Batch 1, then 3 and 8 with the same compiled forward: the batch becomes a symbol too."""
    torch._dynamo.reset()
    want, got, plans = _generate("llama", 1, cache=cache, batches=(3, 8))
    assert torch.equal(got, want)
    assert len(plans) <= 2 * (math.ceil(math.log2(8)) + 1) + 2, [p.specialization.get("sizes") for p in plans]
