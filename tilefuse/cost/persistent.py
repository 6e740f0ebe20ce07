"""The modelled time of a persistent kernel, by simulating its schedule (issue #25).

A persistent kernel's programs take tasks in order from a queue (``codegen/triton/persistent.py``):
each task is one program of one phase.  The schedule is list-scheduled here, event by event: a
worker (a program; one per SM) takes the next task when it is free, pays the queue's atomic (a
round trip to L2) and then waits until the task's dependencies are done — every task of each phase
it waits for (``Phase.after``; by default the phase before), seen by an acquiring read (another
round trip) — and runs the task, which is counted done by a posted release (``red``: the worker
does not wait for it; the count reaches L2 half a round trip later).  A task runs as long as one
program of its kernel runs in that kernel's own launch (the kernel's modelled body divided by its
waves: ``Cost.waves``), a conservative figure: one program alone on an SM is no slower than one
sharing it.  The kernel's time is one launch plus the makespan.  Everything here is MODELLED.

DRAM and prefetch (with a ``dram_rate``, bytes/s): the tasks' own DRAM bytes (each task its share
of its kernel's, asked for when it starts) are served in order at that rate, phase by phase
(phases side by side each at the full rate: the makespan's floor below bounds them together), so a
task ends no earlier than its phase's bytes up to its own are delivered; prefetches
(``codegen/triton/persistent.prefetches``) use what is left: a phase's tasks, when taken and
before any wait, ask L2 for an equal share of the next weights later phases read (what no phase of
the kernel writes), and a share arrives once every byte asked for before it, demand or prefetch,
has crossed the bus. A task of a phase asked for runs at its *warm* time — its kernel's modelled
body without the prefetched DRAM bytes — from when every share asked for it has arrived, or at its
cold time from its start, whichever ends first. Demand ahead of prefetch, and no bytes-in-flight
bound on a prefetch (it waits for no reply), are assumptions until a GPU measures them. The
makespan is at least every phase's DRAM bytes at the DRAM rate.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Phase:
    tasks: int                 # programs of the phase's kernel
    task_s: float              # one task's modelled time
    warm_s: float | None = None    # one task's time once what earlier phases prefetched for it is in L2
    prefetch_bytes: float = 0.0    # bytes its tasks ask L2 for, for later phases (an equal share each)
    prefetch_for: tuple[int, ...] = ()     # those phases (indices in the run)
    dram_bytes: float = 0.0        # its kernel's DRAM bytes (with every phase's: a floor on the run)
    fetched_bytes: float = 0.0     # of those, what earlier phases prefetched (not read when warm)
    after: tuple[int, ...] | None = None   # the phases it waits for (None: the one before it)


def phase_of(cost, launch_s: float, tasks: int) -> Phase:
    """A kernel launching ``tasks`` programs as a phase, from its modelled ``Cost`` (which
    includes a launch)."""
    body = max(cost.seconds - launch_s, 0.0)
    return Phase(max(tasks, 1), body / max(int(cost.waves), 1))


@dataclass(frozen=True)
class Task:
    phase: int
    worker: int
    start: float               # when it starts running (after the queue's atomic and its wait)
    end: float                 # when its count of done reaches L2 (its worker is free before)


def schedule(phases: Sequence[Phase], programs: int, atomic_s: float, dram_rate: float = 0.0) -> list[Task]:
    """The phases' tasks on ``programs`` workers, in the order they are taken: each phase after the
    whole of each phase it waits for, every task paying the queue's atomic (``atomic_s``, a round
    trip), a waiting task the acquire that sees the last of them open (another), a task's count of
    done reaching L2 half of one after it ends.  A free worker takes the next task (the earliest
    free first, the lowest-numbered among equals: deterministic).  With ``dram_rate`` (bytes/s),
    prefetches are modelled (the module docstring); without, none."""
    free = [(0.0, w) for w in range(max(programs, 1))]     # (free time, worker): a heap
    heapq.heapify(free)
    finished: list[float] = []               # per phase, when its last task is counted done
    ready: dict[int, float] = {}             # phase -> when the bytes prefetched for it are all in L2
    total = 0.0                              # when every DRAM byte asked for is delivered
    out = []
    for p, phase in enumerate(phases):
        after = phase.after if phase.after is not None else ((p - 1,) if p else ())
        barrier = max((finished[d] for d in after), default=0.0)
        done, arrived = barrier, 0.0
        demand = 0.0                         # when this phase's own DRAM bytes so far are delivered
        share = phase.prefetch_bytes / phase.tasks if dram_rate else 0.0
        for _ in range(phase.tasks):
            at, w = heapq.heappop(free)
            start = at + atomic_s                           # the queue's atomic
            if share:                                       # asked for before any wait
                total = max(total, start) + share / dram_rate
                arrived = total
            if after and start < barrier:
                start = barrier + atomic_s                   # the acquire that sees it open
            run, own = start + phase.task_s, phase.dram_bytes
            warm = max(start, ready.get(p, 0.0))
            if phase.warm_s is not None and dram_rate and warm + phase.warm_s < run:
                run, own = warm + phase.warm_s, phase.dram_bytes - phase.fetched_bytes
            if dram_rate and own > 0:                       # its own bytes: ahead of prefetches
                demand = max(demand, start) + own / phase.tasks / dram_rate
                total = max(total, start) + own / phase.tasks / dram_rate
                run = max(run, demand)
            end = run + atomic_s / 2                        # counted done: posted, seen in L2 then
            done = max(done, end)
            out.append(Task(p, w, start, end))
            heapq.heappush(free, (run, w))
        finished.append(done)
        for q in phase.prefetch_for:
            ready[q] = max(ready.get(q, 0.0), arrived)
    return out


def simulate(phases: Sequence[Phase], programs: int, atomic_s: float, dram_rate: float = 0.0) -> float:
    """The makespan (seconds) of ``schedule``; with ``dram_rate``, at least the phases' DRAM bytes
    at that rate."""
    span = max((t.end for t in schedule(phases, programs, atomic_s, dram_rate)), default=0.0)
    return max(span, sum(p.dram_bytes for p in phases) / dram_rate) if dram_rate else span
