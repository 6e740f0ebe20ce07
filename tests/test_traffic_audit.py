"""The bytes generated kernels really move (counted under the interpreter) against the bytes the
cost model charged their schedules, before cache credit (issue #9, item 4)."""
import pytest
import torch

import tilefuse
from tilefuse import zoo
from tilefuse.cost.audit import audit_traffic

TOLERANCE = 0.10


@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_every_fused_kernel_of_the_h100_plan_moves_what_the_model_charged(name):
    model, sets = zoo.build(name, "tiny")
    c = tilefuse.compile(model, sets[0], target="h100", backend="reference")
    family = {k.name: k.family for k in c.report.kernels}
    rows = [r for r in audit_traffic(c, *sets[0]) if family[r.name] == "fused"]
    assert len(rows) == sum(k.family == "fused" for k in c.report.kernels) >= 2
    off = [f"{r.index} {r.name}: counted {r.counted_bytes} modelled {r.modelled_bytes}" for r in rows
           if abs(r.ratio - 1) > TOLERANCE]
    assert not off, off


def test_every_gemm_and_chain_kernel_of_the_bert_plan_moves_what_the_model_charged():
    """GEMMs with prologues and epilogues (heads read through the merged Q/K/V projection,
    softmax, GELU, LayerNorm in two phases) and attention chains (Q, K, V tiles, the mask): the
    operand panels the model charges are what the loops load.  (Convolutions are audited by
    bench/traffic.py at the small size; on the tiny zoo's 4x4-16x16 feature maps a padded
    window's in-bounds share is averaged over the image, up to 15% off per kernel.)"""
    model, sets = zoo.build("bert", "tiny")
    c = tilefuse.compile(model, sets[0], target="h100", backend="reference")
    family = {k.name: k.family for k in c.report.kernels}
    rows = [r for r in audit_traffic(c, *sets[0]) if family[r.name] in ("gemm", "chain")]
    assert len(rows) >= 6 and {family[r.name] for r in rows} == {"gemm", "chain"}
    off = [f"{r.index} {r.name}: counted {r.counted_bytes} modelled {r.modelled_bytes}" for r in rows
           if abs(r.ratio - 1) > TOLERANCE]
    assert not off, off


def test_a_looped_kernel_reads_its_input_once_per_loop_as_modelled():
    n = 20000                                  # more than one tile: max, sum and outputs each loop
    model = torch.nn.Softmax(-1)
    x = torch.randn(3, n)
    c = tilefuse.compile(model, (x,), target="h100", backend="reference")
    (row,) = audit_traffic(c, x)
    sched = c.plan.kernels[0].schedule
    assert not sched.one_pass
    assert row.element_bytes == 4 * x.numel() * 4        # 3 loads of x, one store
    assert abs(row.ratio - 1) <= TOLERANCE


def test_the_audit_sees_a_kernel_that_moves_more_than_its_model(monkeypatch):
    # a model that forgot the stores is caught
    model = torch.nn.GELU()
    x = torch.randn(64, 64)
    c = tilefuse.compile(model, (x,), target="h100", backend="reference")
    (row,) = audit_traffic(c, x)
    assert abs(row.ratio - 1) <= TOLERANCE
    assert row.counted_bytes == 2 * x.numel() * 4
    from dataclasses import replace
    k = c.plan.kernels[0]
    wrong = replace(k.schedule, work=replace(k.schedule.work, requested_bytes=x.numel() * 4))
    monkeypatch.setattr(c, "plan", replace(c.plan, kernels=(replace(k, schedule=wrong),)))
    (row,) = audit_traffic(c, x)
    assert row.ratio == pytest.approx(2.0)
