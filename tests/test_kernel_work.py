"""The cost model reads the kernel that is printed (``cost/work.py``, issue #21): a fused schedule's
``Work`` is ``work()`` of the very kernel its build prints, and a change to a kernel's statements
shows in its work."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from test_fused import H100

import tilefuse
from tilefuse.codegen.fused import fused_kernel
from tilefuse.codegen.kernel import Dot, Kernel, Loop, Reduce, Store, TileAxis
from tilefuse.cost.work import work
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.expr import Load, Var

F32 = DType.float32


def _fused_schedules(model, args):
    c = tilefuse.compile(model, args, target="h100", backend="reference", time_limit=5.0)
    return [k.schedule for k in c.plan.kernels if k.schedule.family == "fused"]


class Rows(torch.nn.Module):
    def forward(self, x):                       # rows too long for one tile: looped kernels too
        y = torch.nn.functional.layer_norm(x, x.shape[-1:]).transpose(0, 1)
        return torch.softmax(y * 2, 0), torch.tanh(x).sum(0)


def test_every_fused_schedule_is_costed_from_the_kernel_it_prints():
    scheds = _fused_schedules(Rows(), (torch.randn(3, 20000),))
    assert len(scheds) >= 2 and not all(s.one_pass for s in scheds)
    for s in scheds:
        assert work(fused_kernel(s, "k"), H100) == s.work


def _row_kernel(rows: int, cols: int, block: int, reduce_twice: bool) -> Kernel:
    """out[i] = sum_j x[i, j] (and, with ``reduce_twice``, + max_j x[i, j] in a second loop)."""
    i, j = Var("i"), Var("j")
    x = Load(0, (i, j), F32)
    axes = (TileAxis("x", (i,), (rows,), 1, 0, grid=0, block_name="XBLOCK"),
            TileAxis("r", (j,), (cols,), block, 1, block_name="RBLOCK"))
    body = [Reduce(1, x, "r", "sum", F32, 0.0, F32)]
    value = Load(1, (), F32)
    if reduce_twice:
        body.append(Reduce(2, x, "r", "max", F32, float("-inf"), F32))
        value = value + Load(2, (), F32)
    body.append(Store(0, (i,), value))
    return Kernel("k", (TensorType((rows, cols), F32),), (TensorType((rows,), F32),), axes, tuple(body), 4, 1)


def test_work_follows_the_statements():
    rows, cols = 64, 4096
    row_bytes = rows * cols * 4
    one = work(_row_kernel(rows, cols, 256, False), H100)
    two = work(_row_kernel(rows, cols, 256, True), H100)
    # each looped reduction is a loop issuing its own loads of x: a second one reads x again
    assert one.requested_bytes == row_bytes + rows * 4
    assert two.requested_bytes == 2 * row_bytes + rows * 4
    assert (one.programs, one.chunks, two.chunks) == (rows, cols // 256, 2 * cols // 256)
    assert two.flops > one.flops
    # whole rows: both reductions read one tile of x, loaded once, in a single chunk
    whole = work(_row_kernel(rows, cols, 4096, True), H100)
    assert whole.requested_bytes == row_bytes + rows * 4 and whole.chunks == 1


def test_a_statement_the_walk_does_not_cost_is_refused():
    k = _row_kernel(8, 8, 8, False)
    a = Load(0, (Var("i"), Var("j")), F32)
    dot = Dot(3, a, a, "x", "x", "r", "r", F32, F32)
    with pytest.raises(TypeError, match="Dot statements are not costed"):
        work(dataclasses.replace(k, body=(dot,) + k.body), H100)
