"""End-to-end latency of transformers models: eager PyTorch, torch.compile (inductor), tilefuse,
and tilefuse replayed as one CUDA graph (MEASURED on the device the script runs on).

    python bench/gpu_models.py [--size small|base|tiny] [--models bert,gpt2,vit,resnet,llama]
        [--dtype float16] [--batch 1] [--seq N] [--device cuda|cpu] [--out PATH.json]

Per model (tilefuse/zoo.py: random weights, nothing downloaded) and variant:
- eager: ``model(*inputs)`` under ``torch.no_grad``;
- inductor: ``torch.compile(model)`` (default mode); its compile time is its first call;
- inductor_graph: ``torch.compile(model, mode="reduce-overhead")`` (inductor's kernels replayed as CUDA
  graphs; CUDA only): the like-for-like comparison for tilefuse_graph; each call's outputs are cloned
  (the next replay overwrites them), as tilefuse's graph replay does;
- tilefuse: ``tilefuse.compile(model, inputs, target="auto")``; kernels are generated and
  JIT-compiled at the first call (``first_call_s``);
- tilefuse_graph: the same plan with ``cuda_graph=True`` (CUDA only);
- tilefuse_persistent: ``persistent="auto"`` (issue #25: runs of consecutive kernels launched as one
  persistent kernel where the simulated schedule models faster), per launch;
- tilefuse_persistent_graph: ``persistent="auto", cuda_graph=True`` (planned for graph replay: the
  choice of runs depends on the launch mode), CUDA only;
- tilefuse_persistent_2sm: ``persistent="auto", cuda_graph=True`` planned with two programs an
  SM where a run's binary holds two (``orchestrate/persistence.PER_SM = 2``, session 23's default;
  one since the fourth GPU session measured two slower), CUDA only: beside
  tilefuse_persistent_graph, what a second program an SM buys.

Timing: warm-up calls, then ``--runs`` calls, each isolated (synchronize; CUDA events around the
call; synchronize) over 4 rotating input sets; median, p10, p90 in ms.  On CPU, host
``perf_counter``.  On CUDA also the GPU's own time per call apart from the host's
(``device_busy_us``: torch.profiler's device operations over 20 calls, their durations summed).

Correctness: every variant's outputs (on two input sets with different values, so a CUDA graph
must refresh its static inputs) are compared with an fp32 copy of the model on the same device:
relative L2 error ``|out - ref| / |ref|`` over all output tensors.  A variant passes when that
error is at most ``max(TOL[dtype], 4 x eager's own error)`` and no value is NaN/inf; the max
abs error and max abs error / max |eager| against the eager model in the benchmark dtype are
recorded too.  A failing variant gets no speedup.

Each model runs in its own Python process (a crash or a poisoned CUDA context takes out one model,
not the run); errors are recorded with their text and the run goes on.  The JSON is rewritten
after every model, so a run cut short keeps what it measured.  ``--budget-s`` bounds the whole run.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import json
import os
import platform
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_MODELS = ("bert", "gpt2", "vit", "resnet", "llama")
VARIANTS = ("eager", "inductor", "inductor_graph", "tilefuse", "tilefuse_graph", "tilefuse_persistent",
            "tilefuse_persistent_graph", "tilefuse_persistent_2sm")
GRAPH_VARIANTS = ("tilefuse_graph", "inductor_graph", "tilefuse_persistent_graph", "tilefuse_persistent_2sm")
# Relative L2 error allowed against the fp32 model (and at least 4x eager's own error in the dtype):
# fp32 differs by summation order only (contractions run on cuBLAS/cuDNN), with room for a tf32 path
# (~3e-4); fp16/bf16 by their rounding through a dozen layers (eager fp16 lands near 1e-3).
TOL = {"float32": 1e-3, "float16": 1e-2, "bfloat16": 5e-2}
EAGER_FACTOR = 4.0
INPUT_SETS = 4
ERROR_CHARS = 2000


# ----------------------------------------------------------------------------------------------
# Options and the run's environment.

def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="small", choices=["tiny", "small", "base"])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated, of " + ",".join(DEFAULT_MODELS))
    ap.add_argument("--variants", default=None, help="comma-separated, of " + ",".join(VARIANTS) +
                    " (default: all on cuda; eager,tilefuse on cpu)")
    ap.add_argument("--dtype", default="float16", choices=list(TOL))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=None, help="text models' sequence length (default: per size)")
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"], help="transformers attention implementation")
    ap.add_argument("--device", default=None, choices=["cuda", "cpu"], help="default: cuda when available")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up calls per variant (default 10 cuda, 1 cpu)")
    ap.add_argument("--runs", type=int, default=None, help="timed calls per variant (default 100 cuda, 3 cpu)")
    ap.add_argument("--time-limit", type=float, default=10.0, help="tilefuse's per-segment solver limit (s)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="the whole run's time budget (s): models not "
                    "started in time are recorded as skipped, one still running at the end is stopped")
    ap.add_argument("--out", default=None, help="JSON path (default bench/results/gpu_models_<device>_<size>.json)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)        # run one model, write its record
    ap.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    return args


def resolve(args, cuda: bool) -> None:
    """Fill the defaults that depend on the device."""
    args.device = args.device or ("cuda" if cuda else "cpu")
    gpu = args.device == "cuda"
    if args.variants is None:
        args.variants = list(VARIANTS) if gpu else ["eager", "tilefuse"]
    elif isinstance(args.variants, str):
        args.variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variant(s) {bad}; choose from {VARIANTS}")
    args.warmup = args.warmup if args.warmup is not None else (10 if gpu else 1)
    args.runs = args.runs if args.runs is not None else (100 if gpu else 3)


def skipped_variants(args) -> dict[str, str]:
    """Variants not run in this configuration, with the reason recorded in the JSON."""
    out = {}
    for v in VARIANTS:
        if v in GRAPH_VARIANTS and args.device != "cuda":
            out[v] = "CUDA-graph replay needs a CUDA device"
        elif v not in args.variants:
            out[v] = "not requested (--variants)" if args.device == "cuda" \
                else "not run on cpu by default (this run checks the script; pass --variants to include it)"
    return out


def versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("torch", "tilefuse", "triton", "transformers", "numpy", "highspy"):  # tilefuse before triton
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", None) or _dist_version(mod)
        except Exception as e:  # a missing optional package is recorded, not fatal
            out[mod] = f"unavailable ({type(e).__name__})"
    return out


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def device_info(device: str) -> dict:
    import torch
    info = {"type": device, "platform": platform.platform(), "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine()}
    if device != "cuda":
        info["name"] = f"cpu ({info['processor']}, {info['cpus']} cores; Triton interpreter)"
        return info
    p = torch.cuda.get_device_properties(0)
    info.update(name=p.name, capability=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count,
                memory_gib=round(p.total_memory / 2**30, 1), cuda_runtime=torch.version.cuda,
                driver=_nvidia_smi("driver_version"), l2_mib=round(getattr(p, "L2_cache_size", 0) / 2**20, 1))
    info["copy_tb_s"] = copy_bandwidth()
    return info


def _nvidia_smi(field: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def copy_bandwidth() -> float:
    """Device-to-device copy rate (bytes read + written, TB/s): the memory ceiling of the floors."""
    import torch
    n = 1 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for k in range(12):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        if k >= 2:
            times.append(a.elapsed_time(b) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return round(2 * n / sorted(times)[len(times) // 2] / 1e12, 3)


def slug(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name.lower()).strip("_")


# ----------------------------------------------------------------------------------------------
# One model (runs in a child process).

def tensors(out) -> list:
    import torch
    from torch.utils import _pytree as pytree
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def error_text(e: BaseException) -> str:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    text = f"{type(e).__name__}: {e}".strip()
    tail = "".join(tb[-3:])
    return (text[:ERROR_CHARS // 2] + "\n--- traceback tail ---\n" + tail[-ERROR_CHARS // 2:]).strip()


def compare(got: list, ref32: list, eager: list, tol: float, eager_err: float | None) -> dict:
    """Errors of one variant's outputs against the fp32 model and the eager model (same dtype)."""
    import torch
    if len(got) != len(ref32):
        return {"pass": False, "why": f"{len(got)} output tensors, the model has {len(ref32)}"}
    for g, r in zip(got, ref32):
        if tuple(g.shape) != tuple(r.shape):
            return {"pass": False, "why": f"output shape {tuple(g.shape)} != {tuple(r.shape)}"}
    finite = all(bool(torch.isfinite(g.float()).all()) for g in got if g.is_floating_point())
    num = sum(float((g.double() - r.double()).pow(2).sum()) for g, r in zip(got, ref32))
    den = sum(float(r.double().pow(2).sum()) for r in ref32)
    rel = (num ** 0.5) / max(den ** 0.5, 1e-30)
    max_abs = max(float((g.double() - e.double()).abs().max()) if g.numel() else 0.0 for g, e in zip(got, eager))
    scale = max(float(e.double().abs().max()) if e.numel() else 0.0 for e in eager)
    allowed = max(tol, EAGER_FACTOR * eager_err) if eager_err is not None else tol
    ok = finite and rel <= allowed and den > 0
    why = None if ok else ("NaN/inf in outputs" if not finite else "reference is all zeros" if den == 0
                           else f"relative L2 error {rel:.2e} > allowed {allowed:.2e}")
    return {"pass": ok, "rel_l2_vs_fp32": rel, "allowed": allowed, "max_abs_vs_eager": max_abs,
            "max_rel_vs_eager": max_abs / scale if scale else None, "why": why}


def worst(checks: list[dict]) -> dict:
    """The two input sets' checks folded into one: fails if either does, the larger errors."""
    out = {"pass": all(c["pass"] for c in checks), "input_sets_checked": len(checks)}
    for key in ("rel_l2_vs_fp32", "max_abs_vs_eager", "max_rel_vs_eager"):
        vals = [c[key] for c in checks if c.get(key) is not None]
        out[key] = max(vals) if vals else None
    out["allowed"] = checks[0].get("allowed")
    out["why"] = next((c["why"] for c in checks if c.get("why")), None)
    return out


class Timer:
    """Times one call at a time: synchronize, CUDA events (or perf_counter on CPU) around it."""

    def __init__(self, device: str):
        import torch
        self.torch, self.cuda = torch, device == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def once(self, fn) -> float:
        """Seconds of one call."""
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        self.sync()
        a, b = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3

    def wall(self, fn):
        """(result, seconds) of one call including everything it compiles; synchronized."""
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return out, time.perf_counter() - t0


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def time_calls(timer: Timer, call, inputs: list, warmup: int, runs: int) -> dict:
    for k in range(warmup):
        call(inputs[k % len(inputs)])
    samples = [timer.once(lambda: call(inputs[k % len(inputs)])) for k in range(runs)]
    ms = [s * 1e3 for s in samples]
    return {"median_ms": percentile(ms, 0.5), "p10_ms": percentile(ms, 0.1), "p90_ms": percentile(ms, 0.9),
            "runs": runs, "warmup": warmup}


def device_busy(call, inputs: list, calls: int = 20) -> dict:
    """The GPU's own time per call, apart from the host's: torch.profiler's CUDA activity over
    ``calls`` calls (kernels, copies and memsets, each its device duration), summed and divided
    by the calls; and the device operations per call.  CUDA only; a profiler that fails is
    recorded (``device_busy_error``), not raised: the call's timing stands without it."""
    try:
        return _device_busy(call, inputs, calls)
    except Exception as e:
        return {"device_busy_error": f"{type(e).__name__}: {e}"[:500]}


def _device_busy(call, inputs: list, calls: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for k in range(calls):
            call(inputs[k % len(inputs)])
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in events)
    return {"device_busy_us": round(busy / calls, 2), "device_ops_per_call": round(len(events) / calls, 1),
            "profiled_calls": calls}


@contextlib.contextmanager
def full_fp32(torch):
    """The reference in true fp32: cuDNN convolutions (and matmuls) without tf32 meanwhile."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def to_device(inputs: tuple, device: str, dtype) -> tuple:
    return tuple(t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype) for t in inputs)


def run_model(name: str, args, save=lambda rec: None) -> dict:
    """Build, check and time every requested variant of one model; never raises.  ``save(rec)`` is
    called after each variant (a run stopped midway keeps what it measured)."""
    import torch
    import tilefuse  # first: without CUDA it must select Triton's interpreter before triton loads
    from tilefuse import zoo

    rec: dict = {"model": name, "variants": {}, "skipped": skipped_variants(args)}
    dtype, dev = getattr(torch, args.dtype), args.device
    timer = Timer(dev)
    try:
        t0 = time.perf_counter()
        model32, cpu_inputs = zoo.build(name, args.size, batch=args.batch, seq=args.seq, attn=args.attn,
                                        input_sets=INPUT_SETS)
        model = copy.deepcopy(model32).to(device=dev, dtype=dtype)
        model32 = model32.to(dev)
        inputs = [to_device(x, dev, dtype) for x in cpu_inputs]
        inputs32 = [to_device(x, dev, torch.float32) for x in cpu_inputs]
        weights = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
        rec.update(build_s=round(time.perf_counter() - t0, 2), params=sum(p.numel() for p in model.parameters()),
                   weight_bytes=weights, inputs=[[list(t.shape), str(t.dtype).replace("torch.", "")]
                                                 for t in inputs[0]])
        with torch.no_grad(), full_fp32(torch):
            ref32 = [tensors(model32(*x)) for x in inputs32[:2]]
        with torch.no_grad():
            eager_out = [tensors(model(*x)) for x in inputs[:2]]
        del model32
        eager_err = max(compare(e, r, e, TOL[args.dtype], None)["rel_l2_vs_fp32"] for e, r in zip(eager_out, ref32))
        rec["eager_rel_l2_vs_fp32"] = eager_err
    except Exception as e:
        rec["error"] = "building the model or its references failed: " + error_text(e)
        return rec

    def check(call) -> dict:
        with torch.no_grad():
            got = [tensors(call(x)) for x in inputs[:2]]   # set 1 after set 0: refreshed inputs
        return worst([compare(g, r, e, TOL[args.dtype], eager_err) for g, r, e in zip(got, ref32, eager_out)])

    def measure(variant: str, prepare) -> None:
        """prepare() -> (fn, info): compiles; then first call, check, timing; errors recorded."""
        if variant not in args.variants or variant in rec["skipped"]:
            return
        out: dict = {}
        rec["variants"][variant] = out

        def begin(stage: str) -> str:
            # Saved before the stage runs: a process that crashes or is stopped there says where.
            out["error"] = f"{stage}: did not finish (the model's process crashed or was stopped)"
            save(rec)
            return stage
        stage = begin("compile")
        try:
            fn, info = prepare()
            out.update(info)

            def call(x):
                return fn(*x)
            stage = begin("first call")
            with torch.no_grad():
                _, first = timer.wall(lambda: call(inputs[0]))
            out["first_call_s"] = round(first, 3)
            stage = begin("check")
            out["check"] = check(call)
            stage = begin("timing")
            with torch.no_grad():
                out.update(time_calls(timer, call, inputs, args.warmup, args.runs))
                if dev == "cuda":
                    out.update(device_busy(call, inputs))
            del out["error"]
        except Exception as e:
            out["error"] = f"{stage}: " + error_text(e)
        print(f"  {name}/{variant}: " + (f"error in {out['error'][:300]}" if "error" in out else
              f"{out['median_ms']:.3f} ms, check {'ok' if out['check']['pass'] else 'FAILED'}"), flush=True)
        save(rec)

    measure("eager", lambda: (model, {}))

    def inductor():
        torch._dynamo.reset()
        return torch.compile(model), {}
    measure("inductor", inductor)
    if "inductor" in rec["variants"]:
        v = rec["variants"]["inductor"]
        if "first_call_s" in v:
            v["compile_s"] = v["first_call_s"]   # dynamo + inductor compile at the first call
        torch._dynamo.reset()

    def inductor_graph():
        from torch.utils import _pytree as pytree
        torch._dynamo.reset()
        fn = torch.compile(model, mode="reduce-overhead")

        def call(*x):
            torch.compiler.cudagraph_mark_step_begin()
            return pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, fn(*x))
        return call, {}
    measure("inductor_graph", inductor_graph)
    if "inductor_graph" in rec["variants"]:
        v = rec["variants"]["inductor_graph"]
        if "first_call_s" in v:
            v["compile_s"] = v["first_call_s"]
        torch._dynamo.reset()

    compiled: dict = {}

    def plain():
        if compiled.get("failed"):
            raise RuntimeError("tilefuse.compile failed; see variant 'tilefuse'")
        if "m" not in compiled:
            compiled["failed"] = True
            m, secs = timer.wall(lambda: tilefuse.compile(model, inputs[0], target="auto", time_limit=args.time_limit))
            compiled.update(m=m, info=plan_info(m, secs), failed=False)
        return compiled["m"], dict(compiled["info"])

    def tilefuse_graph():
        # The same plan as tilefuse.compile(..., cuda_graph=True) makes (api._pipeline passes the
        # flag straight to CompiledModel), without planning twice; its own kernels and arena.
        m, info = plain()
        g = tilefuse.CompiledModel(m.imported, m.primgraph, m.plan, m.report, m.backend, m.target, m.kernels,
                                   cuda_graph=True, memory=m.memory)
        return g, {**info, "shares_plan_of": "tilefuse"}

    measure("tilefuse", plain)
    measure("tilefuse_graph", tilefuse_graph)

    traced: dict = {}

    def persistent(graph: bool, per_sm: int | None = None):
        def prepare():
            from tilefuse.orchestrate import persistence
            planned = persistence.PER_SM
            persistence.PER_SM = per_sm or planned
            try:
                m, secs = timer.wall(lambda: tilefuse.compile(model, inputs[0], target="auto",
                                                              time_limit=args.time_limit, cuda_graph=graph,
                                                              persistent="auto"))
            finally:
                persistence.PER_SM = planned
            launches = len(m.kernels) - sum(j - i - 1 for i, j in m.persistent)
            traced["m"] = m
            return m, {**plan_info(m, secs), "launches": launches,
                       "persistent_runs": [[i, j] for i, j in m.persistent]}
        return prepare
    for v in ("tilefuse_persistent", "tilefuse_persistent_graph", "tilefuse_persistent_2sm"):
        measure(v, persistent(v != "tilefuse_persistent", 2 if v.endswith("2sm") else None))
        if dev == "cuda" and "m" in traced and traced["m"].persistent and v in rec["variants"]:
            try:      # each persistent kernel's measured schedule beside the simulated one
                runs = traced.pop("m").trace_persistent(*inputs[0])
                rec["variants"][v].update(trace=runs, traced_over_modelled=[r["measured_over_modelled"] for r in runs])
            except Exception as e:
                rec["variants"][v]["trace_error"] = error_text(e)
            save(rec)
    rec["speedups"] = speedups(rec["variants"])
    return rec


def plan_info(m, compile_s: float) -> dict:
    r = m.report
    return {"compile_s": round(compile_s, 3), "target": r.target, "num_ops": r.num_ops, "num_prims": r.num_prims,
            "num_kernels": r.num_kernels, "est_total_us": r.est_total_us, "strategies": r.strategies,
            "solver": r.solver, "memory": r.memory,
            "kernels_by_family": _count(k.family for k in r.kernels)}


def _count(xs) -> dict:
    out: dict = {}
    for x in xs:
        out[x] = out.get(x, 0) + 1
    return out


def speedups(variants: dict) -> dict:
    """eager/variant and inductor/variant median ratios; none for a variant that failed its check."""
    def good(v):
        x = variants.get(v, {})
        return x.get("median_ms") if "error" not in x and x.get("check", {}).get("pass", v == "eager") else None
    eager, inductor, inductor_graph = good("eager"), good("inductor"), good("inductor_graph")
    out = {}
    for v in VARIANTS[1:]:
        t = good(v)
        if v in variants:
            out[v] = {"vs_eager": round(eager / t, 3) if t and eager else None,
                      "vs_inductor": round(inductor / t, 3) if t and inductor and v != "inductor" else None}
            if v in ("tilefuse_graph", "tilefuse_persistent_graph", "tilefuse_persistent_2sm"):
                out[v]["vs_inductor_graph"] = round(inductor_graph / t, 3) if t and inductor_graph else None
    return out


def child_main(args) -> int:
    import torch
    resolve(args, torch.cuda.is_available())
    path = Path(args.child_out)

    def save(rec):
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec, indent=1, default=str))
        os.replace(tmp, path)
    rec = run_model(args.child, args, save)
    rec["complete"] = True
    save(rec)
    return 0


# ----------------------------------------------------------------------------------------------
# The driver: one child process per model, the JSON rewritten after each.

def run_child(name: str, argv: list[str], out_path: Path, timeout: float) -> dict:
    """Run one model in a child process (its own session, so a timeout ends its compile workers
    too); its record, or what it saved before failing, with the error and the end of its output."""
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--child", name, "--child-out", str(out_path)]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    t0 = time.perf_counter()
    tail: list[str] = []
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    timed_out = False
    while True:
        left = t0 + timeout - time.perf_counter()
        if left <= 0:
            timed_out = True
            break
        if sel.select(timeout=min(left, 5.0)):
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(f"  {name}/"):
                print(line, end="", flush=True)
            tail = (tail + [line])[-40:]
    if timed_out:
        os.killpg(proc.pid, signal.SIGKILL)   # the child and the processes it started
    proc.wait()
    sel.close()
    rec = json.loads(out_path.read_text()) if out_path.exists() else {"model": name}
    rec["wall_s"] = round(time.perf_counter() - t0, 1)
    if timed_out:
        rec["error"] = f"stopped after {timeout:.0f} s (time budget); last output:\n" + "".join(tail)[-ERROR_CHARS:]
    elif not rec.get("complete"):
        rec["error"] = (f"the model's process ended with code {proc.returncode} before finishing; last output:\n"
                        + "".join(tail)[-ERROR_CHARS:])
    return rec


def child_argv(args) -> list[str]:
    argv = ["--size", args.size, "--dtype", args.dtype, "--batch", str(args.batch), "--attn", args.attn,
            "--device", args.device, "--variants", ",".join(args.variants), "--warmup", str(args.warmup),
            "--runs", str(args.runs), "--time-limit", str(args.time_limit)]
    return argv + (["--seq", str(args.seq)] if args.seq else [])


def driver_main(args) -> int:
    started = time.perf_counter()
    import torch
    resolve(args, torch.cuda.is_available())
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    try:
        importlib.import_module("tilefuse")  # fail here, once, rather than in every model's process
    except ImportError as e:
        raise SystemExit(f"tilefuse does not import: {e}; run from the repository root with PYTHONPATH=. and its "
                         f"dependencies installed (bench/README.md: highspy travels as a wheel)") from e
    from tilefuse import zoo
    dev = device_info(args.device)
    out_path = Path(args.out) if args.out else HERE / "results" / f"gpu_models_{slug(dev['name']) if args.device == 'cuda' else 'cpu'}_{args.size}.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "what": "end-to-end model latency, MEASURED: eager PyTorch, torch.compile (inductor), tilefuse, "
                "tilefuse + CUDA graph; outputs checked against an fp32 copy of each model",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": dev, "versions": versions(),
        "config": {"size": args.size, "dtype": args.dtype, "batch": args.batch,
                   "seq": args.seq or zoo.default_seq(args.size), "attn": args.attn, "variants": args.variants,
                   "warmup": args.warmup, "runs": args.runs, "input_sets": INPUT_SETS,
                   "skipped_variants": skipped_variants(args),
                   "tilefuse_time_limit": args.time_limit, "budget_s": args.budget_s,
                   "tolerance": {"rel_l2_vs_fp32": TOL[args.dtype], "or_times_eager_error": EAGER_FACTOR},
                   "timing": "per call: synchronize, CUDA events around the call (perf_counter on cpu); "
                             "median/p10/p90 over runs, 4 rotating input sets"},
        "models": [],
    }
    print(f"{dev['name']}: {args.size} models, {args.dtype}, batch {args.batch}, variants {args.variants}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu_models_") as tmp:
        for name in args.models:
            left = args.budget_s - (time.perf_counter() - started)
            if left < 20:
                doc["models"].append({"model": name, "error": f"skipped: {left:.0f} s of the {args.budget_s:.0f} s time budget left"})
            else:
                print(f"{name} ...", flush=True)
                rec = run_child(name, child_argv(args), Path(tmp) / f"{name}.json", left)
                if rec.get("weight_bytes") and dev.get("copy_tb_s"):
                    # Reading every weight once at the measured copy rate: no batch-1 run is faster.
                    rec["weight_read_floor_us"] = round(rec["weight_bytes"] / (dev["copy_tb_s"] * 1e12) * 1e6, 2)
                doc["models"].append(rec)
            doc["total_s"] = round(time.perf_counter() - started, 1)
            out_path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print()
    print(table(doc))
    print(f"\nwritten {out_path}  ({doc['total_s']} s)")
    return 0


# ----------------------------------------------------------------------------------------------
# The readable table.

def _f(x, fmt: str, none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def table(doc: dict) -> str:
    head = ["model", "variant", "compile s", "1st call s", "median ms", "p10", "p90", "x eager", "x inductor",
            "x ind. graph", "relL2 fp32", "check", "kernels/ops", "est us"]
    rows = [head]
    notes = []
    for rec in doc["models"]:
        name = rec["model"]
        if "error" in rec and not rec.get("variants"):
            rows.append([name, "-", *["-"] * 9, "ERROR", "-", "-"])
            notes.append(f"{name}: {rec['error'].splitlines()[0][:200]}")
            continue
        for v, x in rec.get("variants", {}).items():
            sp = rec.get("speedups", {}).get(v, {})
            chk = x.get("check", {})
            status = "ERROR" if "error" in x else ("ok" if chk.get("pass") else "WRONG")
            plan = f"{x['num_kernels']}/{x['num_ops']}" if "num_kernels" in x else "-"
            plan = f"{x['launches']} launches, {plan}" if "launches" in x else plan
            rows.append([name, v, _f(x.get("compile_s"), ".1f"), _f(x.get("first_call_s"), ".2f"),
                         _f(x.get("median_ms"), ".3f"), _f(x.get("p10_ms"), ".3f"), _f(x.get("p90_ms"), ".3f"),
                         _f(sp.get("vs_eager"), ".2f"), _f(sp.get("vs_inductor"), ".2f"),
                         _f(sp.get("vs_inductor_graph"), ".2f"),
                         _f(chk.get("rel_l2_vs_fp32"), ".1e"), status, plan, _f(x.get("est_total_us"), ".0f")])
            if "error" in x:
                notes.append(f"{name}/{v}: {x['error'].splitlines()[0][:200]}")
            elif not chk.get("pass"):
                notes.append(f"{name}/{v}: wrong answer: {chk.get('why')}")
        if "error" in rec:
            notes.append(f"{name}: {rec['error'].splitlines()[0][:200]}")
    widths = [max(len(r[k]) for r in rows) for k in range(len(head))]
    lines = ["  ".join(c.ljust(w) if k < 2 else c.rjust(w) for k, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    seen = set()
    notes = [n for n in notes if not (n in seen or seen.add(n))]
    notes += [f"{v}: skipped: {why}" for v, why in doc["config"].get("skipped_variants", {}).items()]
    return "\n".join(lines + ([""] + notes if notes else []))


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path[:0] = [str(ROOT)]   # tilefuse from this checkout even when not installed
    if args.child:
        return child_main(args)
    return driver_main(args)


if __name__ == "__main__":
    sys.exit(main())
