"""Buffer planning: intermediates share one arena by lifetime (runtime/memory.py)."""
import torch
from hypothesis import given, settings, strategies as st

import tilefuse
from tilefuse.runtime.memory import ALIGN, assign_offsets


def assert_valid(tensors, offsets, arena):
    assert set(offsets) == set(tensors)
    for n, off in offsets.items():
        assert off % ALIGN == 0 and off + tensors[n][0] <= arena
    names = sorted(tensors)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (sa, fa, la), (sb, fb, lb) = tensors[a], tensors[b]
            if fa <= lb and fb <= la and sa and sb:   # live together: bytes must not overlap
                assert offsets[a] + sa <= offsets[b] or offsets[b] + sb <= offsets[a], (a, b)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 20), st.integers(0, 6)), max_size=25))
def test_tensors_live_together_never_share_bytes(items):
    tensors = {f"t{k}": (size, first, first + span) for k, (size, first, span) in enumerate(items)}
    offsets, arena = assign_offsets(tensors)
    assert_valid(tensors, offsets, arena)
    # never worse than no reuse at all
    assert arena <= sum(-(-s // ALIGN) * ALIGN for s, _, _ in tensors.values())


def test_disjoint_lifetimes_reuse_the_same_bytes():
    offsets, arena = assign_offsets({"a": (1000, 0, 1), "b": (1000, 2, 3), "c": (500, 1, 2)})
    assert offsets["a"] == offsets["b"] == 0 and offsets["c"] >= 1000 and arena == 1024 + 512


class Deep(torch.nn.Module):
    def __init__(self, layers=8, width=24):
        super().__init__()
        self.layers = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(), torch.nn.Linear(2 * width, width),
                                torch.nn.LayerNorm(width)) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def test_many_layer_model_runs_in_an_arena_far_below_the_sum_of_its_intermediates():
    torch.manual_seed(0)
    model, x = Deep().eval(), torch.randn(6, 24)
    c = tilefuse.compile(model, (x,), time_limit=2.0)
    mem = c.report.memory
    assert mem["intermediates"] > 12
    # layers run one after another: the arena holds about one layer's worth, not all eight
    assert mem["intermediate_peak_bytes"] * 4 < mem["intermediate_total_bytes"]
    program = c.program
    assert program.memory.arena_bytes == mem["intermediate_peak_bytes"]
    storages = {t.untyped_storage().data_ptr() for t in program.intermediates.values()}
    assert len(storages) == 1     # every intermediate is a view into the one arena
    with torch.no_grad():
        want = model(x)
    torch.testing.assert_close(c(x), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c(x), want, rtol=1e-5, atol=1e-5)   # the arena is reused across calls
    lt = c.plan.lifetimes
    tensors = {n: (c.primgraph.types[n].nbytes, lt[n].first, lt[n].last) for n in program.memory.offsets}
    assert_valid(tensors, program.memory.offsets, program.memory.arena_bytes)
