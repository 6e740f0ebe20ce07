"""Functionalized in-place updates through the ATen frontend: slice/select/diagonal/as_strided
scatters, index_put (accumulate, masks), scatter along a dim and the in-place copy_/index_put_.

Each case compiles a function with the default pipeline (generated kernels, in Triton's
interpreter without a GPU) and compares with eager torch; structural cases check which canonical
operators the frontend chose.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
from torch.fx.experimental.proxy_tensor import make_fx

import tilefuse
from tilefuse.errors import UnsupportedAttribute, UnsupportedOperator
from tilefuse.frontend.torch import fx_to_graph, import_torch

gen = torch.Generator().manual_seed(7)
FAST = {"time_limit": 1.0}


def rand(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=gen).to(dtype)


def ints(*values):
    return torch.tensor(values, dtype=torch.int64)


def check(fn, *args, rtol=1e-5, atol=1e-6):
    """Compile ``fn`` (which must not mutate its arguments) and compare with eager."""
    cm = tilefuse.compile(fn, args, **FAST)
    got, want = cm(*args), fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.is_floating_point:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    else:
        assert torch.equal(got, want)
    return cm


def ops(fn, *args) -> list[str]:
    return [n.op for n in import_torch(fn, args).graph.nodes]


# ---------------------------------------------------------------- static positions

def slice_every_other(x, y):
    return torch.slice_scatter(x, y, dim=-1, start=1, end=None, step=2)


def slice_negative_start(x, y):
    return torch.slice_scatter(x, y, dim=0, start=-2)


def select_last(x, y):
    return torch.select_scatter(x, y, -2, -1)


def diagonal_below(x, y):
    return torch.diagonal_scatter(x, y, -1, -1, -2)


def strided_window(x, y):
    return torch.as_strided_scatter(x, y, (2, 3), (12, 2), 5)


STATIC = {
    "slice_step2": (slice_every_other, lambda dt: (rand(3, 7, dtype=dt), rand(3, 3, dtype=dt)), "SliceScatter"),
    "slice_negative": (slice_negative_start, lambda dt: (rand(5, 4, dtype=dt), rand(2, 4, dtype=dt)), "SliceScatter"),
    "select": (select_last, lambda dt: (rand(2, 3, 4, dtype=dt), rand(2, 4, dtype=dt)), "SliceScatter"),
    "diagonal": (diagonal_below, lambda dt: (rand(2, 4, 3, dtype=dt), rand(2, 2, dtype=dt)), "DiagonalScatter"),
    "as_strided": (strided_window, lambda dt: (rand(4, 6, dtype=dt), rand(2, 3, dtype=dt)), "AsStridedScatter"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("case", list(STATIC))
def test_static_scatters(case, dtype):
    fn, make, op = STATIC[case]
    args = make(dtype)
    assert op in ops(fn, *args)
    check(fn, *args)


# ---------------------------------------------------------------- index_put

def put_accumulate(x, i, v):
    return torch.index_put(x, (i,), v, accumulate=True)


def put(x, i, v):
    return torch.index_put(x, (i,), v)


def put_two_apart(x, i, j, v):          # indexed dims not adjacent: the index dims go first
    x = x.clone()
    x[i, :, j] = v
    return x


def put_after_slice(x, i, j, v):        # adjacent after a full dim: the index dims stay in place
    x = x.clone()
    x[:, i, j] += v
    return x


INDEX_PUT = {
    # duplicates (1 twice, -1 and 3 the same row) sum with accumulate
    "accumulate_duplicates": (put_accumulate, lambda: (rand(4, 3), ints(1, 1, -1, 3, 0), rand(5, 3))),
    "accumulate_fp16": (put_accumulate, lambda: (rand(4, 3, dtype=torch.float16), ints(2, 2, 0),
                                                 rand(3, 3, dtype=torch.float16))),
    "broadcast_row": (put, lambda: (rand(5, 3), ints(-1, 0), rand(3))),
    "scalar_value": (put, lambda: (rand(5, 3), ints(4, 1), torch.tensor(2.5))),
    "int32_indices": (put, lambda: (rand(5, 3), torch.tensor([3, -5], dtype=torch.int32), rand(2, 3))),
    "two_apart": (put_two_apart, lambda: (rand(3, 2, 4), ints(0, 2), ints(-1, 1), rand(2, 2))),
    "broadcast_indices": (put_two_apart, lambda: (rand(3, 2, 4), ints(0, 2).view(2, 1), ints(1, 3, 0), rand(3, 1))),
    "after_slice": (put_after_slice, lambda: (rand(2, 3, 4), ints(0, 2, 0), ints(1, -1, 1), rand(2, 3))),
    "integers": (put_accumulate, lambda: (torch.arange(12).view(4, 3), ints(3, 3), ints(5, 7, 9))),
    # Without accumulate torch leaves the order of duplicate writes undefined; on the CPU the
    # last one wins, and tilefuse's ScatterND (torch's indexing) keeps the same one.
    "duplicates_last_wins": (put, lambda: (rand(4, 3), ints(2, 0, 2), rand(3, 3))),
}


@pytest.mark.parametrize("case", list(INDEX_PUT))
def test_index_put(case):
    fn, make = INDEX_PUT[case]
    args = make()
    atol = 1e-3 if args[0].dtype is torch.float16 else 1e-6
    check(fn, *args, rtol=1e-3, atol=atol)


def test_accumulate_is_scatter_nd_add():
    g = import_torch(put_accumulate, (rand(4, 3), ints(1, 1), rand(2, 3))).graph
    (node,) = [n for n in g.nodes if n.op == "ScatterND"]
    assert node.attrs["reduction"] == "add"


def mask_fill(x, m):
    return torch.index_put(x, (m,), torch.tensor(0.0))


def mask_add_rows(x, m, v):             # mask over dim 1 only, values broadcast over the masked columns
    return torch.ops.aten.index_put(x, [None, m], v, True)


def mask_two_dims(x, m, v):
    return torch.index_put(x, (m,), v)


@pytest.mark.parametrize("fn, make", [
    (mask_fill, lambda: (rand(3, 4), rand(3, 4) > 0)),
    (mask_add_rows, lambda: (rand(3, 4), rand(4) > 0, rand(3, 1))),
    (mask_two_dims, lambda: (rand(2, 3, 4), rand(2, 3) > 0, rand(4))),
])
def test_mask_with_shared_values_is_a_where(fn, make):
    args = make()
    got = ops(fn, *args)
    assert "Where" in got and "ScatterND" not in got
    check(fn, *args)


def test_constant_mask_with_one_value_per_element():
    mask = torch.tensor([True, False, True, True])

    def f(x, v):
        return torch.index_put(x, (mask,), v)
    check(f, rand(4, 2), rand(3, 2))


def test_data_dependent_mask_is_rejected():
    def f(x, m, v):
        return torch.index_put(x, (m,), v)
    with pytest.raises(UnsupportedOperator) as e:
        import_torch(f, (rand(4), ints(1, 0, 1, 1).bool(), rand(3)))
    assert e.value.op == "aten.index_put.default"
    assert "depends on data" in str(e.value) and "'index_put'" in str(e.value)


# ---------------------------------------------------------------- scatter along a dim

SCATTER = {
    "src_larger_than_index": (lambda x, i, s: x.scatter(1, i, s),
                              lambda: (rand(3, 5), ints(4, 0, 2, 1, 3, 0).view(3, 2), rand(3, 4))),
    "value": (lambda x, i: x.scatter(-1, i, -3.0), lambda: (rand(3, 5), ints(4, 0, 2, 1, 3, 0).view(3, 2))),
    "add_duplicates": (lambda x, i, s: x.scatter_add(0, i, s), lambda: (rand(3, 2), ints(1, 1, 1, 0).view(2, 2),
                                                                       rand(2, 2))),
    "amax": (lambda x, i, s: x.scatter_reduce(1, i, s, "amax"), lambda: (rand(2, 4), ints(0, 0, 3, 3).view(2, 2),
                                                                          rand(2, 2))),
    "prod": (lambda x, i, s: x.scatter_reduce(1, i, s, "prod"), lambda: (rand(2, 4), ints(1, 1, 2, 0).view(2, 2),
                                                                          rand(2, 2))),
}


@pytest.mark.parametrize("case", list(SCATTER))
def test_scatter_along_a_dim(case):
    fn, make = SCATTER[case]
    args = make()
    assert "ScatterElements" in ops(fn, *args)
    check(fn, *args)


@pytest.mark.parametrize("kwargs, attr", [({"reduce": "mean"}, "reduce"),
                                          ({"reduce": "sum", "include_self": False}, "include_self")])
def test_unsupported_scatter_reduce(kwargs, attr):
    def f(x, i, s):
        return x.scatter_reduce(0, i, s, **kwargs)
    with pytest.raises(UnsupportedAttribute) as e:
        import_torch(f, (rand(3), ints(0, 0), rand(2)))
    assert e.value.op == "aten.scatter_reduce.two" and e.value.attr == attr


# ---------------------------------------------------------------- a module of in-place updates

class InPlace(nn.Module):
    def forward(self, x, y, d, idx, v, mask):
        x = x.clone()
        x[:, 1:3] = y
        x[..., 0] = 0
        x[:, :4].diagonal().copy_(d)
        x.index_put_((idx,), v, accumulate=True)
        x[mask] = 0
        return x * 2


def test_in_place_module_end_to_end():
    args = (rand(5, 6), rand(5, 2), rand(4), ints(4, 0, 4, -1), rand(4, 6), rand(5, 6) > 0.5)
    got = ops(InPlace(), *args)
    assert {"SliceScatter", "ScatterND", "Where"} <= set(got)
    cm = tilefuse.compile(InPlace(), args, **FAST)
    torch.testing.assert_close(cm(*args), InPlace()(*args))


# ---------------------------------------------------------------- in-place ops in unfunctionalized graphs

def _convert(fn, *args):
    """An ATen graph with its in-place ops left in place (make_fx without functionalization)."""
    gm = make_fx(fn)(*args)
    inputs = {n: n.name for n in gm.graph.nodes if n.op == "placeholder"}
    em, outs = fx_to_graph(gm.graph, inputs=inputs)
    return em.graph(outs, "g")


def test_in_place_copy_into_a_fresh_tensor():
    def f(x, y):
        z = x * 2
        return z.copy_(y) + 1
    g = _convert(f, rand(2, 3), rand(3))
    assert [n.op for n in g.nodes] == ["Expand", "Add"]


def test_in_place_index_put_into_a_fresh_tensor():
    def f(x, i, v):
        z = x * 2
        return z.index_put_((i,), v, accumulate=True) + 1
    g = _convert(f, rand(3, 2), ints(0, 0), rand(2, 2))
    (node,) = [n for n in g.nodes if n.op == "ScatterND"]
    assert node.attrs["reduction"] == "add"


@pytest.mark.parametrize("fn, match", [
    (lambda x, y: x.copy_(y), "into a model input"),
    (lambda x, y: (x * 2)[0].copy_(y), "through a view"),
])
def test_observable_in_place_writes_are_rejected(fn, match):
    with pytest.raises(UnsupportedOperator, match=match) as e:
        _convert(fn, rand(2, 3), rand(3))
    assert e.value.op == "aten.copy_.default"


def test_reading_the_old_name_after_an_in_place_write_is_rejected():
    # make_fx routes later reads through the copy_ node; a graph reading the written tensor's
    # own node afterwards would see the write, which a functional conversion cannot give it.
    gm = make_fx(lambda x, y: (lambda z: z.copy_(y) + 1)(x * 2))(rand(2, 3), rand(3))
    mul, copy, add = [n for n in gm.graph.nodes if n.op == "call_function"]
    add.update_arg(1, mul)
    inputs = {n: n.name for n in gm.graph.nodes if n.op == "placeholder"}
    with pytest.raises(UnsupportedOperator, match="read again"):
        fx_to_graph(gm.graph, inputs=inputs)
