"""Chains of two contractions in one kernel (the chain family, MCFuser): planned, and measured on a GPU.

    python bench/chains.py attention [--target h100] [--json bench/results/attention_h100.json]
    python bench/chains.py gemm      [--target h100] [--act relu|gelu] [--json bench/results/chains_h100.json]

``attention``: MCFuser's self-attention shapes S1-S9 (mcfuser-notes §4.2 Table III: heads as the
batch, M queries, N keys, K = H head dim) and LLM shapes (prefill at 512-4096 positions, head dim
128, 32 query heads over 8 KV heads, causal; decode: one query token against 4096 keys), fp16,
``scaled_dot_product_attention``.  ``gemm``: MCFuser's GEMM chains G1-G12 (Table II), fp16,
``act(A @ B) @ D``.

For each shape, planned for the target on this machine (MODELLED, no kernel runs): the chain plan
(tilefuse's optimal plan: kernels, families, modelled µs), the same graph planned without the
chain family (the kernels a compiler that stops at each contraction would use: QKᵀ, softmax, PV),
the speedup of one over the other, the model's roofline bound and the modelled time over it;
for GEMM chains also the tile MCFuser's own analytic model (Eq. 2-5, block-aware trip counts)
ranks first in its pruned space beside the tile tilefuse's model chose.  Launch overheads are
excluded from the compared times (``est_us`` minus one launch per kernel), so the comparison is
of the kernels' bodies; the totals with launches are recorded too.

With CUDA present (a lent GPU machine: torch 2.11, Triton 3.6) each shape is also MEASURED with
CUDA events (cost.measure.cuda_timer: warm-up, L2 flush, median): eager torch (cuBLAS products
and torch's softmax), SDPA with the flash backend (attention), torch.compile(mode="max-autotune"),
and tilefuse compiled for the device; each variant's output is checked against an fp32 reference
(relative L2 error), and the JSON records the GPU, driver and versions.  Without CUDA the JSON
says ``measured: null`` with the reason.

Exit status 0 iff every chain plan is one chain kernel (what the optimizer picks, launches
included); shapes whose chain kernel's body models slower than the kernels without it are
flagged (one-token decode: see bench/README.md).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time

# MCFuser Table III: (name, heads, M, N, K=H)
ATTENTION = [("S1", 8, 512, 512, 64), ("S2", 12, 512, 512, 64), ("S3", 16, 512, 512, 64),
             ("S4", 12, 256, 256, 64), ("S5", 16, 256, 256, 64), ("S6", 16, 256, 256, 80),
             ("S7", 1, 512, 256, 64), ("S8", 1, 768, 384, 64), ("S9", 1, 1024, 512, 64)]
LLM = [(f"prefill-{s}", s, s, True) for s in (512, 1024, 2048, 4096)] + [("decode-4096", 1, 4096, False)]
# MCFuser Table II: (name, batch, M, N, K, H)
GEMM = [("G1", 1, 512, 256, 64, 64), ("G2", 1, 512, 256, 64, 128), ("G3", 1, 512, 256, 64, 256),
        ("G4", 1, 512, 512, 256, 256), ("G5", 1, 512, 512, 512, 256), ("G6", 1, 512, 512, 1024, 256),
        ("G7", 1, 512, 512, 128, 128), ("G8", 1, 1024, 512, 128, 128), ("G9", 1, 2048, 512, 128, 128),
        ("G10", 1, 1024, 1024, 128, 128), ("G11", 4, 1024, 1024, 128, 128), ("G12", 8, 1024, 1024, 128, 128)]


def attention_cases():
    import torch
    import torch.nn.functional as F
    out = []
    for name, heads, m, n, d in ATTENTION:
        q, k, v = (torch.empty(1, heads, x, d, dtype=torch.float16) for x in (m, n, n))
        out.append((name, lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, k, v),
                    4 * heads * m * n * d, {"heads": heads, "M": m, "N": n, "K": d, "H": d}))
    for name, m, n, causal in LLM:
        q = torch.empty(1, 32, m, 128, dtype=torch.float16)
        k, v = (torch.empty(1, 8, n, 128, dtype=torch.float16) for _ in range(2))
        fn = (lambda causal: lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                          enable_gqa=True))(causal)
        scores = m * n / 2 if causal else m * n
        out.append((name, fn, (q, k, v), 4 * 32 * scores * 128,
                    {"heads": 32, "kv_heads": 8, "M": m, "N": n, "K": 128, "H": 128, "causal": causal}))
    return out


def gemm_cases(act: str):
    import torch
    f = torch.relu if act == "relu" else torch.nn.functional.gelu
    out = []
    for name, b, m, n, k, h in GEMM:
        a, bb, d = (torch.empty(b, *s, dtype=torch.float16) for s in ((m, k), (k, n), (n, h)))
        out.append((name, (lambda f: lambda a, b, d: f(a @ b) @ d)(f), (a, bb, d), 2 * b * m * n * (k + h),
                    {"batch": b, "M": m, "N": n, "K": k, "H": h, "act": act}))
    return out


def _plan_figures(plan, coster, target) -> dict:
    kernels = []
    body = 0.0
    for k in plan.kernels:
        cost, sched = coster.best(k.candidate)
        kernels.append({"family": sched.family, "us": round(cost.seconds * 1e6, 3),
                        "tile": str(getattr(sched, "tile", "")) or None, "bound": cost.bound})
        body += cost.seconds - target.launch_s
    return {"kernels": len(plan.kernels), "families": [k["family"] for k in kernels],
            "modelled_us": round(plan.cost * 1e6, 3), "modelled_body_us": round(body * 1e6, 3),
            "detail": kernels}


def plan_case(fn, args, flops, target_name: str) -> dict:
    """The chain plan and the plan without the chain family, modelled on the target."""
    import tilefuse
    from tilefuse.cost.target import Target
    from tilefuse.families import FAMILIES
    from tilefuse.orchestrate.costing import Coster
    from tilefuse.orchestrate.strategies import plan_strategies
    target = Target.get(target_name)
    cm = tilefuse.compile(fn, args, target=target_name, backend="reference")
    pg = cm.primgraph
    with_chain = Coster(pg.types, target)
    chain = _plan_figures(plan_strategies(pg, with_chain)["optimal"], with_chain, target)
    without = Coster(pg.types, target, families=[f for f in FAMILIES if f.name != "chain"])
    split = _plan_figures(plan_strategies(pg, without)["optimal"], without, target)
    roof = cm.report.roofline_us
    return {"chain": chain, "without_chain": split,
            "speedup_modelled": round(split["modelled_body_us"] / chain["modelled_body_us"], 3),
            "speedup_modelled_with_launches": round(split["modelled_us"] / chain["modelled_us"], 3),
            "chain_tflops_modelled": round(flops / (chain["modelled_body_us"] * 1e-6) / 1e12, 1),
            "roofline_us": roof, "chain_over_roofline": round(chain["modelled_body_us"] / roof, 2) if roof else None}


def mcfuser_choice(meta: dict, target_name: str) -> dict:
    """The tile MCFuser's analytic model ranks first in its pruned space (block-aware counts)."""
    from tilefuse.cost.target import Target
    from tilefuse.schedule import tiling
    target = Target.get(target_name)
    shape = tiling.ChainShape(meta["batch"], meta["M"], meta["N"], meta["K"], meta["H"], 2)
    params = tiling.ModelParams.of(target)
    best = None
    for c in tiling.pruned_space(shape, target.smem_per_block, convention="block"):
        est = tiling.estimate(shape, c, params, convention="block")
        if best is None or est.seconds < best[0]:
            best = (est.seconds, c)
    if best is None:
        return {"tile": None}
    return {"tiling": str(best[1].tiling), "tile": str(best[1].tile), "model_us": round(best[0] * 1e6, 3)}


def measure_case(fn, args, kind: str) -> dict:
    """Measured device times (CUDA only)."""
    import torch

    import tilefuse
    from tilefuse.cost.measure import cuda_timer
    timer = cuda_timer()
    real = tuple(torch.randn(a.shape, dtype=a.dtype, device="cuda") for a in args)
    with torch.no_grad():
        ref = fn(*(a.float() for a in real)).float()
    variants = {"eager": fn, "torch_compile_max_autotune": torch.compile(fn, mode="max-autotune"),
                "tilefuse": tilefuse.compile(fn, real, target="auto")}
    if kind == "attention":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def flash(*a):
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return fn(*a)
        variants["sdpa_flash"] = flash
    out = {}
    for name, f in variants.items():
        try:
            with torch.no_grad():
                y = f(*real).float()
                err = float((y - ref).norm() / ref.norm())
                t = timer(lambda: f(*real)).median_s
            out[name] = {"us": round(t * 1e6, 2), "rel_l2_error": err}
        except Exception as e:        # recorded, the run goes on
            out[name] = {"error": f"{type(e).__name__}: {e}"[:300]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kind", choices=["attention", "gemm"])
    ap.add_argument("--target", default="h100")
    ap.add_argument("--act", default="relu", choices=["relu", "gelu"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import tilefuse
    import torch
    cases = attention_cases() if args.kind == "attention" else gemm_cases(args.act)
    cuda = torch.cuda.is_available()
    rows, ok = [], True
    print(f"{args.kind} chains planned for {args.target} (MODELLED kernel bodies, launches excluded)")
    print(f"{'shape':12s} {'chain k':>7s} {'chain us':>9s} {'w/o k':>6s} {'w/o us':>9s} {'speedup':>8s} "
          f"{'TFLOP/s':>8s} {'/roofline':>9s}")
    for name, fn, inputs, flops, meta in cases:
        t0 = time.perf_counter()
        rec = {"name": name, **meta, "flops": flops}
        rec.update(plan_case(fn, inputs, flops, args.target))
        if args.kind == "gemm":
            rec["mcfuser_model_choice"] = mcfuser_choice(meta, args.target)
        rec["measured"] = measure_case(fn, inputs, args.kind) if cuda else None
        rec["plan_seconds"] = round(time.perf_counter() - t0, 2)
        rows.append(rec)
        c, w = rec["chain"], rec["without_chain"]
        ok &= c["kernels"] == 1 and c["families"] == ["chain"]
        flag = "" if rec["speedup_modelled"] > 1 else (
            f"   <- body slower; chosen with launches ({rec['speedup_modelled_with_launches']:.2f}x)")
        print(f"{name:12s} {c['kernels']:7d} {c['modelled_body_us']:9.2f} {w['kernels']:6d} {w['modelled_body_us']:9.2f} "
              f"{rec['speedup_modelled']:8.2f} {rec['chain_tflops_modelled']:8.1f} {rec['chain_over_roofline']:9.2f}"
              + flag)
    out = {"what": f"{args.kind} chains: tilefuse plans MODELLED by its cost model"
                   + ("" if cuda else "; no CUDA device: nothing measured"),
           "command": " ".join(["python"] + sys.argv),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": {"platform": platform.platform(), "cpus": __import__("os").cpu_count(),
                       "gpu": torch.cuda.get_device_name(0) if cuda else None},
           "versions": {"tilefuse": getattr(tilefuse, "__version__", "?"), "torch": torch.__version__,
                        "triton": __import__("triton").__version__, "python": platform.python_version()},
           "target": args.target,
           "measured": None if cuda else "no CUDA device on this machine",
           "ok": ok, "cases": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
