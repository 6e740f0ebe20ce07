"""The interpreter memory-traffic counter (tilefuse.cost.traffic_counter)."""
import pytest
import torch
import triton
import triton.language as tl

import tilefuse

from tilefuse.codegen.triton.interpreter import interpreting
from tilefuse.cost.traffic_counter import TensorTraffic, UnsupportedMemoryOp, count_traffic, _interpreting

pytestmark = pytest.mark.skipif(not _interpreting(), reason="kernels here run under Triton's interpreter")


def jit(fn):
    """``triton.jit`` for the interpreter, as tilefuse decorates its own kernels."""
    with interpreting():
        return triton.jit(fn)


@pytest.fixture(autouse=True)
def _interpreter():
    with interpreting():       # each test's launches run in the interpreter, as tilefuse runs its own
        yield


@jit
def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask, other=0.0), mask=mask)


@jit
def _load_twice(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(x_ptr + offs, mask=mask)
    b = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, a + b, mask=mask)


@jit
def _row_sum(x_ptr, y_ptr, ncols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + row * ncols + cols, mask=cols < ncols, other=0.0)
    tl.store(y_ptr + row, tl.sum(v, axis=0))


@jit
def _masked_off(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < 0, other=1.0)
    tl.store(y_ptr + offs, v)


@jit
def _atomic_sum(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.atomic_add(out_ptr + offs * 0, tl.load(x_ptr + offs, mask=mask, other=0.0), mask=mask)


@jit
def _descriptor_copy(x_ptr, y_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    src = tl.make_tensor_descriptor(x_ptr, [M, N], [N, 1], [BM, BN])
    dst = tl.make_tensor_descriptor(y_ptr, [M, N], [N, 1], [BM, BN])
    dst.store([pid * BM, 0], src.load([pid * BM, 0]))


def _launch_copy(x, y, block=256):
    n = x.numel()
    _copy[(triton.cdiv(n, block),)](x, y, n, BLOCK=block)


def test_masked_copy_fp32():
    x = torch.randn(1000)
    y = torch.empty_like(x)
    with count_traffic() as t:
        _launch_copy(x, y)
    assert torch.equal(x, y)
    # 4 programs of 256 lanes, 24 lanes of the last one masked off (other=0.0 reads nothing)
    assert (t.load_bytes, t.store_bytes, t.loads, t.stores) == (4000, 4000, 4, 4)
    assert t.total_bytes == 8000
    assert t.atomics == 0 and t.by_tensor == {} and t.unattributed is None


def test_masked_copy_fp16():
    x = torch.randn(1000).half()
    y = torch.empty_like(x)
    with count_traffic() as t:
        _launch_copy(x, y)
    assert torch.equal(x, y)
    assert (t.load_bytes, t.store_bytes, t.loads, t.stores) == (2000, 2000, 4, 4)


def test_same_pointer_loaded_twice_counts_twice():
    x = torch.randn(1000)
    y = torch.empty_like(x)
    with count_traffic() as t:
        _load_twice[(4,)](x, y, 1000, BLOCK=256)
    torch.testing.assert_close(y, 2 * x)
    assert (t.load_bytes, t.store_bytes, t.loads, t.stores) == (8000, 4000, 8, 4)


def test_row_sum():
    x = torch.randn(8, 100)
    y = torch.empty(8)
    with count_traffic() as t:
        _row_sum[(8,)](x, y, 100, BLOCK=128)
    torch.testing.assert_close(y, x.sum(1))
    assert (t.load_bytes, t.store_bytes, t.loads, t.stores) == (8 * 100 * 4, 8 * 4, 8, 8)


def test_fully_masked_off_load_counts_zero():
    x = torch.randn(64)
    y = torch.empty(64)
    with count_traffic() as t:
        _masked_off[(1,)](x, y, BLOCK=64)
    assert torch.equal(y, torch.ones(64))
    assert (t.load_bytes, t.loads) == (0, 1)
    assert (t.store_bytes, t.stores) == (64 * 4, 1)


def test_per_tensor_breakdown():
    x = torch.randn(1000)
    y = torch.empty_like(x)
    other = torch.randn(10)
    with count_traffic(tensors={"x": x, "y": y, "other": other}) as t:
        _launch_copy(x, y)
    assert t.by_tensor["x"] == TensorTraffic(load_bytes=4000, store_bytes=0)
    assert t.by_tensor["y"] == TensorTraffic(load_bytes=0, store_bytes=4000)
    assert t.by_tensor["other"].total_bytes == 0
    assert t.unattributed.total_bytes == 0
    with count_traffic(tensors={"x": x}) as t:
        _launch_copy(x, y)
    assert t.by_tensor["x"].load_bytes == 4000 and t.unattributed == TensorTraffic(0, 4000)


def test_per_tensor_views():
    # a row of a matrix: its span is its own bytes, not the whole storage
    x = torch.randn(4, 250)
    y = torch.empty(1000)
    with count_traffic(tensors={"row1": x[1], "x": x}) as t:
        _launch_copy(x, y)
    assert t.by_tensor["row1"].load_bytes == 1000
    assert t.by_tensor["x"].load_bytes == 3000
    assert t.unattributed == TensorTraffic(0, 4000)


def test_nested_counters():
    x = torch.randn(1000)
    y = torch.empty_like(x)
    with count_traffic() as outer:
        _launch_copy(x, y)
        with count_traffic() as inner:
            _launch_copy(x, y)
        _launch_copy(x, y)
    assert inner.load_bytes == 4000 and outer.load_bytes == 12000
    assert outer.stores == 12 and inner.stores == 4


def test_patches_removed_on_exit_and_on_error():
    from triton.runtime import interpreter
    originals = {n: interpreter.InterpreterBuilder.__dict__[n]
                 for n in ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas")}
    native = interpreter._interpreter
    with count_traffic():
        assert interpreter.InterpreterBuilder.__dict__["create_masked_load"] is not originals["create_masked_load"]
    with pytest.raises(KeyError):
        with count_traffic():
            raise KeyError("boom")
    for n, f in originals.items():
        assert interpreter.InterpreterBuilder.__dict__[n] is f
    assert interpreter._interpreter is native
    # launches outside a counter are not counted by a finished one
    x = torch.randn(1000)
    with count_traffic() as t:
        pass
    _launch_copy(x, torch.empty_like(x))
    assert t.total_bytes == 0 and t.loads == 0


def test_atomics_counted_or_rejected():
    x = torch.ones(1000)
    out = torch.zeros(1)
    with count_traffic() as t:
        _atomic_sum[(4,)](x, out, 1000, BLOCK=256)
    assert out.item() == 1000
    assert (t.loads, t.stores, t.atomics) == (4, 0, 4)
    assert t.atomic_bytes == 4000
    assert (t.load_bytes, t.store_bytes) == (4000 + 4000, 4000)  # an RMW reads and writes its lanes
    with pytest.raises(Exception, match="atomic"):
        with count_traffic(reject_atomics=True):
            _atomic_sum[(4,)](x, out, 1000, BLOCK=256)


def test_tensor_descriptor_counts_in_bounds_lanes():
    x = torch.randn(10, 16)
    y = torch.zeros_like(x)
    with count_traffic(tensors={"x": x, "y": y}) as t:
        _descriptor_copy[(3,)](x, y, 10, 16, BM=4, BN=16)
    assert torch.equal(x, y)
    # blocks of rows 0-3, 4-7, 8-11: rows 10 and 11 are out of bounds
    assert (t.load_bytes, t.store_bytes, t.loads, t.stores) == (640, 640, 3, 3)
    assert t.by_tensor["x"].load_bytes == 640 and t.by_tensor["y"].store_bytes == 640


def test_rejects_device_tensors_for_attribution():
    meta = torch.empty(4, device="meta")
    with pytest.raises(ValueError, match="CPU"):
        with count_traffic(tensors={"m": meta}):
            pass


def test_softmax_through_tilefuse():
    m = torch.nn.Softmax(-1)
    x = torch.randn(8, 64)
    c = tilefuse.compile(m, (x,))
    with count_traffic() as t:
        out = c(x)
    torch.testing.assert_close(out, m(x))
    assert t.store_bytes == 8 * 64 * 4
    assert t.load_bytes >= 8 * 64 * 4
    assert t.loads >= 1 and t.stores >= 1


def test_uncounted_memory_path_raises(monkeypatch):
    # a builder path that reaches the native load without going through create_masked_load
    # (as a future Triton might) must fail loudly rather than be missed
    import numpy as np
    from triton.runtime import interpreter

    def create_load(self, ptr, *args):
        mask = np.ones_like(ptr.data, dtype=bool)
        dtype = interpreter._get_np_dtype(ptr.get_element_ty())
        data = interpreter._interpreter.load(ptr.data, mask, np.zeros_like(ptr.data, dtype=dtype), dtype)
        return interpreter.TensorHandle(data, ptr.get_element_ty())

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_load", create_load)
    x = torch.randn(256)
    y = torch.empty_like(x)
    _unmasked_copy[(1,)](x, y, BLOCK=256)  # outside a counter: runs
    assert torch.equal(x, y)
    with pytest.raises(Exception, match=f"{UnsupportedMemoryOp.__name__}|outside the builder methods"):
        with count_traffic():
            _unmasked_copy[(1,)](x, y, BLOCK=256)


@jit
def _unmasked_copy(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs))


def test_unmasked_and_scalar_accesses():
    x = torch.randn(256)
    y = torch.empty_like(x)
    with count_traffic() as t:
        _unmasked_copy[(1,)](x, y, BLOCK=256)
        _row_sum[(1,)](x, y, 256, BLOCK=256)  # one scalar store: one lane
    assert (t.load_bytes, t.store_bytes, t.loads, t.stores) == (2048, 1028, 2, 2)


@jit
def _block_ptr_copy(x_ptr, y_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
    pid = tl.program_id(0)
    src = tl.make_block_ptr(x_ptr, (M, N), (N, 1), (pid * BM, 0), (BM, BN), (1, 0))
    dst = tl.make_block_ptr(y_ptr, (M, N), (N, 1), (pid * BM, 0), (BM, BN), (1, 0))
    tl.store(dst, tl.load(src, boundary_check=(0, 1)), boundary_check=(0, 1))


def test_block_pointer_counts_in_bounds_lanes():
    x = torch.randn(10, 16)
    y = torch.zeros_like(x)
    try:
        with count_traffic() as t:
            _block_ptr_copy[(3,)](x, y, 10, 16, BM=4, BN=16)
    except Exception as e:  # Triton >= 3.7 removed block pointers
        if "removed" in str(e):
            pytest.skip("this Triton has no block pointers")
        raise
    assert torch.equal(x, y)
    assert (t.load_bytes, t.store_bytes, t.loads, t.stores) == (640, 640, 3, 3)
