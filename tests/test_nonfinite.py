"""NaN and +-Inf through the generated Triton kernels (the interpreter on a CPU machine).

Every case compiles a tiny module (generated kernels; at least one of the "fused" family must run)
and runs its plan twice -- the kernels, and the reference executor kernel by kernel (what backend
"reference" runs) -- and compares both with eager PyTorch,
NaN positions included (``equal_nan=True``; integer and bool outputs exactly).  A failure names
which of the two is wrong, so a bug in the emitter is told apart from one in the reference.

Inputs are small and deterministic: seeded normal values with NaN, +inf and -inf written at fixed
positions of each reduced "row" (see ``ROW_SPECIALS``), so every reduction sees a NaN beside +inf,
a NaN beside -inf, two NaNs, +inf beside -inf, a row of all -inf and clean rows.
"""
from __future__ import annotations

import math

import pytest
import torch

import tilefuse

NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module", autouse=True)
def _kernel_cache(tmp_path_factory):
    # generated kernels land in a private directory; shared by the module's tests (identical
    # kernels are reused, as in one process)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TILEFUSE_CACHE_DIR", str(tmp_path_factory.mktemp("nonfinite_cache")))
        yield


# ----------------------------------------------------------------------------------------------
# Inputs.

# row -> [(position along the reduced dim, value)]; rows from 7 on are clean.
ROW_SPECIALS = {
    0: [(1, NAN), (3, INF)],          # NaN beside +inf: max/min/argmax/argmin pick the NaN
    1: [(2, INF)],
    2: [(0, -INF)],
    3: [(1, INF), (4, -INF)],         # +inf beside -inf: sum/mean NaN, prod -inf
    4: [(0, -INF), (2, NAN)],         # NaN after -inf
    5: [(2, NAN), (4, NAN)],          # two NaNs: the first one's index
    6: "all -inf",
}


def _base(shape, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype)


def _sprinkle(shape, dim=-1, seed=0, dtype=torch.float32):
    """Normal values with ROW_SPECIALS written into the rows along ``dim``."""
    x = _base(shape, seed, torch.float32)
    rows = x.movedim(dim, -1)              # a view: writes go to x
    lead_shape = rows.shape[:-1]
    assert rows.shape[-1] >= 5 and math.prod(lead_shape) >= 8
    for r, specials in ROW_SPECIALS.items():
        lead = tuple(torch.unravel_index(torch.tensor(r), lead_shape))
        lead = tuple(int(i) for i in lead)
        if specials == "all -inf":
            rows[lead] = -INF
        else:
            for c, v in specials:
                rows[lead + (c,)] = v
    return x.to(dtype)


def _scatter(shape, specials, seed=0, dtype=torch.float32, scale=1.0):
    """Normal values (times ``scale``) with {flat index: value} written in."""
    x = _base(shape, seed) * scale
    f = x.view(-1)
    for i, v in specials.items():
        f[i] = v
    return x.to(dtype)


# 4x33 elementwise operands: x and y share some specials at the same positions, differ at others
ELEM_SHAPE = (4, 33)
X_SPECIALS = {0: NAN, 5: INF, 9: -INF, 14: NAN, 20: INF, 27: -INF, 33: INF, 40: -INF, 47: NAN,
              60: 0.0, 61: -0.0, 70: INF, 90: -INF, 100: NAN, 131: INF}
Y_SPECIALS = {0: NAN, 5: INF, 9: -INF, 14: 1.0, 20: -INF, 27: INF, 33: NAN, 40: -INF, 50: INF,
              60: 0.0, 61: 0.0, 70: 0.0, 90: 0.0, 100: 0.0, 110: 0.0, 111: -0.0, 120: NAN, 131: INF}


def _x(dtype=torch.float32):
    return _scatter(ELEM_SHAPE, X_SPECIALS, seed=1, dtype=dtype)


def _y(dtype=torch.float32):
    return _scatter(ELEM_SHAPE, Y_SPECIALS, seed=2, dtype=dtype)


# ----------------------------------------------------------------------------------------------
# Running and comparing.

class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def _outputs(v):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def _mismatch(got, want, tol) -> str | None:
    """None when ``got`` matches ``want`` (NaN where NaN, exactly for ints/bools), else a line."""
    got, want = _outputs(got), _outputs(want)
    if len(got) != len(want):
        return f"{len(got)} outputs, want {len(want)}"
    for k, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {k}: {g.dtype}{tuple(g.shape)}, want {w.dtype}{tuple(w.shape)}"
        if w.is_floating_point():
            try:
                torch.testing.assert_close(g, w, equal_nan=True, **tol)
                continue
            except AssertionError:
                gf, wf = g.float(), w.float()
                bad = ~(torch.isclose(gf, wf, equal_nan=True, **tol)
                        | ((gf == wf) & torch.isinf(wf)))
        else:
            bad = g != w
            if not bad.any():
                continue
        where = bad.nonzero()
        first = [tuple(i.tolist()) for i in where[:4]]
        vals = "; ".join(f"{i}: got {g[i].item()} want {w[i].item()}" for i in first)
        return f"output {k}: {int(bad.sum())}/{w.numel()} differ ({vals})"
    return None


def check(fn, *inputs, tol=None, fused=True):
    """Compile ``fn`` for ``inputs`` with both backends; each must agree with eager."""
    tol = tol or dict(rtol=1e-5, atol=1e-5)
    module = Fn(fn).eval()
    with torch.no_grad():
        want = module(*inputs)
    problems = []
    triton = tilefuse.compile(module, inputs)
    assert triton.report.backend == "triton"
    families = [k.family for k in triton.report.kernels]
    if fused:
        assert "fused" in families, f"no generated (fused) kernel ran: {families}"
    bad = _mismatch(triton(*inputs), want, tol)
    if bad:
        problems.append(f"generated kernel ({', '.join(families)}): {bad}")
    bad = _mismatch(_reference(triton, inputs), want, tol)
    if bad:
        problems.append(f"reference executor: {bad}")
    assert not problems, "\n".join(problems)


def _reference(cm, inputs):
    """The outputs of ``cm``'s plan run kernel by kernel by the reference executor (what
    ``backend="reference"`` runs, without tracing the module a second time)."""
    from tilefuse.orchestrate.plan import execute_reference
    feeds = dict(zip(cm.input_names, cm.imported.flatten_inputs(inputs, {})))
    return cm.imported.unflatten_outputs([o.clone() for o in execute_reference(cm.plan, cm.primgraph, feeds)])


HALF = dict(rtol=1e-3, atol=1e-3)

# ----------------------------------------------------------------------------------------------
# Reductions: over the last dim of (8, 33) and over the middle dim of (3, 9, 5).

LAYOUTS = {"last": ((8, 33), -1), "mid": ((3, 9, 5), 1)}

REDUCTIONS = {
    "sum": lambda x, d: x.sum(d),
    "mean": lambda x, d: x.mean(d),
    "amax": lambda x, d: x.amax(d),
    "amin": lambda x, d: x.amin(d),
    "max_values": lambda x, d: x.max(d).values,
    "max_indices": lambda x, d: x.max(d).indices,
    "max_both": lambda x, d: tuple(x.max(d)),
    "min_values": lambda x, d: x.min(d).values,
    "min_indices": lambda x, d: x.min(d).indices,
    "argmax": lambda x, d: x.argmax(d),
    "argmin": lambda x, d: x.argmin(d),
    "prod": lambda x, d: x.prod(d),
    "amax_keepdim": lambda x, d: x.amax(d, keepdim=True),
    "any_isnan": lambda x, d: torch.isnan(x).any(d),
    "all_isinf": lambda x, d: torch.isinf(x).all(d),
    "any_gt": lambda x, d: (x > 1.0).any(d),
    "all_le": lambda x, d: (x <= 1.0).all(d),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kind", list(REDUCTIONS))
def test_reduction(kind, layout):
    shape, dim = LAYOUTS[layout]
    x = _sprinkle(shape, dim)
    fn = REDUCTIONS[kind]
    check(lambda t: fn(t, dim), x)


@pytest.mark.parametrize("kind", ["sum", "amax", "amin", "argmax"])
def test_reduction_over_everything(kind):
    x = _sprinkle((8, 33))
    fn = {"sum": torch.sum, "amax": torch.amax, "amin": torch.amin, "argmax": torch.argmax}[kind]
    check(lambda t: fn(t), x)


def test_amax_of_a_single_nan_in_a_clean_tensor():
    x = _scatter((6, 33), {100: NAN})
    check(lambda t: t.amax(-1) + t.amin(0).sum(), x)


# ----------------------------------------------------------------------------------------------
# Pooling on (2, 3, 8, 8): NaN inside windows, infs, a window of all -inf.

POOL_SPECIALS = {
    0: NAN,                 # corner: first element of a window
    9: NAN,                 # inside the same 2x2 window as 0
    19: INF, 27: -INF,      # +inf and -inf in one window
    36: -INF, 37: -INF, 44: -INF, 45: -INF,   # a 2x2 window of all -inf
    64 + 10: NAN,           # channel 1: NaN and +inf in one window
    64 + 11: INF,
    128 + 63: NAN,          # last element of channel 2
    192 + 7: -INF, 192 + 30: INF,
    320 + 33: NAN,
}

POOLS = {
    "max2": torch.nn.MaxPool2d(2),
    "max3s2p1": torch.nn.MaxPool2d(3, stride=2, padding=1),
    "max3s1": torch.nn.MaxPool2d(3, stride=1),
    "avg2": torch.nn.AvgPool2d(2),
    "avg3s1p1": torch.nn.AvgPool2d(3, stride=1, padding=1),
    "avg3s1p1_nopad": torch.nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False),
    "adaptive_avg": torch.nn.AdaptiveAvgPool2d(1),
    # AdaptiveMaxPool2d: unsupported (no converter for aten.adaptive_max_pool2d)
}


@pytest.mark.parametrize("pool", list(POOLS))
def test_pool(pool):
    x = _scatter((2, 3, 8, 8), POOL_SPECIALS, seed=3)
    check(POOLS[pool], x)


# ----------------------------------------------------------------------------------------------
# Softmax, log-softmax, LayerNorm on rows with NaN / +inf / -inf / all -inf.

def _rows(dtype=torch.float32):
    return _sprinkle((8, 33), -1, seed=4, dtype=dtype)


def test_softmax_rows():
    # row 0: NaN -> all NaN; +inf -> NaN row (inf - inf); one -inf -> that entry 0; all -inf -> NaN
    check(lambda t: torch.softmax(t, -1), _rows())


def test_softmax_over_a_non_last_dim():
    x = _sprinkle((3, 9, 5), 1, seed=5)
    check(lambda t: torch.softmax(t, 1), x)


def test_log_softmax_rows():
    check(lambda t: torch.log_softmax(t, -1), _rows())


def test_softmax_of_a_single_plus_inf():
    # torch: a row [.., +inf, ..] softmaxes to all NaN (inf - inf)
    x = _scatter((4, 33), {40: INF, 100: -INF})
    check(lambda t: torch.softmax(t, -1), x)


def test_softmax_fp16():
    check(lambda t: torch.softmax(t, -1), _rows(torch.float16), tol=HALF)


def test_log_softmax_fp16():
    check(lambda t: torch.log_softmax(t, -1), _rows(torch.float16), tol=HALF)


@pytest.mark.parametrize("kind", ["amax", "amin", "max_both", "argmax"])
def test_reduction_fp16(kind):
    x = _sprinkle((8, 33), -1, seed=6, dtype=torch.float16)
    fn = REDUCTIONS[kind]
    check(lambda t: fn(t, -1), x, tol=HALF)


def test_fp16_exp_overflows_to_inf():
    x = _scatter(ELEM_SHAPE, {3: 12.0, 4: -20.0, 5: NAN, 6: INF, 7: -INF}, dtype=torch.float16)
    check(lambda t: torch.exp(t) * 2, x, tol=HALF)


def test_layernorm_nan_poisons_only_its_row():
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(33)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-0.5, 0.5)
    x = _rows()
    with torch.no_grad():
        want = ln(x)
    # the expectation itself: rows with a NaN or an inf are NaN throughout, the clean rows finite
    assert torch.isnan(want[[0, 1, 2, 3, 4, 5, 6]]).all() and torch.isfinite(want[7]).all()
    check(ln, x)


def test_layernorm_of_values_near_the_largest_float_has_infinite_variance():
    """Rows holding a value near fp32's largest: their squared deviations sum past the range, the
    variance is inf and every output 0 (times the weight, plus the bias), as eager gives; the
    deviations' rounding error squared overflowed too, and inf - inf made the rows NaN (the ONNX
    fuzzer: a Clip without min turns -inf into -3.4e38 before a LayerNormalization)."""
    torch.manual_seed(0)
    ln, big = torch.nn.LayerNorm(8), torch.finfo(torch.float32).max
    x = torch.randn(4, 8)
    # (eager's Welford pass is NaN where the huge value comes first in its row: not drawn here)
    x[0, 2], x[1, 7], x[2, 5], x[3, 1] = -big, big, 3e19, -3e19
    with torch.no_grad():
        want = ln(x)
    assert torch.isfinite(want).all()                # (the expectation: no NaN, every row the bias)
    check(ln, x)


def test_layernorm_fp16():
    ln = torch.nn.LayerNorm(33).half()
    check(ln, _rows(torch.float16), tol=HALF)


# ----------------------------------------------------------------------------------------------
# Elementwise on (4, 33) operands with NaN, +-inf, +-0.

UNARY = {
    "clamp": lambda x: torch.clamp(x, -1.0, 1.0),
    "clamp_min": lambda x: torch.clamp(x, min=0.0),
    "clamp_max": lambda x: torch.clamp(x, max=0.5),
    "relu": torch.relu,
    "hardtanh": torch.nn.functional.hardtanh,
    "isnan": torch.isnan,
    "isinf": torch.isinf,
    "isfinite": torch.isfinite,
    "nan_to_zero": lambda x: torch.where(torch.isnan(x), torch.zeros_like(x), x),
    "exp": torch.exp,
    "exp_overflow": lambda x: torch.exp(x * 100.0),
    "log": torch.log,                      # log(<0) = NaN, log(0) = -inf, log(inf) = inf
    "log_abs": lambda x: torch.log(x.abs()),
    "sqrt": torch.sqrt,                    # sqrt(<0) = NaN
    "rsqrt": torch.rsqrt,                  # rsqrt(0) = inf, rsqrt(-0) = -inf
    "reciprocal": torch.reciprocal,        # 1/+-0 = +-inf
    "div_by_zero_scalar": lambda x: x / 0.0,
    "mul_zero": lambda x: x * 0.0,         # inf * 0 = NaN
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "silu": torch.nn.functional.silu,
    "sign": torch.sign,                    # torch: sign(NaN) = 0
    "gt_scalar": lambda x: x > 0.0,
    "eq_inf": lambda x: x == INF,
}


@pytest.mark.parametrize("op", list(UNARY))
def test_unary(op):
    check(UNARY[op], _x())


def test_gelu_of_nan():
    # NaN only: eager CPU gelu gives NaN for +inf and -inf alike (erf form: inf * 1 and -inf * 0
    # evaluated as written), which is torch's arithmetic rather than a limit worth pinning
    x = _scatter(ELEM_SHAPE, {0: NAN, 14: NAN, 47: NAN, 100: NAN}, seed=1)
    check(torch.nn.functional.gelu, x)


BINARY = {
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "clamp_tensor": lambda x, y: torch.clamp(x, min=y),
    "gt": lambda x, y: x > y,
    "lt": lambda x, y: x < y,
    "eq": lambda x, y: x == y,
    "ne": lambda x, y: x != y,
    "where_gt": lambda x, y: torch.where(x > y, x, y),
    "where_nan": lambda x, y: torch.where(torch.isnan(y), x, y),
    "add": lambda x, y: x + y,             # inf + -inf = NaN
    "sub": lambda x, y: x - y,             # inf - inf = NaN
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,             # x/0 = +-inf, 0/0 = NaN, x/-0 = -+inf, inf/inf = NaN
    "logical_and_isnan": lambda x, y: torch.isnan(x) & ~torch.isinf(y),
}


@pytest.mark.parametrize("op", list(BINARY))
def test_binary(op):
    check(BINARY[op], _x(), _y())


def test_maximum_then_amax():
    # elementwise and reduction fused into one kernel
    check(lambda x, y: torch.maximum(x, y).amax(-1), _x(), _y())


def test_comparison_feeds_a_sum():
    check(lambda x, y: (x > y).float().sum(-1) + (x != x).float().sum(-1), _x(), _y())
