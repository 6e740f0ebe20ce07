"""Welder's tile traffic through the fused family (welder-notes §7, cases 2 and 9).

The Matmul -> Softmax example is a group with a reduction nested inside another (the matmul's K
loop inside the softmax's row), which the fused family models but does not build a kernel for;
its traffic per [rows x 128] tile is Welder's (rows·64 + 64·128 + rows·128)·4 bytes.
"""
import pytest

from tilefuse.cost.model import coalesced_elems
from tilefuse.cost.target import Target
from tilefuse.families.base import Group
from tilefuse.families.fused import FusedFamily, tile_traffic
from tilefuse.fission.reduce import softmax
from tilefuse.fission.registry import Fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.expr import Var
from tilefuse.cost.tiles import tile_box

MiB = 1 << 20
H100 = Target.get("h100")


def _matmul_softmax(m=98304, k=64, n=128):
    fx = Fission(set())
    a = fx.ref("A", TensorType((m, k), DType.float32))
    b = fx.ref("B", TensorType((k, n), DType.float32))
    c = fx.reduce((m, n), (k,), "sum", lambda i, r: a[i[0], r[0]] * b[r[0], i[1]])
    d = softmax(fx, c, 1)
    types = {"A": a.type, "B": b.type} | {p.name: p.out for p in fx.prims}
    return Group(tuple(fx.prims), ("A", "B"), (d.name,), types)


@pytest.mark.parametrize("rows,per_tile,total_mib", [(1, 33536, 3144), (4, 35840, 840), (8, 38912, 456),
                                                     (16, 45056, 264), (32, 57344, 168)])
def test_matmul_softmax_traffic(rows, per_tile, total_mib):
    group = _matmul_softmax()
    nbytes, programs = tile_traffic(group, (rows, 128), H100)
    assert programs == 98304 // rows
    assert nbytes == per_tile * programs          # loads of A and B once per tile (shared by the
    assert round(nbytes / MiB) == total_mib      # max, the sum and the output), the tile stored once


def test_matmul_softmax_is_modelled_but_not_built():
    assert FusedFamily().schedules(_matmul_softmax(m=256), H100) == []


def test_chunked_rows_are_read_once_per_pass():
    # the same group with the row split into 32-wide chunks cannot share a row's loads: the
    # matmul's operands are read by each of the three passes (max, sum, output)
    group = _matmul_softmax(m=1024)
    whole, _ = tile_traffic(group, (4, 128), H100)
    chunked, _ = tile_traffic(group, (4, 128), H100, rblock=32)
    stores = 1024 * 128 * 4
    assert chunked - stores == 3 * (whole - stores)


def test_coalescing_penalty():
    # welder-notes test 9, with 32-byte sectors: a [4, 64] box of a row-major fp32 [98304, 64]
    # tensor is whole rows (no waste); a [64, 4] box of [64, 128] reads 16-byte runs of 32-byte sectors
    assert coalesced_elems((4, 64), (98304, 64), 4, H100) == 256
    assert coalesced_elems((64, 4), (64, 128), 4, H100) == 64 * 8


def test_tile_box_takes_consecutive_row_major_positions():
    a, b = Var("a"), Var("b")
    assert tile_box((a, b), (10, 8), 4) == {b: 4, a: 1}
    assert tile_box((a, b), (10, 8), 32) == {b: 8, a: 4}
