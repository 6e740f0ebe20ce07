"""The compile report: what was imported, split and (later) fused, and how long it took."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Report:
    target: str
    backend: str
    strategy: str
    num_ops: int
    num_prims: int
    prims_by_category: dict[str, int]
    compile_seconds: float
    ops_by_type: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), indent=kw.pop("indent", 2), **kw)
