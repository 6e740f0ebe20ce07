"""transformers' ``generate()`` with the model's forward under ``torch.compile(backend="tilefuse")``
(issue #24, item 2): with a static KV cache every decode step has the same shapes, so a prefill plan
and one decode plan serve the whole generation, and the tokens equal eager's (greedy decoding).
The dynamic cache (a new key length every step) needs plans over symbolic sizes, not built yet.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import tilefuse
from tilefuse.frontend.dynamo import TilefuseFallbackWarning

NEW_TOKENS = 6


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        bos_token_id=0, eos_token_id=None, pad_token_id=0))


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=128, n_embd=32, n_layer=1, n_head=4, n_positions=64,
                                      bos_token_id=0, eos_token_id=None, pad_token_id=0))


MODELS = {"llama": _llama, "gpt2": _gpt2}


def _generate(name: str, batch: int):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    ids = torch.randint(1, 128, (batch, 5), generator=torch.Generator().manual_seed(batch))
    kw = dict(max_new_tokens=NEW_TOKENS, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        want = model.generate(ids, **kw)
    before = len(tilefuse.compiled_graphs())
    model.forward = torch.compile(model.forward, backend="tilefuse", options={"interpreter": True, "time_limit": 2.0})
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("error", TilefuseFallbackWarning)      # no graph runs eagerly
        got = model.generate(ids, **kw)
    return want, got, tilefuse.compiled_graphs()[before:]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_static_cache_generation_is_two_plans_and_eager_tokens(name):
    torch._dynamo.reset()
    want, got, plans = _generate(name, 1)
    assert got.shape == (1, 5 + NEW_TOKENS)
    assert torch.equal(got, want), (got.tolist(), want.tolist())
    assert len(plans) == 2, [p.report.num_kernels for p in plans]     # the prefill, then every decode step
    assert all(p.report.num_kernels > 0 for p in plans)


@pytest.mark.slow
def test_static_cache_generation_at_other_batch_sizes():
    for batch in (3, 8):
        torch._dynamo.reset()
        want, got, plans = _generate("llama", batch)
        assert torch.equal(got, want), batch
        assert len(plans) == 2, batch
