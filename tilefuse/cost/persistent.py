"""The modelled time of a persistent kernel, by simulating its schedule (issue #25).

A persistent kernel's programs take tasks in order from a queue (``codegen/triton/persistent.py``):
each task is one program of one phase.  The schedule is list-scheduled here, event by event: a
worker (a program; one per SM) takes the next task when it is free, pays the queue's atomic and
then waits until the task's dependencies are done — for a phase barrier, every task of the phase
before — runs the task, and pays the atomic that counts it done.  A task runs as long as one
program of its kernel runs in that kernel's own launch (the kernel's modelled body divided by its
waves: ``Cost.waves``), a conservative figure: one program alone on an SM is no slower than one
sharing it.  The kernel's time is one launch plus the makespan.  Everything here is MODELLED.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Phase:
    tasks: int                 # programs of the phase's kernel
    task_s: float              # one task's modelled time


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


def schedule(phases: Sequence[Phase], programs: int, atomic_s: float) -> list[Task]:
    """The phases' tasks on ``programs`` workers, in the order they are taken: each phase after the
    whole phase before it (a barrier), every task paying two atomics (take, done) and a waiting
    task the acquire that sees the barrier open.  A free worker takes the next task (the earliest
    free first, the lowest-numbered among equals: deterministic)."""
    free = [(0.0, w) for w in range(max(programs, 1))]     # (free time, worker): a heap
    heapq.heapify(free)
    barrier = 0.0                            # when the phase before is done
    out = []
    for p, phase in enumerate(phases):
        done = barrier
        for _ in range(phase.tasks):
            at, w = heapq.heappop(free)
            start = at + atomic_s                           # the queue's atomic
            if p and start < barrier:
                start = barrier + atomic_s                   # the acquire that sees it open
            end = start + phase.task_s + atomic_s           # the task, then counted done
            done = max(done, end)
            out.append(Task(p, w, start, end))
            heapq.heappush(free, (end, w))
        barrier = done
    return out


def simulate(phases: Sequence[Phase], programs: int, atomic_s: float) -> float:
    """The makespan (seconds) of ``schedule``."""
    return max((t.end for t in schedule(phases, programs, atomic_s)), default=0.0)
