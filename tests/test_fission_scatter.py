"""SliceScatter, DiagonalScatter and AsStridedScatter fission rules against torch's scatters."""
from __future__ import annotations

import pytest
import torch
from opcheck import check_op, run_op

from tilefuse.analysis.classify import classify
from tilefuse.errors import UnsupportedAttribute
from tilefuse.ir.dtypes import DType, TensorType

gen = torch.Generator().manual_seed(3)


def rand(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=gen).to(dtype)


def _one_layout_prim(pg, category="layout") -> None:
    """A scatter into static positions is one select between two loads: data movement, not opaque."""
    assert len(pg.prims) == 1
    assert classify(pg.prims[0]) == category


@pytest.mark.parametrize("shape, axes, starts, ends, steps", [
    ((5, 7), (1,), (1,), (6,), (2,)),                 # strided window
    ((5, 7), (0, 1), (-4, 0), (100, 7), (3, 1)),      # negative start, end clamped, whole axis
    ((4, 6), (1,), (5,), (-100, ), (-2,)),            # reversed (ONNX steps < 0)
    ((2, 3, 4), (2,), (3,), (4,), (1,)),              # one position
    ((3, 4), (0,), (2,), (1,), (1,)),                 # empty window: x unchanged
])
def test_slice_scatter(shape, axes, starts, ends, steps):
    x = rand(*shape)
    # Python's slicing of a list clamps starts and ends (negative ones too) as ONNX Slice does.
    positions = [list(range(n)) for n in shape]
    for a, s, e, st in zip(axes, starts, ends, steps):
        positions[a] = positions[a][s:e:st]
    region = torch.meshgrid(*[torch.tensor(p, dtype=torch.int64) for p in positions], indexing="ij")
    upd = rand(*region[0].shape)
    want = x.clone()
    want[region] = upd
    pg = check_op("SliceScatter", [x, upd], want,
                  {"starts": starts, "ends": ends, "axes": axes, "steps": steps})
    if upd.numel():
        _one_layout_prim(pg)


def test_slice_scatter_casts_updates_and_keeps_dtype():
    x, upd = rand(4, 6, dtype=torch.float16), rand(4, 2)
    want = x.clone()
    want[:, 1:5:2] = upd.half()
    check_op("SliceScatter", [x, upd], want, {"starts": (1,), "ends": (5,), "axes": (1,), "steps": (2,)})


@pytest.mark.parametrize("shape, offset, dim1, dim2", [
    ((4, 6), 0, 0, 1), ((4, 6), 2, 0, 1), ((4, 6), -1, 0, 1), ((3, 4, 5), 1, 2, 0), ((2, 3, 3), -2, -1, -2),
])
def test_diagonal_scatter(shape, offset, dim1, dim2):
    x = rand(*shape)
    upd = rand(*torch.diagonal(x, offset, dim1, dim2).shape)
    want = torch.diagonal_scatter(x, upd, offset, dim1, dim2)
    pg = check_op("DiagonalScatter", [x, upd], want, {"offset": offset, "dim1": dim1, "dim2": dim2})
    _one_layout_prim(pg, "broadcast")   # the updates are read along fewer axes than the output has


@pytest.mark.parametrize("shape, size, stride, offset", [
    ((4, 6), (2, 2), (6, 1), 1),        # a window
    ((4, 6), (3, 2), (5, 2), 2),        # strided rows and columns
    ((4, 6), (4,), (7,), 0),            # the diagonal
    ((2, 3, 4), (4, 2), (1, 12), 0),    # transposed: smallest stride first
    ((4, 6), (24,), (1,), 0),           # everything
])
def test_as_strided_scatter(shape, size, stride, offset):
    x, upd = rand(*shape), rand(*size)
    want = torch.as_strided_scatter(x, upd, size, stride, offset)
    pg = check_op("AsStridedScatter", [x, upd], want, {"size": size, "stride": stride, "storage_offset": offset})
    _one_layout_prim(pg)


@pytest.mark.parametrize("op, attrs, upd_shape, match", [
    ("AsStridedScatter", {"size": (2, 2), "stride": (1, 1), "storage_offset": 0}, (2, 2), "overlaps"),
    ("AsStridedScatter", {"size": (3,), "stride": (12,), "storage_offset": 0}, (3,), "reaches past"),
    ("SliceScatter", {"starts": (0,), "ends": (2,), "axes": (1,), "steps": (1,)}, (4, 3), "written region"),
    ("SliceScatter", {"starts": (0,), "ends": (2,), "axes": (1,), "steps": (0,)}, (4, 2), "step"),
    ("DiagonalScatter", {"offset": 0, "dim1": 1, "dim2": -1}, (4,), "differ"),
])
def test_bad_attributes_name_the_node(op, attrs, upd_shape, match):
    with pytest.raises(UnsupportedAttribute, match=match) as e:
        run_op(op, [rand(4, 6), rand(*upd_shape)], [TensorType((4, 6), DType.float32)], attrs)
    assert e.value.node.name == "n0"
