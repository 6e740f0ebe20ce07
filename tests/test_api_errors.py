"""Bad arguments to the API are one-line TilefuseErrors naming the argument (issue #12, item 1)."""
import numpy as np
import pytest
import torch

import tilefuse
from tilefuse.errors import InputError, OptionError, TilefuseError


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
    with pytest.raises(InputError, match="keyword inputs"):
        cm(x, extra=x)


def test_targets_are_case_blind_and_an_unknown_one_is_one_line(tmp_path):
    from tilefuse.cost.target import Target
    assert Target.get("H100") is Target.get("h100")
    with pytest.raises(OptionError, match="unknown target 'h800'"):
        Target.get("h800")
    import subprocess
    import sys
    onnx_path = tmp_path / "m.onnx"
    model, x = _model()
    torch.onnx.export(model, (x,), str(onnx_path), dynamo=False)
    r = subprocess.run([sys.executable, "-m", "tilefuse.cli", "compile", str(onnx_path), "--target", "h800"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown target 'h800'" in r.stderr and "Traceback" not in r.stderr
