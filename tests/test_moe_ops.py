"""Mixture-of-experts routing ops as transformers writes them (its grouped-GEMM experts path):
``torch.histc`` counting tokens per expert, ``transformers.grouped_mm_fallback`` and
``torch._grouped_mm`` over offsets computed at run time.  Each compiles with both backends and is
compared with eager torch (found by the architecture sweep: 40 MoE models stopped at histc)."""
from __future__ import annotations

import pytest
import torch

import tilefuse
from tilefuse.errors import UnsupportedAttribute

gen = torch.Generator().manual_seed(5)


class Histc(torch.nn.Module):
    def __init__(self, bins, lo, hi):
        super().__init__()
        self.bins, self.lo, self.hi = bins, lo, hi

    def forward(self, x):
        return torch.histc(x, bins=self.bins, min=self.lo, max=self.hi) * 1.0


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("bins,lo,hi", [(4, 0.0, 3.0), (5, -1.0, 1.5), (1, 0.0, 1.0), (7, -2.0, 2.0)])
def test_histc_counts_as_eager(bins, lo, hi, backend):
    x = torch.randn(3, 10, generator=gen) * 1.5
    x[0, :4] = torch.tensor([lo, hi, float("nan"), hi + 1])     # both edges, NaN and outside are edge cases
    got = tilefuse.compile(Histc(bins, lo, hi), (x,), backend=backend)(x)
    torch.testing.assert_close(got, torch.histc(x, bins, lo, hi), rtol=0, atol=0)


def test_histc_over_the_datas_own_range_is_refused_by_name():
    with pytest.raises(UnsupportedAttribute, match=r"histc.*min"):
        tilefuse.compile(Histc(4, 0.0, 0.0), (torch.randn(8),), backend="reference")


class Experts(torch.nn.Module):
    """transformers' grouped experts: sort tokens by expert, count them (histc), cumulative ends."""

    def __init__(self, op, dtype, experts=3, k=8, n=8):
        super().__init__()
        self.op, self.experts = op, experts
        self.w = torch.nn.Parameter(torch.randn(experts, k, n, generator=gen).to(dtype))

    def forward(self, x, ids):
        ids, perm = torch.sort(ids)
        counts = torch.histc(ids.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        return self.op(x[perm], self.w, offs) * 2.0


def _fallback(x, w, offs):
    import transformers.integrations.moe  # noqa: F401 - registers torch.ops.transformers
    return torch.ops.transformers.grouped_mm_fallback(x, w, offs)


def _grouped_mm(x, w, offs):
    return torch._grouped_mm(x, w, offs=offs)


ROUTINGS = {"all_groups": [2, 0, 0, 2, 1, 2], "one_group": [0, 0, 0, 0, 0, 0], "an_empty_group": [2, 2, 0, 2, 2, 0],
            "rows_past_the_last_end": [1, 3, 0, 3, 1, 2]}


@pytest.mark.parametrize("backend", ["reference", "triton"])
@pytest.mark.parametrize("op,dtype", [(_fallback, torch.float32), (_grouped_mm, torch.bfloat16)],
                         ids=["transformers_fallback", "aten_grouped_mm"])     # torch._grouped_mm takes bf16
def test_grouped_matmul_over_runtime_offsets_matches_eager(op, dtype, backend):
    """One compiled model, every routing (the offsets are computed at run time from the ids):
    every group used, one group, an empty group, and ids past the last expert (3: histc does not
    count it, its rows are past the last end)."""
    model = Experts(op, dtype).eval()
    x = torch.randn(6, 8, generator=gen).to(dtype)
    with torch.no_grad():
        compiled = tilefuse.compile(model, (x, torch.tensor(ROUTINGS["all_groups"])), backend=backend)
        for name, routing in ROUTINGS.items():
            ids = torch.tensor(routing)
            want, got = model(x, ids), compiled(x, ids)
            # torch._grouped_mm leaves the rows past the last end uninitialized; the fallback and tilefuse zero them
            defined = len(ids) if op is _fallback else int((ids < model.experts).sum())
            torch.testing.assert_close(got[:defined], want[:defined], msg=lambda m: f"routing {name}: {m}")
            assert bool((got[defined:] == 0).all()), f"routing {name}: rows past the last end not zero"
