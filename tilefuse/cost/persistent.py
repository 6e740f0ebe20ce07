"""The modelled time of a persistent kernel, by simulating its schedule (issue #25).

A persistent kernel's programs take tasks in order from a queue (``codegen/triton/persistent.py``):
each task is one program of one phase.  The schedule is list-scheduled here, event by event: a
worker (a program; one per SM, or two where the run's binary holds two: the caller's
``programs``) takes the next task when it is free, pays the queue's atomic (a round trip to L2)
and then waits until the task's dependencies are done — every task of each phase it
waits for whole (``Phase.after``; by default the phase before), and each earlier task it waits for
alone (``Phase.needs``: tile-level edges), seen by an acquiring read (another round trip) — and runs
the task, which is counted done by a posted release (``red``: the worker does not wait for it; the
count reaches L2 half a round trip later).  A task runs as long as one program of its kernel runs in
that kernel's own launch (the kernel's modelled body divided by its waves: ``Cost.waves``), a
conservative figure where a wave there shares each SM among as many programs as the persistent
kernel has an SM; with two an SM, a phase of fewer tasks than SMs may find two of them on one
SM, which is not charged (a trace on the H200 measured it: BERT-small's 24 tasks of a phase on 17
SMs, the run 1.23x slower than at one an SM, so the planner runs one: ``PER_SM``).  The kernel's time
is one launch plus the makespan.  Everything here is MODELLED.

DRAM and prefetch (with a ``dram_rate``, bytes/s): the tasks' own DRAM bytes (each task its share of
its kernel's, asked for when it starts) are served in order at that rate, phase by phase (phases
side by side each at the full rate: the makespan's floor below bounds them together), so a task ends
no earlier than its phase's bytes up to its own are delivered; prefetches
(``codegen/triton/persistent.prefetches``) use what is left: a phase's tasks, when taken and before
any wait, ask L2 for an equal share each of the next weights later phases read (what no phase of
the kernel writes), task ``i`` the ``i``-th share of that part of the stream (the bytes for the
nearest phase first: ``Phase.prefetch_for`` in the stream's order), and a share arrives once every
byte asked for before it, demand or prefetch, has crossed the bus.  The bytes prefetched for a phase are the first of its DRAM bytes, and its tasks
read its bytes in equal slices in task order (a GEMV's row blocks): task ``i``'s slice is prefetched
in the part the prefetches reached, which arrives as the asks covering it do; the task waits for
that part and reads the rest itself, through the queue and at most at the rate its own requests in
flight draw (``Phase.solo_rate``: Little's law), taking no less than its *warm* time (its kernel's
modelled body with every DRAM byte read from L2).  Demand ahead of prefetch, no bytes-in-flight
bound on a prefetch (it waits for no reply), and the slices' order are assumptions until a GPU
measures them.  The makespan is at least every phase's DRAM bytes at the DRAM rate.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Phase:
    tasks: int                 # programs of the phase's kernel
    task_s: float              # one task's modelled time
    warm_s: float | None = None    # one task's time with every DRAM byte of its slice in L2 (prefetched)
    prefetch_bytes: float = 0.0    # bytes its tasks ask L2 for, for later phases (an equal share each)
    prefetch_for: tuple[tuple[int, float], ...] = ()   # (a later phase, bytes asked for it) pairs,
                                                       # in the stream's order (the nearest first)
    dram_bytes: float = 0.0        # its kernel's DRAM bytes (with every phase's: a floor on the run)
    fetched_bytes: float = 0.0     # of those, the first ones, which earlier phases prefetched
    solo_rate: float = 0.0         # bytes/s one of its tasks draws from DRAM alone (its requests in
                                   # flight a round trip); 0: a task not prefetched runs its cold time
    after: tuple[int, ...] | None = None   # the phases it waits for whole (None: the one before it)
    needs: tuple[tuple[int, ...], ...] = ()  # per task, the earlier tasks (in run order) it waits
                                             # for one by one (tile-level edges); () for none


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
    arrived: dict[int, list[tuple[float, float]]] = {}    # phase -> (bytes prefetched for it, when in L2)
    total = 0.0                              # when every DRAM byte asked for is delivered
    out = []
    for p, phase in enumerate(phases):
        after = phase.after if phase.after is not None else ((p - 1,) if p else ())
        barrier = max((finished[d] for d in after), default=0.0)
        done = barrier
        demand = 0.0                         # when this phase's own DRAM bytes so far are delivered
        share = phase.prefetch_bytes / phase.tasks if dram_rate else 0.0
        slice_ = phase.dram_bytes / phase.tasks
        warm = phase.warm_s is not None and bool(dram_rate) and phase.fetched_bytes > 0 and slice_ > 0
        for i in range(phase.tasks):
            at, w = heapq.heappop(free)
            start = at + atomic_s                           # the queue's atomic
            if share:                                       # asked for before any wait: task i
                offset = 0.0                                # the stream's i-th share, in order
                for q, nbytes in phase.prefetch_for:
                    part = min(offset + nbytes, (i + 1) * share) - max(offset, i * share)
                    offset += nbytes
                    if part > 0:
                        total = max(total, start) + part / dram_rate
                        got = arrived.setdefault(q, [])
                        got.append(((got[-1][0] if got else 0.0) + part, total))
            gate = max(barrier, max((out[u].end for u in phase.needs[i]), default=0.0)) if phase.needs \
                else barrier
            if (after or phase.needs) and start < gate:
                start = gate + atomic_s                      # the acquire that sees it open
            run, own = start + phase.task_s, slice_
            if warm:                                        # its slice's prefetched part
                pre = min(max(phase.fetched_bytes - i * slice_, 0.0), slice_)
                ready = _arrival(arrived.get(p, ()), i * slice_ + pre) if pre > 0 else 0.0
                if ready < math.inf:
                    own = slice_ - pre
                    if phase.solo_rate:     # the rest at its own rate (the queue shares the DRAM)
                        took = max(phase.warm_s, own / phase.solo_rate)
                    else:
                        took = phase.task_s - (phase.task_s - phase.warm_s) * pre / slice_
                    run = max(start + took, ready)
            if dram_rate and own > 0:                       # its own bytes: ahead of prefetches
                demand = max(demand, start) + own / dram_rate
                total = max(total, start) + own / dram_rate
                run = max(run, demand)
            end = run + atomic_s / 2                        # counted done: posted, seen in L2 then
            done = max(done, end)
            out.append(Task(p, w, start, end))
            heapq.heappush(free, (run, w))
        finished.append(done)
    return out


def _arrival(got, nbytes: float) -> float:
    """When the first ``nbytes`` prefetched for a phase are in L2 (``got``: (bytes so far, when)
    as the asks arrive); never (inf), where the asks do not reach that far."""
    for reached, when in got:
        if reached >= nbytes * (1 - 1e-9):
            return when
    return math.inf


def simulate(phases: Sequence[Phase], programs: int, atomic_s: float, dram_rate: float = 0.0) -> float:
    """The makespan (seconds) of ``schedule``; with ``dram_rate``, at least the phases' DRAM bytes
    at that rate."""
    span = max((t.end for t in schedule(phases, programs, atomic_s, dram_rate)), default=0.0)
    return max(span, sum(p.dram_bytes for p in phases) / dram_rate) if dram_rate else span
