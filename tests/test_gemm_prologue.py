"""Row reductions in the gemm family's prologue: an RMSNorm or LayerNorm before a projection is one
kernel, whose programs reduce their rows of A before the K loop reads them normalized.  Every
form of the template (the dot path, the small-M path of a decode step's GEMV, split-K in one or
two launches, a two-phase epilogue) runs under the interpreter against eager torch and the
reference executor."""
import pytest
import torch

from tilefuse.families.gemm import GemmTile, gemm_body
from tilefuse.orchestrate.segment import SHORT, _best_cut, _Readers

from gemm_eval import HALF_TOL, _cache, _seed, check_planned, compile_h100, forced, whole  # noqa: F401


class _RMSNormLinear(torch.nn.Module):
    """transformers' LlamaRMSNorm (fp32 statistics, the normalized rows cast back, then the
    weight) before a projection."""

    def __init__(self, d=64, n=48):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(d) + 0.5)
        self.proj = torch.nn.Linear(d, n, bias=False)

    def forward(self, x):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.proj(self.weight * h.to(x.dtype))


def _layernorm_linear(d=64, n=48, softmax=False):
    ln, proj = torch.nn.LayerNorm(d), torch.nn.Linear(d, n)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)

    def fn(x):
        y = proj(ln(x))
        return torch.softmax(y, -1) if softmax else y
    return fn


@pytest.mark.parametrize("rows", [1, 24], ids=["decode-gemv", "prefill"])
def test_rmsnorm_before_a_projection_is_one_kernel(rows):
    model = _RMSNormLinear().eval().half()
    x = torch.randn(1, rows, 64).half() * 3
    cm = check_planned(model, x, kernels=1, tol=HALF_TOL[torch.float16])
    (k,) = cm.kernels
    assert "PBLOCK" in k.source and "reducemean" in k.name
    # the normalized rows are never written: the kernel reads the input and the two weights only
    assert len(k.inputs) == 3 and len(k.outputs) == 1


_FORMS = {
    "dot": GemmTile(16, 16, 16, 4, 2),
    "small-m": GemmTile(1, 16, 32, 4, 1, dot=False),
    "split-k": GemmTile(16, 16, 16, 4, 2, 1, True, 2),
    "split-k-in-launch": GemmTile(16, 16, 16, 4, 2, 1, True, 2, in_launch=True),
}


@pytest.mark.parametrize("form", sorted(_FORMS))
def test_layernorm_prologue_in_every_form(form):
    """A LayerNorm's three row reductions (sum, shifted sum, shifted squares), each over the
    program's rows before the K loop; with split-K every split reduces whole rows."""
    rows = 1 if form == "small-m" else 20
    built, body = forced(_layernorm_linear(), _FORMS[form], torch.randn(rows, 64) * 2 + 1)
    assert len(body.prologue) == 3 and all(i.rext == (64,) for i in body.prologue)
    assert built.source.count("PBLOCK") >= 3


@pytest.mark.parametrize("stages", [1, 3])
@pytest.mark.parametrize("fn", [
    lambda x, w: torch.softmax(x, -1) @ w,                       # a max and a sum over the row
    lambda x, w: (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)) @ w,
], ids=["softmax", "rmsnorm"])
def test_a_gemv_prologue_reduces_its_row_as_a_1d_tile(fn, stages):
    """On CUDA cores (no ``tl.dot``) a prologue row that varies along its reduced axis alone is
    reduced through a 1-D reshape (``emit._Printer._reduction``: in place, the sm_90 binary of a
    decode GEMV spilled); the max through the NaN-propagating helper as well as the sums, whole
    (K 128: one PBLOCK) and in chunks (K 6000: two of 4096, the last masked), right against eager."""
    for k in (128, 6000):
        x, w = torch.randn(1, k) * 3, torch.randn(k, 48) / k ** 0.5
        built, body = forced(fn, GemmTile(1, 16, 512, 4, stages, dot=False), x, w)
        assert body.prologue and built.source.count("tl.reshape(") == 2 * len(body.prologue), built.source
        assert ("for p0_start" in built.source) == (k > 4096)


def test_layernorm_prologue_with_a_two_phase_epilogue():
    """Row reductions on both sides: the LayerNorm's over K before the loop, a softmax's over N
    (wider than the tile) after it, in two phases."""
    built, body = forced(_layernorm_linear(softmax=True), GemmTile(16, 16, 16, 4, 2, fixup=4),
                         torch.randn(20, 64), tol=dict(rtol=1e-4, atol=1e-5))
    assert body.prologue and body.instances and "tl.atomic_add(" in built.source


@pytest.mark.parametrize("fn", [
    lambda x, w: torch.softmax(x, 0) @ w,                        # over M: varies along K
    lambda x, w: x @ (w / w.abs().sum()),                        # a normalized weight: B reads it
], ids=["softmax-over-rows", "normalized-weight"])
def test_a_reduction_that_is_not_per_row_of_a_stays_out(fn):
    cm = compile_h100(fn, torch.randn(12, 32), torch.randn(32, 16))
    assert gemm_body(whole(cm.primgraph)) is None


def test_segments_keep_a_pre_norm_with_its_projection():
    """The cuts between an RMSNorm's reduction and the projection reading only what it
    normalized are avoided among equally live cuts; a post-norm value a residual also reads
    sets no such span."""
    pre = compile_h100(_RMSNormLinear().eval(), torch.randn(1, 4, 64)).primgraph
    readers = _Readers(pre)
    red = next(k for k, p in enumerate(pre.prims) if p.reduce is not None)
    mm = len(pre.prims) - 1
    assert all(readers.inside_normalized(k) for k in range(red + 1, mm + 1))
    assert not readers.inside_normalized(red)
    ln = torch.nn.LayerNorm(64)
    proj = torch.nn.Linear(64, 64)

    def post_norm(x):
        h = ln(x)
        return h + proj(h)
    post = compile_h100(post_norm, torch.randn(4, 64)).primgraph
    assert not _Readers(post).normalized


class _FlatReaders:
    def inside_attention(self, k):
        return False

    def inside_normalized(self, k):
        return False

    def fed(self, lo, k, hi):
        return True


def test_a_cut_leaves_no_short_segment_where_the_window_allows():
    count = [0, 1, 3, 3, 3, 3, 2, 3, 3, 3, 3]          # fewest live tensors right after the first prim
    nbytes = [0] * len(count)
    assert _best_cut(0, 10, count, nbytes, _FlatReaders()) == 6
    assert _best_cut(0, SHORT, count, nbytes, _FlatReaders()) == 1     # a window no longer than SHORT


@pytest.mark.parametrize("rows", [1, 128], ids=["gemv", "tiles"])
def test_a_norm_prologue_compiles_for_sm90_without_spills(rows):
    """FROM THE BINARY (sm_90, compiled here): the reduction loop before the K loop costs no
    spills, and a 128-row problem keeps its projection on wgmma, pipelined."""
    model = _RMSNormLinear(256, 512).eval().half()
    cm = compile_h100(model, torch.randn(1, rows, 256).half())
    (k,) = cm.kernels
    assert "PBLOCK" in k.source
    (row,) = (r.as_dict() for r in cm.native())
    assert row["spill_bytes"] == 0 and row["registers"] < 255, row
    if rows > 1:
        assert row["mma"] == "wgmma" and row["pipelined"], row


def test_the_stencil_path_refuses_a_prologue_reduction_by_name():
    from tilefuse.families.gemm.template import gemm_kernels
    cm = compile_h100(_layernorm_linear(), torch.randn(4, 64))
    body = gemm_body(whole(cm.primgraph))
    with pytest.raises(ValueError, match="gemm_x: the stencil path has no prologue reductions"):
        gemm_kernels(body, GemmTile(16, 1, 1, 4, 1, 1, dot=False, bb=16), "gemm_x")
