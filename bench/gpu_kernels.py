"""Per kernel: the model's time against the device's (MEASURED), and generated GEMMs against cuBLAS.

    python bench/gpu_kernels.py [--models bert,llama,resnet] [--size small] [--gemms default]
        [--parts kernels,gemms,stems] [--device cuda|cpu] [--budget-s 150] [--out PATH.json]

Part ``kernels``: each zoo model (fp16, batch 1) is planned for the attached GPU (``target="auto"``,
modelled: what ``tilefuse.compile`` does without ``measure``), and every kernel of the optimal plan
is run alone on sample inputs (``runtime/executor.kernel_runner``, the runner
``compile(measure=True)`` times) under ``cost.measure.cuda_timer`` (10 warm-ups, 50 calls, each
after an L2 flush; median).  Recorded per kernel: family, schedule key, the MODELLED time (the
plan's cost, launch included) and the MEASURED device time plus the same modelled launch, and
their ratio measured / modelled.

Part ``gemms``: one ``x @ w`` per shape (fp16); the planner's best schedule of the ``gemm`` family
(the generated Triton kernel) and of the ``library`` family (cuBLAS), each MODELLED and MEASURED
as above, and ``torch.matmul`` timed directly; TFLOP/s and GB/s (each operand moved once) from
the measured medians.  ``--gemms gemv``: a decode step's one-row projections.

Part ``stems`` (not run by default): ResNet-50's stem over the image NCHW as given (2-byte gathers,
a loop Triton does not pipeline) and channels-last padded to 4 and 8 channels (8- and 16-byte
async copies), each plan's kernels MODELLED and MEASURED, and the layout copy MEASURED (``stems_part``).

On ``--device cpu`` the same runs through Triton's interpreter with a wall-clock timer (tiny
shapes): a check of the script, meaningless as speed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

GEMMS = {
    "default": [(128, 768, 768), (128, 3072, 768), (128, 768, 3072), (512, 5632, 2048), (512, 2048, 5632),
                (2048, 2048, 2048), (4096, 4096, 4096), (16, 4096, 4096)],
    "tiny": [(16, 32, 32), (64, 48, 32)],
    # a decode step's projections (TinyLlama's 2048 / 5632, Llama-7B's 4096 / 11008): one row, the
    # weights streamed once; the small-M path's K loop pipelined (``--gemm-tiles``: its other stages)
    "gemv": [(1, 2048, 2048), (1, 5632, 2048), (1, 2048, 5632), (1, 4096, 4096), (1, 11008, 4096)],
    "gemv-tiny": [(1, 48, 1200)],
}


def timer_for(device: str):
    from tilefuse.cost.measure import cuda_timer, wall_timer
    return cuda_timer() if device == "cuda" else wall_timer(warmup=1, reps=2)


def plan_of(model, inputs, device: str, padded: bool | None = None):
    """(primgraph, optimal plan, coster, target) as ``tilefuse.compile`` plans them (modelled);
    with ``padded`` True or False, the ``padded_channels`` rewrite applied or not whatever the
    planner would choose (the other rewrites as it chooses)."""
    import torch

    from tilefuse import api
    from tilefuse.cost.target import Target
    from tilefuse.frontend.torch import import_torch
    tgt = Target.get("auto") if device == "cuda" else Target.get("h100")
    with torch.no_grad():
        imported = import_torch(model, inputs)
    pg, plans, coster, steps = api.choose_graph(api.prims(imported.graph), tgt, time_limit=10.0)
    (_, before, after), = [s for s in steps if s[0] == "padded_channels"]
    if padded is not None and padded != (after is not before):     # the other graph than chosen
        pg = api._padded(before) if padded else before
        plans, coster = api.orchestrate(pg, tgt, time_limit=10.0)
    return pg, plans["optimal"], coster, tgt


def timed(sched, pg, device: str, timer) -> float:
    import torch

    from tilefuse.runtime.executor import kernel_runner
    return timer(kernel_runner(sched, pg, torch.device(device))).median_s


def kernels_part(args, started: float) -> list[dict]:
    import torch

    from tilefuse import zoo
    dtype = getattr(torch, args.dtype)
    timer = timer_for(args.device)
    out = []
    for name in args.models:
        rec = {"model": name, "size": args.size, "dtype": args.dtype, "kernels": []}
        out.append(rec)
        try:
            model, sets = zoo.build(name, args.size)
            model = model.to(device=args.device, dtype=dtype)
            inputs = tuple(t.to(device=args.device, dtype=dtype if t.is_floating_point() else t.dtype)
                           for t in sets[0])
            pg, plan, coster, tgt = plan_of(model, inputs, args.device)
            launch = tgt.launch(False)
            rec.update(target=tgt.name, launch_us=round(launch * 1e6, 3),
                       modelled_total_us=round(plan.cost * 1e6, 3))
            for k in plan.kernels:
                if time.perf_counter() - started > args.budget_s:
                    rec["cut_short"] = f"the {args.budget_s:.0f} s budget was spent"
                    break
                cost, sched = coster.best(k.candidate)
                row = {"family": sched.family, "schedule": sched.key(), "prims": len(k.prims),
                       "modelled_us": round(cost.seconds * 1e6, 3), "bound": cost.bound}
                try:
                    row["measured_us"] = round((timed(sched, pg, args.device, timer) + launch) * 1e6, 3)
                    row["measured_over_modelled"] = round(row["measured_us"] / row["modelled_us"], 3)
                except Exception as e:       # recorded; the other kernels go on
                    row["error"] = f"{type(e).__name__}: {e}"[:600]
                rec["kernels"].append(row)
            ok = [r for r in rec["kernels"] if "measured_us" in r]
            rec["measured_sum_us"] = round(sum(r["measured_us"] for r in ok), 3)
            rec["modelled_sum_us"] = round(sum(r["modelled_us"] for r in ok), 3)
        except Exception as e:
            rec["error"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-2000:]
        print(summary_kernels(rec), flush=True)
    return out


def matmul_module(k: int, n: int, dtype, device):
    """``x @ w`` with ``w`` a constant [k, n] (a linear layer without bias)."""
    import torch

    class MatMul(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(k, n, dtype=dtype, device=device) / k ** 0.5,
                                        requires_grad=False)

        def forward(self, x):
            return x @ self.w
    return MatMul().eval()


# BM,BN,BK,WARPS,STAGES[,ws] of the fixed tiles timed for large GEMMs (``--gemm-fixed``): the
# Triton tutorials' Hopper tiles, and warp-specialized ones (``GemmTile.ws``: a producer warp group
# beside two consumers; 12 warps, never in the planner's space until measured)
FIXED_TILES = ("128,256,64,8,3;128,256,64,8,4;256,128,64,8,3;128,128,64,4,4;128,128,64,8,3;"
               "128,256,64,4,3,ws;128,256,64,4,4,ws;128,128,64,4,4,ws")


def _fixed(text: str, cand, pg, coster, tgt, device: str, timer, launch: float, flops: float, x, want) -> dict:
    """One fixed gemm tile (``BM,BN,BK,WARPS,STAGES[,ws]``, group-M order, descriptors on sm_90)
    of the contraction's group, modelled, run once on ``x`` against ``want`` (``torch.matmul``'s
    result: the relative L2 error) and timed."""
    import torch

    from tilefuse.codegen import kernel_names
    from tilefuse.codegen.kernel import TMA_ARCH
    from tilefuse.families.base import Group
    from tilefuse.families.gemm import _schedule, gemm_body
    from tilefuse.families.gemm.space import SWIZZLE, GemmTile
    from tilefuse.runtime.executor import build
    parts = text.split(",")
    bm, bn, bk, warps, stages = map(int, parts[:5])
    try:
        body = gemm_body(Group(cand.prims, cand.inputs, cand.outputs, dict(pg.types)))
        tile = GemmTile(bm, bn, bk, warps, stages, SWIZZLE, tma=tgt.arch >= TMA_ARCH, ws="ws" in parts[5:])
        sched = _schedule(body, tile, tgt)
        cost = coster.adopt(sched)
        step = build(sched, kernel_names([sched], pg.prims)[0])
        consts = pg.constant_map
        ins = [consts[n].data.to(device) if n in consts else x for n in step.inputs]
        (out,) = [torch.full(pg.types[n].shape, float("nan"), dtype=want.dtype, device=device) for n in step.outputs]
        step.run(ins, [out])
        rel = ((out.double() - want.double()).norm() / want.double().norm()).item()
        dev_s = timer(lambda: step.run(ins, [out])).median_s
    except Exception as e:
        return {"tile": text, "error": f"{type(e).__name__}: {e}"[:300]}
    return {"tile": str(tile), "modelled_us": round(cost.seconds * 1e6, 3), "measured_us": round((dev_s + launch) * 1e6, 3),
            "measured_tflops": round(flops / dev_s / 1e12, 1), "rel_l2": float(f"{rel:.3g}"), "ok": rel < 1e-2}


def gemms_part(args, started: float) -> list[dict]:
    import torch
    dtype = getattr(torch, args.dtype)
    timer = timer_for(args.device)
    out = []
    for m, n, k in GEMMS[args.gemms]:
        if time.perf_counter() - started > args.budget_s:
            out.append({"shape": [m, n, k], "skipped": f"the {args.budget_s:.0f} s budget was spent"})
            continue
        rec = {"shape": [m, n, k], "dtype": args.dtype}
        out.append(rec)
        try:
            mod = matmul_module(k, n, dtype, args.device)
            x = torch.randn(m, k, dtype=dtype, device=args.device)
            pg, plan, coster, tgt = plan_of(mod, (x,), args.device)
            launch = tgt.launch(False)
            flops = 2.0 * m * n * k
            moved = float((m * k + k * n + m * n) * x.element_size())    # each operand once: a GEMV's floor
            from tilefuse.analysis.classify import Category, classify
            kern = next((kk for kk in plan.kernels if any(classify(p) == Category.contraction for p in kk.prims)), None)
            if kern is None:
                raise RuntimeError(f"no contraction kernel in the plan: {[kk.candidate.names for kk in plan.kernels]}")
            rec["chosen"] = coster.best(kern.candidate)[1].family
            for fam in ("gemm", "library"):
                got = next(((c, s) for c, s in coster.options(kern.candidate) if s.family == fam), None)
                if got is None:
                    rec[fam] = {"error": f"no {fam} schedule for this shape"}
                    continue
                cost, sched = got
                dev_s = timed(sched, pg, args.device, timer)
                rec[fam] = {"schedule": sched.key(), "tile": str(getattr(sched, "tile", "")),
                            "modelled_us": round(cost.seconds * 1e6, 3),
                            "measured_us": round((dev_s + launch) * 1e6, 3),
                            "measured_tflops": round(flops / dev_s / 1e12, 1),
                            "measured_gbs": round(moved / dev_s / 1e9, 3)}
            # the generated kernel's next tiles in the model's order (the measurement loop's
            # top-k): which tile of the template comes nearest the library, measured
            alternatives = [(c, s) for c, s in coster.options(kern.candidate) if s.family == "gemm"][1:args.gemm_tiles]
            rec["gemm_alternatives"] = []
            for cost, sched in alternatives:
                dev_s = timed(sched, pg, args.device, timer)
                rec["gemm_alternatives"].append({"tile": str(sched.tile), "modelled_us": round(cost.seconds * 1e6, 3),
                                                 "measured_us": round((dev_s + launch) * 1e6, 3),
                                                 "measured_tflops": round(flops / dev_s / 1e12, 1),
                                                 "measured_gbs": round(moved / dev_s / 1e9, 3)})
            # tiles Hopper GEMMs are known to like (the Triton tutorials': 128 x 256 x 64 at 8 warps,
            # three or four stages), whatever the model ranks them: is any tile of the template
            # within 0.9x of cuBLAS (issue #22)?
            w = mod.w.detach()
            if min(m, n, k) >= args.fixed_from and args.gemm_fixed:
                want = torch.matmul(x, w)
                rec["gemm_fixed"] = [_fixed(text, kern.candidate, pg, coster, tgt, args.device, timer, launch, flops,
                                            x, want) for text in args.gemm_fixed.split(";")]
            dev_s = timer(lambda: torch.matmul(x, w)).median_s
            rec["torch_matmul"] = {"measured_us": round(dev_s * 1e6, 3), "measured_tflops": round(flops / dev_s / 1e12, 1),
                                   "measured_gbs": round(moved / dev_s / 1e9, 3)}
        except Exception as e:
            rec["error"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-2000:]
        print(summary_gemm(rec), flush=True)
    return out


# (the image's layout, its channels): "rows4" is the NCHW image through the ``padded_channels``
# rewrite (tilefuse's copy, rows of 4-channel pixels, a kernel row's taps one 16-byte K run); the
# others are planned without it
STEM_LAYOUTS = (("nchw", 3), ("rows4", 3), ("nhwc4", 4), ("nhwc8", 8))


def stem_module(channels: int, weight, device):
    """ResNet-50's stem, a 7 x 7 stride-2 convolution of 64 filters with BatchNorm and ReLU, reading
    the image NCHW as given (3 channels) or channels-last with its channels zero-padded to
    ``channels`` (the weight likewise: the same outputs)."""
    import torch
    import torch.nn.functional as F

    class Stem(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
            self.conv.weight.data = F.pad(weight, (0, 0, 0, 0, 0, channels - 3))
            self.bn = torch.nn.BatchNorm2d(64)

        def forward(self, x):
            return torch.relu(self.bn(self.conv(x if channels == 3 else x.permute(0, 3, 1, 2))))
    return Stem().eval().to(device=device, dtype=weight.dtype)


def stems_part(args, started: float) -> list[dict]:
    """The stem over each layout of ``STEM_LAYOUTS`` (issue #22's 16-byte question: the NCHW image
    is gathered 2 bytes at a time and its loop is not pipelined; a channels-last copy padded to 8
    channels is read in 16-byte async copies over 8/3 the K, tilefuse's row copy over 32/21):
    each plan's kernels MODELLED and MEASURED as in ``kernels`` (the row copy among them), and the
    copy that makes an input's layout (``permute`` + ``pad`` in torch) MEASURED; the outputs'
    largest difference from the NCHW layout's eager output."""
    import torch
    import torch.nn.functional as F
    dtype = getattr(torch, args.dtype)
    timer = timer_for(args.device)
    side = 224 if args.device == "cuda" else 32          # (the interpreter: a check of the script)
    torch.manual_seed(0)
    image = torch.randn(1, 3, side, side, dtype=dtype, device=args.device)
    weight = torch.randn(64, 3, 7, 7, dtype=dtype, device=args.device) / 12
    out = []
    with torch.no_grad():
        reference = stem_module(3, weight, args.device)(image).float()
    for layout, channels in STEM_LAYOUTS:
        if time.perf_counter() - started > args.budget_s:
            out.append({"layout": layout, "skipped": f"the {args.budget_s:.0f} s budget was spent"})
            continue
        rec = {"layout": layout, "channels": channels, "image": [1, 3, side, side], "kernels": []}
        out.append(rec)
        try:
            model = stem_module(channels, weight, args.device)
            make = (lambda: image) if channels == 3 else \
                (lambda c=channels: F.pad(image.permute(0, 2, 3, 1), (0, c - 3)).contiguous())
            x = make()
            with torch.no_grad():
                eager = model(x).float()
            rec["max_abs_diff_from_nchw_eager"] = float((eager - reference).abs().max())
            if channels != 3:
                rec["copy_measured_us"] = round(timer(make).median_s * 1e6, 3)
            pg, plan, coster, tgt = plan_of(model, (x,), args.device, padded=layout == "rows4")
            launch = tgt.launch(False)
            rec.update(target=tgt.name, modelled_total_us=round(plan.cost * 1e6, 3))
            if layout == "rows4" and not any(p.name.endswith("_rows4") for p in pg.prims):
                raise RuntimeError("the padded_channels rewrite made no row copy of the image")
            for k in plan.kernels:
                cost, sched = coster.best(k.candidate)
                row = {"family": sched.family, "schedule": sched.key(), "modelled_us": round(cost.seconds * 1e6, 3),
                       "measured_us": round((timed(sched, pg, args.device, timer) + launch) * 1e6, 3)}
                rec["kernels"].append(row)
            rec["measured_sum_us"] = round(sum(r["measured_us"] for r in rec["kernels"]), 3)
            if layout == "rows4":
                rec["copy_apart"] = _rows_apart(pg, coster, args.device, timer, launch)
        except Exception as e:
            rec["error"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-2000:]
        print(summary_stem(rec), flush=True)
    return out


def _rows_apart(pg, coster, device: str, timer, launch: float) -> list[dict]:
    """The row copy and the stem over it as kernels of their own, whatever the plan chose (it may
    fuse the copy back into the stem, which gathers the NCHW image again): each group of at most
    three prims that holds the copy and not the stem, or the stem and not the copy, with its
    best schedule, MODELLED and MEASURED."""
    from tilefuse.orchestrate.candidates import enumerate_candidates
    from tilefuse.orchestrate.segment import split_segments
    (copy,) = [p.name for p in pg.prims if p.name.endswith("_rows4")]
    conv = next(p.name for p in pg.prims if copy in p.inputs)
    rows = []
    for seg in split_segments(pg):
        for cand, _ in enumerate_candidates(seg, coster):
            names = list(cand.names)
            if len(names) > 3 or (copy in names) == (conv in names):
                continue
            got = coster.best(cand)
            if got is None:
                continue
            cost, sched = got
            rows.append({"kernel": "copy" if copy in names else "stem over the copy", "prims": names,
                         "family": sched.family, "modelled_us": round(cost.seconds * 1e6, 3),
                         "measured_us": round((timed(sched, pg, device, timer) + launch) * 1e6, 3)})
    return sorted(rows, key=lambda r: (r["kernel"], r["prims"]))


def summary_stem(rec: dict) -> str:
    if "error" in rec or "skipped" in rec:
        return f"[stem] {rec['layout']}: {rec.get('skipped') or 'ERROR ' + rec['error'].splitlines()[-1]}"
    return (f"[stem] {rec['layout']} ({rec.get('target')}): {len(rec['kernels'])} kernels, measured "
            f"{rec['measured_sum_us']} us vs modelled {rec['modelled_total_us']} us; the layout's copy "
            f"{rec.get('copy_measured_us', 0)} us; max |diff| from NCHW eager {rec['max_abs_diff_from_nchw_eager']:.3g}")


def summary_kernels(rec: dict) -> str:
    if "error" in rec:
        return f"[kernels] {rec['model']}: ERROR {rec['error'].splitlines()[-1]}"
    ratios = sorted(r["measured_over_modelled"] for r in rec["kernels"] if "measured_over_modelled" in r)
    med = ratios[len(ratios) // 2] if ratios else float("nan")
    within = sum(0.5 <= r <= 2.0 for r in ratios)
    return (f"[kernels] {rec['model']} ({rec.get('target')}): {len(rec['kernels'])} kernels, sum measured "
            f"{rec.get('measured_sum_us')} us vs modelled {rec.get('modelled_sum_us')} us; measured/modelled "
            f"median {med:.2f}, within 2x {within}/{len(ratios)}, range {ratios[:1]}..{ratios[-1:]}")


def summary_gemm(rec: dict) -> str:
    if "error" in rec:
        return f"[gemm] {rec['shape']}: ERROR {rec['error'].splitlines()[-1]}"
    g, lib, tm = rec.get("gemm", {}), rec.get("library", {}), rec.get("torch_matmul", {})
    return (f"[gemm] {rec['shape']} chosen={rec.get('chosen')}: generated {g.get('measured_us')} us "
            f"({g.get('measured_tflops')} TF/s; modelled {g.get('modelled_us')}), library "
            f"{lib.get('measured_us')} us (modelled {lib.get('modelled_us')}), torch.matmul {tm.get('measured_us')} us"
            f" ({g.get('measured_gbs')} / {tm.get('measured_gbs')} GB/s)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="bert,llama,resnet")
    ap.add_argument("--size", default="small")
    ap.add_argument("--gemms", default="default", choices=list(GEMMS))
    ap.add_argument("--parts", default="kernels,gemms")
    ap.add_argument("--gemm-tiles", type=int, default=1,
                    help="gemm schedules measured per shape in the model's order (the first is 'gemm')")
    ap.add_argument("--gemm-fixed", default=FIXED_TILES,
                    help="BM,BN,BK,WARPS,STAGES[,ws] tiles (';'-separated) checked and timed for GEMMs of --fixed-from a "
                         "side or more (ws: warp-specialized, 4 warps a group)")
    ap.add_argument("--fixed-from", type=int, default=2048)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--device", default=None, choices=["cuda", "cpu"])
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import torch

    from gpu_models import device_info, versions
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.models = [m for m in args.models.split(",") if m]
    started = time.perf_counter()
    result = {"command": " ".join(["python", "bench/gpu_kernels.py", *(argv if argv is not None else sys.argv[1:])]),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "versions": versions(),
              "device": device_info(args.device),
              "note": "modelled_us: the plan's cost model; measured_us: CUDA events on this device (device time) "
                      "plus the modelled launch; on cpu: Triton's interpreter, wall clock (a script check only)"}
    out = Path(args.out or f"bench/results/gpu_kernels_{args.device}.json")

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    parts = args.parts.split(",")
    if "stems" in parts:
        result["stems"] = stems_part(args, started)
        save()
    if "gemms" in parts:
        result["gemms"] = gemms_part(args, started)
        save()
    if "kernels" in parts:
        result["kernels"] = kernels_part(args, started)
    result["seconds"] = round(time.perf_counter() - started, 1)
    save()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
