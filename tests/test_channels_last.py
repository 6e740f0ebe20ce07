"""Convolutions read channels-last activations (``transform/channels_last.py``, issue #22): the
intermediate activations of a convolution chain are relabeled NHWC, each convolution sums over
(kh, kw, c) and reads a weight re-laid out as [F, KH, KW, C]; values unchanged (against eager);
for sm_90 the convolutions' activation loads become 16-byte async copies."""
import sys

import pytest
import torch

import tilefuse
from tilefuse import api
from tilefuse.codegen.kernel import Dot, guarded_load
from tilefuse.analysis.index import linear_form
from tilefuse.ir.expr import Load, walk
from tilefuse.codegen.triton import triton_source
from tilefuse.frontend.torch import import_torch
from tilefuse.transform.channels_last import MIN_CHANNELS, channels_last, channels_padded


class Block(torch.nn.Module):
    """A stem convolution on the model's input, then a residual block of two 3x3 convolutions."""

    def __init__(self, c_in=3, c=16):
        super().__init__()
        self.stem = torch.nn.Conv2d(c_in, c, 3, padding=1, bias=False)
        self.bn0 = torch.nn.BatchNorm2d(c)
        self.conv1 = torch.nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.conv2 = torch.nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.head = torch.nn.Linear(c, 5)

    def forward(self, x):
        y = torch.relu(self.bn0(self.stem(x)))
        y = torch.relu(self.bn1(self.conv1(y)) + y)
        y = torch.relu(self.conv2(y))
        return self.head(y.mean((2, 3)))


def _model(c=16):
    torch.manual_seed(0)
    m = Block(c=c).eval()
    for bn in (m.bn0, m.bn1):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return m, (torch.randn(2, 3, 12, 12),)


def test_a_convolution_chain_runs_channels_last_and_matches_eager():
    m, args = _model()
    with torch.no_grad():
        cm = tilefuse.compile(m, args, target="cpu", verify=True)
        torch.testing.assert_close(cm(*args), m(*args), rtol=1e-4, atol=1e-4)
    pg = cm.primgraph
    nhwc = [p for p in pg.prims if p.name.endswith("_nhwc")]
    assert nhwc and all(p.out.shape[-1] == 16 for p in nhwc if p.out.rank == 4)
    convs = [p for p in pg.prims if p.reduce is not None and p.out.rank == 4 and len(p.reduce.axes) == 3]
    # the stem reads the model's input (NCHW, kept): its window stays inner; the block's
    # convolutions read channels-last activations: the channel is their innermost K variable
    inner = [p.reduce.extents[-1] for p in convs]
    assert sorted(inner) == [3, 16, 16]
    weights = {c.name: c for c in pg.constants if c.name.endswith("_nhwc")}
    assert len(weights) == 2 and all(c.data.shape[1:] == (3, 3, 16) for c in weights.values())
    assert [d.type.shape for d in pg.inputs] == [(2, 3, 12, 12)]
    # a padded window is one load masked by its bounds test, fed to the dot with no select
    # (a zero-filling async copy on a GPU): the values above are eager's
    padded = [k for b in cm.kernels for k in b.kernels
              if any(guarded_load(d.a) or guarded_load(d.b) for d in _dots(k.body))]
    assert padded
    for k in padded:
        src = triton_source(k)
        assert "tl.where" not in src, k.name


def _dots(body):
    for st in body:
        if isinstance(st, Dot):
            yield st
        elif hasattr(st, "body"):
            yield from _dots(st.body)


def test_few_channels_keep_their_layout():
    """Fewer than 8 channels make no 16-byte run: the stage leaves the graph as it is (padding them
    is ``channels_padded``, an alternative the planner weighs: below)."""
    m, args = _model(c=4)
    cm = tilefuse.compile(m, args, target="cpu", backend="reference")
    assert not any(p.name.endswith("_nhwc") for p in cm.primgraph.prims)
    before = _stages_until_channels_last(m, args)
    assert channels_last(before) is before


class DepthwiseStem(torch.nn.Module):
    """MobileNetV2's stem: a 3-channel convolution, BatchNorm + ReLU6, then a depthwise 3 x 3
    (``x[n, c + r, ...]`` over its group's one channel ``r``) and a pointwise projection."""

    def __init__(self, c=16):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, c, 3, stride=2, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(c)
        self.dw = torch.nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.pw = torch.nn.Conv2d(c, 8, 1)

    def forward(self, x):
        y = torch.nn.functional.relu6(self.bn(self.stem(x)))
        return self.pw(torch.nn.functional.relu6(self.dw(y)))


def test_a_depthwise_convolution_after_a_stem_reads_channels_last():
    """The depthwise convolution after a stem over the image keeps the channel through its load
    ``x[n, c + r, ...]`` (``r`` of extent 1), so the stem's output, its BatchNorm and ReLU6 and the
    depthwise input are relabeled NHWC from the pointwise convolution back (they stayed NCHW: the
    depthwise kernel's activation loads were 2-byte gathers); values are eager's."""
    torch.manual_seed(0)
    m = DepthwiseStem().eval()
    m.bn.running_mean.uniform_(-1, 1)
    m.bn.running_var.uniform_(0.5, 2)
    args = (torch.randn(1, 3, 16, 16),)
    pg = channels_last(_stages_until_channels_last(m, args))
    made = {p.name: p for p in pg.prims}
    # every intermediate is channels-last (the stem's output, its BatchNorm, ReLU6, the depthwise
    # input and output, the projection) but the image's padded copy (3 channels) and the output
    kept = {n for n in made if not n.endswith("_nhwc") and n not in pg.outputs}
    assert kept == {p.name for p in pg.prims if p.inputs == ("x",)} and sum(n.endswith("_nhwc") for n in made) == 7
    # the depthwise convolution reads its activation's channel innermost, its weight taps-outer
    (dw,) = [p for p in pg.prims if p.inputs[-1] == "dw.weight_taps"]
    (act,) = {ld for ld in walk(dw.body) if isinstance(ld, Load) and ld.tensor == 0}
    assert dw.inputs[0].endswith("_nhwc")
    assert linear_form(act.index[3]).terms == {dw.axes[3]: 1, dw.reduce.axes[0]: 1}    # (axes: n, h, w, c)
    with torch.no_grad():
        cm = tilefuse.compile(m, args, target="cpu", verify=True)
        torch.testing.assert_close(cm(*args), m(*args), rtol=1e-4, atol=1e-4)


def _stages_until_channels_last(m, args):
    pg = api.fission(import_torch(m, args).graph)
    for name, stage in api.GRAPH_STAGES:
        if name == "channels_last":
            return pg
        pg = stage(pg)
    raise AssertionError("no channels_last stage")


@pytest.mark.skipif(sys.platform != "linux", reason="Triton's NVIDIA backend ships for Linux only")
def test_channels_last_convolutions_load_activations_in_16_byte_async_copies(tmp_path, monkeypatch):
    """For sm_90: the block's convolution kernels copy activations with cp.async (LDGSTS) and
    16-byte loads; without the stage the same convolutions gather 2-byte values."""
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path))
    m, _ = _model(c=32)
    m = m.half()
    args = (torch.randn(1, 3, 32, 32, dtype=torch.float16),)

    def block_convs():
        """The binaries of the convolution kernels after the stem (which reads the NCHW input)."""
        cm = tilefuse.compile(m, args, target="h100")
        convs = [r.binary for r in cm.native() if "conv" in r.binary.kernel and r.binary.mma != "none"]
        return convs[1:]

    nhwc = block_convs()
    monkeypatch.setattr(api, "GRAPH_STAGES", tuple(s for s in api.GRAPH_STAGES if s[0] != "channels_last"))
    nchw = block_convs()
    assert nhwc and nchw
    wide = lambda bs: sum(b.wide_share(16) for b in bs) / len(bs)  # noqa: E731
    assert wide(nhwc) > 0.8 and wide(nchw) < 0.5
    assert all(b.pipelined and b.async_copies.get(16) for b in nhwc)


def test_few_channels_padded_read_zero_padded_channels_last_copies_and_match_eager():
    """``channels_padded``: each convolution over 3 to 7 channels (the stem's 3, the block's 4)
    reads a channels-last copy of its activation padded with zero channels to 8 and a weight
    padded alike, the channel innermost in K; run by the interpreter's kernels, eager's values."""
    m, args = _model(c=4)
    pg = api.prims(import_torch(m, args).graph)
    padded = channels_padded(pg)
    assert padded is not pg
    copies = [p for p in padded.prims if p.name.endswith("_nhwc8")]
    # one copy per activation and form: the stem's padded image and the block's first padded
    # intermediate (stride 1: 8 channels); the stride-2 convolution's input as rows of 4-channel
    # pixels (the next test)
    assert len(copies) == 2 and all(p.out.shape[-1] == MIN_CHANNELS for p in copies)
    assert len([p for p in padded.prims if p.name.endswith("_rows4")]) == 1
    convs = [p for p in padded.prims if p.reduce is not None and p.out.rank == 4 and len(p.reduce.axes) == 3]
    assert [p.reduce.extents[-1] for p in convs] == [MIN_CHANNELS] * 2
    assert all(set(p.inputs) & {c.name for c in copies} for p in convs)
    weights = [c for c in padded.constants if c.name.endswith("_nhwc8")]
    assert len(weights) == 2
    # the weights only the padded convolutions read are replaced, not kept beside their copies
    assert not {"stem.weight", "conv1.weight", "conv2.weight"} & {c.name for c in padded.constants}
    for w in weights:
        assert w.data.shape[1:3] == (3, 3) and w.data.shape[3] == MIN_CHANNELS
        real = 3 if w.name.startswith("stem") else 4
        assert not w.data[..., real:].any() and w.data[..., :real].abs().sum() > 0
    with torch.no_grad():
        cm = tilefuse.compile_prims(padded, target="cpu", verify=True)
        torch.testing.assert_close(cm(*args), m(*args), rtol=1e-4, atol=1e-4)
    # one or two channels are not padded (4 to 8 times the work)
    thin = torch.nn.Conv2d(2, 8, 3).eval()
    pg2 = api.prims(import_torch(thin, (torch.randn(1, 2, 6, 6),)).graph)
    assert channels_padded(pg2) is pg2


@pytest.mark.parametrize("conv,shape,rows", [
    (torch.nn.Conv2d(3, 8, 7, stride=2, padding=3), (1, 3, 21, 21), True),    # ResNet's stem: K 7 x 32
    (torch.nn.Conv2d(4, 8, 3, stride=2, padding=1), (2, 4, 15, 15), True),    # 3 x 16
    (torch.nn.Conv2d(3, 8, 3, stride=2, dilation=2), (1, 3, 17, 17), False),  # taps 2 pixels apart
    (torch.nn.Conv2d(3, 8, 3, stride=1, padding=1), (1, 3, 10, 10), False),   # windows 8 bytes apart
], ids=["7x7-s2", "3x3-s2-4ch", "dilated", "stride-1"])
def test_a_stride_2_stem_reads_rows_of_its_image_and_matches_eager(conv, shape, rows):
    """``channels_padded`` over 3 or 4 channels with an even stride reads row windows: a copy of
    the image with each row's pixels' 4 channels side by side (zero-padded channels, and zero
    pixels where the last window's run reaches past the row), a kernel row's taps one K run
    ``ow·s·4 + j`` padded to a multiple of 8 with zero weights; dilated or stride-1 windows are
    padded to 8 channels instead.  Through the interpreter's kernels, eager's values."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(conv, torch.nn.ReLU()).eval()
    args = (torch.randn(*shape),)
    pg = api.prims(import_torch(m, args).graph)
    padded = channels_padded(pg)
    copies = [p for p in padded.prims if p.name.endswith("_rows4")]
    assert bool(copies) == rows
    if rows:
        (copy,) = copies
        (cv,) = [p for p in padded.prims if p.reduce is not None]
        kh, kw = conv.kernel_size
        run = -(-kw * 4 // 8) * 8
        assert cv.reduce.extents == (kh, run) and copy.name in cv.inputs
        n, c, h, w = shape
        ow = (w + 2 * conv.padding[1] - kw) // 2 + 1
        width = max(w + 2 * conv.padding[1], 2 * (ow - 1) + run // 4)
        assert copy.out.shape == (n, h + 2 * conv.padding[0], (width + width % 2) * 4)
        (wt,) = [k for k in padded.constants if k.name.endswith("_rows4")]
        ref = torch.nn.functional.pad(conv.weight.detach().permute(0, 2, 3, 1), (0, 4 - c)).reshape(8, kh, -1)
        assert wt.data.shape == (8, kh, run) and torch.equal(wt.data[..., :kw * 4], ref) and not wt.data[..., kw * 4:].any()
    with torch.no_grad():
        cm = tilefuse.compile_prims(padded, target="cpu", verify=True)
        torch.testing.assert_close(cm(*args), m(*args), rtol=1e-4, atol=1e-4)


def _few_channel_convs():
    from hypothesis import strategies as st
    return st.fixed_dictionaries({
        "c": st.integers(3, 7), "f": st.sampled_from([5, 8, 16]), "kh": st.integers(1, 5), "kw": st.integers(1, 7),
        "sh": st.integers(1, 3), "sw": st.integers(1, 4), "ph": st.integers(0, 2), "pw": st.integers(0, 3),
        "dil": st.sampled_from([1, 1, 1, 2]), "bias": st.booleans(), "n": st.integers(1, 2),
        "h": st.integers(8, 14), "w": st.integers(8, 17), "act": st.sampled_from(["relu", "sigmoid", "none"]),
        "half": st.booleans()})


def _check_few_channel_conv(spec):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(spec["c"], spec["f"], (spec["kh"], spec["kw"]), stride=(spec["sh"], spec["sw"]),
                           padding=(min(spec["ph"], spec["kh"] - 1), min(spec["pw"], spec["kw"] - 1)),
                           dilation=spec["dil"], bias=spec["bias"])
    act = {"relu": torch.nn.ReLU(), "sigmoid": torch.nn.Sigmoid(), "none": torch.nn.Identity()}[spec["act"]]
    m = torch.nn.Sequential(conv, act).eval()
    x = torch.randn(spec["n"], spec["c"], spec["h"], spec["w"])
    tol = dict(rtol=1e-4, atol=1e-4)
    if spec["half"]:            # (fp16 tiles: tensor cores and descriptors in the h100 plan)
        m, x, tol = m.half(), x.half(), dict(rtol=2e-2, atol=2e-2)
    if (spec["h"] + 2 * conv.padding[0] - spec["dil"] * (spec["kh"] - 1) - 1) < 0 or \
            (spec["w"] + 2 * conv.padding[1] - spec["dil"] * (spec["kw"] - 1) - 1) < 0:
        return
    pg = api.prims(import_torch(m, (x,)).graph)
    padded = channels_padded(pg)
    ow = (spec["w"] + 2 * conv.padding[1] - spec["dil"] * (spec["kw"] - 1) - 1) // spec["sw"] + 1
    rows = spec["c"] <= 4 and (spec["sw"] % 2 == 0 or ow == 1) and spec["dil"] == 1
    assert any(p.name.endswith("_rows4") for p in padded.prims) == rows
    assert any(p.name.endswith("_nhwc8") for p in padded.prims) == (not rows)
    with torch.no_grad():
        want = m.float()(x.float()).to(x.dtype)
        cm = tilefuse.compile_prims(padded, target="cpu", time_limit=1.0)
        torch.testing.assert_close(cm(x), want, **tol)
        # the h100 plan's kernels (its tiles, tensor descriptors) in the interpreter
        cm = tilefuse.compile_prims(padded, target="h100", time_limit=1.0)
        torch.testing.assert_close(cm.emulate(x), want, **tol)


def test_few_channel_convolutions_through_either_padded_form_match_eager():
    """``channels_padded`` over drawn convolutions of 3 to 7 channels (kernel sizes, strides,
    paddings, dilations, biases, odd widths): the row-window form exactly where the channels are
    at most 4, the width's stride even (or the output one column wide) and the taps adjacent,
    else the 8-channel form; both run through the interpreter's kernels, planned for the CPU and
    for an H100, with eager's values."""
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=12, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(_few_channel_convs())
    def run(spec):
        _check_few_channel_conv(spec)
    run()


@pytest.mark.slow
def test_few_channel_convolutions_through_either_padded_form_match_eager_long():
    from hypothesis import HealthCheck, given, settings

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_few_channel_convs())
    def run(spec):
        _check_few_channel_conv(spec)
    run()
