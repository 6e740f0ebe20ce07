"""The onnx package's backend test data through ``tilefuse.compile_onnx``.

Two groups, one test per case:
- model cases: ``onnx/backend/test/data/{simple,pytorch-converted,pytorch-operator}`` (140 models),
  through the whole pipeline with generated kernels: ``tilefuse.compile_onnx(model).run(feeds)``
  (backend ``triton``, the interpreter on a CPU machine);
- node cases: every node test the onnx package generates (``onnx.backend.test.loader``; recent onnx
  wheels no longer ship ``data/node`` as files, so the cases are built in memory as onnx does),
  through frontend, fission and simplification, evaluated by the reference executor (this checks
  frontend and fission rules); and through the whole pipeline with generated kernels
  (``test_node_case_through_kernels``: a sample by default, every case with ``--runslow``).

A case passes if every output matches (shape, dtype, and values: float32/64 rtol 1e-3 atol 1e-4,
float16 rtol/atol 1e-2/1e-3, bfloat16 2e-2/1e-2, integers and bools exactly).  It is an accepted
failure only if compilation raises a ``TilefuseError`` saying something is unsupported and naming
the node.  A wrong answer, or any other exception, fails.

tilefuse compiles static graphs, so a case that feeds a *parameter* (Reshape's shape, ReduceSum's
axes, Range's limit, ... an input the canonical op set turns into an attribute) as a graph input is
compiled specialized for the fed value: that input becomes an initializer.  Skipped, with reasons
listed in ``SKIPS``: cases whose inputs or outputs are sequences/optionals (no tensor to feed or
compare) and cases whose outputs are random.
"""
from __future__ import annotations

import functools
import glob
import math
import os
import re
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

import tilefuse
from tilefuse.errors import TilefuseError
from tilefuse.fission import fission
from tilefuse.frontend.onnx import import_onnx
from tilefuse.ir.evaluate import run_reference
from tilefuse.transform.simplify import simplify_graph
from tilefuse.frontend.onnx_fold import NONDETERMINISTIC
from tilefuse.frontend.onnx_normalize import LIFT

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
MODEL_KINDS = ("simple", "pytorch-converted", "pytorch-operator")
BACKEND = "triton"
MIN_PASS_FRACTION = 0.9
TOLERANCES = {np.dtype(np.float64): (1e-3, 1e-4), np.dtype(np.float32): (1e-3, 1e-4),
              np.dtype(np.float16): (1e-2, 1e-3), "bfloat16": (2e-2, 1e-2)}
# Operators whose inputs are all parameters (their result is folded at import time).
FOLD_ONLY = frozenset({"Range", "ConstantOfShape", "HannWindow", "HammingWindow", "BlackmanWindow",
                       "MelWeightMatrix"})
SKIPS = {
    "sequence": "sequence/optional inputs or outputs: tilefuse graphs take and return tensors",
    "random": "random outputs (Bernoulli, Random*, Multinomial) cannot be compared",
}


# ---------------------------------------------------------------------- cases
def _model_dirs() -> list[str]:
    dirs = []
    for kind in MODEL_KINDS:
        dirs += sorted(d for d in glob.glob(os.path.join(DATA, kind, "test_*")) if os.path.isdir(d))
    return dirs


def _load_model_case(d: str):
    model = onnx.load(os.path.join(d, "model.onnx"))
    data = os.path.join(d, "test_data_set_0")
    ins = [onnx.load_tensor(f) for f in sorted(glob.glob(os.path.join(data, "input_*.pb")), key=_pb_index)]
    outs = [onnx.load_tensor(f) for f in sorted(glob.glob(os.path.join(data, "output_*.pb")), key=_pb_index)]
    return model, ins, outs


def _pb_index(path: str) -> int:
    return int(re.search(r"_(\d+)\.pb$", path).group(1))


@functools.lru_cache(maxsize=None)
def _node_cases() -> dict:
    from onnx.backend.test.loader import load_node_model_tests
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        return {t.name: t for t in load_node_model_tests()}


# ---------------------------------------------------------------------- running one case
def _array(x):
    if isinstance(x, onnx.TensorProto):
        return numpy_helper.to_array(x).copy()      # writable, for torch.from_numpy
    if isinstance(x, np.generic):                   # some cases give scalars as numpy scalars
        return np.asarray(x)
    return x


def _skip_reason(model: onnx.ModelProto, ins, outs) -> str | None:
    if any(not isinstance(_array(x), np.ndarray) for x in list(ins) + list(outs)):
        return SKIPS["sequence"]
    if any(vi.type.WhichOneof("value") != "tensor_type" for vi in list(model.graph.input) + list(model.graph.output)):
        return SKIPS["sequence"]
    if any(nd.op_type in NONDETERMINISTIC for nd in model.graph.node):
        return SKIPS["random"]
    return None


def _param_inputs(model: onnx.ModelProto) -> set[str]:
    """Graph inputs fed to a parameter position (see the module docstring)."""
    names = set()
    for nd in model.graph.node:
        if nd.op_type in FOLD_ONLY:
            names.update(nd.input)
        for idx, _, _ in LIFT.get(nd.op_type, ()):
            if idx < len(nd.input):
                names.add(nd.input[idx])
    return names


def _prepare(model: onnx.ModelProto, ins) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model with parameter inputs frozen, and the feeds for its remaining inputs."""
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    feeds = dict(zip(names, (_array(x) for x in ins)))
    frozen = _param_inputs(model) & set(feeds)
    if frozen:
        m = onnx.ModelProto()
        m.CopyFrom(model)
        for name in sorted(frozen):
            m.graph.initializer.append(numpy_helper.from_array(feeds.pop(name), name))
        model = m
    return model, feeds


def _feed(v: np.ndarray) -> torch.Tensor:
    """Feeds as torch tensors: numpy has no bfloat16 (onnx gives ml_dtypes arrays), and
    CompiledModel.run's numpy path makes 0-d arrays 1-D (np.ascontiguousarray)."""
    if v.dtype.name == "bfloat16":
        return torch.from_numpy(v.view(np.uint16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(v, copy=True))


def _node_names(model: onnx.ModelProto) -> list[str]:
    return [nd.name or f"{nd.op_type}_{k}" for k, nd in enumerate(model.graph.node)]


class _Prims:
    """Frontend + fission + simplification, evaluated by the reference executor (no planning)."""

    def __init__(self, model, **options):
        self.graph = import_onnx(model, **options).graph
        self.primgraph = simplify_graph(fission(self.graph))

    def run(self, feeds: dict[str, torch.Tensor]) -> list[np.ndarray]:
        outs = run_reference(self.primgraph, feeds)
        return [(o.float() if o.dtype is torch.bfloat16 else o).numpy() for o in outs]


def run_case(model: onnx.ModelProto, ins, outs, full: bool = True, **options) -> str:
    """'pass', or 'accepted: <message>' for an accepted failure; raises AssertionError otherwise.
    ``full``: through tilefuse.compile_onnx (with ``options``); else frontend + fission + reference
    executor."""
    model, feeds = _prepare(model, ins)
    compile_ = (lambda m, **kw: tilefuse.compile_onnx(m, backend=BACKEND, **kw, **options)) if full else _Prims
    try:
        compiled = compile_(model, input_shapes={k: v.shape for k, v in feeds.items()})
    except TilefuseError as e:
        msg = str(e)
        named = any(f"node '{name}" in msg for name in _node_names(model))
        assert "unsupported" in msg and named, f"compile failed without naming an unsupported node: {msg}"
        return f"accepted: {msg}"
    got = compiled.run({k: _feed(v) for k, v in feeds.items()})
    expected = [_array(x) for x in outs]
    try:
        assert len(got) == len(expected), f"{len(got)} outputs, expected {len(expected)}"
        for k, (g, e) in enumerate(zip(got, expected)):
            _compare(k, np.asarray(g), np.asarray(e))
    except AssertionError as e:
        raise AssertionError(f"{e}\n{_blame(compiled.graph, feeds, expected)}") from None
    return "pass"


def _blame(graph, feeds, expected) -> str:
    """Whether the frontend's canonical graph (run by onnxruntime) is already wrong."""
    try:
        got = run_canonical(graph, feeds)
        for k, (g, e) in enumerate(zip(got, expected)):
            _compare(k, np.asarray(g), np.asarray(e))
    except AssertionError as e:
        return f"the canonical graph run by onnxruntime is wrong too (a frontend bug?): {e}"
    except Exception as e:  # noqa: BLE001 - diagnostics only
        return f"(could not run the canonical graph with onnxruntime: {type(e).__name__})"
    return "the canonical graph run by onnxruntime is right: a fission/simplify/runtime bug"


# ---------------------------------------------------------------------- canonical graph -> ONNX
# The canonical op set is ONNX opset 21 with parameter inputs as attributes: putting them back
# lets onnxruntime run the frontend's output, which tells frontend bugs from fission bugs.
_AS_INPUTS = {"axes": "Squeeze Unsqueeze " + " ".join(n for n in LIFT if n.startswith("Reduce")),
              "repeats": "Tile", "k": "TopK Trilu", "axis": "CumSum"}


def canonical_to_onnx(graph, opset: int = 21) -> onnx.ModelProto:
    """An ONNX model computing the same as a canonical Graph (the ops the ONNX frontend emits)."""
    inits = [_tensor_proto(c.name, c.data) for c in graph.constants]
    nodes = []

    def const(vals, dtype) -> str:
        name = f"__param{len(inits)}"
        inits.append(numpy_helper.from_array(np.array(vals, dtype=dtype), name))
        return name

    for n in graph.nodes:
        a, ins, op = dict(n.attrs), list(n.inputs), n.op
        out = graph.types[n.outputs[0]] if n.outputs and n.outputs[0] else None
        for key, ops in _AS_INPUTS.items():
            if op in ops.split() and key in a:
                ins = ins[:1] + [const(np.reshape(a.pop(key), -1 if key != "axis" else ()), np.int64)]
        if op == "Slice":
            ins = ins[:1] + [const(a.pop(k), np.int64) for k in ("starts", "ends", "axes", "steps")]
        elif op == "Pad":
            ins = [ins[0], const(a.pop("pads"), np.int64), ins[1] if len(ins) > 1 else ""]
        elif op == "Split":
            ins = ins[:1] + [const(a.pop("split"), np.int64)]
        elif op in ("Reshape", "Expand"):
            ins = ins[:1] + [const(out.shape, np.int64)]
            a = {"allowzero": 1} if op == "Reshape" else {}
        elif op == "OneHot":
            ins = [ins[0], const(a.pop("depth"), np.int64), ins[1]]
        elif op == "Dropout":
            op = "Identity"
        elif op == "Resize":
            scales, roi = a.pop("scales"), a.pop("roi", None)
            shape = graph.types[ins[0]].shape
            exact = all(int(np.floor(d * s)) == o for d, s, o in zip(shape, scales, out.shape))
            ins = [ins[0], const(roi, np.float32) if roi else "",
                   *([const(scales, np.float32)] if exact else ["", const(out.shape, np.int64)])]
        nodes.append(helper.make_node(op, ins, list(n.outputs), name=n.name, **a))

    def vi(name, t):
        return helper.make_tensor_value_info(name, t.dtype.to_onnx(), t.shape)
    g = helper.make_graph(nodes, graph.name, [vi(d.name, d.type) for d in graph.inputs],
                          [vi(o, graph.types[o]) for o in graph.outputs], initializer=inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _tensor_proto(name: str, t: torch.Tensor) -> onnx.TensorProto:
    if t.dtype is torch.bfloat16:
        return helper.make_tensor(name, onnx.TensorProto.BFLOAT16, t.shape,
                                  t.contiguous().view(torch.int16).numpy().astype(np.uint16).tobytes(), raw=True)
    return numpy_helper.from_array(t.numpy(), name)


def run_canonical(graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Run with onnxruntime, or onnx's reference evaluator where onnxruntime lacks a kernel or
    departs from the spec (Resize align_corners with non-integer scaled lengths)."""
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator
    model = canonical_to_onnx(graph)
    feeds = {d.name: feeds[d.name] for d in graph.inputs}
    if not any(n.op == "Resize" for n in graph.nodes):
        try:
            sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            return sess.run(None, feeds)
        except Exception:  # noqa: BLE001 - onnxruntime's errors have no common base class
            pass
    return ReferenceEvaluator(model).run(None, feeds)


def _compare(k: int, got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, f"output {k}: shape {got.shape}, expected {want.shape}"
    if got.dtype.name == "bfloat16":        # from onnxruntime (tilefuse gives float32)
        got = got.astype(np.float32)
    if want.dtype.name == "bfloat16":
        rtol, atol = TOLERANCES["bfloat16"]
        assert got.dtype == np.float32, f"output {k}: dtype {got.dtype}, expected bfloat16 (as float32)"
        want = want.astype(np.float32)
    else:
        assert got.dtype == want.dtype, f"output {k}: dtype {got.dtype}, expected {want.dtype}"
        rtol, atol = TOLERANCES.get(want.dtype, (0, 0))
    if want.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=f"output {k}")
    else:
        np.testing.assert_array_equal(got, want, err_msg=f"output {k}")


def _check(outcome: str) -> None:
    if outcome.startswith("skip: "):
        pytest.skip(outcome[6:])
    if outcome != "pass":
        pytest.xfail(outcome)


@functools.lru_cache(maxsize=None)
def _model_outcome(case_dir: str) -> str:
    """Shared by the per-case tests and the summary (the pipeline runs once per case)."""
    model, ins, outs = _load_model_case(case_dir)
    reason = _skip_reason(model, ins, outs)
    return f"skip: {reason}" if reason else run_case(model, ins, outs)


# ---------------------------------------------------------------------- tests
@pytest.mark.parametrize("case_dir", _model_dirs(), ids=lambda d: f"{os.path.basename(os.path.dirname(d))}/"
                                                                     f"{os.path.basename(d)}")
def test_model_case(case_dir):
    _check(_model_outcome(case_dir))


@pytest.mark.parametrize("name", sorted(_node_cases()))
def test_node_case(name):
    case = _node_cases()[name]
    ins, outs = case.data_sets[0]
    reason = _skip_reason(case.model, ins, outs)
    _check(f"skip: {reason}" if reason else run_case(case.model, ins, outs, full=False))


# Every node case also runs through the whole pipeline with generated kernels (the optimal plan,
# fused where it pays): a sample of every NODE_SAMPLE-th case by default, all with --runslow
# (about 6 minutes on 2 cores).
NODE_SAMPLE = 6


def pytest_generate_tests(metafunc):
    if metafunc.function.__name__ == "test_node_case_through_kernels":
        names = sorted(_node_cases())
        if not metafunc.config.getoption("--runslow"):
            names = names[::NODE_SAMPLE]
        metafunc.parametrize("name", names)


def test_node_case_through_kernels(name):
    case = _node_cases()[name]
    ins, outs = case.data_sets[0]
    reason = _skip_reason(case.model, ins, outs)
    _check(f"skip: {reason}" if reason else run_case(case.model, ins, outs, full=True, time_limit=1.0))


def test_model_cases_mostly_pass():
    """At least 90% of the model cases compile and match (accepted failures count as not passing)."""
    dirs = _model_dirs()
    assert len(dirs) >= 100, f"only {len(dirs)} model cases found under {DATA}"
    failed = {}
    for d in dirs:
        try:
            outcome = _model_outcome(d)
        except Exception as e:  # noqa: BLE001 - any failure counts against the fraction
            outcome = f"{type(e).__name__}: {e}"
        if outcome != "pass":
            failed[os.path.basename(d)] = outcome.splitlines()[0][:160]
    need = math.ceil(MIN_PASS_FRACTION * len(dirs))
    passed = len(dirs) - len(failed)
    assert passed >= need, (f"{passed}/{len(dirs)} model cases pass, need {need}:\n"
                            + "\n".join(f"  {k}: {v}" for k, v in sorted(failed.items())))
