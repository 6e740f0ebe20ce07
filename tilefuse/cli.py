"""Command line: `tilefuse demo | inspect MODEL.onnx | compile MODEL.onnx | run MODEL.onnx`."""
from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections import Counter
from contextlib import contextmanager
from importlib import metadata

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from .errors import TilefuseError
from .progress import reporting


def _category_table(title: str, counts: dict[str, int]) -> Table:
    t = Table(title=title)
    t.add_column("category")
    t.add_column("prims", justify="right")
    for k, v in counts.items():
        if v:
            t.add_row(k, str(v))
    return t


def cmd_demo(args, console: Console) -> int:
    import torch

    import tilefuse
    from .cost.target import Target
    from .demo import demo_model

    model, inputs = demo_model()
    here = Target.detect()
    console.print("[bold]tilefuse demo[/]: a BERT-style encoder block (random weights), batch 2, sequence 16")
    if here.device == "cuda":
        target = here
        console.print(f"Compiled for this machine's GPU ({here.name}), where its kernels run; kernel times are "
                      "modelled by tilefuse's cost model.", soft_wrap=True)
    else:
        target = Target.get("h100")
        console.print("No GPU here: the kernels are planned for an H100 (times modelled by tilefuse's cost "
                      "model, not measured), and the same generated kernels run on this CPU in Triton's "
                      "interpreter to check them against eager PyTorch.", soft_wrap=True)
    model, inputs = model.to(here.device), tuple(t.to(here.device) for t in inputs)
    with _progress(console):
        compiled = tilefuse.compile(model, inputs, target=target)
    r = compiled.report
    console.print(f"imported {r.num_ops} operators, split into {r.num_prims} tensor-expression prims, "
                  f"planned {r.num_kernels} kernels for {r.target} in {r.compile_seconds:.1f} s", soft_wrap=True)
    console.print(_category_table("prims by category", r.prims_by_category))
    console.print(kernel_table(r, detail=False))
    console.print(strategy_table(r))
    with torch.no_grad():
        want = model(*inputs)
    with _progress(console):
        got = compiled(*inputs) if here.device == "cuda" else compiled.emulate(*inputs)
    err = (got - want).abs().max().item()
    ok = torch.allclose(got, want, rtol=1e-4, atol=1e-5)
    where = "on the GPU" if here.device == "cuda" else "on this CPU in Triton's interpreter"
    console.print(f"ran the {r.num_kernels} kernels {where} (generated Triton; library calls through torch) "
                  f"vs eager PyTorch: max abs difference {err:.2e} "
                  + ("[green]match[/]" if ok else "[red]MISMATCH[/]"), soft_wrap=True)
    console.print(_memory_line(r.memory))
    s = r.strategies
    opt = s["optimal"]["est_total_us"]
    console.print(f"modelled on {r.target} (not measured): optimal plan {opt:.1f} us in {r.num_kernels} kernels, "
                  f"{s['unfused']['est_total_us'] / opt:.2f}x faster than unfused, "
                  f"{s['greedy']['est_total_us'] / opt:.2f}x faster than greedy fusion", soft_wrap=True)
    return 0 if ok else 1


def _memory_line(m: dict) -> str:
    return (f"intermediates: {m['intermediates']} tensors, {m['intermediate_total_bytes'] / 1024:.1f} KiB in all, "
            f"planned into a {m['intermediate_peak_bytes'] / 1024:.1f} KiB arena")


def cmd_inspect(args, console: Console) -> int:
    from .analysis.classify import count_by_category
    from .api import prims
    from .fission import fission
    from .frontend.onnx import import_onnx, load_model, unsupported_nodes

    with _progress(console):
        refused, skipped = unsupported_nodes(args.model, input_shapes=_input_shapes(args), dims=_dims(args))
    if refused:         # the ONNX nodes as the file has them: the import stopped short of a graph
        model, _ = load_model(args.model)
        console.print(_ops_table(Counter(n.op_type for n in model.graph.node), refused, Counter(skipped)))
        return _refusals(console, refused, len(skipped))
    with _progress(console):
        graph = import_onnx(args.model, input_shapes=_input_shapes(args), dims=_dims(args)).graph
        pg, errors = fission(graph, collect_errors=True)
    console.print(f"[bold]{args.model}[/]: {len(graph.inputs)} inputs, {len(graph.outputs)} outputs, "
                  f"{len(graph.constants)} constants, {len(graph.nodes)} operators")
    console.print(_ops_table(Counter(n.op for n in graph.nodes), errors))
    if pg is None:
        return _refusals(console, errors, 0)
    console.print(_category_table(f"{len(pg.prims)} prims by category", count_by_category(pg.prims)))
    planned = prims(pg)
    console.print(f"fission makes {len(pg.prims)} prims; compile plans {len(planned.prims)} of them, after "
                  f"simplifying, folding constants and composing layout changes and masks into the prims "
                  f"that read them", soft_wrap=True)
    if args.prims:
        console.print(str(pg), markup=False, highlight=False, soft_wrap=True)
    return 0


def _ops_table(counts: Counter, refused, unseen: Counter | None = None) -> Table:
    """Operators by count, each marked supported or not (the refusals' operators), and how many of
    each were not looked at (``unseen``: they read what a refused node makes)."""
    bad, unseen = Counter(getattr(e, "op", None) for e in refused), unseen or Counter()
    t = Table(title="operators")
    t.add_column("operator")
    t.add_column("count", justify="right")
    t.add_column("supported")
    for op, n in sorted(counts.items()):
        ok = n - bad[op] - unseen[op]
        words = ([f"[red]{bad[op]} no[/]"] if bad[op] else []) + ([f"{unseen[op]} not looked at"] if unseen[op] else [])
        t.add_row(op, str(n), "yes" if ok == n else "[red]no[/]" if bad[op] == n else
                  ", ".join(([f"{ok} yes"] if ok else []) + words))
    return t


def _refusals(console: Console, errors, skipped: int) -> int:
    console.print(f"[red]{len(errors)} operator(s) cannot be compiled:[/]")
    for e in errors:
        console.print(f"  {e}", markup=False, highlight=False, soft_wrap=True)
    if skipped:
        console.print(f"({skipped} node(s) that read only what those make were not looked at)")
    return 2


def kernel_table(report, limit: int | None = None, *, detail: bool = True) -> Table:
    """The plan's kernels; ``detail`` adds grid, warps, waves, occupancy and the dominant bound."""
    measured = any(k.measured_us is not None for k in report.kernels)
    what = "modelled and measured" if measured else "modelled"
    target = report.target + (" = Triton's interpreter, not a GPU" if report.target == "cpu" else "")
    t = Table(title=f"{report.num_kernels} kernels ({report.strategy}, target {target}, "
                    f"{report.launch.replace('_', ' ')}; times {what})")
    t.add_column("#", justify="right", no_wrap=True)
    t.add_column("family", no_wrap=True)
    if not detail:
        t.add_column("prims", justify="right", no_wrap=True)
    t.add_column("operators fused", ratio=1, min_width=12)
    if detail:            # (80 columns: the prims per kernel are in the JSON and HTML reports)
        for col in ("grid", "warps", "waves", "occ"):
            t.add_column(col, justify="right", no_wrap=True)
        t.caption_justify = "left"
        t.add_column("bound", no_wrap=True)
        t.caption = ("grid: programs launched; warps: per program; waves: the grid over the programs the SMs hold "
                     "at once; occ: programs resident per SM; bound: the modelled term that dominates (dram, l2, "
                     "compute, launch; link for a collective)")
    t.add_column("us", justify="right", no_wrap=True)
    if measured:
        t.add_column("measured", justify="right", no_wrap=True)
    rows = report.kernels if limit is None else report.kernels[:limit]
    for k, info in enumerate(rows):
        cells = [str(k), info.family] + ([] if detail else [str(len(info.prims))]) + [_op_summary(info.ops)]
        if detail:
            cells += [str(info.grid), str(info.warps), str(info.waves), str(info.occupancy), info.bound]
        cells.append(f"{info.est_us:.2f}")
        if measured:
            cells.append("" if info.measured_us is None else f"{info.measured_us:.2f}")
        t.add_row(*cells)
    return t


def native_table(rows, arch: int) -> Table:
    """The plan's generated kernels as compiled for ``arch`` (``CompiledModel.native()``): the
    binary's figures, with the model's beside them where it has one."""
    t = Table(title=f"{len(rows)} generated kernels compiled for sm_{arch} (binary / modelled)")
    for col, right in (("#", True), ("kernel", False), ("tensor cores", False), ("regs", True),
                       ("spills", True), ("smem KiB", True), ("progs/SM", True), ("16B loads", True),
                       ("pipelined", False)):
        t.add_column(col, justify="right" if right else "left")
    for i, r in enumerate(rows):
        b = r.binary
        t.add_row(str(i), b.kernel, b.mma, f"{b.registers} / {r.model.regs_per_thread}",
                  f"{b.spill_bytes} B" if b.spills else "0", f"{b.shared_bytes / 1024:.0f} / {r.model.smem_bytes / 1024:.0f}",
                  f"{r.occupancy} / {r.model_occupancy}", f"{100 * b.wide_share(16):.0f}%",
                  "TMA" if b.tma_loads else "cp.async" if b.async_copies else "no")
    spills = sum(r.binary.spills for r in rows)
    dots = [r for r in rows if r.binary.mma != "none"]
    t.caption = (f"{spills} spilling; {sum(r.binary.mma == 'wgmma' for r in dots)} of {len(dots)} tensor-core kernels "
                 f"on wgmma; regs and smem per program, progs/SM = programs resident per SM; pipelined by "
                 f"TMA or cp.async copies, or not")
    return t


def persistent_table(report) -> Table:
    """``report.persistent``: each run of kernels that can be one persistent kernel, its phases and
    tasks, its kernels' time apart and its simulated time (both modelled), and whether it is one
    launch."""
    t = Table(title="persistent kernels (times modelled)")
    for col, right in (("kernels", False), ("phases", True), ("tasks", True), ("apart µs", True),
                       ("persistent µs", True), ("one launch", False)):
        t.add_column(col, justify="right" if right else "left")
    for r in report.persistent:
        t.add_row(f"#{r['first']}-#{r['first'] + len(r['kernels']) - 1}", str(len(r["phases"])), str(r["tasks"]),
                  f"{r['apart_us']:.1f}", f"{r['persistent_us']:.1f}", "yes" if r["launched_as_one"] else "no")
    launches = report.num_kernels - sum(len(r["kernels"]) - 1 for r in report.persistent if r["launched_as_one"])
    t.caption = (f"{launches} launch{'es' if launches != 1 else ''} for {report.num_kernels} kernels; a phase waits "
                 f"for the whole phase before it; programs: one per SM")
    return t


def apart_table(rows) -> Table:
    """``CompiledModel.why_apart()``: each kernel that reads another's output, and why the two are
    not one kernel."""
    t = Table(title="why kernels are apart (times modelled)")
    for col, kw in (("kernels", {"no_wrap": True}), ("tensor", {}), ("reason", {"no_wrap": True}),
                    ("detail", {"ratio": 1})):
        t.add_column(col, **kw)
    for a in rows:
        t.add_row(f"#{a.producer} -> #{a.consumer}", a.tensor, a.reason, a.detail)
    t.caption = ("segment: the planner's segments split them; between: another kernel is on a path between "
                 "them; family: no family builds them as one; cost: one kernel models no faster; plan: the "
                 "plan's other kernels save more")
    t.caption_justify = "left"
    return t


def roofline_line(report) -> str:
    """The plan against what bounds it: its kernels' launches and the roofline (compulsory bytes
    at peak bandwidth, useful flops at peak), all modelled; DRAM traffic over the compulsory."""
    from .cost.target import Target
    launch_us = Target.get(report.target.split(":")[0]).launch(report.launch == "cuda_graph") * 1e6   # (h100:<device>)
    floor = report.num_kernels * launch_us + report.roofline_us
    traffic = report.traffic_bytes / report.compulsory_bytes if report.compulsory_bytes else float("nan")
    n = report.num_kernels
    return (f"modelled plan {report.est_total_us:.1f} us: {n} launch{'es take' if n != 1 else ' takes'} "
            f"{n * launch_us:.1f} us ({launch_us:.1f} each), the roofline bound is {report.roofline_us:.1f} us; the plan is "
            f"{report.est_total_us / floor:.2f}x their sum. DRAM traffic {report.traffic_bytes / 1e6:.2f} MB = "
            f"{traffic:.2f}x the compulsory {report.compulsory_bytes / 1e6:.2f} MB")


def _op_summary(ops: list[str]) -> str:
    """``Add x2, LayerNormalization``: operator types (from "type:name" entries) with counts, in order."""
    counts = Counter(o.split(":", 1)[0] for o in ops)
    return ", ".join(f"{op} x{n}" if n > 1 else op for op, n in counts.items())


def strategy_table(report) -> Table:
    t = Table(title="strategies (modelled)")
    t.add_column("strategy")
    t.add_column("kernels", justify="right")
    t.add_column("est total us", justify="right")
    for name, s in report.strategies.items():
        t.add_row(name, str(s["num_kernels"]), f"{s['est_total_us']:.1f}")
    return t


def cmd_compile(args, console: Console) -> int:
    import tilefuse

    with _progress(console):
        compiled = tilefuse.compile_onnx(
            args.model, target=args.target, strategy=args.strategy, measure=args.measure, native=args.native,
            cuda_graph=args.cuda_graph, dump=args.dump, input_shapes=_input_shapes(args), dims=_dims(args),
            dynamic=False,     # one plan to show: free dims are bound with --dim / --input-shape
            persistent={None: False, "auto": "auto", "all": True}[args.persistent])
    if args.save:
        path = compiled.save(args.save)
        console.print(f"saved the compiled model to {path} (tilefuse run {path} [--check] runs it; "
                      f"tilefuse.load in Python)", soft_wrap=True)
    r = compiled.report
    console.print(kernel_table(r))
    if args.native:
        with _progress(console):
            rows = compiled.native()
        console.print(native_table(rows, compiled.target.arch))
    console.print(strategy_table(r))
    if r.persistent:
        console.print(persistent_table(r))
    if args.why_apart:
        with _progress(console):
            rows = compiled.why_apart()
        console.print(apart_table(rows))
    console.print(roofline_line(r), soft_wrap=True)
    if r.native_planning:
        n = r.native_planning
        console.print(f"planned on {n['schedules_compiled']} schedules compiled for sm_{n['arch']} in {n['rounds']} "
                      f"rounds; plan {'stable' if n['stable'] else 'still changing'}")
    if r.measurement:
        m = r.measurement
        console.print(f"measured {m['schedules_measured']} schedules ({m['from_cache']} from the tuning cache) "
                      f"in {m['rounds']} rounds; plan {'stable' if m['stable'] else 'still changing'}")
    console.print(f"{r.num_ops} operators, {r.num_prims} prims, {r.num_kernels} kernels; {solver_line(r.solver)}; "
                  f"compiled in {r.compile_seconds:.1f} s", soft_wrap=True)
    console.print(_memory_line(r.memory))
    if args.json:
        try:
            with open(args.json, "w") as f:
                f.write(r.to_json())
        except OSError as e:
            raise TilefuseError(f"cannot write the report to {args.json}: {e.strerror or e}; "
                                "give a path in an existing, writable folder") from None
        console.print(f"report written to {args.json}")
    if args.html:
        console.print(f"HTML report written to {compiled.report.to_html(args.html)} (open it in any browser)",
                      soft_wrap=True)
    if args.dump:
        console.print(f"stages and the source of all {r.num_kernels} kernels written to {args.dump}")
    return 0


def solver_line(solver: dict) -> str:
    """``solver: optimal over 12 segments (3.1k candidates, 0.84 s)``."""
    line = (f"solver: {solver['status']} over {solver['num_segments']} segment(s) "
            f"({solver['num_candidates']} candidates, {solver['seconds']:.2f} s)")
    cut = solver.get("time_limit_cut")
    if cut:       # the time limit ended the search somewhere: as a count of candidates, or the
                  # solver's wall clock (only that one can make two runs differ)
        line += f"; the time limit cut {len(cut)} segment(s)"
        if any("solver" in c for c in cut):
            line += ", so the plan may differ from run to run"
    return line


def _random_feeds(model, seed: int = 0) -> dict:
    import numpy as np
    rng = np.random.default_rng(seed)
    feeds = {}
    for d in model.graph.inputs:
        shape, dt = d.type.shape, d.type.dtype
        if dt.is_float:
            feeds[d.name] = rng.standard_normal(shape).astype(dt.to_numpy() if dt.value != "bfloat16" else "float32")
        elif dt.value == "bool":
            feeds[d.name] = rng.random(shape) < 0.5
        else:  # small non-negative integers: valid as ids and indices for most models
            feeds[d.name] = rng.integers(0, 8, shape).astype(dt.to_numpy())
    return feeds


def _load_inputs(path: str) -> dict:
    """Arrays by input name from an .npz file (one array per model input)."""
    import zipfile

    import numpy as np
    what = "an .npz file with one array per model input (numpy.savez(path, name=array, ...))"
    try:
        data = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise TilefuseError(f"--inputs {path}: no such file; give {what}") from None
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise TilefuseError(f"--inputs {path}: not a readable .npz file ({e}); give {what}") from None
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise TilefuseError(f"--inputs {path}: holds one unnamed array (an .npy file); give {what}")
    with data:
        return {k: data[k] for k in data.files}


def cmd_run(args, console: Console) -> int:
    import numpy as np

    import tilefuse
    from .cost.measure import wall_timer

    if args.check:
        try:
            import onnxruntime as ort
        except ImportError:
            raise TilefuseError("--check compares with onnxruntime, which is not installed: "
                                "pip install onnxruntime (or drop --check)") from None
    feeds = _load_inputs(args.inputs) if args.inputs else None   # a bad file fails before compiling
    from .runtime.package import is_package, onnx_model
    packaged = is_package(args.model)
    with _progress(console):
        if packaged:             # saved by compile --save: nothing to plan
            compiled = tilefuse.load(args.model)
            if args.target not in ("auto", compiled.target.name):
                raise TilefuseError(f"{args.model} holds a plan for {compiled.target.name}; --target {args.target} "
                                    f"does not apply to a saved model (compile the ONNX model for {args.target})")
        else:
            compiled = tilefuse.compile_onnx(args.model, target=args.target, backend=args.backend,
                                             input_shapes=_input_shapes(args, feeds), dims=_dims(args), dynamic=False)
        if feeds is None:
            feeds = _random_feeds(compiled)
        # a plan for a GPU that is not here runs its own kernels in Triton's interpreter
        emulate = compiled.target.device == "cuda" and not compiled.target.is_present()
        outs = compiled.run(feeds, emulate=emulate)
        iterations = args.iterations if args.iterations is not None else \
            10 if compiled.target.device == "cuda" and not emulate else 3
        # (run returns host arrays: the device is done when it returns)
        times = wall_timer(args.warmup if iterations else 0, iterations)(
            lambda: compiled.run(feeds, emulate=emulate)).samples
    where = (f"the {compiled.target.name} plan's kernels emulated on this CPU (Triton's interpreter)" if emulate
             else f"on this machine's {compiled.target.name}" if compiled.target.device == "cuda"
             else "on this CPU" + (" (Triton's interpreter)" if args.backend == "triton" else " (reference executor)"))
    t = Table(title=f"outputs ({compiled.report.num_kernels} kernels for {compiled.target.name}, backend "
                    f"{args.backend}; {where})")
    for col in ("output", "dtype", "shape", "mean", "max |x|"):
        t.add_column(col)
    for name, o in zip(compiled.output_names, outs):
        f = o.astype("float64") if o.size else o
        t.add_row(name, str(o.dtype), str(tuple(o.shape)), f"{f.mean():.4g}" if o.size else "-",
                  f"{np.abs(f).max():.4g}" if o.size else "-")
    console.print(t)
    if times:
        console.print(latency_line(times, where, interpreted=emulate or compiled.target.device != "cuda"),
                      soft_wrap=True)
    if not args.check:
        return 0
    options = ort.SessionOptions()
    if not args.debug:
        options.log_severity_level = 3     # errors only: no "Removing initializer" warnings
    source = onnx_model(args.model) if packaged else args.model
    if source is None:
        raise TilefuseError(f"--check runs the ONNX model in onnxruntime, and {args.model} holds none (it was not "
                            f"compiled from an ONNX file): drop --check")
    sess = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    bad = []
    for name, got, ref in zip(compiled.output_names, outs, want):
        if got.shape != ref.shape or not np.allclose(got, ref, rtol=args.rtol, atol=args.atol, equal_nan=True):
            diff = np.abs(got.astype("float64") - ref.astype("float64")).max() if got.shape == ref.shape else "shape"
            bad.append(f"{name}: max abs difference {diff}")
    if bad:
        console.print("[red]mismatch against onnxruntime:[/] " + "; ".join(bad))
        return 1
    console.print(f"[green]all {len(outs)} outputs match onnxruntime[/] (rtol {args.rtol}, atol {args.atol})")
    return 0


def latency_line(times: list[float], where: str, *, interpreted: bool) -> str:
    """trtexec-style: latency percentiles over the timed runs and the throughput they make."""
    import numpy as np
    ms = np.array(times) * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    line = (f"latency (measured, {len(times)} runs, {where}): mean {ms.mean():.3f} ms, p50 {p50:.3f}, "
            f"p90 {p90:.3f}, p99 {p99:.3f} ms; throughput {1e3 / ms.mean():.2f} runs/s")
    if interpreted:
        line += " - interpreter or CPU times, for checking, not the speed of a GPU"
    return line


def cmd_minify(args, console: Console) -> int:
    import tilefuse
    feeds = _load_inputs(args.inputs) if args.inputs else None   # a bad file fails before compiling
    found = tilefuse.minify(args.model, feeds, target=args.target, backend=args.backend, strategy=args.strategy,
                            out=args.output, input_shapes=_input_shapes(args, feeds), dims=_dims(args),
                            progress=lambda line: console.print(line, soft_wrap=True, highlight=False))
    console.print(f"[green]{found.original_prims} prims -> {found.num_prims}[/]; the test case is "
                  f"{found.path} (run it with pytest; attach it to a bug report)", soft_wrap=True)
    return 0


class _Bar:
    """``tilefuse.progress`` reports as rich progress bars, one per step (``what``)."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.tasks: dict[str, int] = {}

    def __call__(self, what: str, done: int, total: int | None) -> None:
        task = self.tasks.get(what)
        if task is None:
            task = self.tasks[what] = self.progress.add_task(what, total=total)
        self.progress.update(task, completed=done, total=total)


@contextmanager
def _progress(console: Console):
    """Progress bars for the long steps, on a terminal only (nothing when piped or redirected);
    they vanish when done."""
    if not console.is_terminal:
        yield
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar, reporting(_Bar(bar)):
        yield


def _input_shapes(args, arrays: dict | None = None) -> dict[str, tuple[int, ...]]:
    """``--input-shape NAME=1x3x224x224`` (repeatable; trtexec's ``NAME:1x3x224x224`` and
    comma-separated lists too) as ``input_shapes``; the shapes of ``arrays`` (an ``--inputs`` file)
    for the inputs no flag names."""
    shapes = {}
    for spec in (part for flag in args.input_shape or () for part in flag.split(",")):
        sep = "=" if "=" in spec else ":"
        name, _, dims = spec.rpartition(sep)
        try:
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims.strip() else ()
        except ValueError:
            shape = None
        if not name or shape is None or any(d < 0 for d in shape):
            raise TilefuseError(f"--input-shape {spec!r}: give NAME=DIMS (or NAME:DIMS) with non-negative dims "
                                f"joined by x, e.g. --input-shape input_ids=1x128 (a scalar: NAME=)")
        if name in shapes:
            raise TilefuseError(f"--input-shape names input {name!r} twice")
        shapes[name] = shape
    for name, a in (arrays or {}).items():
        shapes.setdefault(name, tuple(a.shape))
    return shapes


def _dims(args) -> dict[str, int]:
    """``--dim batch=2`` (repeatable): a named dim bound for every input, as onnxruntime does."""
    out = {}
    for spec in getattr(args, "dim", None) or ():
        name, sep, n = spec.partition("=")
        if not sep or not name or not n.strip().isdigit():
            raise TilefuseError(f"--dim {spec!r}: give NAME=SIZE, a named dim of the model and a non-negative "
                                f"size, e.g. --dim batch=1")
        if name in out:
            raise TilefuseError(f"--dim names {name!r} twice")
        out[name] = int(n)
    return out


def _version() -> str:
    from . import __version__
    others = []
    for dist in ("torch", "triton", "onnx", "highspy"):
        try:
            others.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            others.append(f"{dist} not installed")
    return f"tilefuse {__version__} ({', '.join(others)})"


_NOISY = ("torch", "onnx", "onnxscript", "onnxruntime", "transformers")


@contextmanager
def _quiet_third_parties(quiet: bool):
    """Other libraries' warnings (torch.export, onnx, transformers) say nothing a user of the CLI
    can act on; ``--debug`` shows them.  Restored afterwards (main() may run inside a program)."""
    if not quiet:
        yield
        return
    loggers = [logging.getLogger(name) for name in _NOISY]
    levels = [log.level for log in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for log in loggers:
            log.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for log, level in zip(loggers, levels):
                log.setLevel(level)


# The Python API's words for what the command line spells as flags (errors from the importer)
_FLAGS = (("input_shapes gives", "--input-shape gives"), ("input_shapes names", "--input-shape names"),
          ("dims binds", "--dim binds"), ("dims gives", "--dim gives"))


def _as_flags(message: str) -> str:
    for api, flag in _FLAGS:
        message = message.replace(api, flag)
    return message


def _check_target(args) -> None:
    """A misspelt ``--target`` fails before minutes of loading the model."""
    if getattr(args, "target", None) is None:
        return
    from .cost.target import Target
    try:
        Target.get(args.target)
    except TilefuseError as e:
        raise type(e)(f"--target: {e}") from None


def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of runs (0 or more)")
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tilefuse", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors and other libraries' warnings")
    # global flags are accepted after the subcommand too (a default of SUPPRESS leaves the
    # value given before it alone)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks of errors and other libraries' warnings")
    shaped = argparse.ArgumentParser(add_help=False)
    shaped.add_argument("--dim", action="append", metavar="NAME=SIZE",
                        help="bind a named dynamic dim for every input, e.g. --dim batch=1 (repeatable)")
    shaped.add_argument("--input-shape", action="append", metavar="NAME=DIMS",
                        help="the whole shape of one input, e.g. input_ids=1x128 (repeatable; NAME:DIMS and "
                             "comma-separated lists as trtexec's --shapes); an --inputs file gives its arrays' "
                             "shapes")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="compile a small BERT-style block and check it against eager", parents=[common])
    p = sub.add_parser("inspect", help="operators and prims of an ONNX model; unsupported operators by node",
                       parents=[common, shaped])
    p.add_argument("model")
    p.add_argument("--prims", action="store_true", help="print every prim")
    p = sub.add_parser("compile", help="plan an ONNX model's kernels for a target; table of kernels",
                       parents=[common, shaped])
    p.add_argument("model")
    p.add_argument("--target", default="auto", help="h100, h200, a100, cpu or auto (default)")
    p.add_argument("--strategy", default="optimal", choices=["optimal", "greedy", "unfused"])
    p.add_argument("--json", help="write the report as JSON to this file")
    p.add_argument("--html", help="write the plan as one self-contained HTML page to this file "
                   "(the prim graph with kernels as clusters, each kernel's source, a roofline chart)")
    p.add_argument("--dump", metavar="DIR", help="write each stage (graph, prims, plan) and every kernel's "
                   "source (DIR/4-kernels/) to DIR")
    p.add_argument("--measure", action="store_true",
                   help="time the chosen kernels on this machine's GPU and re-plan with measured times")
    p.add_argument("--native", action="store_true",
                   help="compile the kernels for the target's GPU (sm_90 for h100; no GPU needed), plan on "
                        "their binaries (registers, occupancy, tensor-core path; no spilling kernel), and print "
                        "what each binary uses beside the model")
    p.add_argument("--cuda-graph", action="store_true",
                   help="plan for replay as one CUDA graph (launch overhead per graph node)")
    p.add_argument("--persistent", choices=["auto", "all"],
                   help="launch runs of consecutive generated kernels as one persistent kernel: where modelled "
                        "faster (auto) or every run (all); experimental")
    p.add_argument("--why-apart", action="store_true",
                   help="for each kernel that reads another's output, say why the two are not one kernel")
    p.add_argument("--save", metavar="FILE.tfz", help="save the compiled model (plan, kernels, weights, the ONNX "
                   "model) to load and run elsewhere without planning (tilefuse run FILE.tfz, tilefuse.load)")
    p = sub.add_parser("run", help="run an ONNX model (or a package saved by compile --save) on random (or given) "
                       "inputs; --check compares to onnxruntime", parents=[common, shaped])
    p.add_argument("model")
    p.add_argument("--inputs", help="an .npz file with one array per model input (default: random)")
    p.add_argument("--backend", default="triton", choices=["triton", "reference"])
    p.add_argument("--target", default="auto", help="the plan to run: h100, h200, a100, cpu or auto (default); "
                   "a GPU that is not here has its own kernels emulated in Triton's interpreter")
    p.add_argument("--check", action="store_true", help="compare every output with onnxruntime")
    p.add_argument("--iterations", type=_count, metavar="N",
                   help="timed runs for the latency figures (default 10 on a GPU, 3 in the interpreter; 0: none)")
    p.add_argument("--warmup", type=_count, default=1, metavar="N", help="untimed runs before them (default 1)")
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-5)
    p = sub.add_parser("minify", help="shrink a model tilefuse compiles wrong (against onnxruntime) or fails "
                       "to compile to a small prim graph, written as a test case", parents=[common, shaped])
    p.add_argument("model")
    p.add_argument("--inputs", help="an .npz file with one array per model input (default: random)")
    p.add_argument("--target", default="cpu", help="the plan's target (default cpu; a GPU plan's kernels run here "
                   "in the interpreter)")
    p.add_argument("--backend", default="triton", choices=["triton", "reference"])
    p.add_argument("--strategy", default="optimal", choices=["optimal", "greedy", "unfused"])
    p.add_argument("-o", "--output", default="test_minified.py", help="the test case to write")
    args = parser.parse_args(argv)
    console = Console()
    handler = {"demo": cmd_demo, "inspect": cmd_inspect, "compile": cmd_compile, "run": cmd_run,
               "minify": cmd_minify}[args.command]
    try:
        with _quiet_third_parties(not args.debug):
            _check_target(args)
            return handler(args, console)
    except TilefuseError as e:
        if args.debug:
            raise
        Console(stderr=True).print(Text.assemble(("error: ", "bold red"), _as_flags(str(e))), soft_wrap=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
