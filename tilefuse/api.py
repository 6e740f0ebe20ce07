"""The tilefuse pipeline, stage by stage.

    model ─► frontend ─► Graph ─► fission ─► PrimGraph ─► simplify ─► fold constants ─► band masks
    as index predicates ─► compose layouts and masks into their readers (vertical) ─► orchestrate (segments,
    candidates costed by kernel families on the target, BLP; the graph as it is and with
    contractions sharing an input merged, the cheaper kept) ─► Plan ─► codegen (every kernel
    built by its family: Triton source or a library call) ─► CompiledModel
    (backend "reference": kernels evaluated by the reference executor; "triton": the built kernels)

Each stage is a plain function from one IR to the next; ``dump`` (a directory) writes what each
stage produced.
"""
from __future__ import annotations

import logging
import time
import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from .analysis.classify import count_by_category
from .build import build_kernels
from .codegen import kernel_names
from .cost.roofline import roofline
from .cost.target import Target
from .errors import InterpreterWarning, OptionError
from .fission import fission
from .frontend.common import Imported
from .ir.prim import PrimGraph
from .log import logger
from .orchestrate.costing import Coster
from .orchestrate.instantiate import PlanTemplate, instantiate
from .orchestrate.overlap import hidden, overlap
from .orchestrate.persistence import as_phases, persistent_plan, settle, with_phases
from .orchestrate.plan import Plan
from .orchestrate.strategies import STRATEGIES, plan_strategies
from .progress import step
from .report.report import KernelInfo, Report
from .runtime.compiled import CompiledModel
from .runtime.dynamic import DynamicModel
from .runtime.memory import MemoryPlan, plan_memory
from .transform.fold import fold_constants
from .transform.channels_last import channels_last, channels_padded
from .transform.masks import masks_as_predicates
from .transform.horizontal import horizontal
from .transform.vertical import vertical
from .transform.simplify import simplify_graph
from .verify import (Verifier, eager_float64, eager_oracle, enabled, kernel_device, onnx_oracle, onnx_wide, random_feeds,
                     tensor_leaves)

BACKENDS = ("reference", "triton")
# The graph-to-graph stages after fission, in order (each checked against its input by ``verify``).
GRAPH_STAGES = (("simplify", simplify_graph), ("fold", fold_constants), ("masks", masks_as_predicates),
                ("vertical", vertical), ("channels_last", channels_last), ("simplify", simplify_graph))
_log = logger("plan")


@contextmanager
def _stage(what: str):
    """A pipeline stage: shown as progress, its time logged (channel ``plan``)."""
    t0 = time.perf_counter()
    with step(what):
        yield
    _log.info("%s: %.2f s", what, time.perf_counter() - t0)


def _check_options(backend: str, strategy: str, time_limit=10.0, persistent=False) -> None:
    if backend not in BACKENDS:
        raise OptionError(f"backend {backend!r} is not available; choose one of {BACKENDS}")
    if strategy not in STRATEGIES:
        raise OptionError(f"strategy {strategy!r} is unknown; choose one of {STRATEGIES}")
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0:
        raise OptionError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    if not (persistent is False or persistent is True or persistent == "auto"):
        raise OptionError(f"persistent must be False, True or 'auto', got {persistent!r}")


def _check_frontend_options(fn: str, options: dict, frontend: tuple[str, ...]) -> None:
    """A keyword neither ``fn`` nor its frontend takes: named, with the nearest one it does take."""
    import difflib
    import inspect
    unknown = [k for k in options if k not in frontend]
    if unknown:
        own = [p for p in inspect.signature(globals()[fn]).parameters if p not in ("options", "model",
                                                                                 "model_or_path", "example_inputs")]
        known = own + list(frontend)
        near = difflib.get_close_matches(unknown[0], known, n=1)
        raise OptionError(f"{fn}() got an unknown option {unknown[0]!r}"
                          + (f"; did you mean {near[0]!r}?" if near else "") + f" Its options are {', '.join(known)}")


def orchestrate(pg: PrimGraph, target: Target, *, time_limit: float = 10.0, cuda_graph: bool = False,
                measured: dict[str, float] | None = None, progress: Callable[[int, int], None] | None = None,
                solved: dict | None = None, grounded: dict | None = None,
                seconds: dict | None = None) -> tuple[dict[str, Plan], Coster]:
    """Plans for every strategy, costed on the target as they will run (per-launch or in a CUDA
    graph), with measured kernel times (schedule key -> seconds) in place of modelled ones, and
    costs from compiled binaries (schedule key -> Cost, ``native.ground``) in place of estimates.
    ``seconds``: candidate structure -> best time, shared by plannings with the same costing."""
    coster = Coster(pg.types, target, cuda_graph=cuda_graph, measured=measured, grounded=grounded,
                    seconds=seconds)
    return dict(plan_strategies(pg, coster, time_limit=time_limit, progress=progress, solved=solved)), coster


def _merged(pg: PrimGraph) -> PrimGraph:
    """The horizontal rewrite (contractions sharing an activation merged, ``transform/horizontal.py``),
    its slices composed into their readers."""
    merged = horizontal(pg)
    return simplify_graph(vertical(merged)) if merged is not pg else pg


def _padded(pg: PrimGraph) -> PrimGraph:
    """Convolutions over 3 to 7 channels reading zero-padded channels-last copies
    (``transform/channels_last.channels_padded``)."""
    padded = channels_padded(pg)
    return simplify_graph(padded) if padded is not pg else pg


# Rewrites that pay on some models and targets and not on others, each planned with and without
# (``choose_graph``): the horizontal merge saves launches and activation reads but moves epilogues
# into readers; a padded stem reads 16-byte vectors but costs a copy kernel (a launch) and 8/C of
# its tensor-core work.  Each name is also the ``verify`` stage that checks it.
ALTERNATIVES = (("horizontal", _merged), ("padded_channels", _padded))


def choose_graph(pg: PrimGraph, target: Target, **kw) -> tuple[PrimGraph, dict[str, Plan], Coster, tuple]:
    """The graph to compile, its plans, and each rewrite of ``ALTERNATIVES`` as (name, graph
    before, graph after: the same object where it was not kept): in order, each rewrite is kept
    where its optimal plan is cheaper than the graph's without it.  Segments the graphs share are
    solved once, and candidates of the same structure costed once."""
    solved: dict = {}
    seconds: dict = {}
    plans, coster = orchestrate(pg, target, solved=solved, seconds=seconds, **kw)
    steps = []
    for name, rewrite in ALTERNATIVES:
        new = rewrite(pg)
        keep = False
        if new is not pg:
            plans_r, coster_r = orchestrate(new, target, solved=solved, seconds=seconds, **kw)
            keep = plans_r["optimal"].cost < plans["optimal"].cost
            _log.info("%s: optimal %.1f us with the rewrite vs %.1f us without: %s", name,
                      plans_r["optimal"].cost * 1e6, plans["optimal"].cost * 1e6, "kept" if keep else "not kept")
        steps.append((name, pg, new if keep else pg))
        if keep:
            pg, plans, coster = new, plans_r, coster_r
    return pg, plans, coster, tuple(steps)


def _scheduled(coster: Coster, k) -> tuple:
    """(cost, schedule) of a planned kernel: its own schedule among its candidate's options (an
    instantiated plan keeps its template's family, which need not be the best one here; a schedule
    re-tiled as a persistent kernel's phase is the coster's adopted one)."""
    adopted = coster.adopted(k.schedule)
    if adopted is not None:
        return adopted
    for cost, sched in coster.options(k.candidate):
        if sched is k.schedule:
            return cost, sched
    return coster.best(k.candidate)


def _kernel_infos(plan: Plan, coster: Coster, names: list[str]) -> list[KernelInfo]:
    out = []
    for k, name in zip(plan.kernels, names):
        cost, sched = _scheduled(coster, k)
        ops = list(dict.fromkeys(f"{p.origin.op}:{p.origin.name}" for p in k.prims))
        out.append(KernelInfo(
            name, sched.family, list(k.candidate.names), ops,
            round(cost.seconds * 1e6, 3), int(cost.bytes), int(cost.flops),
            round(cost.seconds * 1e6, 3) if cost.measured else None,
            grid=cost.blocks, warps=cost.warps, waves=cost.waves, occupancy=cost.occupancy, bound=cost.bound,
            l2_bytes=int(cost.l2_bytes), schedule=sched.key()))
    return out


def _traffic(plan: Plan, coster: Coster) -> int:
    return sum(int(_scheduled(coster, k)[0].bytes) for k in plan.kernels)


def report_for(graph, primgraph: PrimGraph, plans: dict[str, Plan], coster: Coster, target: Target,
               backend: str, strategy: str, memory: MemoryPlan | None = None,
               names: list[str] | None = None) -> Report:
    """``names``: the built kernels' (what runs and what a profiler shows: a kernel the persistent
    pass re-tiled or joined keeps the name it was built under); by default the plan's own."""
    plan = plans[strategy]
    names = names or kernel_names([k.schedule for k in plan.kernels], primgraph.prims)
    m = memory or plan_memory(plan, primgraph)
    bound = roofline(primgraph, target)
    traffic = {s: _traffic(p, coster) for s, p in plans.items()}
    return Report(
        target=target.name, backend=backend, strategy=strategy,
        num_ops=len(_operators(graph)), num_prims=len(primgraph.prims),
        prims_by_category=count_by_category(primgraph.prims),
        num_kernels=len(plan.kernels), kernels=_kernel_infos(plan, coster, names),
        est_total_us=round(plan.cost * 1e6, 3),
        strategies={s: {"num_kernels": len(p.kernels), "est_total_us": round(p.cost * 1e6, 3),
                        "traffic_bytes": traffic[s]}
                    for s, p in plans.items()},
        solver={k: plan.solver[k] for k in ("status", "num_segments", "num_candidates", "seconds", "time_limit_cut")},
        ops_by_type=dict(sorted(Counter(op for op, _ in _operators(graph)).items())),
        memory={"intermediate_peak_bytes": m.arena_bytes, "intermediate_total_bytes": m.unplanned_bytes,
                "intermediates": len(m.offsets)},
        launch="cuda_graph" if coster.cuda_graph else "per_launch",
        traffic_bytes=traffic[strategy], compulsory_bytes=bound.compulsory_bytes, total_flops=bound.flops,
        roofline_us=round(bound.seconds * 1e6, 6),
    )


def _operators(graph) -> list[tuple[str, str]]:
    """(type, name) of the source operators: the graph's nodes, or a PrimGraph's prims' origins."""
    if isinstance(graph, PrimGraph):
        return list(dict.fromkeys((p.origin.op, p.origin.name) for p in graph.prims))
    return [(n.op, n.name) for n in graph.nodes]


def _ground(primgraph: PrimGraph, tgt: Target, *, time_limit: float, cuda_graph: bool):
    """Plan -> compile the plan's kernels and their alternatives for the target's architecture ->
    re-plan with their binaries' resources (``native.ground``; no GPU needed)."""
    from .native import ground
    return ground(lambda g: orchestrate(primgraph, tgt, time_limit=time_limit, cuda_graph=cuda_graph, grounded=g),
                  tgt, cuda_graph=cuda_graph)


def _measure(primgraph: PrimGraph, tgt: Target, measure, *, time_limit: float, cuda_graph: bool):
    """Select -> measure -> re-select on the target's device (cost/measure.py); ``measure`` is
    True (CUDA events) or a timer of one's own (a ``cost.measure.Timer``)."""
    import torch

    from .cost.cache import TuningCache
    from .cost.measure import cuda_timer, tune
    from .runtime.executor import kernel_runner
    flush = cold_l2(primgraph, tgt)
    timer = measure if callable(measure) else cuda_timer(flush_l2=flush)
    device = torch.device(tgt.device)
    # times with a warm L2 are cached apart from cold ones (the cold key is the original one)
    key = tgt.name if flush or callable(measure) else f"{tgt.name}:warm-l2"
    return tune(lambda m: orchestrate(primgraph, tgt, time_limit=time_limit, cuda_graph=cuda_graph, measured=m),
                lambda sched: kernel_runner(sched, primgraph, device), timer,
                launch_s=tgt.launch(cuda_graph), target=key, cache=TuningCache())


def cold_l2(pg: PrimGraph, tgt: Target) -> bool:
    """Whether ``measure=True`` times each kernel after flushing L2: when the model's tensors
    (weights, inputs and every intermediate: a bound on what one call touches) exceed half the
    target's L2, the kernels before a kernel evict its inputs; a smaller model keeps them in L2
    from call to call (on an H200, small models' kernels timed after a flush ran ~2x their time
    inside the whole plan's graph replay: bench/README.md, "The GPU suite")."""
    return sum(t.nbytes for t in pg.types.values()) > tgt.l2_bytes // 2


def prims(graph, check: Verifier | None = None) -> PrimGraph:
    """The operator graph (or a PrimGraph: ``compile_prims``) as a simplified PrimGraph: fission,
    then ``GRAPH_STAGES``."""
    if isinstance(graph, PrimGraph):
        pg = graph
    else:
        pg = fission(graph)
        if check is not None:
            check.imported(pg)
    for name, stage in GRAPH_STAGES:
        new = stage(pg)
        if check is not None:
            check.stage(name, pg, new)
        pg = new
    return pg


def _pipeline(imported: Imported, *, target: str | Target, backend: str, strategy: str, t0: float,
              dump: str | Path | None, time_limit: float = 10.0, progress=None,
              cuda_graph: bool = False, measure=False, native: bool = False,
              check: Verifier | None = None, template: PlanTemplate | None = None,
              sizes: dict[str, int] | None = None, persistent: bool | str = False) -> CompiledModel:
    """The stages, from the imported graph to a CompiledModel.  With ``template`` (the plan of the
    same program at other sizes: a bucket's), its kernels are carried to these sizes instead of
    planning (``orchestrate/instantiate.py``), its kernels served by the template's size-generic
    sources where they match at ``sizes`` (symbol -> size); ``measure`` and ``native`` then apply to
    the template's planning, not here."""
    graph = imported.graph
    tgt = Target.get(target)
    if isinstance(target, str) and target.lower() == "auto" and tgt.device == "cpu" and backend == "triton":
        interpreter_notice()
    if cuda_graph and (backend != "triton" or tgt.device != "cuda"):   # before minutes of planning
        raise OptionError(f"cuda_graph=True needs backend='triton' and a CUDA target; "
                          f"got backend={backend!r}, target {tgt.name!r}")
    if native and (measure or not tgt.arch):
        raise OptionError(f"native=True plans on kernels compiled for the target's GPU architecture: it needs a "
                          f"GPU target (h100, h200, a100; got {tgt.name!r}) and not measure=True (which plans on "
                          f"timings instead)")
    with _stage("splitting operators into prims"):
        primgraph = prims(graph, check)
    _log.info("%d operators -> %d prims (%s)", len(_operators(graph)), len(primgraph.prims),
              ", ".join(f"{k} {v}" for k, v in count_by_category(primgraph.prims).items() if v))
    if template is not None:
        with _stage(f"carrying the bucket's plan to these sizes ({tgt.name})"):
            chosen, plans, coster, steps = _instantiated(primgraph, template, tgt, cuda_graph)
        native = measure = False
    else:
        with _stage(f"planning for {tgt.name}"):
            chosen, plans, coster, steps = choose_graph(primgraph, tgt, time_limit=time_limit,
                                                        cuda_graph=cuda_graph, progress=progress)
    for name, before, after in steps if check is not None else ():
        check.stage(name, before, after)
    rewrites, primgraph = tuple(name for name, before, after in steps if after is not before), chosen
    if native:
        with _stage(f"planning on kernels compiled for sm_{tgt.arch}"):
            grounding = _ground(primgraph, tgt, time_limit=time_limit, cuda_graph=cuda_graph)
        plans, coster = grounding.plans, grounding.coster
    if measure:
        with _stage("measuring kernels"):
            tuning = _measure(primgraph, tgt, measure, time_limit=time_limit, cuda_graph=cuda_graph)
        plans, coster = tuning.plans, tuning.coster
    plan = overlap(plans[strategy])          # collectives issued early, waited for late
    persistent = persistent if backend == "triton" else False
    scheduled = lambda k: _scheduled(coster, k)     # noqa: E731  (a planned kernel's cost and schedule)
    phased = plan
    if persistent and template is None:
        phased = with_phases(plan, coster, scheduled, tgt, cuda_graph)
        if tgt.arch:        # a GPU's phases (the interpreter's tiles are not its speed)
            phased = as_phases(phased, coster, scheduled, tgt, cuda_graph)
    with _stage("generating kernels"):
        kernels = build_kernels(phased, primgraph) if template is None else \
            build_kernels(phased, primgraph, template.generics, template.generic_size(sizes))
    runs, rows = [], []
    if persistent:
        with _stage("choosing persistent kernels"):
            phased, kernels, runs, rows = persistent_plan(
                phased, kernels, scheduled, tgt, cuda_graph, persistent, primgraph.types,
                carried=template.persistent if template is not None else None, coster=coster)
            plan, kernels = settle(plan, phased, kernels, runs, primgraph.prims)
    plans = {**plans, strategy: plan}
    if check is not None:
        with _stage("verifying the plan and its kernels"):
            _verify_plan(check, plan, primgraph, kernels if backend == "triton" else None, tgt)
    if dump is not None:
        _dump(Path(dump), graph, primgraph, plan, kernels)
    memory = plan_memory(plan, primgraph, kernels, runs)
    report = report_for(graph, primgraph, plans, coster, tgt, backend, strategy, memory, [b.name for b in kernels])
    if native:
        report.native_planning = {"rounds": grounding.rounds, "stable": grounding.stable,
                                  "schedules_compiled": grounding.compiled, "arch": tgt.arch}
    if measure:
        report.measurement = {"rounds": tuning.rounds, "stable": tuning.stable,
                              "schedules_measured": len(tuning.measured), "from_cache": tuning.from_cache,
                              "cold_l2": None if callable(measure) else cold_l2(primgraph, tgt)}
    if check is not None:
        report.verified = list(check.stages)
    if plan.deferred:
        report.overlap = [{**row, "collective": report.kernels[row["collective"]].name,
                           "waited_before": report.kernels[row["waited_before"]].name
                           if row["waited_before"] < len(report.kernels) else None,
                           "between": [report.kernels[j].name for j in row["between"]]}
                          for row in hidden(plan, lambda k: _scheduled(coster, k)[0].seconds)]
    if persistent:
        report.persistent = rows
        # the modelled total with the runs launched as one at their simulated time
        report.est_total_us = round(report.est_total_us - sum(r["apart_us"] - r["persistent_us"]
                                                              for r in report.persistent if r["launched_as_one"]), 3)
    report.compile_seconds = round(time.perf_counter() - t0, 4)
    _log_plan(report)
    compiled = CompiledModel(imported, primgraph, plan, report, backend, tgt, kernels, cuda_graph=cuda_graph,
                             memory=memory, persistent=runs)
    compiled.template = template or PlanTemplate(plan, rewrites, strategy, persistent=tuple(runs))
    return compiled


def _instantiated(pg: PrimGraph, template: PlanTemplate, tgt: Target, cuda_graph: bool):
    """``template``'s plan on ``pg`` (the same program at other sizes), on the graph it was planned
    on: ``pg`` with the rewrites ``choose_graph`` kept for it; as ``choose_graph`` returns."""
    steps = []
    for name, rewrite in ALTERNATIVES:
        new = rewrite(pg) if name in template.rewrites else pg
        steps.append((name, pg, new))
        pg = new
    coster = Coster(pg.types, tgt, cuda_graph=cuda_graph)
    return pg, {template.strategy: instantiate(template, pg, coster)}, coster, tuple(steps)


_interpreter_told = False


def interpreter_notice() -> None:
    """Once per process: target 'auto' found no GPU, so the kernels will run in Triton's
    interpreter (checking, not speed), and how to plan for a GPU instead."""
    global _interpreter_told
    if _interpreter_told:
        return
    _interpreter_told = True
    warnings.warn("no CUDA GPU on this machine: target='auto' plans for the 'cpu' target, whose kernels run "
                  "in Triton's interpreter to check results, not for speed (often 100x slower than eager "
                  "PyTorch); its modelled times are the interpreter's. To plan for a GPU here, pass "
                  "target='h100' (or 'h200', 'a100') and check its kernels with CompiledModel.emulate(...); "
                  "for numbers only, backend='reference'", InterpreterWarning, stacklevel=4)


def _verify_plan(check: Verifier, plan: Plan, primgraph: PrimGraph, kernels, tgt: Target) -> None:
    check.plan(plan, primgraph)
    if kernels is None:
        return
    device = kernel_device(tgt)
    if device is None:
        _log.warning("verify: the %s plan's kernels cannot run on this machine; they are not checked", tgt.name)
        return
    check.kernels(kernels, primgraph, device, plan)


def _log_plan(report: Report) -> None:
    if not _log.isEnabledFor(logging.INFO):
        return
    for name, s in report.strategies.items():
        _log.info("strategy %s: %d kernels, %.1f us modelled", name, s["num_kernels"], s["est_total_us"])
    for i, k in enumerate(report.kernels):
        _log.info("kernel %d %s (%s, %d prims): %.2f us modelled, %s-bound, grid %s", i, k.name, k.family,
                  len(k.prims), k.est_us, k.bound, k.grid)


def _dump(d: Path, graph, primgraph: PrimGraph, plan: Plan, kernels) -> None:
    """What each stage produced: the graph, the prims, the plan and every kernel's source
    (``4-kernels/<index>_<name>.py`` for generated Triton, ``.txt`` for library and torch calls)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "1-graph.txt").write_text(str(graph) + "\n")
    (d / "2-prims.txt").write_text(str(primgraph) + "\n")
    (d / "3-plan.txt").write_text("\n".join(
        f"{i}: {b.name}  {k.candidate}  est {k.cost * 1e6:.2f} us"
        for i, (k, b) in enumerate(zip(plan.kernels, kernels))) + "\n")
    kd = d / "4-kernels"
    kd.mkdir(exist_ok=True)
    for old in kd.iterdir():   # a previous dump's kernels would read as this plan's
        old.unlink()
    width = len(str(max(len(kernels) - 1, 0)))
    for i, b in enumerate(kernels):
        ext = "py" if b.language == "triton" else "txt"
        (kd / f"{i:0{width}d}_{b.name}.{ext}").write_text(b.source)


def compiled_graphs() -> list[CompiledModel]:
    """What ``torch.compile(model, backend="tilefuse")`` compiled in this process: one
    CompiledModel per graph (per specialization), oldest first (the last 64); each one's
    ``report`` says what the graph became.  Empty until the backend has compiled something."""
    import sys
    dynamo = sys.modules.get("tilefuse.frontend.dynamo")
    return dynamo.compiled_graphs() if dynamo is not None else []


def compile(model, example_inputs, *, target: str | Target = "auto", backend: str = "triton",
            strategy: str = "optimal", dump: str | Path | None = None, time_limit: float = 10.0,
            cuda_graph: bool = False, measure=False, native: bool = False, verify: bool | None = None,
            persistent: bool | str = False, **options: Any) -> CompiledModel:
    """Compile a torch.nn.Module (or callable) for the given example inputs (a tuple of args).

    ``time_limit`` bounds candidate enumeration and the solver per segment (seconds);
    ``cuda_graph`` replays the whole plan as one CUDA graph (CUDA targets, backend ``triton``)
    and plans with graph-node launch overheads; ``measure`` times the chosen kernels and their
    families' best alternatives on the device and re-plans with the measured times (needs the
    target's GPU; results persist in the tuning cache); ``native`` compiles the plan's kernels and
    each one's best alternatives for the target's GPU architecture (no GPU needed) and re-plans with
    their binaries' registers, shared memory, occupancy and tensor-core path, a spilling kernel
    excluded (``tilefuse/native.py``; the times stay modelled); ``verify`` (default: ``TILEFUSE_VERIFY``)
    checks every stage against its input on the example inputs and raises ``VerifyError`` naming
    the first stage that changed a value (``tilefuse/verify.py``); ``persistent`` (experimental,
    issue #25's first stage) launches runs of two or more consecutive generated kernels as one
    persistent kernel of phases (``codegen/triton/persistent.py``): ``"auto"`` the runs its
    simulated schedule models faster (``cost/persistent.py``), True every run; other options go to
    the torch frontend (``example_kwargs``).
    """
    _check_options(backend, strategy, time_limit, persistent)
    _check_frontend_options("compile", options, ("example_kwargs", "strict"))
    from .frontend.torch import import_torch
    t0 = time.perf_counter()
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    with _stage("importing the model (torch.export)"):
        imported = import_torch(model, tuple(example_inputs), **options)
    check = None
    if enabled(verify):
        kwargs = dict(options.get("example_kwargs") or {})
        tensors = imported.flatten_inputs(tuple(example_inputs), kwargs)
        check = Verifier({d.name: t for d, t in zip(imported.graph.inputs, tensors)},
                         eager_oracle(model, tuple(example_inputs), kwargs), tensor_leaves(imported.unflatten_outputs),
                         eager_float64(model, tuple(example_inputs), kwargs))
    return _pipeline(imported, target=target, backend=backend, strategy=strategy, t0=t0, dump=dump,
                     time_limit=time_limit, cuda_graph=cuda_graph, measure=measure, native=native, check=check,
                     persistent=persistent)


def compile_prims(primgraph: PrimGraph, *, target: str | Target = "auto", backend: str = "triton",
                  strategy: str = "optimal", dump: str | Path | None = None, time_limit: float = 10.0,
                  cuda_graph: bool = False, verify: bool | None = None,
                  feeds: dict | None = None) -> CompiledModel:
    """Compile a PrimGraph (the stages after fission): how ``tilefuse.minify``'s test cases, and
    tests of the later stages, start.  The result is called with one tensor per graph input, in
    order.  ``verify`` checks every stage on ``feeds`` (graph input name -> tensor; default
    random)."""
    _check_options(backend, strategy, time_limit)
    check = Verifier(feeds or random_feeds(primgraph.inputs)) if enabled(verify) else None
    return _pipeline(Imported(primgraph), target=target, backend=backend, strategy=strategy,
                     t0=time.perf_counter(), dump=dump, time_limit=time_limit, cuda_graph=cuda_graph, check=check)


def compile_onnx(model_or_path, *, target: str | Target = "auto", backend: str = "triton",
                 strategy: str = "optimal", dump: str | Path | None = None, time_limit: float = 10.0,
                 cuda_graph: bool = False, measure=False, native: bool = False, progress=None,
                 verify: bool | None = None, dynamic: bool = True, max_plans: int = 8,
                 check_buckets: bool = True, persistent: bool | str = False,
                 **options: Any) -> CompiledModel | DynamicModel:
    """Compile an ONNX model (a path, bytes or ``onnx.ModelProto``).

    ``time_limit``, ``cuda_graph``, ``measure``, ``native``, ``persistent`` and ``verify`` as for
    ``compile`` (``verify`` runs
    on random inputs, and checks the import against onnxruntime where it is installed);
    ``progress(done, total)`` is called as segments are planned; other options go to the ONNX
    frontend (``input_shapes``, ``dims``, ``initializers_as_inputs``).  A model whose inputs keep
    free dims after ``dims``/``input_shapes`` gives a ``DynamicModel``: its free dims fall in
    power-of-two buckets, each planned once and carried to every size in it
    (``runtime/dynamic.py``; plans of the last ``max_plans`` buckets kept; ``check_buckets`` plans
    each bucket's smallest sizes too, to report its bound); ``dynamic=False`` asks for one static
    plan and names the dims to bind instead.
    """
    _check_options(backend, strategy, time_limit, persistent)
    _check_frontend_options("compile_onnx", options, ("input_shapes", "dims", "initializers_as_inputs"))
    from .frontend.onnx import open_inputs
    from .frontend.onnx_load import load_model
    rest = dict(target=target, backend=backend, strategy=strategy, dump=dump, time_limit=time_limit,
                cuda_graph=cuda_graph, measure=measure, native=native, progress=progress, verify=verify,
                persistent=persistent)
    if dynamic:
        model, _ = load_model(model_or_path)
        free = open_inputs(model, **options)
        if free:
            if not isinstance(max_plans, int) or isinstance(max_plans, bool) or max_plans < 1:
                raise OptionError(f"max_plans must be a positive integer, got {max_plans!r}")
            inits = options.get("initializers_as_inputs", False)

            def compile_for(dims, input_shapes, template=None, sizes=None):
                return _compile_onnx(model, model_or_path, dims=dims, input_shapes=input_shapes,
                                     initializers_as_inputs=inits, template=template, sizes=sizes, **rest)
            return DynamicModel(model, free, compile_for, pinned=options.get("input_shapes"),
                                dims=options.get("dims"), max_plans=max_plans, initializers_as_inputs=inits,
                                check_buckets=check_buckets)
        model_or_path, source = model, model_or_path     # parsed once: the import below reads it as it is
    else:
        source = model_or_path
    return _compile_onnx(model_or_path, source, **rest, **options)


def _compile_onnx(model, source, *, target, backend, strategy, dump, time_limit, cuda_graph, measure, native,
                  progress, verify, persistent=False, template: PlanTemplate | None = None,
                  sizes: dict | None = None, **options) -> CompiledModel:
    """One static plan of an ONNX model (``source``: what the user gave, kept for checking); with
    ``template``, that plan carried to these sizes."""
    from .frontend.onnx import import_onnx
    t0 = time.perf_counter()
    with _stage("importing the model"):
        imported = import_onnx(model, **options)
    check = None
    if enabled(verify):
        feeds = random_feeds(imported.graph.inputs)
        check = Verifier(feeds, onnx_oracle(source, feeds), exact=onnx_wide(source, feeds))
    compiled = _pipeline(imported, target=target, backend=backend, strategy=strategy, t0=t0, dump=dump,
                         time_limit=time_limit, progress=progress, cuda_graph=cuda_graph, measure=measure,
                         native=native, check=check, template=template, sizes=sizes, persistent=persistent)
    compiled.source_onnx = source               # (CompiledModel.save keeps it, for checking)
    return compiled


def load(path) -> CompiledModel:
    """A compiled model saved with ``CompiledModel.save`` (``tilefuse compile --save``), ready to run
    without planning again (``runtime/package.py``); ``PackageError`` when it was built by another
    tilefuse version, is for a GPU other than the one attached, or is not a package."""
    from .runtime.package import load as load_package
    return load_package(path)
