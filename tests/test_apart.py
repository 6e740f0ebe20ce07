"""Why two kernels are not one (issue #23, item 8): for each kernel that reads another's output,
``CompiledModel.why_apart()`` names what kept them apart, and the report, the HTML page and
``tilefuse compile --why-apart`` show it."""
import dataclasses

import pytest
import torch

import tilefuse
from tilefuse.families.base import Cost
from tilefuse.demo import demo_model
from tilefuse.orchestrate.costing import Coster


@pytest.fixture(scope="module")
def block():
    model, args = demo_model(batch=2, seq=16)
    return tilefuse.compile(model, args, target="h100", backend="reference")


def test_each_pair_of_an_encoder_block_gets_its_reason(block):
    rows = block.why_apart()
    names = [k.name for k in block.report.kernels]
    pairs = {(r.producer, r.consumer): r for r in rows}
    # the Q/K/V projection (its LayerNorm in the prologue) feeds attention: contractions no family
    # builds as one kernel
    qkv = next(j for j, k in enumerate(block.report.kernels) if k.family == "gemm")
    first = pairs[(qkv, qkv + 1)]
    assert block.report.kernels[qkv + 1].family == "chain"
    assert first.reason == "family" and "contraction" in first.detail and first.apart_us > 0
    # the block's input reaches the output projection's residual through the attention kernels
    skip = next(r for r in rows if r.reason == "between")
    assert skip.producer == 0 and "feed" in skip.detail and f"#{skip.consumer}" in skip.detail
    assert {r.reason for r in rows} <= {"segment", "between", "family", "cost", "plan"}
    assert all(0 <= r.producer < r.consumer < len(names) for r in rows)
    d = block.report.to_dict()["apart"]
    assert len(d) == len(rows) and d[0]["reason"] == first.reason


@pytest.mark.parametrize("fused_us, reason", [(1e6, "cost"), (1e-3, "plan")])
def test_a_pair_a_family_can_fuse_is_apart_by_cost_or_by_the_plan(block, monkeypatch, fused_us, reason):
    """Where some family builds the pair, the fused kernel's modelled time decides the words."""
    real = Coster.best

    def best(self, cand):
        got = real(self, cand)
        if got is None:                       # (a family's schedule stands in: any one will do)
            got = (Cost(1.0, 0, 0, 1), block.plan.kernels[0].schedule)
        return dataclasses.replace(got[0], seconds=fused_us * 1e-6), got[1]
    monkeypatch.setattr(Coster, "best", best)
    rows = [r for r in block.why_apart() if r.reason not in ("segment", "between")]
    assert rows and all(r.reason == reason and r.fused_us == pytest.approx(fused_us) for r in rows)
    assert all(f"models {fused_us:.2f} us" in r.detail for r in rows)


def test_html_and_cli_show_them(block, tmp_path, capsys):
    block.why_apart()
    html = block.report.to_html(tmp_path / "r.html").read_text()
    assert "why these kernels are not one" in html and "no kernel family builds them" in html
    import onnx  # noqa: F401  (the CLI compiles an ONNX model)
    from tilefuse.cli import main
    path = tmp_path / "m.onnx"
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 8)).eval()
    torch.onnx.export(model, (torch.randn(4, 16),), str(path), dynamo=False)
    assert main(["compile", str(path), "--target", "h100", "--why-apart"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "why kernels are apart (times modelled)" in out and "#0 -> #1" in out
