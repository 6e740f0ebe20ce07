"""The calibration table (docs/cost-model.md): published and recorded GPU figures, each an
assertion with a stated tolerance.  Every time here is MODELLED by tilefuse's cost model and
compared with a figure measured by others on real hardware (sources in docs/cost-model.md).

Where the model misses a figure, the model is fixed, not the tolerance.
"""
import math

import pytest
import torch

from planning import chosen, meta, plan_op

from tilefuse.cost.model import Resources, Work, estimate, occupancy, parallelism
from tilefuse.cost.target import Target
from tilefuse.ir.dtypes import DType

H100, H200, A100 = (Target.get(n) for n in ("h100", "h200", "a100"))
GiB = 1 << 30


def _body(cost, target):
    """Device time of a kernel without the host's launch overhead (what CUDA events measure)."""
    return cost.seconds - target.launch_s


@pytest.mark.parametrize("target,peak_tb,measured_tb,tol", [
    (H100, 3.35, 3.35 * 0.90, 0.05),     # H100 SXM HBM3 3.35 TB/s; ~90% achievable on a large copy
    (H200, 4.80, 4.30, 0.05),            # H200 4.8 TB/s; a device-to-device copy measured at ~4.3 TB/s
])
def test_large_copy_bandwidth(target, peak_tb, measured_tb, tol):
    n = GiB // 2                         # 1 GiB of fp16, read and written
    plan, coster = plan_op("Relu", [meta(n)], (n,), target=target.name)      # a copy's traffic
    ((cost, s),) = chosen(plan, coster, "fused")
    rate = 2 * n * 2 / _body(cost, target)          # read + write bytes, as the copy benchmarks count
    assert rate == pytest.approx(measured_tb * 1e12, rel=tol)


def test_8192_cubed_bf16_gemm_on_h200_about_790_tflops():
    n = 8192
    plan, coster = plan_op("MatMul", [meta(n, n, dtype=torch.bfloat16), meta(n, n, dtype=torch.bfloat16)], (n, n),
                           target="h200", dtype=DType.bfloat16)
    ((cost, s),) = chosen(plan, coster, "library")
    assert s.tensor_cores
    tflops = 2 * n ** 3 / _body(cost, H200) / 1e12
    assert tflops == pytest.approx(790, rel=0.10)


@pytest.mark.parametrize("target", [H100, H200, A100])
def test_launch_overheads(target):
    # 2-5 us per launch from Python (Souffle: ~2 us per launch on an A100); ~1 us per CUDA-graph
    # node: a tiny kernel is launch-bound either way, and a CUDA graph saves the difference
    plan, coster = plan_op("Relu", [meta(256)], (256,), target=target.name)
    ((eager, _),) = chosen(plan, coster, "fused")
    plan, coster = plan_op("Relu", [meta(256)], (256,), target=target.name, cuda_graph=True)
    ((graph, _),) = chosen(plan, coster, "fused")
    assert eager.bound == "launch"
    assert eager.seconds - graph.seconds == pytest.approx(target.launch_s - target.launch_graph_s)
    assert 2e-6 <= eager.seconds <= 8e-6 and 1e-6 <= graph.seconds <= 4e-6


@pytest.mark.parametrize("n", [1024, 2048, 4096, 8192])
def test_triton_softmax_tutorial_one_row_per_program_near_dram_bandwidth(n):
    # The Triton fused-softmax tutorial (fp32, 4096 rows): one row per program reaches close to
    # DRAM bandwidth for rows up to the register limit.  "Close": >= 75% of the peak.
    plan, coster = plan_op("Softmax", [meta(4096, n, dtype=torch.float32)], (4096, n), {"axis": -1},
                           dtype=DType.float32)
    ((cost, s),) = chosen(plan, coster, "fused")
    assert s.xblock == 1 and s.one_pass
    rate = 2 * 4096 * n * 4 / _body(cost, H100)
    assert rate >= 0.75 * H100.dram_bw


def _attention_tflops(b, h, s, d, families=None):
    """Modelled TFLOP/s of non-causal fp16 attention planned for h100 (launches excluded), and the
    plan's kernel count; ``families`` restricts the kernel families."""
    from opcheck import one_node_graph

    from tilefuse.fission import fission
    from tilefuse.ir.dtypes import TensorType
    from tilefuse.orchestrate.costing import Coster
    from tilefuse.orchestrate.strategies import plan_strategies
    from tilefuse.transform.simplify import simplify_graph
    q = meta(b, h, s, d)
    pg = simplify_graph(fission(one_node_graph("ScaledDotProductAttention", [q, q, q],
                                               [TensorType((b, h, s, d), DType.float16)], {})))
    coster = Coster(pg.types, H100, **({"families": families} if families else {}))
    plan = plan_strategies(pg, coster)["optimal"]
    seconds = sum(coster.best(k.candidate)[0].seconds - H100.launch_s for k in plan.kernels)
    return 4 * b * h * s * s * d / seconds / 1e12, len(plan.kernels)


def test_attention_in_three_kernels_is_slower_than_flashattention():
    # FlashAttention-2 forward reaches ~335 TFLOP/s (fp16, head dim 128, H100).  Without the chain
    # family attention is three or more kernels (QK^T, softmax, PV) with the S x S scores through
    # DRAM: the model must not claim that beats FlashAttention-2.
    from tilefuse.families import FAMILIES
    tflops, kernels = _attention_tflops(1, 16, 4096, 128, [f for f in FAMILIES if f.name != "chain"])
    assert tflops < 335 and kernels >= 2


# FlashAttention-3 paper (Shah et al., 2024), Fig. "Attention forward speed, head dim 64/128/256
# (H100 80GB SXM5)", fp16, non-causal, 16k tokens per batch: Triton's fused attention at sequence
# length 4k reaches 499 / 605 / 854 TFLOP/s.  The chain kernel (one kernel, online softmax, the
# scores on chip) must not model above the Triton figure (at most 10%), nor far below it (60%):
# our chain MEASURED 479 TFLOP/s on the H200 at head dim 128 (0.79x the published 605; the model
# is held to that measurement by the test below), and its exponentials run on the SFU at 16 a
# clock an SM (``OP_WEIGHT``), which the published kernel's overlap of softmax and products hides
# better.  Modelled from the kernel the template prints (cost/work.py): 374 / 478 / 545.
@pytest.mark.parametrize("d,published,low", [(64, 499, 0.6), (128, 605, 0.6), (256, 854, 0.6)])
def test_chain_attention_models_near_published_triton_throughput(d, published, low):
    tflops, kernels = _attention_tflops(16384 // 4096, 2048 // d, 4096, d)     # batch 4, hidden 2048
    assert kernels == 1
    assert low * published <= tflops <= 1.1 * published


def test_mcfuser_t7_parallelism_factor():
    # mcfuser-notes §7 T7 on 108 SMs: 8 blocks -> 14.5, 108 -> 2.0, many -> 1 (ranking only)
    assert parallelism(8, A100) == pytest.approx(14.5)
    assert parallelism(108, A100) == pytest.approx(2.0)
    assert parallelism(10 ** 9, A100) == pytest.approx(1.0)


def test_welder_waves_and_occupancy():
    # welder-notes: num_wave = ceil(grid / (blocks_per_SM · #SM)); blocks per SM limited by
    # threads, registers and shared memory (souffle-notes: the same occupancy form)
    res = Resources(warps=4, regs_per_thread=64, smem_bytes=48 * 1024)
    occ = occupancy(res, H100)
    assert occ == min(32, 2048 // 128, 65536 // (64 * 128), (228 * 1024) // (48 * 1024)) == 4
    w = Work(programs=1000, dram_bytes=1e6, l2_bytes=1e6, flops=0, peak=1e12, inflight_bytes=4096, res=res)
    assert estimate(w, H100).waves == math.ceil(1000 / (132 * 4))


def test_tensor_core_tasks_of_the_traced_persistent_kernel():
    """MEASURED on an H200 (bench/results/gpu_h200_2026-11-28): BERT-small's persistent kernel with
    each task's GPU clock.  Its plan, made again here with the tensor-core latency floor off (the
    model it was planned with), gives the same kernels in the same order (but that the first
    layer's attention reads the mask's cast from the cast kernel, where the traced one computed it
    again: an exponential costs the SFU's rate since); with h200's floor each
    tensor-core task's modelled time is within 20% of the median task measured (without it they
    were over 2x short)."""
    import json
    from dataclasses import replace
    from pathlib import Path
    import tilefuse
    from tilefuse import zoo
    from tilefuse.cost.persistent import phase_of
    from tilefuse.families import family
    record = Path(__file__).resolve().parent.parent / "bench/results/gpu_h200_2026-11-28/gpu_models_small.json"
    trace = json.loads(record.read_text())["models"][0]["variants"]["tilefuse_persistent"]["trace"][0]["phases"]
    model, (inputs,) = zoo.build("bert", "small")
    unfloored = replace(H200, dot_program_s=0.0, dot_step_s=0.0)
    cm = tilefuse.compile(model.half(), inputs, target=unfloored, time_limit=10.0, backend="reference")
    assert [b.name for b in cm.kernels] == [p["kernel"].replace("chain_cast_", "chain_") for p in trace]
    checked = 0
    for k, p in zip(cm.plan.kernels, trace):
        if not k.schedule.work.dot_steps:
            continue
        task = lambda t: phase_of(family(k.schedule.family).cost(k.schedule, t), t.launch_s,  # noqa: E731
                                  k.schedule.work.programs).task_s
        assert task(H200) * 1e6 == pytest.approx(p["measured"]["task_us"], rel=0.2), p["kernel"]
        assert task(unfloored) * 1e6 < p["measured"]["task_us"] / 2, p["kernel"]
        checked += 1
    assert checked == 20           # five a layer: QKV, attention, out-projection, FFN up, FFN down


def test_two_pipeline_stages_cost_what_the_h200_measured_of_the_same_gemm_tiles():
    """The fourth GPU session timed GEMM tiles at two and three pipeline stages (TMA, warpgroup
    MMA; bench/results/gpu_h200_2026-11-28_s24): two stages ran 1.3-1.5x longer where K loops
    22-64 times.  Modelled (``Target.two_stage_k_s``), each such pair's ratio is within 15% of the
    measured one, and the tile h200 ranks first for 2048^3 and 4096^3 is the fastest one measured
    (128 x 256 x 64, three stages: 0.92x torch.matmul at 4096^3), where the model without the
    term tied it with two stages and planned the slower."""
    import json
    import re
    from dataclasses import replace
    from pathlib import Path
    from tilefuse.cost.work import kernel_seconds
    from tilefuse.families.gemm import _schedule, plain_body, ranked_tiles
    from tilefuse.families.gemm.space import GemmShape, GemmTile
    from tilefuse.ir.dtypes import DType
    folder = Path(__file__).resolve().parent.parent / "bench/results/gpu_h200_2026-11-28_s24"
    measured: dict = {}
    for name in ("gpu_kernels.json", "gpu_kernels_fixed.json"):
        for g in json.loads((folder / name).read_text())["gemms"]:
            for r in [g["gemm"], *g.get("gemm_alternatives", []), *g.get("gemm_fixed", [])]:
                measured.setdefault((tuple(g["shape"]), r["tile"]), []).append(r["measured_us"])

    def tile(text: str) -> GemmTile:
        bm, bn, bk, warps, stages = map(int, re.match(r"BM=(\d+) BN=(\d+) BK=(\d+) warps=(\d+) stages=(\d+)", text).groups())
        group = re.search(r"group-M (\d+)", text)
        split = re.search(r"split-K (\d+)", text)
        return GemmTile(bm, bn, bk, warps, stages, int(group.group(1)) if group else 1,
                        split=int(split.group(1)) if split else 1, tma="TMA" in text, in_launch="one launch" in text)

    def modelled(shape, t: GemmTile, target) -> float:
        s = GemmShape(1, *shape, DType.float16)
        sched = _schedule(plain_body(s), t, target)
        return sum(kernel_seconds(w, target) for w in (sched.work, *sched.then)) * 1e6

    pairs = 0
    for (shape, text), us in measured.items():
        t = tile(text)
        three = next((v for (sh, x), v in measured.items() if sh == shape and x == text.replace("stages=2", "stages=3")), None)
        if t.stages != 2 or three is None or -(-shape[2] // (t.bk * t.split)) < 16:
            continue
        ratio = modelled(shape, t, H200) / modelled(shape, replace(t, stages=3), H200)
        assert ratio == pytest.approx(min(us) / min(three), rel=0.15), (shape, text)
        pairs += 1
    assert pairs == 4
    for shape in ((2048, 2048, 2048), (4096, 4096, 4096)):
        best = ranked_tiles(GemmShape(1, *shape, DType.float16), H200)[0]
        times = {x: min(v) for (sh, x), v in measured.items() if sh == shape}
        assert str(best) == min(times, key=times.get), (shape, str(best))
        assert modelled(shape, best, H200) == pytest.approx(times[str(best)], rel=0.15)
        flat = replace(H200, two_stage_k_s=0.0)
        two = ranked_tiles(GemmShape(1, *shape, DType.float16), flat)[0]
        assert two.stages == 2 and modelled(shape, two, flat) == pytest.approx(modelled(shape, best, flat), rel=1e-6)


def test_a_chains_key_loop_at_two_stages_costs_what_the_h200_measured():
    """The same attention chain (16 x 4096 x 4096, d 128; 128 x 128 tiles at 8 warps, through
    descriptors) measured 339.0 us at two stages and 287.0 at three on the H200, 128 x 64 tiles
    314.1 and 316.6 at three and four (bench/results/gpu_h200_2026-11-28_s24/run3_chain_tiles_4096.json).
    Modelled, two stages take the longer by a ratio within 10% of the measured one
    (``CHAIN_TWO_STAGE_SHARE``), and each tile's time is within 10% of its measurement (16-22%
    short while the model counted an exponential at 3 FMA-equivalents, not the SFU's 16);
    without the term the two tie."""
    import json
    from dataclasses import replace
    from pathlib import Path
    import torch.nn.functional as F
    import tilefuse
    from tilefuse.cost.work import kernel_seconds
    from gemm_eval import whole
    from tilefuse.families.chain import _schedule, chain_body
    from tilefuse.families.chain.space import ChainTile
    record = Path(__file__).resolve().parent.parent / "bench/results/gpu_h200_2026-11-28_s24/run3_chain_tiles_4096.json"
    rows = {r["tile"]: r["measured_us"] for r in json.loads(record.read_text())["rows"]}
    heads, m, n, d = 16, 4096, 4096, 128
    q, k, v = (torch.zeros(1, heads, s, d, dtype=torch.float16) for s in (m, n, n))
    cm = tilefuse.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, k, v), target="h200",
                          backend="reference")
    body = chain_body(whole(cm.primgraph))

    def modelled(text: str, target) -> float:
        *sizes, _ = text.split(",")
        sched = _schedule(body, ChainTile(*map(int, sizes), tma=True), target)
        return sum(kernel_seconds(w, target) for w in (sched.work, *sched.then)) * 1e6

    two, three = "128,128,128,128,8,2,tma", "128,128,128,128,8,3,tma"
    assert modelled(two, H200) / modelled(three, H200) == pytest.approx(rows[two] / rows[three], rel=0.1)
    for text, us in rows.items():
        assert modelled(text, H200) == pytest.approx(us, rel=0.1), text
    flat = replace(H200, two_stage_k_s=0.0)
    assert modelled(two, flat) == pytest.approx(modelled(three, flat), rel=1e-6)
