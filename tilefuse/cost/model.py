"""The analytic cost model (docs/cost-model.md): one function, ``estimate``, for every family.

A kernel is described by what it does (``Work``: programs, DRAM and L2 bytes, flops at a peak,
bytes one program keeps in flight, per-program resources) and timed on a ``Target``:

    t = launch + max(DRAM, L2, Σ_waves compute) + fill + programs-per-SM × program cost

* occupancy: programs resident per SM, from the target's per-SM limits on blocks, threads,
  registers and shared memory and the program's use of them; slots = SMs × occupancy;
* memory: the bytes move at min(bandwidth, resident programs × bytes in flight / latency)
  (Little's law: a small grid, or small programs at low occupancy, cannot keep enough requests in
  flight to saturate DRAM or L2); programs are dispatched as slots free up, so a memory-bound grid
  keeps min(programs, slots) resident until it drains;
* waves: ceil(programs / slots); compute runs wave by wave, a wave of n programs at the peak times
  the fraction of the SMs' warp schedulers its warps occupy, so a partial last wave (or a small
  grid) pays through idle SMs (wave quantization), not through a factor;
* fill: one memory latency before the first bytes arrive (DRAM's; L2's for work that reads nothing
  from DRAM: a persistent kernel's phase whose inputs L2 holds; what a kernel writes lands in L2);
* program cost: each program costs ``program_cycles`` of its SM's time (dispatch, prologue), so a
  huge grid of tiny programs pays per program.

Everything is modelled, never measured.  MCFuser's α = (blocks + SMs)/blocks survives only as
``parallelism`` for ranking tilings inside a chain search; it never multiplies a time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir.expr import Binary, Expr, Load, Select, Unary, walk
from .target import Target

# Relative cost of one evaluation of an op, in flops of the CUDA cores' peak (``peak_simt``, an
# FMA two): special functions need several instructions (erf, pow) or run on the SFU.  An
# exponential is the SFU's ``MUFU.EX2`` (sm_90 binaries: ``tl.exp2`` one, ``tl.exp`` one beside
# four FMULs and compares), 16 a clock an SM against 128 FP32 lanes: 16 flops of that peak, 20
# for ``exp``.  MEASURED: with it the attention chain's four tiles timed on the H200 model within
# 5% (16-22% short at the 3 and 4 counted before; ``tests/test_calibration.py``), the causal
# 4096 prefill within 3%.  The other SFU functions (rsqrt, sqrt, a division's reciprocal) keep
# their old weights until a measurement asks.
OP_WEIGHT = {
    "exp": 20, "log": 4, "sin": 4, "cos": 4, "tan": 8, "tanh": 6, "sigmoid": 6, "erf": 8, "pow": 8,
    "sqrt": 4, "rsqrt": 4, "div": 4, "reciprocal": 4, "asin": 8, "acos": 8, "atan": 8, "sinh": 8,
    "cosh": 8, "asinh": 8, "acosh": 8, "atanh": 8, "log1p": 4, "expm1": 4, "exp2": 16, "fmod": 4, "mod": 2,
    "floordiv": 2,
}
BOUNDS = ("dram", "l2", "compute", "launch")


def expr_flops(e: Expr) -> int:
    """Weighted arithmetic operations to evaluate e once (index arithmetic inside loads excluded)."""
    total = 0
    for n in walk(e, into=lambda n: not isinstance(n, Load)):
        if isinstance(n, (Unary, Binary)):
            total += OP_WEIGHT.get(n.op, 1)
        elif isinstance(n, Select):
            total += 1
    return total


def parallelism(blocks: int, target: Target) -> float:
    """MCFuser's α = (blocks + SMs) / blocks: ranks tilings of one chain; never multiplies a time."""
    blocks = max(int(blocks), 1)
    return (blocks + target.sm_count) / blocks


@dataclass(frozen=True)
class Resources:
    """What one program (thread block) holds while it runs."""
    warps: int
    regs_per_thread: int = 32
    smem_bytes: int = 0


REG_UNIT = 8


def occupancy(res: Resources, target: Target) -> int:
    """Programs resident per SM (0: the program does not fit the SM at all)."""
    threads = res.warps * target.warp_size
    # registers are allocated per warp in units of 256 (8 a thread): 254 of them hold 256; a
    # program of more than 255 a thread does not exist (ptxas spills instead)
    regs = -(-max(res.regs_per_thread, 1) // REG_UNIT) * REG_UNIT * threads
    if threads > target.max_threads_per_block or regs > target.regs_per_block \
            or res.smem_bytes > target.smem_per_block or res.regs_per_thread > 255:
        return 0
    limits = [target.max_blocks_per_sm, target.max_threads_per_sm // threads, target.regs_per_sm // regs]
    if res.smem_bytes:
        limits.append(target.smem_per_sm // res.smem_bytes)
    return max(min(limits), 0)


@dataclass(frozen=True)
class Work:
    """What a kernel does, in totals over its grid."""
    programs: int
    dram_bytes: float          # compulsory traffic plus re-reads that miss L2
    l2_bytes: float            # every byte requested by the SMs (loads and stores)
    flops: float
    peak: float                # FLOP/s the kernel's arithmetic runs at (dtype, tensor cores, efficiency)
    inflight_bytes: float      # bytes one program has requested and not yet received
    res: Resources
    chunks: int = 1            # loop iterations of a program (interpreting targets charge each)
    requested_bytes: float = 0.0   # bytes the kernel's loads and stores ask for, before any cache
                                   # credit (what a counter of its memory operations sees)
    store_bytes: float = 0.0   # of dram_bytes and l2_bytes, bytes stored: posted, they wait on no
                               # round trip, so only loads are bound by the bytes kept in flight
    tail: "Work | None" = None  # a phase the kernel runs after this one in the same launch (the
                               # last program of each group, after an Arrive): timed without a launch
    serial_chunks: float = 0.0  # loop chunks of a program whose loads its tensor cores wait for
                               # (a dot loop at num_stages 1: Triton issues no loads ahead)
    dram_stored: float = 0.0   # of dram_bytes, bytes written: they land in L2 (written back to DRAM
                               # later), so a kernel whose other DRAM bytes are none waits on L2 only
    dot_steps: float = 0.0     # products a program runs one after another (its Dots times its loop
                               # chunks; a library GEMM's K steps): each at least ``Target.dot_step_s``
    two_stage_k: float = 0.0   # K positions of a program's tensor-core products in a loop of two
                               # pipeline stages (chunks times each Dot's BK): ``Target.two_stage_k_s``


@dataclass(frozen=True)
class Estimate:
    seconds: float
    launch: float
    dram_s: float              # time each term alone would take
    l2_s: float
    compute_s: float
    waves: int
    occupancy: int
    bound: str                 # which of BOUNDS dominates

    @property
    def body(self) -> float:
        return self.seconds - self.launch


INFEASIBLE = Estimate(math.inf, 0.0, math.inf, math.inf, math.inf, 0, 0, "compute")


def estimate(w: Work, target: Target, *, cuda_graph: bool = False) -> Estimate:
    """Modelled time of a kernel (see the module docstring); ``INFEASIBLE`` if a program cannot
    be resident on an SM."""
    launch = target.launch(cuda_graph)
    programs = max(int(w.programs), 0)
    if programs == 0:
        return Estimate(launch, launch, 0.0, 0.0, 0.0, 0, 0, "launch")
    occ = occupancy(w.res, target)
    if occ == 0:
        return INFEASIBLE
    slots = target.sm_count * occ
    waves = -(-programs // slots)
    # Memory: programs are dispatched as slots free up and desynchronize, so the grid keeps
    # min(programs, slots) programs' requests in flight until it drains.
    resident = min(programs, slots)
    dram = _memory_s(w.dram_bytes, w.store_bytes, target.dram_rate, target.dram_latency_s, resident * w.inflight_bytes)
    l2 = _memory_s(w.l2_bytes, w.store_bytes, target.l2_rate, target.l2_latency_s, resident * w.inflight_bytes)
    # Compute: equal programs run in waves; a partial last wave leaves SMs (or their warp
    # schedulers) idle: wave quantization.
    comp = 0.0
    if w.flops:
        full, rem = divmod(programs, slots)
        for n, count in ((slots, full), (rem, 1 if rem else 0)):
            if count:
                # SMs with a program, times the share of their warp schedulers the warps fill
                sms = min(n, target.sm_count)
                busy = sms / target.sm_count * min(1.0, n * w.res.warps / (sms * target.warp_schedulers))
                comp += count * (n / programs) * w.flops / (w.peak * busy)
    if w.serial_chunks and comp:
        # each unpipelined chunk waits a round trip before its product; the programs resident on
        # an SM hide one another's waits, the SM's waves run one after another
        comp += waves * w.serial_chunks * target.l2_latency_s / max(min(occ, -(-programs // target.sm_count)), 1)
    if w.dot_steps and comp:
        # a tensor-core program's latency (MEASURED, docs/cost-model.md): each product step takes
        # at least dot_step_s (load barrier, issue, completion), and the program a fixed
        # dot_program_s besides (operand setup, the accumulator's epilogue, its stores); the
        # programs of a wave run side by side, the waves one after another
        comp = max(comp, waves * w.dot_steps * target.dot_step_s) + waves * target.dot_program_s
    if w.two_stage_k and comp:
        # at two stages the loop's next loads wait for the products before them (MEASURED:
        # the same tiles at three stages ran 1.3-1.5x faster, docs/cost-model.md)
        comp += waves * w.two_stage_k * target.two_stage_k_s
    body = max(dram, l2, comp)
    # the fill: one round trip before the first bytes arrive (from L2 where nothing is read from
    # DRAM: a persistent kernel's phase reading what an earlier phase wrote; stores wait on none)
    fill = target.dram_latency_s if w.dram_bytes > w.dram_stored else target.l2_latency_s
    overhead = fill + -(-programs // target.sm_count) * target.program_cycles / target.clock_hz
    if target.program_s:      # an interpreting target runs programs and their loop chunks one by one
        overhead += target.program_s * programs * max(w.chunks, 1)
    seconds = launch + body + overhead
    terms = {"dram": dram, "l2": l2, "compute": comp, "launch": launch + overhead}
    bound = max(BOUNDS, key=lambda k: terms[k])
    return Estimate(seconds, launch, dram, l2, comp, waves, occ, bound)


def _memory_s(nbytes: float, stored: float, bandwidth: float, latency: float, inflight: float) -> float:
    """Seconds to move ``nbytes``, of which ``stored`` are posted stores: every byte needs the
    bandwidth, loads also the round trips their bytes in flight allow."""
    if not stored:
        return nbytes / _rate(bandwidth, latency, inflight)
    loads = max(nbytes - stored, 0.0)
    return max(nbytes / bandwidth, loads / _rate(bandwidth, latency, inflight))


def _rate(bandwidth: float, latency: float, inflight: float) -> float:
    """Bytes/s a set of programs with ``inflight`` bytes outstanding can draw (Little's law)."""
    if latency <= 0:
        return bandwidth
    return max(min(bandwidth, inflight / latency), 1.0)


def coalesced_elems(sub: tuple[int, ...], full: tuple[int, ...], elem_bytes: int, target: Target,
                    start: int = 0) -> float:
    """Elements actually transferred to read a sub-box of a row-major tensor (Welder's rule).

    A transaction moves ``transaction_bytes``; the contiguous run of a box is the product of its
    trailing dims while they equal the tensor's, times the first dim that differs.  Each run takes
    whole transactions: runs shorter than a transaction, and a run's last partial one, waste the
    rest of it.  A run need not start on a transaction boundary: the box starts at element
    ``start`` of the tensor and the next run a row stride further, so when those offsets are not
    multiples of a transaction a run straddles one more on average (a row of 17 floats; a slice
    at +4 elements); the expected count over the runs' starting offsets is charged.
    """
    n = 1
    for s in sub:
        n *= s
    if n == 0:
        return 0.0
    run, first = 1, 0
    for d in range(len(sub) - 1, -1, -1):
        run *= sub[d]
        if sub[d] != full[d]:
            first = d
            break
    per_tx = max(target.transaction_bytes // max(elem_bytes, 1), 1)
    tx = per_tx * elem_bytes
    # the runs start at ``start`` plus multiples of the strides of the dims outside the run
    grain = tx
    for d in range(first):
        if sub[d] > 1:
            grain = math.gcd(grain, math.prod(full[d + 1:]) * elem_bytes)
    length = run * elem_bytes
    offsets = [(start * elem_bytes + k * grain) % tx for k in range(tx // grain)]
    per_run = sum(-(-(o + length) // tx) for o in offsets) / len(offsets)
    return n / run * per_run * per_tx
