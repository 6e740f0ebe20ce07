"""ATen ops the frontend gained with the scatters: the strided views diagonal, as_strided and
unfold, cumprod, sort, grid_sample, normalization by batch statistics, and FFTs (FNet).

Each case compiles a function with the default pipeline (generated kernels, in Triton's
interpreter without a GPU) and compares with eager torch.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tilefuse
from tilefuse.errors import UnsupportedAttribute, UnsupportedOperator
from tilefuse.frontend.torch import import_torch

gen = torch.Generator().manual_seed(11)


def rand(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=gen).to(dtype)


CASES = {
    "diagonal": (lambda x: x.diagonal() * 2, (4, 6)),
    "diagonal_offset": (lambda x: torch.diagonal(x, 2, -1, 0) + 1, (3, 2, 5)),
    "diagonal_below": (lambda x: torch.diagonal(x, -2, 1, 2) + 1, (2, 5, 3)),
    "diagonal_empty": (lambda x: torch.diagonal(x, 7) + 1, (4, 6)),
    "trace": (lambda x: x.trace(), (5, 5)),
    "as_strided": (lambda x: x.as_strided((3, 2), (5, 2), 2) * 2, (4, 6)),
    "as_strided_overlapping": (lambda x: x.as_strided((3, 3), (1, 1)) * 2, (4, 6)),   # reads may overlap
    "unfold": (lambda x: x.unfold(-1, 3, 2) * 2, (2, 7)),
    "unfold_dim0": (lambda x: x.unfold(0, 2, 1) + 1, (4, 3)),
    "cumprod": (lambda x: torch.cumprod(x, -1), (3, 5)),
    "sort": (lambda x: x.sort(1)[0] * 2, (3, 5)),
    "argsort_descending": (lambda x: torch.sort(x, stable=True, dim=0, descending=True)[1], (4, 3)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_eager(case, dtype):
    fn, shape = CASES[case]
    x = rand(*shape, dtype=dtype)
    cm = tilefuse.compile(fn, (x,), time_limit=1.0)
    got, want = cm(x), fn(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 1e-3 if dtype is torch.float16 else 1e-6
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_diagonal_is_a_strided_slice():
    ops = [n.op for n in import_torch(lambda x: x.diagonal(1) * 2, (rand(3, 4),)).graph.nodes]
    assert ops == ["Reshape", "Slice", "Mul"]


def test_as_strided_of_a_non_contiguous_tensor_is_rejected():
    def f(x):
        return x.t().as_strided((2, 2), (1, 2)) * 2
    with pytest.raises(UnsupportedOperator, match="non-contiguous") as e:
        import_torch(f, (rand(3, 4),))
    assert e.value.op == "aten.as_strided.default"


def test_sort_orders_ties_by_index():
    def f(x):
        values, indices = torch.sort(x, stable=True, dim=-1)
        return values * 2, indices
    x = torch.tensor([[2.0, 1.0, 2.0, 1.0, 0.5], [3.0, 3.0, 3.0, -1.0, 3.0]])
    cm = tilefuse.compile(f, (x,), time_limit=1.0)
    for got, want in zip(cm(x), f(x)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("mode, padding, align", [
    ("bilinear", "zeros", False), ("nearest", "border", True), ("bicubic", "reflection", False),
    ("bilinear", "reflection", True),
])
def test_grid_sample(mode, padding, align):
    def f(x, grid):
        return F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=align)
    x, grid = rand(1, 2, 5, 6), torch.rand(1, 3, 4, 2, generator=gen) * 2.4 - 1.2   # some points outside
    cm = tilefuse.compile(f, (x, grid), time_limit=1.0)
    torch.testing.assert_close(cm(x, grid), f(x, grid), rtol=1e-5, atol=1e-5)


def test_grid_sample_3d():
    def f(x, grid):
        return F.grid_sample(x, grid, align_corners=False)
    x, grid = rand(1, 2, 3, 4, 5), torch.rand(1, 2, 3, 2, 3, generator=gen) * 2 - 1
    cm = tilefuse.compile(f, (x, grid), time_limit=1.0)
    torch.testing.assert_close(cm(x, grid), f(x, grid), rtol=1e-5, atol=1e-5)


def test_bicubic_grid_sample_with_border_padding_is_rejected():
    def f(x, grid):
        return F.grid_sample(x, grid, mode="bicubic", padding_mode="border", align_corners=False)
    with pytest.raises(UnsupportedAttribute, match="padding_mode") as e:
        import_torch(f, (rand(1, 1, 4, 4), rand(1, 2, 2, 2)))
    assert e.value.op == "aten.grid_sampler_2d.default"


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 5)),             # a batch of one after reshaping
    (lambda: nn.BatchNorm2d(3, track_running_stats=False), (2, 3, 4, 5)),   # statistics over the batch too
    (lambda: nn.BatchNorm1d(3, track_running_stats=False), (4, 3)),
])
def test_normalization_by_batch_statistics(make, shape):
    m = make().eval()
    with torch.no_grad():
        m.weight.copy_(torch.rand(3, generator=gen) + 0.5)
        m.bias.copy_(torch.randn(3, generator=gen))
    x = rand(*shape) * 3 + 1
    assert "InstanceNormalization" in [n.op for n in import_torch(m, (x,)).graph.nodes]
    cm = tilefuse.compile(m, (x,), time_limit=1.0)
    torch.testing.assert_close(cm(x), m(x), rtol=1e-5, atol=1e-5)


FFT = {
    "fnet": lambda x: torch.fft.fft(torch.fft.fft(x, dim=-1), dim=-2).real,      # FNet's token mixing
    "rfft_forward_norm": lambda x: torch.view_as_real(torch.fft.rfft(x, dim=1, norm="forward")),
    "fft2_ortho": lambda x: torch.view_as_real(torch.fft.fft2(x, norm="ortho")),   # a cast to complex first
    "ifft": lambda x: torch.view_as_real(torch.fft.ifft(torch.fft.fft(x, dim=0), dim=0)),
    "irfft_odd_length": lambda x: torch.fft.irfft(torch.fft.rfft(x, dim=1), n=5, dim=1),
    "irfft2": lambda x: torch.fft.irfft2(torch.fft.rfft2(x)),
}


@pytest.mark.parametrize("case", list(FFT))
def test_fft(case):
    fn = FFT[case]
    x = rand(2, 4, 6)
    assert "DFT" in [n.op for n in import_torch(fn, (x,)).graph.nodes]
    cm = tilefuse.compile(fn, (x,), time_limit=1.0)
    torch.testing.assert_close(cm(x), fn(x), rtol=1e-5, atol=1e-5)


def test_complex_values_outside_ffts_are_rejected():
    with pytest.raises(UnsupportedOperator, match="read by aten.abs") as e:
        import_torch(lambda x: torch.fft.fft(x).abs(), (rand(4),))
    assert e.value.op == "aten._fft_r2c.default"


@pytest.mark.parametrize("fn", [lambda x: F.max_pool2d(x, 2), lambda x: F.max_pool2d(x, 3, 1, 1),
                                lambda x: F.avg_pool2d(x, 2), lambda x: F.adaptive_avg_pool2d(x, 1),
                                lambda x: F.adaptive_avg_pool2d(x, (2, 3)), lambda x: F.max_pool2d(x, 8, ceil_mode=True)],
                         ids=["max", "max_padded", "avg", "global", "adaptive", "whole_window"])
def test_unbatched_pooling_matches_eager(fn):
    # a (C, H, W) input (SuperPoint pools one so); it was refused, and an adaptive pool of one
    # read C as the batch
    x = rand(3, 6, 6)
    torch.testing.assert_close(tilefuse.compile(fn, (x,))(x), fn(x))
