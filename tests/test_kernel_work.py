"""The cost model reads the kernel that is printed (``cost/work.py``, issue #21): every generated
family's schedule (fused, gemm, chain) has the ``Work`` of the very kernels its build prints, and a
change to a kernel's statements shows in its work."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from test_fused import H100

import tilefuse
from tilefuse.families.fused.template import fused_kernel
from tilefuse.codegen.kernel import Kernel, Reduce, Store, TileAxis
from tilefuse.cost.work import work
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.expr import Load, Value, Var

F32 = DType.float32


def _fused_schedules(model, args):
    c = tilefuse.compile(model, args, target="h100", backend="reference", time_limit=5.0)
    return [k.schedule for k in c.plan.kernels if k.schedule.family == "fused"]


class Rows(torch.nn.Module):
    def forward(self, x):                       # rows too long for one tile: looped kernels too
        y = torch.nn.functional.layer_norm(x, x.shape[-1:]).transpose(0, 1)
        return torch.softmax(y * 2, 0), torch.tanh(x).sum(0)


def test_every_fused_schedule_is_costed_from_the_kernel_it_prints():
    scheds = _fused_schedules(Rows(), (torch.randn(3, 20000),))
    assert len(scheds) >= 2 and not all(s.one_pass for s in scheds)
    for s in scheds:
        assert work(fused_kernel(s, "k"), H100) == s.work


def _row_kernel(rows: int, cols: int, block: int, reduce_twice: bool) -> Kernel:
    """out[i] = sum_j x[i, j] (and, with ``reduce_twice``, + max_j x[i, j] in a second loop)."""
    i, j = Var("i"), Var("j")
    x = Load(0, (i, j), F32)
    axes = (TileAxis("x", (i,), (rows,), 1, 0, grid=0, block_name="XBLOCK"),
            TileAxis("r", (j,), (cols,), block, 1, block_name="RBLOCK"))
    body = [Reduce(1, x, "r", "sum", F32, 0.0, F32)]
    value = Value(1, F32)
    if reduce_twice:
        body.append(Reduce(2, x, "r", "max", F32, float("-inf"), F32))
        value = value + Value(2, F32)
    body.append(Store(0, (i,), value))
    return Kernel("k", (TensorType((rows, cols), F32),), (TensorType((rows,), F32),), axes, tuple(body), 4, 1)


def test_work_follows_the_statements():
    rows, cols = 64, 4096
    row_bytes = rows * cols * 4
    one = work(_row_kernel(rows, cols, 256, False), H100)
    two = work(_row_kernel(rows, cols, 256, True), H100)
    # each looped reduction is a loop issuing its own loads of x: a second one reads x again
    assert one.requested_bytes == row_bytes + rows * 4
    assert two.requested_bytes == 2 * row_bytes + rows * 4
    assert (one.programs, one.chunks, two.chunks) == (rows, cols // 256, 2 * cols // 256)
    assert two.flops > one.flops
    # whole rows: both reductions read one tile of x, loaded once, in a single chunk
    whole = work(_row_kernel(rows, cols, 4096, True), H100)
    assert whole.requested_bytes == row_bytes + rows * 4 and whole.chunks == 1


def test_a_statement_the_walk_does_not_know_is_refused():
    k = _row_kernel(8, 8, 8, False)
    with pytest.raises(TypeError, match="str statements are not costed"):
        work(dataclasses.replace(k, body=("x",) + k.body), H100)


# ---------------------------------------------------------------- gemm and chain kernels

def _gemm(m, n, k, bm, bn, bk, stages=2, swizzle=1, dtype=DType.float16):
    """The plain GEMM of that shape as the gemm template prints it for the tile."""
    from tilefuse.families.gemm import GemmShape, GemmTile, plain_body
    from tilefuse.families.gemm.template import gemm_kernels
    (kernel,) = gemm_kernels(plain_body(GemmShape(1, m, n, k, dtype)), GemmTile(bm, bn, bk, 4, stages, swizzle), "g")
    return kernel


def test_every_gemm_and_chain_schedule_is_costed_from_the_kernels_it_prints():
    """The family's schedules of a GEMM + LayerNorm group (and its tiles in two phases and with
    split-K) and of a causal attention group: each schedule's work is ``work()`` of the kernels
    its build prints."""
    from gemm_eval import whole
    from tilefuse.families.chain.template import chain_kernel
    from tilefuse.families.chain import ChainFamily
    from tilefuse.families.gemm import GemmFamily, GemmTile, _schedule, gemm_body
    from tilefuse.families.gemm.template import gemm_kernels

    def graph(fn, *args):
        return tilefuse.compile(fn, args, target="h100", backend="reference", time_limit=5.0).primgraph

    proj, norm = torch.nn.Linear(512, 1024).half(), torch.nn.LayerNorm(1024).half()
    g = whole(graph(lambda x: norm(proj(x)), torch.randn(64, 512).half()))
    body = gemm_body(g)
    scheds = GemmFamily().schedules(g, H100)
    scheds += [_schedule(body, GemmTile(32, 64, 64, 4, 2, fixup=4), H100)]
    plain = whole(graph(lambda x: proj(x), torch.randn(64, 512).half()))
    scheds += [_schedule(gemm_body(plain), GemmTile(64, 64, 64, 4, 2, split=2), H100)]
    assert {len(s.then) for s in scheds} == {0, 1} and any(s.work.tail for s in scheds)
    for s in scheds:
        assert [work(kn, H100) for kn in gemm_kernels(s.body, s.tile, "k")] == [s.work, *s.then]
    q = torch.randn(1, 2, 64, 16).half()
    attn = whole(graph(lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True), q))
    chains = ChainFamily().schedules(attn, H100)
    assert chains and chains[0].body.causal == 0
    for s in chains:
        assert work(chain_kernel(s.body, s.tile, "k"), H100) == s.work


def test_a_dot_stages_its_looped_operands_in_shared_memory():
    """A K loop keeps ``num_stages`` operand tiles in shared memory; K in one chunk holds one;
    the product's flops are its padded tiles'."""
    looped = work(_gemm(256, 256, 1024, 64, 128, 64, stages=3), H100)
    assert looped.res.smem_bytes == 3 * (64 + 128) * 64 * 2
    assert looped.chunks >= 1024 // 64
    whole = work(_gemm(256, 256, 64, 64, 128, 64, stages=3), H100)
    assert whole.res.smem_bytes == (64 + 128) * 64 * 2
    ragged = work(_gemm(100, 256, 64, 64, 128, 64), H100)     # 2 row tiles of 64: 128 rows computed
    assert ragged.flops >= 2 * 128 * 256 * 64


def test_a_swizzled_grid_rereads_operands_less_from_dram():
    """Operands larger than half of L2: in group-M order the resident programs cover a window of
    rows and columns, so each panel comes from DRAM fewer times than in row-major order."""
    big = dict(m=8192, n=8192, k=4096, bm=128, bn=128, bk=64)
    rows = work(_gemm(**big), H100)
    grouped = work(_gemm(**big, swizzle=8), H100)
    operands = 2 * 8192 * 4096 * 2
    assert operands > H100.l2_bytes // 2
    assert operands < grouped.dram_bytes < rows.dram_bytes
    small = work(_gemm(512, 512, 512, 64, 64, 64), H100)     # fits in L2: each byte once
    assert small.dram_bytes == 2 * 512 * 512 * 2 + 512 * 512 * 2


def test_split_k_is_two_kernels_whose_partials_stay_in_l2():
    from tilefuse.families.gemm import GemmShape, GemmTile, plain_body
    from tilefuse.families.gemm.template import gemm_kernels
    body = plain_body(GemmShape(1, 64, 64, 8192, DType.float16))
    first, second = gemm_kernels(body, GemmTile(64, 64, 64, 4, 2, split=4), "g")
    assert first.workspaces == frozenset({0}) and second.transient == frozenset({len(body.inputs)})
    w1, w2 = work(first, H100), work(second, H100)
    partials = 4 * 64 * 64 * 4
    assert w1.programs == 4 and w1.l2_bytes >= partials
    assert w1.dram_bytes < 2 * 64 * 8192 * 2 + partials      # the partials are not written to DRAM
    assert w2.l2_bytes >= partials and w2.dram_bytes < partials


def test_a_load_through_a_floordiv_map_is_charged_over_programs_along_the_grid():
    """out[i] = x[(i - 1) // 2], one row a program: the first program's index leaves the tensor
    (it reads nothing), the others read a sector each.  The box of the first program does not
    stand for the others' (ViT's class token before its patches); programs spread along the grid
    do."""
    from tilefuse.ir.expr import binary
    i = Var("i")
    n = 64
    axes = (TileAxis("x", (i,), (n,), 1, 0, grid=0, block_name="XBLOCK"),)
    value = Load(0, (binary("floordiv", binary("sub", i, 1), 2),), F32)
    k = Kernel("k", (TensorType((n // 2,), F32),), (TensorType((n,), F32),), axes, (Store(0, (i,), value),), 1, 1)
    w = work(k, H100)
    loads = w.requested_bytes - n * 4
    assert 0.8 * (n - 1) * 32 <= loads <= (n - 1) * 32


def test_a_tile_box_at_an_offset():
    from tilefuse.cost.work import _box_at
    a, b = Var("a"), Var("b")
    assert _box_at((a, b), (3, 5), 5, 5) == {a: (1, 1), b: (0, 4)}
    assert _box_at((a, b), (3, 5), 2, 6) == {a: (1, 1), b: (1, 2)}
    assert _box_at((a, b), (3, 5), 5, 3) == {a: (0, 1), b: (0, 4)}     # wraps: every column


def test_scratch_is_declared_and_planned():
    """A split-K GEMM's partials are a workspace the memory planner places in the arena (live
    during their kernel only) and the program hands to the kernel; a two-phase GEMM's counters
    are zeroed once per program and left at zero by every call; both match eager torch."""
    from gemm_eval import compile_h100, whole
    from tilefuse.families.gemm import GemmFamily, GemmTile, _schedule, gemm_body
    from tilefuse.runtime.executor import Program
    from tilefuse.runtime.memory import plan_memory, scratch_names

    def program(fn, tile, *args):
        cm = compile_h100(fn, *args)
        assert len(cm.plan.kernels) == 1, [k.family for k in cm.kernels]
        pg = cm.primgraph
        built = GemmFamily().build(_schedule(gemm_body(whole(pg)), tile, H100), "g")
        memory = plan_memory(cm.plan, pg, [built])
        prog = Program(cm.plan, pg, torch.device("cpu"), [built], memory)
        return prog, built, memory, dict(zip(cm.input_names, args))

    x, w = torch.randn(16, 1024), torch.randn(1024, 32)
    prog, built, memory, feeds = program(lambda x, w: torch.relu(x @ w), GemmTile(16, 32, 64, 4, 2, split=4), x, w)
    assert [(sc.type.shape, sc.zeroed) for sc in built.scratch] == [((4, 16, 32), False)]
    assert scratch_names(0, built)[0] in memory.offsets and memory.arena_bytes >= 4 * 16 * 32 * 4
    torch.testing.assert_close(prog.run(feeds)[0], torch.relu(x @ w), rtol=1e-4, atol=1e-4)

    norm = torch.nn.LayerNorm(96)
    x, w = torch.randn(16, 32), torch.randn(32, 96)
    prog, built, memory, feeds = program(lambda x, w: norm(x @ w), GemmTile(16, 32, 32, 4, 2, fixup=4), x, w)
    assert [sc.zeroed for sc in built.scratch] == [False, True]    # the rows' workspace, the counters
    assert scratch_names(0, built)[1] not in memory.offsets        # counters: not in the shared arena
    for _ in range(2):
        with torch.no_grad():
            torch.testing.assert_close(prog.run(feeds)[0], norm(x @ w), rtol=1e-4, atol=1e-4)
        assert int(prog.scratch[0][1].abs().sum()) == 0


def test_a_result_and_a_zero_dim_input_are_different_nodes():
    """A kernel reads a 0-d input as ``Load(slot, ())`` and a statement's result as
    ``Value(slot)``: a softmax scaled by a 0-d tensor prints and runs right (interpreter, against
    eager torch), and the result has no load site the traffic model could charge."""
    from tilefuse.codegen.kernel import Reduce as ReduceStmt
    from tilefuse.cost.tiles import load_sites
    from tilefuse.ir.expr import Value, walk

    def fn(x, s):
        return torch.softmax(x, -1) * s

    x, s = torch.randn(6, 40), torch.tensor(1.5)
    c = tilefuse.compile(fn, (x, s), target="h100")
    torch.testing.assert_close(c.emulate(x, s), fn(x, s), rtol=1e-5, atol=1e-5)
    (k,) = [fused_kernel(kn.schedule, "k") for kn in c.plan.kernels if kn.schedule.family == "fused"]
    zero_d = [n for st in k.body for e in _exprs(st) for n in walk(e) if isinstance(n, Load) and not n.index]
    values = [n for st in k.body for e in _exprs(st) for n in walk(e) if isinstance(n, Value)]
    assert zero_d and values and {v.slot for v in values} <= {st.slot for st in k.body if isinstance(st, ReduceStmt)}
    assert all(site.load.tensor < len(k.inputs) for site in load_sites([e for st in k.body for e in _exprs(st)],
                                                                         len(k.inputs)))


def _exprs(st):
    if isinstance(st, Store):
        return (st.value, *st.index, *st.guards)
    if isinstance(st, Reduce):
        return (st.value,)
    return tuple(e for inner in getattr(st, "body", ()) for e in _exprs(inner))


@pytest.mark.parametrize("bad,message", [
    (lambda k, i, j: (Store(0, (i,), Value(7, F32)),), "value 7 is read before a statement defines it"),
    (lambda k, i, j: (Reduce(0, Load(0, (i, j), F32), "r", "sum", F32, 0.0, F32),), "result slot 0 is an input"),
    (lambda k, i, j: (Store(0, (i,), Load(0, (i,), F32)),), "a load of slot 0 with 1 indices is no input's"),
    (lambda k, i, j: (Reduce(1, Load(0, (i, j), F32), "q", "sum", F32, 0.0, F32),), "axis 'q' is not one of"),
    (lambda k, i, j: (Reduce(1, Load(0, (i, j), F32), "r", "sum", F32, 0.0, F32),
                      Reduce(1, Load(0, (i, j), F32), "r", "max", F32, float("-inf"), F32)), "defined twice"),
], ids=["undefined", "input-slot", "rank", "axis", "twice"])
def test_the_printer_refuses_a_kernel_whose_slots_do_not_hold_together(bad, message):
    from tilefuse.codegen.triton.emit import triton_source
    k = _row_kernel(8, 8, 8, False)
    i, j = Var("i"), Var("j")
    triton_source(k)                                   # the well-formed kernel prints
    with pytest.raises(ValueError, match=message):
        triton_source(dataclasses.replace(k, body=bad(k, i, j)))
