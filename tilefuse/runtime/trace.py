"""A persistent kernel's MEASURED schedule beside its MODELLED one (issue #25: "costed by simulating
the schedule" checked against the machine).

Traced (``CompiledModel.trace_persistent``, a GPU's), each task of a persistent kernel writes the
GPU's global clock when it was taken, when its waits ended and when it was counted done, and the
SM it ran on (``codegen/triton/persistent.py``: ``TRACE``).  ``compare`` puts those readings per
phase beside the schedule the cost model simulated for the same run (``report/gantt.timeline``
of the report's row): when each phase's first task started and its last one ended, and its
tasks' mean time running and waiting, both ways.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class TracedTask:
    phase: int
    sm: int
    taken: float          # seconds from the first task taken
    started: float        # its waits over
    done: float           # counted done


def traced_tasks(raw: Sequence[Sequence[int]], tasks_per_phase: Sequence[int]) -> list[TracedTask]:
    """The tasks of one traced launch in task order: ``raw`` its rows of (taken, started, done ns,
    SM), ``tasks_per_phase`` the phases' task counts (the kernel's task order)."""
    rows = [list(map(int, r)) for r in raw]
    if len(rows) != sum(tasks_per_phase):
        raise ValueError(f"a trace of {len(rows)} tasks for phases of {sum(tasks_per_phase)}")
    if any(r[0] == 0 or not r[0] <= r[1] <= r[2] for r in rows):
        raise ValueError("the trace has a task never run or clock readings out of order")
    t0 = min(r[0] for r in rows)
    phase_of = [p for p, n in enumerate(tasks_per_phase) for _ in range(n)]
    return [TracedTask(p, r[3], (r[0] - t0) * 1e-9, (r[1] - t0) * 1e-9, (r[2] - t0) * 1e-9)
            for p, r in zip(phase_of, rows)]


def compare(row: dict, raw: Sequence[Sequence[int]]) -> dict:
    """A report's persistent ``row`` (``Report.persistent``) with its launch's ``raw`` trace: per
    phase, measured and modelled (µs from the first task's start) first start, last end, mean task
    time and mean wait, and both makespans; ``measured_over_modelled`` the ratio of the makespans."""
    from ..report.gantt import timeline
    counts = [p["tasks"] for p in row["phases"]]
    measured = traced_tasks(raw, counts)
    modelled = timeline(row)
    # both from the first task's start (the launch itself is outside what a trace sees)
    m0, s0 = min(t.started for t in measured), min(t.start for t in modelled)
    phases = []
    for p, ph in enumerate(row["phases"]):
        got = [t for t in measured if t.phase == p]
        sim = [t for t in modelled if t.phase == p]
        phases.append({"kernel": ph["kernel"], "tasks": ph["tasks"],
                       "measured": _figures([(t.started - m0, t.done - m0, t.started - t.taken) for t in got]),
                       "modelled": _figures([(t.start - s0, t.end - s0, None) for t in sim]),
                       "sms": len({t.sm for t in got})})
    span = max(t.done for t in measured) - m0
    model = max(t.end for t in modelled) - s0
    return {"first": row["first"], "kernels": row["kernels"], "tasks": len(measured),
            "measured_us": round(span * 1e6, 3), "modelled_us": round(model * 1e6, 3),
            "measured_over_modelled": round(span / model, 3) if model else None, "phases": phases}


def _figures(spans: list[tuple]) -> dict:
    """First start, last end, mean running time and (where known) mean wait, in µs."""
    us = 1e6
    out = {"start_us": round(min(s for s, _, _ in spans) * us, 3), "end_us": round(max(e for _, e, _ in spans) * us, 3),
           "task_us": round(sum(e - s for s, e, _ in spans) / len(spans) * us, 3)}
    waits = [w for _, _, w in spans if w is not None]
    if waits:
        out["wait_us"] = round(sum(waits) / len(waits) * us, 3)
    return out
