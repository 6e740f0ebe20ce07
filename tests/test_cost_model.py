"""Unit tests of the cost model (cost/model.py, cost/tiles.py): every term can be seen to act."""
import pytest
import torch

from planning import meta, plan_op

from tilefuse.cost.model import INFEASIBLE, Resources, Work, estimate, occupancy
from tilefuse.cost.target import Target
from tilefuse.families.fused import _ranked
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.cost.tiles import split_l2

H100 = Target.get("h100")


def _work(programs, nbytes=64e6, flops=0.0, warps=4, inflight=8192, **res):
    return Work(programs, nbytes, nbytes, flops, 67e12, inflight, Resources(warps, **res))


def test_small_grids_pay_through_idle_sms_not_a_factor():
    # the same bytes moved by 8 programs or by 8192: few programs cannot keep DRAM busy
    few, many = estimate(_work(8), H100), estimate(_work(8192), H100)
    assert few.seconds > 5 * many.seconds
    assert few.waves == 1 and many.bound == "dram"


def test_huge_grids_of_tiny_programs_pay_per_program():
    coarse = estimate(_work(16_384), H100)
    fine = estimate(_work(1 << 22, inflight=256), H100)
    assert fine.seconds > coarse.seconds
    assert fine.seconds - coarse.seconds >= ((1 << 22) - 16_384) / 132 * H100.program_cycles / H100.clock_hz * 0.9


def test_occupancy_limits():
    assert occupancy(Resources(4, 32), H100) == 16                  # threads: 2048 / 128
    assert occupancy(Resources(1, 32), H100) == 32                  # blocks per SM
    assert occupancy(Resources(8, 128), H100) == 2                  # registers: 65536 / (128 * 256)
    assert occupancy(Resources(4, 32, 100 * 1024), H100) == 2       # shared memory: 228 KB / 100 KB
    assert occupancy(Resources(4, 256), H100) == 0                  # more than 255 registers: spills
    assert estimate(_work(10, warps=4, regs_per_thread=300), H100) is INFEASIBLE


def test_compute_bound_kernels_quantize_into_waves():
    w = lambda p: Work(p, 1e3, 1e3, 1e12 * p / 132, 989e12, 1e5, Resources(8, 200, 150 * 1024))
    one = estimate(w(132), H100)                                     # occupancy 1: one full wave
    tail = estimate(w(133), H100)                                    # one program more: a second wave
    assert one.occupancy == 1 and one.waves == 1 and tail.waves == 2 and one.bound == "compute"
    assert tail.compute_s == pytest.approx(2 * one.compute_s, rel=0.02)


def test_launch_follows_the_plan_mode():
    w = _work(1, nbytes=1e3)
    eager, graph = estimate(w, H100), estimate(w, H100, cuda_graph=True)
    assert eager.launch == H100.launch_s and graph.launch == H100.launch_graph_s
    assert eager.seconds - graph.seconds == pytest.approx(H100.launch_s - H100.launch_graph_s)


def test_a_kernel_reading_nothing_from_dram_waits_one_l2_round_trip_not_a_dram_one():
    """What a kernel writes lands in L2 (written back later): a kernel whose only DRAM bytes are its
    stores (a persistent kernel's phase reading what an earlier phase wrote) fills from L2."""
    from dataclasses import replace
    loads = Work(1, 1024, 2048, 0.0, 67e12, 1024, Resources(4))        # 1 KB read from DRAM, 1 KB written
    stores_only = replace(loads, dram_stored=1024.0)                  # the same bytes: only the store in DRAM
    gap = estimate(loads, H100).seconds - estimate(stores_only, H100).seconds
    assert gap == pytest.approx(H100.dram_latency_s - H100.l2_latency_s)
    plan, _ = plan_op("Relu", [meta(64, 64, dtype=torch.float16)], (64, 64))
    assert plan.kernels[0].schedule.work.dram_stored == 64 * 64 * 2   # the printed kernel's store


def test_rereads_are_charged_at_l2_not_free():
    t = TensorType((4096, 4096), DType.float16)                     # 32 MiB: fits in half of L2
    dram, l2 = split_l2([4096 * 2 * 3], 4096, 512, [t], H100)       # three passes over each row
    assert dram == t.nbytes and l2 == 3 * t.nbytes
    big = TensorType((32768, 8192), DType.float16)                  # 512 MiB: re-read rows stay
    dram, l2 = split_l2([8192 * 2 * 3], 32768, 512, [big], H100)    # resident only per program
    assert dram == big.nbytes and l2 == 3 * big.nbytes
    dram, _ = split_l2([8192 * 2 * 3], 32768, 40_000, [big], H100)  # too many rows in flight
    assert dram == 3 * big.nbytes


def test_one_pass_loads_each_element_once_looped_three_times():
    plan, coster = plan_op("Softmax", [meta(1024, 2048, dtype=torch.float32)], (1024, 2048), {"axis": -1},
                           dtype=DType.float32)
    (k,) = plan.kernels
    body = coster.best(k.candidate)[1].body
    scheds = _ranked(body, H100)
    one = next(s for s in scheds if s.one_pass and s.xblock == 1)
    looped = next(s for s in scheds if not s.one_pass and s.xblock == 1)
    row = 1024 * 2048 * 4
    assert one.work.l2_bytes == 2 * row                              # x read once, y written once
    assert looped.work.l2_bytes == 4 * row                           # max, sum, output loops read x
    assert one.work.dram_bytes == looped.work.dram_bytes == 2 * row  # the re-reads hit L2
    assert estimate(one.work, H100).seconds <= estimate(looped.work, H100).seconds
    assert scheds[0].one_pass


def test_report_kernels_say_grid_warps_waves_occupancy_and_bound():
    import tilefuse
    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)).half()
    r = tilefuse.compile(m, (torch.randn(128, 64).half(),), target="h100", backend="reference").report
    for k in r.kernels:
        assert k.grid >= 1 and k.warps >= 1 and k.waves >= 1 and k.occupancy >= 1
        assert k.bound in ("dram", "l2", "compute", "launch") and k.schedule
    assert r.launch == "per_launch" and r.roofline_us > 0
    assert r.est_total_us > r.roofline_us                          # no plan beats the roofline
    assert r.traffic_bytes >= r.compulsory_bytes > 0
    assert set(r.strategies["optimal"]) >= {"num_kernels", "est_total_us", "traffic_bytes"}
    graph = tilefuse.compile(m, (torch.randn(128, 64).half(),), target="h100", cuda_graph=True).report
    assert graph.launch == "cuda_graph" and graph.est_total_us < r.est_total_us


def test_opaque_kernels_cost_a_few_passes_over_their_bytes():
    plan, coster = plan_op("TopK", [meta(64, 4096), None], (64, 8), {"axis": -1, "largest": 1, "k": 8},
                           dtype=DType.float16, n_out=1)
    costs = [coster.best(k.candidate) for k in plan.kernels]
    opaque = [(c, s) for c, s in costs if s.family == "opaque"]
    assert opaque
    c, s = opaque[0]
    nbytes = sum(s.group.types[t].nbytes for t in dict.fromkeys(s.group.prims[0].inputs)) + s.group.prims[0].out.nbytes
    assert c.bytes == 3 * nbytes and c.seconds > H100.launch_s
