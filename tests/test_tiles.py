"""Welder tile propagation and traffic (welder-notes §7, cases 1 and 2)."""
import pytest

from tilefuse.fission.reduce import softmax
from tilefuse.fission.registry import Fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.schedule.tiles import propagate

MiB = 1 << 20


def _matmul_softmax(m=98304, k=64, n=128):
    fx = Fission(set())
    a = fx.ref("A", TensorType((m, k), DType.float32))
    b = fx.ref("B", TensorType((k, n), DType.float32))
    c = fx.reduce((m, n), (k,), "sum", lambda i, r: a[i[0], r[0]] * b[r[0], i[1]])
    d = softmax(fx, c, 1)
    types = {"A": a.type, "B": b.type} | {p.name: p.out for p in fx.prims}
    return fx.prims, types, c.name, d.name


def test_matmul_softmax_propagation():
    prims, types, c, d = _matmul_softmax()
    plan = propagate(prims, types, d, (4, 128))
    assert plan.shape(c) == (4, 128)
    assert plan.shape("A") == (4, 64) and plan.shape("B") == (64, 128)
    chunked = propagate(prims, types, d, (4, 128), rstep={c: (16,)})
    assert chunked.shape("A") == (4, 16) and chunked.shape("B") == (16, 128)


@pytest.mark.parametrize("rows,per_tile,total_mib", [(1, 33536, 3144), (4, 35840, 840), (8, 38912, 456),
                                                     (16, 45056, 264), (32, 57344, 168)])
def test_matmul_softmax_traffic(rows, per_tile, total_mib):
    prims, types, _, d = _matmul_softmax()
    plan = propagate(prims, types, d, (rows, 128))
    assert plan.load_bytes + plan.store_bytes == per_tile
    assert plan.tiles == 98304 // rows
    assert round(plan.traffic / MiB) == total_mib
