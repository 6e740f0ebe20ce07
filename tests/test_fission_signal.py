"""Fission of DFT and STFT (contractions with constant DFT matrices) against torch.fft."""
import pytest
import torch

from opcheck import check_op

torch.manual_seed(0)
TOL = dict(rtol=1e-4, atol=1e-4)


def _pairs(z: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(z).float()


@pytest.mark.parametrize("axis", [1, 2])
def test_dft_of_a_real_signal(axis):
    x = torch.randn(2, 8, 6, 1)
    check_op("DFT", [x], _pairs(torch.fft.fft(x[..., 0].double(), dim=axis)), attrs={"axis": axis}, **TOL)


def test_inverse_dft_of_a_complex_signal():
    x = torch.randn(3, 10, 2)
    want = _pairs(torch.fft.ifft(torch.view_as_complex(x.double()), dim=1))
    check_op("DFT", [x], want, attrs={"axis": 1, "inverse": 1}, **TOL)


def test_onesided_dft_and_padded_length():
    x = torch.randn(2, 7, 1)
    want = _pairs(torch.fft.rfft(x[..., 0].double(), n=12, dim=1))
    check_op("DFT", [x], want, attrs={"axis": 1, "onesided": 1, "dft_length": 12}, **TOL)


@pytest.mark.parametrize("length", [8, 9])
def test_irfft_reads_a_hermitian_half_spectrum(length):
    spectrum = torch.fft.rfft(torch.randn(2, length).double(), dim=1)
    want = torch.fft.irfft(spectrum, n=length, dim=1).float().unsqueeze(-1)
    check_op("DFT", [_pairs(spectrum)], want, attrs={"axis": 1, "inverse": 1, "onesided": 1, "dft_length": length},
             **TOL)


@pytest.mark.parametrize("windowed", [False, True])
def test_stft_matches_torch(windowed):
    x, n, step = torch.randn(2, 40, 1), 16, 6
    window = torch.hann_window(n, periodic=False) if windowed else None
    frames = x[..., 0].double().unfold(1, n, step)                      # [B, frames, n]
    if windowed:
        frames = frames * window.double()
    want = _pairs(torch.fft.rfft(frames, dim=-1))
    pg = check_op("STFT", [x, window], want, attrs={"frame_step": step, "frame_length": n, "onesided": 1}, **TOL)
    assert sum(p.reduce is not None for p in pg.prims) == 1           # one contraction
