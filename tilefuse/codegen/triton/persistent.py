"""Persistent kernels: consecutive generated kernels as the phases of one launch (issue #25).

Each phase is a kernel of the plan printed as a device function taking its program ids
(``Kernel.phase``); the persistent kernel's programs take *tasks* — one per program of every
phase, phases in plan order — from an atomic counter, run each through its phase's function, and
count it done.  A task first waits for what it depends on (``task_dependencies``): the earlier
phases that write what it reads, or read or write what it writes — for each, only the tasks whose
tiles its own tile touches, where those are some of them (Souffle's one-relies-on-one: a row
block's task after the row blocks it reads, through each task's done flag and a table of what
each task waits for, ``NEEDS``), or the whole phase where it needs every task (one-relies-on-many:
a GEMM's K over a whole activation, a row reduction over all columns; the phase's done count).
Which tiles a task touches is the bounding box of its index expressions over its tile
(``codegen/regions.py``).  Phases that do not depend on one another (a decode step's cache writes
and the query's transpose) run side by side, and a task whose tiles are done starts while the
rest of their phase runs.

(The next ticket taken at a task's start instead would not hide the ticket's round trip: Triton
broadcasts a scalar atomic's value through shared memory behind a CTA barrier right after the
``ATOMG``, sm_90 SASS, so the program waits for it there either way.)

Why it cannot deadlock: tasks are handed out in order, so a waiting task's predecessors were all
taken before it, by programs that are running (the grid never exceeds what the GPU holds at once:
the caller's ``programs``) and that wait only for tasks taken before theirs.  In Triton's
interpreter the programs run one after another: the first takes every task in order, and every
wait is already met.

Memory ordering: a task's stores are made visible before it is counted done (a CTA barrier, then
atomic adds with release semantics to its phase's count and, where a later task waits for it alone,
its own flag); a wait spins on acquire loads of the count or flags (a block of flags at once, until
all are set: loads of one line are served side by side, where read-modify-writes would queue at L2
behind the producers' own adds), and the load that sees the count complete synchronizes with every
release counted into the value it reads (later adds to the same counter continue the release
sequence), so the wait ends with no further round trip (the queue's ticket orders nothing: relaxed) (``ACQUIRE_FN``: ``tl.atomic_load`` where
Triton has it, 3.9; ``ld.acquire.gpu`` in PTX on older ones; in their interpreter, which runs the
programs one after another and cannot run PTX, a plain load); a phase implied by another one waited
for whole is not waited for again (that one's tasks acquired it before releasing theirs:
happens-before is transitive; a tile-level edge implies nothing about the phases behind it, so
those are kept); a phase's loads of tensors an earlier phase of the launch wrote bypass L1 (``Kernel.written``: loaded ``.cg``), so a program never
reads a line its SM cached before another SM rewrote it. Dependencies are by tensor name, which is
exact only because no two tensors a run touches share arena bytes (``runtime/memory.plan_memory``
keeps each alive through the runs it meets): two phases that do not depend on each other may run at
once.

Prefetch: the weights the phases read (what no phase of the kernel writes, nor gathers from: an
embedding table's rows are picked by data) form one stream in the order they are first read; each
phase's tasks, once taken and before they wait, ask L2 for an equal share each of the stream's next
part (``prefetches``: up to ``PREFETCH_WINDOW`` bytes past what the phases so far have read), task
``i`` its ``i``-th share, so the tasks taken first ask for the bytes needed first
(``prefetch_share``), one ``prefetch.global.L2`` per 128-byte line, so weights come from DRAM while earlier phases run and
wait at their barriers. A part is asked for only where what the phases in between read fits beside
it in L2 (``PREFETCH_REACH``): a line evicted before its use is a wasted DRAM read (a GEMV's
weights, read once, are loaded evict-first and do not count). A prefetch is a hint: it changes no
value (L2 is the point of coherence, and a line fetched early is the line any later load sees), so
it needs no ordering argument, and Triton's interpreter, which cannot run PTX, runs the kernel
without it.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Callable, Sequence

import torch

from ...ir.expr import Expr, Load, walk
from ..kernel import Kernel
from ..dependencies import Waits, task_dependencies
from .emit import triton_source
from .interpreter import interpreted, interpreting

COUNTERS = "tf_counters"     # int32 [1 + phases + tasks]: the task counter, each phase's done count,
                             # each task's done flag (set where a later task waits for it alone)
NEEDS = "tf_needs"           # int32: per task, where in it the tasks it waits for one by one are
TILE_LANES = 32              # earlier tasks a waiting task checks at once (a block of flags)
PREFETCH_FN = "tf_prefetch_l2"
TRACE = "tf_trace"           # int64 [tasks, TRACE_FIELDS] (``trace=True``): per task the GPU's clock
TRACE_FIELDS = 4             # (ns) when taken, when its waits ended, when counted done, and its SM
CLOCK_FN, SM_FN = "tf_clock", "tf_smid"
ACQUIRE_FN = "tf_acquire"    # an acquire load of a counter or flag (the wait's spin)
LINE_BYTES = 128             # an L2 line: one prefetch each
PREFETCH_LANES = 128         # lines a program asks for at once (one per thread at 4 warps)
PREFETCH_MIN_BYTES = 64 << 10    # a smaller tensor is a few lines: not worth a task's instructions
PREFETCH_WINDOW = 16 << 20        # bytes asked for ahead of what the phases so far have read
PREFETCH_REACH = 24 << 20        # what may pass through L2 between a line's prefetch and its use:
                                 # with the window, inside an A100's or H100's L2 (40, 50 MB)


@dataclass(frozen=True)
class Prefetch:
    """Elements ``[first, first + numel)`` of a tensor the phase ``phase`` reads, prefetched by an
    earlier phase."""
    tensor: str
    first: int
    numel: int
    itemsize: int
    phase: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


def prefetches(kernels: Sequence[Kernel], reads: Sequence[Sequence[str]],
               writes: Sequence[Sequence[str]]) -> list[list[Prefetch]]:
    """Per phase, what its tasks prefetch (the module docstring): the stream is every tensor of
    ``PREFETCH_MIN_BYTES`` or more that no phase writes, at the phase that first reads it (not the
    first phase: nothing runs before it), unless that phase gathers from it (``gathers``); phase
    ``p`` asks for the stream from where the asks so far end (or what phases up to ``p`` read, if
    further) to ``PREFETCH_WINDOW`` bytes past the latter, stopping at the first tensor whose reader
    is more than ``PREFETCH_REACH`` bytes of phase inputs away (inputs a phase streams evict-first,
    ``Kernel.streamed``, do not count: they push nothing out of L2). The cost model reads the same
    list."""
    written = {n for outs in writes for n in outs}
    seen: set[str] = set()
    stream = []                                  # (reader, name, numel, itemsize, stream offset)
    size = 0
    reach = _kept(kernels, reads)
    for q, (k, ins) in enumerate(zip(kernels, reads)):
        types = dict(zip(ins, k.inputs))
        gathered = {ins[j] for j in gathers(k)}
        for n, t in types.items():
            if q and n not in written and n not in seen and n not in gathered and t.nbytes >= PREFETCH_MIN_BYTES:
                stream.append((q, n, t.numel, t.dtype.itemsize, size))
                size += t.nbytes
        seen.update(ins)
    out, asked = [], 0
    for p in range(len(kernels)):
        read = sum(t[2] * t[3] for t in stream if t[0] <= p)     # the stream up to phase p's own
        lo, hi, mine = max(asked, read), read + PREFETCH_WINDOW, []
        for q, n, numel, item, at in stream:
            if at + numel * item <= lo or q <= p:
                continue
            if at >= hi or sum(reach[p:q]) > PREFETCH_REACH:
                break
            first = max(lo - at, 0) // item
            last = min(hi - at, numel * item) // item
            if last > first:
                mine.append(Prefetch(n, first, last - first, item, q))
                asked = at + last * item
        out.append(mine)
    return out


def prefetch_share(mine: Sequence[Prefetch], tasks: int) -> int:
    """The bytes each of a phase's ``tasks`` asks for of what it prefetches (``mine``, one part of
    the stream in order): equal shares, each a whole number of lines, task ``i`` the ``i``-th."""
    per = -(-sum(f.nbytes for f in mine) // max(tasks, 1))      # (ceiling divisions)
    return -(-per // LINE_BYTES) * LINE_BYTES


def gathers(k: Kernel) -> set[int]:
    """The input slots ``k`` reads through an index that depends on loaded data (an embedding
    table's rows picked by token ids): which bytes it reads is not known ahead, so none are
    prefetched (the table is mostly never read)."""
    out: set[int] = set()

    def visit(x) -> None:
        if isinstance(x, Expr):
            for n in walk(x):
                if isinstance(n, Load) and any(isinstance(m, Load) for i in n.index for m in walk(i)):
                    out.add(n.tensor)
        elif isinstance(x, tuple):
            for y in x:
                visit(y)
        elif is_dataclass(x):
            for f in fields(x):
                visit(getattr(x, f.name))
    visit(k.body)
    return out


def resident(kernels: Sequence[Kernel], reads: Sequence[Sequence[str]],
             writes: Sequence[Sequence[str]], partial=frozenset()) -> list[int]:
    """Per phase, the bytes it reads of tensors an earlier phase of the kernel wrote and L2 still
    holds: written and read with at most ``PREFETCH_REACH`` bytes of phase inputs L2 keeps in
    between (the cost model reads them from L2, not DRAM); not the ``partial`` ones, of which the
    writer wrote a few rows (a cache written in place)."""
    reach = _kept(kernels, reads)
    writer: dict[str, int] = {}
    out = []
    for q, (k, ins, outs) in enumerate(zip(kernels, reads, writes)):
        types = dict(zip(ins, k.inputs))
        out.append(sum(t.nbytes for n, t in types.items()
                       if n in writer and t.nbytes + sum(reach[writer[n] + 1:q]) <= PREFETCH_REACH))
        writer.update((n, q) for n in outs if n not in partial)
    return out


def _kept(kernels: Sequence[Kernel], reads: Sequence[Sequence[str]]) -> list[int]:
    """Each phase's input bytes that pass through L2 and stay (not those it streams evict-first;
    of a tensor it gathers from, at most as many as it writes: the rows it picks)."""
    out = []
    for k, ins in zip(kernels, reads):
        kept = {n for j, n in enumerate(ins) if j not in k.streamed}
        gathered = {ins[j] for j in gathers(k)}
        written = sum(t.nbytes for t in k.outputs)
        out.append(sum(min(t.nbytes, written) if n in gathered else t.nbytes
                       for n, t in dict(zip(ins, k.inputs)).items() if n in kept))
    return out


# the part of one tensor in a program's share of the phase's prefetch: the share is bytes
# [task * share, (task + 1) * share) of the part of the stream the phase asks for (a whole number
# of lines; the programs taken first ask for the bytes needed first), the tensor's elements
# [first, first + numel) its bytes [offset, offset + numel * ITEM); out-of-range lanes repeat the
# first line
_PREFETCH_SOURCE = f"""@triton.jit
def {PREFETCH_FN}(ptr, first, numel, offset, task, share, ITEM: tl.constexpr, LINE: tl.constexpr,
                  LANES: tl.constexpr):
    lo = first + tl.maximum(task * share - offset, 0) // ITEM
    hi = first + tl.minimum((task + 1) * share - offset, numel * ITEM) // ITEM
    for s in range(lo, hi, LANES * LINE):
        at = s + tl.arange(0, LANES) * LINE
        at = tl.where(at < hi, at, lo)
        tl.inline_asm_elementwise("prefetch.global.L2 [$1];\\n\\tmov.u32 $0, 0;", "=r,l", [ptr + at],
                                  dtype=tl.int32, is_pure=False, pack=1)"""


# the wait's acquire load, by what the installed Triton offers: tl.atomic_load (3.9), PTX (3.6 on a
# GPU), a plain load (3.6's interpreter: its programs run one after another, every wait already met)
def _acquire_source(ptx: bool) -> str:
    import triton.language as tl
    if hasattr(tl, "atomic_load"):
        load = 'tl.atomic_load(ptr, sem="acquire")'
    elif ptx:
        load = ('tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], '
                'dtype=tl.int32, is_pure=False, pack=1)')
    else:
        load = "tl.load(ptr, volatile=True)"
    return f"@triton.jit\ndef {ACQUIRE_FN}(ptr):\n    return {load}"


# the GPU's global clock (ns) and the SM a program runs on, read where a task is traced (the
# argument only gives the value a shape; PTX, so not for the interpreter)
_TRACE_SOURCE = f"""@triton.jit
def {CLOCK_FN}(t):
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [t], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def {SM_FN}(t):
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r,r", [t], dtype=tl.int32, is_pure=False, pack=1)"""


def phase_kernels(kernels: Sequence[Kernel], reads: Sequence[Sequence[str]],
                  writes: Sequence[Sequence[str]]) -> list[Kernel]:
    """The kernels as phases: device functions, each input an earlier phase writes read past L1,
    none warp-specialized (a producer group cannot enter a function the persistent loop calls)."""
    out, written = [], set()
    for k, ins, outs in zip(kernels, reads, writes):
        late = frozenset(j for j, n in enumerate(ins) if n in written)
        out.append(replace(k, phase=True, specialized=False, written=k.written | late, name=f"{k.name}_phase"))
        written.update(outs)
    return out


def needs_table(phases: Sequence[Kernel], waits: Waits) -> list[int] | None:
    """The tasks each task waits for one by one, as the driver reads them (``NEEDS``): an offset
    per task of the kernel (and one past the last) into the same table, then the earlier tasks'
    indices (in the kernel's task order); None where no edge is tile-level."""
    if not any(waits.tiles):
        return None
    starts = [0]
    for k in phases:
        starts.append(starts[-1] + _tasks(k))
    ids: list[list[int]] = []
    for p, k in enumerate(phases):
        per = waits.needs(p)
        ids += [[starts[d] + u for d, u in per[t]] for t in range(_tasks(k))] if per else [[]] * _tasks(k)
    table = [0] * (starts[-1] + 1)
    at = len(table)
    for t, mine in enumerate(ids):
        table[t] = at
        at += len(mine)
    table[-1] = at
    return table + [u for mine in ids for u in mine]


def persistent_source(name: str, phases: Sequence[Kernel], args: Sequence[Sequence[str]],
                      params: Sequence[str], prefetch: Sequence[Sequence[Prefetch]] = (),
                      after: Sequence[Sequence[int]] | None = None, waits: Waits | None = None,
                      trace: bool = False, ptx: bool = True) -> str:
    """The module of the persistent kernel ``name``: the phases' functions and the driver, whose
    parameters are ``params`` (tensor names, each a pointer), the counters and, with tile-level
    waits, the ``NEEDS`` table (``needs_table``); ``args``: each phase's tensors in its
    inputs-then-outputs order; ``prefetch[p]``: what phase ``p``'s tasks prefetch (``prefetches``;
    none: no prefetch code); ``after[p]``: the phases phase ``p`` waits for whole (by default each
    the one before); ``waits``: ``task_dependencies``' (its ``after`` and tile-level edges);
    ``trace``: each task writes its ``TRACE_FIELDS`` to a last parameter, ``TRACE`` (GPU only);
    ``ptx``: for a GPU (not the interpreter), where the wait's acquire load may be PTX."""
    if waits is not None:
        after = waits.after
    after = [(p - 1,) if p else () for p in range(len(phases))] if after is None else after
    tiled = waits is not None and any(waits.tiles)
    flagged = {d for m in waits.tiles for d in m} if tiled else set()
    flags = 1 + len(phases)             # the counters' index of the first task's done flag
    modules = [triton_source(p) for p in phases]
    head, bodies = [], []
    for src in modules:
        lines = src.split("\n\n\n")
        head.extend(line for line in lines[0].splitlines() if line.startswith(("import", "from")))
        bodies.extend(lines[1:])
    pointer = {n: f"p{k}" for k, n in enumerate(params)}
    total = sum(_tasks(p) for p in phases)
    extra = (f", {NEEDS}" if tiled else "") + (f", {TRACE}" if trace else "")
    driver = ["@triton.jit", f"def {name}({', '.join(pointer[n] for n in params)}, {COUNTERS}{extra}):",
              f"    t = tl.atomic_add({COUNTERS}, 1, sem=\"relaxed\")",
              f"    while t < {total}:"]
    end = 0
    for p, (phase, names) in enumerate(zip(phases, args)):
        start, end = end, end + _tasks(phase)
        driver.append(f"        {'if' if p == 0 else 'elif'} t < {end}:")
        if trace:
            driver.append(f"            tf_taken = {CLOCK_FN}(t)")
        mine = prefetch[p] if p < len(prefetch) else ()
        share, at = prefetch_share(mine, end - start), 0
        for f in mine:
            driver.append(f"            {PREFETCH_FN}({pointer[f.tensor]}, {f.first}, {f.numel}, {at}, t - {start}, "
                          f"{share}, {f.itemsize}, {max(LINE_BYTES // f.itemsize, 1)}, {PREFETCH_LANES})")
            at += f.nbytes
        for d in after[p]:
            driver.append(f"            while {ACQUIRE_FN}({COUNTERS} + {d + 1}) < {_tasks(phases[d])}:")
            driver.append("                pass")
        if tiled and waits.tiles[p]:        # the earlier tasks it needs: their flags, a block at a time
            # the spin carries a scalar, not the block of flags: Triton 3.6 fails to compile a while
            # loop carrying a tensor there (TritonGPURemoveLayoutConversions; 3.9 compiles both);
            # a lane past the task's list loads task 0's flag (u = 0: an address, read, not used)
            seen = f"tl.min(tl.where(i < hi, {ACQUIRE_FN}({COUNTERS} + {flags} + u), 1))"
            driver += [f"            lo = tl.load({NEEDS} + t)",
                       f"            hi = tl.load({NEEDS} + t + 1)",
                       f"            for b in range(lo, hi, {TILE_LANES}):",
                       f"                i = b + tl.arange(0, {TILE_LANES})",
                       f"                u = tl.load({NEEDS} + i, mask=i < hi, other=0)",
                       f"                done = {seen}",
                       "                while done == 0:",
                       f"                    done = {seen}"]
        if trace:
            driver.append(f"            tf_started = {CLOCK_FN}(t)")
        ids = _program_ids(phase.grid, f"(t - {start})")
        blocks = [str(a.block) for a in _blocks(phase)]
        driver.append(f"            {phase.name}({', '.join([pointer[n] for n in names] + ids + blocks)})")
        driver.append("            tl.debug_barrier()")
        if p in flagged:
            driver.append(f"            tl.atomic_add({COUNTERS} + {flags} + t, 1, sem=\"release\")")
        driver.append(f"            tl.atomic_add({COUNTERS} + {p + 1}, 1, sem=\"release\")")
        if trace:
            at = f"{TRACE} + {TRACE_FIELDS} * t"
            driver += [f"            tf_done = {CLOCK_FN}(t)",
                       f"            tl.store({at}, tf_taken)",
                       f"            tl.store({at} + 1, tf_started)",
                       f"            tl.store({at} + 2, tf_done)",
                       f"            tl.store({at} + 3, {SM_FN}(t).to(tl.int64))"]
    driver.append(f"        t = tl.atomic_add({COUNTERS}, 1, sem=\"relaxed\")")
    imports = list(dict.fromkeys(head))
    # each phase a function of its own (not inlined): its shared memory and registers are its own,
    # not added to every other phase's by the compiler (LLaMA small's 27 kernels inlined needed
    # 983 KB of shared memory and spilled; as calls, 209 KB and 166 registers, no spills: sm_90)
    bodies = [_called(b, {p.name for p in phases}) for b in bodies]
    helpers = list(dict.fromkeys(b.rstrip("\n") for b in bodies))
    if any(after) or tiled:
        helpers.append(_acquire_source(ptx))
    if any(prefetch):
        helpers.append(_PREFETCH_SOURCE)
    if trace:
        helpers.append(_TRACE_SOURCE)
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
                      writes: Sequence[Sequence[str]], prefetch: bool = True,
                      trace: bool = False, ptx: bool = True) -> tuple[str, list[str], list[int] | None]:
    """(the source of the persistent kernel ``name`` of ``kernels`` as phases, its tensors in
    parameter order, its ``NEEDS`` table or None); ``prefetch``: with the phases' L2 prefetches,
    ``trace``: with each task's clock readings, ``ptx``: PTX allowed (none of them for the
    interpreter)."""
    phases = phase_kernels(kernels, reads, writes)
    params = list(dict.fromkeys(n for ins, outs in zip(reads, writes) for n in (*ins, *outs)))
    args = [list(ins) + list(outs) for ins, outs in zip(reads, writes)]
    ahead = prefetches(kernels, reads, writes) if prefetch else ()
    waits = task_dependencies(kernels, reads, writes)
    return (persistent_source(name, phases, args, params, ahead, waits=waits, trace=trace, ptx=ptx), params,
            needs_table(kernels, waits))


def resident_grid(programs: int, per_sm: int, tasks: int, held: int) -> int:
    """A persistent kernel's grid once its launched binary is known: ``programs`` planned at
    ``per_sm`` an SM, no more than ``held`` an SM (what the binary lets be resident), nor more
    than its ``tasks``; one an SM at least."""
    sms = max(1, programs // max(per_sm, 1))
    return max(1, min(programs, tasks, sms * max(min(held, per_sm), 1)))


def compile_persistent(name: str, kernels: Sequence[Kernel], reads: Sequence[Sequence[str]],
                       writes: Sequence[Sequence[str]], programs: int, trace: bool = False, per_sm: int = 1,
                       fits: Callable[[int, int, int], int] | None = None,
                       maxnreg: int | None = None) -> tuple[Callable, str, list[str]]:
    """(launcher, source, its tensors in parameter order) of the persistent kernel running
    ``kernels`` as phases (their tensors named by ``reads``/``writes``, inputs-then-outputs order);
    the launcher takes a ``{name: tensor}`` mapping and runs on at most ``programs`` programs.
    ``trace`` (a GPU's): each launch leaves its tasks' clock readings in ``launcher.trace``, an
    int64 tensor [tasks, ``TRACE_FIELDS``] (``runtime/trace.py`` reads it).

    ``per_sm``: the programs an SM runs at once in ``programs`` (the plan's, from a binary compiled
    ahead of time).  Every program must be resident for the waits to end, so on a GPU the first
    launch runs one program per SM (``programs // per_sm``: resident wherever the kernel runs at
    all) and the grid of the launches after it is what ``fits(registers, shared bytes, warps)``
    says an SM holds of the binary that launch compiled, at most ``per_sm`` an SM: a compiler that
    allocates more registers than the plan's binary shrinks the grid instead of hanging it.
    ``maxnreg``: the registers a thread ptxas may use (the plan's cap for ``per_sm``)."""
    from .launch import _descriptor_scratch, load_kernel
    if trace and interpreted():
        raise ValueError("tracing a persistent kernel reads the GPU's clock (PTX), which Triton's "
                         "interpreter cannot run: it needs a CUDA device")
    source, params, table = persistent_module(name, kernels, reads, writes, prefetch=not interpreted(), trace=trace,
                                              ptx=not interpreted())
    fn = load_kernel(source, name)
    total = sum(_tasks(k) for k in kernels)
    size = 1 + len(kernels) + (total if table is not None else 0)
    grid = [max(1, min(programs, total))]
    # (the interpreter runs its programs one after another: any grid completes)
    unchecked = [per_sm > 1 and not interpreted()]
    warps, stages = max(k.num_warps for k in kernels), max(k.num_stages for k in kernels)
    options = {"num_warps": warps, "num_stages": stages, **({"maxnreg": maxnreg} if maxnreg else {})}
    written = {n for outs in writes for n in outs}
    tma = any(k.tma for k in kernels) and "make_tensor_descriptor" in source
    counters: dict = {}

    def launch(buffers) -> None:
        device = next(iter(buffers.values())).device
        got = counters.get(device)
        if got is None:
            needs = [] if table is None else [torch.tensor(table, dtype=torch.int32, device=device)]
            got = counters[device] = (torch.zeros(size, dtype=torch.int32, device=device), needs)
        c, needs = got
        c.zero_()
        if trace:
            launch.trace = torch.zeros((total, TRACE_FIELDS), dtype=torch.int64, device=device)
            needs = [*needs, launch.trace]
        ts = [buffers[n] if n in written else buffers[n].contiguous() for n in params]
        if tma:         # a tensor descriptor's base must be 16-byte aligned (a view may not be)
            ts = [t if n in written or t.data_ptr() % 16 == 0 else t.clone() for n, t in zip(params, ts)]
            if not interpreted():
                _descriptor_scratch()
        with interpreting() if interpreted() else contextlib.nullcontext():
            if unchecked[0]:
                sms = max(1, programs // per_sm)
                compiled = fn[(max(1, min(sms, total)),)](*ts, c, *needs, **options)
                held = fits(compiled.n_regs, compiled.metadata.shared, warps) if fits is not None else 1
                grid[0] = resident_grid(programs, per_sm, total, held)
                unchecked[0] = False
                return
            fn[tuple(grid)](*ts, c, *needs, **options)

    return launch, source, params
