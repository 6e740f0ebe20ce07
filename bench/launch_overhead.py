"""Where a per-launch plan's host time goes (MEASURED; for issue #25's launch work).

    python bench/launch_overhead.py [--model bert] [--size small] [--calls 200] [--json PATH]

The first GPU session measured tilefuse per launch at 35-40 us of host time per kernel against
~5 us of kernel (bench/README.md, "The GPU suite").  This splits that time, on the device the
script runs on, each figure the median of ``--calls`` host-timed calls with no synchronization
inside the loop (what a caller waits for when the GPU keeps up):

- ``triton_jit_us``: one launch of a trivial one-pointer Triton kernel through ``kernel[grid](...)``
  (the JIT's Python path: binding, specialization key, cache lookup, launch);
- ``program_per_kernel_us``: ``Program.run`` of the zoo model's plan divided by its kernels
  (tilefuse's runtime and every launch path it takes: Triton, cuBLAS/cuDNN, torch);
- ``call_us`` / ``call_per_kernel_us``: a whole ``CompiledModel`` call (inputs checked, outputs
  made), and per kernel;
- ``graph_call_us``: the same plan replayed as one CUDA graph (inputs copied in, outputs cloned);
- ``persistent_program_us`` / ``persistent_call_us``: the plan with every run of kernels as one
  persistent kernel (``persistent=True``): ``Program.run`` and a whole call, one launch each
  (the second GPU session measured small BERT so at 286 µs a call against 150 as a graph: this
  says how much of it is tilefuse's Python, how much Triton's launch of a kernel of many
  pointers, ``persistent_params``).

Without CUDA only the tilefuse figures are taken, with every launch stubbed out (what tilefuse's
own Python costs; no Triton, no device).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def host_us(fn, calls: int, sync) -> float:
    """Median host time of ``fn()`` in µs, over batches of 10 calls (synchronized between batches)."""
    for _ in range(5):
        fn()
    sync()
    samples = []
    for _ in range(max(calls // 10, 1)):
        t0 = time.perf_counter()
        for _ in range(10):
            fn()
        samples.append((time.perf_counter() - t0) / 10 * 1e6)
        sync()
    return round(statistics.median(samples), 2)


def triton_jit_us(calls: int, sync) -> float:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _touch(x, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x + offs, tl.load(x + offs) + 1)
    x = torch.zeros(128, device="cuda")
    return host_us(lambda: _touch[(1,)](x, BLOCK=128), calls, sync)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert")
    ap.add_argument("--size", default="small")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import torch

    import tilefuse
    from tilefuse import zoo
    from tilefuse.runtime.executor import Program
    cuda = torch.cuda.is_available()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = {"device": torch.cuda.get_device_name() if cuda else "cpu (launches stubbed)",
           "torch": torch.__version__, "model": args.model, "size": args.size}
    if not cuda:                      # tilefuse's own Python: every Triton launch made a no-op
        import tilefuse.codegen.triton.launch as launch

        class _NoLaunch:
            def __getitem__(self, grid):
                return lambda *a, **k: None
        launch.load_kernel = lambda source, name: _NoLaunch()
        launch.interpreted = lambda: False
    model, sets = zoo.build(args.model, args.size)
    dtype = torch.float16 if cuda else torch.float32
    dev = "cuda" if cuda else "cpu"
    model = model.to(device=dev, dtype=dtype)
    inputs = tuple(t.to(dev, dtype=dtype if t.is_floating_point() else t.dtype) for t in sets[0])
    cm = tilefuse.compile(model, inputs, target="auto" if cuda else "h100")
    n = len(cm.kernels)
    out["kernels"] = n
    if cuda:
        prog = cm.program
    else:                             # the h100 plan's program on the CPU, library kernels stubbed too
        for b in cm.kernels:
            object.__setattr__(b, "run", lambda ins, outs: None)
        prog = Program(cm.plan, cm.primgraph, torch.device("cpu"), cm.kernels, cm.memory)
    feeds = dict(zip(cm.input_names, cm.imported.flatten_inputs(inputs, {})))
    out["program_us"] = host_us(lambda: prog.run(feeds), args.calls, sync)
    pm = tilefuse.compile(model, inputs, target="auto" if cuda else "h100", persistent=True)
    if not cuda:
        import tilefuse.codegen.triton.persistent as pk
        pk.interpreted = lambda: False
        for b in pm.kernels:
            object.__setattr__(b, "run", lambda ins, outs: None)
    pprog = pm.program if cuda else Program(pm.plan, pm.primgraph, torch.device("cpu"), pm.kernels, pm.memory,
                                               persistent=pm.persistent, programs=132, donate=True)
    out["persistent_runs"] = [list(r) for r in pm.persistent]
    out["persistent_params"] = sum(len(set(n for ks in pm.kernels[i:j] for n in (*ks.inputs, *ks.outputs)))
                                   for i, j in pm.persistent)
    out["persistent_program_us"] = host_us(lambda: pprog.run(feeds), args.calls, sync)
    out["program_per_kernel_us"] = round(out["program_us"] / n, 2)
    if cuda:
        out["call_us"] = host_us(lambda: cm(*inputs), args.calls, sync)
        out["call_per_kernel_us"] = round(out["call_us"] / n, 2)
        out["triton_jit_us"] = triton_jit_us(args.calls, sync)
        g = tilefuse.CompiledModel(cm.imported, cm.primgraph, cm.plan, cm.report, cm.backend, cm.target, cm.kernels,
                                   cuda_graph=True, memory=cm.memory)
        out["graph_call_us"] = host_us(lambda: g(*inputs), args.calls, sync)
        out["persistent_call_us"] = host_us(lambda: pm(*inputs), args.calls, sync)
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
