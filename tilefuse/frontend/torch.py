"""PyTorch frontend: torch.export -> ATen graph (fixed opset) -> canonical operator Graph.

``import_torch`` exports the model in eval mode without gradients, decomposes it to core ATen
except for the ops in ``aten.KEEP_WHOLE``, and converts each ATen node with the table in
``aten.py``.  Parameters, buffers and lifted constants become graph constants; nodes whose inputs
are all constants (``arange``, ``full``, a transposed weight, ...) are evaluated once here.
``fx_to_graph`` is shared with the torch.compile backend (``dynamo.py``).
"""
from __future__ import annotations

import operator
import os
import re
import sys
import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

import torch
import torch.fx as fx
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.utils import _pytree as pytree

from ..errors import InputError, ModelLoadError, UnsupportedOperator
from ..ir.graph import Attrs, Node
from .aten import AS_WRITTEN, CONVERTERS, KEEP_WHOLE, NO_OPS, Emitter, bind, op_name, tensor_type
from .common import Imported

# Folding an op on constants is skipped when it has a converter and would make a constant this big.
FOLD_LIMIT = 1 << 22


def decomposition_table() -> dict:
    """Core ATen decompositions, minus the ops with a canonical node worth keeping whole, as a
    dict.  torch builds its table anew on every call by asking the dispatcher for every
    CompositeImplicitAutograd op (about 40 ms of the 0.28 s a small model's export takes on a
    CPU); it is built once here for each set of those ops (a custom op registered later makes a
    new table)."""
    global _TABLE
    ops = tuple(torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd"))
    got = _TABLE
    if got is None or got[0] != ops:
        table = torch.export.default_decompositions()
        for op in KEEP_WHOLE:
            table.pop(op, None)
        got = _TABLE = (ops, dict(table.items()))
    return dict(got[1])


_TABLE: tuple[tuple, dict] | None = None       # (the CompositeImplicitAutograd ops, the table)


def import_torch(model, example_inputs: tuple, *, example_kwargs: Mapping[str, Any] | None = None,
                 strict: bool = False) -> Imported:
    """Export ``model(*example_inputs, **example_kwargs)`` and convert it to a canonical Graph."""
    module = model if isinstance(model, torch.nn.Module) else _Callable(model)
    ep = export(module, tuple(example_inputs), dict(example_kwargs or {}), strict=strict)
    return import_exported(ep, name=type(model).__name__ if isinstance(model, torch.nn.Module)
                           else getattr(model, "__name__", "model"))


class _Callable(torch.nn.Module):
    """Wraps a plain function so torch.export can trace it."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        # torch.export records only `forward` frames in stack traces; anchor the function so its
        # lines become node locations (the hook is internal to torch.fx, hence optional).
        anchor = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
        if anchor is not None:
            anchor(fn)

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def export(module: torch.nn.Module, args: tuple, kwargs: dict, *, strict: bool = False) -> ExportedProgram:
    """torch.export in eval mode under no_grad, decomposed to the frontend's opset."""
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # torch's own pytree code warns about its deprecated LeafSpec while exporting
            warnings.filterwarnings("ignore", message=r".*LeafSpec", category=FutureWarning)
            ep = torch.export.export(module, args, kwargs, strict=strict)
            table = decomposition_table()
            if decomposed_already(ep, table):
                ep.graph.eliminate_dead_code()      # (the re-trace would drop unused outputs too)
                ep.graph_module.recompile()
                return ep
            return ep.run_decompositions(table)
    except Exception as e:
        first = str(e).strip().split("\n")[0]
        raise ModelLoadError(f"torch.export could not trace {type(module).__name__}: "
                             f"{type(e).__name__}: {first}") from e
    finally:
        module.train(was_training)


def decomposed_already(ep: ExportedProgram, table: Mapping) -> bool:
    """Whether the frontend converts ``ep`` as it is to what it converts ``ep.run_decompositions(table)``
    to: every call is an ATen op that mutates nothing (functionalization has nothing to do) and
    that the decomposition leaves alone (in no entry of the table, no CompositeImplicitAutograd
    kernel to decompose it unless the frontend keeps it whole) or whose converter takes it as
    written (``aten.AS_WRITTEN``: a ``reshape``, a ``layer_norm``, a ``conv2d``), or one that is
    folded (an op without a converter on constants only: ``arange``, evaluated here as written),
    or a ``getitem`` of such an op's results.  torch spends ~0.3 s of fixed overhead on every
    ``run_decompositions`` call (it re-registers every CompositeImplicitAutograd op of the
    process), most of a small graph's compile; ``tests/test_torch_frontend.py`` checks that the
    two paths give the same canonical graph."""
    constant = {n for n, spec in zip((n for n in ep.graph.nodes if n.op == "placeholder"), ep.graph_signature.input_specs)
                if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)}
    for n in ep.graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        if n.op != "call_function":
            return False                            # a submodule (a higher-order op's body)
        t = n.target
        if t is operator.getitem:
            if n.args[0] in constant:
                constant.add(n)
            continue
        if not isinstance(t, torch._ops.OpOverload) or t._schema.is_mutable:
            return False
        name = op_name(t)
        if name not in CONVERTERS and torch.Tag.nondeterministic_seeded not in t.tags and all(
                a in constant for a in pytree.tree_leaves((n.args, n.kwargs)) if isinstance(a, fx.Node)):
            constant.add(n)                         # folded (``_foldable``): evaluated as written
            continue
        if name in AS_WRITTEN:
            continue
        if t in table:
            return False
        if t not in KEEP_WHOLE and torch._C._dispatch_has_kernel_for_dispatch_key(t.name(), "CompositeImplicitAutograd"):
            return False
    return True


def import_exported(ep: ExportedProgram, name: str = "model") -> Imported:
    """Convert an ExportedProgram (already decomposed) to a canonical Graph and call adapters."""
    sig = ep.graph_signature
    placeholders = [n for n in ep.graph.nodes if n.op == "placeholder"]
    inputs, constants, values, user_leaves = {}, {}, {}, []
    for node, spec in zip(placeholders, sig.input_specs):
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            data = ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
            constants[node] = (spec.target, data)
        elif spec.kind is InputKind.USER_INPUT:
            val = node.meta.get("val")
            if isinstance(val, torch.Tensor):
                inputs[node] = node.name
                user_leaves.append((node.name, True, None))
            else:
                value = getattr(spec.arg, "value", val)
                values[node] = value
                user_leaves.append((node.name, False, value))
        elif spec.kind is InputKind.TOKEN:
            raise _effectful(node)
        else:
            raise _unsupported_signature(node, f"model input of kind {spec.kind.name}")
    em, outs = fx_to_graph(ep.graph, inputs=inputs, constants=constants, values=values)
    graph_outputs, out_leaves = [], []
    for value, spec in zip(outs, sig.output_specs):
        buffer = ep.state_dict.get(spec.target, ep.constants.get(spec.target))     # constants: non-persistent
        if spec.kind is OutputKind.BUFFER_MUTATION and _unchanged(em, value, buffer):
            continue    # the buffer written with its own value (CTRL's ``self.pos_encoding = ....to(device)``)
        if spec.kind is not OutputKind.USER_OUTPUT:
            raise _unsupported_signature(None, f"the model mutates {spec.target!r} in forward "
                                         f"({spec.kind.name}); tilefuse compiles pure functions")
        if isinstance(value, str):
            graph_outputs.append(value)
            out_leaves.append((True, None))
        else:
            out_leaves.append((False, value))
    graph = em.graph(graph_outputs, name)
    in_spec, out_spec = ep.call_spec.in_spec, ep.call_spec.out_spec
    return Imported(graph, _Flattener(in_spec, user_leaves), _Unflattener(out_spec, out_leaves))


def _unchanged(em, value, buffer) -> bool:
    """Whether a mutated buffer's new value is a constant equal to the buffer's value."""
    if not isinstance(value, str) or not em.is_const(value) or buffer is None:
        return False
    new = em.consts[value]
    return new.dtype == buffer.dtype and new.shape == buffer.shape and bool(torch.equal(new, buffer))


def _effectful(token: fx.Node) -> UnsupportedOperator:
    """An effect token (torch.export threads one through operators with side effects): the
    operator that needs it, named as the model wrote it (``torch.linalg.inv``'s run-time check of
    singular inputs), not the token."""
    for use in token.users:
        if use.op == "call_function" and len(use.args) > 1:
            effect, data = use.args[1], [a for a in use.args[2:] if isinstance(a, fx.Node)]
            made = next((a for a in data if a.op == "call_function" and a.target is not operator.getitem), None)
            made = made or next((a.args[0] for a in data if a.target is operator.getitem), use)
            node = Node(str(getattr(made, "target", made)), made.name, (), (), Attrs(), location=source_location(made))
            return UnsupportedOperator(node, f"torch.export gives it an operator with side effects ({effect}: a "
                                             f"run-time check), which tilefuse does not compile")
    return _unsupported_signature(token, "an effect token (an operator with side effects)")


def _unsupported_signature(node, detail: str) -> UnsupportedOperator:
    return UnsupportedOperator(Node("torch.export", node.name if node is not None else "signature", (), (),
                                    Attrs()), detail)


@dataclass(frozen=True)
class _Flattener:
    """Call arguments -> the graph's input tensors, as the model was exported (a class, not a
    closure: a saved model pickles it)."""
    in_spec: Any
    user_leaves: list

    @cached_property
    def _positional_tensors(self) -> bool:
        """Whether the model was exported with positional tensors only (the common call)."""
        n = len(self.user_leaves)
        return all(is_tensor for _, is_tensor, _ in self.user_leaves) \
            and self.in_spec == pytree.tree_flatten((tuple(range(n)), {}))[1]

    def __call__(self, args: tuple, kwargs: dict) -> list:
        if not kwargs and self._positional_tensors and len(args) == len(self.user_leaves) \
                and all(isinstance(a, torch.Tensor) for a in args):
            return list(args)        # the same structure as exported: no pytree walk on every call
        in_spec, user_leaves = self.in_spec, self.user_leaves
        kw_spec = in_spec.child(1)
        keys = list(kw_spec.context or [])
        positional = in_spec.child(0).num_children
        example = _calling(positional, keys)
        if set(kwargs) != set(keys):
            extra, missing = sorted(set(kwargs) - set(keys)), sorted(set(keys) - set(kwargs))
            raise InputError(f"the model was compiled to be called as {example}; got "
                             + (f"keyword input(s) {extra} it was not compiled with" if extra else "")
                             + (" and " if extra and missing else "")
                             + (f"no keyword input(s) {missing}" if missing else "")
                             + (". Pass the inputs the way the example inputs were given, or compile with "
                                "example_kwargs={...} to call the model by keyword" if extra else ""))
        if len(args) != positional:
            raise InputError(f"the model was compiled to be called as {example}: {positional} positional "
                             f"input(s), got {len(args)}")
        flat, spec = pytree.tree_flatten((tuple(args), {k: kwargs[k] for k in keys}))
        if spec != in_spec:
            raise InputError(f"the inputs are nested differently from the example inputs the model was compiled "
                             f"with ({in_spec.num_leaves} tensors and values in all; got {spec.num_leaves}): "
                             f"pass them as the example was, or compile again with inputs of this structure")
        tensors = []
        for leaf, (name, is_tensor, value) in zip(flat, user_leaves):
            if is_tensor:
                tensors.append(leaf)
            elif isinstance(leaf, torch.Tensor) or leaf != value:
                raise InputError(f"input '{name}' was {value!r} when the model was compiled, got {leaf!r}; "
                                 f"compile again for the new value")
        return tensors


def _calling(positional: int, keys: list) -> str:
    """``compiled(x0, x1, mask=...)``: how the model was called at compile time."""
    return "compiled(" + ", ".join([f"x{k}" for k in range(positional)] + [f"{k}=..." for k in keys]) + ")"


@dataclass(frozen=True)
class _Unflattener:
    """The graph's outputs -> the structure the model returns."""
    out_spec: Any
    out_leaves: list

    def __call__(self, outs: list) -> Any:
        it = iter(outs)
        flat = [next(it) if is_tensor else value for is_tensor, value in self.out_leaves]
        return pytree.tree_unflatten(flat, self.out_spec)


# ----------------------------------------------------------------------------------------------
# FX (ATen) graph -> canonical Graph, shared with the torch.compile backend.

def fx_to_graph(graph: fx.Graph, *, inputs: Mapping[fx.Node, str], constants: Mapping[fx.Node, tuple] | None = None,
                values: Mapping[fx.Node, Any] | None = None, owner: torch.nn.Module | None = None,
                updated: frozenset = frozenset()):
    """Convert an ATen FX graph.  Placeholders are graph inputs (``inputs``: node -> name),
    constants (``constants``: node -> (name, tensor)) or specialized Python values (``values``);
    ``updated``: the input placeholders whose new values the caller writes back into them.

    Returns the Emitter (call ``.graph(outputs, name)``) and the output node's flat values: value
    names for tensors, Python values otherwise.
    """
    constants, values = constants or {}, values or {}
    em = Emitter({n.name for n in graph.nodes})
    em.updated = frozenset(updated)
    env: dict[fx.Node, Any] = {}
    outs: list = []
    for node in graph.nodes:
        if node.op == "placeholder":
            if node in constants:
                name, data = constants[node]
                env[node] = em.const(data, name)
            elif node in inputs:
                env[node] = em.add_input(inputs[node], tensor_type(node.meta.get("val")))
            else:
                env[node] = values.get(node)
        elif node.op == "get_attr":
            env[node] = em.const(_get_attr(owner, node.target), node.name)
        elif node.op == "call_function":
            env[node] = convert_node(em, node, env)
        elif node.op == "output":
            outs = pytree.tree_leaves(fx.node.map_arg(node.args[0], lambda n: env[n]),
                                      is_leaf=lambda x: x is None)
            scalar = next((o for o in outs if isinstance(o, DataScalar)), None)
            if scalar is not None:
                raise UnsupportedOperator(scalar.node, "the value of .item() is a model output; it depends on the data")
        else:
            raise UnsupportedOperator(Node(node.op, node.name, (), ()), "unexpected FX node kind")
    return em, outs


def _get_attr(owner, target: str) -> torch.Tensor:
    obj = owner
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


class DataScalar:
    """The value of ``.item()`` (``aten._local_scalar_dense``): known only at run time.  Runtime
    checks on it (``assert x.max().item() <= n``: export's ``_assert_scalar``) are dropped as
    every assertion is; anything that computes with it is refused, naming the ``.item()``."""

    def __init__(self, node: Node):
        self.node = node

    def refusal(self, em: Emitter) -> UnsupportedOperator:
        loc = f" at {self.node.location}" if self.node.location else ""
        return em.unsupported(f"it reads the value of .item() (node '{self.node.name}'{loc}), which depends on "
                              "the data")


def _data_scalar(node: fx.Node, env: Mapping[fx.Node, Any]) -> DataScalar | None:
    for arg in pytree.tree_leaves((node.args, node.kwargs)):
        if isinstance(arg, fx.Node) and isinstance(env.get(arg), DataScalar):
            return env[arg]
    return None


def convert_node(em: Emitter, node: fx.Node, env: Mapping[fx.Node, Any]):
    """The canonical value(s) of one ATen node: emitted nodes, a folded constant, or a Python value."""
    em.begin(node, source_location(node))
    if node.target is operator.getitem:
        return env[node.args[0]][node.args[1]]
    name = op_name(node.target)
    val = node.meta.get("val")
    if name in NO_OPS:
        return None
    if name == "aten._local_scalar_dense.default":
        return DataScalar(em.node_ref())
    scalar = _data_scalar(node, env)
    if scalar is not None:
        if not isinstance(node.target, torch._ops.OpOverload):
            return scalar      # Python arithmetic or a comparison on it: for an assertion, or refused later
        raise scalar.refusal(em)
    if isinstance(val, (int, float, bool)) and not isinstance(val, torch.Tensor):
        return val  # shape arithmetic, specialized to the example's static shapes
    if not isinstance(node.target, torch._ops.OpOverload):
        raise em.unsupported("not an ATen operator")
    lookup = env.__getitem__
    if _foldable(em, node, name, lookup):
        return _fold(em, node, lookup)
    conv = CONVERTERS.get(name)
    if conv is None:
        raise em.unsupported("no converter for this ATen operator")
    start = len(em.nodes)
    result = conv(em, bind(node, lookup))
    return em.finish_node(result, start)


def _foldable(em: Emitter, node: fx.Node, name: str, lookup) -> bool:
    if torch.Tag.nondeterministic_seeded in node.target.tags:
        return False
    for arg in pytree.tree_leaves((node.args, node.kwargs)):
        if isinstance(arg, fx.Node) and not em.is_const(lookup(arg)):
            return False
    if name in CONVERTERS:
        val = node.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        return all(not isinstance(v, torch.Tensor) or v.numel() <= FOLD_LIMIT for v in vals)
    return True


def _fold(em: Emitter, node: fx.Node, lookup):
    """Evaluate an op whose inputs are all constants; its results become constants."""
    def real(n):
        return em.consts[lookup(n)]
    args = fx.node.map_arg(node.args, real)
    kwargs = dict(fx.node.map_arg(node.kwargs, real))
    if "device" in kwargs:
        kwargs["device"] = "cpu"
    with torch.no_grad():
        result = node.target(*args, **kwargs)
    if isinstance(result, torch.Tensor):
        return em.const(result, node.name)
    if isinstance(result, (tuple, list)):
        return tuple(em.const(r, f"{node.name}:{k}") if isinstance(r, torch.Tensor) else r
                     for k, r in enumerate(result))
    return result


# ----------------------------------------------------------------------------------------------
# Source locations.

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_TILEFUSE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Library plumbing inside transformers; a model's own modeling file is the useful location.
_TRANSFORMERS_PLUMBING = ("utils", "integrations", "modeling_utils.py", "masking_utils.py", "pytorch_utils.py",
                          "activations.py", "modeling_layers.py", "generation")


def _transformers_dir() -> str | None:
    mod = sys.modules.get("transformers")
    f = getattr(mod, "__file__", None)
    return os.path.dirname(f) + os.sep if f else None


def _is_plumbing(path: str, tdir: str | None) -> bool:
    return bool(tdir) and path.startswith(tdir) and path[len(tdir):].split(os.sep)[0] in _TRANSFORMERS_PLUMBING


def _not_ours(frames: list) -> list:
    return [f for f in frames if not f[0].startswith(_TORCH_DIR) and not f[0].startswith(_TILEFUSE_DIR)]


def source_location(node: fx.Node) -> str | None:
    """``file.py:LINE in fn`` of the innermost user frame of the node's stack trace."""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    if not frames:
        return None
    outside = _not_ours(frames)
    tdir = _transformers_dir()
    user = [f for f in outside if not _is_plumbing(f[0], tdir)]
    path, line, fn = (user or outside or frames)[-1]
    return f"{os.path.basename(path)}:{line} in {fn}"
