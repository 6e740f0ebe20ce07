"""Architecture sweep (issue #20 item 5): every model architecture of the installed transformers,
shrunk, with random weights, through ``tilefuse.compile`` (Triton kernels, ``verify=True``),
compared with eager PyTorch.

    python bench/sweep.py [--jobs 2] [--timeout 420] [--only bert,vit] [--json PATH]
    python bench/sweep.py --update --redo unsupported,crash   # run those again, merge into the JSON
    python bench/sweep.py --one bert          # one architecture in this process: prints its record
    python bench/sweep.py --table             # the JSON's table for bench/README.md

One entry per ``model_type`` of ``transformers.CONFIG_MAPPING``, built as its base model class
(``MODEL_MAPPING``), else the first task head of the auto mappings; a config without any auto
model class (a component such as ``clip_vision_model``'s parents' parts) is recorded as not
buildable.  The config is shrunk generically (``shrink``: rules on attribute names, applied to
the config and every nested sub-config), the model built in fp32 eval mode with weights re-drawn
by ``tilefuse.zoo.randomize``, and its inputs made from ``model.main_input_name`` (``inputs``).

Each architecture runs in its own forked process with a timeout (a hung or huge model must not
stop the sweep; the parent imports torch, transformers and tilefuse once) and ends in one outcome:

- ``not buildable``: the config, the model or eager itself fails (or eager is not deterministic);
  excluded from the pass rate, with the reason;
- ``pass``: compiled with ``verify=True`` and every output equals eager's (``tilefuse.verify.difference``);
- ``unsupported``: ``UnsupportedOperator``/``UnsupportedAttribute``/``ModelLoadError``, its one line;
- ``mismatch``: ``VerifyError`` (the stage and value it blames) or an output that differs from eager;
- ``crash``: any other exception (its type and first line);
- ``timeout``: the process ran past ``--timeout``.

``tests/test_sweep.py`` runs a fast subset through ``run_one``.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import inspect
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "sweep.json"
README = ROOT / "bench" / "README.md"

# The shrunk shape (issue #20: hidden <= 64, <= 2 layers, <= 4 heads, vocab <= 128, image <= 64 px).
HIDDEN, LAYERS, HEADS, VOCAB, IMAGE = 64, 2, 4, 128, 64
HEAD_DIM = 16           # per-head widths (head_dim, rope dims, LoRA ranks' heads)
FFN = 128               # intermediate (MLP) widths
EXPERTS, TOPK = 4, 2    # mixture-of-experts: experts per layer, experts per token
POSITIONS = 128         # position tables: longer than every input the sweep makes
SOURCE_POSITIONS = 32   # audio encoders' positions (Whisper takes exactly twice as many frames)
RESERVED = 16           # the top of the vocabulary holds the special tokens; inputs avoid it
BATCH, SEQ = 2, 8       # text inputs; vision inputs are one image

# Special cases where a generic rule cannot work: model_type -> {attribute: value} applied
# after shrinking.  Each entry says why.
OVERRIDES: dict[str, dict] = {}


# ------------------------------------------------------------------------------------------------
# Which class to build


def architectures() -> list[tuple[str, str | None]]:
    """(model_type, model class name or None) for every config of the installed transformers: the
    base model (``MODEL_MAPPING``), else the first task head of the auto mappings that has it."""
    import transformers.models.auto.modeling_auto as auto
    from transformers import CONFIG_MAPPING
    heads = [getattr(auto, n) for n in sorted(dir(auto))
             if n.startswith("MODEL_FOR_") and n.endswith("_MAPPING_NAMES") and isinstance(getattr(auto, n), dict)]
    out = []
    for model_type in sorted(CONFIG_MAPPING.keys()):
        name = auto.MODEL_MAPPING_NAMES.get(model_type)
        if name is None:
            name = next((m[model_type] for m in heads if model_type in m), None)
        if isinstance(name, (tuple, list)):
            name = name[0]
        out.append((model_type, name))
    return out


def model_class(name: str):
    import transformers
    return getattr(transformers, name)


# ------------------------------------------------------------------------------------------------
# Shrinking a config: rules on attribute names, first match wins.  Each rule maps a value to its
# shrunk value; ``Shrinker`` holds what the rules share across the config tree (the width divisor,
# the token ids above the new vocabulary, the original and new layer counts).

KIND_RULES = [
    ("skip", r"^(num_channels|in_channels|input_channels|out_channels|audio_channels|channels|num_labels|"
             r"chunk_size_feed_forward|type_vocab_size|num_feat_extract_layers|conv_kernel|d_conv|"
             r"num_conv_pos_embeddings|num_conv_pos_embedding_groups|input_size|num_codebooks)$"),
    ("vocab", r"(^|_)vocab_size$|^vocab_size_per_layer_input$|^num_embeddings$|^codebook_size$|^vocab_offset$|^n_words$"),
    ("token", r"(token_id|token_index|_token_ids|_token)$"),
    ("kv_heads", r"(key_value_heads|kv_heads|^n_head_kv|^num_kv_heads|^multi_query_group_num)$"),
    ("heads", r"(heads|^n_head|^n_heads|^attention_heads)$"),
    ("head_dim", r"(head_dim|head_size|^d_kv|^dim_head|^rotary_dim|^kv_lora_rank|^q_lora_rank|^d_head|"
                 r"^qk_rope_head_dim|^qk_nope_head_dim|^v_head_dim|^qk_head_dim)$"),
    ("ffn", r"(intermediate_size|ffn_dim|^n_inner|^d_ff|^mlp_dim|intermediate_dim|ffn_hidden_size|^inner_dim|"
            r"dim_feedforward|^d_inner|^encoder_ffn_dim|^decoder_ffn_dim|^hidden_dim_ffn)$"),
    ("layers", r"((^|_)layers|^n_layer|^depth|_depth|^num_blocks|^n_layers|^num_layer)$"),
    ("experts", r"(^num_experts|^n_routed_experts|^num_local_experts|^moe_num_experts|^num_experts_per_layer)$"),
    ("shared_experts", r"(shared_experts)$"),
    ("topk", r"(experts_per_tok|^moe_topk|^moe_k|^top_k|^topk|^num_selected_experts)$"),
    ("expert_groups", r"^(n_group|num_expert_group)$"),
    ("expert_topk_groups", r"^(topk_group|topk_groups)$"),
    ("positions", r"(max_position_embeddings|^n_positions|^n_ctx|_positions|^max_seq_len|^max_sequence_length|"
                  r"^max_length|^seq_length|^max_2d_position_embeddings)$"),
    ("image", r"(image_size|^img_size|^resolution)$"),
    ("patch", r"^patch_size$"),
    ("width", r"(hidden_size|^d_model|^n_embd|embed_dim|^dim$|hidden_dim|^embedding_size|^emb_dim|"
              r"embedding_dim|projection_dim|^width|^d_embed|_channels$|channel$|^conv_dim|hidden_sizes|embed_dims|"
              r"^dims$|^num_filters|_rank$|^proj_size|^output_dim|^encoder_hidden_dim|^classifier_proj_size|"
              r"^xvector_output_dim|^tdnn_dim|hidden_size_per_stage|_per_stage$)"),
]
KIND_RULES = [(k, re.compile(p)) for k, p in KIND_RULES]
STAGE_DEPTHS = re.compile(r"(^depths$|_depths$|^blocks_per_stage$|^stage_num_blocks$|^num_layers$|"
                          r"^stage_numb_of_layers$|^num_blocks$|^layers$|^depth$)")
LAYER_INDICES = re.compile(r"(indexes|indices|idxs|_layers$|layer_ids$|_layer_idx$)")
PATTERN = re.compile(r"(pattern|types?$|block|layout)")     # a string with a character per layer
BASE_FIELDS = {"transformers_version", "architectures", "output_hidden_states", "return_dict", "dtype",
               "chunk_size_feed_forward", "is_encoder_decoder", "id2label", "label2id", "problem_type"}


def kind(name: str) -> str | None:
    for k, pattern in KIND_RULES:
        if pattern.search(name):
            return k
    return None


def _ints(v) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _pow2_at_most(n: int, cap: int) -> int:
    """The largest power of two <= min(n, cap) (heads: 3 -> 2, 12 -> 4), at least 1."""
    return 1 << int(math.log2(max(1, min(n, cap))))


class Shrinker:
    """Shrinks a config and its sub-configs.  Widths are divided by one power of two for the whole
    tree (so widths that must be equal, or in proportion, stay so) chosen to bring the largest
    hidden size to <= HIDDEN, then rounded up to a multiple of 8; per-head widths likewise by
    their own divisor to <= HEAD_DIM; other sizes are clamped."""

    def __init__(self, root):
        widths, head_dims = [1], [1]
        for cfg in configs(root):
            for name, v in fields(cfg).items():
                k = kind(name)
                if k == "width" and (_int(v) or _ints(v)) and "hidden" in name or name in ("d_model", "n_embd", "embed_dim", "emb_dim", "dim"):
                    widths += [x for x in (v if isinstance(v, (list, tuple)) else [v]) if _int(x)]
                if k == "head_dim" and _int(v):
                    head_dims.append(v)
        self.width_div = _divisor(max(widths), HIDDEN >> doublings(root))
        self.head_div = _divisor(max(head_dims), HEAD_DIM)
        self.tokens: dict[int, int] = {}

    def width(self, v: int) -> int:
        if v <= 8:
            return v
        return max(8, -(-(v // self.width_div) // 8) * 8)

    def value(self, name: str, v, layers: int | None):
        """The shrunk value of attribute ``name`` (``layers``: the config's original layer count)."""
        k = kind(name)
        if isinstance(v, (list, tuple)) and v and layers and len(v) == layers and layers > LAYERS \
                and not _ints(v) or (isinstance(v, str) and PATTERN.search(name) and layers and len(v) == layers > LAYERS):
            return _select(v, LAYERS)                          # per-layer types ("sliding_attention", ...)
        if _ints(v) and STAGE_DEPTHS.search(name):
            return type(v)(min(x, 1) if x > 0 else x for x in v)   # blocks per stage
        if _ints(v) and layers and LAYER_INDICES.search(name) and k not in ("width", "heads") \
                and all(0 <= x < layers for x in v) and layers > LAYERS:
            kept = [x for x in v if x < LAYERS]
            return type(v)(kept or [LAYERS - 1])
        if k is None or k == "skip":
            return v
        if _ints(v):
            if k == "width":
                return type(v)(self.width(x) for x in v)
            if k == "heads":
                return type(v)(_pow2_at_most(x, HEADS) for x in v)
            if k == "layers":
                return type(v)(min(x, LAYERS) for x in v)
            if k == "image":
                return type(v)(min(x, IMAGE) for x in v)
            return v
        if not _int(v) or v <= 0:
            return v
        if k == "vocab":
            return min(v, VOCAB)
        if k == "token":
            return v if v < VOCAB - RESERVED else self.token(v)
        if k == "heads":
            return _pow2_at_most(v, HEADS)
        if k == "kv_heads":
            return v           # settled with the heads (``fix_heads``)
        if k == "head_dim":
            return max(2, -(-(v // self.head_div) // 2) * 2) if v > HEAD_DIM else v
        if k == "ffn":
            return min(FFN, self.width(v)) if v > FFN else v
        if k == "layers":
            return min(v, LAYERS)
        if k == "experts":
            return min(v, EXPERTS)
        if k == "shared_experts":
            return min(v, 1)
        if k == "topk":
            return min(v, TOPK)
        if k == "expert_groups":
            return min(v, 2)
        if k == "expert_topk_groups":
            return min(v, 1)
        if k == "positions":
            cap = SOURCE_POSITIONS if name == "max_source_positions" else POSITIONS
            return min(v, cap)
        if k == "image":
            return min(v, IMAGE)
        if k == "width":
            return self.width(v)
        return v

    def token(self, v: int) -> int:
        """Special token ids above the new vocabulary: distinct ids at its top, equal ids kept equal."""
        if v not in self.tokens:
            self.tokens[v] = VOCAB - 1 - len(self.tokens) % RESERVED
        return self.tokens[v]


def doublings(root) -> int:
    """How often a hierarchical vision model (Swin-like: per-stage ``depths``, no list of stage
    widths) doubles its width: the first stage's width is kept small enough for the last's."""
    for cfg in configs(root):
        values = fields(cfg)
        depths = values.get("depths")
        if _ints(depths) and not any(_ints(v) and kind(n) == "width" for n, v in values.items()):
            return min(len(depths) - 1, 3)
    return 0


def _divisor(largest: int, cap: int) -> int:
    d = 1
    while largest / d > cap:
        d *= 2
    return d


def _select(seq, n: int):
    """``n`` entries of a per-layer list, the first of each distinct kind first, in order."""
    picked: list[int] = []
    for i, x in enumerate(seq):
        if x not in [seq[j] for j in picked] and len(picked) < n:
            picked.append(i)
    for i in range(len(seq)):
        if len(picked) >= n:
            break
        if i not in picked:
            picked.append(i)
    out = [seq[i] for i in sorted(picked)]
    return "".join(out) if isinstance(seq, str) else type(seq)(out)


def fields(cfg) -> dict:
    """The config's own dataclass fields (not the PreTrainedConfig base's bookkeeping)."""
    return {f.name: getattr(cfg, f.name, None) for f in dataclasses.fields(cfg)
            if f.init and not f.name.startswith("_") and f.name not in BASE_FIELDS}


def configs(cfg):
    """``cfg`` and every config nested in it (sub-configs, encoder/decoder, backbone...)."""
    from transformers import PretrainedConfig
    yield cfg
    for v in vars(cfg).values():
        if isinstance(v, PretrainedConfig):
            yield from configs(v)


def layer_count(values: dict) -> int | None:
    for name in ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "decoder_layers", "encoder_layers", "depth"):
        if _int(values.get(name)):
            return values[name]
    return None


def shrink(config):
    """A shrunk copy of ``config`` (a PretrainedConfig instance) and of its sub-configs."""
    return _shrink(config, Shrinker(config))


def _shrink(cfg, s: Shrinker):
    from transformers import PretrainedConfig
    declared = {f.name: f.default for f in dataclasses.fields(cfg)}
    values = fields(cfg)
    layers = layer_count(values)
    kw = {}
    for name, v in values.items():
        if isinstance(v, PretrainedConfig):
            kw[name] = _shrink(v, s)
        elif declared.get(name, 0) is None and (_int(v) or _ints(v)) and kind(name) not in (None, "skip", "token", "image"):
            kw[name] = None          # derived in __post_init__ from what is shrunk (head_dim, kv heads...)
        elif isinstance(v, dict) and name.startswith("rope"):
            kw[name] = _rope(v, s)
        else:
            kw[name] = s.value(name, v, layers)
    fix_heads(values, kw)
    image = values.get("image_size")
    if _int(image) and _int(kw.get("image_size")) and kw["image_size"] < image:
        # windows (Swin's, SAM's) shrink with the image, so the last stage still holds a window
        ratio = kw["image_size"] / image
        for name, v in values.items():
            if name.endswith("window_size") and (_int(v) or _ints(v)):
                scale = lambda x: max(2, round(x * ratio)) if x > 2 else x   # noqa: E731
                kw[name] = scale(v) if _int(v) else type(v)(scale(x) for x in v)
    # Generic switches: no timm or pretrained backbone (nothing is downloaded), no cache outputs.
    for name, value in (("use_timm_backbone", False), ("use_pretrained_backbone", False), ("use_cache", False)):
        if name in values:
            kw[name] = value
    kw.update(OVERRIDES.get(getattr(cfg, "model_type", ""), {}))
    return type(cfg)(**kw)


def _rope(params: dict, s: Shrinker) -> dict:
    """RoPE parameters: sections of the rotary half-dim (mrope) scale with the head dims."""
    out = dict(params)
    for k, v in params.items():
        if _ints(v) and "section" in k:
            out[k] = type(v)(max(1, x // s.head_div) for x in v)
        elif k == "original_max_position_embeddings" and _int(v):
            out[k] = min(v, POSITIONS)
    return out


def fix_heads(values: dict, kw: dict) -> None:
    """Key/value heads divide the (shrunk) query heads: as many as them, one (MQA) or half (GQA)."""
    for name, v in values.items():
        if kind(name) != "kv_heads" or not _int(v) or kw.get(name) is None:
            continue
        heads_name = next((h for h in ("num_attention_heads", "n_head", "num_heads", "attention_heads")
                           if _int(kw.get(h))), None)
        if heads_name is None:
            kw[name] = min(v, HEADS)
            continue
        old_heads, heads = values[heads_name], kw[heads_name]
        kw[name] = heads if v >= old_heads else 1 if v == 1 else max(1, heads // 2)


# ------------------------------------------------------------------------------------------------
# Inputs from ``main_input_name``: candidate inputs in order; the first eager accepts is used.


def text_vocab(config) -> int:
    for cfg in configs(config):
        v = getattr(cfg, "vocab_size", None)
        if _int(v) and v > 0:
            return v
    return VOCAB


def _ids(config, batch: int, seq: int, g):
    import torch
    v = text_vocab(config)
    hi = v - RESERVED if v > 2 * RESERVED else v
    return torch.randint(min(3, hi - 1), hi, (batch, seq), generator=g)


def _first(config, names, default):
    for cfg in configs(config):
        for n in names:
            v = getattr(cfg, n, None)
            if _int(v) and v > 0:
                return v
            if _ints(v):
                return v[0]
    return default


def candidate_inputs(model, config, seed: int = 0):
    """Keyword-input dicts to try, most complete first."""
    import torch
    g = torch.Generator().manual_seed(seed)
    params = inspect.signature(model.forward).parameters
    name = model.main_input_name
    if isinstance(name, (list, tuple)):
        name = name[0]
    channels = _first(config, ("num_channels", "in_channels", "input_channels"), 3)
    image = _first(config, ("image_size", "img_size"), IMAGE)
    mels = _first(config, ("num_mel_bins", "feature_size", "input_feat_per_channel", "n_mels", "mel_dim"), 80)
    frames = 2 * _first(config, ("max_source_positions",), SOURCE_POSITIONS)
    mains = []
    if name == "input_ids":
        mains = [_ids(config, BATCH, SEQ, g)]
    elif name in ("pixel_values", "pixel_values_videos", "flattened_patches"):
        mains = [torch.randn(1, channels, image, image, generator=g), torch.randn(1, 2, channels, image, image, generator=g)]
    elif name == "input_values":
        mains = [torch.randn(BATCH, 1600, generator=g), torch.randn(BATCH, channels if channels < 8 else 1, 1600, generator=g)]
    elif name in ("input_features", "audio_mel", "spectrogram"):
        mains = [torch.randn(BATCH, mels, frames, generator=g), torch.randn(BATCH, frames, mels, generator=g)]
    elif name in ("inputs_embeds", "hidden_states", "inputs", "patch_embeds", "noise_embeds", "latents"):
        hidden = _first(config, ("hidden_size", "d_model", "n_embd"), HIDDEN)
        mains = [torch.randn(BATCH, SEQ, hidden, generator=g)]
    out = []
    for x in mains:
        base = {name: x}
        extra = {}
        if name == "input_ids" and "attention_mask" in params:
            mask = torch.ones(BATCH, SEQ, dtype=torch.long)
            mask[1, -2:] = 0          # padding in the second row: masks are part of what is checked
            extra["attention_mask"] = mask
        if "decoder_input_ids" in params and getattr(config, "is_encoder_decoder", False) or \
                "decoder_input_ids" in params and name != "input_ids":
            extra["decoder_input_ids"] = _ids(config, x.shape[0], SEQ - 2, g)
        if extra:
            out.append({**base, **extra})
            if "attention_mask" in extra:
                out.append({k: v for k, v in {**base, **extra}.items() if k != "attention_mask"})
        out.append(base)
    return out


# ------------------------------------------------------------------------------------------------
# One architecture


class NotBuildable(Exception):
    pass


def first_line(e: BaseException) -> str:
    s = str(e).strip()
    return f"{type(e).__name__}: {s.splitlines()[0] if s else ''}"[:300]


def build(model_type: str, class_name: str | None, seed: int = 0):
    """(model, kwargs, eager outputs): the shrunk model with random weights and inputs eager accepts."""
    import torch
    from transformers import CONFIG_MAPPING
    from tilefuse.zoo import randomize
    if class_name is None:
        raise NotBuildable("no model class in transformers' auto mappings (a component of another architecture)")
    try:
        config = shrink(CONFIG_MAPPING[model_type]())
    except Exception as e:      # noqa: BLE001 - recorded as the reason
        raise NotBuildable(f"config: {first_line(e)}") from e
    try:
        torch.manual_seed(seed)
        model = model_class(class_name)(config)
        randomize(model, seed)
        model = model.float().eval()
    except Exception as e:      # noqa: BLE001
        raise NotBuildable(f"model: {first_line(e)}") from e
    errors = []
    for kwargs in candidate_inputs(model, config, seed):
        try:
            with torch.no_grad():
                want = tensors(model(**kwargs))
                again = tensors(model(**kwargs))
        except Exception as e:  # noqa: BLE001
            errors.append(first_line(e))
            continue
        if not want:
            errors.append("the model returns no tensor")
            continue
        if len(want) != len(again) or any(not torch.equal(a, b) and not _both_nan(a, b) for a, b in zip(want, again)):
            raise NotBuildable("eager is not deterministic (two runs on the same inputs differ)")
        return model, kwargs, want
    if not errors:
        raise NotBuildable(f"no inputs for main_input_name {model.main_input_name!r}")
    raise NotBuildable(f"eager: {errors[0]}")


def _both_nan(a, b) -> bool:
    import torch
    return a.is_floating_point() and a.shape == b.shape and bool(torch.equal(torch.isnan(a), torch.isnan(b))) and \
        torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))


def tensors(out) -> list:
    import torch
    from torch.utils import _pytree as pytree
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def describe(kwargs: dict) -> dict:
    return {k: [str(v.dtype).replace("torch.", ""), list(v.shape)] for k, v in kwargs.items()}


def run_one(model_type: str, class_name: str | None = None, *, time_limit: float = 2.0, seed: int = 0,
            compile: bool = True) -> dict:
    """Build, compile and compare one architecture; the record ``bench/results/sweep.json`` holds."""
    import tilefuse
    from tilefuse.errors import ModelLoadError, UnsupportedAttribute, UnsupportedOperator
    from tilefuse.verify import VerifyError, difference
    if class_name is None:
        class_name = dict(architectures()).get(model_type)
    rec = {"model_type": model_type, "model_class": class_name}
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model, kwargs, want = build(model_type, class_name, seed)
        except NotBuildable as e:
            return {**rec, "outcome": "not buildable", "reason": str(e), "seconds": round(time.perf_counter() - t0, 1)}
        rec["inputs"] = describe(kwargs)
        rec["parameters"] = sum(p.numel() for p in model.parameters())
        if not compile:                 # --build-only: the shrinker and the inputs alone
            return {**rec, "outcome": "built", "seconds": round(time.perf_counter() - t0, 1)}
        try:
            compiled = tilefuse.compile(model, (), example_kwargs=kwargs, backend="triton", verify=True,
                                        time_limit=time_limit)
            got = tensors(compiled(**kwargs))
        except VerifyError as e:
            rec.update(outcome="mismatch", stage=e.stage, value=e.value, origin=str(e.origin) if e.origin else None,
                       reason=first_line(e))
        except (UnsupportedOperator, UnsupportedAttribute, ModelLoadError) as e:
            rec.update(outcome="unsupported", reason=first_line(e), operator=getattr(e, "op", None))
        except Exception as e:  # noqa: BLE001 - every other exception is a crash, recorded
            rec.update(outcome="crash", reason=first_line(e))
        else:
            rec.update(kernels=compiled.report.num_kernels, prims=compiled.report.num_prims)
            bad = None
            if len(got) != len(want):
                bad = f"{len(got)} outputs, eager has {len(want)}"
            for k, (g, w) in enumerate(zip(got, want)):
                d = difference(g, w)
                if d and bad is None:
                    bad = f"output {k} {d}"
            if bad:
                rec.update(outcome="mismatch", stage="output", reason=bad)
            else:
                rec.update(outcome="pass")
    rec["seconds"] = round(time.perf_counter() - t0, 1)
    return rec


# ------------------------------------------------------------------------------------------------
# The sweep: one process per architecture


def _fork(arch: tuple[str, str | None], time_limit: float, build_only: bool) -> tuple[int, int]:
    """Run one architecture in a forked child (the parent has imported torch, transformers and
    tilefuse once; a fresh interpreter per model would spend more time importing than compiling):
    (its pid, the read end of the pipe its record comes back on)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        return pid, r
    os.close(r)
    code = 0
    try:
        os.setpgid(0, 0)            # a timeout kills the child and anything it started
        os.nice(10)
        import torch
        torch.set_num_threads(1)
        rec = run_one(arch[0], arch[1], time_limit=time_limit, compile=not build_only)
    except BaseException as e:      # noqa: BLE001 - reported as a crash of the child
        rec, code = {"model_type": arch[0], "model_class": arch[1], "outcome": "crash",
                     "reason": f"sweep child: {first_line(e)}"}, 1
    with os.fdopen(w, "w") as f:
        f.write(json.dumps(rec))
    os._exit(code)


def _collect(arch, pid: int, r: int, status: int, started: float, timed_out: bool) -> dict:
    with os.fdopen(r) as f:
        text = f.read()
    seconds = round(time.perf_counter() - started, 1)
    if timed_out:
        return {"model_type": arch[0], "model_class": arch[1], "outcome": "timeout",
                "reason": f"ran past the sweep's timeout ({seconds:.0f} s)", "seconds": seconds}
    if text:
        return json.loads(text)
    why = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit status {os.WEXITSTATUS(status)}"
    return {"model_type": arch[0], "model_class": arch[1], "outcome": "crash",
            "reason": f"process died ({why}) without a record", "seconds": seconds}


def sweep(archs: list, jobs: int, timeout: float, time_limit: float, build_only: bool = False, log=print,
          on_record=None) -> list[dict]:
    """Every architecture in its own forked process, ``jobs`` at a time, each killed after
    ``timeout`` seconds.  Single-threaded: the parent only forks, waits and reads pipes."""
    import signal
    # Import once what every child needs (the fork inherits it), tilefuse's lazily imported
    # modules included, by compiling a tiny model: every child then runs the same code, even
    # when the tree changes during a sweep.  One thread: a forked child inherits no thread pool.
    import torch
    import transformers  # noqa: F401
    import tilefuse
    torch.set_num_threads(1)
    with torch.no_grad():
        tilefuse.compile(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()), (torch.randn(2, 4),),
                         verify=True)
    pending, running, records = list(archs), {}, []
    while pending or running:
        while pending and len(running) < jobs:
            arch = pending.pop(0)
            pid, r = _fork(arch, time_limit, build_only)
            running[pid] = (arch, r, time.perf_counter())
        time.sleep(0.05)
        for pid, (arch, r, started) in list(running.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            late = not done and time.perf_counter() - started > timeout
            if late:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _, status = os.waitpid(pid, 0)
            if done or late:
                del running[pid]
                rec = _collect(arch, pid, r, status, started, late)
                records.append(rec)
                if on_record is not None:
                    on_record(rec)
                log(f"[{len(records)}/{len(archs)}] {rec['model_type']}: {rec['outcome']} ({rec.get('seconds')} s) "
                    f"{rec.get('reason', '')[:160]}")
    return sorted(records, key=lambda rec: rec["model_type"])


OUTCOMES = ("pass", "unsupported", "mismatch", "crash", "timeout", "not buildable")


def summary(records: list[dict]) -> dict:
    counts = {o: sum(r["outcome"] == o for r in records) for o in OUTCOMES}
    buildable = len(records) - counts["not buildable"]
    return {"architectures": len(records), "buildable": buildable, "counts": counts,
            "pass_rate": round(counts["pass"] / buildable, 4) if buildable else None}


def versions() -> dict:
    import torch
    import transformers
    import triton
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "tilefuse"], cwd=ROOT).returncode:
        commit += "+uncommitted"
    return {"torch": torch.__version__, "triton": triton.__version__, "transformers": transformers.__version__,
            "tilefuse_commit": commit, "python": platform.python_version()}


def readme_table(data: dict) -> str:
    """The summary for ``bench/README.md``: counts, the pass rate and every non-passing architecture."""
    s = data["summary"]
    lines = ["| outcome | architectures |", "|---|---:|"]
    lines += [f"| {o} | {s['counts'][o]} |" for o in OUTCOMES]
    lines += ["", f"Pass rate over buildable architectures: **{s['counts']['pass']} / {s['buildable']} = "
                  f"{100 * (s['pass_rate'] or 0):.1f}%**.", ""]
    rows = [r for r in data["architectures"] if r["outcome"] not in ("pass", "not buildable")]
    if rows:
        lines += ["| architecture | class | outcome | reason |", "|---|---|---|---|"]
        for r in rows:
            stage = f" (stage `{r['stage']}`)" if r.get("stage") else ""
            lines.append(f"| {r['model_type']} | {r['model_class']} | {r['outcome']}{stage} | {_cell(r.get('reason', ''))} |")
    return "\n".join(lines)


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")[:240]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--one", help="run one model_type in this process and print its record")
    ap.add_argument("--only", help="comma-separated model types")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=420.0, help="seconds per architecture")
    ap.add_argument("--time-limit", type=float, default=2.0, help="tilefuse.compile's time_limit")
    ap.add_argument("--json", default=str(RESULTS))
    ap.add_argument("--build-only", action="store_true", help="build and run eager only (checks the shrinking)")
    ap.add_argument("--update", action="store_true",
                    help="re-run the architectures chosen (--only, --redo) and replace their records in --json")
    ap.add_argument("--redo", help="with --update: comma-separated outcomes whose architectures run again")
    ap.add_argument("--table", action="store_true", help="print the markdown table of --json and stop")
    args = ap.parse_args(argv)
    if args.table:
        print(readme_table(json.loads(Path(args.json).read_text())))
        return 0
    if args.one:
        print(json.dumps(run_one(args.one, time_limit=args.time_limit, compile=not args.build_only)), flush=True)
        return 0
    archs = architectures()
    kept: list[dict] = []
    if args.update and Path(args.json).exists():
        old = json.loads(Path(args.json).read_text())
        redo = set(args.redo.split(",")) if args.redo else set()
        chosen = {r["model_type"] for r in old["architectures"] if r["outcome"] in redo}
        chosen |= set(args.only.split(",")) if args.only else set()
        chosen |= {a[0] for a in archs} - {r["model_type"] for r in old["architectures"]}   # new ones
        kept = [r for r in old["architectures"] if r["model_type"] not in chosen]
        archs = [a for a in archs if a[0] in chosen]
    else:
        args.update = False
    if not args.update and args.only:
        wanted = set(args.only.split(","))
        archs = [a for a in archs if a[0] in wanted]
    t0 = time.time()
    ver = versions()
    commands = [" ".join(["python"] + [os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])]
    if args.update:
        commands = old.get("commands", [old.get("command")]) + commands
    wall = old.get("wall_seconds", 0) if args.update else 0
    total = len(architectures())
    done: list[dict] = []

    def write(rec: dict | None = None) -> dict:
        """The JSON as it stands, rewritten after every architecture: a sweep stopped at any point
        keeps what it ran, and ``--update`` goes on with the architectures it lacks."""
        if rec is not None:
            done.append({**rec, "tilefuse_commit": ver["tilefuse_commit"]})
        records = sorted(kept + done, key=lambda r: r["model_type"])
        data = {
            "commands": commands,      # the first sweep, then each --update (records name their commit)
            "date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores; no GPU: every kernel ran on the CPU "
                       "in Triton's interpreter (TRITON_INTERPRET=1)",
            "versions": ver,
            "settings": {"hidden": HIDDEN, "layers": LAYERS, "heads": HEADS, "vocab": VOCAB, "image": IMAGE,
                         "batch": BATCH, "seq": SEQ, "timeout_s": args.timeout, "time_limit": args.time_limit,
                         "jobs": args.jobs},
            "wall_seconds": wall + round(time.time() - t0),
            "complete": len(records) == total,
            "summary": summary(records),
            "architectures": records,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(args.json).with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(args.json)
        return data

    sweep(archs, args.jobs, args.timeout, args.time_limit, args.build_only,
          log=lambda line: print(line, flush=True), on_record=write)
    data = write()
    print(json.dumps(data["summary"]))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
