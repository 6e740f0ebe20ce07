"""Two-phase row reductions in the gemm family: an epilogue that reduces rows wider than BLOCK_N
(LayerNorm over 768, softmax over a long row) stays in the GEMM's kernel.  Every tile stores its
pre-reduction values; the last tile of a row block to finish re-reads the block's rows, reduces
them and stores the results.  Run under the interpreter against eager torch and the reference.
"""
import pytest
import torch

from tilefuse.ir.samples import allocate

from tilefuse.families.gemm.template import gemm_kernels
from tilefuse.codegen.triton.emit import triton_source
from tilefuse.families.gemm import GemmFamily, _schedule, gemm_body
from tilefuse.ir.dtypes import DType
from tilefuse.families.gemm import GemmShape, GemmTile, ranked_tiles
from tilefuse.families.gemm.space import FIXUP_ELEMS_PER_THREAD, fixup_rows, tile_space

from gemm_eval import _cache, _seed, H100, HALF_TOL, compile_h100, eager, feeds_of, forced, run_cpu, whole  # noqa: F401

TOL = dict(rtol=1e-5, atol=1e-5)



def two_phase(bm=16, bn=16, bk=16, fixup=4, warps=4):
    return GemmTile(bm, bn, bk, warps, 2, 1, fixup=fixup)


def layernorm_model(n, k=24, dtype=torch.float32):
    ln = torch.nn.LayerNorm(n).eval()
    lin = torch.nn.Linear(k, n).eval()
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    ln, lin = ln.to(dtype), lin.to(dtype)
    return lambda x, res: ln(lin(x) + res)  # noqa: E731


@pytest.mark.parametrize("m,n,t", [
    (20, 40, two_phase(16, 16, 16, 4)),     # 2 row blocks (the second ragged), 3 column tiles (ragged)
    (20, 40, two_phase(16, 16, 16, 16)),    # the whole row block in one step
    (33, 100, two_phase(32, 32, 16, 1)),    # one row a step, rows padded 100 -> 128
    (5, 64, two_phase(16, 32, 16, 8)),      # fewer rows than the block
], ids=["ragged", "one-step", "row-a-step", "short"])
def test_layernorm_after_matmul_bias_residual_in_two_phases(m, n, t):
    fn = layernorm_model(n)
    built, body = forced(fn, t, torch.randn(m, 24), torch.randn(m, n), tol=TOL)
    ph = body.phases
    # the row sum, then the deviations' sum and sum of squares (fission/norm.py: corrected two-pass)
    assert ph is not None and len(body.instances) == 3 and ph.late == (0,) and ph.source == -1
    # the stored value is the LayerNorm's input (acc + bias + residual), not the bare accumulator
    assert sum(1 for _ in ph.pre.children()) == 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_layernorm_two_phases_in_half_precision(dtype):
    fn = layernorm_model(48, dtype=dtype)
    forced(fn, two_phase(16, 16, 16, 4), torch.randn(24, 24).to(dtype), torch.randn(24, 48).to(dtype),
           tol=HALF_TOL[dtype])


def test_softmax_over_a_row_wider_than_the_tile():
    """softmax(x @ w * s) over 100 columns in tiles of 32: max and sum of exponentials per row in
    the fixup (padding enters neither)."""
    fn = lambda x, w: torch.softmax(x @ w * 0.5, -1)  # noqa: E731
    built, body = forced(fn, two_phase(16, 32, 16, 2), torch.randn(20, 40), torch.randn(40, 100) * 3, tol=TOL)
    assert len(body.instances) == 2


def test_log_softmax_and_rmsnorm_rows():
    fn = lambda x, w: torch.log_softmax(x @ w, -1)  # noqa: E731
    forced(fn, two_phase(16, 16, 16, 4), torch.randn(18, 40), torch.randn(40, 70), tol=TOL)
    rms = torch.nn.RMSNorm(70, eps=1e-6).eval()
    with torch.no_grad():
        rms.weight.uniform_(0.5, 1.5)
    fn2 = lambda x, w: rms(x @ w)  # noqa: E731
    forced(fn2, two_phase(16, 16, 16, 4), torch.randn(18, 40), torch.randn(40, 70), tol=TOL)


def test_batched_rows_count_per_batch_and_row_block():
    """Attention-like scores: softmax over keys of each head's rows; the counters are per (head,
    row block), so heads never finish each other's rows."""
    fn = lambda q, k: torch.softmax(q @ k.transpose(-1, -2) * 0.25, -1)  # noqa: E731
    built, body = forced(fn, two_phase(16, 16, 16, 8), torch.randn(3, 20, 16), torch.randn(3, 48, 16), tol=TOL)
    assert body.shape.batch == 3


def test_early_store_and_output_reread():
    """Pre-LN residual stream: the kernel writes h = x @ W + res (an early store, every tile) and
    LayerNorm(h) (late); the fixup re-reads h from its own output, no workspace."""
    ln = torch.nn.LayerNorm(40).eval()
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)

    def fn(x, w, res):
        h = x @ w + res
        return h, ln(h)

    built, body = forced(fn, two_phase(16, 16, 16, 4), torch.randn(20, 24), torch.randn(24, 40),
                         torch.randn(20, 40), tol=TOL)
    ph = body.phases
    assert ph.early and ph.late and ph.source in ph.early
    kernel, = gemm_kernels(body, two_phase(16, 16, 16, 4), "k")
    assert len(kernel.outputs) == len(body.stores) + 1          # the stores and the counters: no workspace


def test_relaunching_finds_the_counters_at_zero():
    """The last program of a row block resets its counter: a second launch (a CUDA graph replay)
    computes the same result on new inputs."""
    fn = layernorm_model(40)
    cm = compile_h100(fn, torch.randn(20, 24), torch.randn(20, 40))
    pg = cm.primgraph
    body = gemm_body(whole(pg))
    built = GemmFamily().build(_schedule(body, two_phase(), H100), "gemm_relaunch")
    env = {c.name: c.data for c in pg.constants}
    assert [s.zeroed for s in built.scratch] == [False, True]     # the rows' workspace, the counters
    scratch = allocate(built.scratch, torch.device("cpu"))
    for _ in range(2):
        args = torch.randn(20, 24), torch.randn(20, 40)
        env |= feeds_of(cm, args)
        out = torch.full((20, 40), float("nan"))
        built.run([env[n] for n in built.inputs], [out] + scratch)
        torch.testing.assert_close(out, fn(*args), **TOL)
        assert int(scratch[-1].abs().sum()) == 0


def test_two_phase_kernel_source():
    """The kernel counts arrivals after a barrier with acquire-release semantics, resets the
    counter in the last program, and re-reads the stored rows through L2."""
    fn = layernorm_model(40)
    cm = compile_h100(fn, torch.randn(20, 24), torch.randn(20, 40))
    body = gemm_body(whole(cm.primgraph))
    kernel, = gemm_kernels(body, two_phase(), "k")
    src = triton_source(kernel)
    lines = [ln.strip() for ln in src.splitlines()]
    barrier = lines.index("tl.debug_barrier()")
    assert lines[barrier + 1] == 'arrived = tl.atomic_add(out2 + pid_m, 1, sem="acq_rel")'
    assert lines[barrier + 2] == "if arrived == 2:" and lines[barrier + 3] == "tl.store(out2 + pid_m, 0)"
    assert 'cache_modifier=".cg"' in src and src.count("tl.atomic_add") == 1
    assert "for fm_start in range(0, 16, FIX_M):" in src
    # the LayerNorm's weight and bias are loaded once in the last program, not in every tile
    body_lines = src.splitlines()
    cond = next(i for i, ln in enumerate(body_lines) if ln.strip() == "if arrived == 2:")
    assert not any("in4" in ln for ln in body_lines[:cond] if "tl.load" in ln)


def test_planner_keeps_wide_layernorm_in_the_gemm_kernel():
    """x @ W + b + residual -> LayerNorm over 768 at 128 rows (BERT-base's shape, fp16): the h100
    plan is one gemm kernel in two phases, and it runs right under the interpreter."""
    fn = layernorm_model(768, k=768, dtype=torch.float16)
    args = torch.randn(128, 768).half(), torch.randn(128, 768).half()
    cm = compile_h100(fn, *args)
    assert [k.family for k in cm.kernels] == ["gemm"]
    sched = cm.plan.kernels[0].schedule
    assert sched.tile.fixup and sched.tile.bn < 768 and sched.work.tail is not None
    torch.testing.assert_close(run_cpu(cm, *args)[0].float(), eager(fn, *args)[0].float(), **HALF_TOL[torch.float16])


def test_tile_space_offers_whole_rows_and_two_phases():
    s = GemmShape(1, 128, 768, 768, DType.float16, True)
    tiles = tile_space(s, H100)
    assert any(t.bn >= 768 and not t.fixup for t in tiles)
    split = [t for t in tiles if t.bn < 768]
    # a tile narrower than the row: two phases, or split-K (whose reduction kernel holds rows)
    assert split and all(bool(t.fixup) != (t.split > 1) for t in split)
    assert any(t.split > 1 for t in split)
    steps = lambda t: {fixup_rows(t.bm, t.warps, 1024, H100, per) for per in FIXUP_ELEMS_PER_THREAD}  # noqa: E731
    assert all(t.fixup in steps(t) for t in split if t.fixup)
    # both step sizes where they differ: BM 64 at 8 warps fixes 4 or 16 rows a step
    assert {t.fixup for t in split if t.bm == 64 and t.warps == 8 and t.fixup} == {4, 16}
    # rows too wide for one tile (N = 4096 > MAX_ROW): only two phases
    wide = ranked_tiles(GemmShape(1, 64, 4096, 256, DType.float16, True), H100)
    assert wide and all(t.fixup for t in wide)


@pytest.mark.parametrize("bm,warps,n2,want", [(64, 4, 1024, 2), (64, 8, 1024, 4), (1, 4, 1024, 1),
                                             (64, 4, 128, 16), (64, 4, 16384, 0), (64, 8, 16384, 1)])
def test_fixup_rows(bm, warps, n2, want):
    """About 16 values a thread per step, one row at least, none when a row would need > 64;
    64 values a thread: four times the rows, within the row block."""
    assert fixup_rows(bm, warps, n2, H100) == want
    assert fixup_rows(bm, warps, n2, H100, 64) == (min(max(4 * want, 1), bm) if n2 <= 1024 else want)


def test_two_phase_tail_is_charged():
    """The fixup runs after the tiles: a two-phase schedule costs its tail on top of its tiles,
    and the tail's traffic (the re-read rows, the results) is in its bytes."""
    fn = layernorm_model(768, k=64, dtype=torch.float16)
    cm = compile_h100(fn, torch.randn(128, 64).half(), torch.randn(128, 768).half())
    body = gemm_body(whole(cm.primgraph))
    fam = GemmFamily()
    s = _schedule(body, two_phase(32, 64, 64, 2), H100)
    whole_cost = fam.cost(s, H100)
    from tilefuse.cost.model import estimate
    tiles_only = estimate(s.work, H100)
    tail = s.work.tail
    assert whole_cost.seconds > tiles_only.seconds
    assert tail.programs == 4 and tail.l2_bytes >= 2 * 128 * 768 * 2
    assert s.requested_bytes() == s.work.requested_bytes + tail.requested_bytes


@pytest.mark.parametrize("m,n,k,t", [(128, 768, 128, two_phase(32, 64, 64, 2)),
                                     (100, 200, 64, two_phase(32, 32, 32, 4))], ids=["bert-rows", "ragged"])
def test_two_phase_traffic_matches_the_model(m, n, k, t):
    """The sectors the two-phase kernel's loads and stores move under the interpreter (tiles,
    stored rows, the fixup's re-reads and results) are within 10% of what its schedule charges;
    the stored rows are 16-bit (the LayerNorm's fp32 widening is redone on the re-read)."""
    from tilefuse.cost.traffic_counter import count_traffic
    fn = layernorm_model(n, k=k, dtype=torch.float16)
    args = torch.randn(m, k).half(), torch.randn(m, n).half()
    cm = compile_h100(fn, *args)
    pg = cm.primgraph
    body = gemm_body(whole(pg))
    assert body.phases.pre.dtype is DType.float16
    s = _schedule(body, t, H100)
    built = GemmFamily().build(s, "g")
    env = {c.name: c.data for c in pg.constants} | feeds_of(cm, args)
    out = torch.empty(m, n, dtype=torch.float16)
    with count_traffic() as counted:
        built.run([env[x] for x in built.inputs], [out] + allocate(built.scratch, torch.device("cpu")))
    assert counted.sector_bytes == pytest.approx(s.requested_bytes(), rel=0.1)
    torch.testing.assert_close(out.float(), fn(*args).float(), **HALF_TOL[torch.float16])
