"""One LLaMA decode step with a static KV cache, measured (issue #25): eager, torch.compile with
CUDA graphs, tilefuse per launch, as one CUDA graph, and as persistent kernels; and the persistent
step called 10,000 times against eager (a race between phases shows as a rare mismatch).

    python bench/gpu_decode.py [--layers 2] [--hidden 2048] [--calls 10000] [--out PATH.json]
    python bench/gpu_decode.py --device cpu --hidden 256 --heads 4 --kv-heads 2 --ffn 512 \\
        --cache 256 --prompt 20 --calls 20 --runs 3        # checks the script (interpreter)

The model is TinyLlama's shape by default (hidden 2048, 32 query heads over 4 key/value heads, FFN
5632, vocab 32000; random weights, fp16), ``--layers`` layers, transformers' ``StaticCache`` of
``--cache`` positions holding a ``--prompt``-token prompt (written by the eager model).  The step
is ``model.forward`` of one token at position ``--prompt`` under ``torch.compile`` (the way a
static cache reaches a compiler), every call at that position: it rewrites the same cache row and
attends over the same prefix, so calls are alike and independent.  Variants (each its own cache):

- eager: ``model.forward`` as is;
- inductor_graph: ``torch.compile(mode="reduce-overhead")`` (inductor, CUDA graphs; CUDA only);
- tilefuse: ``backend="tilefuse"``, per-kernel launches;
- tilefuse_graph: ``options={"cuda_graph": True}`` (CUDA only);
- tilefuse_persistent: ``options={"persistent": "auto"}`` (the decode step's kernels as one
  persistent kernel where the simulated schedule models faster);
- tilefuse_persistent_graph: both (CUDA only).

Timing: ``--warmup`` calls, then ``--runs`` calls, each isolated (synchronize, CUDA events around
it), median/p10/p90 in µs (on CPU: host time of interpreted kernels, which says nothing about
speed); on CUDA also ``device_busy_us``, the GPU's own time per step (torch.profiler's device
operations over 20 steps, durations summed; the counter's rewind, one fill per layer, included),
and for the persistent variants each persistent kernel's measured schedule beside its simulated
one (``CompiledModel.trace_persistent``: every task's clock readings on the GPU).  Correctness: every variant's hidden state on 4 tokens against an fp32 copy of the model
with its own fp32 cache (relative L2 error <= max(1e-2, 4 x eager fp16's)), and its cache row
against eager's.  Race check: the persistent variants are called ``--calls`` times on random
tokens and every ``--check-every``-th output is checked the same way.  Roofline: the weights
(without the embedding table: one row is read) and the cache's filled rows read once, the new rows
written, at the measured device-to-device copy rate and at the target's modelled DRAM rate.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]
import gpu_models as gm  # noqa: E402  (bench/gpu_models.py: timing, checks, versions)

# In the order run: what the issue asks about first (a run cut short keeps what it measured)
VARIANTS = ("eager", "tilefuse_persistent", "tilefuse_graph", "inductor_graph", "tilefuse_persistent_graph",
            "tilefuse")
OPTIONS = {"tilefuse": {}, "tilefuse_graph": {"cuda_graph": True}, "tilefuse_persistent": {"persistent": "auto"},
           "tilefuse_persistent_graph": {"cuda_graph": True, "persistent": "auto"}}
CHECK_TOKENS = 4


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--cache", type=int, default=2048, help="static cache positions")
    ap.add_argument("--prompt", type=int, default=100, help="tokens already in the cache")
    ap.add_argument("--variants", default=None, help="comma-separated, of " + ",".join(VARIANTS))
    ap.add_argument("--device", default=None, choices=["cuda", "cpu"])
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--calls", type=int, default=10000, help="race check: calls of each persistent variant")
    ap.add_argument("--check-every", type=int, default=500)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def build(args, torch):
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.ffn,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, max_position_embeddings=args.cache,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    return cfg, LlamaModel(cfg).eval()


def main(argv=None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", message=".*past_key_values.*", category=FutureWarning)  # 5.2x renames it
    import torch

    import tilefuse  # before triton: without CUDA it selects Triton's interpreter
    from transformers import StaticCache
    dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    skipped = {v: "CUDA graphs need a CUDA device" for v in variants if v.endswith("graph") and dev != "cuda"}
    variants = [v for v in variants if v not in skipped]
    timer = gm.Timer(dev)
    cfg, model32 = build(args, torch)
    model32 = model32.to(dev)
    model = copy.deepcopy(model32).half()
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, args.vocab, (1, args.prompt), generator=g).to(dev)
    tokens = torch.randint(0, args.vocab, (CHECK_TOKENS, 1, 1), generator=g).to(dev)
    pos = torch.tensor([args.prompt], device=dev)

    def new_cache(m):
        cache = StaticCache(config=cfg, max_cache_len=args.cache)
        with torch.no_grad():
            m(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(args.prompt, device=dev))
        return cache

    def rewind(cache):
        # transformers' StaticLayer (5.2x) writes at its own counter, not at cache_position: set it
        # back so that every call writes the same row (older versions write at cache_position)
        for layer in cache.layers:
            if getattr(layer, "cumulative_length", None) is not None and torch.is_tensor(layer.cumulative_length):
                layer.cumulative_length.fill_(args.prompt)

    def call_of(fn, cache):          # one step at the prompt's position, the counter as it is
        return lambda tok: fn(input_ids=tok, past_key_values=cache, cache_position=pos,
                              use_cache=True).last_hidden_state

    def rewound(call, cache):        # the counter set back first: every step writes the same row
        def step(tok):
            rewind(cache)
            return call(tok)
        return step

    def new_row(cache):      # the step's cache row of every layer, keys and values
        return torch.cat([torch.cat([layer.keys[..., args.prompt, :].flatten(), layer.values[..., args.prompt, :].flatten()])
                          for layer in cache.layers]).float()

    with torch.no_grad(), gm.full_fp32(torch):
        cache32 = new_cache(model32)
        ref_step = rewound(call_of(model32.forward, cache32), cache32)
        ref32 = [[ref_step(t).clone()] for t in tokens]
    eager_cache = new_cache(model)
    eager_step = rewound(call_of(model.forward, eager_cache), eager_cache)
    with torch.no_grad():
        eager_out, eager_rows = [], []
        for t in tokens:
            eager_out.append([eager_step(t).clone()])
            eager_rows.append(new_row(eager_cache))
    eager_err = max(gm.compare(e, r, e, gm.TOL["float16"], None)["rel_l2_vs_fp32"] for e, r in zip(eager_out, ref32))

    def traced(step, tok) -> dict:
        """The persistent kernels' measured schedules beside the modelled ones
        (``CompiledModel.trace_persistent`` on the arguments dynamo gives the plan in one step)."""
        from tilefuse.runtime.compiled import CompiledModel
        seen, real = {}, CompiledModel.__call__
        CompiledModel.__call__ = lambda self, *a, **k: seen.update(model=self, args=a) or real(self, *a, **k)
        try:
            with torch.no_grad():
                step(tok)
        finally:
            CompiledModel.__call__ = real
        try:
            runs = seen["model"].trace_persistent(*seen["args"])
        except Exception as e:
            return {"trace_error": gm.error_text(e)}
        return {"trace": runs, "traced_over_modelled": [r["measured_over_modelled"] for r in runs]}

    def check(step, cache, ks) -> dict:
        checks = []
        with torch.no_grad():
            for k in ks:
                got = [step(tokens[k]).clone()]
                c = gm.compare(got, ref32[k], eager_out[k], gm.TOL["float16"], eager_err)
                row_err = float((new_row(cache) - eager_rows[k]).abs().max())
                if row_err > 1e-2 * float(eager_rows[k].abs().max()):
                    c.update({"pass": False, "why": f"cache row differs from eager's by {row_err:.2e}"})
                c["cache_row_max_abs_vs_eager"] = row_err
                checks.append(c)
        return gm.worst(checks)

    weights = sum(p.numel() * p.element_size() for p in model.parameters()) - model.embed_tokens.weight.nbytes \
        + model.embed_tokens.weight[0].nbytes
    kv_row = 2 * args.layers * args.kv_heads * (args.hidden // args.heads) * 2
    moved = weights + kv_row * (args.prompt + 1) + kv_row
    info = gm.device_info(dev)
    doc = {"what": "one decode step of a LLaMA-shaped model with a static KV cache: MEASURED on the device named",
           "command": "python " + " ".join(sys.argv), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "device": info, "versions": gm.versions(), "config": dict(vars(args)),
           "skipped_variants": skipped, "eager_rel_l2_vs_fp32": eager_err,
           "bytes_moved": moved, "variants": {}}
    if dev == "cuda":
        doc["roofline_us_at_copy_rate"] = round(moved / (info["copy_tb_s"] * 1e12) * 1e6, 2)
    rng = torch.Generator().manual_seed(2)
    race_tokens = torch.randint(0, args.vocab, (64, 1, 1), generator=rng).to(dev)

    def save():
        if args.out:
            Path(args.out).write_text(json.dumps(doc, indent=1, default=str))

    for v in variants:
        out: dict = {}
        doc["variants"][v] = out
        stage = "compile"
        try:
            torch._dynamo.reset()
            cache = new_cache(model) if v != "eager" else eager_cache
            if v == "eager":
                fn = model.forward
            elif v == "inductor_graph":
                fn = torch.compile(model.forward, mode="reduce-overhead")
            else:
                fn = torch.compile(model.forward, backend="tilefuse",
                                   options={"target": "auto", "time_limit": args.time_limit, **OPTIONS[v]})
            run = call_of(fn, cache)
            if v == "inductor_graph":
                inner = run

                def run(tok, inner=inner):
                    torch.compiler.cudagraph_mark_step_begin()
                    return inner(tok).clone()

            step = rewound(run, cache)
            with torch.no_grad():
                _, first = timer.wall(lambda: step(tokens[0]))
            out["first_call_s"] = round(first, 2)
            if v.startswith("tilefuse"):
                c = tilefuse.compiled_graphs()[-1]
                r = c.report
                out.update(kernels=len(c.kernels), launches=len(c.kernels) - sum(j - i - 1 for i, j in c.persistent),
                           persistent_runs=[[i, j] for i, j in c.persistent], est_total_us=r.est_total_us,
                           roofline_us_modelled=r.roofline_us, target=r.target,
                           graphs=len(tilefuse.compiled_graphs()))
            stage = "check"
            out["check"] = check(step, cache, range(CHECK_TOKENS))
            stage = "timing"
            with torch.no_grad():
                for k in range(args.warmup):
                    step(tokens[k % CHECK_TOKENS])
                us = []
                for k in range(args.runs):      # the counter's rewind outside the timed call
                    rewind(cache)
                    us.append(1e6 * timer.once(lambda: run(tokens[k % CHECK_TOKENS])))
            out.update(median_us=round(gm.percentile(us, 0.5), 2), p10_us=round(gm.percentile(us, 0.1), 2),
                       p90_us=round(gm.percentile(us, 0.9), 2), runs=args.runs)
            if dev == "cuda":     # the GPU's own time per step, apart from the host's
                with torch.no_grad():
                    out.update(gm.device_busy(step, list(tokens)))
                if "persistent" in v:
                    out.update(traced(step, tokens[0]))
            if "persistent" in v and args.calls:
                stage = "race check"
                fails, checked, t0 = [], 0, time.perf_counter()
                with torch.no_grad():
                    for k in range(args.calls):
                        if k % args.check_every == 0 or k == args.calls - 1:
                            c = check(step, cache, [k // args.check_every % CHECK_TOKENS])
                            checked += 1
                            if not c["pass"]:
                                fails.append({"call": k, **c})
                        else:
                            step(race_tokens[k % len(race_tokens)])
                timer.sync()
                out["race_check"] = {"calls": args.calls, "checked": checked, "failed": fails[:5],
                                     "failures": len(fails), "seconds": round(time.perf_counter() - t0, 2)}
        except Exception as e:
            out["error"] = f"{stage}: " + gm.error_text(e)
        ok = "error" not in out and out["check"]["pass"] and not out.get("race_check", {}).get("failures")
        print(f"{v:26s} " + (f"{out['median_us']:9.1f} us (device {out.get('device_busy_us', '-')})  check {'ok' if ok else 'FAILED'}"
                             f"  launches {out.get('launches', '-')}  modelled {out.get('est_total_us', '-')} us"
                             + (f"  race {out['race_check']['failures']}/{out['race_check']['checked']} failed"
                                if "race_check" in out else "")
                             if "error" not in out else "ERROR " + out["error"][:400]), flush=True)
        save()
    base = doc["variants"].get("eager", {}).get("median_us")
    for v, out in doc["variants"].items():
        if base and out.get("median_us"):
            out["vs_eager"] = round(base / out["median_us"], 3)
        if doc.get("roofline_us_at_copy_rate") and out.get("median_us"):
            out["vs_roofline"] = round(out["median_us"] / doc["roofline_us_at_copy_rate"], 3)
    save()
    print(f"bytes moved {moved / 1e6:.1f} MB; roofline at the copy rate: {doc.get('roofline_us_at_copy_rate')} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
