"""Persistent kernels in the zoo's plans and in a decode step (issue #25): launches and modelled time
with and without them.

    python bench/persistent.py [--target h100] [--models bert:base,gpt2:small,llama:small,resnet:small]
                               [--decode 2] [--json bench/results/persistent_h100.json]

For each model (``tilefuse.zoo``, random weights, fp16, batch 1) and launch mode (per launch; CUDA
graph) the plan is compiled twice, without persistent kernels and with ``persistent="auto"``
(``codegen/triton/persistent.py``: a run of consecutive generated kernels launched as one where
its simulated schedule models faster, ``cost/persistent.py``).  Recorded: kernels, launches,
the modelled total (``report.est_total_us``), the roofline bound and their ratio, the kernels' L2 floor (what they
request through L2, re-reads included, at the L2's bandwidth), and per run its
kernels and both modelled times.  Everything is MODELLED for the target: no GPU is used, no kernel
runs (the kernels are generated, not compiled).

``--decode N``: one decode step of a LLaMA-style model of N layers (hidden 2048, 32 query heads over
4 key/value heads, FFN 5632: TinyLlama's shape, random weights, fp16) with transformers' static
cache of 2048 positions, a prompt of 100 tokens already in it, as ``torch.compile`` gives it to
tilefuse (``options={"target": ..., "plan_only": True}``: planned for the GPU, run through
PyTorch here).  Its roofline is the weights and the cache read once at the DRAM's peak (the
cache's new rows written, not the whole cache).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="h100")
    ap.add_argument("--models", default="bert:base,gpt2:small,llama:small,resnet:small")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--decode", type=int, default=2, help="layers of the decode step (0: none)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    import tilefuse
    from tilefuse import zoo
    rows = []
    for spec in filter(None, args.models.split(",")):         # (--models "": the decode step alone)
        name, size = spec.split(":")
        model, (inputs,) = zoo.build(name, size)
        model = model.half()
        for graph in (False, True):
            rows.append(_row(f"{name} {size}", graph, lambda mode: tilefuse.compile(
                model, inputs, target=args.target, time_limit=args.time_limit, cuda_graph=graph, persistent=mode)))
    for graph in (False, True) if args.decode else ():
        rows.append(_row(f"llama decode step ({args.decode} layers, static cache 2048)", graph,
                         lambda mode: _decode_step(args.decode, args.target, mode, graph, args.time_limit)))
    record = {"what": "plans with and without persistent kernels (persistent='auto'); MODELLED times, no GPU",
              "command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(),
              "machine": platform.machine(), "torch": torch.__version__, "tilefuse": tilefuse.__version__,
              "target": args.target, "dtype": "float16", "batch": 1, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


def _row(model: str, graph: bool, compiled) -> dict:
    """A record of one model and launch mode: ``compiled(persistent)`` without and with "auto"."""
    row = {"model": model, "launch": "cuda_graph" if graph else "per_launch"}
    for mode in (False, "auto"):
        c = compiled(mode)
        r = c.report
        launches = len(c.kernels) - sum(j - i - 1 for i, j in c.persistent)
        row["persistent" if mode else "plain"] = {
            "kernels": len(c.kernels), "launches": launches, "est_us": r.est_total_us,
            "roofline_us": r.roofline_us, "vs_roofline": round(r.est_total_us / r.roofline_us, 3),
            "l2_floor_us": _l2_floor_us(r)}
        if mode:    # the runs as reported, less each task's tile-level waits (the edges say which
            # phases wait for some tasks of which: the record stays small; the report redraws from them)
            row["runs"] = [{**run, "phases": [{k: v for k, v in ph.items() if k != "needs"} for ph in run["phases"]]}
                           for run in r.persistent]
    p, q = row["plain"], row["persistent"]
    print(f"{model[:24]:24s} {row['launch']:10s} launches {p['launches']:4d} -> {q['launches']:4d}  "
          f"{p['est_us']:9.1f} -> {q['est_us']:9.1f} us (modelled; roofline {p['roofline_us']:.1f} us: "
          f"{p['vs_roofline']}x -> {q['vs_roofline']}x; the kernels' L2 bytes {q['l2_floor_us']:.1f} us)", flush=True)
    return row


def _l2_floor_us(report) -> float:
    """What the plan's kernels request through L2 (re-reads included: a GEMM's operands once per
    tile that reads them) at the target's L2 bandwidth: a floor on the plan's time that no launch
    mode, wait or prefetch lowers, only tiles that re-read less."""
    from tilefuse.cost.target import Target
    tgt = Target.get(report.target)
    return round(sum(k.l2_bytes for k in report.kernels) / tgt.l2_rate * 1e6, 2)


def _decode_step(layers: int, target: str, persistent, cuda_graph: bool, time_limit: float):
    """The CompiledModel of one decode step (the module docstring), planned for ``target``."""
    import torch
    from transformers import LlamaConfig, LlamaModel, StaticCache

    import tilefuse
    cfg = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                      num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaModel(cfg).eval().half()
    cache = StaticCache(config=cfg, max_cache_len=2048)
    torch._dynamo.reset()
    step = torch.compile(model.forward, backend="tilefuse",
                         options={"target": target, "plan_only": True, "persistent": persistent,
                                  "cuda_graph": cuda_graph, "time_limit": time_limit})
    with torch.no_grad():
        model(input_ids=torch.randint(0, 32000, (1, 100)), past_key_values=cache, cache_position=torch.arange(100))
        step(input_ids=torch.randint(0, 32000, (1, 1)), past_key_values=cache, cache_position=torch.tensor([100]),
             use_cache=True)
    return tilefuse.compiled_graphs()[-1]


if __name__ == "__main__":
    sys.exit(main())
