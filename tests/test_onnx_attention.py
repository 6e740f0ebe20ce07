"""Attention through ONNX plans as through PyTorch (issue #23, item 6): the exporters guard the
softmax with ``Where(IsNaN(p), 0, p)`` (a row whose keys are all masked gives zeros, not NaN);
the chain family reads that guard as a row-only select on the row's max (``chain/body.py:
_nan_guards``), so scores, softmax and the product with the values stay one kernel.  Values
against onnxruntime, a fully masked row among them."""
import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import tilefuse

B, H, S, D = 2, 2, 8, 16


def _guarded_attention(path):
    """softmax(q kᵀ / √D + where(mask, 0, -inf)) with the exporters' NaN guard, times v."""
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info(n, f, [B, H, S, D]) for n in ("q", "k", "v")]
    ins.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [B, 1, 1, S]))
    out = helper.make_tensor_value_info("y", f, [B, H, S, D])
    consts = [helper.make_tensor("zero", f, [], [0.0]), helper.make_tensor("ninf", f, [], [-np.inf]),
              helper.make_tensor("scale", f, [], [D ** -0.5])]
    nodes = [helper.make_node("Where", ["mask", "zero", "ninf"], ["bias"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Mul", ["qk", "scale"], ["scaled"]),
             helper.make_node("Add", ["scaled", "bias"], ["scores"]),
             helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
             helper.make_node("IsNaN", ["p"], ["nan"]),
             helper.make_node("Where", ["nan", "zero", "p"], ["pg"], name="nan_guard"),
             helper.make_node("MatMul", ["pg", "v"], ["y"])]
    m = helper.make_model(helper.make_graph(nodes, "attention", ins, [out], consts),
                          opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    onnx.save(m, path)
    return str(path)


def _feeds():
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((B, H, S, D)).astype(np.float32) for n in ("q", "k", "v")}
    mask = np.ones((B, 1, 1, S), bool)
    mask[0, ..., 5:] = False         # batch 0: the last three keys masked
    mask[1] = False                  # batch 1: every key masked (the guard's zeros)
    feeds["mask"] = mask
    return feeds


def test_the_nan_guard_keeps_attention_one_chain_kernel(tmp_path):
    import onnxruntime as ort
    path = _guarded_attention(tmp_path / "att.onnx")
    plan = tilefuse.compile_onnx(path, target="h100")
    assert [k.family for k in plan.report.kernels].count("chain") == 1
    assert not any(k.family == "gemm" for k in plan.report.kernels)
    feeds = _feeds()
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert not want[1].any() and np.isfinite(want).all()
    got = plan.run(feeds, emulate=True)[0]               # the h100 plan's chain kernel, here
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dynamo", [True, pytest.param(False, marks=pytest.mark.slow)],   # the legacy
                         ids=["dynamo-exporter", "torchscript-exporter"])       # TorchScript exporter: --runslow
def test_distilbert_through_onnx_has_one_attention_kernel_per_layer(dynamo, tmp_path):
    import transformers
    cfg = transformers.DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                        max_position_embeddings=32, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.DistilBertModel(cfg).eval()
    ids, mask = torch.randint(0, 64, (1, 8)), torch.ones(1, 8, dtype=torch.long)
    path = tmp_path / "distilbert.onnx"
    with torch.no_grad():
        torch.onnx.export(model, (ids, mask), str(path), input_names=["input_ids", "attention_mask"],
                          dynamo=dynamo)
    plan = tilefuse.compile_onnx(str(path), target="h100", backend="reference")
    attention = [k for k in plan.report.kernels if k.family == "chain" and any(op.startswith("Softmax") for op in k.ops)]
    assert len(attention) == cfg.n_layers, [(k.family, k.ops) for k in plan.report.kernels]
    with torch.no_grad():                       # the imported graph against eager
        want = model(ids, attention_mask=mask).last_hidden_state
    from tilefuse.orchestrate.plan import execute_reference
    feeds = dict(zip(plan.input_names, (ids, mask)))
    got = execute_reference(plan.plan, plan.primgraph, feeds)[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
