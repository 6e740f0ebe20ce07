"""transformers models for tests and benchmarks, built from configs with random weights (never downloaded).

``transformers`` is imported when a model is built (it is a test/benchmark dependency, not a
runtime one).

``build(name, size, batch=1, seq=None, attn="sdpa", input_sets=1)`` returns ``(model, [inputs, ...])``:
an fp32 model in eval mode with weights re-drawn by ``randomize`` and ``input_sets`` tuples of
example inputs (different values, same shapes) on the CPU.  Sizes:

- ``tiny``: the test zoo's shapes (hidden 32, 2 layers): seconds through the Triton interpreter.
- ``small``: a modest scale-up (hidden 256, 4 layers, seq 128; ResNet at 128x128 with four stages).
- ``base``: the published base configurations (BERT-base, GPT-2 small, ViT-B/16, ResNet-50, and a
  12-layer Llama with hidden 768 and grouped-query attention).

Text models take token ids (and an attention mask with a few trailing padded positions that differ
between input sets); vision models take pixels.  The test zoo (tests/test_models.py) has its own
shrunk configurations (nine models, every attention implementation) and shares ``randomize``.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

SIZES = ("tiny", "small", "base")

# Per size: the shared transformer shape.  ``seq`` is the default sequence length of text models.
TEXT = {
    "tiny": dict(hidden=32, layers=2, heads=4, kv_heads=2, ffn=64, vocab=99, seq=8),
    "small": dict(hidden=256, layers=4, heads=4, kv_heads=2, ffn=1024, vocab=8192, seq=128),
    "base": dict(hidden=768, layers=12, heads=12, kv_heads=4, ffn=3072, vocab=None, seq=128),
}
# Real vocabularies for ``base`` (vocab=None above).
BASE_VOCAB = {"bert": 30522, "gpt2": 50257, "llama": 32000}
# Llama's MLP is gated (three matrices): its base width is the usual 8/3 * hidden rounded.
LLAMA_FFN = {"tiny": 64, "small": 688, "base": 2048}

VIT = {
    "tiny": dict(image=16, patch=4),
    "small": dict(image=64, patch=8),
    "base": dict(image=224, patch=16),
}
RESNET = {
    "tiny": dict(image=32, embedding=8, hidden=[8, 16], depths=[1, 1]),
    "small": dict(image=128, embedding=32, hidden=[64, 128, 256, 512], depths=[1, 1, 1, 1]),
    "base": dict(image=224, embedding=64, hidden=[256, 512, 1024, 2048], depths=[3, 4, 6, 3]),
}


def _vocab(name: str, size: str) -> int:
    return TEXT[size]["vocab"] or BASE_VOCAB[name]


def _text_inputs(vocab: int, batch: int, seq: int, k: int, mask: bool) -> tuple:
    """Token ids, and a mask whose last ``k * max(1, seq // 16)`` positions (input set k) are padding."""
    ids = torch.randint(0, vocab, (batch, seq))
    if not mask:
        return (ids,)
    m = torch.ones(batch, seq, dtype=torch.long)
    pad = min(k * max(1, seq // 16), seq - 1)
    if pad:
        m[:, seq - pad:] = 0
    return ids, m


def bert(size, batch, seq, attn):
    import transformers as T
    s = TEXT[size]
    cfg = T.BertConfig(vocab_size=_vocab("bert", size), hidden_size=s["hidden"], num_hidden_layers=s["layers"],
                       num_attention_heads=s["heads"], intermediate_size=s["ffn"],
                       max_position_embeddings=max(512, seq), attn_implementation=attn)
    return T.BertModel(cfg), (lambda k: _text_inputs(cfg.vocab_size, batch, seq, k, mask=True))


def gpt2(size, batch, seq, attn):
    import transformers as T
    s = TEXT[size]
    cfg = T.GPT2Config(vocab_size=_vocab("gpt2", size), n_embd=s["hidden"], n_layer=s["layers"], n_head=s["heads"],
                       n_inner=s["ffn"], n_positions=max(1024, seq), bos_token_id=0, eos_token_id=0,
                       attn_implementation=attn, use_cache=False)
    return T.GPT2LMHeadModel(cfg), (lambda k: _text_inputs(cfg.vocab_size, batch, seq, k, mask=False))


def llama(size, batch, seq, attn):
    import transformers as T
    s = TEXT[size]
    cfg = T.LlamaConfig(vocab_size=_vocab("llama", size), hidden_size=s["hidden"], intermediate_size=LLAMA_FFN[size],
                        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                        num_key_value_heads=s["kv_heads"], max_position_embeddings=max(2048, seq),
                        attn_implementation=attn, use_cache=False)
    return T.LlamaForCausalLM(cfg), (lambda k: _text_inputs(cfg.vocab_size, batch, seq, k, mask=True))


def vit(size, batch, seq, attn):
    import transformers as T
    s, v = TEXT[size], VIT[size]
    cfg = T.ViTConfig(image_size=v["image"], patch_size=v["patch"], num_channels=3, hidden_size=s["hidden"],
                      num_hidden_layers=s["layers"], num_attention_heads=s["heads"], intermediate_size=s["ffn"],
                      num_labels=1000 if size == "base" else 10, attn_implementation=attn)
    return T.ViTForImageClassification(cfg), (lambda k: (torch.randn(batch, 3, v["image"], v["image"]),))


def resnet(size, batch, seq, attn):
    import transformers as T
    r = RESNET[size]
    cfg = T.ResNetConfig(num_channels=3, embedding_size=r["embedding"], hidden_sizes=r["hidden"], depths=r["depths"],
                         layer_type="bottleneck", num_labels=1000 if size == "base" else 10)
    return T.ResNetForImageClassification(cfg), (lambda k: (torch.randn(batch, 3, r["image"], r["image"]),))


BUILDERS: dict[str, Callable] = {"bert": bert, "gpt2": gpt2, "vit": vit, "resnet": resnet, "llama": llama}


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    """Weights ~ N(0, 1/fan_in), norm scales in [0.5, 1.5], biases and BN statistics O(0.1..1).

    The libraries' default init makes several of these nets' outputs (near) zero, and comparing
    zeros checks nothing; fan-in scaling keeps activations O(1) through depth.
    """
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p[0].numel()))
            elif name.endswith("weight"):
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                p.copy_((torch.rand(p.shape, generator=g) - 0.5) * 0.2)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)


def default_seq(size: str) -> int:
    return TEXT[size]["seq"]


def build(name: str, size: str, *, batch: int = 1, seq: int | None = None, attn: str = "sdpa",
          input_sets: int = 1, seed: int = 0) -> tuple[torch.nn.Module, list[tuple]]:
    """An fp32 eval-mode model with random weights, and ``input_sets`` example input tuples (CPU)."""
    if name not in BUILDERS:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(BUILDERS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; choose from {SIZES}")
    torch.manual_seed(seed)
    model, make_inputs = BUILDERS[name](size, batch, seq or default_seq(size), attn)
    randomize(model, seed)
    return model.eval(), [make_inputs(k) for k in range(input_sets)]
