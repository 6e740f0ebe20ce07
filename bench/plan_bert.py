"""Plan full-size BERT-base (or a LLaMA-style decoder) for a GPU target on this (CPU) machine;
record the modelled plans.

    python bench/plan_bert.py [--model bert|llama] [--target h100] [--seq 128] [--dtype float16]
                              [--label before|after] [--json bench/results/plan_bert_h100_after.json]

Everything recorded is MODELLED by tilefuse's analytic cost model (docs/cost-model.md), not
measured: no GPU is used and no kernel runs (backend "reference", plan only).  ``--model bert``
(default): the transformers default BertConfig (12 layers, hidden 768, 12 heads, sdpa attention)
with random weights; batch 1.  ``--model llama``: tilefuse.zoo's base Llama
(``zoo.build("llama", "base")``: LlamaForCausalLM, hidden 768, 12 layers, 12 query heads over 4 KV
heads, FFN 2048, vocab 32000, use_cache=False, sdpa attention; random weights, seed 0), its
input set 0 (token ids and an all-ones attention mask); batch 1.  Its layers are
``model.layers.N`` in the module paths.

For each strategy (unfused, greedy, optimal) and each launch mode (per-launch; CUDA graph) it
records the number of kernels, the modelled total time, the modelled DRAM traffic, and per encoder
layer the kernels whose prims all come from that layer; for the model the compulsory bytes (every
graph input, weight and output moved once), the flops and the roofline bound
max(compulsory / DRAM bandwidth, flops / peak), and the ratios modelled / roofline and
traffic / compulsory.  Figures the compile report provides are taken from it ("source": "report");
figures it lacks are computed here ("source": "script-fallback", with the method).

Exit status 0 iff, per-launch, optimal <= greedy <= unfused in modelled time and the optimal plan
has fewer kernels than the model has operators.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict

import torch

STRATEGIES = ("unfused", "greedy", "optimal")
MODES = ("per_launch", "cuda_graph")
# Published H100 SXM figures, used only if the Target object lacks them.
H100_FALLBACK = {"dram_bw": 3.35e12, "peak_fp16_tensor": 989.4e12, "launch_s": 4.0e-6, "launch_graph_s": 1.0e-6}
_LAYER = re.compile(r"(?:^|[._])layers?[._](\d+)(?=$|[._])")


# --------------------------------------------------------------------------- helpers

def _report_get(report, name):
    """A report field if the report has it (attribute or to_dict key), else None."""
    v = getattr(report, name, None)
    if v is None:
        try:
            v = report.to_dict().get(name)
        except Exception:
            v = None
    return v


def _kdict(k) -> dict:
    return k if isinstance(k, dict) else dict(vars(k))


def _git(path: str, *args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", path, *args], capture_output=True, text=True, timeout=30,
                              check=True).stdout.strip()
    except Exception:
        return None


def _tensor_bytes(t) -> int:
    return int(t.numel) * int(t.dtype.itemsize)


def _capture_export():
    """Wrap tilefuse's torch.export step so the ExportedProgram (its fx nodes' nn_module_stack) is kept."""
    box: dict = {}
    try:
        import tilefuse.frontend.torch as ft
        orig = ft.export
    except Exception as e:  # frontend reorganised: the caller falls back to its own export
        box["error"] = f"{type(e).__name__}: {e}"
        return box, lambda: None

    def wrapped(*a, **k):
        ep = orig(*a, **k)
        box.setdefault("ep", ep)
        return ep

    ft.export = wrapped
    return box, lambda: setattr(ft, "export", orig)


def _module_paths(ep) -> dict[str, str]:
    """fx node name -> innermost module path ('' for the top-level module)."""
    out = {}
    for node in ep.graph.nodes:
        stack = node.meta.get("nn_module_stack") or {}
        if stack:
            path = list(stack.values())[-1][0]
            out[node.name] = path if isinstance(path, str) else str(path)
    return out


def _scope(path: str | None) -> str:
    """'encoder.layer.3.attention.self' -> 'layer.3'; 'embeddings.LayerNorm' -> 'embeddings'; '' -> 'model';
    a causal LM's 'model.layers.3.mlp' -> 'layer.3', 'model.norm' -> 'norm', 'lm_head' -> 'lm_head'."""
    if path is None:
        return "unknown"
    m = _LAYER.search(path)
    if m:
        return f"layer.{int(m.group(1))}"
    parts = path.split(".")
    if parts[0] == "model" and len(parts) > 1:     # LlamaForCausalLM wraps its LlamaModel as 'model'
        parts = parts[1:]
    return parts[0] or "model"


def _scope_key(scope: str) -> tuple:
    """Natural order: embeddings, model, layer.0 .. layer.11, pooler, mixed / unknown last."""
    if scope.startswith("layer."):
        return (1, int(scope.split(".")[1]), "")
    return (3 if scope.startswith(("mixed:", "unknown")) else 2 if scope == "pooler" else 0, 0, scope)


def _prim_scope(prim, paths: dict[str, str]) -> str:
    # 'linear_3.0' / 'x:1' -> fx node name; a merged projection ('linear+linear_1+linear_2',
    # transform/horizontal.py) has the scope its nodes share
    scopes = {_scope(paths.get(re.split(r"[.:]", n, maxsplit=1)[0])) for n in prim.origin.name.split("+")}
    return scopes.pop() if len(scopes) == 1 else "mixed:" + "+".join(sorted(scopes))


def _is_contraction(prim):
    """A sum reduction of a product of two loads (a matmul / attention contraction)."""
    from tilefuse.ir.expr import Binary, Cast, Load
    if prim.is_opaque or prim.reduce is None or prim.reduce.combiner != "sum":
        return False
    e = prim.body
    while isinstance(e, Cast):
        e = e.x
    if not (isinstance(e, Binary) and e.op == "mul"):
        return False
    a, b = e.a, e.b
    while isinstance(a, Cast):
        a = a.x
    while isinstance(b, Cast):
        b = b.x
    return isinstance(a, Load) and isinstance(b, Load)


def _contraction_flops(pg) -> int:
    total = 0
    for p in pg.prims:
        if _is_contraction(p):
            k = 1
            for x in p.reduce.extents:
                k *= x
            total += 2 * p.out.numel * k
    return total


def _compulsory(pg) -> dict:
    """Every graph input and constant read once, every graph output written once (distinct names)."""
    types = pg.types
    inputs = {d.name: _tensor_bytes(d.type) for d in pg.inputs}
    consts = {c.name: _tensor_bytes(c.type) for c in pg.constants}
    outs = {o: _tensor_bytes(types[o]) for o in dict.fromkeys(pg.outputs) if o not in inputs and o not in consts}
    # Informational: a table only ever gathered from (embeddings) is read at most as many bytes as
    # the gathers produce, not whole.
    gathered = 0
    for name, nbytes in consts.items():
        users = pg.consumers.get(name, ())
        if users and all(u.origin.op == "Gather" for u in users):
            gathered += nbytes - min(nbytes, sum(_tensor_bytes(u.out) for u in users))
    total = sum(inputs.values()) + sum(consts.values()) + sum(outs.values())
    return {"value": total, "inputs": sum(inputs.values()), "constants": sum(consts.values()),
            "outputs": sum(outs.values()), "num_inputs": len(inputs), "num_constants": len(consts),
            "num_outputs": len(outs), "gather_rows_only": total - gathered,
            "gather_rows_only_note": "informational: the same, but a constant that only Gather prims read "
                                     "(the embedding tables) counted at most at the bytes its gathers produce"}


def _target_figures(target_name: str, dtype: str) -> dict:
    from tilefuse.cost.target import Target
    t = Target.get(target_name)
    fig = {"name": t.name}
    try:
        from tilefuse.ir.dtypes import DType
        fig["peak_flops"] = float(t.peak(DType(dtype), True))
        fig["peak_kind"] = f"{dtype}, tensor cores (Target.peak)"
        fig["peak_source"] = "tilefuse Target"
    except Exception as e:
        if t.name != "h100":
            raise
        fig["peak_flops"] = H100_FALLBACK["peak_fp16_tensor"]
        fig["peak_kind"] = "float16, tensor cores (published H100 SXM figure)"
        fig["peak_source"] = f"script-fallback ({type(e).__name__})"
    for key in ("dram_bw", "launch_s", "launch_graph_s"):
        v = getattr(t, key, None)
        if v is None and t.name == "h100":
            v = H100_FALLBACK[key]
            fig[f"{key}_source"] = "script-fallback"
        fig[key] = v
    fig["dram_bw_Bps"] = fig.pop("dram_bw")
    return fig


# --------------------------------------------------------------------------- one plan's figures

def _plan_figures(compiled, paths: dict[str, str] | None) -> dict:
    """Kernels, modelled µs, traffic, flops and per-layer kernels of a compile's own (chosen) plan."""
    r = compiled.report
    kinfos = [_kdict(k) for k in r.kernels]
    plan_kernels = compiled.plan.kernels
    assert len(kinfos) == len(plan_kernels), "report kernels and plan kernels disagree"
    traffic = _report_get(r, "traffic_bytes")
    fig = {
        "num_kernels": len(plan_kernels),
        "modelled_us": float(r.est_total_us),
        "traffic_bytes": int(traffic) if traffic is not None else sum(int(k["bytes"]) for k in kinfos),
        "traffic_source": "report" if traffic is not None
        else "script-fallback: sum of report.kernels[i]['bytes'] of this compile's plan",
        "kernel_flops": sum(int(k.get("flops", 0)) for k in kinfos),
    }
    if paths is None:
        return fig
    by_scope: Counter = Counter()
    us_by: dict[str, float] = defaultdict(float)
    bytes_by: dict[str, int] = defaultdict(int)
    for k, info in zip(plan_kernels, kinfos):
        scopes = sorted({_prim_scope(p, paths) for p in k.prims})
        key = scopes[0] if len(scopes) == 1 else "mixed:" + "+".join(scopes)
        by_scope[key] += 1
        us_by[key] += float(info.get("est_us", 0.0))
        bytes_by[key] += int(info.get("bytes", 0))
    layers = sorted({int(s.split(".")[1]) for s in by_scope if s.startswith("layer.")})
    fig["kernels_by_scope"] = dict(sorted(by_scope.items(), key=lambda kv: _scope_key(kv[0])))
    fig["kernels_per_layer"] = [by_scope.get(f"layer.{i}", 0) for i in range(max(layers) + 1)] if layers else []
    fig["layer0"] = {"kernels": by_scope.get("layer.0", 0), "modelled_us": round(us_by.get("layer.0", 0.0), 3),
                     "traffic_bytes": bytes_by.get("layer.0", 0)}
    fig["kernels_spanning_scopes"] = sum(v for s, v in by_scope.items() if s.startswith("mixed:"))
    return fig


def _graph_fallback(fig: dict, delta_s: float) -> dict:
    """CUDA-graph time from a per-launch plan: every kernel saves launch_s - launch_graph_s."""
    g = dict(fig)
    g["modelled_us"] = round(fig["modelled_us"] - fig["num_kernels"] * delta_s * 1e6, 3)
    g["modelled_us_source"] = ("script-fallback: per-launch plan, est_total - kernels x "
                               "(target.launch_s - target.launch_graph_s)")
    if "layer0" in fig:
        l0 = dict(fig["layer0"])
        l0["modelled_us"] = round(l0["modelled_us"] - l0["kernels"] * delta_s * 1e6, 3)
        g["layer0"] = l0
    return g


# --------------------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="bert", choices=["bert", "llama"])
    ap.add_argument("--target", default="h100")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--label", default=None, help="stored in the JSON, e.g. before / after")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import transformers

    import tilefuse

    t_start = time.perf_counter()
    torch.manual_seed(0)
    if args.model == "bert":
        config = transformers.BertConfig(attn_implementation="sdpa")
        model = transformers.BertModel(config).eval().to(getattr(torch, args.dtype))
        ids = torch.randint(0, config.vocab_size, (1, args.seq))
        mask = torch.ones(1, args.seq, dtype=torch.int64)
        inputs = (ids, mask)
    else:
        from tilefuse import zoo
        model, input_sets = zoo.build("llama", "base", batch=1, seq=args.seq, attn="sdpa")
        model = model.to(getattr(torch, args.dtype))
        inputs = tuple(input_sets[0])
    built = time.perf_counter() - t_start

    notes: list[str] = []
    compile_log: list[dict] = []

    def do_compile(strategy: str, cuda_graph: bool, backend: str = "reference"):
        t = time.perf_counter()
        kw = {"cuda_graph": True} if cuda_graph else {}
        c = tilefuse.compile(model, inputs, target=args.target, backend=backend, strategy=strategy, **kw)
        compile_log.append({"strategy": strategy, "cuda_graph": cuda_graph, "backend": backend,
                            "seconds": round(time.perf_counter() - t, 2)})
        return c

    # ---- per-launch: one compile per strategy (the CompiledModel keeps only its chosen plan)
    box, restore = _capture_export()
    try:
        per = {"optimal": do_compile("optimal", False)}
    finally:
        restore()
    for s in ("unfused", "greedy"):
        per[s] = do_compile(s, False)
    main_c = per["optimal"]
    r = main_c.report
    rd = r.to_dict()
    pg = main_c.primgraph

    # ---- module paths of the source ops (for kernels per encoder layer)
    paths = None
    layer_method = None
    try:
        ep = box.get("ep")
        how = "the ExportedProgram tilefuse's frontend made during the compile (captured)"
        if ep is None:
            ep = torch.export.export(model, inputs).run_decompositions(torch.export.default_decompositions())
            how = "a separate torch.export of the model (tilefuse's export could not be captured)"
        paths = _module_paths(ep)
        names = [re.split(r"[.:]", n, maxsplit=1)[0] for p in pg.prims for n in p.origin.name.split("+")]
        unmatched = sorted({n for n in names if n not in paths})
        layer_method = (
            "prim.origin is Origin(op, name, location): op the source operator type, name the torch.fx "
            "node name of the decomposed exported program (suffixes '.k' / ':k' for the k-th canonical "
            "node emitted for one fx node), location the source line (e.g. 'modeling_bert.py:292 in "
            "forward'); none of them names the layer.  The script maps the fx node name (origin.name up "
            f"to the first '.' or ':') to the node's innermost nn_module_stack path, taken from {how}; "
            + ("a path containing 'layer.N' ('encoder.layer.3.attention.self') is encoder layer N, others "
               "are scoped by their first component ('embeddings', 'pooler', '' = 'model' for BertModel's "
               "own ops such as the attention-mask preparation)" if args.model == "bert" else
               "a path containing 'layers.N' ('model.layers.3.self_attn') is decoder layer N, others are "
               "scoped by their first component after LlamaForCausalLM's 'model.' ('embed_tokens', "
               "'rotary_emb', 'norm', 'lm_head', '' = 'model' for the model's own ops such as the "
               "attention-mask preparation); a prim of a merged projection (origin name "
               "'linear+linear_1+linear_2') has the scope its fx nodes share")
            + ".  A kernel counts for layer N iff all its "
            "prims are in layer N; kernels with prims from several scopes are counted under "
            "'mixed:<scopes>'.")
        if unmatched:
            notes.append(f"{len(unmatched)} prim origin names had no fx node / module path "
                         f"(scope 'unknown'): {unmatched[:10]}")
    except Exception as e:
        notes.append(f"kernels per layer unavailable: {type(e).__name__}: {e}")

    # ---- target figures, model figures
    tfig = _target_figures(args.target, args.dtype)
    delta_s = (tfig["launch_s"] or 0.0) - (tfig["launch_graph_s"] or 0.0)
    comp = _compulsory(pg)
    comp_report = _report_get(r, "compulsory_bytes")
    compulsory = {"value": int(comp_report) if comp_report is not None else comp["value"],
                  "source": "report" if comp_report is not None else
                  "script-fallback: PrimGraph inputs + constants + outputs, each distinct tensor once",
                  "script": comp}
    flops_report = _report_get(r, "total_flops")
    per_fig = {s: _plan_figures(per[s], paths) for s in STRATEGIES}
    flops = {"value": int(flops_report) if flops_report is not None else per_fig["optimal"]["kernel_flops"],
             "source": "report" if flops_report is not None else
             "script-fallback: sum of report.kernels[i]['flops'] of the optimal plan",
             "contraction_flops_2mnk": _contraction_flops(pg),
             "kernel_flops_by_strategy": {s: per_fig[s]["kernel_flops"] for s in STRATEGIES}}
    mem_us = compulsory["value"] / tfig["dram_bw_Bps"] * 1e6
    cmp_us = flops["value"] / tfig["peak_flops"] * 1e6
    roof_report = _report_get(r, "roofline_us")
    roofline = {"us": float(roof_report) if roof_report is not None else round(max(mem_us, cmp_us), 3),
                "source": "report" if roof_report is not None else
                "script-fallback: max(compulsory_bytes / dram_bw, flops / peak)",
                "script_us": round(max(mem_us, cmp_us), 3), "memory_us": round(mem_us, 3),
                "compute_us": round(cmp_us, 3), "bound": "memory" if mem_us >= cmp_us else "compute",
                "memory_us_gather_rows_only": round(comp["gather_rows_only"] / tfig["dram_bw_Bps"] * 1e6, 3)}

    # ---- consistency: each strategy compile against the optimal compile's strategies summary
    for s in STRATEGIES:
        summ = rd["strategies"].get(s, {})
        if summ and (summ.get("num_kernels") != per_fig[s]["num_kernels"]
                     or abs(float(summ.get("est_total_us", 0)) - per_fig[s]["modelled_us"]) > 1e-3):
            notes.append(f"strategy {s}: its own compile ({per_fig[s]['num_kernels']} kernels, "
                         f"{per_fig[s]['modelled_us']} us) differs from the optimal compile's summary {summ}")

    # ---- CUDA graph
    graph_info: dict = {}
    graph_c = None
    for backend in ("reference", "triton"):
        try:
            graph_c = {"optimal": do_compile("optimal", True, backend)}
            graph_info["backend"] = backend
            break
        except Exception as e:
            graph_info[f"error_{backend}"] = f"{type(e).__name__}: {e}"
    if graph_c is not None and graph_info["backend"] != "reference":
        notes.append(f"cuda_graph=True with backend='reference' raised ({graph_info['error_reference']}); "
                     f"the CUDA-graph plan was made with backend='{graph_info['backend']}' (plan only, "
                     f"kernels generated, none run)")
    changed = graph_c is not None and any(
        abs(float(graph_c["optimal"].report.to_dict()["strategies"][s]["est_total_us"])
            - per_fig[s]["modelled_us"]) > 1e-3 for s in STRATEGIES)
    graph_fig = {}
    if changed:
        for s in ("unfused", "greedy"):
            graph_c[s] = do_compile(s, True, graph_info["backend"])
        for s in STRATEGIES:
            graph_fig[s] = _plan_figures(graph_c[s], paths)
            graph_fig[s]["modelled_us_source"] = "report (compiled with cuda_graph=True)"
        graph_info["time_source"] = "report"
    else:
        for s in STRATEGIES:
            graph_fig[s] = _graph_fallback(per_fig[s], delta_s)
        graph_info["time_source"] = "script-fallback"
        graph_info["why"] = ("compiling with cuda_graph=True failed" if graph_c is None else
                             "compiling with cuda_graph=True left every modelled total unchanged "
                             "(the cost model ignores the launch mode)")
    for s in STRATEGIES:
        per_fig[s]["modelled_us_source"] = "report (est_total_us of a per-launch compile)"

    # ---- ratios
    modes = {"per_launch": per_fig, "cuda_graph": graph_fig}
    for figs in modes.values():
        for f in figs.values():
            f["modelled_over_roofline"] = round(f["modelled_us"] / roofline["us"], 3)
            f["traffic_over_compulsory"] = round(f["traffic_bytes"] / compulsory["value"], 3)
            f["traffic_over_compulsory_gather_rows_only"] = round(f["traffic_bytes"] / comp["gather_rows_only"], 3)

    # ---- print
    title = "BERT-base" if args.model == "bert" else "LLaMA-style (tilefuse.zoo llama base: LlamaForCausalLM)"
    print(f"{title}, seq {args.seq}, {args.dtype}, batch 1, target {args.target}"
          f"{' [' + args.label + ']' if args.label else ''} (MODELLED, not measured)")
    print(f"operators {r.num_ops}, prims {r.num_prims}; compulsory {compulsory['value'] / 1e6:.2f} MB "
          f"({compulsory['source'].split(':')[0]}), flops {flops['value'] / 1e9:.2f} G "
          f"({flops['source'].split(':')[0]}); roofline {roofline['us']:.1f} us ({roofline['bound']}-bound, "
          f"{roofline['source'].split(':')[0]})")
    print(f"{'strategy':8s} {'mode':10s} {'kernels':>7s} {'model us':>9s} {'traffic MB':>10s} "
          f"{'/roofline':>9s} {'/compuls.':>9s} {'k/layer0':>8s}  time source")
    for mode, figs in modes.items():
        for s in STRATEGIES:
            f = figs[s]
            l0 = f.get("layer0", {}).get("kernels", "-")
            print(f"{s:8s} {mode:10s} {f['num_kernels']:7d} {f['modelled_us']:9.1f} "
                  f"{f['traffic_bytes'] / 1e6:10.2f} {f['modelled_over_roofline']:9.2f} "
                  f"{f['traffic_over_compulsory']:9.2f} {l0!s:>8s}  {f['modelled_us_source'].split(':')[0]}")
    total_s = time.perf_counter() - t_start
    print(f"solver: {r.solver}")
    print(f"compiles: {', '.join(str(c['seconds']) for c in compile_log)} s; model construction "
          f"{built:.1f} s; total {total_s:.1f} s")
    for n in notes:
        print("note:", n)
    layer_kernels = None
    if args.model != "bert" and paths is not None:
        # LLaMA only (BERT's output stays as it was): every layer's kernel count per mode and the
        # kernels of one middle layer (layer 1) of the per-launch optimal plan
        layer_kernels = {"per_layer": {m: {s: figs[s].get("kernels_per_layer") for s in STRATEGIES}
                                       for m, figs in modes.items()},
                         "kernels_by_scope": {m: figs["optimal"].get("kernels_by_scope") for m, figs in modes.items()},
                         "layer1_optimal_per_launch": []}
        for k, info in zip(main_c.plan.kernels, r.kernels):
            if {_prim_scope(p, paths) for p in k.prims} == {"layer.1"}:
                layer_kernels["layer1_optimal_per_launch"].append(
                    {"name": info.name, "family": info.family, "est_us": info.est_us,
                     "ops": list(dict.fromkeys(o.split(":")[0] for o in info.ops))})
        for m, figs in modes.items():
            print(f"kernels per layer, optimal, {m}: {figs['optimal'].get('kernels_per_layer')}; other scopes: "
                  + ", ".join(f"{k} {v}" for k, v in (figs["optimal"].get("kernels_by_scope") or {}).items()
                              if not k.startswith("layer.")))
        print("layer 1, optimal, per launch:")
        for k in layer_kernels["layer1_optimal_per_launch"]:
            print(f"  {k['name'][:48]:48s} {k['family']:8s} {k['est_us']:8.2f} us  {' '.join(k['ops'])}")

    ok_order = (per_fig["optimal"]["modelled_us"] <= per_fig["greedy"]["modelled_us"]
                <= per_fig["unfused"]["modelled_us"])
    ok_fewer = per_fig["optimal"]["num_kernels"] < r.num_ops
    ok = ok_order and ok_fewer

    if args.json:
        pkg_dir = os.path.dirname(os.path.abspath(tilefuse.__file__))
        status = _git(pkg_dir, "status", "--porcelain")
        out = {
            "what": f"tilefuse plans of {'BERT-base' if args.model == 'bert' else 'a LLaMA-style decoder'}; "
                    "times and traffic are MODELLED by the analytic cost "
                    "model, not measured",
            "label": args.label,
            "command": " ".join(([f"PYTHONPATH={os.environ['PYTHONPATH']}"] if os.environ.get("PYTHONPATH") else [])
                                + [os.path.basename(sys.executable)] + sys.argv),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": {"platform": platform.platform(), "processor": platform.processor(),
                        "cpus": os.cpu_count(), "hostname": platform.node()},
            "versions": {"tilefuse": getattr(tilefuse, "__version__", None), "torch": torch.__version__,
                         "transformers": transformers.__version__, "python": platform.python_version()},
            "tilefuse_source": {"file": tilefuse.__file__,
                                "git_commit": _git(pkg_dir, "rev-parse", "HEAD"),
                                "git_dirty_files": None if status is None else len(status.splitlines())},
            "config": {"model": "BertModel(BertConfig(attn_implementation='sdpa')), random weights, seed 0"
                       if args.model == "bert" else
                       "tilefuse.zoo.build('llama', 'base'): LlamaForCausalLM(LlamaConfig(vocab_size=32000, "
                       "hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12, "
                       "num_key_value_heads=4, attn_implementation='sdpa', use_cache=False)), weights "
                       "zoo.randomize (seed 0), inputs: input set 0 (token ids, all-ones attention mask)",
                       "target": args.target, "seq": args.seq, "dtype": args.dtype, "batch": 1,
                       "backend": "reference (plan only; no kernel runs)"},
            "target": tfig,
            "model": {"num_ops": r.num_ops, "num_prims": r.num_prims, "compulsory_bytes": compulsory,
                      "flops": flops, "roofline": roofline},
            "modes": {
                "per_launch": {"source": "report", "strategies": per_fig},
                "cuda_graph": {**graph_info, "strategies": graph_fig},
            },
            "kernels_per_layer_method": layer_method,
            "solver": r.solver,
            "compiles": compile_log,
            "model_construction_seconds": round(built, 2),
            "total_seconds": round(total_s, 2),
            "checks": {"optimal<=greedy<=unfused (per-launch)": ok_order,
                       "optimal kernels < operators": ok_fewer, "ok": ok},
            "notes": notes,
        }
        if layer_kernels is not None:
            out["layers"] = layer_kernels
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
