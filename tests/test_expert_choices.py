"""The planner's choices for h100 are the ones a Triton expert would make (issue #8, item 4).

Every shape is planned with the whole pipeline's orchestrator (fission, candidates, families,
cost model, BLP); nothing here runs a kernel.  Times are modelled.
"""
import pytest

from planning import chosen, meta, plan_op

from tilefuse.ir.dtypes import DType


def _only_fused(op, inputs, shape, attrs=None, **kw):
    plan, coster = plan_op(op, inputs, shape, attrs, **kw)
    got = chosen(plan, coster, "fused")
    assert len(plan.kernels) == 1 and len(got) == 1, [k.candidate for k in plan.kernels]
    return got[0]


@pytest.mark.parametrize("shape", [(4096, 4096), (64, 1024, 1024), (16384, 3072)])
def test_large_pointwise_gets_wide_programs_and_4_to_8_warps(shape):
    cost, s = _only_fused("Add", [meta(*shape), meta(*shape)], shape)
    assert s.xblock * s.rblock >= 1024
    assert 4 <= s.num_warps <= 8
    assert s.rblock == 1 and len(s.body.instances) == 0          # no reduction loop at all


@pytest.mark.parametrize("op", ["Softmax", "LayerNormalization", "RMSNormalization"])
def test_rows_up_to_8192_one_row_per_program_in_one_pass(op):
    warps = []
    for n in (1024, 2048, 4096, 8192):
        inputs = [meta(4096, n)] + ([meta(n), meta(n)] if op == "LayerNormalization" else
                                    [meta(n)] if op == "RMSNormalization" else [])
        attrs = {"axis": -1} if op == "Softmax" else {"axis": -1, "epsilon": 1e-5}
        cost, s = _only_fused(op, inputs, (4096, n), attrs)
        assert s.xblock == 1, (n, s.xblock)       # (768-wide rows of 4096: see test_bert_rows_one_pass)
        assert s.one_pass, n
        assert s.rblock >= n
        warps.append(s.num_warps)
    assert warps == sorted(warps) and warps[-1] > warps[0]      # warps grow with the row


def test_bert_rows_one_pass():
    # BERT-base: LayerNorm over 768 and softmax over 128 keys of 12 heads.  (With 4096 rows of
    # 768 the model puts two rows in a program: they share the loads of the weight vectors and
    # the last wave fills better; it counts that as more than its 5% resolution.)
    cost, s = _only_fused("LayerNormalization", [meta(128, 768), meta(768), meta(768)], (128, 768),
                          {"axis": -1, "epsilon": 1e-12})
    assert s.one_pass and s.xblock == 1
    cost, s = _only_fused("Softmax", [meta(12, 128, 128)], (12, 128, 128), {"axis": -1})
    assert s.one_pass


@pytest.mark.parametrize("n", [65536, 131072])
def test_very_long_rows_loop_in_chunks(n):
    cost, s = _only_fused("Softmax", [meta(8, n)], (8, n), {"axis": -1})
    assert not s.one_pass and s.rblock < n


def test_llm_logits_softmax_is_not_64_single_warp_programs():
    cost, s = _only_fused("Softmax", [meta(64, 32000)], (64, 32000), {"axis": -1})
    assert s.blocks > 64 or s.num_warps >= 8
    assert s.rblock >= 4096              # wide chunks: enough bytes in flight for 64 SMs


@pytest.mark.parametrize("m,n,k", [(128, 768, 768), (128, 3072, 768), (128, 768, 3072), (128, 2304, 768)])
def test_bert_base_fp16_gemms_use_tensor_cores(m, n, k):
    plan, coster = plan_op("MatMul", [meta(m, k), meta(k, n)], (m, n))
    ((cost, s),) = [coster.best(kn.candidate) for kn in plan.kernels]
    assert s.family in ("library", "gemm") and _tensor_cores(s)
    # and the model ranks them faster than the same GEMM on CUDA cores
    fp32_plan, fp32_coster = plan_op("MatMul", [meta(m, k, dtype=__import__("torch").float32),
                                                meta(k, n, dtype=__import__("torch").float32)], (m, n),
                                     dtype=DType.float32)
    ((cost32, s32),) = [fp32_coster.best(kn.candidate) for kn in fp32_plan.kernels]
    assert not _tensor_cores(s32) and cost.seconds < cost32.seconds


def _tensor_cores(s) -> bool:
    """Whether a library or gemm schedule runs on tensor cores (h100)."""
    if s.family == "library":
        return s.tensor_cores
    from tilefuse.cost.dot import tensor_cores
    from tilefuse.cost.target import Target
    return s.tile.dot and tensor_cores(s.body.in_dtype, Target.get("h100"))


def test_tiles_off_wgmma_rank_with_a_longer_body_on_hopper():
    """On h100 a tensor-core tile that misses warpgroup MMA (BM 16) ranks as if its body were
    ``LEGACY_MMA_MARGIN`` longer (the launch unchanged), a wgmma tile (BM 64) as modelled; on a100
    (no wgmma) and for fp32 (no tensor cores) nothing changes."""
    from tilefuse.cost.dot import LEGACY_MMA_MARGIN, ranking_seconds
    from tilefuse.cost.target import Target
    h100, a100 = Target.get("h100"), Target.get("a100")
    launch = h100.launch(False)
    sec = launch + 2e-6
    assert ranking_seconds(sec, 16, 4, DType.float16, h100) == pytest.approx(launch + 2e-6 * (1 + LEGACY_MMA_MARGIN))
    assert ranking_seconds(2 * sec, 16, 4, DType.float16, h100, launches=2) == \
        pytest.approx(2 * launch + 4e-6 * (1 + LEGACY_MMA_MARGIN))
    assert ranking_seconds(sec, 64, 4, DType.float16, h100) == sec
    assert ranking_seconds(sec, 16, 4, DType.float16, a100) == sec
    assert ranking_seconds(sec, 16, 4, DType.float32, h100) == sec
