"""Layout fission rules against torch / onnx.reference on random inputs with edge attributes."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper
from onnx.reference import ReferenceEvaluator
from opcheck import check_op, run_op

from tilefuse.analysis.classify import classify
from tilefuse.errors import UnsupportedAttribute
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.expr import Const, Load, Select, walk
from tilefuse.ir.printer import format_prim

INT_MAX = 2**63 - 1
gen = torch.Generator().manual_seed(0)


def rand(*shape, dtype=torch.float32):
    x = torch.randn(shape, generator=gen)
    return x if dtype.is_floating_point else (x * 10).to(dtype)


def onnx_ref(op, inputs, attrs=None, n_out=1):
    """Run one ONNX node with onnx.reference (inputs: numpy arrays, None = omitted)."""
    names = [f"i{k}" if a is not None else "" for k, a in enumerate(inputs)]
    node = helper.make_node(op, names, [f"o{k}" for k in range(n_out)], **(attrs or {}))
    feeds = {n: a for n, a in zip(names, inputs) if n}
    return [np.ascontiguousarray(r) for r in ReferenceEvaluator(node).run(None, feeds)]


def moves_data_only(p) -> bool:
    """The value part of the body is loads, Selects and constants (arithmetic only in indices/conds)."""
    def ok(e):
        if isinstance(e, (Load, Const)):
            return True
        return isinstance(e, Select) and ok(e.a) and ok(e.b)
    return ok(p.body)


def assert_layout(pg, allowed=("layout",)):
    for p in pg.prims:
        assert moves_data_only(p), format_prim(p)
        assert classify(p).value in allowed, (classify(p), format_prim(p))


# ---------------------------------------------------------------- reshape family

@pytest.mark.parametrize("src,dst", [
    ((2, 3, 4, 5), (6, 20)), ((6, 20), (2, 3, 4, 5)), ((6, 4), (4, 6)), ((1, 3, 1, 5), (15,)),
    ((15,), (3, 1, 5, 1)), ((2, 3, 4), (24,)), ((3, 10), (5, 6)), ((7,), (7,)), ((), (1, 1)),
    ((2, 0, 3), (0, 6)), ((4, 9, 2), (2, 2, 3, 3, 2)),
])
def test_reshape(src, dst):
    x = rand(*src)
    pg = check_op("Reshape", [x], x.reshape(dst))
    assert all(moves_data_only(p) for p in pg.prims)


def test_flatten_squeeze_unsqueeze():
    x = rand(2, 1, 3, 5)
    check_op("Flatten", [x], x.reshape(2, 15), attrs={"axis": -3})
    check_op("Flatten", [x], x.reshape(1, 30), attrs={"axis": 0})
    assert_layout(check_op("Squeeze", [x], x.squeeze(1), attrs={"axes": (-3,)}), ("broadcast",))
    assert_layout(check_op("Unsqueeze", [x], x[:, :, None, :, :, None], attrs={"axes": (2, -1)}),
                  ("broadcast",))
    i = rand(3, 4, dtype=torch.int64)
    check_op("Reshape", [i], i.reshape(4, 3))


def body_size(p) -> int:
    """Distinct expression nodes in the body (shared sub-expressions count once)."""
    return len(list(walk(p.body)))


def test_reshape_index_expressions_stay_small():
    x = rand(2, 3, 4, 5)
    fwd = check_op("Reshape", [x], x.reshape(6, 20)).prims[0]
    back = check_op("Reshape", [x.reshape(6, 20)], x).prims[0]
    print(format_prim(fwd))
    print(format_prim(back))
    # a pure split: each input index is one floordiv or one mod of an output index
    assert [str(i) for i in fwd.body.index] == ["i0 // 3", "i0 % 3", "i1 // 5", "i1 % 5"]
    # a pure merge: one affine term per pair of dims
    assert [str(i) for i in back.body.index] == ["i0 * 3 + i1", "i2 * 5 + i3"]
    assert classify(fwd).value == classify(back).value == "layout"
    # a deep mixed reshape grows linearly with rank, not exponentially
    y = rand(2, 3, 4, 5, 6, 7)
    deep = check_op("Reshape", [y], y.reshape(4, 5, 9, 7, 4)).prims[0]
    assert body_size(deep) <= 40, format_prim(deep)


def test_expand():
    x = rand(3, 1)
    pg = check_op("Expand", [x], x.expand(2, 3, 4))
    assert_layout(pg, ("layout", "broadcast"))
    s = rand(1)
    check_op("Expand", [s], s.expand(5))


# ---------------------------------------------------------------- permutations and blocks

@pytest.mark.parametrize("perm", [None, (0, 2, 1, 3), (3, 1, 0, 2), (1, 0, 2, 3)])
def test_transpose(perm):
    x = rand(2, 3, 1, 5)
    want = x.permute(*(perm or (3, 2, 1, 0)))
    pg = check_op("Transpose", [x], want, attrs={} if perm is None else {"perm": perm})
    assert_layout(pg)


def test_transpose_bad_perm():
    x = rand(2, 3)
    with pytest.raises(UnsupportedAttribute, match="perm"):
        run_op("Transpose", [x], [TensorType((3, 2), DType.float32)], attrs={"perm": (0, 0)})


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space(mode):
    x = rand(2, 12, 3, 5)
    want = torch.from_numpy(onnx_ref("DepthToSpace", [x.numpy()], {"blocksize": 2, "mode": mode})[0])
    assert_layout(check_op("DepthToSpace", [x], want, attrs={"blocksize": 2, "mode": mode}))
    if mode == "CRD":
        torch.testing.assert_close(want, torch.nn.functional.pixel_shuffle(x, 2))


@pytest.mark.parametrize("mode", ["DCR", "CRD"])     # mode is an opset-28 attribute; DCR before
def test_space_to_depth(mode):
    x = rand(2, 3, 6, 9)
    want = torch.from_numpy(onnx_ref("SpaceToDepth", [x.numpy()], {"blocksize": 3, "mode": mode})[0])
    assert_layout(check_op("SpaceToDepth", [x], want, attrs={"blocksize": 3, "mode": mode}))
    back = check_op("DepthToSpace", [want], x, attrs={"blocksize": 3, "mode": mode})
    assert_layout(back)


def test_depth_to_space_bad_mode():
    x = rand(1, 4, 2, 2)
    with pytest.raises(UnsupportedAttribute, match="mode"):
        run_op("DepthToSpace", [x], [TensorType((1, 1, 4, 4), DType.float32)], attrs={"blocksize": 2, "mode": "X"})


# ---------------------------------------------------------------- concat, split

@pytest.mark.parametrize("axis", [1, -1, 0])
def test_concat(axis):
    shapes = {1: [(2, 3, 4), (2, 1, 4), (2, 5, 4)], -1: [(2, 3, 1), (2, 3, 7), (2, 3, 0), (2, 3, 2)],
              0: [(1, 3), (4, 3)]}[axis]
    xs = [rand(*s) for s in shapes]
    pg = check_op("Concat", xs, torch.cat(xs, axis), attrs={"axis": axis})
    assert_layout(pg)


def test_concat_int_and_constant_input():
    a, b = rand(3, 2, dtype=torch.int32), rand(3, 5, dtype=torch.int32)
    check_op("Concat", [a, b], torch.cat([a, b], 1), attrs={"axis": -1}, const=(1,))


@pytest.mark.parametrize("axis,split,n", [(1, (2, 5, 0, 3), 4), (-1, None, 3), (0, None, 2), (-3, (1, 3), 2)])
def test_split(axis, split, n):
    x = rand(4, 10, 7)
    size = x.shape[axis]
    sizes = list(split) if split else [min(-(-size // n), size - k * -(-size // n)) for k in range(n)]
    want = list(torch.split(x, sizes, axis))
    pg = check_op("Split", [x], want, attrs={"axis": axis, **({"split": split} if split else {})})
    assert_layout(pg, ("layout", "elementwise"))     # the first piece reads x at its own index


# ---------------------------------------------------------------- slice

SLICES = [
    # starts, ends, axes, steps
    ((1, 0), (3, INT_MAX), (0, 2), (1, 2)),
    ((-1,), (-INT_MAX,), (1,), (-1,)),              # full reverse
    ((INT_MAX,), (0,), (-1,), (-2,)),               # start clamped to dim-1, end excluded
    ((-3, 5), (-1, 100), (-2, 0), (1, 1)),
    ((2,), (1,), (0,), (1,)),                        # empty
    ((10,), (-10,), (2,), (-3,)),                    # clamped both sides, negative step
    ((0, 1, 1), (1, 2, 3), (0, 1, 2), (1, 1, 1)),
    ((-100,), (100,), (1,), (3,)),
]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice(starts, ends, axes, steps):
    x = rand(3, 5, 7)
    arr = [np.array(v, dtype=np.int64) for v in (starts, ends, axes, steps)]
    want = torch.from_numpy(onnx_ref("Slice", [x.numpy(), *arr])[0])
    pg = check_op("Slice", [x], want, attrs={"starts": starts, "ends": ends, "axes": axes, "steps": steps})
    if want.numel():
        assert_layout(pg, ("layout", "elementwise", "broadcast"))


def test_slice_default_axes_and_steps():
    x = rand(6, 4)
    check_op("Slice", [x], x[1:-1, :3], attrs={"starts": (1, 0), "ends": (-1, 3)})


def test_slice_step_zero():
    x = rand(3)
    with pytest.raises(UnsupportedAttribute, match="step"):
        run_op("Slice", [x], [TensorType((3,), DType.float32)],
               attrs={"starts": (0,), "ends": (3,), "axes": (0,), "steps": (0,)})


# ---------------------------------------------------------------- pad

@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("pads", [(0, 1, 2, 0, 3, 1), (1, 0, 0, 2, 2, 6), (0, 0, 0, 0, 0, 0)])
def test_pad_modes(mode, pads):
    x = rand(2, 3, 4)
    want = torch.from_numpy(onnx_ref("Pad", [x.numpy(), np.array(pads, dtype=np.int64)], {"mode": mode})[0])
    pg = check_op("Pad", [x], want, attrs={"pads": pads, "mode": mode})
    assert_layout(pg, ("layout", "elementwise"))


def test_pad_constant_value_runtime_and_constant():
    x = rand(3, 4)
    pads = (1, 2, 0, 3)
    cv = torch.tensor(2.5)
    want = torch.nn.functional.pad(x, (2, 3, 1, 0), value=2.5)
    for const in ((), (1,)):
        pg = check_op("Pad", [x, cv], want, attrs={"pads": pads, "mode": "constant"}, const=const)
        assert_layout(pg)
    xi = rand(4, 2, dtype=torch.int64)
    check_op("Pad", [xi, torch.tensor([-7])], torch.nn.functional.pad(xi, (1, 1, 0, 2), value=-7),
             attrs={"pads": (0, 1, 2, 1)})


def onnxruntime_pad(x, pads, mode):
    import onnxruntime as ort
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x.shape)],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                          [onnx.numpy_helper.from_array(np.array(pads, dtype=np.int64), "p")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return torch.from_numpy(sess.run(None, {"x": x.numpy()})[0])


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_negative_crops(mode):
    x = rand(4, 6)
    pads = (-1, 2, 1, -3)      # crop 1 row at the top, 3 columns at the right
    want = onnxruntime_pad(x, pads, mode)
    check_op("Pad", [x], want, attrs={"pads": pads, "mode": mode})


def test_pad_wide_reflect_and_size_one():
    x = rand(3, 1)
    pads = (5, 2, 4, 1)        # wider than the input: numpy repeats the reflection
    for mode in ("reflect", "wrap", "edge"):
        want = torch.from_numpy(onnx_ref("Pad", [x.numpy(), np.array(pads, dtype=np.int64)], {"mode": mode})[0])
        check_op("Pad", [x], want, attrs={"pads": pads, "mode": mode})


def test_pad_bad_mode():
    with pytest.raises(UnsupportedAttribute, match="mode"):
        run_op("Pad", [rand(2)], [TensorType((4,), DType.float32)], attrs={"pads": (1, 1), "mode": "mirror"})


# ---------------------------------------------------------------- tile, trilu

@pytest.mark.parametrize("shape,reps", [((2, 3), (2, 3)), ((1, 5, 3), (4, 1, 2)), ((3,), (0,))])
def test_tile(shape, reps):
    x = rand(*shape)
    pg = check_op("Tile", [x], x.repeat(*reps), attrs={"repeats": reps})
    if x.repeat(*reps).numel():
        assert_layout(pg, ("layout", "broadcast"))


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [0, 2, -1, -7])
def test_trilu(upper, k):
    x = rand(2, 4, 6)
    want = torch.triu(x, k) if upper else torch.tril(x, k)
    pg = check_op("Trilu", [x], want, attrs={"upper": upper, "k": k})
    assert_layout(pg, ("elementwise",))
    assert all(moves_data_only(p) for p in pg.prims)


def test_trilu_runtime_k_and_bool():
    x = rand(5, 3) > 0
    check_op("Trilu", [x, torch.tensor(1)], torch.tril(x, 1), attrs={"upper": 0})
    check_op("Trilu", [x], torch.triu(x), attrs={})


# ---------------------------------------------------------------- ReverseSequence

@pytest.mark.parametrize("time_axis,batch_axis", [(0, 1), (1, 0)])
def test_reverse_sequence(time_axis, batch_axis):
    x = torch.randn(4, 3, 2) if time_axis == 0 else torch.randn(3, 4, 2)
    lens = torch.tensor([4, 1, 2], dtype=torch.int64)
    want = x.clone()
    for b, n in enumerate(lens.tolist()):
        sl = [slice(None)] * 3
        sl[batch_axis], sl[time_axis] = b, slice(0, n)
        want[tuple(sl)] = x[tuple(sl)].flip(0)
    check_op("ReverseSequence", [x, lens], want, attrs={"time_axis": time_axis, "batch_axis": batch_axis})


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_writes_each_batch_at_its_index(mode):
    cache, update = torch.randn(3, 2, 6, 4), torch.randn(3, 2, 3, 4)
    where = torch.tensor([0, 2, 4 if mode == "circular" else 3])
    want = cache.clone()
    for b in range(3):
        for s in range(3):
            pos = int(where[b]) + s
            want[b, :, pos % 6 if mode == "circular" else pos] = update[b, :, s]
    check_op("TensorScatter", [cache, update, where], want, attrs={"mode": mode, "axis": -2})
