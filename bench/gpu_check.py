"""Every kernel of a zoo model's plan run one at a time on the GPU, each checked on its own.

    python bench/gpu_check.py [--models llama,resnet] [--size small] [--dtype float16] [--out PATH.json]

Per model: ``tilefuse.compile(model, inputs, target="auto")``; then the plan's kernels run in
order on the compile's buffers (``runtime/executor.Program``) with a device synchronization after
each, so a fault (an illegal address) is pinned on the kernel that made it; each kernel's outputs
(or, with ``--sample``, on fresh sample inputs as ``compile(measure=True)`` times them) are compared
with the reference executor (``ir/evaluate.eval_prim``, on the CPU, upcast to fp32)
applied to the same inputs copied back (relative L2 error), and the whole model with eager PyTorch
on the same device.  Run it under ``compute-sanitizer --tool memcheck`` to have the faulting
access named.  Exit status 3 when a kernel faulted, 1 when one's output is off, else 0.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

TOL = {"float32": 1e-3, "float16": 2e-2, "bfloat16": 5e-2}


def check_model(name: str, args) -> dict:
    import torch

    import tilefuse
    from tilefuse import zoo
    from tilefuse.ir.evaluate import eval_prim
    from tilefuse.ir.samples import allocate, sample_io
    from tilefuse.runtime.executor import Program
    dtype = getattr(torch, args.dtype)
    model, sets = zoo.build(name, args.size)
    model = model.to(device=args.device, dtype=dtype)
    inputs = tuple(t.to(device=args.device, dtype=dtype if t.is_floating_point() else t.dtype) for t in sets[0])
    cm = tilefuse.compile(model, inputs, target="auto")
    pg = cm.primgraph
    prog = Program(cm.plan, pg, torch.device(args.device), cm.kernels, cm.memory)
    feeds = dict(zip(cm.input_names, cm.imported.flatten_inputs(inputs, {})))
    buffers = dict(prog.constants) | feeds | dict(prog.intermediates)
    for n in prog._fresh:
        t = pg.types[n]
        buffers[n] = torch.empty(t.shape, dtype=t.dtype.to_torch(), device=args.device)
    rec = {"model": name, "target": cm.target.name, "kernels": []}
    for k, (step, kern) in enumerate(zip(prog.steps, cm.plan.kernels)):
        row = {"index": k, "name": step.name, "family": kern.schedule.family}
        rec["kernels"].append(row)
        if args.sample:     # alone on fresh sample tensors, as compile(measure=True) times it
            ins, outs = sample_io(step, pg, torch.device(args.device))
            buffers = buffers | dict(zip(step.inputs, ins)) | dict(zip(step.outputs, outs))
            scratch = allocate(step.scratch, torch.device(args.device))
        else:
            ins, scratch = [buffers[n] for n in step.inputs], prog.scratch[k]
        try:
            step.run(ins, [buffers[n] for n in step.outputs] + scratch)
            if args.device == "cuda":
                torch.cuda.synchronize()
        except Exception as e:
            row["fault"] = f"{type(e).__name__}: {e}"[:800]
            rec["faulted_at"] = k
            print(f"  {name} kernel {k} {step.name}: FAULT {row['fault'][:200]}", flush=True)
            return rec
        values = {n: buffers[n].detach().float().cpu() if buffers[n].is_floating_point() else buffers[n].cpu()
                  for n in step.inputs}
        values |= {c.name: c.data.float() if c.data.is_floating_point() else c.data for c in pg.constants
                   if c.name in {i for p in kern.prims for i in p.inputs}}
        for p in kern.prims:
            values[p.name] = eval_prim(p, [values[n] for n in p.inputs])
        errs = []
        for n in step.outputs:
            got, want = buffers[n].float().cpu(), values[n].float()
            both = got.isnan() & want.isnan()      # sample inputs can make NaN (rsqrt of a negative)
            got, want = got.masked_fill(both, 0), want.masked_fill(both, 0)
            errs.append(float((got - want).norm() / want.norm().clamp_min(1e-30)))
        row["rel_l2"] = max(errs) if errs else 0.0
        row["ok"] = row["rel_l2"] <= TOL[args.dtype]
        if not row["ok"]:
            print(f"  {name} kernel {k} {step.name}: rel L2 {row['rel_l2']:.2e} OFF", flush=True)
    with torch.no_grad():
        want = model(*inputs)
        got = cm(*inputs)
    from torch.utils import _pytree as pytree
    ws = [t for t in pytree.tree_leaves(want) if isinstance(t, torch.Tensor)]
    gs = [t for t in pytree.tree_leaves(got) if isinstance(t, torch.Tensor)]
    rec["model_rel_l2_vs_eager"] = max(float((g.float() - w.float()).norm() / w.float().norm()) for g, w in zip(gs, ws))
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama,resnet")
    ap.add_argument("--size", default="small")
    ap.add_argument("--dtype", default="float16", choices=list(TOL))
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the interpreter (a script check)")
    ap.add_argument("--sample", action="store_true", help="each kernel on fresh sample inputs (as measured), "
                    "not the plan's buffers")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    results, status = [], 0
    for name in args.models.split(","):
        t0 = time.perf_counter()
        try:
            rec = check_model(name, args)
        except Exception as e:
            rec = {"model": name, "error": "".join(traceback.format_exception(type(e), e, e.__traceback__))[-2000:]}
        rec["seconds"] = round(time.perf_counter() - t0, 1)
        results.append(rec)
        off = [r for r in rec.get("kernels", []) if r.get("ok") is False]
        print(f"[check] {name}: {len(rec.get('kernels', []))} kernels run, fault at {rec.get('faulted_at')}, "
              f"{len(off)} off, model vs eager {rec.get('model_rel_l2_vs_eager')}, error "
              f"{rec.get('error', '').splitlines()[-1:] }", flush=True)
        if "faulted_at" in rec:
            status = 3
            break                   # the CUDA context is gone
        status = max(status, 1 if off or "error" in rec else 0)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
