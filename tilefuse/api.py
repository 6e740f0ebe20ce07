"""The tilefuse pipeline, stage by stage.

    model ─► frontend ─► Graph ─► fission ─► PrimGraph ─► (orchestration, codegen: to come) ─► CompiledModel

Each stage is a plain function from one IR to the next; ``dump`` (a directory) writes what each
stage produced.
"""
from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from .analysis.classify import count_by_category
from .fission import fission
from .frontend.common import Imported
from .report.report import Report
from .runtime.compiled import CompiledModel

BACKENDS = ("reference",)
STRATEGIES = ("optimal", "greedy", "unfused")


def _check_options(backend: str, strategy: str, target: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not available; choose one of {BACKENDS}")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy {strategy!r} is unknown; choose one of {STRATEGIES}")


def _pipeline(imported: Imported, *, target: str, backend: str, strategy: str, t0: float,
              dump: str | Path | None) -> CompiledModel:
    graph = imported.graph
    primgraph = fission(graph)
    if dump is not None:
        d = Path(dump)
        d.mkdir(parents=True, exist_ok=True)
        (d / "1-graph.txt").write_text(str(graph) + "\n")
        (d / "2-prims.txt").write_text(str(primgraph) + "\n")
    report = Report(
        target=target, backend=backend, strategy=strategy,
        num_ops=len(graph.nodes), num_prims=len(primgraph.prims),
        prims_by_category=count_by_category(primgraph.prims),
        compile_seconds=round(time.perf_counter() - t0, 4),
        ops_by_type=dict(sorted(Counter(n.op for n in graph.nodes).items())),
    )
    return CompiledModel(imported, primgraph, report, backend)


def compile(model, example_inputs, *, target: str = "auto", backend: str = "reference",
            strategy: str = "optimal", dump: str | Path | None = None, **options: Any) -> CompiledModel:
    """Compile a torch.nn.Module (or callable) for the given example inputs (a tuple of args)."""
    _check_options(backend, strategy, target)
    from .frontend.torch import import_torch
    t0 = time.perf_counter()
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    imported = import_torch(model, tuple(example_inputs), **options)
    return _pipeline(imported, target=target, backend=backend, strategy=strategy, t0=t0, dump=dump)


def compile_onnx(model_or_path, *, target: str = "auto", backend: str = "reference",
                 strategy: str = "optimal", dump: str | Path | None = None, **options: Any) -> CompiledModel:
    """Compile an ONNX model (a path, bytes or ``onnx.ModelProto``)."""
    _check_options(backend, strategy, target)
    from .frontend.onnx import import_onnx
    t0 = time.perf_counter()
    imported = import_onnx(model_or_path, **options)
    return _pipeline(imported, target=target, backend=backend, strategy=strategy, t0=t0, dump=dump)
