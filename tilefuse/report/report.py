"""The compile report: what was imported, split, fused and chosen, with modelled costs."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TilefuseError


class ReportError(TilefuseError):
    """The HTML report cannot be made: no plan to draw, or the file cannot be written."""


@dataclass
class KernelInfo:
    name: str
    family: str
    prims: list[str]
    ops: list[str]
    est_us: float              # modelled, or the measured time when measured_us is set
    bytes: int                 # DRAM bytes (modelled)
    flops: int
    measured_us: float | None = None
    grid: int = 0              # programs launched
    warps: int = 0             # per program
    waves: int = 0             # ceil(grid / (SMs x occupancy))
    occupancy: int = 0         # programs resident per SM
    bound: str = ""            # dram | l2 | compute | launch: the modelled term that dominates
    l2_bytes: int = 0          # bytes requested through L2 (re-reads included)
    schedule: str = ""         # the schedule's structural key (tuning cache)
    # Its tile-level kernels compiled for the target's architecture (CompiledModel.native(); empty
    # until then): facts of the binary beside the model's registers, shared memory and occupancy.
    native: list[dict] = field(default_factory=list)


@dataclass
class Report:
    target: str
    backend: str
    strategy: str
    num_ops: int
    num_prims: int
    prims_by_category: dict[str, int]
    num_kernels: int = 0
    kernels: list[KernelInfo] = field(default_factory=list)
    est_total_us: float = 0.0
    strategies: dict[str, dict[str, float]] = field(default_factory=dict)
    solver: dict[str, Any] = field(default_factory=dict)
    compile_seconds: float = 0.0
    ops_by_type: dict[str, int] = field(default_factory=dict)
    # Intermediate tensors (neither inputs, weights nor outputs): the arena the buffer planner
    # lays them out in (bytes live at the peak, with reuse), against the sum of all of them.
    memory: dict[str, int] = field(default_factory=dict)
    # How the plan was costed and how far it is from the hardware: launches per kernel or as
    # CUDA-graph nodes; modelled DRAM traffic of the plan; the roofline bound of the model
    # (compulsory bytes at peak bandwidth vs useful flops at peak; cost/roofline.py).
    launch: str = "per_launch"
    traffic_bytes: int = 0
    compulsory_bytes: int = 0
    total_flops: int = 0
    roofline_us: float = 0.0
    # The measurement loop (compile(measure=...)): rounds, whether the plan settled, how many
    # schedules were measured and how many of those came from the tuning cache.  Empty if none.
    measurement: dict[str, Any] = field(default_factory=dict)
    # Planning on compiled binaries (compile(native=True)): rounds, whether the plan settled, how
    # many schedules were compiled for the architecture.  Empty if not asked for.
    native_planning: dict[str, Any] = field(default_factory=dict)
    # The stages ``verify`` checked against their input, in order (empty when it was off).
    verified: list[str] = field(default_factory=list)
    # Why each pair of kernels where one reads the other is not one kernel (``report/apart.py``;
    # ``CompiledModel.why_apart()`` fills it): producer, consumer, tensor, reason, detail, times.
    apart: list[dict[str, Any]] = field(default_factory=list)
    # A plan compiled for one input signature of a torch.compile graph with symbolic shapes: which
    # plan of the graph it is, how many the graph has, and what differs from the nearest earlier
    # signature (``frontend/dynamo.py``).  Empty for other compiles.
    specialization: dict[str, Any] = field(default_factory=dict)
    # Collectives issued before the kernels that do not need their result and waited for just
    # before the first that does (``orchestrate/overlap.py``): per collective, the kernels between
    # and the time the model would hide (the smaller of the two; modelled, not subtracted from
    # ``est_total_us``).  Empty without collectives.
    overlap: list[dict[str, Any]] = field(default_factory=list)
    # Runs of kernels that can be one persistent kernel (``compile(persistent=...)``, experimental):
    # their kernels, the first's index, the tasks (the phases' programs), the grid, the modelled
    # time of the kernels launched one by one and of the persistent kernel (its simulated
    # schedule: ``cost/persistent.py``), and whether the run is launched as one (``est_total_us``
    # then counts its simulated time; ``strategies`` do not).
    persistent: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), indent=kw.pop("indent", 2), **kw)

    def attach(self, primgraph, plan, kernels, target) -> None:
        """Keep what ``to_html`` draws (prims, kernels, schedules, sources, roofs) as plain data;
        not a field, so ``to_dict`` is unchanged and the report holds none of the model's tensors."""
        from .snapshot import snapshot
        self._snapshot = snapshot(primgraph, plan, kernels, target)

    def to_html(self, path: str | Path) -> Path:
        """Write a self-contained HTML page of the plan to ``path`` (no network needed to view it):
        the primitive graph with kernels as clusters, each kernel's details and generated source,
        a sortable kernel table, the strategies side by side and a roofline chart."""
        from .html import write_html
        return write_html(self, path)
