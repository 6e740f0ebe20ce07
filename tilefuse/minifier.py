"""``tilefuse minify``: a failing compilation shrunk to a small prim graph and written as a test.

Given a model and inputs whose compiled outputs differ from eager PyTorch (or onnxruntime), or
whose compilation fails with an internal error, ``minify`` finds a small PrimGraph that fails the
same way and writes it as a self-contained Python test case:

1. The model is compiled as ``tilefuse.compile`` would and compared with the model itself; a
   model that matches has nothing to minify.  If the frontend's prims already differ from the
   model (``verify``'s ``import`` stage), the bug is in the frontend or in fission, which a prim
   graph cannot show: that is said, with the first wrong value.
2. From here the oracle is the reference executor on the prim graph after fission, and a
   candidate graph *fails the same way* when compiling it from that point (``compile_prims``,
   with ``verify``) raises the same kind of error (for a ``VerifyError``: in the same stage) or
   gives outputs that differ from its reference.
3. A subgraph keeps some prims; every tensor they read from a dropped prim becomes a graph input
   holding the full graph's value (so the values a kernel sees stay realistic), and its outputs
   are the kept prims nothing kept reads.  The search starts from the value ``verify`` blamed and
   the fewest levels of its producers that still fail, then runs delta debugging (Zeller's ddmin:
   drop chunks, then single prims) over that set, and finally turns each input it can into a
   constant.
4. The result is written as Python: the prims as text (``tilefuse.ir.printer``), the tensors
   exactly (raw bytes, base64), and a test calling ``check_prims``.
"""
from __future__ import annotations

import base64
import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .errors import TilefuseError
from .ir.dtypes import DType, TensorType
from .ir.expr import Var
from .ir.printer import format_expr, parse_expr
from .ir.prim import Constant, Opaque, Origin, Prim, PrimGraph, Reduction, TensorDecl
from .verify import VerifyError, difference, evaluate, floor


class MinifyError(TilefuseError):
    """Nothing to minify (the model compiles and matches), or the failure cannot be shown as a
    prim graph (the frontend or fission is wrong)."""


@dataclass(frozen=True)
class Failure:
    kind: str          # the exception's type name, or "mismatch"
    stage: str | None  # the stage verify blamed, if any
    value: str | None  # the value verify blamed, if any
    detail: str        # one line

    def same(self, other: "Failure | None") -> bool:
        return other is not None and other.kind == self.kind and other.stage == self.stage

    def __str__(self) -> str:
        where = f" in stage {self.stage!r}" if self.stage else ""
        return f"{self.kind}{where}: {self.detail}"


@dataclass
class Minified:
    """What ``minify`` found: the small graph, its inputs' values, the failure, and the test."""
    graph: PrimGraph
    feeds: dict[str, torch.Tensor]
    failure: Failure
    original_prims: int
    source: str                 # the test case
    path: Path | None = None    # where it was written

    @property
    def num_prims(self) -> int:
        return len(self.graph.prims)


# ---------------------------------------------------------------- the failure of a prim graph

def failure_of(pg: PrimGraph, feeds: dict[str, torch.Tensor], *, target: str = "cpu", backend: str = "triton",
               strategy: str = "optimal", time_limit: float = 10.0) -> Failure | None:
    """How compiling ``pg`` from after fission fails (None when its outputs equal its reference)."""
    from .api import compile_prims
    try:
        cm = compile_prims(pg, target=target, backend=backend, strategy=strategy, time_limit=time_limit,
                           verify=True, feeds=feeds)
        args = [feeds[d.name] for d in pg.inputs]
        got = cm.emulate(*args) if backend == "triton" and not cm.target.is_present() else cm(*args)
    except VerifyError as e:
        return Failure("VerifyError", e.stage, e.value, _line(e))
    except Exception as e:       # noqa: BLE001 - any internal error is a failure to minify
        return Failure(type(e).__name__, None, None, _line(e))
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    want = evaluate(pg, feeds)
    lo = floor(pg.types.values())
    for name, g in zip(pg.outputs, got):
        bad = difference(g, want[name], lo)
        if bad:
            return Failure("mismatch", None, name, f"output {name!r} {bad}")
    return None


def _line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


# ---------------------------------------------------------------- subgraphs

def subgraph(pg: PrimGraph, keep: set[str], values: dict[str, torch.Tensor],
             as_constants: frozenset[str] = frozenset()) -> tuple[PrimGraph, dict[str, torch.Tensor]]:
    """The prims named in ``keep``; what they read from dropped prims becomes graph inputs (or
    constants, for names in ``as_constants``) holding ``values``."""
    prims = [p for p in pg.prims if p.name in keep]
    made = {p.name for p in prims}
    consts = pg.constant_map
    inputs, constants, feeds = [], [], {}
    seen: set[str] = set()
    for p in prims:
        for n in p.inputs:
            if n in made or n in seen:
                continue
            seen.add(n)
            if n in consts:
                constants.append(consts[n])
            elif n in as_constants:
                constants.append(Constant(n, values[n]))
            else:
                inputs.append(TensorDecl(n, pg.types[n]))
                feeds[n] = values[n]
    read = {n for p in prims for n in p.inputs}
    outputs = [p.name for p in prims if p.name in pg.outputs or p.name not in read]
    return PrimGraph(tuple(inputs), tuple(constants), tuple(prims), tuple(outputs)), feeds


def ddmin(items: Sequence, fails: Callable[[list], bool]) -> list:
    """A 1-minimal sublist of ``items`` for which ``fails`` holds (Zeller's delta debugging:
    try dropping each of n chunks, doubling n when none can go)."""
    items = list(items)
    n = 2
    while len(items) >= 2:
        size = -(-len(items) // n)
        chunks = [items[i:i + size] for i in range(0, len(items), size)]
        for k in range(len(chunks)):
            rest = [x for j, c in enumerate(chunks) if j != k for x in c]
            if rest and fails(rest):
                items, n = rest, max(n - 1, 2)
                break
        else:
            if n >= len(items):
                break
            n = min(2 * n, len(items))
    return items


def _producers(pg: PrimGraph, name: str, depth: int) -> set[str]:
    """``name`` and the prims up to ``depth`` producer levels above it."""
    prod = pg.producers
    got, frontier = {name}, [name]
    for _ in range(depth):
        frontier = [n for f in frontier for n in prod[f].inputs if n in prod and n not in got]
        got.update(frontier)
    return got


# ---------------------------------------------------------------- minify

def minify_prims(pg: PrimGraph, feeds: dict[str, torch.Tensor], *, target: str = "cpu", backend: str = "triton",
                 strategy: str = "optimal", time_limit: float = 10.0, progress: Callable[[str], None] | None = None
                 ) -> tuple[PrimGraph, dict[str, torch.Tensor], Failure]:
    """The smallest subgraph of ``pg`` found that fails as ``pg`` does (``MinifyError`` if
    ``pg`` does not fail)."""
    say = progress or (lambda _: None)
    opts = dict(target=target, backend=backend, strategy=strategy, time_limit=time_limit)
    first = failure_of(pg, feeds, **opts)
    if first is None:
        raise MinifyError("the prim graph compiles and matches its reference: nothing to minify")
    say(f"failure: {first}")
    values = evaluate(pg, feeds)
    cache: dict[frozenset, bool] = {}

    def fails(names, consts=frozenset()) -> bool:
        key = frozenset(names) | frozenset("const:" + c for c in consts)
        if key not in cache:
            sub, sub_feeds = subgraph(pg, set(names), values, frozenset(consts))
            cache[key] = bool(sub.prims) and first.same(failure_of(sub, sub_feeds, **opts))
        return cache[key]

    names = [p.name for p in pg.prims]
    if first.value in pg.producers:          # start near the value verify blamed
        for depth in range(0, 8):
            near = _producers(pg, first.value, depth)
            if fails(near):
                names = [n for n in names if n in near]
                break
    say(f"delta debugging over {len(names)} prims")
    names = ddmin(names, fails)
    sub, sub_feeds = subgraph(pg, set(names), values)
    consts: set[str] = set()
    for d in sub.inputs:                      # inputs that can be constants are
        if fails(names, consts | {d.name}):
            consts.add(d.name)
    sub, sub_feeds = subgraph(pg, set(names), values, frozenset(consts))
    failure = failure_of(sub, sub_feeds, **opts)
    say(f"{len(pg.prims)} prims -> {len(sub.prims)}: {failure}")
    return sub, sub_feeds, failure


def minify(model, example_inputs: Sequence | dict | None = None, *, target: str = "cpu", backend: str = "triton",
           strategy: str = "optimal", time_limit: float = 10.0, out: str | Path | None = "test_minified.py",
           example_kwargs: dict | None = None, input_shapes: dict | None = None, dims: dict | None = None,
           progress: Callable[[str], None] | None = None) -> Minified:
    """Shrink a failing compilation of ``model`` (a torch module with ``example_inputs``, or an
    ONNX model: a path, bytes or proto, with optional feeds by input name) to a small prim graph
    and write it as a test case to ``out`` (None: not written).  ``target``/``backend``/
    ``strategy`` are those of the failing compilation; an h100 plan's kernels run here in the
    interpreter; ``input_shapes`` and ``dims`` pin an ONNX model's dynamic dims (``import_onnx``)."""
    from .fission import fission
    graph, feeds, expected, leaves, exact = _import(model, example_inputs, example_kwargs, input_shapes, dims)
    pg = fission(graph)
    say = progress or (lambda _: None)
    # the model itself against the compiled model: is there anything to minify?
    from .verify import Verifier
    try:
        check = Verifier(feeds, expected, leaves, exact)
        check.imported(pg)
    except VerifyError as e:
        raise MinifyError(f"the frontend's prims already differ from the model ({e}); the bug is in the frontend "
                          "or in fission, which a prim graph cannot show: report the model") from None
    sub, sub_feeds, failure = minify_prims(pg, feeds, target=target, backend=backend, strategy=strategy,
                                           time_limit=time_limit, progress=say)
    source = test_source(sub, sub_feeds, failure, target=target, backend=backend, strategy=strategy,
                         what=_describe(model), original=len(pg.prims))
    path = None
    if out is not None:
        path = Path(out)
        path.write_text(source)
    return Minified(sub, sub_feeds, failure, len(pg.prims), source, path)


def _describe(model) -> str:
    if isinstance(model, (str, Path)):
        return str(model)
    return type(model).__name__


def _import(model, example_inputs, example_kwargs, input_shapes=None, dims=None):
    """(graph, feeds by input name, the model's own outputs, how to flatten graph outputs like them,
    the model's outputs in float64 where it can run so)."""
    from .verify import eager_float64, eager_oracle, onnx_oracle, onnx_wide, random_feeds, tensor_leaves
    if isinstance(model, torch.nn.Module) or callable(model) and not isinstance(model, (str, bytes, Path)):
        from .frontend.torch import import_torch
        args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
        kwargs = dict(example_kwargs or {})
        imported = import_torch(model, args, example_kwargs=kwargs)
        tensors = imported.flatten_inputs(args, kwargs)
        feeds = {d.name: t.detach() for d, t in zip(imported.graph.inputs, tensors)}
        return (imported.graph, feeds, eager_oracle(model, args, kwargs), tensor_leaves(imported.unflatten_outputs),
                eager_float64(model, args, kwargs))
    from .frontend.onnx import import_onnx
    graph = import_onnx(model, input_shapes=input_shapes, dims=dims).graph
    if example_inputs is None:
        feeds = random_feeds(graph.inputs)
    else:
        feeds = {k: torch.as_tensor(v) for k, v in dict(example_inputs).items()}
    return graph, feeds, onnx_oracle(model, feeds), list, onnx_wide(model, feeds)


# ---------------------------------------------------------------- the test case

def tensor(dtype: str, shape: Sequence[int], data: str) -> torch.Tensor:
    """A tensor from ``test_source``'s exact encoding (raw bytes, base64)."""
    t = DType(dtype).to_torch()
    raw = bytearray(base64.b64decode(data))
    flat = torch.frombuffer(raw, dtype=t) if raw else torch.empty(0, dtype=t)
    return flat.reshape(tuple(shape)).clone()


def _encode(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return f'tensor("{DType.from_torch(t.dtype).value}", {tuple(t.shape)}, "{base64.b64encode(raw).decode()}")'


def prim(name: str, inputs: Sequence[str], axes: str, body: str | tuple, out: tuple[str, Sequence[int]],
         input_dtypes: Sequence[str], reduce: tuple | None = None, origin: tuple = ("?", "?")) -> Prim:
    """A prim from ``test_source``'s text: ``body`` is ``format_expr`` text over ``in0, in1, ...``
    (or ``(fn, attrs)`` for an opaque call), ``reduce`` ``(combiner, ((axis, extent), ...))``."""
    axis_names = axes.split()
    red = None
    names = list(axis_names)
    if reduce is not None:
        combiner, over = reduce
        red = Reduction(tuple(Var(a) for a, _ in over), tuple(e for _, e in over), combiner)
        names += [a for a, _ in over]
    if isinstance(body, tuple):
        expr: Any = Opaque(body[0], tuple(body[1]))
    else:
        expr = parse_expr(body, names, [DType(d) for d in input_dtypes])
    return Prim(name, tuple(inputs), tuple(Var(a) for a in axis_names), expr,
                TensorType(tuple(out[1]), DType(out[0])), red, Origin(*origin))


def _prim_source(p: Prim, types) -> str:
    if p.is_opaque:
        body = repr((p.body.fn, p.body.attrs))
    else:
        body = repr(format_expr(p.body))
    red = ""
    if p.reduce is not None:
        red = f", reduce=({p.reduce.combiner!r}, {tuple((v.name, e) for v, e in zip(p.reduce.axes, p.reduce.extents))!r})"
    origin = (p.origin.op, p.origin.name) + ((p.origin.location,) if p.origin.location else ())
    dtypes = [types[n].dtype.value for n in p.inputs]
    return (f"    prim({p.name!r}, {list(p.inputs)!r}, {' '.join(v.name for v in p.axes)!r}, {body},\n"
            f"         ({p.out.dtype.value!r}, {p.out.shape!r}), {dtypes!r}{red}, origin={origin!r}),")


def test_source(pg: PrimGraph, feeds: dict[str, torch.Tensor], failure: Failure, *, target: str, backend: str,
                strategy: str, what: str = "a model", original: int | None = None) -> str:
    """``pg`` on ``feeds`` as a self-contained pytest file that fails while the bug is there."""
    import tilefuse
    shrunk = f" ({original} prims -> {len(pg.prims)})" if original else ""
    lines = [
        f'"""Minified by `tilefuse minify` (tilefuse {tilefuse.__version__}, {datetime.date.today()}) from {what}{shrunk}.',
        "",
        f"It failed with: {failure}",
        f"(target {target!r}, backend {backend!r}, strategy {strategy!r}).  Run it with pytest: it fails while",
        'the bug is there and passes once it is fixed."""',
        "from tilefuse.minifier import check_prims, prim, tensor",
        "",
        "INPUTS = {",
        *(f"    {d.name!r}: {_encode(feeds[d.name])}," for d in pg.inputs),
        "}",
        "CONSTANTS = {",
        *(f"    {c.name!r}: {_encode(c.data)}," for c in pg.constants),
        "}",
        "PRIMS = [",
        *(_prim_source(p, pg.types) for p in pg.prims),
        "]",
        f"OUTPUTS = {list(pg.outputs)!r}",
        "",
        "",
        "def test_minified():",
        f"    check_prims(INPUTS, CONSTANTS, PRIMS, OUTPUTS, target={target!r}, backend={backend!r}, "
        f"strategy={strategy!r})",
        "",
    ]
    return "\n".join(lines)


def check_prims(inputs: dict[str, torch.Tensor], constants: dict[str, torch.Tensor], prims: Sequence[Prim],
                outputs: Sequence[str], *, target: str = "cpu", backend: str = "triton", strategy: str = "optimal") -> None:
    """A minified test case's check: compiled from after fission, the graph equals its reference."""
    pg = PrimGraph(tuple(TensorDecl(n, TensorType(tuple(t.shape), DType.from_torch(t.dtype))) for n, t in inputs.items()),
                   tuple(Constant(n, t) for n, t in constants.items()), tuple(prims), tuple(outputs))
    failure = failure_of(pg, dict(inputs), target=target, backend=backend, strategy=strategy)
    assert failure is None, str(failure)
