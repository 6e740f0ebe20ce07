"""The generated source is what a Triton expert would write (issue #9): golden-shape checks on the
kernels planned for h100, the dump of every kernel, and one name per kernel everywhere."""
import re

import pytest
import torch
from planning import chosen, meta, plan_op

import tilefuse
from tilefuse.families.fused import FusedFamily
from tilefuse.ir.dtypes import DType


def _fused_source(op, inputs, shape, attrs=None, dtype=DType.float32):
    plan, coster = plan_op(op, inputs, shape, attrs, dtype=dtype)
    got = chosen(plan, coster, "fused")
    assert len(plan.kernels) == 1 and len(got) == 1, [k.candidate for k in plan.kernels]
    s = got[0][1]
    return s, FusedFamily().build(s, "k").source


def _body(src: str) -> str:
    return src[src.index("def k("):]


def test_bert_base_layernorm_loads_each_input_once_in_one_pass():
    x, w = meta(128, 768, dtype=torch.float32), meta(768, dtype=torch.float32)
    s, src = _fused_source("LayerNormalization", [x, w, w], (128, 768), {"axis": -1, "epsilon": 1e-12})
    body = _body(src)
    assert s.one_pass and "one pass" in src.splitlines()[0]
    assert body.count("tl.load(") == 3            # x, gamma, beta: each once
    assert body.count("for ") == 0                # one pass over the row: no loop at all
    assert body.count("tl.store(") == 1
    assert "int64" not in body and "//" not in body and "%" not in body
    assert "rmask" in body and "xmask" not in body   # 768 < RBLOCK=1024; 128 rows divide XBLOCK


def test_bert_base_softmax_loads_once_and_propagates_nan():
    s, src = _fused_source("Softmax", [meta(1, 12, 128, 128, dtype=torch.float32)], (1, 12, 128, 128), {"axis": -1})
    body = _body(src)
    assert s.one_pass
    assert body.count("tl.load(") == 1 and body.count("for ") == 0 and body.count("tl.store(") == 1
    assert "mask" not in body                     # 128 divides every block: no masks at all
    assert "_maximum" in body and "tl.max(" not in body     # NaN-propagating max
    assert "int64" not in body


def test_large_pointwise_is_one_dimensional_int32_and_unmasked():
    s, src = _fused_source("Add", [meta(4096, 4096, dtype=torch.float16)] * 2, (4096, 4096), dtype=DType.float16)
    body = _body(src)
    assert "for " not in body and "RBLOCK" not in body and "[:, None]" not in body
    assert "int64" not in body and "mask" not in body
    assert body.count("tl.load(") == 2 and "xs" in body
    assert re.search(r"tl\.load\(in0 \+ xs\)", body)       # a contiguous layout is not unravelled


def test_offsets_beyond_int32_use_int64():
    shape = (65536, 32768 + 8)                     # more than 2**31 elements
    s, src = _fused_source("Relu", [meta(*shape, dtype=torch.float16)], shape, dtype=DType.float16)
    assert "tl.program_id(0).to(tl.int64)" in _body(src)


def test_looped_rows_keep_reread_data_in_cache_and_pipeline():
    n = 65536                                      # too long for one tile: looped in chunks
    s, src = _fused_source("Softmax", [meta(4, n, dtype=torch.float32)], (4, n), {"axis": -1})
    body = _body(src)
    assert not s.one_pass and s.num_stages == 2
    assert body.count("for ") == 3                 # max, sum, outputs
    assert 'eviction_policy="evict_last"' in body
    assert "num_stages=2" in src.splitlines()[0]
    assert 'float("-inf")' in body                 # the max's identity as a literal


def test_dump_writes_every_kernel_and_names_agree(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.LayerNorm(16))
    x = torch.randn(4, 16)
    c = tilefuse.compile(model, (x,), dump=tmp_path)
    files = sorted((tmp_path / "4-kernels").iterdir())
    assert len(files) == c.report.num_kernels == len(c.kernels)
    for f, info, built in zip(files, c.report.kernels, c.kernels):
        assert f.name.endswith(f"_{info.name}.{'py' if built.language == 'triton' else 'txt'}")
        assert info.name == built.name
        if built.language == "triton":
            assert f"def {info.name}(" in f.read_text()
    names = [k.name for k in c.report.kernels]
    # one GEMM kernel: bias, GELU and the LayerNorm over its 16-wide rows in the epilogue
    assert names == ["gemm_gemm_gelu_layernormalization"]
    torch.testing.assert_close(c(x), model(x), rtol=1e-5, atol=1e-5)


def test_cli_compile_dump_writes_every_kernel(tmp_path, capsys):
    import onnx
    from onnx import TensorProto, helper

    from tilefuse.cli import main
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])
    w = helper.make_tensor("w", TensorProto.FLOAT, [32, 32], [0.01] * 1024)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Softmax", ["m"], ["y"], axis=-1)]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)],
                          ir_version=10)
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    assert main(["compile", str(path), "--target", "h100", "--dump", str(tmp_path / "d")]) == 0
    files = sorted(p.name for p in (tmp_path / "d" / "4-kernels").iterdir())
    assert files == ["0_gemm_matmul_softmax.py"]          # the softmax over 32-wide rows is the epilogue
    assert "written to" in capsys.readouterr().out


def test_codegen_errors_surface_at_compile(monkeypatch):
    from tilefuse.families import fused        # the family's template (families/fused/template.py)

    def broken(s, name):
        raise RuntimeError("template bug")
    monkeypatch.setattr(fused, "fused_kernel", broken)
    with pytest.raises(RuntimeError, match="template bug"):
        tilefuse.compile(torch.nn.ReLU(), (torch.randn(4),))


def test_a_kernel_carries_only_the_helpers_and_imports_it_calls():
    """A GEMM + ReLU calls no combiner and no libdevice function: neither is in its module; a
    softmax's row max is a NaN-propagating ``_maximum`` (defined once), and an erf GELU imports
    libdevice; every module still compiles and runs (against eager)."""
    def sources(model, x):
        with torch.no_grad():
            cm = tilefuse.compile(model, (x,), target="cpu")
            torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
        return [b.source for b in cm.kernels]
    x = torch.randn(4, 16)
    (gemm,) = sources(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()), x)
    assert "def _" not in gemm and "libdevice" not in gemm
    (soft,) = sources(torch.nn.Softmax(-1), x)
    assert soft.count("def _maximum(") == 1 and "def _mul(" not in soft and "def _minimum(" not in soft
    (gelu,) = sources(torch.nn.GELU(), x)
    assert "from triton.language.extra import libdevice" in gelu and "libdevice.erf(" in gelu
