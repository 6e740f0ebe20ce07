"""The modelled time of a persistent kernel, by simulating its schedule (issue #25).

A persistent kernel's programs take tasks in order from a queue (``codegen/triton/persistent.py``):
each task is one program of one phase.  The schedule is list-scheduled here, event by event: a
worker (a program; one per SM) takes the next task when it is free, pays the queue's atomic and
then waits until the task's dependencies are done — every task of each phase it waits for
(``Phase.after``; by default the phase before) — runs the task, and pays the atomic that counts it
done.  A task runs as long as one program of its kernel runs in that kernel's own launch (the kernel's modelled body divided by its
waves: ``Cost.waves``), a conservative figure: one program alone on an SM is no slower than one
sharing it.  The kernel's time is one launch plus the makespan.  Everything here is MODELLED.

DRAM and prefetch (with a ``dram_rate``): every DRAM byte crosses one queue served at the
target's DRAM rate in the order it is asked for — a task's own bytes (its share of its kernel's
DRAM bytes) when it starts, so a task ends no earlier than the queue has delivered them, and
prefetches (``codegen/triton/persistent.prefetches``): a phase's tasks, when taken and before any
wait, ask L2 for an equal share of the next weights later phases read (what no phase of the kernel
writes), so those bytes stream while the phases before them run and wait.  A task of such a phase
runs at its *warm* time — its kernel's modelled body without the prefetched DRAM bytes — from
when every share asked for it has arrived, or at its cold time from its start, whichever ends
first.  (A prefetch waits for no reply, so no bytes-in-flight bound applies to it: an assumption until a GPU measures
it.)  The makespan is at least every phase's DRAM bytes at the DRAM rate.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Phase:
    tasks: int                 # programs of the phase's kernel
    task_s: float              # one task's modelled time
    warm_s: float | None = None    # one task's time once what the phase before prefetched is in L2
    prefetch_bytes: float = 0.0    # bytes its tasks ask L2 for, for later phases (an equal share each)
    prefetch_for: tuple[int, ...] = ()     # those phases (indices in the run)
    dram_bytes: float = 0.0        # its kernel's DRAM bytes (with every phase's: a floor on the run)
    fetched_bytes: float = 0.0     # of those, what the phase before prefetched (not read warm)
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
    end: float                 # when it is counted done


def schedule(phases: Sequence[Phase], programs: int, atomic_s: float, dram_rate: float = 0.0) -> list[Task]:
    """The phases' tasks on ``programs`` workers, in the order they are taken: each phase after the
    whole of each phase it waits for, every task paying two atomics (take, done) and a waiting
    task the acquire that sees the last of them open.  A free worker takes the next task (the earliest
    free first, the lowest-numbered among equals: deterministic).  With ``dram_rate`` (bytes/s),
    prefetches are modelled (the module docstring); without, none."""
    free = [(0.0, w) for w in range(max(programs, 1))]     # (free time, worker): a heap
    heapq.heapify(free)
    finished: list[float] = []               # per phase, when its last task is counted done
    ready: dict[int, float] = {}             # phase -> when the bytes prefetched for it are all in L2
    queue = 0.0                              # when the DRAM queue drains
    out = []
    for p, phase in enumerate(phases):
        after = phase.after if phase.after is not None else ((p - 1,) if p else ())
        barrier = max((finished[d] for d in after), default=0.0)
        done, arrived = barrier, 0.0
        share = phase.prefetch_bytes / phase.tasks if dram_rate else 0.0
        for _ in range(phase.tasks):
            at, w = heapq.heappop(free)
            start = at + atomic_s                           # the queue's atomic
            if share:                                       # asked for before any wait
                queue = max(queue, start) + share / dram_rate
                arrived = queue
            if after and start < barrier:
                start = barrier + atomic_s                   # the acquire that sees it open
            run, own = start + phase.task_s, phase.dram_bytes
            warm = max(start, ready.get(p, 0.0))
            if phase.warm_s is not None and dram_rate and warm + phase.warm_s < run:
                run, own = warm + phase.warm_s, phase.dram_bytes - phase.fetched_bytes
            if dram_rate and own > 0:                       # its own bytes, after what was asked before
                queue = max(queue, start) + own / phase.tasks / dram_rate
                run = max(run, queue)
            end = run + atomic_s                            # the task, then counted done
            done = max(done, end)
            out.append(Task(p, w, start, end))
            heapq.heappush(free, (end, w))
        finished.append(done)
        for q in phase.prefetch_for:
            ready[q] = max(ready.get(q, 0.0), arrived)
    return out


def simulate(phases: Sequence[Phase], programs: int, atomic_s: float, dram_rate: float = 0.0) -> float:
    """The makespan (seconds) of ``schedule``; with ``dram_rate``, at least the phases' DRAM bytes
    at that rate."""
    span = max((t.end for t in schedule(phases, programs, atomic_s, dram_rate)), default=0.0)
    return max(span, sum(p.dram_bytes for p in phases) / dram_rate) if dram_rate else span
