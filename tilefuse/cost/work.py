"""A kernel's ``Work``, read from the kernel that is printed (issue #21: one description per kernel).

``work(kernel, target)`` walks the kernel's statements the way the printer places them
(``codegen/triton/emit.py``): the program's top level binds every axis that is covered whole, and
each loop over a looped axis opens a scope binding it; a load lives in the outermost open scope
binding the axes its index varies along (loop-invariant loads are hoisted) and is issued once
per scope (loads are interned; a later loop reuses a load still held by an enclosing scope), and
each arithmetic node is computed once per scope (the printer's values are memoized too).
From that walk, for every family alike:

- programs: the grid (``Kernel.grid``);
- bytes: each issued load over one program's box — program-split axes over the program's tile
  (``tiles.tile_box``; an axis walking within one, over that tile), every other axis over all of
  it, since the program's loops cover every chunk — in Welder's coalesced transactions
  (``tiles.site_elems``), times the chunks of the enclosing loops it does not vary along (a query
  tile re-read per key chunk), scaled by the in-range share of the program-split axes it varies
  along (a ragged last tile's masked positions move nothing), times the programs; every output
  written whole once (one stored at data-dependent positions, a scatter: one value per position of
  the kernel's space);
- DRAM and L2: a ``Dot`` operand's tensor comes from DRAM once when the operands fit in half of
  L2, else once per band of the grid the resident programs cover (``_window``: the programs
  resident at once, in program-id order — group-M order for a swizzled GEMM — cover a window
  of tiles; a row panel is fetched again for every window of columns: ``_rereads``); an input
  that reads a workspace (``Kernel.transient``, ``Kernel.written``) from L2, and from DRAM only
  when it exceeds half of L2; workspaces stored likewise; every other load by ``tiles.split_l2``;
- chunks: the loop iterations of a program (one for the top level when it issues loads or runs no
  loop at all), and the bytes in flight: a chunk's share of the loads, times ``num_stages - 1``
  for a pipelined ``Dot`` loop;
- flops: each statement's new arithmetic at every position it runs for — the program-split axes'
  extents, the extents of the loops around it and of its own axis for a reduction, and of the
  whole axes its store index spans; a ``Dot`` operand's at the positions of the axes it varies
  along times the tiles of the others (a weight's prologue runs once per row tile); a ``Dot``
  computes its padded tiles at ``dot.dot_rate`` (tensor cores or not), the rest at the fp32
  CUDA-core peak;
- resources: with a ``Dot``, its fp32 accumulators per thread, its operands' registers by how
  each is read (``OPERAND_REGISTERS``: a cp.async or TMA copy, a split-K chunk's through a
  descriptor at its shift, a computed prologue, one zeroed outside a padded window, a gather of
  whole 16-byte runs, a gather, a scalar gather), the tiles the epilogue loads, and the
  operand tiles staged in shared memory (``num_stages`` deep inside a loop, each whole-tile load
  of a computed operand in a chain's key loop its own; one stage where an
  operand is a scalar gather, which Triton does not pipeline: ``_Walk.scalar``); without a Dot,
  a loop's chunks ``num_stages - 1`` deep (``emit._streams``), which is also how many chunks it
  keeps in flight; without, a base
  for indices and pointers (smaller for a phase that runs its tile once than for one with a loop)
  plus a thread's share of the tile (without an axis only ever summed as loaded, where each thread
  holds it whole: ``_Walk.streamed``), a quarter of the values the widest scope loads (at most 8
  loads), and in a one-pass phase the positions where a window's test (a select of a constant
  fill) selects loaded values;
- a causal loop split in two (``Loop.until``, ``Loop.resume``) charges each part its share of
  the chunks and the second its own pipeline of the product (``SPLIT_REGISTERS``);
- a loop that stops early or starts late (a causal key loop, ``Loop.stop``; a sliding window's,
  ``Loop.start``) runs its average share of the chunks;
- an ``Arrive``'s body is a tail phase (``Work.tail``): one program per group, run by the last
  program of each to arrive in the same launch.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass, replace

from ..analysis.index import linear_form
from ..codegen.kernel import (Arrive, Dot, Kernel, Loop, Reduce, Store, descriptor_dims, guarded_load,
                              piece_descriptors, piece_tests, pow2, tile_shift)
from ..ir.dtypes import DType
from ..ir.expr import Binary, Cast, Const, Load, Select, Unary, Value, Var, free_vars, load_nodes, walk
from .dot import dot_rate, tensor_cores, wgmma
from .model import OP_WEIGHT, REG_UNIT, Resources, Work, estimate, occupancy
from .target import Target
from .tiles import LoadSite, load_site, site_elems, split_l2, stored_bytes, tile_box

# Per thread: program ids, offsets and pointers of a phase that runs its tile once (fitted: sm_90
# binaries of one-pass fused kernels, rows, reductions, pools and elementwise, 14 to 40 registers)
REGISTER_BASE = 14
# With a loop (a stencil's taps, an Arrive tail's chunks): its counters and advancing pointers too
LOOP_REGISTER_BASE = 20
DOT_REGISTER_BASE = 28   # with a Dot: its operand pointers and K-loop state too
# Per position of a thread's tile where a window's test selects loaded values (``where(in_window,
# x[...], fill)``: a padded pool's or convolution's taps) in a one-pass phase: the test's terms
# held per position (fitted: the same binaries; padded max pools 38-40 registers, 24 counted
# without it; padded depthwise convolutions 28-40)
WINDOW_REGISTERS = 0.75
# ... times this where the selected value is computed from loads beside the windowed one (a
# BatchNorm + ReLU6 zeroed outside the window of a depthwise convolution: its prologue's vectors
# and temporaries per position; sm_90 binaries of MobileNetV2's, 60 registers against 39 counted
# as a plain load's window; a ReLU6 of the windowed value alone, 29 against 47 at this rate), except
# in a pool: a max over a BatchNorm + ReLU's window holds no more than a plain window's (sm_90
# binaries of ResNet-50's stem pool, 32 registers, 46 counted at this rate; a fused pool's 56, 77)
WINDOW_COMPUTED = 3.5
# Registers per value of a thread's share of a Dot's operand tile (one stage), by how the operand
# is read, and the base above: fitted to the sm_90 binaries of the bench plans' and the zoo's small
# h100 plans' dot kernels, 82 distinct ones (bench/README.md, "native.py"; tests/test_native_plans.py
# checks the share within 25%).  A plain
# load is copied to shared memory (cp.async: an address per 16-byte vector); a computed operand (a
# prologue: casts, scales, activations) passes through registers, per tile it loads, and one
# zeroed outside a padded window (BatchNorm + ReLU before a 3 x 3 convolution) holds the window's
# test, the per-channel vectors and the select per value too (ResNet-50's: 145-161); a gathered
# one (an address not affine in a tile axis's flat index, nor whole 16-byte runs: NCHW im2col, a
# rotated half) holds addresses and masks per value too; a scalar gather (no 4-byte run: an NCHW
# stem's im2col, ``_Walk.scalar``) is loaded a value at a time into registers, each with its own
# 64-bit address and bounds (the ResNet and MobileNet stems' binaries: 2.6-2.9 a value), as is one
# through a quotient index ``x // c`` (a row copy fused back into its stem), which loaded once (no
# K loop) still holds its div/mod and guards, 1.5 a value; a plain
# load through a tensor descriptor (``Kernel.tma``) holds none: the copy engine computes the addresses.
OPERAND_REGISTERS = {"direct": 0.04, "computed": 0.9, "windowed": 3.0, "gathered": 0.75, "scalar": 2.5, "tma": 0.0,
                     "quotient": 2.5, "quotient_once": 1.5, "vector": 0.3}
# A computed operand of one load in K chunks of 128 or more holds more a value (sm_90 binaries,
# bench/dot_registers.py and MobileNetV2's BatchNorm + ReLU6 1 x 1 convolutions: 1.0-1.7 a value
# at BK 128, 0.7-1.0 at 32 and 64); of two (LLaMA's SiLU(gate) * up before the down projection:
# 173 registers at BK 128) the count per load holds it already
WIDE_COMPUTED, WIDE_K = 1.2, 128
CP_ASYNC_BYTES = 4       # the narrowest copy cp.async makes: a loop with a narrower operand run is not pipelined
EPILOGUE_REGISTERS = 0.5  # per value of a tile the epilogue loads (fp16 pairs share a register)
# A computed operand loaded once, outside a pipelined loop (attention's query, a whole key tile),
# streams through registers into shared memory: a fraction of the values a loop keeps in flight
HELD_COMPUTED = 0.1
# The computed operand of a kernel's one Dot, which no loop repeats (the whole K one chunk, no loop
# around it), is live in registers, values and their computation's temporaries, until the product
# (fitted: sm_90 binaries of single-chunk GEMMs with a computed operand, K 64 and 128, 16 to 128
# rows, wgmma and mma.sync: 0.35-0.4 a value; MobileNetV2's BatchNorm + ReLU6 before a 1 x 1
# convolution). An attention chain's query, its key tile one chunk, still streams to shared
# memory: HELD_COMPUTED.
SINGLE_CHUNK_COMPUTED = 0.4
# Per value of a warp's slice of a computed A operand held whole on warp-level MMA
# (``_warp_operand_registers``; fitted: sm_90 binaries of 16- and 32-row GEMMs with a computed
# operand and a described weight, BK 64 and 128: 0.3-0.6; at BK 32 the binaries hold no more
# than counted)
WARP_OPERAND_REGISTERS = 0.45
WARP_OPERAND_MIN_K = 64
# Per value of a fresh product tile in the second loop of a split (Loop.resume): fitted to the sm_90
# binaries of causal attention at two stages, the sm_90 space's only looping chains (d 128 and 64,
# 128 x 128 tiles: 195 and 162 registers, 252 and 220 at 1.5, which the one-stage binaries held)
SPLIT_REGISTERS = 0.6
LIVE_SHARE = 4           # without a Dot: one in LIVE_SHARE loaded values is live at once
# A chain's key loop at two stages waits for its loads this share of a GEMM loop's time per K
# position of its second product (the keys of a chunk): MEASURED on the H200, attention 16 x 4096
# x 4096, d 128, 128 x 128 tiles at 8 warps through descriptors: 339.0 us at two stages, 287.0 at
# three, 0.41 us a chunk of 128 keys against a GEMM loop's 0.68 (``Target.two_stage_k_s``); its
# softmax between the products covers part of the wait.  One shape: a lead.
CHAIN_TWO_STAGE_SHARE = 0.6
# An unrolled loop's loads are all issued ahead of their use: every chunk's values are live at
# once, at their bytes (two fp16 values a 32-bit register).  sm_90 binaries of MobileNetV2's
# depthwise stencils (ReLU6 + pad + 3 x 3, 9 taps; ``bench/stencil_registers.py``): fp16 at 4, 8
# and 16 outputs a thread hold 32-44, 58-74 and 94-121 registers, about 22 + 5.4 an output (its
# accumulator and nine half registers); fp32 at 4 and 8 hold 64-76 and 102-128.  Past that the
# compiler stops issuing every tap ahead (fp32 at 16 outputs: 79-234), so wide tiles are counted
# over the binary: conservative.  A loop on CUDA cores holds each chunk so too (its products or sums
# take the chunk whole): the small-M path's GEMVs (1 x 2048-4096 fp16, BN 16-64, BK 128-512, 2-8
# warps, 1-4 stages; sm_90) within a quarter for 180 of 204 tiles, 162 at a quarter of the values;
# at 64 products a thread 103-166 registers, counted 101 before and 118 now
REGISTER_BYTES = 4
# The architecture from which ptxas issues every chunk of an unrolled loop ahead; for sm_80 it
# interleaves the loads with their uses, a quarter of the values live, at their bytes (sm_80
# binaries of MobileNetV2's a100 stencils: fp16 at 8 and 16 outputs a thread 32-62 and 48-80
# registers, fp32 at 4, 8 and 16 32-54, 38-58 and 62-87; ``bench/stencil_registers.py --target a100``)
UNROLLED_AHEAD_ARCH = 90
# K steps of 16 whose operand fragments warp-level MMA holds in registers at once: the current
# and the next (fitted: sm_80 binaries of fp16 GEMMs, BM 32-256 x BN 32-256 x BK 32-128, 4 and 8
# warps, 2-4 stages: 202 of the 202 that do not spill within ±25%, 24 without the term; with a
# GELU epilogue 173 of 173; ``bench/mma_registers.py``)
FRAGMENT_STEPS = 2
# Registers a value of a computed A operand holds on warp-level MMA (fitted: sm_80 binaries of
# relu(A) @ B, the same 211 tiles: 198 of 205 that do not spill within ±25%, 56 at the sm_90
# rate beside A's fragments); one zeroed outside a padded window too (ResNet-50's a100 plan: a
# ReLU before a 3 x 3 convolution, 32 x 32 x 64, 56 registers in the binary, 101 counted at the
# sm_90 window's rate, 51 at this one)
WARP_COMPUTED = 0.3
# The registers a consumer group of a warp-specialized loop allocates for itself (USETMAXREG 232 in
# the sm_90 binaries of Triton 3.6 and 3.9, the producer's 40 leaving it room)
WS_CONSUMER_REGISTERS = 232
GATHER_RUN = 8           # contiguous values (16 bytes of fp16) a run needs to stay one vector load
MAX_LIVE_LOADS = 8       # loads a thread holds at once, at most (the compiler interleaves the rest)


@dataclass(frozen=True)
class LoadUse:
    """A load as the walk places it."""
    site: LoadSite
    vars: tuple              # the kernel variables its index reads
    varies: frozenset        # the axes (canonical: an alias by its axis) its index varies along
    reps: tuple              # enclosing loop axes it does not vary along: issued again each chunk
    path: tuple              # the loop axes of its scope, outermost first
    operand: bool            # it feeds a Dot's operand
    stopped: int             # inside a bounded loop: 1 + its index in ``Profile.stops`` (0: none)
    irregular: bool = False  # an index dim neither affine nor data-dependent (floordiv/mod maps):
                             # the first program's box does not stand for the others'
    narrow: bool = False     # no run of ``CP_ASYNC_BYTES`` Triton can prove (``_Walk.narrow``):
                             # a pipelined loop cannot copy it ahead


@dataclass(frozen=True)
class DotUse:
    m: str
    n: str
    k: str                   # canonical
    in_dtype: DType
    around: tuple            # enclosing loop axes
    staged: tuple            # per operand (a, b): 0 no input loads (registers), 1 loaded once, 2 in a loop
    stopped: int
    reads: tuple = (("", 0, ()), ("", 0, ()))   # per operand: (a key of OPERAND_REGISTERS, or ""
                             # without input loads; the loads of whole tiles it reads; the tests
                             # of a concatenation's pieces, read as one direct load where every
                             # block divides their thresholds: ``kernel.piece_tests``)
    again: bool = False      # the same Dot as in the loop before (Loop.resume): its accumulator,
                             # operand registers and shared memory are that one's
    fresh: bool = True       # its product starts from zeros (not a carried accumulator)
    tile_loads: tuple = (1, 1)   # per operand: its loads of a whole tile (one at least)


@dataclass(frozen=True)
class Profile:
    """What a kernel (or an ``Arrive``'s tail) does that does not depend on its block sizes,
    given which axes are looped."""
    loads: tuple[LoadUse, ...]
    flops: tuple[tuple[int, frozenset, frozenset, int], ...]    # (flops, extent axes, tile axes, stopped)
    dots: tuple[DotUse, ...]
    reduce_tiles: tuple[frozenset, ...]                        # axes of each reduction's value tile
    scopes: tuple[tuple[tuple, bool, int], ...]                # (loop path, issues loads, stopped)
    stored: frozenset                                          # output slots this phase stores
    stops: tuple = ()                                          # per bounded loop: (loop axis, row axis,
                                                               # offset past the row tile or None, window
                                                               # before it or None, its part or None:
                                                               # ("until" | "resume", offset))
    arrive: tuple = ()                                         # the tail's group axes
    tail: "Profile | None" = None
    unrolled: frozenset = frozenset()                          # axes of unrolled loops (Loop.unroll)
    scattered: frozenset = frozenset()                         # output slots stored at data-dependent
                                                               # positions (a scatter: not written whole)
    windows: tuple = ()                                        # per select of loaded values by a window's
                                                               # test (no Dot): the axes it varies along,
                                                               # and whether the value is computed
    streamed: tuple = ()                                       # axes only ever reduced whole as loaded,
                                                               # and their loads' vector width (``_Walk.streamed``)
    rows: tuple = ()                                           # axes only ever reduced whole, along which
                                                               # nothing else varies (``_Walk.rows``)


def work(kernel: Kernel, target: Target) -> Work:
    """The kernel's work on ``target`` (see the module docstring)."""
    t = _tile(kernel.body, kernel.axes, kernel.inputs, kernel.outputs, (kernel.workspaces, kernel.counters),
              target, kernel.tma)
    # a specialized loop's tiles are the consumer groups' (its producer holds a few addresses)
    warps = kernel.compute_warps
    threads = warps * target.warp_size
    regs = _registers(t.main, threads) + _warp_operand_registers(t.main, warps, target) \
        + _fragment_registers(t.main, warps, target)
    if t.tail is not None:
        regs = max(regs, _registers(t.tail, threads) + _warp_operand_registers(t.tail, warps, target)
                   + _fragment_registers(t.tail, warps, target))
    if kernel.specialized:
        # Triton's pass launches the register file split evenly (65,536 over 384 threads: 168 on
        # sm_90) and moves registers at run time, the producer down to 40, the consumers up to
        # ``WS_CONSUMER_REGISTERS`` (USETMAXREG in the binaries): a consumer tile beyond that spills
        even = target.regs_per_sm // (kernel.launched_warps * target.warp_size) // REG_UNIT * REG_UNIT
        regs = even if regs <= WS_CONSUMER_REGISTERS else 256
    # Triton pipelines a loop only when every operand can be copied asynchronously: with a scalar
    # gather it runs one stage, whatever ``num_stages`` says (the stems' binaries: no cp.async, one
    # stage of shared memory)
    stages = max(kernel.num_stages, 1) if t.main.pipelined else 1
    # (a loop of tensor-core products holds ``num_stages`` buffers of its operands, as fitted; a
    # pipelined loop on CUDA cores one fewer: its sm_90 binaries, ``tests/test_native.py``)
    smem = stages * t.main.staged + t.main.held if t.main.dots else (stages - 1) * t.main.staged
    if _warp_level(t.main, warps, target):
        # on warp-level MMA the products read registers, so a buffer is free once its fragments
        # are loaded: one buffer fewer; the accumulator tile goes to the store through shared
        # memory in the output's type, which the buffers' space serves after the loop (sm_80
        # binaries of fp16 GEMMs, 2-4 stages: 203 of 211 within a quarter, most to the byte;
        # ``bench/mma_registers.py``)
        bm, bn, _ = t.main.dots[-1]
        smem = max(max(stages - 1, 1) * t.main.staged + t.main.held, bm * bn * kernel.outputs[0].dtype.itemsize)
    if kernel.specialized:
        # the consumers hand half the stored accumulator tile over in the output's type (sm_90
        # binaries: 16.8 KB more at 128 x 128, 33.2 KB at 128 x 256, fp16, a GEMM's or a chain's
        # second product; ``tests/test_native.py``)
        bm, bn, _ = t.main.dots[-1]
        smem += bm * bn // 2 * kernel.outputs[0].dtype.itemsize
    res = Resources(kernel.launched_warps, regs, smem)
    main = _phase_work(t.main, kernel, res, target, stages)
    if t.tail is not None:
        main = replace(main, tail=_phase_work(t.tail, kernel, res, target, 1))
    return main


def kernel_seconds(w: Work, target: Target, *, cuda_graph: bool = False) -> float:
    """Modelled seconds of a kernel's work, its tail phase included (same launch)."""
    s = estimate(w, target, cuda_graph=cuda_graph).seconds
    return s + (estimate(w.tail, target).body if w.tail is not None else 0.0)


@dataclass(frozen=True)
class _Phase:
    """One phase of a kernel bound to its blocks, whatever its warps."""
    programs: int
    per_input: tuple[float, ...]      # bytes one program's loads request of each input
    operand: frozenset                # inputs a Dot's operand reads
    rereads: tuple                    # per input: the split axes whose tiles re-read it (operands)
    stored: float                     # bytes of plan outputs stored
    scratch: float                    # bytes of workspaces stored
    chunks: float
    waits: float                      # of the chunks, those whose loads wait for the ones before
                                      # (an unrolled loop's chunks issue theirs together)
    inflight_loop: float              # bytes one chunk of the loop scopes requests (Dot kernels)
    dot_flops: tuple[float, ...]      # per Dot: its padded tiles' flops
    dots: tuple[tuple[int, int, DType], ...]     # per Dot: its (BM, BN, dtype) for the rate
    dot_ks: tuple[int, ...]           # per Dot: its BK (the K positions of one product)
    cuda_flops: float
    reduce_tile: int                  # the widest reduction's value tile (elements)
    tile_elems: int                   # per tile dimension its widest block, multiplied
    live: int                         # load values the program holds at once (no Dot)
    staged: int                       # shared-memory bytes of one pipeline stage of the operands
                                      # (no Dot: of the widest pipelined loop's chunk)
    held: int                         # shared-memory bytes of operands loaded once
    acc_elems: float                  # the Dots' accumulator elements (and a split loop's second pipeline)
    operand_regs: float               # registers of the Dots' operand values (OPERAND_REGISTERS), all threads
    epilogue_elems: int               # values of the tiles loaded outside Dot operands
    tail: bool                        # an Arrive's tail phase
    pipelined: bool = True            # no Dot operand is a scalar gather (``_Walk.scalar``)
    # per Dot whose A operand is computed in a loop and whose B comes through a tensor descriptor:
    # (BM, BN, BK, the registers counted for A, all threads): ``_warp_operand_registers``
    warp_operands: tuple = ()
    window_elems: int = 0             # positions a window's test selects loaded values at (no Dot)
    streamed: tuple | None = None     # (tile elements without the axes ``Profile.streamed``, their
                                      # loads' vector width)
    gathered_once: float = 0.0        # registers of operands gathered a value at a time and loaded
                                      # once, all threads: live before the accumulator is
    rows: tuple | None = None         # (tile elements without the axes ``Profile.rows``, their
                                      # reductions' widest value tile)
    products: int = 0                 # the Dots a chunk of the loops runs one after another (a split
                                      # loop's second runs the first's again, on other chunks)
    # per Dot: (the registers counted for its A operand computed in a loop, its values; all
    # threads), or None for a split loop's second run of a product (``_fragment_registers``)
    computed_a: tuple = ()


@dataclass(frozen=True)
class _Tile:
    main: _Phase
    tail: _Phase | None


def _phase_work(p: _Phase, kernel: Kernel, res: Resources, target: Target, stages: int) -> Work:
    occ = occupancy(res, target)
    concurrent = min(p.programs, max(occ, 1) * target.sm_count)
    dram = l2 = 0.0
    half = target.l2_bytes // 2
    inputs = kernel.inputs
    transient = kernel.written | kernel.transient
    plain = [per if k not in p.operand and k not in transient else 0.0 for k, per in enumerate(p.per_input)]
    d, l = split_l2(plain, p.programs, concurrent, inputs, target)
    dram, l2 = dram + d, l2 + l
    fits = sum(inputs[k].nbytes for k in p.operand) <= half
    window = _window(kernel, concurrent) if p.operand and not fits else {}
    for k, per in enumerate(p.per_input):
        total = per * p.programs
        if k in transient:
            l2 += total
            dram += total if inputs[k].nbytes > half else 0.0
        elif k in p.operand:
            l2 += total
            times = 1.0 if fits else math.prod(-(-c // window[a]) for a, c in p.rereads[k])
            dram += min(total, inputs[k].nbytes * times)
    scratch_dram = p.scratch if p.scratch > half else 0.0
    requested = sum(p.per_input) * p.programs
    if p.dots:
        rates = [dot_rate(bm, bn, kernel.compute_warps, dt, target) for bm, bn, dt in p.dots]
        tc = sum(p.dot_flops)
        seconds = sum(f / r for f, r in zip(p.dot_flops, rates))
        peak = tc / seconds if seconds else rates[0]
        cuda = target.peak(DType.float32, False)
        flops = tc + p.cuda_flops * peak / cuda
        # a pipelined loop keeps stages - 1 chunks in flight; without a loop, every load at once;
        # a loop at one stage waits for each chunk's loads before its products (``serial``)
        inflight = max(stages - 1, 1) * p.inflight_loop or (requested / p.programs if p.programs else 0.0)
        serial = p.chunks if stages == 1 and p.inflight_loop and p.chunks > 1 else 0.0
        # a loop of tensor-core products at two stages (``Target.two_stage_k_s``, measured on GEMM
        # K loops; a chain's key loop, ``CHAIN_TWO_STAGE_SHARE`` of it by its second product's K)
        two = 0.0
        if stages == 2 and p.inflight_loop and p.chunks > 1 and target.two_stage_k_s \
                and all(tensor_cores(dt, target) for _, _, dt in p.dots):
            two = math.ceil(p.chunks) * (p.dot_ks[0] if len(p.dots) == 1 else CHAIN_TWO_STAGE_SHARE * p.dot_ks[-1])
    else:
        peak, flops = target.peak(DType.float32, False), p.cuda_flops
        # a pipelined loop (``staged``) keeps stages - 1 chunks in flight; else one, and every
        # load outside a loop at once
        ahead = max(stages - 1, 1) if p.staged else 1
        inflight = ahead * requested / p.programs / p.waits if p.programs else 0.0
        serial = two = 0.0
    return Work(p.programs, dram + p.stored + scratch_dram, l2 + p.stored + p.scratch, flops, peak,
                inflight_bytes=inflight, res=res, chunks=max(math.ceil(p.chunks), 1), serial_chunks=serial,
                requested_bytes=requested + p.stored + p.scratch,
                store_bytes=(p.stored + p.scratch) if p.tail else 0.0, dram_stored=p.stored + scratch_dram,
                # (the chunks of both loops of a split, each chunk its products once: 2.0x the
                # causal chain's steps before the split's second loop was told apart)
                dot_steps=max(math.ceil(p.chunks), 1) * p.products, two_stage_k=two)


def _window(kernel: Kernel, concurrent: int) -> dict:
    """Tiles of each program-split axis the ``concurrent`` resident programs cover: program-id
    dimension 0 fastest, each through its task mapping (``Kernel.task_mapping``: row-major, or
    group-M order when swizzled)."""
    out: dict = {}
    left = max(concurrent, 1)
    for g in range(len(kernel.grid)):
        mapping = kernel.task_mapping(g)
        out.update(zip((a.name for a in kernel.sharing(g)), mapping.window(left)))
        left = -(-left // mapping.workers)
    return out


def _registers(p: _Phase, threads: int) -> int:
    if p.dots:
        held = p.operand_regs + EPILOGUE_REGISTERS * p.epilogue_elems
        # (a reduction over the accumulator's tile reduces it in place: no registers of its own)
        return DOT_REGISTER_BASE + max(math.ceil(p.acc_elems / threads), math.ceil(p.gathered_once / threads)) \
            + math.ceil(held / threads)
    # the widest scope's loads are consumed as they arrive: about a quarter of them live at once
    # (fitted with the Dot coefficients above; an elementwise kernel's binary holds far fewer
    # values than it loads)
    tile = p.tile_elems
    looped = p.tail or p.chunks > 1
    if p.rows is not None and looped:
        # a row reduced whole before a loop (a decode GEMV's RMSNorm prologue: a [2048] row, then
        # the BN x BK tiles of the K loop) is gone when the loop's tile is born: the larger of the
        # two, not the product of each dimension's widest blocks (the 1-D row of
        # ``emit._Printer._reduction``; sm_90 binaries over BN 16-128, BK 32-512, 2-8 warps: 73
        # of 87 within a quarter, every spilling one counted past 255)
        tile = max(p.rows)
    elif p.streamed is not None and p.streamed[0] >= threads * p.streamed[1]:
        # Triton spreads threads along the other axes a vector each first: where they cover all
        # threads, each holds a streamed axis whole and sums it as loaded; else the axis spans
        # threads, each holds its loaded values until the sum across them (split-K partial sums
        # [256, 4] over 128 threads: 30 registers in the sm_90 binary)
        tile = p.streamed[0]
    if looped:
        return LOOP_REGISTER_BASE + -(-tile // threads) + -(-p.live // (LIVE_SHARE * threads))
    return REGISTER_BASE + -(-tile // threads) + -(-p.live // (LIVE_SHARE * threads)) \
        + math.ceil(WINDOW_REGISTERS * p.window_elems / threads)


def _warp_operand_registers(p: _Phase, warps: int, target: Target) -> int:
    """Registers beyond the count of ``OPERAND_REGISTERS`` for a computed A operand on Hopper's
    warp-level MMA (mma.sync: fewer rows than a warpgroup MMA takes) whose B operand comes through a
    tensor descriptor: each warp holds its rows' whole BK-wide slice of A in registers, and a warp's
    rows are at least the instruction's 16, so with 16 rows every warp holds all of A (sm_90
    binaries: MobileNetV2's 16-row BatchNorm + ReLU6 convolutions, 72 registers against 46 counted;
    with B through pointers Triton slices the product along K and holds no more than counted)."""
    extra = 0.0
    for bm, bn, bk, counted in p.warp_operands:
        if target.warpgroup_mma_rows and not wgmma(bm, warps, target) and bk >= WARP_OPERAND_MIN_K:
            per_warp = bm * bk / (target.warp_size * _warps_along_m(bm, bn, warps))
            extra += max(0.0, WARP_OPERAND_REGISTERS * per_warp - counted / (warps * target.warp_size))
    return math.ceil(extra)


def _warp_level(p: _Phase, warps: int, target: Target) -> bool:
    """The phase's one Dot runs on warp-level ``mma.sync`` on a target without warpgroup MMA (an
    A100's): what ``FRAGMENT_STEPS`` and the buffers one fewer were fitted on.  A chain's two
    products hold their operands otherwise (its query loaded once, its probabilities already in
    registers): sm_80 binaries of BERT's and LLaMA's attention and MCFuser's G4 hold what the
    model counts without the term (76-80 registers at BERT's 16 rows), while causal attention at 64
    x 64 (237 registers) and G11 hold more; too few to fit a chain's own term."""
    return len(p.dots) == 1 and not target.warpgroup_mma_rows and \
        all(tensor_cores(dt, target) and not wgmma(bm, warps, target) for bm, _, dt in p.dots)


def _fragment_registers(p: _Phase, warps: int, target: Target) -> int:
    """Registers of the operand fragments warp-level MMA (``mma.sync``, m16n8k16) reads from
    registers, which Triton loads from shared memory ``FRAGMENT_STEPS`` K steps of 16 ahead (at
    BK 16 the next chunk's first step): per step a warp's BM/wm x 16 slice of A (4 registers a
    16 x 16 piece a thread) and 16 x BN/wn of B (2 a 16 x 8 piece).  An A operand computed in the
    loop (a prologue) goes from its loads to its fragments in registers, no shared memory
    between: its values at ``WARP_COMPUTED`` each, in place of what ``OPERAND_REGISTERS``
    counted for it."""
    if not _warp_level(p, warps, target):
        return 0
    ((bm, bn, _),), (counted, values) = p.dots, p.computed_a[0]
    wm = _warps_along_m(bm, bn, warps)
    wn = max(warps // wm, 1)
    b = bn / wn / 4 * FRAGMENT_STEPS
    if values:
        return math.ceil((WARP_COMPUTED * values - counted) / (warps * target.warp_size) + b)
    return math.ceil(bm / wm / 4 * FRAGMENT_STEPS + b)


def _warps_along_m(bm: int, bn: int, warps: int) -> int:
    """How Triton spreads ``warps`` over a BM x BN tile for warp-level MMA (16 x 8 a warp at least):
    doubling along whichever dimension has more instruction tiles a warp, M first on a tie."""
    wm = wn = 1
    while wm * wn < warps:
        if bm // 16 // wm >= bn // (8 * wn) and wm < bm // 16:
            wm *= 2
        else:
            wn *= 2
    return wm


@functools.lru_cache(maxsize=4096)
def _tile(body: tuple, axes: tuple, inputs: tuple, outputs: tuple, scratch: tuple, target: Target,
          tma: bool = False) -> _Tile:
    """Cached by value: the warp counts a family tries for one tile share it."""
    looped = frozenset(a.name for a in axes if a.looped)
    shape = tuple((a.name, a.vars, a.ext, a.dim, a.grid, a.alias) for a in axes)
    prof = profile(body, shape, looped, tuple(t.shape for t in inputs), tuple(t.dtype.itemsize for t in inputs), tma)
    main = _bind(prof, axes, inputs, outputs, scratch, target, None)
    tail = _bind(prof.tail, axes, inputs, outputs, scratch, target, prof.arrive) if prof.tail else None
    return _Tile(main, tail)


def _bind(prof: Profile, axes: tuple, inputs: tuple, outputs: tuple, scratch: tuple, target: Target,
          arrive: tuple | None) -> _Phase:
    """A phase's figures for one binding of the blocks (``arrive``: the tail's group axes)."""
    workspaces, counters = scratch
    by = {a.name: a for a in axes}
    canon = {a.name: a.alias or a.name for a in axes}
    split = [a for a in axes if a.grid is not None]
    empty = any(t.numel == 0 for t in outputs) or any(a.extent == 0 for a in split)
    if arrive is not None:
        programs = 0 if empty else math.prod(max(by[a].chunks, 1) for a in arrive)
    else:
        programs = 0 if empty else math.prod(max(a.chunks, 1) for a in split)
    ranges = {v: (0, n - 1) for a in axes for v, n in zip(a.vars, a.ext)}
    full = dict(ranges)
    for a in axes:
        if a.grid is not None:
            ranges.update((v, (0, n - 1)) for v, n in tile_box(a.vars, a.ext, a.block).items())
        elif a.within:
            ranges.update((v, (0, n - 1)) for v, n in tile_box(a.vars, a.ext, a.span).items())
    chunks = lambda name: max(by[name].chunks, 1)  # noqa: E731
    reach = lambda name: by[name].extent if by[name].grid is not None else by[name].reach  # noqa: E731
    # in-range share of a split axis's tiles: the last tile's positions beyond the extent are masked
    inside = {a.name: a.extent / (max(a.chunks, 1) * min(a.block, a.extent)) for a in split if a.extent}
    shares = (1.0,) + tuple(_stop_share(st, by) for st in prof.stops)
    samples = _sampled(ranges, split) if any(u.irregular for u in prof.loads) else ()
    per_input = [0.0] * len(inputs)
    operand: set = set()
    rereads: dict = {}
    loop_bytes = 0.0
    scope_bytes: dict = {}          # per loop scope (not unrolled): one chunk's load tiles' bytes
    split_names = {a.name for a in split}
    for u in prof.loads:
        t = inputs[u.site.load.tensor]
        whole = tuple(full[v] for v in u.vars)
        if u.irregular:
            b = sum(_site_bytes(u.site.load, tuple(r[v] for v in u.vars), t, target, whole)
                    for r in samples) / len(samples)
        elif u.operand and u.path:
            # a Dot operand loads one chunk's box per iteration: a convolution's chunks of K
            # re-read the input rows their windows share, which the union over K would not
            box, scale = dict(ranges), 1.0
            for a in axes:
                if canon[a.name] in u.path and canon[a.name] in u.varies and set(a.vars) & set(u.vars):
                    part = tile_box(a.vars, a.ext, a.block)
                    box.update((v, (0, n - 1)) for v, n in part.items())
                    scale *= a.reach / math.prod(part.values())
            b = scale * _site_bytes(u.site.load, tuple(box[v] for v in u.vars), t, target, whole)
        else:
            b = _site_bytes(u.site.load, tuple(ranges[v] for v in u.vars), t, target, whole)
        b *= math.prod(chunks(x) for x in u.reps)
        if not u.irregular:     # (sampled boxes already hold the last tile's in-range share)
            b *= math.prod(inside.get(x, 1.0) for x in u.varies)
        b *= shares[u.stopped]
        per_input[u.site.load.tensor] += b
        if u.path and shares[u.stopped]:       # (a loop part no program runs moves nothing)
            loop_bytes += b / (math.prod(chunks(x) for x in u.path) * shares[u.stopped])
            if not any(x in prof.unrolled for x in u.path) and not u.narrow:
                # (a buffer holds the whole tile, masked positions too: a 2-column GEMV at BN 16)
                tile = math.prod(by[x].block for x in u.varies if x in by) * t.dtype.itemsize
                scope_bytes[u.path] = scope_bytes.get(u.path, 0) + tile
        if u.operand:
            operand.add(u.site.load.tensor)
            rereads.setdefault(u.site.load.tensor, set()).update(split_names - u.varies)
    cuda = 0.0
    for f, ext_axes, tile_axes, stopped in prof.flops:
        n = f * math.prod(reach(x) for x in ext_axes) * math.prod(chunks(x) for x in tile_axes)
        cuda += n * shares[stopped]
    if arrive is not None:      # the tail walks its groups' tiles: positions per group, times groups
        cuda *= programs
    blk = lambda name: min(by[name].block, pow2(reach(name)))  # noqa: E731
    padded = lambda name: by[name].block  # noqa: E731   (what a program holds: the whole block, padding too)
    dot_flops, dots, dot_ks, staged, held, acc, operand_regs, warp_ops = [], [], [], 0, 0, 0, 0.0, []
    gathered_once, computed_a = 0.0, []
    progs = math.prod(max(a.chunks, 1) for a in split) if not empty else 0
    for d in prof.dots:
        dims = (d.m, d.n, d.k)
        per = math.prod(blk(x) if by[x].grid is not None else chunks(x) * blk(x) for x in dims)
        per *= math.prod(chunks(x) for x in d.around if canon[x] not in dims)
        f = 2.0 * progs * per * shares[d.stopped]
        dot_flops.append(f)
        dots.append((blk(d.m), blk(d.n), d.in_dtype))
        dot_ks.append(blk(d.k))
        if d.again:
            # the second loop of a split keeps its own pipeline of the product: fitted to sm_90
            # binaries of causal attention split and not (bench/README.md, "native.py")
            acc += SPLIT_REGISTERS * padded(d.m) * padded(d.n) if d.fresh else 0
            computed_a.append(None)
            continue
        # (a GEMV's one row on tensor cores holds the 16-row block's accumulator: the decode
        # step's RMSNorm + gate/up at BM 16, 106-114 registers in its sm_90 binary, 34 counted
        # with the row alone)
        acc += padded(d.m) * padded(d.n)
        item = max(d.in_dtype.itemsize, 1)
        final = []
        tiles_ab = (blk(d.m) * blk(d.k), blk(d.k) * blk(d.n))
        for kind, reads, loads, tile in zip(d.staged, d.reads, d.tile_loads, tiles_ab):
            how, tiles, tests = reads
            counted = 0.0
            if kind == 2:
                # in a loop the compiler pipelines (a chain's key loop), each whole-tile load of a
                # computed operand has its own buffers (LLaMA's RoPE'd keys, five loads: 272 KiB of
                # shared memory at two stages in the sm_90 binary, 144 counted as one tile); the
                # printer's K loop of a GEMM computes its operand in registers (the binaries: one)
                staged += tile * item * (loads if how in ("computed", "gathered") and d.around else 1)
            elif kind == 1:
                held += tile * item
            # (a shifted box is the printer's where the block itself divides the chunk: ``masked``)
            if tests and all(t % (by[a].block if how == "shifted" else blk(a)) == 0 for a, t, _ in tests):
                # one piece's pointers per tile (emit.py: _pointers), or its descriptor; a
                # shifted descriptor where no tile runs past its chunk
                how, tiles = ("tma" if how in ("pieces", "shifted") else "direct"), 1
            elif how == "pieces":
                how = "computed"
            elif how == "shifted":
                how = "direct"
            if how == "computed" and kind == 1 and len(prof.dots) == 1 and not any(chunks(x) > 1 for x in d.around):
                operand_regs += SINGLE_CHUNK_COMPUTED * tiles * tile
            elif how in ("computed", "windowed") and kind == 1:
                operand_regs += HELD_COMPUTED * tiles * tile
            elif how == "scalar" and kind == 1:
                # a scalar gather loaded once (the whole K one chunk: no loop) holds a gather's
                # values and addresses before its product, whose accumulator is born after
                # (MobileNetV2's NCHW stem, 256 x 32 at BK 32: 95 registers in its sm_90 binary
                # against 92 for its accumulator, 141 counted with both; the 6-channel stem's
                # 64 x 16 at BK 128: 72 against 76 for its gather); in a loop it holds each
                # chunk's values and addresses beside the accumulator
                gathered_once += OPERAND_REGISTERS["gathered"] * tiles * tile
            elif how:
                # through a quotient, loaded once, it holds its addresses' div/mod and guards per
                # value (MobileNetV2's stem with its row copy fused back: 128-168 registers, sm_90)
                if kind == 1 and how == "quotient":
                    how = "quotient_once"
                wide = how == "computed" and tiles == 1 and by[d.k].block >= WIDE_K
                counted = (WIDE_COMPUTED if wide else OPERAND_REGISTERS[how]) * tiles * tile
                operand_regs += counted
            final.append((how, kind, tiles * tile, counted))
        # an A computed in a loop (a prologue; zeroed outside a padded window too): (its
        # registers counted above, its values), all threads
        computed_a.append((final[0][3], final[0][2]) if final[0][0] in ("computed", "windowed") and final[0][1] == 2
                          else (0.0, 0))
        if len(final) == 2 and final[0][:2] == ("computed", 2) and final[1][0] == "tma":
            warp_ops.append((padded(d.m), padded(d.n), padded(d.k), OPERAND_REGISTERS["computed"] * final[0][2]))
    if not prof.dots:
        # a loop reduced on CUDA cores, pipelined (``emit._streams``): each stage past the first
        # buffers one chunk's loads in shared memory, the loops one after another (sm_90
        # binaries of the decode GEMVs: 17 KiB a stage for a 16 x 512 fp16 weight chunk)
        staged = max(scope_bytes.values(), default=0)
    reduce_tile = max((math.prod(blk(x) for x in tile) for tile in prof.reduce_tiles), default=0)
    streamed, rows = dict(prof.streamed), set(prof.rows)

    def widest(skip) -> dict[int, int]:
        """Per tile dimension, the widest block of the axes on it but those in ``skip``."""
        out: dict[int, int] = {}
        for a in axes:
            if a.dim >= 0 and canon[a.name] not in skip:
                out[a.dim] = max(out.get(a.dim, 1), a.block)
        return out
    dims, kept, unrowed = widest(()), widest(streamed), widest(rows)
    loops = [(p, s) for p, has, s in prof.scopes]
    nchunks = waits = 0.0
    for path, has, stopped in prof.scopes:
        if path:
            nchunks += math.prod(chunks(x) for x in path) * shares[stopped]
            # an unrolled loop's chunks issue their loads together: one round trip
            waits += math.prod(chunks(x) for x in path if x not in prof.unrolled) * shares[stopped]
        elif has or len(loops) == 1:
            nchunks += 1
            waits += 1
    # the values a thread holds at once: its share of each load of the widest scope (a load
    # spans the blocks of the axes it varies along; an unrolled loop's, every chunk's), at most
    # MAX_LIVE_LOADS of them
    live = 0
    for path, _ in loops:
        sizes = sorted(((math.prod(by[x].block for x in u.varies if x in by), u.site.load.dtype.itemsize)
                        for u in prof.loads if u.path == path), reverse=True)[:MAX_LIVE_LOADS]
        # (an Arrive tail's unrolled sum of the partials adds each as it arrives: the split-K
        # GEMMs' sm_90 binaries hold no more than their main phase, bench/dot_registers.py)
        unrolled = math.prod(chunks(x) for x in path if x in prof.unrolled) if arrive is None else 1
        if unrolled > 1 or (path and not prof.dots and arrive is None):
            # every chunk's values at once, at their bytes (``live`` counts values a quarter of
            # which are held: ``LIVE_SHARE``); so a loop's on CUDA cores, whose chunk feeds its
            # products or sums whole (``REGISTER_BYTES``); an unrolled loop's for sm_80 interleaved
            # with its uses, a quarter of them (``UNROLLED_AHEAD_ARCH``)
            ahead = 1 if unrolled > 1 and 0 < target.arch < UNROLLED_AHEAD_ARCH else LIVE_SHARE
            values = unrolled * ahead * sum(n * item / REGISTER_BYTES for n, item in sizes)
        else:
            values = sum(n for n, _ in sizes)
        live = max(live, math.ceil(values))
    epilogue = sum(math.prod(blk(x) for x in u.varies if x in by) for u in prof.loads if not u.operand) \
        if prof.dots else 0
    stored_slots = [k for k in prof.stored if k not in workspaces and k not in counters and k not in prof.scattered]
    scratch_slots = [k for k in prof.stored if k in workspaces]
    # a scatter writes one value per position of the kernel's iteration space, not its output whole
    positions = math.prod(a.extent for a in axes if not a.alias and not a.within)
    scattered = sum(positions * outputs[k].dtype.itemsize for k in prof.scattered)
    return _Phase(programs, tuple(per_input), frozenset(operand),
                  tuple(tuple((a, chunks(a)) for a in sorted(rereads.get(k, ()))) for k in range(len(inputs))),
                  stored_bytes([outputs[k] for k in sorted(stored_slots)], target) + scattered,
                  sum(outputs[k].nbytes for k in scratch_slots), max(nchunks, 1.0), max(waits, 1.0), loop_bytes,
                  tuple(dot_flops), tuple(dots), tuple(dot_ks), cuda, reduce_tile,
                  # a tail holds its own tile (its reductions', else its widest load's: a
                  # split-K sum's output tile), not the kernel's widest blocks
                  (reduce_tile or max((math.prod(by[x].block for x in u.varies if x in by) for u in prof.loads),
                                      default=math.prod(dims.values())))
                  if arrive is not None else math.prod(dims.values()),
                  live, staged, held, acc, operand_regs, epilogue, arrive is not None,
                  not any(r[0] in ("scalar", "quotient") for d in prof.dots for r in d.reads), tuple(warp_ops),
                  sum(math.prod(by[x].block for x in ax if x in by) * (WINDOW_COMPUTED if computed else 1.0)
                      for ax, computed in prof.windows),
                  (math.prod(kept.values()), max(streamed.values())) if streamed and arrive is None else None,
                  gathered_once,
                  (math.prod(unrowed.values()),
                   max(math.prod(blk(x) for x in t) for t in prof.reduce_tiles if t & rows))
                  if rows and arrive is None else None, sum(not d.again for d in prof.dots), tuple(computed_a))


@functools.lru_cache(maxsize=65536)
def _site_bytes(load: Load, box: tuple, t, target: Target, whole: tuple) -> float:
    """Bytes a load moves over a box of its variables' ranges (``box``; ``whole``: their ranges
    over the kernel): cached, since most candidate tiles leave a load's box unchanged."""
    site = _load_site(load)
    names = _site_vars(site)
    return site_elems(site, dict(zip(names, box)), t, target, dict(zip(names, whole))) * t.dtype.itemsize


@functools.lru_cache(maxsize=65536)
def _load_site(load: Load) -> LoadSite:
    return load_site(load)


def _site_vars(site: LoadSite) -> tuple:
    return _sorted_vars(site.load)


@functools.lru_cache(maxsize=65536)
def _sorted_vars(load: Load) -> tuple:
    return tuple(sorted(_index_vars(load), key=lambda v: v.name))


SAMPLES = 8    # program tiles whose boxes stand for a load through a floordiv/mod index map


def _sampled(ranges: dict, split: list) -> list[dict]:
    """The boxes of up to ``SAMPLES`` programs spread along the grid (tile k·chunks/SAMPLES of
    each program-split axis): a load through a non-affine index map (a concatenation's, a
    patch embedding's floordiv/mod) touches different boxes from program to program."""
    count = max([min(a.chunks, SAMPLES) for a in split] + [1])
    out = []
    for k in range(count):
        r = dict(ranges)
        for a in split:
            r.update(_box_at(a.vars, a.ext, a.block, (k * max(a.chunks, 1) // count) * a.block))
        out.append(r)
    return out


def _box_at(vars_, ext, block: int, start: int) -> dict:
    """Each variable's range over the row-major positions [start, start + block) of its axis."""
    if not math.prod(ext):          # an empty axis: no position, its variables' whole (empty) ranges
        return {v: (0, n - 1) for v, n in zip(vars_, ext)}
    out, stride = {}, 1
    end = min(start + block, math.prod(ext)) - 1
    for v, n in zip(reversed(vars_), reversed(ext)):
        lo, hi = start // stride, end // stride
        out[v] = (0, n - 1) if hi - lo + 1 >= n or lo % n > hi % n else (lo % n, hi % n)
        stride *= n
    return out


def _stop_share(stop: tuple, by: dict) -> float:
    """Of a loop that stops after the key ``k`` past its program's last row and starts at the
    chunk of the key ``w`` before its first row (either None: from the first chunk, to the last),
    the share of its chunks a program runs on average over the row tiles; of its part before
    the chunk reaching past key ``s`` after the first row (``("until", s)``), or from there on
    (``("resume", s)``)."""
    loop, row, k, w, part = stop
    n, m = by[loop], by[row]
    nt = max(n.chunks, 1)
    walked = []
    for i in range(max(m.chunks, 1)):
        end = nt if k is None else min(nt, max(0, -(-((i + 1) * m.block + k) // n.block)))
        first = 0 if w is None else max(i * m.block - w, 0) // n.block
        if part is not None:
            split = min(nt, max(first, (i * m.block + part[1] + 1) // n.block))
            first, end = (first, split) if part[0] == "until" else (split, end)
        walked.append(max(end - first, 0))
    return sum(walked) / len(walked) / nt


@functools.lru_cache(maxsize=4096)
def profile(body: tuple, shape: tuple, looped: frozenset, input_shapes: tuple, itemsizes: tuple,
            tma: bool = False) -> Profile:
    """The kernel's ``Profile`` from its statements, its axes (name, vars, ext, dim, grid, alias),
    the axes that are looped, its inputs' shapes and element sizes, and whether plain operand
    loads go through tensor descriptors.  Cached by value: a family lowers a body once and binds
    block sizes per candidate, which changes neither."""
    return _Walk(shape, looped, input_shapes, itemsizes, tma=tma).run(body)


class _Walk:
    """One phase's walk.  ``tail``: an ``Arrive``'s body, whose positions are per group (its
    program-split axes are the group's, one position each)."""

    def __init__(self, shape: tuple, looped: frozenset, input_shapes: tuple, itemsizes: tuple, tail: bool = False,
                 tma: bool = False):
        self.shape, self.input_shapes, self.itemsizes, self.tma = shape, input_shapes, itemsizes, tma
        self.tiled = {v: dim >= 0 for _, vars_, _, dim, *_ in shape for v in vars_}   # a tile dim, not per program
        self.axis_info = {v: (alias or name, vars_, ext[0] if len(ext) == 1 else None, dim)
                          for name, vars_, ext, dim, _, alias in shape for v in vars_}
        self.extents = {v: n for _, vars_, ext, *_ in shape for v, n in zip(vars_, ext)}
        num_inputs = len(input_shapes)
        self.canon = {name: alias or name for name, _, _, _, _, alias in shape}
        self.axis_of = {v: self.canon[name] for name, vars_, *_ in shape for v in vars_}
        aliases: dict[str, set[str]] = {}
        for name, _, _, _, _, alias in shape:
            aliases.setdefault(alias or name, set()).add(name)
        self.binds = {k: frozenset(v) for k, v in aliases.items()}
        self.split = frozenset() if tail else frozenset(n for n, _, _, _, grid, _ in shape if grid is not None)
        self.whole = frozenset(name for name, _, _, _, grid, alias in shape
                               if grid is None and not alias and name not in looped)
        bound = frozenset().union(*(self.binds[name] for name, *_rest, alias in shape
                                    if not alias and name not in looped))
        self.looped, self.nin, self.is_tail = looped, num_inputs, tail
        # open scopes: (bound axes, loads issued, arithmetic computed, loop axis or None, index in scopes)
        self.stack: list[tuple[frozenset, dict, set, str | None, int]] = [(bound, {}, set(), None, 0)]
        self.scopes: list[list] = [[(), False, False]]
        self.uses: list[LoadUse] = []
        self.flops: list = []
        self.dots: list[DotUse] = []
        self.reduce_tiles: list[frozenset] = []
        self.stored: set[int] = set()
        self.slot_axes: dict[int, frozenset] = {}
        self.axes_memo: dict = {}
        self.around: list[str] = []               # enclosing Loop axes
        self.stopped = 0
        self.stops: list[tuple] = []
        self.until: tuple | None = None           # the last loop's split (Loop.until)
        self.resuming = False                     # in a loop that resumes the one before it
        self.tail: Profile | None = None
        self.arrive: tuple = ()
        self.unrolled: set = set()
        self.scattered: set[int] = set()
        self.windows: dict = {}                   # select by a window's test -> its axes
        self.reduced: dict = {}                   # axis reduced whole -> the widest vector of the loads its
                                                  # reductions read (0: one reads something else)
        self.kept: set = set()                    # axes a stored value or another reduction varies along
        self.chunked: set = set()                 # axes a reduction takes a chunk at a time

    def run(self, body) -> Profile:
        self.statements(body)
        return Profile(tuple(self.uses), tuple(self.flops), tuple(self.dots), tuple(self.reduce_tiles),
                       tuple((tuple(p), has, st) for p, has, st in self.scopes), frozenset(self.stored),
                       tuple(self.stops), self.arrive, self.tail, frozenset(self.unrolled),
                       frozenset(self.scattered), tuple(self.windows.values()), self.streamed(), self.rows())

    def streamed(self) -> tuple:
        """(axis, vector width) of the axes reduced whole (not looped) only ever from a load as
        it arrives, and along which nothing else varies: a split-K sum of the partials before an
        epilogue's row.  Where a thread holds the axis whole (``_registers``), it folds each
        loaded vector into its sum and holds no more of the loaded tile than the loads in flight
        (BERT's split-K + LayerNorm row, [1, 1024, 8] fp32 partials over 256 threads: 38 registers
        in its sm_90 binary, 58 counted with the 32 values held)."""
        return tuple(sorted((a, vec) for a, vec in self.reduced.items() if vec and a not in self.kept))

    def rows(self) -> tuple:
        """The axes reduced whole (not looped), loaded or computed, along which nothing else
        varies: a row summed to a value before a loop (a decode GEMV's RMSNorm prologue), dead
        before the loop's tile is born (``_registers``)."""
        return tuple(sorted(a for a in self.reduced if a not in self.kept and a not in self.chunked))

    def window(self, *exprs, pool: bool = False) -> None:
        """Record the selects of loaded values by a test of indices alone in ``exprs`` (a padded
        window: ``where(in_bounds, relu(x[i - 1]), fill)``), each once; ``pool``: a max or min
        over the window takes each computed value as it comes (not ``WINDOW_COMPUTED``)."""
        for e in exprs:
            for n in walk(e, into=lambda x: not isinstance(x, Load)):
                if not isinstance(n, Select) or n in self.windows or load_nodes(n.cond):
                    continue
                inner = n.a if _fill(n.b) else n.b if _fill(n.a) else None
                loads = {v for v in load_nodes(inner) if v.tensor < self.nin} if inner is not None else ()
                if loads:
                    # (computed: per-channel vectors loaded beside the windowed value, a BatchNorm's;
                    # a clip of the windowed value alone holds no more than the value)
                    self.windows[n] = (self.node_axes(n), not pool and len(loads) > 1)

    def statements(self, body) -> None:
        for st in body:
            if isinstance(st, Store):
                self.kept.update(self.axes(st.value, *st.index))
                self.window(st.value)
                for e in (st.value, *st.index, *st.guards):
                    self.loads(e)
                self.count((st.value, *st.guards))
                self.stored.add(st.output)
                if any(isinstance(n, Load) for e in st.index for n in walk(e)):
                    self.scattered.add(st.output)
            elif isinstance(st, Reduce):
                axis = self.canon[st.axis]
                tile = self.axes(st.value) | {axis}
                self.kept.update(tile - {axis})
                self.window(st.value, pool=st.combiner in ("max", "min"))
                value = st.value
                while isinstance(value, Cast):
                    value = value.x
                loaded = st.axis not in self.looped and isinstance(value, Load) and value.tensor < self.nin
                if st.axis in self.looped:
                    self.chunked.add(axis)
                vec = 16 // self.itemsizes[value.tensor] if loaded else 0
                self.reduced[axis] = min(self.reduced.get(axis, vec), vec) if vec else 0
                with self.scope(st.axis):
                    self.loads(st.value)
                    self.count((st.value,), {axis}, combine=1)
                self.slot_axes[st.slot] = tile - {axis}
                self.reduce_tiles.append(frozenset(tile))
            elif isinstance(st, Loop):
                for s in st.state:
                    self.slot_axes[s.slot] = frozenset(self.canon[a] for a in s.axes)
                looped = st.axis in self.looped
                if st.unroll and looped:
                    self.unrolled.add(self.canon[st.axis])
                if st.until is not None and not looped:
                    continue                # one chunk: the loop that resumes it runs it
                stopped = self.stopped
                part = ("until", st.until[1]) if st.until is not None else \
                    ("resume", self.until[1]) if st.resume and looped and self.until else None
                bound = st.stop or st.start or st.until or (self.until if part else None)
                self.until = st.until
                if bound is not None:
                    self.stops.append((st.axis, bound[0], st.stop[1] if st.stop else None,
                                       st.start[1] if st.start else None, part))
                    self.stopped = len(self.stops)
                resuming, self.resuming = self.resuming, self.resuming or (st.resume and part is not None)
                with self.scope(st.axis):
                    self.around.append(self.canon[st.axis])
                    self.statements(st.body)
                    for s in st.state:
                        self.loads(s.next)
                        self.count((s.next,))
                    self.around.pop()
                self.stopped, self.resuming = stopped, resuming
            elif isinstance(st, Dot):
                self.dot(st)
            elif isinstance(st, Arrive):
                if self.tail is not None or self.is_tail:
                    raise TypeError("work: a kernel with nested or repeated Arrive statements")
                self.arrive = st.axes
                self.stored.add(st.counter)
                inner = _Walk(self.shape, self.looped, self.input_shapes, self.itemsizes, tail=True)
                inner.slot_axes = dict(self.slot_axes)
                self.tail = inner.run(st.body)
            else:
                raise TypeError(f"work: {type(st).__name__} statements are not costed")

    def dot(self, st: Dot) -> None:
        m, n, k = (self.canon[x] for x in (st.m, st.n, st.k))
        staged = []
        reads = []
        tile_loads = []
        with self.scope(st.k):
            for operand, dims in ((st.a, {m, k}), (st.b, {k, n})):
                paths = self.loads(operand, operand=True)
                staged.append(0 if not paths else 2 if any(paths) else 1)
                reads.append(self.operand_reads(operand, dims, k) if paths else ("", 0, ()))
                tile_loads.append(self.whole_tiles(operand, dims))
                self.count((operand,))
            if st.init is not None:
                self.count((st.init,))
        self.dots.append(DotUse(m, n, k, st.in_dtype, tuple(self.around), tuple(staged), self.stopped,
                                tuple(reads), self.resuming, st.init is None, tuple(tile_loads)))
        self.slot_axes[st.slot] = frozenset({m, n})

    def operand_reads(self, e, dims: set, k: str) -> tuple:
        """How a Dot operand with input loads is read, (a key of ``OPERAND_REGISTERS``, the loads
        of whole tiles it reads, a concatenation's tests): gathered when a load's address is not
        affine in a tile axis's flat index, else direct when the operand is the load itself (cast
        at most), else computed (direct after all, at binding, where it is a concatenation whose
        pieces the blocks divide; "pieces" where each piece's tile is a descriptor's box on sm_90:
        ``tma`` then, as the printer reads it, ``emit.py: _described_pieces``)."""
        # each load of the whole tile holds its own values and addresses (a concatenation's
        # select among three weights: three); a per-row or per-column vector is few values;
        # a gathered operand's loads share their index arithmetic (RoPE's two reads of a row)
        loads = [n for n in walk(e) if isinstance(n, Load) and n.tensor < self.nin]
        tiles = self.whole_tiles(e, dims)
        while isinstance(e, Cast):
            e = e.x
        windowed = self.windowed(e, dims - {k}) and not guarded_load(e)
        if any(self.gathered(ld) for ld in loads):
            kinds = {self.scalar(ld) for ld in loads}
            if kinds <= {"", "vector"} and windowed:
                # a prologue zeroed outside a padded window holds the window's test, its vectors
                # and the select per value whether its K positions are split by div/mod per
                # value (a split-K chunk's) or not (ResNet-50's split-4 3 x 3 BatchNorm + ReLU
                # convolution: 255 registers and a spill in its sm_90 binary, 156 counted gathered)
                return "windowed", tiles, ()
            if kinds == {"vector"}:
                # a computed operand (a ReLU6 before the product) still passes through registers
                # (MobileNetV2's split-K 1 x 1 convolutions: 117 registers, 73 counted as copies)
                plain = self.unguarded(e, k)
                return ("vector", 1, ()) if isinstance(plain, Load) or guarded_load(plain) else ("computed", tiles, ())
            return ("quotient" if "quotient" in kinds else "scalar" if "scalar" in kinds else "gathered"), 1, ()
        if guarded_load(e):                 # a padded window: one zero-filling masked copy (no TMA)
            return "direct", 1, ()
        if isinstance(e, Load):
            shape = self.input_shapes[e.tensor]
            if not self.tma:
                return "direct", 1, ()
            if descriptor_dims(e, shape, self.axis_info, tuple(dims), self.extents):
                return "tma", 1, ()
            where = descriptor_dims(e, shape, self.axis_info, tuple(dims), self.extents, shifted=tuple(dims))
            if not where:
                return "direct", 1, ()
            # at a split-K program's shift: a descriptor where each shifted axis's block divides
            # its extent (the printer's test), else pointers
            tests = []
            for d in where.values():
                v, shift = tile_shift(e.index[d], self.axis_info)
                if shift is not None:
                    tests.append((self.axis_info[v][0], self.extents[v], None))
            return "shifted", 1, tuple(tests)
        if windowed:
            return "windowed", tiles, ()     # a prologue zeroed outside a padded window
        tests = piece_tests(e, self.axis_info) or ()
        if tests and self.tma and {a for a, _, _ in tests} <= {self.canon[n] for n in self.split} and \
                piece_descriptors(e, self.input_shapes, self.axis_info, tuple(dims), self.extents):
            return "pieces", tiles, tests    # through the descriptor of a tile's piece, where blocks divide
        return "computed", tiles, tests

    def whole_tiles(self, e, dims: set) -> int:
        """The loads of a Dot operand ``e`` that each read a whole tile over ``dims`` (one at
        least); a variable of extent 1 varies along nothing (a batch of one's per-channel vector)."""
        loads = [n for n in walk(e) if isinstance(n, Load) and n.tensor < self.nin]
        return max(sum(dims <= self.varies(ld) for ld in loads), 1)

    def varies(self, ld: Load) -> frozenset:
        """The axes (canonical) a load's index varies along; a variable of extent 1 varies along
        nothing (a batch of one's index into a per-channel vector, ``(b, c, 0, 0)``, reads one row,
        not the M tile)."""
        return frozenset(self.axis_of[v] for v in _index_vars(ld) if v in self.axis_of and self.extents[v] != 1)

    def windowed(self, e, rows: set) -> bool:
        """``e`` is a value zeroed outside a padded window: a select of zero whose test varies
        along the operand's rows (``rows``: its tile axis other than K), under any selects whose
        test reads K alone (a split-K chunk's guard past K, ``k < 960``: one test a column, not a
        window's, MobileNetV2's split-K ReLU6 1 x 1 convolutions)."""
        while isinstance(e, (Cast, Select)):
            if isinstance(e, Cast):
                e = e.x
                continue
            if not (isinstance(e.b, Const) and e.b.value == 0):
                return False
            if self.axes(e.cond) & rows:
                return True
            e = e.a
        return False

    def unguarded(self, e, k: str):
        """``e`` without its casts and the selects of zero whose test reads K alone (a split-K
        chunk's guard past K)."""
        while isinstance(e, Cast) or (isinstance(e, Select) and isinstance(e.b, Const) and e.b.value == 0
                                      and self.axes(e.cond) <= {k}):
            e = e.x if isinstance(e, Cast) else e.a
        return e

    def gathered(self, ld: Load) -> bool:
        """The load's element offset is not affine in the flat index of a tile axis of several
        variables (the printer splits such an index by div/mod): an im2col window, a strided
        row, a permuted pair of axes; variables of extent 1 do not count."""
        coeff: dict = {}
        stride = 1
        for (kind, what), n in reversed(tuple(zip(_load_site(ld).dims, self.input_shapes[ld.tensor]))):
            if kind != "affine":
                used = what if kind == "data" else free_vars(what)
                if (kind == "other" and _whole_runs(what)) or not any(self.tiled.get(v) for v in used):
                    continue        # (a per-program index: a KV head's h // 4)
                return True
            for v, c in what[0].items():
                coeff[v] = coeff.get(v, 0) + c * stride
            stride *= n
        lives = [[(v, n) for v, n in zip(vars_, ext) if n > 1 and dim >= 0] for _, vars_, ext, dim, *_ in self.shape]
        # the variables a tile axis's flat index moves fastest: runs of memory follow one of them
        # or none (a padded-channels stem over an NCHW image: the channel innermost, a tap's
        # column moving by one element but not fastest, so no run of the flat index)
        fastest = {live[-1][0] for live in lives if live}
        for live in lives:
            if len(live) > 1 and any(coeff.get(v) for v, _ in live) and \
                    any(coeff.get(a, 0) != coeff.get(b, 0) * nb for (a, _), (b, nb) in zip(live, live[1:])):
                # runs of the innermost variable that hold whole 16-byte vectors stay vector
                # loads (a heads-by-dim axis); shorter runs are per-value addresses; an axis the
                # memory runs do not follow (a strided convolution's rows: one base address a
                # row) keeps the vectors of the axis they do follow
                inner, n = live[-1]
                if coeff.get(inner) == 1 and n % GATHER_RUN == 0:
                    continue
                if coeff.get(inner) == 1 or \
                        not any(c == 1 and self.tiled.get(v) and v in fastest for v, c in coeff.items()):
                    return True
        return False

    def narrow(self, ld: Load) -> bool:
        """Whether Triton can prove no ``CP_ASYNC_BYTES`` run of the load: a scalar gather
        (``scalar``), or rows whose length is no whole run read at varying rows (a 50,257-wide
        vocabulary in fp16: every row's start unaligned, 2-byte loads in the sm_90 binary)."""
        if self.scalar(ld) in ("scalar", "quotient"):
            return True
        shape = self.input_shapes[ld.tensor]
        need = -(-CP_ASYNC_BYTES // self.itemsizes[ld.tensor])
        return need > 1 and len(shape) > 1 and shape[-1] % need != 0 \
            and any(free_vars(i) for i in ld.index[:-1])

    def scalar(self, ld: Load) -> str:
        """"scalar" where Triton can prove no run of ``CP_ASYNC_BYTES`` contiguous in the load's tile: its last
        dim's index moves by one element only along a tile axis's innermost variable of an
        extent without a factor that long (``flat % 7``: the 7 taps of an NCHW stem's row), or
        by more (a stride-2 row); its values are loaded one at a time (sm_90 binaries of the
        ResNet and MobileNet stems: 2-byte loads, no cp.async); or its last dim's index is a
        quotient ``x // c`` of a tiled index, "quotient" (each value c times over, no two
        neighbours contiguous: a row-window copy fused back into its stem reads the NCHW image so,
        2-byte loads in its sm_90 binary); "vector" where its last dim's index is a channel
        taken modulo whole 16-byte runs (``vector_run``); "" otherwise.  Another index the walk cannot read as
        affine is not judged (a rotated half stays a gather)."""
        dims = _load_site(ld).dims
        need = -(-CP_ASYNC_BYTES // self.itemsizes[ld.tensor])
        if dims and dims[-1][0] == "other" and need > 1:
            last = dims[-1][1]
            if _quotient(last) and any(self.tiled.get(v) for v in free_vars(last)):
                return "quotient"
            return "vector" if self.vector_run(last, 16 // self.itemsizes[ld.tensor]) else ""
        if not dims or dims[-1][0] != "affine" or need <= 1:
            return ""           # (a 0-d tensor's one value: a broadcast, not a run)
        what = dims[-1][1]
        coeff = what[0]
        moving = False
        for _, vars_, ext, dim, *_ in self.shape:
            live = [(v, n) for v, n in zip(vars_, ext) if n > 1 and dim >= 0]
            if not live:
                continue
            moving = moving or any(coeff.get(v) for v, _ in live)
            inner, n = live[-1]
            # one variable: a contiguous arange of the block; the innermost of several: ``flat % n``
            if coeff.get(inner) == 1 and (len(live) == 1 or n & -n >= need):
                return ""
        return "scalar" if moving else ""

    def vector_run(self, e, run: int) -> bool:
        """The innermost index ``e`` is ``x % c`` of a tile variable at step one plus per-program
        shifts, ``c`` and every shift whole ``run``s (16 bytes): a split-K chunk's channel of an
        NHWC convolution, ``(ss * 640 + k) % 256``, whose gather moves whole 16-byte vectors (its
        sm_90 binaries: 0.3 registers a value, against 0.75 for an NCHW gather's)."""
        if not (isinstance(e, Binary) and e.op == "mod" and isinstance(e.b, Const) and int(e.b.value) % run == 0):
            return False
        lin = linear_form(e.a)
        own = [v for v, c in lin.terms.items() if isinstance(v, Var) and self.tiled.get(v) and c == 1]
        return len(own) == 1 and lin.const % run == 0 and \
            all(c % run == 0 and not any(self.tiled.get(w) for w in free_vars(u))
                for u, c in lin.terms.items() if u is not own[0])

    @contextlib.contextmanager
    def scope(self, axis: str):
        """A loop over ``axis`` when it is looped and not bound yet (by an enclosing loop)."""
        bound = self.stack[-1][0]
        if axis not in self.looped or axis in bound:
            yield                          # covered whole (or this chunk of an enclosing loop)
            return
        path = [a for *_, a, _ in self.stack if a is not None] + [axis]
        self.scopes.append([path, False, self.stopped])
        self.stack.append((bound | self.binds[self.canon[axis]], {}, set(), axis, len(self.scopes) - 1))
        try:
            yield
        finally:
            self.stack.pop()

    def axes(self, *exprs) -> frozenset:
        """The axes (canonical) the expressions vary along: their variables' and the slots' they read."""
        return frozenset().union(*(self.node_axes(e) for e in exprs))

    def loads(self, e, operand: bool = False) -> list[tuple]:
        """Place every memory load of ``e`` in its scope, once; the loop paths of the scopes
        holding them (for a Dot's operand: staged in shared memory when one is a loop's)."""
        paths = []
        for n in load_nodes(e):
            if n.tensor >= self.nin:
                continue
            depth = next((i for i, s in enumerate(self.stack) if n in s[1]), None)
            if depth is None:
                axes = self.varies(n)
                depth = next(i for i, s in enumerate(self.stack) if axes <= s[0])
                home = self.stack[depth]
                home[1][n] = None
                path = tuple(s[3] for s in self.stack[:depth + 1] if s[3] is not None)
                self.scopes[home[4]][1] = True
                site = _load_site(n)
                self.uses.append(LoadUse(site, _site_vars(site), axes,
                                         tuple(a for a in path if self.canon[a] not in axes), path, operand,
                                         self.stopped if path else 0, any(k == "other" for k, _ in site.dims),
                                         self.narrow(n)))
            paths.append(tuple(s[3] for s in self.stack[:depth + 1] if s[3] is not None))
        return paths

    def count(self, exprs, spans=frozenset(), *, combine: int = 0) -> None:
        """Record the arithmetic of ``exprs`` not yet computed in an open scope: each node at the
        positions of the axes it varies along (a row's max once per row, not per element), times
        the tiles (programs, loop chunks) of the program-split and enclosing loop axes it does
        not vary along; ``combine`` more per position of the expressions and ``spans`` (a
        reduction's combining step)."""
        memo = self.stack[-1][2]
        seen = [s[2] for s in self.stack]
        by_axes: dict[frozenset, int] = {}
        for e in exprs:
            for n in walk(e, into=lambda x: not isinstance(x, Load)):
                if isinstance(n, (Unary, Binary, Select)) and not any(n in s for s in seen):
                    memo.add(n)
                    ax = self.node_axes(n)
                    by_axes[ax] = by_axes.get(ax, 0) + (1 if isinstance(n, Select) else OP_WEIGHT.get(n.op, 1))
        if combine:
            ax = self.axes(*exprs) | frozenset(self.canon[a] for a in spans)
            by_axes[ax] = by_axes.get(ax, 0) + combine
        within = self.split | frozenset(self.around)
        for ax, f in sorted(by_axes.items(), key=lambda kv: sorted(kv[0])):
            self.flops.append((f, ax, within - ax, self.stopped))

    def node_axes(self, e) -> frozenset:
        """The axes (canonical) the value of ``e`` varies along (memoized per node)."""
        got = self.axes_memo.get(e)
        if got is None:
            if isinstance(e, Var):
                got = frozenset({self.axis_of[e]}) if e in self.axis_of else frozenset()
            elif isinstance(e, Value):
                got = self.slot_axes.get(e.slot, frozenset())
            else:
                got = frozenset().union(*(self.node_axes(c) for c in e.children()))
            self.axes_memo[e] = got
        return got


def _fill(e) -> bool:
    """``e`` is a constant (under casts): a window's fill outside it.  A select between two loaded
    values by an index test (RoPE's rotated half, ``where(d < 64, -x[d + 64], x[d - 64])``) is no
    window: its sm_90 binary holds the two loads' values, no test per position (LLaMA's: 18
    registers, 34 counted as a window)."""
    while isinstance(e, Cast):
        e = e.x
    return isinstance(e, Const)


def _quotient(e) -> bool:
    """``e`` is ``x // c`` (plus or minus a constant) with ``c`` a constant of at least 2."""
    while isinstance(e, Binary) and e.op in ("add", "sub") and isinstance(e.b, Const):
        e = e.a
    return isinstance(e, Binary) and e.op == "floordiv" and isinstance(e.b, Const) and int(e.b.value) >= 2


def _whole_runs(e) -> bool:
    """An index ``v // c`` or ``v % c`` of one variable with ``c`` a multiple of ``GATHER_RUN``:
    runs of ``c`` consecutive values (a heads-by-dim axis read from a [heads, seq, dim] tensor),
    whole vectors."""
    return isinstance(e, Binary) and e.op in ("floordiv", "mod") and isinstance(e.a, Var) \
        and isinstance(e.b, Const) and int(e.b.value) % GATHER_RUN == 0


@functools.lru_cache(maxsize=65536)
def _index_vars(ld: Load) -> frozenset[Var]:
    return frozenset().union(*(free_vars(e) for e in ld.index))
