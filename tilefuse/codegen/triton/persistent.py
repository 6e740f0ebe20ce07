"""Persistent kernels: consecutive generated kernels as the phases of one launch (issue #25, first
stage: phase barriers).

Each phase is a kernel of the plan printed as a device function taking its program ids
(``Kernel.phase``); the persistent kernel's programs take *tasks* — one per program of every
phase, phases in plan order — from an atomic counter, run each through its phase's function, and
count it done.  A task of phase ``p > 0`` first waits until every task of phase ``p - 1`` is done
(a phase barrier: the dependencies between phases are not analysed yet, so a phase waits for the
whole phase before it, and so, transitively, for all of them).

Why it cannot deadlock: tasks are handed out in order, so a waiting task's predecessors were all
taken before it, by programs that are running (the grid never exceeds what the GPU holds at once:
the caller's ``programs``) and that wait only for tasks taken before theirs.  In Triton's
interpreter the programs run one after another: the first takes every task in order, and every
wait is already met.

Memory ordering: a task's stores are made visible before it is counted done (a CTA barrier, then
an atomic add with release semantics); a wait reads the count with acquire semantics; a phase's
loads of tensors an earlier phase of the launch wrote bypass L1 (``Kernel.written``: loaded
``.cg``), so a program never reads a line its SM cached before another SM rewrote it.  Byte
ranges the arena gives to two phases' tensors are safe for the same reason: a phase starts after
every earlier one has finished reading and writing.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import replace
from typing import Callable, Sequence

import torch

from ..kernel import Kernel
from .emit import triton_source
from .interpreter import interpreted, interpreting

COUNTERS = "tf_counters"     # int32 [1 + phases]: the task counter, then each phase's done count


def phase_kernels(kernels: Sequence[Kernel], reads: Sequence[Sequence[str]],
                  writes: Sequence[Sequence[str]]) -> list[Kernel]:
    """The kernels as phases: device functions, each input an earlier phase writes read past L1."""
    out, written = [], set()
    for k, ins, outs in zip(kernels, reads, writes):
        late = frozenset(j for j, n in enumerate(ins) if n in written)
        out.append(replace(k, phase=True, written=k.written | late, name=f"{k.name}_phase"))
        written.update(outs)
    return out


def persistent_source(name: str, phases: Sequence[Kernel], args: Sequence[Sequence[str]],
                      params: Sequence[str]) -> str:
    """The module of the persistent kernel ``name``: the phases' functions and the driver, whose
    parameters are ``params`` (tensor names, each a pointer) and the counters; ``args``: each
    phase's tensors in its inputs-then-outputs order."""
    modules = [triton_source(p) for p in phases]
    head, bodies = [], []
    for src in modules:
        lines = src.split("\n\n\n")
        head.extend(line for line in lines[0].splitlines() if line.startswith(("import", "from")))
        bodies.extend(lines[1:])
    pointer = {n: f"p{k}" for k, n in enumerate(params)}
    total = sum(_tasks(p) for p in phases)
    driver = ["@triton.jit", f"def {name}({', '.join(pointer[n] for n in params)}, {COUNTERS}):",
              f"    t = tl.atomic_add({COUNTERS}, 1)",
              f"    while t < {total}:"]
    end = 0
    for p, (phase, names) in enumerate(zip(phases, args)):
        start, end = end, end + _tasks(phase)
        driver.append(f"        {'if' if p == 0 else 'elif'} t < {end}:")
        if p:
            driver.append(f"            while tl.atomic_add({COUNTERS} + {p}, 0, sem=\"acquire\") < {_tasks(phases[p - 1])}:")
            driver.append("                pass")
        ids = _program_ids(phase.grid, f"(t - {start})")
        blocks = [str(a.block) for a in _blocks(phase)]
        driver.append(f"            {phase.name}({', '.join([pointer[n] for n in names] + ids + blocks)})")
        driver.append("            tl.debug_barrier()")
        driver.append(f"            tl.atomic_add({COUNTERS} + {p + 1}, 1, sem=\"release\")")
    driver.append(f"        t = tl.atomic_add({COUNTERS}, 1)")
    imports = list(dict.fromkeys(head))
    # each phase a function of its own (not inlined): its shared memory and registers are its own,
    # not added to every other phase's by the compiler (LLaMA small's 27 kernels inlined needed
    # 983 KB of shared memory and spilled; as calls, 209 KB and 166 registers, no spills: sm_90)
    bodies = [_called(b, {p.name for p in phases}) for b in bodies]
    helpers = list(dict.fromkeys(b.rstrip("\n") for b in bodies))
    return "\n".join(imports) + "\n\n\n" + "\n\n\n".join(helpers + ["\n".join(driver)]) + "\n"


def _called(block: str, names) -> str:
    """A function of the module, not inlined where it is one of the phases ``names``."""
    m = re.match(r"@triton\.jit\ndef (\w+)\(", block)
    return block.replace("@triton.jit\n", "@triton.jit(noinline=True)\n", 1) if m and m.group(1) in names else block


def _tasks(k: Kernel) -> int:
    n = 1
    for g in k.grid:
        n *= g
    return n


def _program_ids(grid: tuple[int, ...], task: str) -> list[str]:
    """Program ids of a task within its phase, dimension 0 fastest (as a launch grid numbers them)."""
    ids, stride = [], 1
    for g in grid:
        ids.append(f"({task} // {stride}) % {g}" if stride > 1 else f"{task} % {g}")
        stride *= g
    return ids


def _blocks(k: Kernel):
    return list({a.block_name: a for a in k.axes}.values())


def persistent_module(name: str, kernels: Sequence[Kernel], reads: Sequence[Sequence[str]],
                      writes: Sequence[Sequence[str]]) -> tuple[str, list[str]]:
    """(the source of the persistent kernel ``name`` of ``kernels`` as phases, its tensors in
    parameter order)."""
    phases = phase_kernels(kernels, reads, writes)
    params = list(dict.fromkeys(n for ins, outs in zip(reads, writes) for n in (*ins, *outs)))
    args = [list(ins) + list(outs) for ins, outs in zip(reads, writes)]
    return persistent_source(name, phases, args, params), params


def compile_persistent(name: str, kernels: Sequence[Kernel], reads: Sequence[Sequence[str]],
                       writes: Sequence[Sequence[str]], programs: int) -> tuple[Callable, str, list[str]]:
    """(launcher, source, its tensors in parameter order) of the persistent kernel running
    ``kernels`` as phases (their tensors named by ``reads``/``writes``, inputs-then-outputs order);
    the launcher takes a ``{name: tensor}`` mapping and runs on at most ``programs`` programs."""
    from .launch import _descriptor_scratch, load_kernel
    source, params = persistent_module(name, kernels, reads, writes)
    fn = load_kernel(source, name)
    phases = len(kernels)
    grid = (max(1, min(programs, sum(_tasks(k) for k in kernels))),)
    warps, stages = max(k.num_warps for k in kernels), max(k.num_stages for k in kernels)
    written = {n for outs in writes for n in outs}
    tma = any(k.tma for k in kernels) and "make_tensor_descriptor" in source
    counters: dict = {}

    def launch(buffers) -> None:
        device = next(iter(buffers.values())).device
        c = counters.get(device)
        if c is None:
            c = counters[device] = torch.zeros(phases + 1, dtype=torch.int32, device=device)
        else:
            c.zero_()
        ts = [buffers[n] if n in written else buffers[n].contiguous() for n in params]
        if tma:         # a tensor descriptor's base must be 16-byte aligned (a view may not be)
            ts = [t if n in written or t.data_ptr() % 16 == 0 else t.clone() for n, t in zip(params, ts)]
            if not interpreted():
                _descriptor_scratch()
        with interpreting() if interpreted() else contextlib.nullcontext():
            fn[grid](*ts, c, num_warps=warps, num_stages=stages)

    return launch, source, params
