"""Plan a LLaMA-style decoder for a GPU target on this (CPU) machine; record the modelled plans.

    python bench/plan_llama.py [--target h100] [--seq 128] [--json bench/results/plan_llama_h100.json]

Everything recorded is MODELLED by tilefuse's analytic cost model (docs/cost-model.md), not
measured: no kernel runs.  The model is tilefuse.zoo's base Llama shape (hidden 768, 12 query
heads over 4 KV heads, FFN 2048, RMSNorm, rotary embeddings, SwiGLU MLP, vocab 32000,
LlamaModel with use_cache=False, sdpa attention), fp16, batch 1, random weights.  Kernels per
layer are counted as the marginal kernels of one more layer: the plans of the same model with
2 and 3 layers (every layer identical), per strategy; the full 12-layer plan is recorded too.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time


def build(layers: int, seq: int):
    import torch
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048,
                                   num_hidden_layers=layers, num_attention_heads=12, num_key_value_heads=4,
                                   max_position_embeddings=2048, attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaModel(cfg).eval().half()
    return model, (torch.randint(0, 32000, (1, seq)),)


def plan(layers: int, seq: int, target: str) -> dict:
    import tilefuse
    model, args = build(layers, seq)
    t0 = time.perf_counter()
    c = tilefuse.compile(model, args, target=target, backend="reference")
    r = c.report
    return {"layers": layers, "compile_seconds": round(time.perf_counter() - t0, 2),
            "strategies": r.strategies, "roofline_us": r.roofline_us, "compulsory_bytes": r.compulsory_bytes,
            "kernels": [{"name": k.name, "family": k.family, "est_us": k.est_us,
                         "ops": [o.split(":")[0] for o in k.ops]} for k in r.kernels]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="h100")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import tilefuse
    import torch
    import transformers
    runs = {n: plan(n, args.seq, args.target) for n in (2, 3, 12)}
    per_layer = {s: runs[3]["strategies"][s]["num_kernels"] - runs[2]["strategies"][s]["num_kernels"]
                 for s in runs[3]["strategies"]}
    us_per_layer = {s: round(runs[3]["strategies"][s]["est_total_us"] - runs[2]["strategies"][s]["est_total_us"], 3)
                    for s in runs[3]["strategies"]}
    print(f"LLaMA-style decoder (hidden 768, 12/4 heads, FFN 2048), fp16, seq {args.seq}, target {args.target} "
          "(MODELLED, not measured)")
    print(f"{'strategy':9s} {'kernels/layer':>13s} {'us/layer':>9s} {'12 layers: kernels':>19s} {'us':>9s}")
    for s in per_layer:
        full = runs[12]["strategies"][s]
        print(f"{s:9s} {per_layer[s]:13d} {us_per_layer[s]:9.1f} {full['num_kernels']:19d} {full['est_total_us']:9.1f}")
    layer = runs[3]["kernels"][-per_layer["optimal"]:] if per_layer["optimal"] > 0 else []
    print("one layer (optimal, the 3-layer plan's last):")
    for k in layer:
        print(f"  {k['name'][:50]:50s} {k['family']:7s} {k['est_us']:7.2f}  {' '.join(k['ops'])}")
    out = {"what": "tilefuse plans of a LLaMA-style decoder; times are MODELLED by the analytic cost model, not measured",
           "command": " ".join(["python"] + sys.argv),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": {"platform": platform.platform(), "cpus": __import__("os").cpu_count()},
           "versions": {"tilefuse": getattr(tilefuse, "__version__", "?"), "torch": torch.__version__,
                        "transformers": transformers.__version__, "python": platform.python_version()},
           "config": {"hidden": 768, "heads": 12, "kv_heads": 4, "ffn": 2048, "vocab": 32000, "dtype": "float16",
                      "batch": 1, "seq": args.seq, "target": args.target},
           "kernels_per_layer": per_layer, "modelled_us_per_layer": us_per_layer,
           "kernels_per_layer_method": "kernels of the 3-layer plan minus those of the 2-layer plan (identical layers)",
           "plans": runs}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if per_layer["optimal"] <= 6 else 1


if __name__ == "__main__":
    sys.exit(main())
