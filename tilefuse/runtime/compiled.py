"""CompiledModel: a compiled program callable like the model it came from."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import torch

from ..errors import InputError, TargetAbsentError
from ..ir.dtypes import DType
from ..ir.prim import PrimGraph
from ..frontend.common import Imported
from ..orchestrate.plan import Plan, execute_reference
from .executor import build_steps, execute


class CompiledModel:
    """Callable with the model's inputs (torch tensors); ``run`` takes ONNX-style numpy feeds."""

    def __init__(self, imported: Imported, primgraph: PrimGraph, plan: Plan, report, backend: str, target):
        self.imported = imported
        self.graph = imported.graph
        self.primgraph = primgraph
        self.plan = plan
        self.report = report
        self.backend = backend
        self.target = target
        self._steps = None    # generated kernels, built at the first call

    @property
    def input_names(self) -> list[str]:
        return [d.name for d in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    def _check(self, tensors: Sequence[Any]) -> dict[str, torch.Tensor]:
        decls = self.graph.inputs
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
            feeds[d.name] = t.detach().cpu()
        return feeds

    def _execute(self, feeds: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        if not self.target.is_present():
            raise TargetAbsentError(
                f"this model was compiled for {self.target.name}, which is not present on this machine; "
                f"its plan and report are available (.plan, .report); compile with target='auto' to run here")
        if self.backend == "triton":
            if self._steps is None:
                self._steps = build_steps(self.plan)
            outs = execute(self._steps, self.plan, self.primgraph, feeds, torch.device("cpu"))
        else:  # "reference": the plan's kernels one by one, each evaluated by the reference executor
            outs = execute_reference(self.plan, self.primgraph, feeds)
        aliased = {d.name for d in self.primgraph.inputs} | {c.name for c in self.primgraph.constants}
        return [o.clone() if n in aliased else o for n, o in zip(self.primgraph.outputs, outs)]

    def __call__(self, *args, **kwargs):
        tensors = self.imported.flatten_inputs(args, kwargs)
        device = next((t.device for t in tensors if isinstance(t, torch.Tensor)), torch.device("cpu"))
        outs = self._execute(self._check(list(tensors)))
        return self.imported.unflatten_outputs([o.to(device) for o in outs])

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str] | None = None) -> list[np.ndarray]:
        """ONNX-Runtime-style call: numpy feeds by input name, outputs in graph output order."""
        names = self.input_names
        missing = [n for n in names if n not in feeds]
        extra = [n for n in feeds if n not in names]
        if missing or extra:
            raise InputError(f"feeds must name exactly the inputs {names}; "
                             f"missing {missing}, unexpected {extra}")
        tensors = []
        for n in names:
            v = feeds[n]
            if isinstance(v, torch.Tensor):
                tensors.append(v)
                continue
            v = np.asarray(v)
            try:
                DType.from_numpy(v.dtype)
            except TypeError as e:
                raise InputError(f"input '{n}': {e}") from None
            tensors.append(torch.from_numpy(np.array(v, order="C")))  # keeps 0-d arrays 0-d
        outs = self._execute(self._check(tensors))
        result = {n: o for n, o in zip(self.output_names, outs)}
        wanted = list(output_names) if output_names is not None else self.output_names
        return [_to_numpy(result[n]) for n in wanted]


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype is torch.bfloat16:
        t = t.float()
    return t.detach().cpu().numpy()
