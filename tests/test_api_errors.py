"""Bad arguments to the API are one-line TilefuseErrors naming the argument (issue #12, item 1)."""
import numpy as np
import pytest
import torch

import tilefuse
from tilefuse.errors import InputError, OptionError, TilefuseError, UnsupportedOperator


def _model():
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU()).eval(), torch.randn(2, 4)


@pytest.mark.parametrize("limit", ["10", -1, 0, None, True])
def test_time_limit_must_be_a_positive_number(limit):
    model, x = _model()
    with pytest.raises(OptionError, match="time_limit must be a positive number of seconds") as e:
        tilefuse.compile(model, (x,), time_limit=limit)
    assert isinstance(e.value, TilefuseError) and "\n" not in str(e.value)


def test_run_rejects_unknown_output_names_and_feeds_that_are_not_a_dict():
    model, x = _model()
    cm = tilefuse.compile(model, (x,), backend="reference")
    feeds = {cm.input_names[0]: x.numpy()}
    (y,) = cm.run(feeds)
    np.testing.assert_allclose(y, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="no output named 'nope'"):
        cm.run(feeds, output_names=["nope"])
    with pytest.raises(InputError, match="feeds must be a dict"):
        cm.run([x.numpy()])


def test_keyword_inputs_to_a_positional_model_are_an_input_error():
    model, x = _model()
    cm = tilefuse.compile(model, (x,), backend="reference")
    with pytest.raises(InputError, match=r"compiled to be called as compiled\(x0\); got keyword input\(s\) "
                                         r"\['extra'\] it was not compiled with\. .*example_kwargs"):
        cm(x, extra=x)


@pytest.mark.parametrize("fn, kw, match", [
    ("compile", {"targte": "cpu"}, r"compile\(\) got an unknown option 'targte'; did you mean 'target'\? "
                                   r"Its options are target, backend,"),
    ("compile_onnx", {"input_shape": {}}, r"unknown option 'input_shape'; did you mean 'input_shapes'\?.* dims"),
])
def test_a_misspelt_option_names_the_nearest_one(fn, kw, match, tmp_path):
    model, x = _model()
    args = (model, (x,)) if fn == "compile" else (_onnx_path(model, x, tmp_path),)
    with pytest.raises(OptionError, match=match):
        getattr(tilefuse, fn)(*args, **kw)


def _onnx_path(model, x, tmp_path):
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False)
    return str(path)


def test_an_operator_with_side_effects_is_named_not_its_token():
    """torch.linalg.inv exports with an effect token (its singular-input check): the refusal names
    the operator and the model's line, not "a model input of kind TOKEN"."""
    class Inv(torch.nn.Module):
        def forward(self, x):
            return torch.linalg.inv(x)
    with pytest.raises(UnsupportedOperator, match=r"aten\.linalg_inv_ex\.default \(node 'linalg_inv_ex' at "
                                                  r"test_api_errors\.py:\d+ in forward\): .*side effects"):
        tilefuse.compile(Inv(), (torch.randn(3, 3),), target="cpu")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_targets_are_case_blind_and_an_unknown_one_is_one_line(tmp_path):
    from tilefuse.cost.target import Target
    assert Target.get("H100") is Target.get("h100")
    with pytest.raises(OptionError, match="unknown target 'h800'"):
        Target.get("h800")
    r = _cli("compile", _onnx(tmp_path), "--target", "h800")
    assert r.returncode == 2 and "unknown target 'h800'" in r.stderr and "Traceback" not in r.stderr


def _onnx(tmp_path):
    path = tmp_path / "m.onnx"
    model, x = _model()
    torch.onnx.export(model, (x,), str(path), dynamo=False)
    return path


def _cli(*args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "tilefuse.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_cli_input_files_and_report_paths_that_cannot_be_used_are_one_line(tmp_path, capsys):
    from tilefuse.cli import main
    m = _onnx(tmp_path)
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    np.save(tmp_path / "one.npy", np.zeros(3))
    for args, words in [(("run", m, "--inputs", tmp_path / "missing.npz"), "no such file"),
                        (("run", m, "--inputs", tmp_path / "junk.npz"), "not a readable .npz file"),
                        (("run", m, "--inputs", tmp_path / "one.npy"), "an .npy file"),
                        (("compile", m, "--target", "h100", "--json", tmp_path / "no" / "r.json"),
                         "cannot write the report"),
                        (("compile", m, "--target", "h100", "--html", tmp_path / "no" / "r.html"),
                         "cannot write the HTML report")]:
        code = main([str(a) for a in args])        # (in-process: the subprocess case is the --debug test's)
        err = capsys.readouterr().err
        assert code == 2 and words in " ".join(err.split()), (args, err[-500:])
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_corrupt_cached_kernel_is_rewritten_and_an_unusable_cache_is_replaced(tmp_path, monkeypatch):
    from tilefuse.codegen.triton import launch
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(launch, "_MODULES", {})
    model, x = _model()
    tilefuse.compile(model, (x,))(x)
    (kernel,) = (tmp_path / "cache" / "kernels").glob("*.py")
    good = kernel.read_bytes()
    kernel.write_bytes(good + b"\xff")                    # a damaged entry: not even UTF-8
    monkeypatch.setattr(launch, "_MODULES", {})
    with torch.no_grad():
        torch.testing.assert_close(tilefuse.compile(model, (x,))(x), model(x))
    assert kernel.read_bytes() == good
    (tmp_path / "blocked").write_text("a file where the cache folder should be")
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path / "blocked"))
    monkeypatch.setattr(launch, "_MODULES", {})
    with pytest.warns(UserWarning, match="kernel cache .* cannot be used"):
        y = tilefuse.compile(model, (x,))(x)
    with torch.no_grad():
        torch.testing.assert_close(y, model(x))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_debug_is_accepted_after_the_subcommand(tmp_path, capsys):
    """--debug before or after the subcommand lets the error out (Python prints its traceback:
    the subprocess run above shows the one line without it) instead of the one line."""
    from tilefuse.cli import main
    m = str(_onnx(tmp_path))
    for args in (["--debug", "compile", m, "--target", "h800"], ["compile", m, "--target", "h800", "--debug"]):
        with pytest.raises(OptionError, match="unknown target 'h800'"):
            main(args)
    capsys.readouterr()
    assert main(["compile", m, "--target", "h800"]) == 2
    assert "unknown target 'h800'" in capsys.readouterr().err


@pytest.mark.parametrize("option, message", [
    (dict(backend="cuda"), "backend 'cuda' is not available"),
    (dict(strategy="best"), "strategy 'best' is unknown"),
    (dict(cuda_graph=True, target="cpu"), "cuda_graph=True needs backend='triton' and a CUDA target"),
])
def test_options_out_of_range_are_option_errors(option, message):
    model, x = _model()
    with pytest.raises(OptionError, match=message) as e:
        tilefuse.compile(model, (x,), **option)
    assert isinstance(e.value, ValueError) and "\n" not in str(e.value)
