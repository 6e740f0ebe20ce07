"""ONNX conformance: the onnx package's backend test data through tilefuse, and the checked-in
expectations (``tests/onnx_expectations.json``) the tests hold every case to.

Four kinds of case, one test each (``tests/test_onnx_backend.py``, ``tests/test_onnx_frontend.py``):
- ``test_model_case``: ``onnx/backend/test/data/{simple,pytorch-converted,pytorch-operator}``
  (140 models) through the whole pipeline with generated kernels:
  ``tilefuse.compile_onnx(model).run(feeds)`` (backend ``triton``, the interpreter on a CPU machine);
- ``test_node_case``: every node test the onnx package generates (``onnx.backend.test.loader``;
  recent onnx wheels no longer ship ``data/node`` as files, so the cases are built in memory as
  onnx does), through frontend, fission and simplification, evaluated by the reference executor
  (this checks frontend and fission rules);
- ``test_node_case_through_kernels``: the node cases through the whole pipeline with generated
  kernels (the optimal plan);
- ``test_canonical_graph_matches_onnxruntime``: the frontend alone; its canonical graph, put back
  into ONNX opset 21 and run by onnxruntime, must reproduce the data (every model case, and the node
  cases of the operators normalization rewrites).

A case passes if every output matches (shape, dtype, and values: float32/64 rtol 1e-3 atol 1e-4,
float16 rtol/atol 1e-2/1e-3, bfloat16 2e-2/1e-2, integers and bools exactly).  It is *unsupported*
only if compilation raises a ``TilefuseError`` saying something is unsupported and naming the node;
a wrong answer, or any other exception, fails.  The outcome of every case (``pass``,
``unsupported: <reason>``, ``skip: <reason>``) is recorded in the expectations file, and a case whose
outcome differs from its entry fails (``check``): a regression, or an improvement to record with
``python scripts/conformance.py --update``.

tilefuse compiles static graphs, so a case that feeds a *parameter* (Reshape's shape, ReduceSum's
axes, Range's limit, ... an input the canonical op set turns into an attribute) as a graph input is
compiled specialized for the fed value: that input becomes an initializer.  Skipped, with reasons
listed in ``SKIPS``: cases whose inputs or outputs are sequences/optionals (no tensor to feed or
compare) and cases whose outputs are random.
"""
from __future__ import annotations

import functools
import glob
import json
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
from tilefuse.frontend.onnx_fold import NONDETERMINISTIC
from tilefuse.frontend.onnx_normalize import LIFT
from tilefuse.ir.evaluate import run_reference
from tilefuse.transform.simplify import simplify_graph

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
MODEL_KINDS = ("simple", "pytorch-converted", "pytorch-operator")
BACKEND = "triton"
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
    """The onnx package's node cases by name.  Its loader imports every case module, which
    computes each case's expected outputs (~9 s); every test process (each xdist worker) needs
    them, so the first one pickles them under a lock for this onnx and numpy, and the others load
    that (a file that does not load is made again)."""
    import pickle
    import tempfile

    from filelock import FileLock
    path = os.path.join(tempfile.gettempdir(), f"tilefuse-onnx-node-cases-{onnx.__version__}-{np.__version__}.pkl")
    with FileLock(path + ".lock"):
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except Exception:  # noqa: BLE001 - missing or unreadable: made again below
            pass
        from onnx.backend.test.loader import load_node_model_tests
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            got = {t.name: t for t in load_node_model_tests()}
        with tempfile.NamedTemporaryFile("wb", dir=os.path.dirname(path), delete=False) as f:
            pickle.dump(got, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(f.name, path)
        return got


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


# Control inputs tilefuse needs at import time (it unrolls the loop): parameters too.
CONTROL_PARAMS = {"Loop": (0, 1)}


def _param_inputs(model: onnx.ModelProto) -> set[str]:
    """Graph inputs fed to a parameter position (see the module docstring)."""
    names = set()
    for nd in model.graph.node:
        if nd.op_type in FOLD_ONLY:
            names.update(nd.input)
        names.update(nd.input[k] for k in CONTROL_PARAMS.get(nd.op_type, ()) if k < len(nd.input))
        for idx, _, _ in LIFT.get(nd.op_type, ()):
            if idx < len(nd.input):
                names.add(nd.input[idx])
    return names


def _twin_params(case: str) -> set[str]:
    """An expanded node case (its operator's function body) freezes the inputs its operator's case
    does: the body computes shapes from them."""
    twin = re.sub(r"_expanded(_ver\d+)?$", "", case)
    return _param_inputs(_node_cases()[twin].model) if twin != case and twin in _node_cases() else set()


def _prepare(model: onnx.ModelProto, ins, params=frozenset()) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model with parameter inputs (and ``params``) frozen, and the feeds for its remaining inputs."""
    inits = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    feeds = dict(zip(names, (_array(x) for x in ins)))
    frozen = (_param_inputs(model) | set(params)) & set(feeds)
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


def run_case(model: onnx.ModelProto, ins, outs, full: bool = True, params=frozenset(), **options) -> str:
    """'pass', or 'unsupported: <reason>'; raises AssertionError otherwise.  ``full``: through
    tilefuse.compile_onnx (with ``options``); else frontend + fission + reference executor."""
    model, feeds = _prepare(model, ins, params)
    compile_ = (lambda m, **kw: tilefuse.compile_onnx(m, backend=BACKEND, **kw, **options)) if full else _Prims
    try:
        compiled = compile_(model, input_shapes={k: v.shape for k, v in feeds.items()})
    except TilefuseError as e:
        return _unsupported(model, e)
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
              "repeats": "Tile", "k": "TopK Trilu", "axis": "CumSum CumProd"}


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




# ---------------------------------------------------------------------- outcomes of the four kinds
def outcome_of(kind: str, case: str) -> str:
    """The outcome of one case (``pass``, ``unsupported: ...``, ``skip: ...``); raises
    AssertionError on a wrong answer."""
    if kind == "test_model_case":
        return _model_outcome(case)
    if kind == "test_canonical_graph_matches_onnxruntime":
        return _canonical_outcome(case)
    model, (ins, outs) = _node_cases()[case].model, _node_cases()[case].data_sets[0]
    reason = _skip_reason(model, ins, outs)
    if reason:
        return f"skip: {reason}"
    if kind == "test_node_case":
        return run_case(model, ins, outs, full=False, params=_twin_params(case))
    return run_case(model, ins, outs, full=True, params=_twin_params(case), time_limit=1.0)


@functools.lru_cache(maxsize=None)
def _model_outcome(case: str) -> str:
    """One model case's outcome (memoized: the pipeline runs once per case and process)."""
    model, ins, outs = _load_model_case(os.path.join(DATA, case))
    reason = _skip_reason(model, ins, outs)
    return f"skip: {reason}" if reason else run_case(model, ins, outs)


def _canonical_outcome(case: str) -> str:
    if case in _node_cases():
        model, (ins, outs) = _node_cases()[case].model, _node_cases()[case].data_sets[0]
    else:
        model, ins, outs = _load_model_case(os.path.join(DATA, case))
    reason = _skip_reason(model, ins, outs)
    if reason:
        return f"skip: {reason}"
    model, feeds = _prepare(model, ins)
    try:
        graph = import_onnx(model, input_shapes={k: v.shape for k, v in feeds.items()}).graph
    except TilefuseError as e:
        return _unsupported(model, e)
    got = run_canonical(graph, feeds)
    for k, (g, e) in enumerate(zip(got, [_array(x) for x in outs])):
        _compare(k, np.asarray(g), np.asarray(e))
    return "pass"


# Node cases of the operators normalization rewrites: the canonical test's node cases.
REWRITTEN = ("Resize", "Upsample", "Split", "Slice", "Pad", "Softmax", "LogSoftmax", "Hardmax", "ReduceSum",
             "Clip", "BatchNormalization", "Squeeze", "Unsqueeze", "TopK", "Tile", "GroupNormalization", "Compress",
             "CumSum", "Trilu", "OneHot", "Expand", "Scatter")


def cases(kind: str) -> list[str]:
    """Every case of one kind, by its pytest id."""
    if kind == "test_model_case":
        return [_model_id(d) for d in _model_dirs()]
    if kind == "test_canonical_graph_matches_onnxruntime":
        return [_model_id(d) for d in _model_dirs()] + [
            name for name, case in sorted(_node_cases().items())
            if not name.endswith("_expanded") and "_expanded_ver" not in name
            and any(nd.op_type in REWRITTEN for nd in case.model.graph.node)]
    return sorted(_node_cases())


KINDS = ("test_model_case", "test_node_case", "test_node_case_through_kernels",
         "test_canonical_graph_matches_onnxruntime")


def _model_id(case_dir: str) -> str:
    return os.path.relpath(case_dir, DATA)


# ---------------------------------------------------------------------- expectations
EXPECTATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "onnx_expectations.json")
UPDATE = "python scripts/conformance.py --update"


def key(kind: str, case: str) -> str:
    return f"{kind}[{case}]"


@functools.lru_cache(maxsize=None)
def expectations() -> dict[str, str]:
    with open(EXPECTATIONS) as f:
        return json.load(f)


def save_expectations(table: dict[str, str]) -> None:
    with open(EXPECTATIONS, "w") as f:
        json.dump(dict(sorted(table.items())), f, indent=0, sort_keys=True)
        f.write("\n")


def check(kind: str, case: str) -> None:
    """Run one case and hold it to its entry.  An unsupported case with another reason fails too:
    the reason says how far the case gets and which operator stops it, so a change there (a new
    rule moving the failure to a later node, or a supported operator now refused) is news the
    file must record."""
    want = expectations().get(key(kind, case))
    if want is None:
        pytest.fail(f"{key(kind, case)} has no entry in {os.path.basename(EXPECTATIONS)}: run {UPDATE} -k '{case}'")
    got = outcome_of(kind, case)
    if got != want:
        pytest.fail(f"{key(kind, case)}: outcome\n  {got}\nexpected\n  {want}\n"
                    f"a regression, or an improvement to record with: {UPDATE} -k '{case}'")
    if got.startswith("skip: "):
        pytest.skip(got[6:])
    if got != "pass":
        pytest.xfail(got)


def _unsupported(model: onnx.ModelProto, e: TilefuseError) -> str:
    msg = str(e)
    named = any(f"node '{name}" in msg for name in _node_names(model))
    assert "unsupported" in msg and named, f"compile failed without naming an unsupported node: {msg}"
    return f"unsupported: {normalize_reason(msg)}"


_REASON_REWRITES = (
    (re.compile(r"^unsupported operator "), ""),
    (re.compile(r" \(node '[^']*'(?: at [^)]*)?\)"), ""),        # node names: the operator is the news
    (re.compile(r"\. Rewrite or remove the operator, or open an issue with the model\.$"), ""),
    (re.compile(r"0x[0-9a-f]+"), "0x?"),                        # addresses in wrapped exceptions
)


def normalize_reason(msg: str) -> str:
    """The stable part of an unsupported error: operator and short reason, one line, at most 200
    characters (``Op: reason``, or ``unsupported attribute a=v of Op: reason``)."""
    msg = msg.splitlines()[0]
    for pattern, repl in _REASON_REWRITES:
        msg = pattern.sub(repl, msg)
    return msg[:200]
