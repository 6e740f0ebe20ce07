"""Attention in one chain kernel against the same graph without the chain family: planned (MODELLED)
for a GPU target on any machine, and MEASURED against eager, SDPA-flash and torch.compile where
CUDA is present.

    python bench/attention.py [--target h100] [--json bench/results/attention_h100.json]
        [--shapes S1,S2,...|mcfuser|llm|tiny] [--device cuda|cpu|none] [--variants eager,sdpa_flash,...]
        [--warmup 10] [--runs 50] [--budget-s 540]

Shapes (fp16, batch 1): MCFuser's Table III, S1-S9 (shared/papers/mcfuser-notes.md §4.2: heads as
given, M query length, N key length, K = H head dim), and LLM shapes: causal prefill at 512, 1024,
2048, 4096 positions and one decode token against 4096 keys, head dim 128, 32 query heads over 8
KV heads (``enable_gqa=True``).  ``fn`` is ``torch.nn.functional.scaled_dot_product_attention``.

MODELLED, per shape, planned for ``--target`` (no kernel runs; the inputs are empty CPU tensors):

- the chain plan: ``tilefuse.compile(fn, (q, k, v), target=..., backend="reference")``, its own
  plan and report;
- the plan without the chain family: the compile's PrimGraph planned by
  ``plan_strategies(pg, Coster(pg.types, target, families=[every family but chain]))["optimal"]``
  (QK^T with its scale, mask and softmax, then PV: two or three kernels);
- per plan: kernels (family, name, modelled µs with and without the launch, grid, warps, waves,
  occupancy, bound, DRAM bytes, schedule tile: ``plan.kernels[i].schedule.tile``), the total
  modelled µs **per launch** (every kernel's time including its launch, ``Target.launch_s``: what
  the planner minimizes) and the **kernel bodies** (the same minus one launch per kernel, two for
  a split-K gemm, which launches a reduction kernel), the DRAM traffic (the sum of the kernels'
  modelled bytes, what ``report.traffic_bytes`` is), TFLOP/s of the useful flops
  (4·b·h·M·N·K, half the scores for causal) over each total, and each total over the roofline;
- the roofline bound of the graph (``report.roofline_us``: compulsory bytes at peak bandwidth vs
  every prim's flops at peak: it counts all M·N scores even when causal, and the softmax's
  arithmetic at the fp32 CUDA-core peak), and the speedup chain vs without (bodies; per launch).

MEASURED (only where CUDA is available; ``--device cuda`` is the default there), per shape:
``eager`` (q@k^T·scale, causal mask, softmax, @v in torch; GQA's KV heads repeated),
``sdpa_flash`` (SDPA under ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)``; if flash refuses the
shape the default backend runs and the record says so), ``torch_compile_max_autotune``
(``torch.compile(fn, mode="max-autotune")``, its compile time is its first call) and
``tilefuse`` (``tilefuse.compile(fn, inputs, target="auto")``, called once to JIT its kernels) and
``tilefuse_graph`` (the same with ``cuda_graph=True``: the kernel replayed as a CUDA graph, so the
host's per-call path is not in the time; CUDA only).
Timing: ``tilefuse.cost.measure.cuda_timer`` (``--warmup`` untimed calls, then ``--runs`` calls
each between CUDA events with a 256 MiB L2 flush before each; median, p10, p90).  Every variant's
output is compared with an fp32 eager reference (tf32 off): relative L2 error, pass at <= 1e-2
and finite.  The JSON records torch, Triton, tilefuse versions, the GPU (name, driver, CUDA, SMs)
and the exact command.  Without CUDA the JSON says ``measured: null`` with the reason and the
script still exits on the modelled checks alone.  ``--device cpu`` runs the measuring path on the
CPU (Triton's interpreter; meant for the ``tiny`` shapes: a check of the script, not of speed).

Exit status 0 iff every chain plan is one chain kernel and models faster than the plan without
the chain family, both as kernel bodies and per launch (one-token decode included).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# MCFuser Table III: (name, heads, M, N, K = H)
MCFUSER = [("S1", 8, 512, 512, 64), ("S2", 12, 512, 512, 64), ("S3", 16, 512, 512, 64),
           ("S4", 12, 256, 256, 64), ("S5", 16, 256, 256, 64), ("S6", 16, 256, 256, 80),
           ("S7", 1, 512, 256, 64), ("S8", 1, 768, 384, 64), ("S9", 1, 1024, 512, 64)]
LLM_HEADS, LLM_KV_HEADS, LLM_HEAD_DIM = 32, 8, 128
PREFILL = (512, 1024, 2048, 4096)
DECODE_KV = 4096
VARIANTS = ("eager", "sdpa_flash", "torch_compile_max_autotune", "tilefuse", "tilefuse_graph")
TOL_FP16 = 1e-2          # relative L2 error against the fp32 reference (gpu_models.TOL["float16"])


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    group: str           # mcfuser | llm | tiny
    heads: int
    kv_heads: int
    m: int               # query length
    n: int               # key length
    d: int               # head dim (K = H)
    causal: bool
    label: str

    @property
    def gqa(self) -> bool:
        return self.kv_heads != self.heads

    @property
    def shapes(self) -> tuple[tuple[int, ...], ...]:
        return ((1, self.heads, self.m, self.d), (1, self.kv_heads, self.n, self.d),
                (1, self.kv_heads, self.n, self.d))

    @property
    def useful_flops(self) -> float:
        """4·b·h·M·N·K; causal (M = N): half the scores."""
        return 4 * self.heads * self.m * self.n * self.d * (0.5 if self.causal else 1.0)

    def meta(self) -> dict:
        return {"batch": 1, "heads": self.heads, "kv_heads": self.kv_heads, "M": self.m, "N": self.n,
                "K": self.d, "H": self.d, "causal": self.causal, "enable_gqa": self.gqa, "dtype": "float16",
                "label": self.label}


def cases() -> list[Case]:
    out = [Case(n, "mcfuser", h, h, m, nn, d, False, f"{h}×{m}×{nn}, d {d}") for n, h, m, nn, d in MCFUSER]
    out += [Case(f"prefill-{s}", "llm", LLM_HEADS, LLM_KV_HEADS, s, s, LLM_HEAD_DIM, True,
                 f"prefill {s}, causal, GQA 32/8, d 128") for s in PREFILL]
    out.append(Case(f"decode-{DECODE_KV}", "llm", LLM_HEADS, LLM_KV_HEADS, 1, DECODE_KV, LLM_HEAD_DIM, False,
                    f"decode: 1 query × {DECODE_KV} keys, GQA 32/8, d 128"))
    # for --device cpu (the measuring path under Triton's interpreter): not planned by default
    out += [Case("tiny", "tiny", 2, 2, 32, 32, 16, False, "2×32×32, d 16"),
            Case("tiny-gqa-causal", "tiny", 4, 2, 32, 32, 16, True, "4/2 heads, 32, causal, d 16"),
            Case("tiny-decode", "tiny", 4, 2, 1, 64, 16, False, "1 query × 64 keys, 4/2 heads, d 16")]
    return out


def select(all_cases: list, spec: str | None, default_groups=("mcfuser", "llm")) -> list:
    """``spec``: comma-separated names or group names (mcfuser, llm, tiny); None: the default groups."""
    if not spec:
        return [c for c in all_cases if c.group in default_groups]
    want = [w for w in spec.split(",") if w]
    names = {c.name for c in all_cases} | {c.group for c in all_cases}
    bad = [w for w in want if w not in names]
    if bad:
        raise SystemExit(f"unknown shape(s) {bad}; choose from {sorted(names)}")
    return [c for c in all_cases if c.name in want or c.group in want]


def sdpa_fn(case: Case):
    import torch.nn.functional as F
    causal, gqa = case.causal, case.gqa
    if gqa:
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def eager_fn(case: Case, device: str):
    """Attention written out in torch: q@k^T·scale, the causal mask, softmax, @v (KV heads repeated for GQA)."""
    import torch
    scale = 1.0 / math.sqrt(case.d)
    rep = case.heads // case.kv_heads
    mask = torch.ones(case.m, case.n, dtype=torch.bool, device=device).triu(1) if case.causal else None

    def eager(q, k, v):
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-2, -1)) * scale
        if mask is not None:
            s = s.masked_fill(mask, float("-inf"))
        return torch.softmax(s, dim=-1) @ v
    return eager


# ---------------------------------------------------------------------------------------------
# Shared with bench/chains.py: the modelled figures of a plan, the environment, the measuring.

def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
    except Exception:
        return None


def whole_group(pg):
    """The whole prim graph as one group (the kernel a family would make of all of it), writing
    the graph's outputs."""
    from tilefuse.families.base import Group
    made = {p.name for p in pg.prims}
    ins = tuple(dict.fromkeys(n for p in pg.prims for n in p.inputs if n not in made))
    return Group(pg.prims, ins, tuple(pg.outputs), dict(pg.types))


def launches_of(sched) -> int:
    """Kernel launches one planned kernel costs: a split-K gemm launches its reduction kernel too."""
    tile = getattr(sched, "tile", None)
    return 2 if sched.family == "gemm" and getattr(tile, "split", 1) > 1 else 1


def _tile_record(tile) -> dict | str | None:
    if tile is None:
        return None
    if dataclasses.is_dataclass(tile):
        return {"text": str(tile), **dataclasses.asdict(tile)}
    return str(tile)


def plan_figures(plan, pg, target, useful_flops: float, roofline_us: float) -> dict:
    """Kernels and totals of one plan, every figure modelled; times in µs."""
    from tilefuse.codegen import kernel_names
    from tilefuse.families import family
    scheds = [k.schedule for k in plan.kernels]
    names = kernel_names(scheds, pg.prims)
    kernels, total, body, launches, traffic, l2 = [], 0.0, 0.0, 0, 0, 0
    for k, s, name in zip(plan.kernels, scheds, names):
        cost = family(s.family).cost(s, target)
        n_launch = launches_of(s)
        b = cost.seconds - n_launch * target.launch_s
        total += cost.seconds
        body += b
        launches += n_launch
        traffic += int(cost.bytes)
        l2 += int(cost.l2_bytes)
        kernels.append({"family": s.family, "name": name, "modelled_us": round(cost.seconds * 1e6, 3),
                        "body_us": round(b * 1e6, 3), "launches": n_launch, "grid": int(cost.blocks),
                        "warps": cost.warps, "waves": cost.waves, "occupancy": cost.occupancy, "bound": cost.bound,
                        "dram_bytes": int(cost.bytes), "l2_bytes": int(cost.l2_bytes), "flops": int(cost.flops),
                        "tile": _tile_record(getattr(s, "tile", None)),
                        "ops": list(dict.fromkeys(p.origin.op for p in k.prims))})
    fig = {"num_kernels": len(kernels), "families": [k["family"] for k in kernels],
           "modelled_us": round(total * 1e6, 3), "body_us": round(body * 1e6, 3), "launches": launches,
           "traffic_bytes": traffic, "l2_bytes": l2,
           "tflops": round(useful_flops / total / 1e12, 1) if total > 0 else None,
           "tflops_body": round(useful_flops / body / 1e12, 1) if body > 0 else None,
           "over_roofline": round(total * 1e6 / roofline_us, 3) if roofline_us else None,
           "body_over_roofline": round(body * 1e6 / roofline_us, 3) if roofline_us else None,
           "kernels": kernels}
    if abs(plan.cost - total) > 1e-9 + 1e-6 * total:
        fig["note"] = (f"the plan's own cost {plan.cost * 1e6:.3f} us differs from the sum of its kernels' "
                       f"family costs {total * 1e6:.3f} us")
    return fig


def plan_pair(fn, inputs, useful_flops: float, target_name: str, objects: dict | None = None) -> dict:
    """The chain plan (tilefuse.compile) and the same PrimGraph planned without the chain family;
    ``objects``, if given, receives the CompiledModel ("compiled") and the other plan ("without")."""
    import tilefuse
    from tilefuse.cost.roofline import roofline
    from tilefuse.cost.target import Target
    from tilefuse.families import FAMILIES
    from tilefuse.ir.dtypes import DType
    from tilefuse.orchestrate.costing import Coster
    from tilefuse.orchestrate.strategies import plan_strategies
    target = Target.get(target_name)
    t0 = time.perf_counter()
    cm = tilefuse.compile(fn, inputs, target=target_name, backend="reference")
    t1 = time.perf_counter()
    pg, r = cm.primgraph, cm.report
    roof = roofline(pg, target)
    roof_us = float(r.roofline_us)
    peak = target.peak(DType.float16, True)
    chain = plan_figures(cm.plan, pg, target, useful_flops, roof_us)
    chain["report_est_total_us"] = r.est_total_us
    chain["report_traffic_bytes"] = int(r.traffic_bytes)
    if abs(chain["modelled_us"] - r.est_total_us) > 1e-2:
        chain["note"] = f"report.est_total_us {r.est_total_us} != the kernels' sum {chain['modelled_us']}"
    coster = Coster(pg.types, target, families=[f for f in FAMILIES if f.name != "chain"])
    plan_without = plan_strategies(pg, coster)["optimal"]
    without = plan_figures(plan_without, pg, target, useful_flops, roof_us)
    t2 = time.perf_counter()
    if objects is not None:
        objects.update(compiled=cm, without=plan_without)

    def ratio(a, b):
        return round(a / b, 3) if b else None
    return {
        "chain": chain, "without_chain": without,
        "speedup_body": ratio(without["body_us"], chain["body_us"]),
        "speedup": ratio(without["modelled_us"], chain["modelled_us"]),
        "speedup_graph_launches": ratio(without["body_us"] + without["launches"] * target.launch_graph_s * 1e6,
                                        chain["body_us"] + chain["launches"] * target.launch_graph_s * 1e6),
        "speedup_graph_launches_note": "derived, not re-planned: each plan's kernel bodies plus "
                                       "Target.launch_graph_s per launch (as CUDA-graph nodes)",
        "useful_flops": useful_flops,
        "roofline": {"us": roof_us, "memory_us": round(roof.memory_s * 1e6, 3),
                     "compute_us": round(roof.compute_s * 1e6, 3), "compulsory_bytes": int(r.compulsory_bytes),
                     "flops": int(r.total_flops), "bound": "memory" if roof.memory_s >= roof.compute_s else "compute",
                     "useful_us": round(max(roof.memory_s, useful_flops / peak) * 1e6, 3),
                     "useful_note": "max(memory_us, useful flops at the fp16 tensor-core peak): the bound with "
                                    "only the useful products (causal: half the scores; no softmax or "
                                    "activation arithmetic)"},
        "chain_body_over_useful_roofline": round(chain["body_us"] / (max(roof.memory_s, useful_flops / peak) * 1e6),
                                                 3),
        "report_strategies": r.strategies,
        "solver_status": r.solver.get("status"),
        "plan_seconds": {"compile": round(t1 - t0, 2), "without_chain": round(t2 - t1, 2)},
    }


def target_figures(target_name: str) -> dict:
    from tilefuse.cost.target import Target
    from tilefuse.ir.dtypes import DType
    t = Target.get(target_name)
    return {"name": t.name, "sm_count": t.sm_count, "dram_bw_Bps": t.dram_bw,
            "peak_fp16_tensor_flops": t.peak(DType.float16, True), "peak_fp32_flops": t.peak(DType.float32, False),
            "launch_s": t.launch_s, "launch_graph_s": t.launch_graph_s, "l2_bytes": t.l2_bytes}


def environment(device: str | None) -> dict:
    """Versions, machine, GPU (bench/gpu_models.py's helpers), the tilefuse checkout."""
    sys.path.insert(0, str(HERE))
    import gpu_models as gm
    status = _git("status", "--porcelain")
    out = {"versions": gm.versions(),
           "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                       "cpus": os.cpu_count(), "hostname": platform.node()},
           "tilefuse_source": {"path": str(ROOT), "git_commit": _git("rev-parse", "HEAD"),
                               "git_dirty_files": None if status is None else len(status.splitlines())}}
    if device == "cuda":
        out["device"] = gm.device_info("cuda")
    return out


def command() -> str:
    env = [f"PYTHONPATH={os.environ['PYTHONPATH']}"] if os.environ.get("PYTHONPATH") else []
    return " ".join(env + [Path(sys.executable).name, *sys.argv])


def resolve_device(arg: str | None) -> tuple[str | None, str | None]:
    """(device to measure on or None, why nothing is measured)."""
    import torch
    if arg == "none":
        return None, "--device none: measurement not requested"
    if arg == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    if arg in ("cuda", "cpu"):
        return arg, None
    if torch.cuda.is_available():
        return "cuda", None
    return None, "no CUDA device on this machine: every number is modelled, nothing measured"


def make_timer(device: str, warmup: int, runs: int):
    """cuda_timer (events, L2 flush, median) on CUDA; wall-clock on the CPU (a script check only)."""
    from tilefuse.cost.measure import cuda_timer, wall_timer
    if device == "cuda":
        return cuda_timer(warmup=warmup, reps=runs, flush_l2=True)
    return wall_timer(warmup=warmup, reps=runs)


def _percentile(xs, q: float) -> float:
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def rel_l2(out, ref) -> tuple[float, bool]:
    import torch
    o = out.double()
    finite = bool(torch.isfinite(o).all())
    den = float(ref.double().norm())
    return float((o - ref.double()).norm()) / max(den, 1e-30), finite


def run_variants(variants: dict, inputs: tuple, ref, timer, device: str, modelled_us: float | None,
                 useful_flops: float) -> dict:
    """variants: name -> prepare() returning (callable, info) or (callable, info, context manager
    held around its calls).  Each: compile/first call (wall), check against ``ref``, timing; an
    exception is recorded and the next variant runs."""
    import torch

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()
    out = {}
    for name, prepare in variants.items():
        rec: dict = {}
        out[name] = rec
        stage = "prepare"
        try:
            t0 = time.perf_counter()
            got = prepare()
            fn, info = got[0], got[1]
            ctx = got[2] if len(got) > 2 else contextlib.nullcontext()   # held around every call
            sync()
            rec.update(info)
            rec["prepare_s"] = round(time.perf_counter() - t0, 3)
            stage = "first call"
            with torch.no_grad(), ctx:
                t0 = time.perf_counter()
                y = fn(*inputs)
                sync()
                if isinstance(y, (tuple, list)):
                    y = y[0]
                rec["first_call_s"] = round(time.perf_counter() - t0, 3)
                stage = "check"
                err, finite = rel_l2(y.float(), ref)
                rec["check"] = {"rel_l2_vs_fp32": err, "finite": finite, "allowed": TOL_FP16,
                                "pass": finite and err <= TOL_FP16}
                del y
                stage = "timing"
                t = timer(lambda: fn(*inputs))
            us = [s * 1e6 for s in t.samples]
            rec.update(median_us=round(t.median_s * 1e6, 3), p10_us=round(_percentile(us, 0.1), 3),
                       p90_us=round(_percentile(us, 0.9), 3), runs=len(us),
                       tflops=round(useful_flops / t.median_s / 1e12, 1) if t.median_s > 0 else None)
            if name.startswith("tilefuse") and modelled_us:
                rec["modelled_us_for_target"] = modelled_us
        except Exception as e:       # recorded; the run goes on
            rec["error"] = f"{stage}: {type(e).__name__}: {e}"[:1500]
        print(f"    {name:28s} " + (f"ERROR {rec['error'][:200]}" if "error" in rec else
                                     f"{rec['median_us']:10.2f} us  rel L2 {rec['check']['rel_l2_vs_fp32']:.1e}"
                                     f"{'' if rec['check']['pass'] else '  WRONG'}"), flush=True)
    return out


def tilefuse_variant(fn, inputs, timer_device: str, cuda_graph: bool = False):
    """prepare() for the tilefuse variant: compile for this machine's device (target auto);
    ``cuda_graph``: the plan replayed as one CUDA graph (the kernel's time without the host's)."""
    def prepare():
        import tilefuse
        t0 = time.perf_counter()
        cm = tilefuse.compile(fn, inputs, target="auto", cuda_graph=cuda_graph)
        r = cm.report
        return cm, {"compile_s": round(time.perf_counter() - t0, 3), "target": r.target,
                    "num_kernels": r.num_kernels, "families": [k.family for k in r.kernels],
                    "kernels": [{"name": k.name, "family": k.family, "est_us": k.est_us, "grid": k.grid}
                                for k in r.kernels],
                    "est_total_us": r.est_total_us}
    return prepare


def torch_compile_variant(fn):
    def prepare():
        import torch
        torch._dynamo.reset()
        return torch.compile(fn, mode="max-autotune"), {"note": "compile happens at the first call (first_call_s)"}
    return prepare


PLAN_CONVENTIONS = {
    "modelled_us": "sum of the plan's kernels' modelled times, each including one launch "
                   "(Target.launch_s; two for a split-K gemm): per-launch, what the planner minimizes",
    "body_us": "the same without the launches (kernel bodies)",
    "speedup_body / speedup": "without-chain / chain, on body_us / on modelled_us",
    "speedup_graph_launches": "without-chain / chain on body_us + launch_graph_s per launch (derived)",
}


def measured_header(device: str | None, args, reference: str) -> dict | None:
    """How the measurements were taken (None without a device)."""
    if device is None:
        return None
    return {"device": device, "variants": list(args.variants), "warmup": args.warmup, "runs": args.runs,
            "timer": "tilefuse.cost.measure.cuda_timer: CUDA events, 256 MiB L2 flush before each timed call, "
                     "median" if device == "cuda" else "perf_counter (cpu: script check)",
            "reference": reference, "tolerance_rel_l2": TOL_FP16}


def finish(doc: dict, args, started: float, why_not: str | None, failures: list[str], notes=()) -> int:
    """Record the failures and the run time, write the JSON, say so; the exit status."""
    doc["failures"] = failures
    doc["ok"] = not failures
    doc["total_s"] = round(time.perf_counter() - started, 1)
    write_json(args.json, doc)
    if why_not:
        print(f"\nmeasured: null ({why_not})")
    for note in notes:
        print(f"\n{note}")
    if failures:
        print("\nFAILED checks (exit 1):")
        for f in failures:
            print("  " + f)
    if args.json:
        print(f"\nwritten {args.json} ({doc['total_s']} s)")
    return 0 if not failures else 1


def measured_within_budget(measure, case, device: str | None, args, started: float) -> dict | None:
    """``measure(case, device, args)``'s record; None without a device, a note once
    ``--budget-s`` is spent, the error if it raised (the run goes on)."""
    if device is None:
        return None
    if time.perf_counter() - started > args.budget_s:
        return {"skipped": f"the {args.budget_s:.0f} s budget was spent"}
    print(f"  {case.name}: measuring on {device}", flush=True)
    try:
        return measure(case, device, args)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:1500]}


def write_json(path: str | None, doc: dict) -> None:
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    os.replace(tmp, p)


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def print_table(head: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths))))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def measured_table(rows: list[dict], variants: tuple[str, ...], device: str | None = None) -> None:
    head = ["shape"] + [v + " us" for v in variants] + ["tilefuse modelled us"]
    out = []
    for rec in rows:
        m = rec.get("measured")
        if not m:
            continue
        cells = [rec["name"]]
        for v in variants:
            x = m.get(v)
            if x is None:
                cells.append("-")
            elif "error" in x:
                cells.append("ERROR")
            else:
                cells.append(f"{x['median_us']:.1f}" + ("" if x["check"]["pass"] else " WRONG"))
        tf = m.get("tilefuse", {})
        cells.append(_f(tf.get("est_total_us"), ".1f"))
        out.append(cells)
    if out:
        how = ("median of CUDA-event timings, L2 flushed" if device == "cuda" else
               "median wall-clock on the CPU, Triton interpreter: a check of the script, not of speed")
        print(f"\nMEASURED ({how}; WRONG: failed the fp32 check):")
        print_table(head, out)


# ---------------------------------------------------------------------------------------------

def measure_case(case: Case, device: str, args) -> dict:
    import torch

    from tilefuse.cost.measure import cuda_timer  # noqa: F401  (fails early if the module moved)
    gen = torch.Generator().manual_seed(0)
    real = tuple(torch.randn(s, generator=gen).to(device=device, dtype=torch.float16) for s in case.shapes)
    sys.path.insert(0, str(HERE))
    import gpu_models as gm
    with torch.no_grad(), gm.full_fp32(torch):
        ref = eager_fn(case, device)(*(x.float() for x in real)).float()
    fn = sdpa_fn(case)
    flash_info: dict = {}

    def flash_prepare():
        """SDPA with only the flash backend allowed (the context is held around the timed calls,
        not entered per call); the default backend if flash refuses the shape."""
        from torch.nn.attention import SDPBackend, sdpa_kernel
        try:
            with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                fn(*real)
            flash_info["backend"] = "flash"
            return fn, dict(flash_info), sdpa_kernel(SDPBackend.FLASH_ATTENTION)
        except Exception as e:
            flash_info["backend"] = "default"
            flash_info["flash_unavailable"] = f"{type(e).__name__}: {e}"[:500]
            return fn, dict(flash_info, note="the flash backend refused this call; the default SDPA backend ran")

    prep = {"eager": lambda: (eager_fn(case, device), {"what": "q@k^T*scale, mask, softmax, @v in torch"}),
            "sdpa_flash": flash_prepare,
            "torch_compile_max_autotune": torch_compile_variant(fn),
            "tilefuse": tilefuse_variant(fn, real, device),
            "tilefuse_graph": tilefuse_variant(fn, real, device, cuda_graph=True)}
    chosen = {v: prep[v] for v in args.variants}
    timer = make_timer(device, args.warmup, args.runs)
    out = run_variants(chosen, real, ref, timer, device, None, case.useful_flops)
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="h100", help="the target planned for (modelled figures)")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--shapes", default=None, help="comma-separated names or groups (mcfuser, llm, tiny); "
                    "default: mcfuser,llm")
    ap.add_argument("--device", default=None, choices=["cuda", "cpu", "none"],
                    help="where to measure (default: cuda when available, else nothing)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="measured variants, of " + ",".join(VARIANTS))
    ap.add_argument("--warmup", type=int, default=None, help="untimed calls (default 10 on cuda, 1 on cpu)")
    ap.add_argument("--runs", type=int, default=None, help="timed calls (default 50 on cuda, 3 on cpu)")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="stop measuring (planning goes on) once the run has taken this long")
    args = ap.parse_args(argv)
    sys.path[:0] = [str(ROOT)]
    import tilefuse  # noqa: F401  (first: without CUDA it selects Triton's interpreter before triton loads)
    import torch
    args.variants = tuple(v for v in args.variants.split(",") if v)
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variant(s) {bad}; choose from {VARIANTS}")
    device, why_not = resolve_device(args.device)
    args.warmup = args.warmup if args.warmup is not None else (10 if device == "cuda" else 1)
    args.runs = args.runs if args.runs is not None else (50 if device == "cuda" else 3)
    todo = select(cases(), args.shapes)
    started = time.perf_counter()
    doc = {"what": "attention: tilefuse's chain plan vs the same graph planned without the chain family. "
                   "Planned figures are MODELLED by tilefuse's analytic cost model for the target "
                   "(no kernel runs); 'measured' holds device timings where CUDA was available",
           "command": command(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           **environment(device),
           "target": target_figures(args.target),
           "conventions": {
               **PLAN_CONVENTIONS,
               "tflops / tflops_body": "useful flops (4*b*h*M*N*K, half the scores when causal) over "
                                       "modelled_us / body_us",
               "traffic_bytes": "modelled DRAM bytes of the plan's kernels (report.traffic_bytes)",
               "roofline": "report.roofline_us: max(compulsory bytes / peak DRAM bandwidth, every prim's flops "
                           "at its peak); its flops count all M*N scores (causal too) and the softmax's "
                           "arithmetic at the fp32 CUDA-core peak",
               "over_roofline / body_over_roofline": "modelled_us / roofline, body_us / roofline",
               "roofline.useful_us": "max(memory bound, useful flops / fp16 tensor-core peak): below the report's "
                                     "bound for causal attention (half the scores)"},
           "measured": measured_header(device, args, "fp32 eager attention, tf32 off"),
           "measured_reason": why_not,
           "cases": []}
    print(f"attention planned for {args.target}: MODELLED (no kernel runs). body = kernel bodies without "
          f"launches; total = per launch ({args.target} launch {doc['target']['launch_s'] * 1e6:.0f} us/kernel)")
    rows, failures = [], []
    for case in todo:
        q, k, v = (torch.empty(s, dtype=torch.float16) for s in case.shapes)
        rec = {"name": case.name, **case.meta()}
        try:
            rec.update(plan_pair(sdpa_fn(case), (q, k, v), case.useful_flops, args.target))
        except Exception as e:
            rec["error"] = f"planning: {type(e).__name__}: {e}"[:1500]
        c = rec.get("chain")
        checks = {"chain_is_one_chain_kernel": bool(c) and c["num_kernels"] == 1 and c["families"] == ["chain"],
                  "chain_faster_per_launch": bool(c) and rec["speedup"] is not None and rec["speedup"] > 1}
        rec["checks"] = checks
        # (the planner chooses by the time per launch: a chain whose body alone models slower than
        # the two GEMMs', chosen for the launch it saves, is a note, as in chains.py)
        rec["chain_faster_body"] = bool(c) and rec["speedup_body"] is not None and rec["speedup_body"] > 1
        failures += [f"{case.name}: {k_}" for k_, ok in checks.items() if not ok]
        rec["measured"] = measured_within_budget(measure_case, case, device, args, started)
        rows.append(rec)
        doc["cases"] = rows
        doc["total_s"] = round(time.perf_counter() - started, 1)
        write_json(args.json, doc)
        if c:
            w = rec["without_chain"]
            print(f"  {case.name:15s} chain {c['num_kernels']} k {c['body_us']:8.2f} / {c['modelled_us']:8.2f} us"
                  f" | w/o {w['num_kernels']} k {w['body_us']:8.2f} / {w['modelled_us']:8.2f} us"
                  f" | x{rec['speedup_body']:.2f} / x{rec['speedup']:.2f}", flush=True)
        else:
            print(f"  {case.name:15s} {rec['error'][:300]}", flush=True)

    print("\nMODELLED for", args.target, "(us; body = without launches, total = per launch)")
    head = ["shape", "chain k", "tile", "body", "total", "w/o k", "w/o fam", "w/o body", "w/o total",
            "x body", "x total", "TFLOP/s body", "MB chain", "MB w/o", "roofline", "body/roof", "useful roof",
            "body/useful"]
    table = []
    for rec in rows:
        c, w = rec.get("chain"), rec.get("without_chain")
        if not c:
            table.append([rec["name"], "ERROR"] + ["-"] * (len(head) - 2))
            continue
        tile = c["kernels"][0]["tile"] if c["num_kernels"] == 1 else None
        tile_s = (f"{tile['bm']}x{tile['bn']}x{tile['bk']}x{tile['bh']} w{tile['warps']} s{tile['stages']}"
                  if isinstance(tile, dict) and "bm" in tile else "-")
        table.append([rec["name"], str(c["num_kernels"]), tile_s, f"{c['body_us']:.2f}", f"{c['modelled_us']:.2f}",
                      str(w["num_kernels"]), "+".join(w["families"]), f"{w['body_us']:.2f}", f"{w['modelled_us']:.2f}",
                      f"{rec['speedup_body']:.2f}", f"{rec['speedup']:.2f}", _f(c["tflops_body"], ".0f"),
                      f"{c['traffic_bytes'] / 1e6:.2f}", f"{w['traffic_bytes'] / 1e6:.2f}",
                      f"{rec['roofline']['us']:.2f}", _f(c["body_over_roofline"], ".2f"),
                      f"{rec['roofline']['useful_us']:.2f}", _f(rec["chain_body_over_useful_roofline"], ".2f")])
    print_table(head, table)
    measured_table(rows, args.variants, device)
    doc["chain_body_slower"] = [r["name"] for r in rows if r.get("chain") and not r["chain_faster_body"]]
    notes = [f"chain kernel body models slower than the two GEMMs (chosen for the launch it saves): "
             f"{', '.join(doc['chain_body_slower'])}"] if doc["chain_body_slower"] else []
    return finish(doc, args, started, why_not, failures, notes)


if __name__ == "__main__":
    sys.exit(main())
