"""Persistent kernels, first stage (issue #25): runs of consecutive generated kernels launched as
the phases of one kernel whose programs take tasks from a counter (``codegen/triton/persistent.py``,
``compile(persistent=True)``, experimental: every run, not chosen by cost).  Checked against eager
PyTorch through Triton's interpreter (its programs run one after another: the first takes every
task in order), and compiled for sm_90."""
from __future__ import annotations

import math
import re

import pytest
import torch

import tilefuse
from tilefuse import zoo
from tilefuse.runtime.executor import run_phases


# h100 without the measured tensor-core latency floor (gemm_eval.H100_UNFLOORED): the plans these
# tests' mechanisms need (a cuBLAS call between generated kernels, a split chain that compiles
# without spilling) are the ones the model chose before it; with the floor it prefers fewer,
# larger programs there
def unfloored():
    from gemm_eval import H100_UNFLOORED
    return H100_UNFLOORED


def _outputs(x):
    if isinstance(x, torch.Tensor):
        return x
    return getattr(x, "logits", None) if hasattr(x, "logits") else getattr(x, "last_hidden_state", x[0])


@pytest.mark.parametrize("name", ["resnet", pytest.param("bert", marks=pytest.mark.slow),
                                  pytest.param("llama", marks=pytest.mark.slow)])
def test_persistent_runs_equal_eager(name, tmp_path):
    model, (inputs,) = zoo.build(name, "tiny")
    compiled = tilefuse.compile(model, inputs, target="cpu", time_limit=1.0, persistent=True)
    runs = compiled.report.persistent
    assert runs and all(len(r["kernels"]) >= 2 for r in runs), runs
    assert sum(len(r["kernels"]) for r in runs) > len(compiled.kernels) // 2
    with torch.no_grad():
        torch.testing.assert_close(_outputs(compiled(*inputs)), _outputs(model(*inputs)), rtol=1e-4, atol=1e-4)
    # a saved model keeps its persistent kernels
    loaded = tilefuse.load(compiled.save(tmp_path / "m.tfz"))
    assert loaded.persistent == compiled.persistent and loaded.program._persistent
    with torch.no_grad():
        torch.testing.assert_close(_outputs(loaded(*inputs)), _outputs(model(*inputs)), rtol=1e-4, atol=1e-4)


def test_an_h100_plans_persistent_kernels_run_emulated_and_compile_for_sm90_without_spills(tmp_path, monkeypatch):
    from tilefuse.codegen.triton.native import compile_native_persistent
    from tilefuse.report.gantt import timeline
    model, (inputs,) = zoo.build("gpt2", "tiny")
    # (without the latency floor: with it, no kernel of this plan is re-tiled as a phase, below)
    compiled = tilefuse.compile(model, inputs, target=unfloored(), time_limit=1.0, persistent="auto")
    rows = compiled.report.persistent
    # one program an SM (``PER_SM``: two measured slower on the H200, tasks doubled up on SMs)
    assert rows and all(r["programs"] == 132 and r["per_sm"] == 1 and r["maxnreg"] is None for r in rows), rows
    # "auto": a run is one launch where its simulated schedule models faster than its kernels apart
    assert all(r["launched_as_one"] == (r["persistent_us"] < r["apart_us"]) for r in rows), rows
    assert [(r["first"], r["first"] + len(r["kernels"])) for r in rows if r["launched_as_one"]] == list(compiled.persistent)
    assert compiled.persistent, rows          # (launch-bound tiny kernels: one launch saves the others)
    # some of its phases wait for the tasks whose tiles they read, not for whole phases
    assert any(e["kind"] == "tile" for r in rows if r["launched_as_one"] for e in r["edges"]), rows
    saved = sum(r["apart_us"] - r["persistent_us"] for r in rows if r["launched_as_one"])
    assert compiled.report.est_total_us == pytest.approx(compiled.plan.cost * 1e6 - saved, abs=1e-2)
    with torch.no_grad():
        torch.testing.assert_close(_outputs(compiled.emulate(*inputs)), _outputs(model(*inputs)), rtol=1e-4, atol=1e-4)
    # kernels re-tiled for being phases (``as_phases``: no launch to pay) where that models faster,
    # only inside the runs taken; the report describes the schedule that runs
    plain = tilefuse.compile(model, inputs, target=unfloored(), time_limit=1.0)
    moved = [k for k, (a, b) in enumerate(zip(plain.plan.kernels, compiled.plan.kernels))
             if a.schedule.key() != b.schedule.key()]
    assert moved and all(any(i <= k < j for i, j in compiled.persistent) for k in moved), moved
    assert all(compiled.report.kernels[k].schedule == compiled.plan.kernels[k].schedule.key() for k in moved)
    # the report's page draws each persistent kernel's simulated schedule: its tasks per SM, the
    # makespan the row's modelled time has (one launch besides)
    launch_us = compiled.target.launch(False) * 1e6
    page = compiled.report.to_html(tmp_path / "r.html").read_text()
    assert '<section id="persistent-section">' in page
    assert page.count('<svg class="gantt"') == len(compiled.persistent)
    for r in rows:
        tasks = timeline(r)
        assert len(tasks) == r["tasks"] and {t.worker for t in tasks} <= set(range(r["programs"]))
        assert all(a.phase <= b.phase for a, b in zip(tasks, tasks[1:]))             # taken in order
        assert max(t.end for t in tasks) * 1e6 + launch_us == pytest.approx(r["persistent_us"], abs=0.01)
        kinds = [e["kind"] for e in r["edges"]]
        assert kinds.count("phase barrier") == sum(len(p["after"]) for p in r["phases"])
        assert kinds.count("tile") == sum(len({_phase_of(r, u) for runs in p.get("needs", ()) for a, b in runs
                                               for u in range(a, b + 1)}) for p in r["phases"])
    for i, j in compiled.persistent:
        tiles, reads, writes, scratch = run_phases(compiled.kernels, i, j)
        binary = compile_native_persistent(f"persistent_{i}", tiles, reads, writes,
                                           {**compiled.primgraph.types, **scratch}, 90)
        assert not binary.spills and binary.shared_bytes <= compiled.target.smem_per_block, (i, j, binary)
    # traced (a GPU's measurement of the schedule, runtime/trace.py): the clock readings compile
    # for sm_90 beside the phases; a trace equal to the simulated schedule compares as equal
    from tilefuse.codegen.triton.persistent import persistent_module
    from tilefuse.errors import TargetAbsentError
    from tilefuse.runtime.trace import compare
    i, j = compiled.persistent[0]
    tiles, reads, writes, scratch = run_phases(compiled.kernels, i, j)
    traced = persistent_module("pk", tiles, reads, writes, trace=True)[0]
    assert traced.count("= tf_clock(t)") == 3 * len(tiles) and traced.count("tl.store(tf_trace") == 4 * len(tiles)
    binary = compile_native_persistent("traced", tiles, reads, writes, {**compiled.primgraph.types, **scratch}, 90,
                                       trace=True)
    assert not binary.spills, binary
    row = next(r for r in rows if r["first"] == i)
    sim = timeline(row)
    raw = [[1000 + round(t.start * 1e9), 1000 + round(t.start * 1e9), 1000 + round(t.end * 1e9), t.worker]
           for t in sorted(sim, key=lambda t: (t.phase, t.start))]
    same = compare(row, raw)
    assert same["measured_over_modelled"] == pytest.approx(1.0, abs=1e-3) and same["tasks"] == row["tasks"]
    assert all(ph["measured"]["end_us"] == pytest.approx(ph["modelled"]["end_us"], abs=1e-3) for ph in same["phases"])
    slow = compare(row, [[2 * a - 1000, 2 * b - 1000, 2 * c - 1000, s] for a, b, c, s in raw])   # at half speed
    assert slow["measured_over_modelled"] == pytest.approx(2.0, rel=0.02)
    with pytest.raises(TargetAbsentError):
        compiled.trace_persistent(*inputs)
    # the weights' L2 prefetches (the tiny model's are under the size worth one: asked for here)
    # are in the binary, one per line a thread asks for; the interpreter's source has none
    from tilefuse.codegen.triton import persistent as pk
    monkeypatch.setattr(pk, "PREFETCH_MIN_BYTES", 0)
    i, j = compiled.persistent[0]
    tiles, reads, writes, scratch = run_phases(compiled.kernels, i, j)
    assert any(pk.prefetches(tiles, reads, writes))
    binary = compile_native_persistent("prefetching", tiles, reads, writes, {**compiled.primgraph.types, **scratch}, 90)
    assert binary.prefetches > 0 and not binary.spills, binary
    assert "prefetch.global.L2" in pk.persistent_module("pk", tiles, reads, writes)[0]
    # a tile wait spins on a scalar: Triton 3.6 (the GPU machine's) cannot compile a while loop
    # carrying the block of flags (bench/README.md, the second GPU session), 3.9 compiles both
    waiting = next(pk.persistent_module("pk", *run_phases(compiled.kernels, i, j)[:3])[0]
                   for i, j in compiled.persistent
                   if any(e["kind"] == "tile" for r in rows if r["first"] == i for e in r["edges"]))
    assert "while done == 0:" in waiting and "while tl.min(" not in waiting
    assert "prefetch.global.L2" not in pk.persistent_module("pk", tiles, reads, writes, prefetch=False)[0]


def _phase_of(row: dict, task: int) -> int:
    """The phase of a persistent row's task (its index in run order)."""
    for p, ph in enumerate(row["phases"]):
        if task < ph["tasks"]:
            return p
        task -= ph["tasks"]
    raise IndexError(task)


class _Gated(torch.nn.Module):
    """A softmax over the sequence (no projection's prologue: not a reduction per row of its
    operand), two projections of its output (merged into one matmul: on h100 a cuBLAS call) and
    a gated projection of theirs."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 64, bias=False), torch.nn.Linear(32, 64, bias=False)
        self.out = torch.nn.Linear(64, 32, bias=False)

    def forward(self, x):
        h = torch.softmax(x, dim=1)
        return x + self.out(torch.nn.functional.silu(self.a(h)) * self.b(h))


def test_a_library_call_between_generated_kernels_becomes_a_phase_where_that_pays():
    """``with_phases``: the cuBLAS call between two generated kernels is replaced by its group's
    generated kernel when the one launch it makes possible models faster; ``settle`` makes it a
    call again where no run took it."""
    from tilefuse.orchestrate.persistence import settle
    torch.manual_seed(0)
    model, x = _Gated().eval().half(), torch.randn(1, 8, 32).half()
    plain = tilefuse.compile(model, (x,), target=unfloored(), time_limit=10.0)       # (no candidate cut by time)
    compiled = tilefuse.compile(model, (x,), target=unfloored(), time_limit=10.0, persistent="auto")
    assert [b.family for b in plain.kernels] == ["fused", "library", "chain"]
    assert [b.family for b in compiled.kernels] == ["fused", "gemm", "chain"] and compiled.persistent == ((0, 3),)
    row = compiled.report.persistent[0]
    assert row["persistent_us"] < row["apart_us"]
    with torch.no_grad():
        torch.testing.assert_close(compiled.emulate(x), model(x), rtol=1e-2, atol=1e-2)
    again, built = settle(plain.plan, compiled.plan, compiled.kernels, [], compiled.primgraph.prims)
    assert [b.family for b in built] == ["fused", "library", "chain"]
    assert [b.name for b in built] == [b.name for b in plain.kernels]
    assert again.kernels[1].schedule is plain.plan.kernels[1].schedule


def test_a_call_left_between_built_runs_joins_them_where_the_run_then_simulates_faster(monkeypatch):
    """``persistence._joined``: a call that ``with_phases`` left between generated kernels (it
    judges without the prefetches the built kernels make; switched off here, so the call reaches
    the built plan) is replaced by its group's generated kernel, built, where the one run it then
    joins simulates faster; the run equals eager through the interpreter."""
    import tilefuse.api as api
    monkeypatch.setattr(api, "with_phases", lambda plan, *rest: plan)
    torch.manual_seed(0)
    model, x = _Gated().eval().half(), torch.randn(1, 8, 32).half()
    compiled = tilefuse.compile(model, (x,), target=unfloored(), time_limit=10.0, persistent="auto")
    assert [b.family for b in compiled.kernels] == ["fused", "gemm", "chain"] and compiled.persistent == ((0, 3),)
    assert compiled.plan.kernels[1].schedule.family == "gemm" and compiled.kernels[1].name.startswith("gemm_")
    assert [k.name for k in compiled.report.kernels] == [b.name for b in compiled.kernels]   # the names that run
    row = compiled.report.persistent[0]
    assert row["launched_as_one"] and row["persistent_us"] < row["apart_us"]
    with torch.no_grad():
        torch.testing.assert_close(compiled.emulate(x), model(x), rtol=1e-2, atol=1e-2)


class _DecodeLike(torch.nn.Module):
    """One token through RMS-normed projections (a decode step's shape, no attention): GEMVs whose
    weights (2-3 MB) the persistent kernel prefetches while the phases before them run."""

    def __init__(self, d=1024, f=1408):
        super().__init__()
        self.w = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(d)) for _ in range(3)])
        self.qkv, self.o = torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, d, bias=False)
        self.up, self.down, self.head = (torch.nn.Linear(d, f, bias=False), torch.nn.Linear(f, d, bias=False),
                                         torch.nn.Linear(d, d, bias=False))

    def norm(self, x, k):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w[k]

    def forward(self, x):
        h = x + self.o(torch.tanh(self.qkv(self.norm(x, 0))))
        h = h + self.down(torch.nn.functional.silu(self.up(self.norm(h, 1))))
        return self.head(self.norm(h, 2))


def _decode_like(monkeypatch):
    """(the h100 plan of ``_DecodeLike``, persistent "auto"; the model; its input; per run
    ``_warm_tiles`` took: its simulated time before and after, (kernel, programs before, after)
    of each kernel it re-tiled)."""
    from gemm_eval import fresh_rankings
    from tilefuse.families import gemm
    from tilefuse.orchestrate import persistence
    # the GEMVs' tie-break towards the SM count (``gemm._spread``) already plans the programs the
    # prefetched phases want; without it the DRAM-bound tiles tie at fewer programs, for
    # ``_warm_tiles`` to re-tile
    monkeypatch.setattr(gemm, "_spread", lambda *a: 0)
    fresh_rankings(monkeypatch)
    torch.manual_seed(0)
    model, x = _DecodeLike().eval().half(), torch.randn(1, 1024).half()
    seen = []
    warm = persistence._warm_tiles

    def spy(plan, kernels, i, j, run, *rest):
        out = warm(plan, kernels, i, j, run, *rest)
        seen.append((run[4], out[2][4], [(k, plan.kernels[k].schedule.work.programs, out[0].kernels[k].schedule.work.programs)
                                          for k in range(i, j) if out[0].kernels[k] is not plan.kernels[k]]))
        return out
    monkeypatch.setattr(persistence, "_warm_tiles", spy)
    compiled = tilefuse.compile(model, (x,), target="h100", time_limit=2.0, persistent="auto")
    return compiled, model, x, seen


def test_a_prefetched_phase_is_re_tiled_where_the_whole_run_then_simulates_faster(monkeypatch):
    """``_warm_tiles``: a GEMV whose weights earlier phases prefetch draws them from L2, so more
    programs than its kernel launched alone (bound by DRAM) make the persistent kernel faster in
    the simulation with its prefetches; the plan, the kernels and the report have the re-tiled
    schedule (the run against eager: the next test)."""
    compiled, _, _, seen = _decode_like(monkeypatch)
    assert compiled.persistent == ((0, len(compiled.kernels)),) and len(seen) == 1
    before, after, moved = seen[0]
    assert after < before and moved and all(now > was for _, was, now in moved), seen
    row = compiled.report.persistent[0]
    assert row["persistent_us"] == pytest.approx(after * 1e6, abs=1e-3)
    for k, _, now in moved:
        assert compiled.plan.kernels[k].schedule.work.programs == now
        assert compiled.report.kernels[k].schedule == compiled.plan.kernels[k].schedule.key()
        tiles, _, _, _ = run_phases(compiled.kernels, k, k + 1)
        assert math.prod(tiles[0].grid) == now and row["phases"][k]["tasks"] == now
        assert row["phases"][k].get("fetched_bytes", 0) > 0      # its weights were prefetched


@pytest.mark.slow          # (13 s in the interpreter: hundreds of programs of 2048-wide GEMVs)
def test_a_run_with_re_tiled_prefetched_phases_equals_eager(monkeypatch):
    compiled, model, x, seen = _decode_like(monkeypatch)
    assert seen[0][2]
    with torch.no_grad():
        torch.testing.assert_close(compiled.emulate(x), model(x), rtol=2e-2, atol=2e-2)


class _Mlp(torch.nn.Module):
    """A pre-norm MLP and a projection of its ReLU'd output: on h100 a GEMM with the LayerNorm and
    GELU, then a GEMM chain (the down projection, residual, ReLU, projection) whose 16 rows leave
    SMs idle: its intermediate columns split across programs, the last of a row tile's summing
    the splits."""

    def __init__(self, d=256, f=1024):
        super().__init__()
        self.norm, self.up, self.down, self.out = (torch.nn.LayerNorm(d), torch.nn.Linear(d, f), torch.nn.Linear(f, d),
                                                   torch.nn.Linear(d, d))

    def forward(self, x):
        h = x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))
        return self.out(torch.relu(h))


def test_a_split_gemm_chain_is_a_phase_of_a_persistent_kernel():
    """The chain's splits combined in its own launch: one phase whose last program per row tile
    reads the splits' shares back (its own workspace, past L1) and combines them; the run equals
    eager through the interpreter, twice (the counters are back at zero)."""
    torch.manual_seed(0)
    model, x = _Mlp().eval().half(), torch.randn(16, 256).half()
    compiled = tilefuse.compile(model, (x,), target=unfloored(), time_limit=2.0, persistent=True)
    chain = next(b for b in compiled.kernels if b.family == "chain")
    tile = compiled.plan.kernels[compiled.kernels.index(chain)].schedule.tile
    assert tile.split > 1 and tile.in_launch
    assert [k.name for k in chain.kernels] == [chain.name] and [s.zeroed for s in chain.scratch] == [False, True]
    assert compiled.persistent == ((0, len(compiled.kernels)),)
    tiles, reads, writes, _ = run_phases(compiled.kernels, 0, len(compiled.kernels))
    k = [t.name for t in tiles].index(chain.name)
    assert reads[k][-1] == writes[k][-2] and writes[k][-2].startswith("scratch:")
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(compiled.emulate(x), model(x), rtol=2e-2, atol=2e-2)


class _SplitK(torch.nn.Module):
    """A softmax over the batch (a plain kernel: not a reduction per row of the projection's
    operand), a long-K projection with a LayerNorm, also an output (h100: split-K, its partial
    products and their reduction two kernels sharing a workspace), a projection with a LayerNorm
    over its row (a two-phase epilogue: programs that arrive on a counter, the last one finishing
    the row from a workspace; a softmax there, its exponentials on the SFU in a few programs'
    tails, is a kernel of its own since they are costed at the SFU's rate)."""

    def __init__(self):
        super().__init__()
        self.down, self.norm, self.up = torch.nn.Linear(4096, 128), torch.nn.LayerNorm(128), torch.nn.Linear(128, 4096)
        self.out = torch.nn.LayerNorm(4096)

    def forward(self, x):
        h = self.norm(self.down(torch.softmax(x, 0)))
        return self.out(self.up(h)), h


def test_kernels_with_scratch_are_phases_split_k_and_two_phase_epilogues():
    from tilefuse.codegen.triton.native import compile_native_persistent
    torch.manual_seed(0)
    model, x = _SplitK().eval().half(), torch.randn(4, 4096).half()
    compiled = tilefuse.compile(model, (x,), target="h100", time_limit=1.0, persistent=True)
    shapes = [(len(b.kernels), len(b.scratch)) for b in compiled.kernels]
    assert shapes == [(1, 0), (2, 1), (1, 2)], shapes     # plain, split-K, arriving (workspace + counters)
    assert compiled.persistent == ((0, 3),)
    tiles, reads, writes, scratch = run_phases(compiled.kernels, 0, 3)
    # the simulated schedule has the tasks the persistent kernel runs: each phase's programs
    assert [p["tasks"] for p in compiled.report.persistent[0]["phases"]] == [math.prod(t.grid) for t in tiles]
    for tile, ins, outs in zip(tiles, reads, writes):           # the declared wiring fits each kernel
        types = {**compiled.primgraph.types, **scratch}
        assert [types[n] for n in ins] == list(tile.inputs) and [types[n] for n in outs] == list(tile.outputs)
    # split-K's partials: written by phase 1, read back by phase 2 (past L1); the arriving kernel
    # reads its own workspace back
    assert writes[1] == ["scratch:1:0"] and "scratch:1:0" in reads[2] and "scratch:2:0" in reads[3]
    with torch.no_grad():
        want = model(x)
        for _ in range(2):                                          # counters left at zero
            y, h = compiled.emulate(x)
            torch.testing.assert_close(y, want[0], rtol=1e-2, atol=2e-2)
            torch.testing.assert_close(h, want[1], rtol=1e-2, atol=1e-2)     # fp16 values near 1
    binary = compile_native_persistent("persistent_0", tiles, reads, writes, {**compiled.primgraph.types, **scratch}, 90)
    assert not binary.spills and binary.mma != "none" and binary.shared_bytes <= 227 * 1024, binary


def test_runs_stop_at_what_cannot_be_a_phase_and_where_a_collective_is_waited_for():
    from types import SimpleNamespace

    from tilefuse.runtime.executor import persistent_runs

    from tilefuse.families.base import Built

    def kernel(language="triton", scratch=(), parts=1, wired=False, empty=False, start=None):
        k = SimpleNamespace(empty=empty)
        wiring = ((("x",), ("y",)),) * parts if wired else ()
        return Built("k", "f", ("x",), ("y",), None, "", language, scratch, (k,) * parts, start=start, wiring=wiring)
    ks = [kernel(), kernel(), kernel("torch"), kernel(), kernel(), kernel(), kernel(scratch=("w",)), kernel(),
          kernel(parts=2), kernel(), kernel(), kernel(parts=2, scratch=("w",), wired=True), kernel(empty=True),
          kernel(), kernel(start=print), kernel()]
    # undeclared scratch, two kernels unwired, an empty kernel, a collective: each ends a run
    assert persistent_runs(ks) == [(0, 2), (3, 6), (9, 12)]
    assert persistent_runs(ks, breaks={4}) == [(0, 2), (4, 6), (9, 12)]


def test_a_phase_waits_for_the_phases_it_depends_on_and_counts_itself_done():
    """The driver's structure, which the deadlock argument rests on: tasks taken in order from one
    counter; a phase waits (acquire) for the task count of each earlier phase it depends on
    (``task_dependencies``); each task counted done (release) after a CTA barrier; loads of what an
    earlier phase wrote bypass L1; and no two tensors the run touches share arena bytes (phases
    that do not depend on each other may run at once)."""
    from tilefuse.codegen.dependencies import task_dependencies
    from tilefuse.codegen.triton.persistent import persistent_module
    from tilefuse.runtime.memory import plan_memory
    model, (inputs,) = zoo.build("bert", "tiny")
    compiled = tilefuse.compile(model, inputs, target="cpu", time_limit=1.0, persistent=True)
    i, j = max(compiled.persistent, key=lambda r: r[1] - r[0])
    steps = compiled.kernels[i:j]
    tiles, reads, writes, _ = run_phases(compiled.kernels, i, j)
    source, _, table = persistent_module("pk", tiles, reads, writes)
    driver = source.split("def pk(")[1]
    tasks = [int(torch.tensor(b.kernels[0].grid).prod()) for b in steps]
    waits = task_dependencies(tiles, reads, writes)
    after, tiled = waits.after, [p for p, m in enumerate(waits.tiles) if m]
    flagged = {d for m in waits.tiles for d in m}
    assert after[0] == () and all(a or waits.tiles[p] for p, a in enumerate(after) if p)
    assert driver.count("tl.atomic_add(tf_counters, 1, sem=\"relaxed\")") == 2      # a ticket orders nothing
    for p, a in enumerate(after):
        for d in a:      # spins on acquire loads (no read-modify-write queue at L2, no RMW after)
            assert f"while tf_acquire(tf_counters + {d + 1}) < {tasks[d]}:" in driver
    # a phase waiting for some tasks of an earlier one spins on their flags' acquire loads
    assert driver.count("tf_acquire(") == sum(map(len, after)) + 2 * len(tiled)
    assert "sem=\"acquire\"" not in driver and "volatile=True" not in driver
    import triton.language as tl    # Triton 3.9's acquire load; PTX's ld.acquire on 3.6
    assert ('tl.atomic_load(ptr, sem="acquire")' if hasattr(tl, "atomic_load") else "ld.acquire.gpu") in \
        source.split("def tf_acquire(ptr):")[1].split("\n")[1]
    assert (table is None) == (not tiled)
    assert driver.count("sem=\"release\")") == len(steps) + len(flagged)
    assert driver.count("tl.debug_barrier()") == len(steps)
    touched = {n for k in range(i, j) for n in (*compiled.kernels[k].inputs, *compiled.kernels[k].outputs)}

    def shared(memory):
        spans = sorted((memory.offsets[n], memory.offsets[n] + compiled.primgraph.types[n].nbytes)
                       for n in touched if n in memory.offsets)
        return any(b[0] < a[1] for a, b in zip(spans, spans[1:]))
    assert not shared(compiled.program.memory)
    assert shared(plan_memory(compiled.plan, compiled.primgraph, compiled.kernels))     # reused without runs
    assert 'cache_modifier=".cg"' in source
    # each phase is a function of its own (its registers and shared memory not added to the
    # others'), its loops pipelined as deep as its own kernel's
    for b in steps:
        assert f"@triton.jit(noinline=True)\ndef {b.kernels[0].name}_phase(" in source
    assert not re.search(r"(?<![\w.])range\(", source)
    for b in steps:
        body = source.split(f"def {b.kernels[0].name}_phase(")[1].split("\n\n\n")[0]
        assert set(re.findall(r"num_stages=(\d+)\)", body)) <= {str(b.kernels[0].num_stages)}


def test_the_simulated_schedule():
    """Equal tasks fill the workers in waves; a phase starts after the whole phase before it;
    each task pays the queue's atomic, a waiting one the acquire that sees the barrier open, and
    its count of done (posted: its worker goes on) reaches L2 half a round trip after it ends."""
    from tilefuse.cost.persistent import Phase, simulate
    assert simulate([Phase(10, 1.0)], 4, 0.0) == 3.0                     # ceil(10 / 4) waves
    assert simulate([Phase(4, 1.0), Phase(4, 2.0)], 4, 0.0) == 3.0        # barrier: 1, then 2
    assert simulate([Phase(3, 1.0), Phase(1, 1.0)], 4, 0.0) == 2.0        # a free worker still waits
    assert simulate([Phase(1, 1.0), Phase(1, 1.0)], 1, 0.1) == pytest.approx(2.25)   # 0.1 + 1, 0.1 + 1, 0.05
    assert simulate([Phase(1, 1.0), Phase(1, 1.0)], 2, 0.1) == pytest.approx(2.3)    # 1.15 seen, + 0.1 + 1 + 0.05
    # phases that wait only for the first run side by side; a phase waiting for none starts at once
    assert simulate([Phase(4, 1.0), Phase(4, 1.0, after=(0,)), Phase(4, 1.0, after=(0,))], 8, 0.0) == 2.0
    assert simulate([Phase(4, 1.0), Phase(4, 1.0), Phase(4, 1.0)], 8, 0.0) == 3.0
    assert simulate([Phase(4, 1.0), Phase(4, 1.0, after=())], 8, 0.0) == 1.0


def test_the_simulated_dram_queue_and_prefetches():
    """With a DRAM rate: a task ends no earlier than the queue has delivered its bytes, the run no
    earlier than all of them; the bytes a phase prefetched for a later one are the first of that
    one's, read in equal slices in task order: a task whose slice was prefetched runs at its warm
    time and ends no earlier than its slice arrived, one whose slice was not reads it itself (its
    cold time), one half prefetched in between."""
    from dataclasses import replace
    from tilefuse.cost.persistent import Phase, schedule, simulate
    rate = 1e3                                                           # bytes per second
    assert simulate([Phase(2, 0.1, dram_bytes=2000)], 2, 0.0, rate) == pytest.approx(2.0)
    assert simulate([Phase(2, 0.1, dram_bytes=2000)], 2, 0.0) == pytest.approx(0.1)     # no rate: none
    cold = Phase(1, 5.0, warm_s=1.0, dram_bytes=500, fetched_bytes=500)
    early = Phase(1, 1.0, prefetch_bytes=500, prefetch_for=((1, 500),))  # 0.5 s of DRAM, asked at once
    assert simulate([early, cold], 1, 0.0, rate) == pytest.approx(2.0)   # 1 s, then warm: 1 s
    assert simulate([early, cold], 1, 0.0) == pytest.approx(6.0)         # not modelled: cold
    late = Phase(1, 1.0, prefetch_bytes=3000, prefetch_for=((1, 3000),))     # one ask: in L2 at 3 s
    assert simulate([late, cold], 1, 0.0, rate) == pytest.approx(3.0)    # warm from 1, waits for it
    slow = Phase(1, 1.0, prefetch_bytes=9000, prefetch_for=((1, 9000),))     # arrives at 9 s
    heavy = Phase(1, 12.0, warm_s=1.0, dram_bytes=9000, fetched_bytes=9000)
    assert simulate([slow, heavy], 1, 0.0, rate) == pytest.approx(9.0)   # 9 < 1 + 12
    # half of a phase's bytes prefetched: its first task's slice (warm, ends at 2), not its
    # second's (cold: 1 + 4; its own 1000 bytes in 1 s meanwhile); half of the first of 3 slices
    # asked for: the first task halfway from cold to warm
    ask = Phase(1, 1.0, prefetch_bytes=1000, prefetch_for=((1, 1000),))
    half = Phase(2, 4.0, warm_s=1.0, dram_bytes=2000, fetched_bytes=1000)
    assert [t.end for t in schedule([ask, half], 2, 0.0, rate)][1:] == pytest.approx([2.0, 5.0])
    third = replace(half, tasks=3, dram_bytes=3000, fetched_bytes=500)
    ends = [t.end for t in schedule([replace(ask, prefetch_bytes=500, prefetch_for=((1, 500),)), third],
                                    3, 0.0, rate)][1:]
    assert ends[0] == pytest.approx(1.0 + 4.0 - 3.0 * 0.5) and ends[1:] == pytest.approx([5.0, 5.0])
    # task i asks for the i-th share of the stream: phase 1's 500 bytes are the first task's
    # (in L2 at 0.5 s), phase 2's the second's (at 1.0 s), not half of each by each task
    two = Phase(2, 0.1, prefetch_bytes=1000, prefetch_for=((1, 500), (2, 500)))
    near = far = Phase(1, 2.0, warm_s=0.2, dram_bytes=500, fetched_bytes=500, after=())
    ends = [t.end for t in schedule([two, near, far], 4, 0.0, rate)]
    assert ends[2:] == pytest.approx([0.5, 1.0])
    # a task's own bytes go ahead of prefetches asked for before it: it is not held up by them
    reads = Phase(1, 0.5, dram_bytes=500, prefetch_bytes=4000, prefetch_for=((1, 4000),))
    assert max(t.end for t in schedule([reads], 1, 0.0, rate)) == pytest.approx(0.5)


def test_each_task_prefetches_its_share_of_the_stream_in_order(tmp_path):
    """The prefetch helper of a persistent kernel (its address arithmetic run in the interpreter,
    the PTX prefetch swapped for a store of the asking task): task ``i`` asks for the lines of the
    ``i``-th share of the phase's part of the stream, across tensors, each line once."""
    import importlib.util
    import re

    import torch
    from tilefuse.codegen.triton import persistent as pk
    from tilefuse.codegen.triton.interpreter import interpreting
    asks = [pk.Prefetch("a", 10, 200, 4, 1), pk.Prefetch("b", 0, 300, 4, 2)]    # 800 + 1200 bytes
    share = pk.prefetch_share(asks, 3)
    assert share == 768 and pk.prefetch_share(asks, 1) == 2048          # whole lines: 6, 16
    helper, swapped = re.subn(r"tl\.inline_asm_elementwise\(\"prefetch\.global\.L2 \[\$1\];.*?pack=1\)",
                              "tl.store(ptr + at, task + 1 + 0 * at)", pk._PREFETCH_SOURCE, flags=re.S)
    assert swapped == 1
    calls = "\n".join(f"    {pk.PREFETCH_FN}({f.tensor}, {f.first}, {f.numel}, {at}, t, {share}, 4, 32, 128)"
                      for f, at in zip(asks, (0, 800)))
    path = tmp_path / "prefetch_probe.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + helper + "\n\n\n@triton.jit\n"
                    "def probe(a, b):\n    t = tl.program_id(0)\n" + calls + "\n")
    a, b = torch.zeros(256, dtype=torch.int32), torch.zeros(320, dtype=torch.int32)
    with interpreting():                # (its functions made for the interpreter: loaded inside)
        spec = importlib.util.spec_from_file_location("prefetch_probe", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.probe[(3,)](a, b)
    asked = [(n, i, int(v)) for n, x in (("a", a), ("b", b)) for i, v in enumerate(x.tolist()) if v]
    assert asked == [("a", 10 + 32 * k, 1) for k in range(6)] + [("a", 202, 2)] + \
        [("b", 32 * k, 2) for k in range(6)] + [("b", 184 + 32 * k, 3) for k in range(4)]


def test_phases_wait_for_the_phases_whose_tensors_they_touch():
    """``task_dependencies`` by name (no kernels: every edge a barrier): a phase waits for the
    earlier phases that write what it reads or writes or read what it writes, less those implied
    by another it waits for."""
    from tilefuse.codegen.dependencies import task_dependencies
    reads = [["x", "w0"], ["a", "w1"], ["a"], ["b", "c"], ["x"], ["d"], ["e"]]
    writes = [["a"], ["b"], ["c"], ["d"], ["e"], ["a"], ["f"]]
    # 1 and 2 both read a (from 0): side by side; 4 touches nothing written before it; 5 rewrites
    # a (which 0 wrote, 1 and 2 read) and reads d: waiting for 3 implies the rest
    waits = task_dependencies(None, reads, writes)      # by name alone: every edge a barrier
    assert waits.after == ((), (0,), (0,), (1, 2), (), (3,), (4,)) and not any(waits.tiles)


def test_the_weights_stream_is_prefetched_a_window_ahead_within_the_l2s_reach():
    """``prefetches``: the tensors no phase writes, at the phase first reading them (not the
    first), in order, each byte asked for once, at most a window ahead of what the phases so far
    read, none across a phase reading more than the reach, none of a tensor a phase gathers from."""
    from types import SimpleNamespace
    from tilefuse.codegen.kernel import Store
    from tilefuse.codegen.triton import persistent as pk
    from tilefuse.ir.dtypes import DType, TensorType
    from tilefuse.ir.expr import Load, Var
    MB = 1 << 20

    def k(*nbytes, streamed=frozenset(), body=()):
        return SimpleNamespace(inputs=tuple(TensorType((n // 2,), DType.float16) for n in nbytes), streamed=streamed,
                               body=body, outputs=(TensorType((512,), DType.float16),))
    kernels = [k(1024, MB), k(1024, 4 * MB), k(1024, 6 * MB), k(1024, 40 * MB), k(1024, 2 * MB), k(1024, 1024)]
    reads = [["x", "w0"], ["a", "w1"], ["b", "w2"], ["c", "big"], ["d", "w4"], ["e", "small"]]
    writes = [["a"], ["b"], ["c"], ["d"], ["e"], ["f"]]
    asks = pk.prefetches(kernels, reads, writes)
    got = [[(f.tensor, f.first * 2 // MB, f.nbytes // MB, f.phase) for f in mine] for mine in asks]
    assert pk.PREFETCH_WINDOW == 16 * MB and pk.PREFETCH_REACH == 24 * MB
    assert got == [
        [("w1", 0, 4, 1), ("w2", 0, 6, 2), ("big", 0, 6, 3)],     # 16 MB ahead of nothing read yet
        [("big", 6, 4, 3)],                                         # w1 read: 4 MB more
        [("big", 10, 6, 3)],                                        # w2 read: up to 16 MB past it
        [], [], []]                                 # w4 is behind 40 MB of reads: never asked for
    assert sum(map(len, asks)) == 5 and all(f.phase > p for p, mine in enumerate(asks) for f in mine)
    # streamed evict-first (a GEMV's weights), the 40 MB push nothing out of L2: w4 is asked for
    kernels[3] = k(1024, 40 * MB, streamed=frozenset({1}))
    asks = pk.prefetches(kernels, reads, writes)
    assert [(f.tensor, f.nbytes // MB, f.phase) for f in asks[3]] == [("w4", 2, 4)]
    # a 40 MB table the phase picks rows from (an embedding): not prefetched, and what it keeps
    # in L2 is the rows it picks (at most what it writes), so w4 is in the first window
    x = Var("x")
    rows = (Store(0, (x,), Load(1, (Load(0, (x,), DType.int64),), DType.float16)),)
    kernels[3] = k(1024, 40 * MB, body=rows)
    assert pk.gathers(kernels[3]) == {1}
    asks = pk.prefetches(kernels, reads, writes)
    assert [(f.tensor, f.nbytes // MB, f.phase) for f in asks[0]] == [("w1", 4, 1), ("w2", 6, 2), ("w4", 2, 4)]
    assert sum(map(len, asks)) == 3
    # what L2 still holds of what earlier phases wrote (``resident``: read from L2 in the model):
    # a tensor read right after it is written, yes; across 40 MB of reads L2 keeps, no
    reads[5], kernels[5] = ["e", "a"], k(1024, 1024)
    kernels[3] = k(1024, 40 * MB, streamed=frozenset({1}))
    assert pk.resident(kernels, reads, writes) == [0, 1024, 1024, 1024, 1024, 2048]
    kernels[3] = k(1024, 40 * MB)
    assert pk.resident(kernels, reads, writes) == [0, 1024, 1024, 1024, 1024, 1024]
    # a tensor its writer wrote a few rows of (a cache written in place) is not in L2 whole
    assert pk.resident(kernels, reads, writes, partial={"a"}) == [0, 0, 1024, 1024, 1024, 1024]


def test_the_persistent_option_takes_false_true_or_auto():
    from tilefuse.errors import OptionError
    with pytest.raises(OptionError, match="persistent must be False, True or 'auto', got 'yes'"):
        tilefuse.compile(torch.nn.ReLU(), (torch.randn(4),), target="cpu", persistent="yes")
    with pytest.raises(OptionError, match="got 1"):          # 1 == True, but not the option's value
        tilefuse.compile_onnx(b"", target="cpu", persistent=1)


def test_a_persistent_grid_never_exceeds_what_the_launched_binary_holds():
    """Planned at two programs an SM, a persistent kernel's first launch on a GPU runs one an SM;
    the launches after it run as many as the binary that launch compiled lets be resident (a
    compiler holding more registers than the plan's binary must shrink the grid, not hang it)."""
    from tilefuse.codegen.triton.persistent import resident_grid
    assert resident_grid(264, 2, 10_000, 2) == 264
    assert resident_grid(264, 2, 10_000, 1) == 132           # the launched binary holds one
    assert resident_grid(264, 2, 10_000, 4) == 264           # never past the plan's
    assert resident_grid(264, 2, 200, 2) == 200              # nor past its tasks
    assert resident_grid(264, 2, 10_000, 0) == 132           # (one an SM whatever it says)


def test_a_compiled_model_runs_each_run_at_its_rows_programs_an_sm(monkeypatch):
    """The report's row of a run launched as one says how many programs an SM its plan runs
    (``per_sm``, from the run's sm_90 binary); the runnable program gives each kernel of the run
    that figure, and the target's occupancy rule for a launched binary.  (Planned at two an SM,
    ``PER_SM`` 2, the mechanism kept for a task order that spreads a phase over SMs first: some
    run takes two where its sm_90 binary holds two.)"""
    from tilefuse.orchestrate import persistence
    monkeypatch.setattr(persistence, "PER_SM", 2)
    model, (inputs,) = zoo.build("gpt2", "tiny")
    compiled = tilefuse.compile(model, inputs, target=unfloored(), time_limit=1.0, persistent="auto")
    grid = compiled._persistent_grid()
    rows = [r for r in compiled.report.persistent if r["launched_as_one"]]
    spans = [(r, range(r["first"], r["first"] + len(r["kernels"]))) for r in rows]
    assert rows and grid["per_sm"] == {k: r["per_sm"] for r, ks in spans for k in ks}
    assert all(r["programs"] == 132 * r["per_sm"] for r in rows) and 2 in grid["per_sm"].values(), rows
    # 200 registers and 64 KiB at 4 warps: two an SM of an H100 (25,600 registers a program);
    # 255 at 8 warps: one
    assert grid["fits"](200, 64 * 1024, 4) == 2 and grid["fits"](255, 0, 8) == 1


def test_a_run_over_the_register_budget_of_two_programs_an_sm_is_capped_to_it(monkeypatch):
    """A persistent kernel that holds one program an SM for its registers alone (BERT-base's run:
    138 registers at 8 warps) is compiled again with ptxas's cap, ``maxnreg`` 128 at 8 warps;
    where that binary neither spills nor holds fewer than two an SM, the plan runs two an SM
    under the cap (the report row's ``maxnreg``); a binary already within the budget is kept."""
    import dataclasses
    from tilefuse.cost.target import Target
    from tilefuse.native import binary_occupancy
    from tilefuse.orchestrate import persistence
    monkeypatch.setattr(persistence, "PER_SM", 2)        # (the default is one: ``PER_SM``)
    model, (inputs,) = zoo.build("gpt2", "tiny")
    tgt = Target.get("h100")
    compiled = tilefuse.compile(model, inputs, target=unfloored(), time_limit=1.0, persistent="auto")
    (i, j), *_ = compiled.persistent
    types = compiled.primgraph.types
    binary = persistence._binary(compiled.kernels, i, j, types, tgt)
    assert persistence._capped(binary, compiled.kernels, i, j, types, tgt) == (binary, None)
    # (as if it held 200 registers at 8 warps: one an SM)
    heavy = dataclasses.replace(binary, registers=200, num_warps=8)
    assert binary_occupancy(heavy, tgt) == 1
    capped, cap = persistence._capped(heavy, compiled.kernels, i, j, types, tgt)
    assert cap == 128 and capped.registers <= 128 and not capped.spills


def test_a_carried_plan_keeps_its_templates_runs_without_compiling_them_again(monkeypatch):
    """A bucket's plan carried to another size (``orchestrate/instantiate.py``) takes its template's
    persistent runs as they are: the same kernels at another size have the same tiles, so their
    binaries are not compiled and checked again for every size (seconds each on a GPU target)."""
    import time

    from tilefuse.api import _pipeline
    from tilefuse.frontend.torch import import_torch
    from tilefuse.orchestrate import persistence
    checked = []
    real = persistence._binary
    monkeypatch.setattr(persistence, "_binary", lambda *a, **k: checked.append(a[1:3]) or real(*a, **k))
    model, (inputs,) = zoo.build("gpt2", "tiny")
    imported = import_torch(model, inputs)
    first = _pipeline(imported, target="h100", backend="triton", strategy="optimal", t0=time.perf_counter(),
                      dump=None, time_limit=1.0, persistent="auto")
    assert first.persistent and checked and first.template.persistent == first.persistent
    checked.clear()
    carried = _pipeline(imported, target="h100", backend="triton", strategy="optimal", t0=time.perf_counter(),
                        dump=None, template=first.template, sizes={}, persistent="auto")
    assert carried.persistent == first.persistent and not checked


def _rows_kernel(name: str, index, value, rows: int = 64, block: int = 16, grid: bool = True):
    """A one-input, one-output kernel over ``rows`` positions: out[i] = value(in[index(i)]), in
    tiles of ``block`` across programs (``grid``) or all in one program (a loop)."""
    from tilefuse.codegen.kernel import Kernel, Store, TileAxis
    from tilefuse.ir.dtypes import DType, TensorType
    from tilefuse.ir.expr import Load, Var
    i = Var("i")
    t = TensorType((rows,), DType.float32)
    axis = TileAxis("x", (i,), (rows,), block, 0, grid=0 if grid else None, block_name="XBLOCK")
    return Kernel(name, (t,), (t,), (axis,), (Store(0, (i,), value(Load(0, (index(i),), DType.float32))),), 4, 1)


def test_tile_level_dependencies_wait_for_the_tasks_whose_tiles_they_touch():
    """``task_dependencies``: a phase reading what an earlier one wrote, tile for tile, waits for
    that tile's task alone; reading it reversed, for the mirrored tile's; reading every row (one
    program over all of them), for the whole phase (a barrier); a phase rewriting what an earlier
    one read waits for the tasks that read those rows.  The persistent kernel (its tasks' done
    flags, the table of what each waits for) equals the same kernels run one after another."""
    from tilefuse.codegen.dependencies import task_dependencies
    from tilefuse.codegen.triton.persistent import compile_persistent, needs_table
    from tilefuse.ir.expr import binary
    from tilefuse.ir.expr import Const
    from tilefuse.ir.dtypes import DType
    two = Const(2.0, DType.float32)
    same = lambda i: i  # noqa: E731
    kernels = [_rows_kernel("double", same, lambda v: binary("mul", v, two)),                 # a = 2x
               _rows_kernel("plus", same, lambda v: binary("add", v, two)),                   # b = a + 2
               _rows_kernel("mirror", lambda i: binary("sub", Const(63, i.dtype), i), same),  # c = a reversed
               _rows_kernel("all", same, same, block=64, grid=False),                         # d = c (one program)
               _rows_kernel("again", same, lambda v: binary("mul", v, v))]                    # x' = b * b: rewrites
    reads = [["x"], ["a"], ["a"], ["c"], ["b"]]                                               # ... what 0 read
    writes = [["a"], ["b"], ["c"], ["d"], ["y"]]
    waits = task_dependencies(kernels, reads, writes)
    assert waits.tiles[1] == {0: ((0,), (1,), (2,), (3,))}
    assert waits.tiles[2] == {0: ((3,), (2,), (1,), (0,))}
    assert waits.after[3] == (2,) and not waits.tiles[3]          # every row: the whole phase
    assert waits.tiles[4] == {1: ((0,), (1,), (2,), (3,))}        # y: b tile for tile
    table = needs_table(kernels, waits)
    assert table[:5] == [18, 18, 18, 18, 18] and table[4:8] == [18, 19, 20, 21]
    writes[4] = ["x"]                                             # x' rewrites x, which 0 read
    waits = task_dependencies(kernels, reads, writes)
    assert waits.tiles[4] == {0: ((0,), (1,), (2,), (3,)), 1: ((0,), (1,), (2,), (3,))}
    launch, source, params = compile_persistent("pk", kernels, reads, writes, programs=4)
    assert "tf_needs" in source and source.count('sem="release")') == len(kernels) + 2     # 0 and 1 flag tasks
    x = torch.arange(64, dtype=torch.float32)
    bufs = {n: torch.empty(64) for n in params} | {"x": x.clone()}
    launch(bufs)
    a = 2 * x
    torch.testing.assert_close(bufs["b"], a + 2)
    torch.testing.assert_close(bufs["d"], a.flip(0))
    torch.testing.assert_close(bufs["x"], (a + 2) ** 2)


def test_a_trace_needs_a_gpu_and_every_task_run():
    """Tracing reads the GPU's clock (PTX): in Triton's interpreter it is refused with the reason;
    a trace with a task never run (its clock readings zero) or out of order is refused too."""
    from tilefuse.codegen.triton.persistent import compile_persistent
    from tilefuse.runtime.trace import traced_tasks
    model, (inputs,) = zoo.build("resnet", "tiny")
    compiled = tilefuse.compile(model, inputs, target="cpu", time_limit=1.0, persistent=True)
    i, j = compiled.persistent[0]
    tiles, reads, writes, _ = run_phases(compiled.kernels, i, j)
    with pytest.raises(ValueError, match="interpreter cannot run"):
        compile_persistent("pk", tiles, reads, writes, 4, trace=True)
    with pytest.raises(ValueError, match="interpreter cannot run"):
        compiled.trace_persistent(*inputs)
    assert [t.phase for t in traced_tasks([[5, 6, 9, 0], [7, 9, 12, 1], [8, 12, 20, 0]], [2, 1])] == [0, 0, 1]
    with pytest.raises(ValueError, match="never run"):
        traced_tasks([[5, 6, 9, 0], [0, 0, 0, 0]], [2])
    with pytest.raises(ValueError, match="3 tasks"):
        traced_tasks([[5, 6, 9, 0]] * 3, [2])
