"""A fast subset of the architecture sweep (``bench/sweep.py``): transformers models of different
families, shrunk generically, with random weights, compiled with generated Triton kernels and
``verify=True``, compared with eager (``run_one``).  The whole sweep is in ``bench/results/sweep.json``
and its table in ``bench/README.md``."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent


def _sweep():
    spec = importlib.util.spec_from_file_location("tilefuse_bench_sweep", ROOT / "bench" / "sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


sweep = _sweep()

# One or two of each family: encoders, decoders (learned, rotary, ALiBi positions; GQA; parallel
# residual), encoder-decoders, mixture of experts, state spaces, vision transformers, convolutional
# nets (depthwise, batch norm), speech.  The slower ones (swin2sr: windows and cosine attention,
# whose near-zero normalized vectors once made verify blame rounding; 50 s) run with --runslow, and
# so do those tests/test_models.py compiles by default already (bert, vit, resnet, segformer,
# mobilenet_v2, llama: PyTorch and ONNX against eager) or whose family another covers here
# (whisper: t5 and wav2vec2; albert: bert; gpt_neox: llama's rotary, gpt2; gpt2 itself: bloom's
# decoder, and tests/test_models.py compiles it) or another test does
# (mixtral, 24 s: its experts' histc and grouped matmuls in tests/test_moe_ops.py), and mamba
# (20 s), moved out of the default run for time: state-space layers are then checked by --runslow
# only.
SUBSET = ["convnext"]
SLOW = ["deberta-v2", "t5", "bloom", "wav2vec2", "gpt2", "mixtral", "mamba", "albert", "gpt_neox", "qwen2", "bart", "swin2sr", "bert", "vit", "resnet", "segformer", "mobilenet_v2", "whisper", "llama"]


@pytest.fixture(scope="module", autouse=True)
def _kernel_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("sweep_cache")))
        yield


@pytest.mark.parametrize("model_type", SUBSET + [pytest.param(m, marks=pytest.mark.slow) for m in SLOW])
def test_architecture_compiles_through_kernels_and_matches_eager(model_type):
    rec = sweep.run_one(model_type)
    assert rec["outcome"] == "pass", rec
    assert rec["kernels"] > 0 and rec["prims"] >= rec["kernels"]


@pytest.mark.slow       # (11 s: every architecture's config; the harness's own check)
def test_shrunk_configs_respect_the_bounds():
    # every architecture's shrunk config and sub-configs: hidden <= 64, layers <= 2, heads <= 4,
    # vocab <= 128, image <= 64 px (the two SAM3 video configs rebuild a prompt encoder at its
    # default image size in __post_init__; the sweep records what they do)
    from transformers import CONFIG_MAPPING
    bounds = {"hidden_size": 64, "d_model": 64, "n_embd": 64, "emb_dim": 64, "num_hidden_layers": 2, "num_layers": 2,
              "n_layer": 2, "encoder_layers": 2, "decoder_layers": 2}
    kind_bounds = {"heads": 4, "vocab": 128, "image": 64}
    over, built = [], 0
    for model_type, _ in sweep.architectures():
        try:
            config = sweep.shrink(CONFIG_MAPPING[model_type]())
        except Exception:       # noqa: BLE001 - recorded as not buildable by the sweep
            continue
        built += 1
        for cfg in sweep.configs(config):
            for name, v in sweep.fields(cfg).items():
                limit = bounds.get(name, kind_bounds.get(sweep.kind(name)))
                values = v if isinstance(v, (list, tuple)) else [v]
                if limit and any(sweep._int(x) and x > limit for x in values):
                    over.append((model_type, type(cfg).__name__, name, v))
    assert built > 600
    assert {m for m, *_ in over} <= {"sam3_video", "sam3_tracker_video"}, over


def test_shrinking_divides_widths_by_one_power_of_two():
    from transformers import BertConfig
    c = sweep.shrink(BertConfig())       # 768 hidden, 12 heads of 64, 3072 intermediate, 12 layers
    assert (c.hidden_size, c.num_attention_heads, c.num_hidden_layers) == (48, 4, 2)
    assert c.intermediate_size <= sweep.FFN and c.vocab_size == sweep.VOCAB
    assert math.log2(768 // c.hidden_size).is_integer()
