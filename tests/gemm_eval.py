"""Test helpers for the gemm and chain families: plan a function for h100 and run its kernels on
the CPU (under the interpreter), or build its whole graph as one kernel with a forced tile, and
compare with eager torch and the reference executor; the modules using them import the autouse
fixtures ``_cache`` (kernels in a temporary cache) and ``_seed``."""
from dataclasses import replace

import pytest
import torch

import tilefuse
from tilefuse.ir.samples import allocate
from tilefuse.cost.target import Target
from tilefuse.families.base import Group
from tilefuse.families.gemm import GemmFamily, _schedule, gemm_body
from tilefuse.ir.evaluate import run_reference
from tilefuse.runtime.executor import Program
from tilefuse.families.gemm import GemmTile

H100 = Target.get("h100")
# h100 without the measured tensor-core latency (Target.dot_program_s, dot_step_s): for tests of a
# mechanism whose premise is a plan or ranking the model made before that latency was charged
H100_UNFLOORED = replace(H100, dot_program_s=0.0, dot_step_s=0.0)
F32_TOL = dict(rtol=1e-4, atol=1e-4)
HALF_TOL = {torch.float16: dict(rtol=1e-2, atol=1e-2), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


def tile(bm=16, bn=16, bk=16, swizzle=1):
    return GemmTile(bm=bm, bn=bn, bk=bk, warps=4, stages=2, swizzle=swizzle)


def batchnorm(c):
    """An eval BatchNorm2d over c channels with non-trivial statistics and affine parameters."""
    bn = torch.nn.BatchNorm2d(c).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


def compile_h100(fn, *args):
    return tilefuse.compile(fn, args, target="h100", backend="triton")


def feeds_of(cm, args):
    return dict(zip(cm.input_names, cm.imported.flatten_inputs(args, {})))


def run_cpu(cm, *args):
    """The h100 plan's kernels, run on the CPU: the graph outputs in order."""
    prog = Program(cm.plan, cm.primgraph, torch.device("cpu"), cm.kernels, cm.memory)
    return prog.run(feeds_of(cm, args))


def eager(fn, *args):
    with torch.no_grad():
        out = fn(*args)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def gemm_kernels(cm):
    return [k for k in cm.report.kernels if k.family == "gemm"]


def check_planned(fn, *args, kernels=1, tol=F32_TOL):
    """Compile for h100, assert the plan is ``kernels`` kernels, all of the gemm family, and that
    running them matches eager; returns the compiled model."""
    cm = compile_h100(fn, *args)
    assert [k.family for k in cm.kernels] == ["gemm"] * kernels, [(k.name, k.ops) for k in cm.report.kernels]
    got, want = run_cpu(cm, *args), eager(fn, *args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g.float(), w.float(), **tol)
    return cm


def whole(pg, outputs=None):
    """The whole prim graph as one group (writing ``outputs``, by default the graph's)."""
    made = {p.name for p in pg.prims}
    ins = tuple(dict.fromkeys(n for p in pg.prims for n in p.inputs if n not in made))
    return Group(pg.prims, ins, tuple(outputs or pg.outputs), dict(pg.types))


def forced(fn, t, *args, tol=F32_TOL, family="gemm", form=None):
    """The whole graph of ``fn`` as one kernel of ``family`` (gemm or chain) with tile ``t`` (its
    body rewritten by ``form``, when given: the chain's ``grouped``); asserts that its outputs
    (poisoned with NaN first: every element must be written) match the reference executor and
    eager torch, and that its counters are back at zero.  Returns (built kernel, body)."""
    from tilefuse.families import chain
    body_of, schedule, fam = ((gemm_body, _schedule, GemmFamily()) if family == "gemm" else
                              (chain.chain_body, chain._schedule, chain.ChainFamily()))
    cm = compile_h100(fn, *args)
    pg = cm.primgraph
    body = body_of(whole(pg))
    assert body is not None
    if form is not None:
        body = form(body)
        assert body is not None
    built = fam.build(schedule(body, t, H100), f"{family}_test")
    assert built.family == family and set(built.outputs) == set(pg.outputs)
    feeds = feeds_of(cm, args)
    env = {c.name: c.data for c in pg.constants} | feeds
    outs = [torch.full(pg.types[o].shape, float("nan"), dtype=pg.types[o].dtype.to_torch()) for o in built.outputs]
    scratch = allocate(built.scratch, torch.device("cpu"))
    built.run([env[n] for n in built.inputs], outs + scratch)
    for s, buf in zip(built.scratch, scratch):      # counters: left at zero for the next launch
        assert not (s.zeroed and buf.any()), f"a counter buffer {s.type} is not zero after the launch"
    got = dict(zip(built.outputs, outs))
    for name, ref, want in zip(pg.outputs, run_reference(pg, feeds), eager(fn, *args)):
        torch.testing.assert_close(got[name], ref, **tol, msg=lambda m: f"{name} vs reference: {m}")
        torch.testing.assert_close(got[name].float(), want.float(), **tol,
                                   msg=lambda m: f"{name} vs eager: {m}")
    return built, body


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def fresh_rankings(monkeypatch) -> None:
    """The gemm family's cached tile rankings as fresh caches for this test (dropped after it):
    for a test that changes what the ranking reads (a constant, a tie-break)."""
    import functools

    from tilefuse.families import gemm
    for name in ("ranked_tiles", "_lowest_ranked", "_legacy_ranked"):
        monkeypatch.setattr(gemm, name, functools.lru_cache(maxsize=None)(getattr(gemm, name).__wrapped__))
