"""Buckets of sizes and plans carried from one size to another (issue #24, item 1;
``orchestrate/buckets.py``, ``orchestrate/instantiate.py``): a plan made at one sequence length
runs the same program at another, equal to eager PyTorch; a plan of another program is refused by
name; the bucket arithmetic bounds the plans of a range."""
from __future__ import annotations

import math
import time

from dataclasses import replace

import pytest
import torch
import torch.nn as nn

import tilefuse
from tilefuse.api import _pipeline
from tilefuse.cost.target import Target
from tilefuse.orchestrate.costing import Coster
from tilefuse.frontend.torch import import_torch
from tilefuse.orchestrate.buckets import bucket, checked_size, plan_bucket, planned_size
from tilefuse.orchestrate.instantiate import PlanMismatch, PlanTemplate, instantiate


class Attention(nn.Module):
    """LayerNorm, causal attention over the sequence (softmax along it), a residual."""

    def __init__(self, d=16, heads=2):
        super().__init__()
        self.heads, self.norm, self.qkv = heads, nn.LayerNorm(d), nn.Linear(d, 3 * d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + a.transpose(1, 2).reshape(b, t, d)


def _carried(model, x, template, target="cpu"):
    return _pipeline(import_torch(model, (x,)), target=target, backend="triton", strategy="optimal",
                     t0=time.perf_counter(), dump=None, time_limit=1.0, template=template)


@pytest.mark.parametrize("n, want", [(1, (1, 1)), (2, (2, 2)), (3, (3, 4)), (4, (3, 4)), (5, (5, 8)), (8, (5, 8)),
                                     (9, (9, 16)), (512, (257, 512)), (513, (513, 1024))])
def test_power_of_two_buckets(n, want):
    assert bucket(n) == want
    first, last = want
    assert first <= planned_size(first, last) <= last and first <= checked_size(first, last) <= last
    assert planned_size(first, last) % 2 == 1 or first == last, "planned at an odd size where it can be"


def test_sizes_up_to_n_need_at_most_log2_n_plus_one_buckets():
    for n in (1, 2, 3, 17, 100, 256, 261):
        assert len({bucket(k) for k in range(1, n + 1)}) <= math.ceil(math.log2(n)) + 1 if n > 1 else 1


def test_a_plan_carried_to_other_lengths_equals_eager():
    torch.manual_seed(0)
    model = Attention().eval()
    planned = tilefuse.compile(model, (torch.randn(1, 7, 16),), target="cpu", time_limit=1.0)
    assert planned.template.plan is planned.plan
    for seq in (5, 6, 8):
        x = torch.randn(1, seq, 16)
        carried = _carried(model, x, planned.template)
        assert carried.report.solver["status"] == "instantiated"
        assert [k.candidate.names for k in carried.plan.kernels] == [k.candidate.names for k in planned.plan.kernels]
        assert [k.schedule.family for k in carried.plan.kernels] == [k.schedule.family for k in planned.plan.kernels]
        with torch.no_grad():
            torch.testing.assert_close(carried(x), model(x), rtol=1e-4, atol=1e-5)


def test_a_gpu_plan_carried_is_checked_by_emulation():
    torch.manual_seed(0)
    model = Attention().eval()
    planned = tilefuse.compile(model, (torch.randn(2, 15, 16),), target="h100", time_limit=1.0)
    x = torch.randn(2, 11, 16)
    carried = _carried(model, x, planned.template, target="h100")
    assert carried.report.target == "h100" and carried.report.solver["status"] == "instantiated"
    with torch.no_grad():
        torch.testing.assert_close(carried.emulate(x), model(x), rtol=1e-4, atol=1e-5)


def test_the_plan_of_another_program_is_refused_by_name():
    torch.manual_seed(0)
    planned = tilefuse.compile(Attention().eval(), (torch.randn(1, 7, 16),), target="cpu", time_limit=1.0)
    other = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 16), nn.GELU()).eval()
    with pytest.raises(PlanMismatch, match=r"inputs and outputs differ from the template's \(\['0.bias'"):
        _carried(other, torch.randn(1, 7, 16), planned.template)
    # the same inputs and outputs, a prim reading something else: named with its operator
    pg = planned.primgraph
    victim = next(p for p in pg.prims if len(p.inputs) == 2)
    changed = replace(pg, prims=tuple(replace(p, inputs=p.inputs[::-1]) if p is victim else p for p in pg.prims))
    coster = Coster(changed.types, Target.get("cpu"))
    with pytest.raises(PlanMismatch, match=rf"prim {victim.name} \({victim.origin.op} '{victim.origin.name}'\) "
                                           rf"differs at these sizes: it reads"):
        instantiate(planned.template, changed, coster)


def test_plan_bucket_plans_once_and_checks_the_far_end():
    """``plan_bucket`` compiles at the planned size, then (check) the checked size's own plan and
    the bucket's plan carried there, and reports how much slower the carried one is."""
    torch.manual_seed(0)
    model = Attention().eval()
    calls = []

    def compile_at(at, template):
        calls.append((dict(at), template is not None))
        x = torch.randn(1, at["seq"], 16)
        if template is None:
            return tilefuse.compile(model, (x,), target="h100", time_limit=1.0)
        return _carried(model, x, template, target="h100")
    b, top = plan_bucket({"seq": bucket(13)}, compile_at)
    # planned at 15; 9 planned on its own and carried (the bound); carried to 11 and 13, the samples
    # the kernels are made size-generic from (odd, no multiple of 8 beside them)
    assert calls == [({"seq": 15}, False), ({"seq": 9}, False), ({"seq": 9}, True), ({"seq": 11}, True),
                     ({"seq": 13}, True)]
    assert b.template.generic_over == ("seq",) and any(b.template.generics)
    assert isinstance(b.template, PlanTemplate) and b.template.sizes == {"seq": 15}
    assert b.ranges == {"seq": (9, 16)} and b.checked_at == {"seq": 9}
    assert b.own_us > 0 and b.carried_us >= b.own_us * (1 - 1e-9), "the own plan is optimal (modelled)"
    record = b.record()
    assert record["ranges"] == {"seq": [9, 16]} and record["slower"] == round(b.slower, 4)
    assert record["generic_kernels"] == sum(g is not None for g in b.template.generics) > 0
    assert top.report.est_total_us == b.planned_us


# ---------------------------------------------------------------- size-generic sources

SOURCE = """import triton
import triton.language as tl


@triton.jit
def k(in0, out0, XBLOCK: tl.constexpr):
    # {n} rows
    xs = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xs < {n}
    t1 = tl.load(in0 + xs * {s} + {c}, mask=xmask, other=0)
    for r in range(0, {n}, XBLOCK):
        t1 += 1
    tl.store(out0 + xs, t1 + {tiles}, mask=xmask)
"""


def _source(n: int, **over) -> str:
    fields = dict(n=n, s=3 * n + 1, c=n * n, tiles=-(-n // 16))
    fields.update(over)
    return SOURCE.format(**fields)


def test_forms_fit_what_the_samples_hold():
    from tilefuse.codegen.triton.generic import Form, fit
    assert fit([9, 11, 13], [28, 34, 40]) == Form("affine", 3, 1)
    tiles = fit([9, 11, 17, 33], [1, 1, 2, 3])
    assert tiles is not None and [tiles(t) for t in (16, 17, 48, 49)] == [1, 2, 3, 4]
    assert fit([9, 11, 13, 15], [81, 121, 169, 225]) == Form("square", 1, 0, 0)
    assert fit([9, 11, 13, 15], [1, 7, 2, 5]) is None          # nothing explains it
    for form in (Form("affine", 3, 1), Form("square", 2, -1, 5), Form("tiles", 2, 1, 1, 16)):
        for t in (9, 10, 31, 100):       # the text Triton runs computes what the form does
            assert eval(form.text().replace("tf_size", str(t))) == form(t), (form, t)


def test_generic_source_is_the_samples_with_the_size_an_argument():
    from tilefuse.codegen.triton.generic import generalize
    g = generalize({t: _source(t) for t in (9, 11, 13, 15)}, "k")
    assert g is not None
    assert "def k(in0, out0, tf_size, XBLOCK: tl.constexpr):" in g.source
    assert '@triton.jit(do_not_specialize=["tf_size"])' in g.source
    assert "xmask = xs < (tf_size)" in g.source and "range(0, (tf_size), XBLOCK)" in g.source
    assert "xs * (3 * tf_size + 1) + (1 * tf_size * tf_size)" in g.source
    # served only where it is that size's own source: every literal as the forms say
    assert all(g.matches(_source(t), t) for t in (10, 12, 14, 16))
    assert not g.matches(_source(12), 13)
    assert not g.matches(_source(12, c=7), 12)
    assert not g.matches(_source(12).replace("t1 + ", "t1 - "), 12)


def test_no_generic_source_where_samples_differ_in_structure_or_in_constants_triton_needs():
    from tilefuse.codegen.triton.generic import generalize
    assert generalize({9: _source(9), 11: _source(11).replace("xmask = ", "ymask = ")}, "k") is None
    # one sample of another structure (no mask at a size a block divides) is left out
    odd = {9: _source(9), 11: _source(11), 13: _source(13).replace(", mask=xmask, other=0", ""), 15: _source(15)}
    g = generalize(odd, "k")
    assert g is not None and g.matches(_source(14), 14) and not g.matches(odd[13], 13)
    assert not g.matches(_source(21), 21)        # ⌈21/16⌉ = 2: the samples all had 1 tile there
    # two samples fit a line through anything: a size where the line is wrong is not served by it
    two = generalize({9: _source(9), 11: _source(11)}, "k")
    assert two is not None and two.matches(_source(13), 13) is False
    assert generalize({9: _source(9), 11: _source(11, c=2.5)}, "k") is None        # a float differs
    arange = {t: _source(t).replace("tl.arange(0, XBLOCK)", f"tl.arange(0, {t + 7})") for t in (9, 11, 13)}
    assert generalize(arange, "k") is None                                         # a compile-time bound
    assert generalize({9: _source(9)}, "k") is None
    assert generalize({9: _source(9), 11: _source(9)}, "k") is None               # nothing varies


def test_a_buckets_generic_kernels_compile_for_sm90_with_the_size_an_argument():
    """The runtime-size kernels take the GPU path (not only the interpreter's): compiled for sm_90,
    no spills, the tensor-core path and load widths of the size's own kernel."""
    from tilefuse.codegen.triton.native import compile_native, compile_native_generic
    torch.manual_seed(0)
    model = Attention().eval().half()

    def compile_at(at, template):
        x = torch.randn(2, at["seq"], 16).half()
        if template is None:
            return tilefuse.compile(model, (x,), target="h100", time_limit=1.0)
        return _carried(model, x, template, target="h100")
    b, top = plan_bucket({"seq": bucket(13)}, compile_at, check=False)
    compiled = [(k.name, compile_native_generic(k.kernels[0], g, 90), compile_native(k.kernels[0], 90))
                for g, k in zip(b.template.generics, top.kernels) if g is not None]
    assert len(compiled) >= 2 and any(name.startswith("chain") for name, _, _ in compiled), compiled
    assert not [name for name, binary, _ in compiled if binary.spills]
    for name, generic, own in compiled:
        assert (generic.mma, generic.wide_share()) == (own.mma, own.wide_share()), name


# ---------------------------------------------------------------- narrowing

def test_a_bucket_is_narrowed_until_its_bound_holds():
    """Carried below 13 the plan models 30% slower than those sizes' own: the bucket 9..16 planned
    at 15 is narrowed (its far end halfway to 15 each time: 12, then 14) to 14..16, where it holds;
    what was cut off is a bucket of its own."""
    from types import SimpleNamespace

    from tilefuse.orchestrate.buckets import clipped
    checked = []

    def compile_at(at, template):
        n = at["seq"]
        if template is not None:
            checked.append(n)
        return SimpleNamespace(template=SimpleNamespace(plan="plan", rewrites=(), strategy="optimal", persistent=()), kernels=(),
                               report=SimpleNamespace(est_total_us=130.0 if template is not None and n < 13 else 100.0))
    b, _ = plan_bucket({"seq": (9, 16)}, compile_at)
    assert checked[:3] == [9, 12, 14]
    assert b.ranges == {"seq": (14, 16)} and b.narrowed and b.asked == {"seq": (9, 16)}
    assert b.checked_at == {"seq": 14} and b.slower == 0.0
    assert b.holds({"seq": 16}) and not b.holds({"seq": 13})
    assert b.record()["narrowed_from"] == {"seq": [9, 16]}
    assert clipped({"seq": (9, 16)}, {"seq": 10}, [b.ranges]) == {"seq": (9, 13)}


def test_narrowed_buckets_serve_every_size_equal_to_onnxruntime(monkeypatch):
    """With a tolerance nothing meets, every bucket narrows to its planned size alone, and the
    sizes it cut off are planned as buckets of their own: each call still runs, right."""
    import io

    import numpy as np
    import onnxruntime as ort

    import tilefuse.orchestrate.buckets as buckets
    monkeypatch.setattr(buckets, "TOLERANCE", -1.0)
    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.onnx.export(Attention().eval(), (torch.randn(1, 5, 16),), buf, dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {1: "seq"}, "y": {1: "seq"}})
    model = tilefuse.compile_onnx(buf.getvalue(), target="cpu", time_limit=1.0)
    session = ort.InferenceSession(buf.getvalue(), providers=["CPUExecutionProvider"])
    for seq in (7, 5, 6):
        x = np.random.default_rng(seq).standard_normal((1, seq, 16), dtype=np.float32)
        np.testing.assert_allclose(model.run(None, {"x": x})[0], session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)
    ranges = [p.report.specialization["bucket"]["ranges"]["seq"] for p in model.plans]
    assert ranges == [[7, 7], [5, 5], [6, 6]], ranges
    assert model.plans[1].report.specialization["bucket"]["narrowed_from"] == {"seq": [5, 6]}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_zoo_models_served_across_a_bucket_match_eager(name):
    """The zoo's tiny text models under torch.compile with the sequence marked dynamic, at sizes of
    one bucket (planned at 15, carried to the rest, size-generic kernels where they match) and the
    next: every output equal to eager's."""
    import torch._dynamo

    from tilefuse import zoo
    torch._dynamo.reset()
    model, _ = zoo.build(name, "tiny")
    compiled = torch.compile(model, backend="tilefuse", options={"interpreter": True, "time_limit": 1.0,
                                                                 "check_buckets": False})
    generic = 0
    for seq in (9, 11, 12, 14, 16, 17):
        _, (inputs,) = zoo.build(name, "tiny", seq=seq)
        for t in inputs:
            if isinstance(t, torch.Tensor) and t.dim() >= 2:
                torch._dynamo.mark_dynamic(t, 1)
        with torch.no_grad():
            got, want = compiled(*inputs), model(*inputs)
        got, want = (getattr(x, "logits", None) if hasattr(x, "logits") else x[0] for x in (got, want))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"{name} at sequence {seq}")
        generic += tilefuse.compiled_graphs()[-1].report.specialization.get("generic_kernels", 0)
    assert generic > 0, "no size ran a size-generic kernel"
    torch._dynamo.reset()


def test_a_plan_that_does_not_carry_to_the_far_end_narrows_the_bucket_and_skips_samples():
    """A carry that raises PlanMismatch at the checked end narrows the bucket as a bound missed by
    far would; at a sample size it leaves the sample out."""
    from types import SimpleNamespace

    def compile_at(at, template):
        if template is not None and at["seq"] in (9, 11):
            raise PlanMismatch(f"no kernel at {at['seq']}")
        return SimpleNamespace(template=SimpleNamespace(plan="plan", rewrites=(), strategy="optimal", persistent=()), kernels=(),
                               report=SimpleNamespace(est_total_us=100.0))
    b, _ = plan_bucket({"seq": (9, 16)}, compile_at)
    assert b.ranges == {"seq": (12, 16)} and b.checked_at == {"seq": 12} and b.slower == 0.0
