"""What compiling costs on this machine: wall-clock time and peak memory of ``tilefuse.compile``
(plan only: target h100, backend "reference"; no kernel is built or run).

    python bench/compile_cost.py [--model bert-base|tinyllama] [--json bench/results/compile_cost.json]
    python bench/compile_cost.py --one tinyllama      # one measurement, printed as JSON (a child run)

Each model is measured in a fresh Python process (``--one``), so the peak resident set
(``ru_maxrss``) is that compile's: the process's peak minus what it held once the model was
built (the weights, torch) is what compiling added, and the ratio of the whole peak to the
weights' bytes is the figure issue #21 bounds (at most 1.5×).  Models, random weights, batch 1:

- ``bert-base``: transformers' default BertConfig (12 layers, hidden 768), fp32, seq 128;
- ``tinyllama``: TinyLlama-1.1B's shape (LlamaConfig: hidden 2048, FFN 5632, 22 layers, 32 query
  heads over 4 KV heads, vocab 32000), fp16, seq 512, sdpa attention, use_cache=False.

Times are measured on this CPU machine (wall clock of the compile call); plans and every time in
them are modelled.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time


def build(name: str):
    import torch
    import transformers
    torch.manual_seed(0)
    if name == "bert-base":
        model = transformers.BertModel(transformers.BertConfig(attn_implementation="sdpa")).eval()
        return model, (torch.randint(0, 30522, (1, 128)),)
    if name == "tinyllama":
        cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                       num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                                       max_position_embeddings=2048, attn_implementation="sdpa", use_cache=False)
        with torch.device("meta"):
            model = transformers.LlamaModel(cfg)
        model = model.to_empty(device="cpu").half().eval()
        for p in model.parameters():          # random weights without an fp32 copy
            p.data.normal_(0, 0.02)
        return model, (torch.randint(0, 32000, (1, 512)),)
    raise SystemExit(f"unknown model {name!r}")


def _rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # Linux: KiB


def one(name: str) -> dict:
    import torch

    import tilefuse
    model, args = build(name)
    weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
    held = _rss()
    t0 = time.perf_counter()
    c = tilefuse.compile(model, args, target="h100", backend="reference")
    seconds = time.perf_counter() - t0
    peak = _rss()
    return {"model": name, "compile_seconds": round(seconds, 2), "weights_bytes": weights,
            "rss_before_compile_bytes": held, "peak_rss_bytes": peak,
            "compile_added_bytes": peak - held, "peak_over_weights": round(peak / weights, 3),
            "kernels": c.report.num_kernels, "modelled_total_us": round(c.report.est_total_us, 2),
            "torch": torch.__version__}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", action="append", choices=["bert-base", "tinyllama"])
    ap.add_argument("--one", choices=["bert-base", "tinyllama"])
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one)))
        return 0
    rows = []
    for name in a.model or ["bert-base", "tinyllama"]:
        p = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True)
        if p.returncode:
            print(p.stderr[-3000:], file=sys.stderr)
            return 1
        rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{name}: compile {r['compile_seconds']} s (measured, this CPU), peak RSS "
              f"{r['peak_rss_bytes'] / 2**30:.2f} GiB = {r['peak_over_weights']}x the weights "
              f"({r['weights_bytes'] / 2**30:.2f} GiB); compiling added {r['compile_added_bytes'] / 2**30:.2f} GiB")
    if a.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
        with open(a.json, "w") as f:
            json.dump({"command": "python bench/compile_cost.py " + " ".join(argv or sys.argv[1:]),
                       "date": time.strftime("%Y-%m-%d"), "tilefuse_commit": commit,
                       "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (no GPU)", "runs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
