"""Compile every generated kernel of seven h100 plans natively for sm_90 (and the same plans'
kernels for sm_80) on this machine, no GPU; record what the binaries are.

    python bench/native.py [--plans bert,llama,sdpa,resnet50,mobilenetv2,g4,g11] [--archs 90,80]
                           [--target h100] [--label before] [--json bench/results/native_h100.json]

The plans are MODELLED (tilefuse's cost model chooses them, target h100 unless ``--target a100``
says otherwise, its kernels then compiled for sm_80 by default; fp16, batch 1); the
kernel figures are FROM THE COMPILED BINARY (``triton.compile`` for the architecture, then
Triton's bundled ``cuobjdump``: registers, spills, shared memory, HGMMA = wgmma, HMMA = mma.sync,
LDG widths, LDGSTS = cp.async, UTMALDG = TMA); nothing is measured on a GPU.  Plans:

- ``bert``: transformers' default BertModel (hidden 768, 12 layers, sdpa), seq 128;
- ``llama``: one LlamaDecoderLayer-sized LlamaModel layer at hidden 2048 (16 heads over 4 KV heads,
  FFN 5632, sdpa, causal mask), seq 512;
- ``sdpa``: ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, 32 heads x 2048 x 128;
- ``resnet50``: tilefuse.zoo's base ResNet (ResNet-50 shape), 224x224;
- ``mobilenetv2``: transformers' MobileNetV2 (depth multiplier 1.0), 224x224;
- ``g4``, ``g11``: MCFuser's GEMM chains relu(A @ B) @ D (bench/chains.py: G4 1x512x512x256x256,
  G11 4x1024x1024x128x128).

With ``--grounded`` the plans are made on the binaries (``compile(native=True)``: each kernel's
top alternatives compiled, occupancy and the tensor-core path from the binary, a spilling kernel
refused).  Per plan, family and architecture it records: kernels compiled, compile failures, spilling
kernels, kernels needing more shared memory than a block may have (``over_shared``), tensor-core
kernels and how many on wgmma (also among those whose problem has >= 64 rows),
the 16-byte share of global load instructions, kernels with a dot loop and how many are pipelined
(cp.async/TMA), and registers / shared memory binary vs model (ratio per kernel; mean and range).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

PLANS = ("bert", "llama", "sdpa", "resnet50", "mobilenetv2", "g4", "g11")


def build(name: str):
    """(model or function, example args) of a plan, fp16."""
    import torch
    import transformers as T
    torch.manual_seed(0)
    h = torch.float16
    if name == "bert":
        return T.BertModel(T.BertConfig(attn_implementation="sdpa")).eval().half(), \
            (torch.randint(0, 30522, (1, 128)),)
    if name == "llama":
        cfg = T.LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=1,
                            num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048,
                            attn_implementation="sdpa", use_cache=False)
        return T.LlamaModel(cfg).eval().half(), (torch.randint(0, 32000, (1, 512)),)
    if name == "sdpa":
        q, k, v = (torch.randn(1, 32, 2048, 128, dtype=h) for _ in range(3))
        return (lambda a, b, c: torch.nn.functional.scaled_dot_product_attention(a, b, c, is_causal=True)), (q, k, v)
    if name == "resnet50":
        from tilefuse import zoo
        model, _ = zoo.build("resnet", "base")
        return model.half().eval(), (torch.randn(1, 3, 224, 224, dtype=h),)
    if name == "mobilenetv2":
        cfg = T.MobileNetV2Config(num_channels=3, image_size=224, depth_multiplier=1.0)
        return T.MobileNetV2ForImageClassification(cfg).eval().half(), (torch.randn(1, 3, 224, 224, dtype=h),)
    if name in ("g4", "g11"):
        b, m, n, k, hh = {"g4": (1, 512, 512, 256, 256), "g11": (4, 1024, 1024, 128, 128)}[name]
        args = (torch.randn(b, m, k, dtype=h), torch.randn(b, k, n, dtype=h), torch.randn(b, n, hh, dtype=h))
        return (lambda a, bb, d: torch.relu(a @ bb) @ d), args
    raise SystemExit(f"unknown plan {name!r}; choose from {', '.join(PLANS)}")


def _rows_m(kernel) -> int:
    """Rows of the problem a dot kernel's program-split M axis covers (its extent)."""
    for a in kernel.axes:
        if a.block_name == "BLOCK_M":
            return a.extent
    return 0


def _has_dot(kernel) -> bool:
    from tilefuse.codegen.kernel import Dot, Loop

    def walk(body):
        for st in body:
            if isinstance(st, Dot):
                return True
            if isinstance(st, Loop) and walk(st.body):
                return True
            if hasattr(st, "body") and not isinstance(st, Loop) and walk(st.body):
                return True
        return False
    return walk(kernel.body)


def _dot_loop(kernel) -> bool:
    """A Dot over more than one K chunk (the printer's K loop) or inside a Loop of more than one
    trip (a chain's key loop): a loop Triton can pipeline."""
    from tilefuse.codegen.kernel import Dot, Loop

    def walk(body, looped):
        for st in body:
            if isinstance(st, Dot) and (looped or kernel.axis(st.k).chunks > 1):
                return True
            if isinstance(st, Loop) and walk(st.body, kernel.axis(st.axis).chunks > 1):
                return True
            if hasattr(st, "body") and not isinstance(st, Loop) and walk(st.body, looped):
                return True
        return False
    return walk(kernel.body, False)


def _ratio_stats(pairs):
    rs = [b / m for b, m in pairs if m > 0]
    if not rs:
        return None
    return {"mean": round(statistics.mean(rs), 3), "min": round(min(rs), 3), "max": round(max(rs), 3), "n": len(rs)}


def run_plan(name: str, archs, grounded: bool = False, target: str = "h100") -> dict:
    import tilefuse
    from tilefuse.codegen.triton.native import TMA_BOX_BYTES, NativeCompileError, compile_native
    from tilefuse.cost.model import occupancy
    from tilefuse.cost.target import A100, H100, PRESETS
    from tilefuse.native import binary_occupancy
    fn, args = build(name)
    t = time.time()
    cm = tilefuse.compile(fn, args, target=target, backend="triton", native=grounded)
    tgt = PRESETS[target]
    plan_s = time.time() - t
    jobs = [(b, kernel, work) for k, b in zip(cm.plan.kernels, cm.kernels)
            for kernel, work in zip(b.kernels, (k.schedule.work, *k.schedule.then))]
    out = {"plan_kernels": len(cm.kernels), "generated_kernels": len(jobs), "modelled_us": cm.report.est_total_us,
           "plan_seconds": round(plan_s, 1), "archs": {}}
    for arch in archs:
        per_family: dict[str, dict] = {}
        kernels = []
        t = time.time()
        for b, kernel, work in jobs:
            fam = per_family.setdefault(b.family, {"kernels": 0, "failures": 0, "spilling": 0, "over_shared": 0,
                                                   "tensor_core": 0,
                                                   "wgmma": 0, "tensor_core_64_rows": 0, "wgmma_64_rows": 0,
                                                   "dot_loops": 0, "pipelined_dot_loops": 0,
                                                   "_loads": {}, "_regs": [], "_smem": [], "_occ": []})
            fam["kernels"] += 1
            try:
                bin_ = compile_native(kernel, arch)
            except NativeCompileError as e:
                fam["failures"] += 1
                kernels.append({"kernel": kernel.name, "family": b.family, "error": str(e)[:500]})
                continue
            big = _rows_m(kernel) >= 64
            fam["spilling"] += bin_.spills
            # more shared memory than a block may have: the launch would fail on the GPU
            fam["over_shared"] += bin_.shared_bytes > (H100 if arch >= 90 else A100).smem_per_block
            if bin_.mma != "none" or _has_dot(kernel):
                fam["tensor_core"] += 1
                fam["wgmma"] += bin_.mma == "wgmma"
                fam["tensor_core_64_rows"] += big
                fam["wgmma_64_rows"] += big and bin_.mma == "wgmma"
            if _dot_loop(kernel):
                fam["dot_loops"] += 1
                fam["pipelined_dot_loops"] += bin_.pipelined
            for d in (bin_.loads, bin_.async_copies, {TMA_BOX_BYTES: bin_.tma_loads} if bin_.tma_loads else {}):
                for w, c in d.items():
                    fam["_loads"][w] = fam["_loads"].get(w, 0) + c
            fam["_regs"].append((bin_.registers, work.res.regs_per_thread))
            fam["_smem"].append((bin_.shared_bytes, work.res.smem_bytes))
            fam["_occ"].append((binary_occupancy(bin_, tgt), occupancy(work.res, tgt)))
            kernels.append({"kernel": kernel.name, "family": b.family, "grid": list(kernel.grid),
                            "blocks": {a.block_name: a.block for a in kernel.axes}, "warps": kernel.num_warps,
                            "stages": kernel.num_stages, "m_rows": _rows_m(kernel), **bin_.as_dict(),
                            "occupancy": binary_occupancy(bin_, tgt) if arch == tgt.arch else None,
                            "model_registers": work.res.regs_per_thread, "model_shared_bytes": work.res.smem_bytes,
                            "model_occupancy": occupancy(work.res, tgt)})
        for fam in per_family.values():
            loads = fam.pop("_loads")
            total = sum(loads.values())
            fam["wide_load_share"] = round(sum(c for w, c in loads.items() if w >= 16) / total, 3) if total else None
            regs = fam.pop("_regs")
            fam["registers_binary_over_model"] = _ratio_stats(regs)
            # the model within ±25% of the binary (issue #22's words; tests/test_native_plans.py)
            fam["registers_within_25"] = sum(0.75 <= m / b <= 1.25 for b, m in regs if b > 0)
            fam["shared_binary_over_model"] = _ratio_stats(fam.pop("_smem"))
            occ = fam.pop("_occ")
            fam["occupancy_model_above_binary"] = sum(m > b for b, m in occ) if arch == tgt.arch else None
        out["archs"][str(arch)] = {"families": per_family, "kernels": kernels,
                                   "compile_seconds": round(time.time() - t, 1)}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--archs", help="default: 90,80 for h100, 80 for a100")
    ap.add_argument("--target", default="h100", choices=("h100", "a100"))
    ap.add_argument("--label", default="")
    ap.add_argument("--json")
    ap.add_argument("--grounded", action="store_true",
                    help="plan on the binaries (compile(native=True): spilling kernels refused)")
    args = ap.parse_args(argv)
    import tilefuse
    import torch
    import triton
    archs = [int(a) for a in (args.archs or ("90,80" if args.target == "h100" else "80")).split(",")]
    results = {}
    for name in args.plans.split(","):
        r = run_plan(name, archs, args.grounded, args.target)
        results[name] = r
        for arch, a in r["archs"].items():
            for fam, f in sorted(a["families"].items()):
                print(f"{name:12s} sm_{arch} {fam:6s} kernels {f['kernels']:3d} fail {f['failures']} "
                      f"spill {f['spilling']} over-smem {f['over_shared']} wgmma {f['wgmma']}/{f['tensor_core']} "
                      f"(>=64 rows {f['wgmma_64_rows']}/{f['tensor_core_64_rows']}) "
                      f"pipelined {f['pipelined_dot_loops']}/{f['dot_loops']} 16B {f['wide_load_share']} "
                      f"regs b/m {(f['registers_binary_over_model'] or {}).get('mean')} "
                      f"(within 25% {f['registers_within_25']}/{f['kernels'] - f['failures']}) "
                      f"smem b/m {(f['shared_binary_over_model'] or {}).get('mean')}", flush=True)
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
        doc = {"what": f"generated kernels of MODELLED {args.target} plans, compiled for each arch; figures FROM THE "
                       "BINARY (triton.compile + cuobjdump), no GPU", "target": args.target, "label": args.label,
               "command": "python " + " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:])),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
               "versions": {"tilefuse": tilefuse.__version__, "torch": torch.__version__, "triton": triton.__version__,
                            "python": platform.python_version()},
               "machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "plans": results}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"written {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
