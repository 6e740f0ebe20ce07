"""CompiledModel: a compiled program callable like the model it came from."""
from __future__ import annotations

import threading
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np
import torch

from ..errors import InputError, OptionError, TargetAbsentError
from ..ir.dtypes import DType
from ..ir.prim import PrimGraph
from ..frontend.common import Imported
from ..orchestrate.plan import Plan, execute_reference
from .executor import Program
from .memory import MemoryPlan


class CompiledModel:
    """Callable with the model's inputs (torch tensors); ``run`` takes ONNX-style numpy feeds.

    Safe to call from several threads at once: each call takes a ``Program`` (the kernels with
    their own arena of intermediates) from a pool and gives it back, making a new one when all
    are busy (so as many arenas as calls ever ran at once); a CUDA-graph replay, whose static
    buffers are shared, runs one call at a time."""

    def __init__(self, imported: Imported, primgraph: PrimGraph, plan: Plan, report, backend: str, target,
                 kernels: Sequence = (), cuda_graph: bool = False, memory: MemoryPlan | None = None,
                 persistent: Sequence[tuple[int, int]] = ()):
        if cuda_graph and (backend != "triton" or target.device != "cuda"):
            raise OptionError(f"cuda_graph=True needs backend='triton' and a CUDA target; "
                              f"got backend={backend!r}, target {target.name!r}")
        self.imported = imported
        self.graph = imported.graph
        self.primgraph = primgraph
        self.plan = plan
        self.report = report
        self.backend = backend
        self.target = target
        self.cuda_graph = cuda_graph
        self.kernels = tuple(kernels)   # built at compile time, plan order (families.base.Built)
        if len(self.kernels) == len(plan.kernels):     # built: the report keeps what report.to_html draws
            report.attach(primgraph, plan, self.kernels, target)
        self.memory = memory      # the plan's buffer layout, when the pipeline already made it
        # runs of kernels launched as one persistent kernel each (first, past the last), on at most
        # one program per SM (``codegen/triton/persistent.py``)
        self.persistent = tuple(persistent)
        self.device = torch.device(target.device)
        self._program = None    # the kernels with their buffers on the device, made at the first call
        self._idle: list[Program] = []         # programs no call is running
        self._lock = threading.Lock()          # guards the pool and the replay's creation
        self._replay = None
        self._replay_lock = threading.Lock()
        self._emulator: Program | None = None    # the plan's kernels on the CPU (``emulate``)
        self.source_onnx = None     # the ONNX model compiled (``compile_onnx``): a saved package keeps it
        # the plan as a template for other sizes of the same program (``orchestrate/instantiate.py``)
        self.template = None
        # inputs that stay where they are call after call (a torch.compile'd graph's parameters,
        # buffers and tensors marked static: ``frontend/dynamo.py``): a CUDA-graph replay reads them
        # in place rather than copying them (``runtime/cudagraph.py``)
        self.static_inputs: frozenset[str] = frozenset()

    def save(self, path, *, onnx_model=None):
        """Write this compiled model to ``path`` (a ``.tfz`` package: ``runtime/package.py``), to
        load elsewhere with ``tilefuse.load`` without planning again; ``onnx_model`` (default: the
        ONNX model it was compiled from, if any) is kept in it for checking."""
        from .package import save
        return save(self, path, onnx_model=onnx_model if onnx_model is not None else self.source_onnx)

    @property
    def input_names(self) -> list[str]:
        return [d.name for d in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    def get_inputs(self) -> list["IOInfo"]:
        """The inputs as onnxruntime's ``InferenceSession.get_inputs()`` lists them: name, shape,
        type (``tensor(float16)``), and the numpy dtype."""
        return [_io(d.name, d.type) for d in self.graph.inputs]

    def get_outputs(self) -> list["IOInfo"]:
        return [_io(n, self.graph.types[n]) for n in self.graph.outputs]

    def _check(self, tensors: Sequence[Any], device: torch.device | None = None) -> dict[str, torch.Tensor]:
        decls = self.graph.inputs
        device = device or self.device
        if len(tensors) != len(decls):
            raise InputError(f"the model takes {len(decls)} tensor input(s) "
                             f"({', '.join(d.name for d in decls)}), got {len(tensors)}")
        feeds = {}
        for k, (t, d) in enumerate(zip(tensors, decls)):
            if not isinstance(t, torch.Tensor):
                raise InputError(f"input '{d.name}' (#{k}) must be a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != d.type.shape:
                raise InputError(f"input '{d.name}' (#{k}) has shape {tuple(t.shape)}, the model was compiled "
                                 f"for {d.type.shape}; compile again with inputs of the new shape")
            if t.dtype != d.type.dtype.to_torch():
                raise InputError(f"input '{d.name}' (#{k}) has dtype {str(t.dtype).replace('torch.', '')}, "
                                 f"the model expects {d.type.dtype.value}")
            if t.device.type != device.type and t.dim() == 0 and t.device.type == "cpu":
                # a CPU scalar beside device tensors, which PyTorch allows (transformers' static
                # cache compiled with its prefill reads its CPU length counter): copied over
                t = t.to(device)
            if t.device.type != device.type:
                raise InputError(f"input '{d.name}' (#{k}) is on {t.device}; the model was compiled for "
                                 f"{self.target.name} and runs on {device.type}: "
                                 f"move the inputs there (.to('{device.type}'))")
            feeds[d.name] = t.detach()
        return feeds

    @property
    def program(self) -> Program:
        """The runnable plan (buffers allocated on first use); the first of the call pool's."""
        with self._lock:
            if self._program is None:
                self._program = self._new_program()
                self._idle.append(self._program)
            return self._program

    def _persistent_grid(self) -> dict:
        """The persistent kernels' programs an SM and register cap, per kernel of each run launched
        as one (the plan's, ``Report.persistent``; one and none where a row has none), and what an
        SM of the target holds of a launched binary: ``Program``'s arguments."""
        from functools import partial

        from ..native import launched_occupancy
        rows = [r for r in (self.report.persistent or ()) if r["launched_as_one"]]
        spans = [(r, range(r["first"], r["first"] + len(r["kernels"]))) for r in rows]
        return {"per_sm": {k: r.get("per_sm", 1) for r, ks in spans for k in ks},
                "maxnreg": {k: r["maxnreg"] for r, ks in spans if r.get("maxnreg") for k in ks},
                "fits": partial(launched_occupancy, target=self.target)}

    def _new_program(self) -> Program:
        return Program(self.plan, self.primgraph, self.device, self.kernels, self.memory,
                       persistent=self.persistent, programs=self.target.sm_count, donate=True,
                       **self._persistent_grid())

    def _run_pooled(self, feeds: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        self.program                       # the first program, made once
        with self._lock:
            prog = self._idle.pop() if self._idle else self._new_program()
        try:
            return prog.run(feeds)
        finally:
            with self._lock:
                self._idle.append(prog)

    def _require_present(self) -> None:
        if not self.target.is_present():
            raise TargetAbsentError(
                f"this model was compiled for {self.target.name}, which is not present on this machine; "
                f"its plan and report are available (.plan, .report), .emulate(*inputs) (or .run(feeds, "
                f"emulate=True)) runs its kernels on the CPU to check them; compile with target='auto' to run here")

    def _execute(self, feeds: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        if self.backend == "triton":
            if self.cuda_graph:
                with self._replay_lock:        # one capture, one set of static buffers
                    if self._replay is None:
                        from .cudagraph import GraphReplay
                        self._replay = GraphReplay(self.program, static=self.static_inputs)
                    outs = self._replay.run(feeds)
            else:
                outs = self._run_pooled(feeds)
        else:  # "reference": the plan's kernels one by one, each evaluated by the reference executor (CPU)
            cpu = {n: t.cpu() for n, t in feeds.items()}
            outs = [o.to(self.device) for o in execute_reference(self.plan, self.primgraph, cpu)]
        return self._owned(outs)

    def trace_persistent(self, *args, **kwargs) -> list[dict]:
        """MEASURED: one call on ``args`` with every persistent kernel tracing its tasks (the GPU's
        clock when each was taken, started and done, and its SM), after an untraced warm-up call;
        per persistent kernel, its measured schedule beside the simulated one the report has
        (``runtime/trace.compare``).  Needs the GPU the model was compiled for.  The plan runs twice
        on ``args``: an input it updates in place (a KV cache's rows, a length counter) is updated
        twice."""
        from .trace import compare
        self._require_present()
        if not self.persistent:
            raise ValueError("this model has no persistent kernel (compile with persistent=True or 'auto')")
        feeds = self._check(list(self.imported.flatten_inputs(args, kwargs)))
        prog = Program(self.plan, self.primgraph, self.device, self.kernels, self.memory,
                       persistent=self.persistent, programs=self.target.sm_count, donate=True, trace=True,
                       **self._persistent_grid())
        prog.run(feeds)                     # compiles every kernel, warms the caches
        prog.run(feeds)
        torch.cuda.synchronize(self.device)
        rows = {r["first"]: r for r in self.report.persistent if r["launched_as_one"]}
        return [compare(rows[i], launch.trace.cpu().tolist()) for i, (launch, _) in sorted(prog._persistent.items())
                if i in rows]       # (a run the Program cut at a kernel it runs apart has no row)

    def _owned(self, outs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Outputs the caller owns: a graph output that is an input or a weight is copied."""
        aliased = {d.name for d in self.primgraph.inputs} | {c.name for c in self.primgraph.constants}
        return [o.clone() if n in aliased else o for n, o in zip(self.primgraph.outputs, outs)]

    def __call__(self, *args, **kwargs):
        self._require_present()
        tensors = self.imported.flatten_inputs(args, kwargs)
        outs = self._execute(self._check(list(tensors)))
        return self.imported.unflatten_outputs(outs)

    def emulate(self, *args, **kwargs):
        """The model's outputs from this plan's kernels run on the CPU, whatever the target:
        generated kernels in Triton's interpreter, library calls through torch.  How a plan made
        for a GPU that is not attached (``target="h100"`` on a laptop) is checked against the
        model; slow, for checking, never for speed.  Needs a machine without CUDA (where
        tilefuse switches the interpreter on)."""
        feeds = self._check(list(self.imported.flatten_inputs(args, kwargs)), torch.device("cpu"))
        return self.imported.unflatten_outputs(self._emulated(feeds))

    def _emulated(self, feeds: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        from ..codegen.triton.interpreter import interpreted
        if self.backend != "triton":
            raise InputError(f"emulate runs generated kernels; this model was compiled with backend={self.backend!r}")
        if not interpreted():
            raise TargetAbsentError("emulate needs Triton's interpreter, which tilefuse switches on only on a "
                                    "machine without CUDA; on this machine compile with target='auto' and call "
                                    "the model instead")
        with self._replay_lock:      # one emulating call at a time: one arena
            if self._emulator is None:
                self._emulator = Program(self.plan, self.primgraph, torch.device("cpu"), self.kernels, self.memory,
                                         persistent=self.persistent, programs=self.target.sm_count,
                                         **self._persistent_grid())
            outs = self._emulator.run(feeds)
        return self._owned(outs)

    def why_apart(self) -> list:
        """For each pair of the plan's kernels where the second reads what the first wrote, why
        they are not one kernel: a segment boundary, a kernel between them, no family that builds
        the pair, or the cost model (the fused pair's modelled time beside theirs apart)
        (``report/apart.py``).  The report (JSON and HTML) carries them from then on."""
        from ..report.apart import why_apart
        rows = why_apart(self)
        self.report.apart = [r.as_dict() for r in rows]
        return rows

    def native(self) -> list:
        """Every generated kernel of the plan compiled ahead of time for the target's GPU
        architecture (``target="h100"``: sm_90), on any machine, GPU or not: the binary's
        registers, spills, shared memory, tensor-core path, load widths and async copies beside
        what the cost model assumed (``tilefuse/native.py``: ``NativeKernel`` rows, plan order).
        The report's kernels carry them (``KernelInfo.native``) from then on.  Cached by kernel."""
        from ..native import native_kernels
        if self.backend != "triton":
            raise InputError(f"native compiles generated kernels; this model was compiled with "
                             f"backend={self.backend!r}")
        rows = native_kernels(self.plan, self.kernels, self.target)
        by_kernel: dict[str, list] = {}
        for r in rows:
            by_kernel.setdefault(r.plan_kernel, []).append(r.as_dict())
        for info in self.report.kernels:
            info.native = by_kernel.get(info.name, [])
        return rows

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None, *,
            emulate: bool = False) -> list[np.ndarray]:
        """ONNX-Runtime-style call: numpy feeds by input name, outputs in graph output order (or
        ``output_names``'); onnxruntime's own order, ``run(None, feeds)`` or ``run(["y"], feeds)``,
        is accepted too.  ``emulate``: this plan's kernels on the CPU whatever the target (the
        interpreter, as ``emulate``), e.g. an h100 plan checked on a machine without one."""
        if isinstance(output_names, Mapping) and (feeds is None or _names(feeds)):
            feeds, output_names = output_names, feeds          # onnxruntime's run(output_names, feeds)
        if not emulate:
            self._require_present()
        names = self.input_names
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a dict from input name to array ({', '.join(names)}), "
                             f"got {type(feeds).__name__}")
        unknown = [n for n in (output_names or ()) if n not in self.output_names]
        if unknown:
            raise InputError(f"no output named {', '.join(map(repr, unknown))}; the outputs are {self.output_names}")
        missing = [n for n in names if n not in feeds]
        extra = [n for n in feeds if n not in names]
        if missing or extra:
            raise InputError(f"feeds must name exactly the inputs {names}; "
                             f"missing {missing}, unexpected {extra}")
        tensors = []
        device = torch.device("cpu") if emulate else self.device
        for n in names:
            v = feeds[n]
            if isinstance(v, torch.Tensor):
                tensors.append(v.to(device))
                continue
            v = np.asarray(v)
            try:
                DType.from_numpy(v.dtype)
            except TypeError as e:
                raise InputError(f"input '{n}': {e}") from None
            tensors.append(torch.from_numpy(np.array(v, order="C")).to(device))  # keeps 0-d arrays 0-d
        outs = self._emulated(self._check(tensors, device)) if emulate else self._execute(self._check(tensors))
        result = {n: o for n, o in zip(self.output_names, outs)}
        wanted = list(output_names) if output_names is not None else self.output_names
        return [_to_numpy(result[n]) for n in wanted]


class IOInfo(NamedTuple):
    """An input or output as onnxruntime's ``NodeArg`` shows it."""
    name: str
    shape: list
    type: str            # onnxruntime's spelling: "tensor(float)", "tensor(int64)", ...
    dtype: np.dtype | None


_ORT_TYPES = {"float32": "float", "float64": "double"}


def _io(name: str, t) -> IOInfo:
    dt = t.dtype.value
    try:
        npdt = t.dtype.to_numpy()
    except TypeError:      # (bfloat16 has no numpy dtype)
        npdt = None
    return IOInfo(name, list(t.shape), f"tensor({_ORT_TYPES.get(dt, dt)})", npdt)


def _names(x) -> bool:
    return isinstance(x, (list, tuple)) and all(isinstance(n, str) for n in x)


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype is torch.bfloat16:
        t = t.float()
    return t.detach().cpu().numpy()
