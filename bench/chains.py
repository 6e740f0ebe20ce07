"""GEMM chains ``act(A @ B) @ D`` in one chain kernel against two GEMMs: planned (MODELLED) for a
GPU target on any machine, MCFuser's own analytic model beside tilefuse's, and MEASURED against
eager and torch.compile where CUDA is present.

    python bench/chains.py [--target h100] [--act relu|gelu] [--json bench/results/chains_h100.json]
        [--shapes G1,G2,...|tiny] [--device cuda|cpu|none] [--variants eager,torch_compile_max_autotune,tilefuse]
        [--warmup 10] [--runs 50] [--budget-s 540]
    python bench/chains.py attention ...      # the attention benchmark: bench/attention.py (same options)

Shapes: MCFuser's Table II, G1-G12 (shared/papers/mcfuser-notes.md §4.2: GEMM1 (b, M, K) x (b, K, N),
GEMM2 (b, M, N) x (b, N, H)), fp16, ``act`` ReLU (default) or GELU (erf).

MODELLED, per shape, planned for ``--target`` (no kernel runs; empty CPU tensors): the chain plan
(``tilefuse.compile(fn, (a, b, d), target=..., backend="reference")``) and the same PrimGraph planned
without the chain family (two GEMMs, the activation in the first one's epilogue), with the same
figures as bench/attention.py (kernels, family, name, modelled µs per launch and as kernel bodies,
grid, tile, DRAM traffic, useful TFLOP/s = 2·b·M·N·(K+H) / time, the roofline bound
``report.roofline_us`` and time / roofline, speedups).

MCFuser's model beside tilefuse's (``bench/mcfuser.py``; ``ModelParams.of(target)``: the
target's peak DRAM bandwidth and fp16 tensor-core peak; the block-aware trip-count convention):

- ``mcfuser_space``: the tile MCFuser's analytic model (Eq. 2-5: (bytes/𝒲 + flops/𝒫)·α) ranks
  first over its whole pruned space (``pruned_space``: Rules 1-4, tiles multiples of 16, both
  tilings ``mh|nk`` and ``m|n(k,h)``), and what its evolutionary search (``search``, Alg. 1, seed 0,
  the model itself standing in for the device measurements, as no device runs here) returns;
- ``template_space``: the same model over the Triton template's space (``chain_tiles``: the ``nk``
  tiling, power-of-two tiles), where tilefuse's chain family searches too; beside it the tile
  tilefuse's cost model chose for the chain kernel (``plan.kernels[0].schedule.tile``), each
  tile's rank and time under the other model, and whether the two models agree (same BM, BN,
  BK, BH; tilefuse also picks warps and stages, which MCFuser's model does not see).

MEASURED (only where CUDA is available): ``eager`` (the two matmuls and the activation in torch,
cuBLAS), ``torch_compile_max_autotune`` and ``tilefuse`` (``target="auto"``, called once to JIT),
timed and checked against an fp32 reference exactly as in bench/attention.py.  Without CUDA the
JSON says ``measured: null`` with the reason.

Exit status 0 iff the chain family builds every chain.  Shapes whose chain kernel body models
slower than the two GEMMs, and shapes whose plan is not the chain because its best kernel models
slower (per launch) than the plan without it, are listed, not failed.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import math
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import attention as att  # noqa: E402  (bench/attention.py: the shared helpers)

# MCFuser Table II: (name, batch, M, N, K, H)
GEMM = [("G1", 1, 512, 256, 64, 64), ("G2", 1, 512, 256, 64, 128), ("G3", 1, 512, 256, 64, 256),
        ("G4", 1, 512, 512, 256, 256), ("G5", 1, 512, 512, 512, 256), ("G6", 1, 512, 512, 1024, 256),
        ("G7", 1, 512, 512, 128, 128), ("G8", 1, 1024, 512, 128, 128), ("G9", 1, 2048, 512, 128, 128),
        ("G10", 1, 1024, 1024, 128, 128), ("G11", 4, 1024, 1024, 128, 128), ("G12", 8, 1024, 1024, 128, 128)]
TINY = [("tiny", 1, 32, 32, 16, 16), ("tiny-batch2", 2, 32, 64, 32, 16)]
VARIANTS = ("eager", "torch_compile_max_autotune", "tilefuse")
TIE = 1e-9               # relative: model times this close are ties


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    group: str
    batch: int
    m: int
    n: int
    k: int
    h: int
    act: str

    @property
    def shapes(self):
        return ((self.batch, self.m, self.k), (self.batch, self.k, self.n), (self.batch, self.n, self.h))

    @property
    def useful_flops(self) -> float:
        return 2 * self.batch * self.m * self.n * (self.k + self.h)

    def meta(self) -> dict:
        return {"batch": self.batch, "M": self.m, "N": self.n, "K": self.k, "H": self.h, "act": self.act,
                "dtype": "float16", "fn": f"{self.act}(A @ B) @ D"}


def cases(act: str) -> list[Case]:
    return ([Case(n, "mcfuser", b, m, nn, k, h, act) for n, b, m, nn, k, h in GEMM]
            + [Case(n, "tiny", b, m, nn, k, h, act) for n, b, m, nn, k, h in TINY])


def chain_fn(act: str):
    import torch
    f = torch.relu if act == "relu" else torch.nn.functional.gelu
    return lambda a, b, d: f(a @ b) @ d


# ---------------------------------------------------------------------------------------------
# MCFuser's model beside tilefuse's

def _tile4(t) -> tuple[int, int, int, int]:
    return (t.bm, t.bn, t.bk, t.bh)


def model_comparison(case: Case, chain_sched, target_name: str) -> dict:
    """MCFuser's analytic model over its pruned space and over the Triton template's, and tilefuse's
    choice; ``chain_sched``: the chain plan's chain kernel schedule (None if the plan has none)."""
    from tilefuse.cost.target import Target
    import mcfuser as tiling
    target = Target.get(target_name)
    params = tiling.ModelParams.of(target)
    smem = target.smem_per_block
    if chain_sched is not None:
        from tilefuse.families.chain import chain_shape
        shape = chain_shape(chain_sched.body)
    else:
        shape = tiling.ChainShape(case.batch, case.m, case.n, case.k, case.h, 2)
    out: dict = {"shape": dataclasses.asdict(shape), "params": dataclasses.asdict(params), "convention": "block",
                 "smem_per_block": smem}

    def est(c):
        return tiling.estimate(shape, c, params, convention="block")

    # MCFuser's whole pruned space
    space = tiling.pruned_space(shape, smem, convention="block")
    scored = sorted(((est(c).seconds, str(c.tiling), _tile4(c.tile), c) for c in space), key=lambda x: x[:3])
    if scored:
        s, _, _, best = scored[0]
        e = est(best)
        out["mcfuser_space"] = {"candidates": len(space), "tiling": str(best.tiling), "tile": list(_tile4(best.tile)),
                                "ties": sum(1 for x in scored if x[0] <= s * (1 + TIE)),
                                "tie_note": "candidates within TIE of the best; the first by (tiling, tile) is shown",
                                "model_us": round(s * 1e6, 3), "alpha": round(e.alpha, 3),
                                "t_mem_us": round(e.t_mem * 1e6, 3), "t_comp_us": round(e.t_comp * 1e6, 3)}
        t0 = time.perf_counter()
        r = tiling.search(shape, lambda cands: [est(c).seconds for c in cands], params, smem, convention="block",
                          seed=0)
        out["mcfuser_space"]["search"] = {
            "tiling": str(r.best.tiling), "tile": list(_tile4(r.best.tile)), "model_us": round(r.seconds * 1e6, 3),
            "rounds": len(r.rounds), "converged": r.converged, "seconds": round(time.perf_counter() - t0, 2),
            "finds_exhaustive_best": r.best == best or r.seconds <= s * (1 + 1e-12),
            "measure": "the model itself (no device): the search's candidates are ranked and 'measured' by Eq. 2"}
    else:
        out["mcfuser_space"] = {"candidates": 0, "note": "Rules 3 and 4 leave no tile"}

    # the Triton template's space (the nk tiling, power-of-two tiles): MCFuser's model vs tilefuse's.
    # MCFuser's model often ties (BN changes neither its bytes nor its padded flops when the n loop
    # runs inside the program): its choice is the set of tiles within TIE of its best, which MCFuser
    # would leave to its device measurements.
    tiles = tiling.chain_tiles(shape, target)
    mc_time = {_tile4(t): est(tiling.Candidate(tiling.NK, t)).seconds for t in tiles}
    tmpl: dict = {"tiles": len(tiles)}
    if not mc_time:
        out["template_space"] = tmpl
        return out
    mc_best_s = min(mc_time.values())
    ties = sorted(t for t, x in mc_time.items() if x <= mc_best_s * (1 + TIE))
    distinct = sorted(set(mc_time.values()))
    tmpl["mcfuser_choice"] = {"best_tiles": [list(t) for t in ties], "ties": len(ties),
                              "mcfuser_model_us": round(mc_best_s * 1e6, 3)}
    if chain_sched is None:
        out["template_space"] = tmpl
        return out
    from tilefuse.cost.model import estimate as kernel_estimate
    from tilefuse.families import family
    from tilefuse.families.chain import ranked_tiles
    tf = chain_sched.tile
    tf4 = _tile4(tf)
    tf_mc = mc_time.get(tf4)
    if tf_mc is None:
        tf_mc = est(tiling.Candidate(tiling.NK, tiling.ChainTile(*tf4))).seconds
    chosen_body = family("chain").cost(chain_sched, target).seconds - target.launch_s
    tmpl["tilefuse_choice"] = {
        "tile": list(tf4), "warps": tf.warps, "stages": tf.stages, "text": str(tf),
        "tilefuse_body_us": round(chosen_body * 1e6, 3), "mcfuser_model_us": round(tf_mc * 1e6, 3),
        "mcfuser_model_over_its_best": round(tf_mc / mc_best_s, 3),
        "mcfuser_rank": 1 + sum(1 for x in distinct if x < tf_mc * (1 - TIE)),
        "mcfuser_rank_note": "1 + the number of distinct MCFuser-model times below this tile's"}
    tmpl["agree"] = tf4 in ties
    # tilefuse's model of MCFuser's best tiles: each at tilefuse's best warps and stages for it
    try:
        from tilefuse.families.chain import _schedule    # private: the work of one tile on this body
        body_of: dict = {}
        for t in ranked_tiles(chain_sched.body, target):  # fastest first: the first per 4-tuple wins
            if _tile4(t) not in body_of:
                body_of[_tile4(t)] = (t, kernel_estimate(_schedule(chain_sched.body, t, target).work, target).body)
    except Exception as e:               # the chain module changed: say what is missing
        tmpl["tilefuse_model_note"] = f"tilefuse's times of other tiles unavailable: {type(e).__name__}: {e}"
        out["template_space"] = tmpl
        return out
    order = sorted(b for _, b in body_of.values())
    scored = sorted((body_of[t][1], t) for t in ties if t in body_of)
    if scored:
        (b_lo, t_lo), (b_hi, t_hi) = scored[0], scored[-1]
        tmpl["mcfuser_choice"].update(
            tilefuse_best_of_ties={"tile": list(t_lo), "warps_stages": [body_of[t_lo][0].warps, body_of[t_lo][0].stages],
                                   "tilefuse_body_us": round(b_lo * 1e6, 3),
                                   "over_tilefuse_choice": round(b_lo / chosen_body, 3),
                                   "tilefuse_rank": 1 + sum(1 for x in order if x < b_lo * (1 - TIE))},
            tilefuse_worst_of_ties={"tile": list(t_hi), "tilefuse_body_us": round(b_hi * 1e6, 3),
                                    "over_tilefuse_choice": round(b_hi / chosen_body, 3)})
    missing = [list(t) for t in ties if t not in body_of]
    if missing:
        tmpl["mcfuser_choice"]["infeasible_for_tilefuse"] = missing
    out["template_space"] = tmpl
    return out


def measure_case(case: Case, device: str, args) -> dict:
    import torch
    sys.path.insert(0, str(HERE))
    import gpu_models as gm
    gen = torch.Generator().manual_seed(0)
    sa, sb, sd = case.shapes
    a = torch.randn(sa, generator=gen)
    b = torch.randn(sb, generator=gen) / math.sqrt(case.k)      # O(1) activations through both products
    d = torch.randn(sd, generator=gen) / math.sqrt(case.n)
    real = tuple(x.to(device=device, dtype=torch.float16) for x in (a, b, d))
    fn = chain_fn(case.act)
    with torch.no_grad(), gm.full_fp32(torch):
        ref = fn(*(x.float() for x in real)).float()
    prep = {"eager": lambda: (fn, {"what": f"{case.act}(a @ b) @ d in torch (cuBLAS)"}),
            "torch_compile_max_autotune": att.torch_compile_variant(fn),
            "tilefuse": att.tilefuse_variant(fn, real, device)}
    timer = att.make_timer(device, args.warmup, args.runs)
    out = att.run_variants({v: prep[v] for v in args.variants}, real, ref, timer, device, None, case.useful_flops)
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def _chain_schedule_us(cm, target_name: str):
    """Modelled µs (per launch) of the chain family's best kernel for the whole graph, or None
    when the family cannot build it."""
    from tilefuse.cost.target import Target
    from tilefuse.families.chain import ChainFamily
    target = Target.get(target_name)
    fam = ChainFamily()
    scheds = fam.schedules(att.whole_group(cm.primgraph), target)
    return fam.cost(scheds[0], target).seconds * 1e6 if scheds else None


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "attention":
        return att.main(argv[1:])
    if argv and argv[0] == "gemm":
        argv = argv[1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="h100")
    ap.add_argument("--act", default="relu", choices=["relu", "gelu"])
    ap.add_argument("--json", default=None)
    ap.add_argument("--shapes", default=None, help="comma-separated names or groups (mcfuser, tiny); default mcfuser")
    ap.add_argument("--device", default=None, choices=["cuda", "cpu", "none"],
                    help="where to measure (default: cuda when available, else nothing)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="measured variants, of " + ",".join(VARIANTS))
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--runs", type=int, default=None)
    ap.add_argument("--budget-s", type=float, default=540.0)
    args = ap.parse_args(argv)
    sys.path[:0] = [str(att.ROOT)]
    import tilefuse  # noqa: F401  (before triton loads)
    import torch
    args.variants = tuple(v for v in args.variants.split(",") if v)
    bad = [v for v in args.variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variant(s) {bad}; choose from {VARIANTS}")
    device, why_not = att.resolve_device(args.device)
    args.warmup = args.warmup if args.warmup is not None else (10 if device == "cuda" else 1)
    args.runs = args.runs if args.runs is not None else (50 if device == "cuda" else 3)
    todo = att.select(cases(args.act), args.shapes, default_groups=("mcfuser",))
    started = time.perf_counter()
    doc = {"what": f"GEMM chains {args.act}(A @ B) @ D: tilefuse's chain plan vs the same graph planned without "
                   "the chain family, and MCFuser's analytic model's tile choice beside tilefuse's. Planned "
                   "figures are MODELLED for the target (no kernel runs); 'measured' holds device timings "
                   "where CUDA was available",
           "command": att.command(),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           **att.environment(device),
           "target": att.target_figures(args.target),
           "conventions": {
               **att.PLAN_CONVENTIONS,
               "tflops / tflops_body": "useful flops 2*b*M*N*(K+H) over modelled_us / body_us",
               "traffic_bytes": "modelled DRAM bytes of the plan's kernels (report.traffic_bytes)",
               "roofline": "report.roofline_us: max(compulsory bytes / peak DRAM bandwidth, every prim's flops "
                           "at its peak: the products at the fp16 tensor-core peak, the activation at the fp32 "
                           "CUDA-core peak)",
               "mcfuser": "bench/mcfuser.py: estimate() with ModelParams.of(target), block-aware "
                          "trip counts; times in 'model_us' are MCFuser's model's, not tilefuse's"},
           "measured": att.measured_header(device, args, "the same function in fp32, tf32 off"),
           "measured_reason": why_not,
           "cases": []}
    print(f"GEMM chains {args.act}(A@B)@D planned for {args.target}: MODELLED (no kernel runs)")
    rows, failures, slower, not_chosen = [], [], [], []
    for case in todo:
        inputs = tuple(torch.empty(s, dtype=torch.float16) for s in case.shapes)
        rec = {"name": case.name, **case.meta()}
        objs: dict = {}
        try:
            rec.update(att.plan_pair(chain_fn(case.act), inputs, case.useful_flops, args.target, objs))
        except Exception as e:
            rec["error"] = f"planning: {type(e).__name__}: {e}"[:1500]
        c = rec.get("chain")
        one = bool(c) and c["num_kernels"] == 1 and c["families"] == ["chain"]
        rec["checks"] = {"chain_is_one_chain_kernel": one,
                         "chain_faster_body": bool(c) and (rec["speedup_body"] or 0) > 1,
                         "chain_faster_per_launch": bool(c) and (rec["speedup"] or 0) > 1}
        if not one:
            best = _chain_schedule_us(objs.get("compiled"), args.target) if c else None
            rec["chain_family_best_us"] = best
            if best is None:        # the chain family cannot build the chain at all: a failure
                failures.append(f"{case.name}: the chain plan is not one chain kernel"
                                + (f" ({c['num_kernels']} kernels: {'+'.join(c['families'])})" if c else ""))
            else:                   # it can, and its best kernel models slower than the plan chosen
                not_chosen.append(f"{case.name} (chain {best:.2f} us vs {c['modelled_us']:.2f} us)")
        elif not rec["checks"]["chain_faster_body"]:
            slower.append(case.name)
        if c:
            chains = [k.schedule for k in objs["compiled"].plan.kernels if k.schedule.family == "chain"]
            try:
                rec["models"] = model_comparison(case, chains[0] if chains else None, args.target)
            except Exception as e:
                rec["models"] = {"error": f"{type(e).__name__}: {e}"[:1500]}
        rec["measured"] = att.measured_within_budget(measure_case, case, device, args, started)
        rows.append(rec)
        doc["cases"] = rows
        doc["total_s"] = round(time.perf_counter() - started, 1)
        att.write_json(args.json, doc)
        if c:
            w = rec["without_chain"]
            print(f"  {case.name:6s} chain {c['num_kernels']} k {c['body_us']:7.2f} / {c['modelled_us']:7.2f} us"
                  f" | w/o {w['num_kernels']} k {w['body_us']:7.2f} / {w['modelled_us']:7.2f} us"
                  f" | x{rec['speedup_body']:.2f} / x{rec['speedup']:.2f}", flush=True)
        else:
            print(f"  {case.name:6s} {rec['error'][:300]}", flush=True)

    print(f"\nMODELLED for {args.target} (us; body = without launches, total = per launch)")
    head = ["shape", "chain k", "body", "total", "w/o k", "w/o body", "w/o total", "x body", "x total",
            "TFLOP/s body", "MB chain", "MB w/o", "roofline", "body/roof"]
    table = []
    for rec in rows:
        c, w = rec.get("chain"), rec.get("without_chain")
        if not c:
            table.append([rec["name"], "ERROR"] + ["-"] * (len(head) - 2))
            continue
        table.append([rec["name"], str(c["num_kernels"]), f"{c['body_us']:.2f}", f"{c['modelled_us']:.2f}",
                      f"{w['num_kernels']} {'+'.join(w['families'])}", f"{w['body_us']:.2f}", f"{w['modelled_us']:.2f}",
                      f"{rec['speedup_body']:.2f}", f"{rec['speedup']:.2f}", att._f(c["tflops_body"], ".0f"),
                      f"{c['traffic_bytes'] / 1e6:.2f}", f"{w['traffic_bytes'] / 1e6:.2f}",
                      f"{rec['roofline']['us']:.2f}", att._f(c["body_over_roofline"], ".2f")])
    att.print_table(head, table)

    print("\nTile choices, BMxBNxBKxBH: tilefuse's cost model vs MCFuser's analytic model (Eq. 2, block-aware "
          "trip counts) over the Triton template's space; 'MC best' = the tiles tied at MCFuser's best, "
          "'tf of MC best' = tilefuse's time of the best of them over tilefuse's choice")
    head = ["shape", "tilefuse tile", "MC best (ties)", "agree", "tf tile in MC model", "tf of MC best",
            "MCFuser own space (ties)", "MC model us", "search=exh."]
    table = []
    for rec in rows:
        m = rec.get("models") or {}
        if "template_space" not in m:
            table.append([rec["name"], (m.get("error") or "-")[:60]] + ["-"] * (len(head) - 2))
            continue
        t, ms = m["template_space"], m.get("mcfuser_space", {})
        tfc, mcc = t.get("tilefuse_choice") or {}, t.get("mcfuser_choice") or {}

        def x4(v):
            return "x".join(map(str, v)) if v else "-"
        lo = mcc.get("tilefuse_best_of_ties") or {}
        table.append([rec["name"], f"{x4(tfc.get('tile'))} w{tfc.get('warps')} s{tfc.get('stages')}" if tfc else "-",
                      f"{x4(lo.get('tile') or (mcc.get('best_tiles') or [None])[0])} ({mcc.get('ties', 0)})",
                      "yes" if t.get("agree") else "no",
                      f"x{att._f(tfc.get('mcfuser_model_over_its_best'), '.3f')} (rank {tfc.get('mcfuser_rank', '-')})",
                      f"x{att._f(lo.get('over_tilefuse_choice'), '.2f')}",
                      f"{ms.get('tiling', '-')} {x4(ms.get('tile'))} ({ms.get('ties', 0)})", att._f(ms.get("model_us"), ".2f"),
                      str(ms.get("search", {}).get("finds_exhaustive_best", "-"))])
    att.print_table(head, table)
    att.measured_table(rows, args.variants, device)
    doc["chain_body_slower"] = slower
    doc["chain_not_chosen"] = not_chosen
    notes = [f"chain kernel body models slower than the two GEMMs (chosen for the launch it saves): "
             f"{', '.join(slower)}"] if slower else []
    if not_chosen:
        notes.append("the chain family's best kernel models slower than the plan without it, which the "
                     f"planner chose: {', '.join(not_chosen)}")
    return att.finish(doc, args, started, why_not, failures, notes)


if __name__ == "__main__":
    sys.exit(main())
