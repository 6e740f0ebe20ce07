"""Generated Triton kernels of the fused family, run in the interpreter, against the reference."""
import dataclasses
import random

import pytest
import torch
from fused_eval import all_values, layernorm_group, op_graph, transpose_scale_group
from test_fused import H100

from tilefuse.families.base import Group
from tilefuse.families.fused import FusedFamily
from tilefuse.fission import fission
from tilefuse.fission.registry import Fission
from tilefuse.frontend.torch import import_torch
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.expr import BINARY_OPS, COMPARE_OPS, LOGIC_OPS, UNARY_OPS, binary, cast, select, unary
from tilefuse.transform.fold import fold_constants


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path))


def emit_fused(s, name="fused_kernel"):
    """The Triton source the fused family builds for ``s``."""
    return FusedFamily().build(s, name).source


def compile_fused(s, name="fused_kernel"):
    return FusedFamily().build(s, name).run


def _schedule(group, xblock=8, rblock=32):
    scheds = FusedFamily().schedules(group, H100)
    assert scheds
    s = scheds[0]
    # the interpreter is slow: small tiles (which also exercise masks and chunked loops)
    return dataclasses.replace(s, xblock=min(s.xblock, xblock), rblock=min(s.rblock, rblock))


def _check(group, env, tol=1e-5, **tiles):
    s = _schedule(group, **tiles)
    outs = {st.tensor: torch.full(env[st.tensor].shape, float("nan")).to(env[st.tensor].dtype)
            for st in s.body.stores}   # poisoned: every element must be written
    compile_fused(s)([env[n] for n in s.body.inputs], list(outs.values()))
    assert set(outs) == set(group.outputs)
    for name, t in outs.items():
        torch.testing.assert_close(t, env[name], rtol=tol, atol=tol, equal_nan=True,
                                   msg=lambda m: f"{name}: {m}")
    return s


def _whole(pg):
    made = {p.name for p in pg.prims}
    ins = tuple(dict.fromkeys(n for p in pg.prims for n in p.inputs if n not in made))
    return Group(pg.prims, ins, pg.outputs, dict(pg.types))


def _model(fn, *inputs):
    pg = fission(import_torch(fn, inputs).graph)
    env = all_values(pg, {d.name: t for d, t in zip(pg.inputs, inputs)})
    return _whole(pg), env


@pytest.mark.parametrize("rblock", [16, 64])   # looped and persistent reductions
def test_softmax_non_power_of_two_rows(rblock):
    pg, feeds = op_graph("Softmax", [torch.randn(6, 33)], (6, 33), {"axis": -1})
    s = _check(_whole(pg), all_values(pg, feeds), xblock=4, rblock=rblock)
    assert len(s.body.instances) == 2
    # a whole row in one tile: max, sum and the output share one load of x; else a loop each
    src = emit_fused(s)
    assert ("one pass" in src.splitlines()[0]) == (rblock == 64)
    assert src.count("tl.load(") == (1 if rblock == 64 else 3)


def test_fp16_softmax():
    x = (torch.randn(5, 40) * 4).half()
    pg, feeds = op_graph("Softmax", [x], (5, 40), {"axis": -1}, DType.float16)
    _check(_whole(pg), all_values(pg, feeds), tol=2e-3)


@pytest.mark.parametrize("rblock", [16, 32])      # looped, one pass
def test_layernorm_with_row_outputs_stores_them_once_per_row(rblock):
    s = _check(*layernorm_group(), rblock=rblock)
    assert sum(st.row_only for st in s.body.stores) == 2
    body = emit_fused(s).split("def fused_kernel(")[1]
    stores = [line for line in body.splitlines() if "tl.store(" in line]
    assert len(stores) == 3
    # mean and inverse std: at the kernel's top level, outside any loop, with no inner-axis mask
    row = [line for line in stores if "out0" not in line]
    assert all(line.startswith("    tl.store(") and "rmask" not in line for line in row)
    assert ("for " in body) == (rblock == 16)


def test_transpose_and_scale_store_two_layouts():
    _check(*transpose_scale_group())


def test_elementwise_chain_with_broadcasting():
    group, env = _model(lambda x, y, z: torch.sigmoid(x + y) * z - torch.tanh(x),
                        torch.randn(4, 5), torch.randn(1, 5), torch.randn(4, 1))
    _check(group, env)


def test_embedding_gather_plus_position():
    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(11, 6)
            self.pos = torch.nn.Parameter(torch.randn(5, 6))

        def forward(self, ids):
            return self.emb(ids) + self.pos

    group, env = _model(Embed(), torch.randint(0, 11, (2, 5)))
    _check(group, env)


def test_concat_slice_pad():
    fn = lambda x, y: torch.nn.functional.pad(torch.cat([x, y], 1)[:, 1:6], (2, 1, 1, 0), value=-1.5)
    group, env = _model(fn, torch.randn(3, 4), torch.randn(3, 3))
    _check(group, env)


def test_gelu_bias_residual():
    fn = lambda x, b, r: torch.nn.functional.gelu(x + b) + r
    group, env = _model(fn, torch.randn(3, 5, 24), torch.randn(24), torch.randn(3, 5, 24))
    _check(group, env)


def test_transpose_reshape_chain():
    # the multi-head split and merge of attention: view, permute, then back through a reshape
    fn = lambda x: (x.view(2, 5, 4, 6).permute(0, 2, 1, 3) * 0.5).transpose(1, 2).reshape(2, 5, 24) + 1.0
    group, env = _model(fn, torch.randn(2, 5, 24))
    _check(group, env, xblock=4, rblock=8)


def test_two_reductions_under_different_joined_guards_keep_their_own_masks():
    """Mamba2's chunked scan (Zamba2): a cumsum over zero-padded positions, read at the last
    position and at every position.  Each reduction's load is guarded by its own triangle test
    joined with the padding test, an expression made while printing.  The printer's memo once
    keyed expressions by id: the first joined guard was freed, the second took its id, and both
    loads used the first's mask (r <= 15 for every row).  Checked against eager."""
    def segment(a, x):
        a = torch.nn.functional.pad(a, (0, 0, 0, 8)).permute(0, 2, 1)
        c = torch.cumsum(a, -1)
        d = torch.exp(c[..., -1:] - c)
        x = torch.nn.functional.pad(x, (0, 0, 0, 8)).view(2, 16, 4, 4)
        return c, x * d.permute(0, 2, 1)[..., None]

    a, x = -torch.rand(2, 8, 4), torch.randn(2, 8, 16)
    pg = fold_constants(fission(import_torch(segment, (a, x)).graph))
    s = _schedule(_whole(pg), xblock=16, rblock=16)
    assert len(s.body.instances) >= 2          # the two reductions, in one kernel
    outs = {n: torch.full(pg.types[n].shape, float("nan")) for n in pg.outputs}
    feeds = {d.name: t for d, t in zip(pg.inputs, (a, x))}
    compile_fused(s)([feeds[n] for n in s.body.inputs], [outs[st.tensor] for st in s.body.stores])
    for name, want in zip(pg.outputs, segment(a, x)):
        torch.testing.assert_close(outs[name].reshape(want.shape), want, rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("sizes", [[4, 4, 4], [3, 5, 2]], ids=["even", "uneven"])
def test_split_into_several_outputs(sizes):
    # attention's q, k, v chunk; uneven parts are computed at the largest part's coordinates and
    # stored where they fit (their reads past the input are masked)
    fn = lambda x: tuple(t * (k + 1) for k, t in enumerate(torch.split(x, sizes, dim=1)))
    group, env = _model(fn, torch.randn(4, sum(sizes)))
    s = _check(group, env)
    assert len(s.body.stores) == 3
    assert sum(bool(st.limits) for st in s.body.stores) == (2 if sizes[0] != sizes[1] else 0)


def test_integer_and_bool_group():
    fn = lambda a, b: torch.where((a > b) | (a == 0), a // 3 + a % 5, torch.fmod(a, 4) - b) * 2
    group, env = _model(fn, torch.randint(-20, 20, (4, 6)), torch.randint(-20, 20, (4, 6)))
    _check(group, env)


def _op_group(make, inputs):
    """One kernel with one output per op: ``make(op, loads) -> expr`` over same-shaped inputs."""
    shape = tuple(inputs[0][1].shape)
    names = [n for n, _ in inputs]
    fx = Fission(set(names))
    refs = [fx.ref(n, TensorType(shape, DType.from_torch(t.dtype))) for n, t in inputs]
    env = dict(inputs)
    outs = {}
    for op, fn in make.items():
        r = fx.compute(shape, lambda i, fn=fn: fn(*(x[i] for x in refs)))
        outs[r.name] = op
    from tilefuse.ir.prim import PrimGraph, TensorDecl
    from tilefuse.ir.evaluate import run_reference
    pg = PrimGraph(tuple(TensorDecl(n, TensorType(shape, DType.from_torch(t.dtype))) for n, t in inputs), (),
                   tuple(fx.prims), tuple(outs))
    env.update(zip(pg.outputs, run_reference(pg, dict(inputs))))
    return Group(pg.prims, tuple(names), pg.outputs, dict(pg.types)), env


def test_every_unary_and_float_binary_op_matches_the_reference():
    x = torch.linspace(-3.2, 3.2, 24).reshape(4, 6)
    x[0, :3] = torch.tensor([2.5, -0.5, 1.5])               # round half to even
    y = torch.randn(4, 6) + 0.1
    un = {op: (lambda a, b, op=op: unary(op, a) if op != "not" else cast(unary(op, a.gt(0.0)), DType.float32))
          for op in sorted(UNARY_OPS)}
    un = {op: (lambda a, b, f=f: cast(f(a, b), DType.float32)) for op, f in un.items()}
    bi = {op: (lambda a, b, op=op: cast(binary(op, a, b), DType.float32))
          for op in sorted(BINARY_OPS - LOGIC_OPS) if op not in ("bitand", "bitor", "bitxor", "shl", "shr")}
    group, env = _op_group({**un, **{"b_" + k: v for k, v in bi.items()}}, [("x0", x), ("x1", y)])
    _check(group, env, tol=2e-5)


def test_integer_binary_ops_match_the_reference():
    a = torch.randint(-30, 30, (4, 6), dtype=torch.int32)
    b = torch.randint(1, 6, (4, 6), dtype=torch.int32) * torch.where(torch.rand(4, 6) < 0.5, -1, 1).int()
    ops = sorted(BINARY_OPS - LOGIC_OPS - COMPARE_OPS - {"pow", "shl", "shr"})
    make = {op: (lambda p, q, op=op: binary(op, p, q)) for op in ops}
    make["shifts"] = lambda p, q: binary("shr", p, binary("bitand", q, 3)) + binary("shl", p, binary("bitand", q, 3))
    make["pow"] = lambda p, q: binary("pow", p, binary("bitand", q, 3))
    make["logic"] = lambda p, q: select(binary("xor", p.gt(0), q.lt(0)) , p, q)
    group, env = _op_group(make, [("x0", a), ("x1", b)])
    _check(group, env)


def test_float_mod_by_infinity_and_zero_like_the_reference():
    # Python-style mod of floats: x mod ±inf is x or ±inf (not NaN), x mod 0 is NaN
    inf = float("inf")
    a = torch.tensor([[3.0, -1.0, 3.0, -1.0, 5.5, -5.5, 0.0, inf]])
    b = torch.tensor([[inf, inf, -inf, -inf, 2.0, 2.0, 0.0, 3.0]])
    group, env = _op_group({"mod": lambda p, q: binary("mod", p, q)}, [("x0", a), ("x1", b)])
    _check(group, env)


@pytest.mark.parametrize("combiner", ["max", "min", "sum", "prod"])
def test_bool_reduction_over_an_empty_axis_gives_its_identity(combiner):
    from tilefuse.ir.prim import PrimGraph, TensorDecl
    from tilefuse.ir.evaluate import run_reference
    x = torch.zeros(3, 0, dtype=torch.bool)
    fx = Fission({"x0"})
    ref = fx.ref("x0", TensorType((3, 0), DType.bool))
    r = fx.reduce((3,), (0,), combiner, lambda i, k: ref[(i[0], k[0])])
    pg = PrimGraph((TensorDecl("x0", ref.type),), (), tuple(fx.prims), (r.name,))
    env = {"x0": x, r.name: run_reference(pg, {"x0": x})[0]}
    assert env[r.name].tolist() == [combiner in ("min", "prod")] * 3   # all() of nothing is True
    _check(Group(pg.prims, ("x0",), pg.outputs, dict(pg.types)), env)


def test_source_is_deterministic_and_names_its_operators():
    pg, _ = op_graph("Softmax", [torch.randn(6, 33)], (6, 33), {"axis": -1})
    s = _schedule(_whole(pg))
    from tilefuse.codegen import kernel_names
    name = kernel_names([s], pg.prims)[0]
    assert name == "fused_softmax"
    src = emit_fused(s, name)
    assert src == emit_fused(s, name)
    assert src.startswith("#") and "Softmax 'n0'" in src.split("import")[0]
    assert "def fused_softmax(" in src


def test_sample_of_encoder_block_candidates():
    from tilefuse.demo import demo_model
    from tilefuse.frontend.torch import import_torch
    from tilefuse.orchestrate.candidates import enumerate_candidates
    from tilefuse.orchestrate.segment import split_segments
    model, inputs = demo_model(batch=2, seq=8)
    pg = fission(import_torch(model, inputs).graph)
    env = all_values(pg, {d.name: t for d, t in zip(pg.inputs, inputs)})
    fam = FusedFamily()
    every = []
    for seg in split_segments(pg):
        enumerate_candidates(seg, lambda c: every.append(c) or 0.0)
    # a uniform sample of the candidates the family builds: candidates in random order, the first
    # eight it accepts (asking the family about each candidate costs more than running eight)
    sample = []
    for c in random.Random(0).sample(every, len(every)):
        if fam.schedules(Group(c.prims, c.inputs, c.outputs, pg.types), H100):
            sample.append(c)
            if len(sample) == 8:
                break
    assert len(sample) == 8
    for c in sample:
        _check(Group(c.prims, c.inputs, c.outputs, pg.types), env, tol=1e-4)


def test_the_schedules_warps_reach_the_source_and_the_launch():
    pg, _ = op_graph("Softmax", [torch.randn(6, 33)], (6, 33), {"axis": -1})
    s = _schedule(_whole(pg))
    for warps in (1, 4, 8):
        src = emit_fused(dataclasses.replace(s, num_warps=warps))
        assert f"num_warps={warps}" in src.splitlines()[0]