"""tilefuse: optimal kernel orchestration and Triton code generation for DL inference."""
import os as _os

import torch as _torch

if not _torch.cuda.is_available():
    # Without a GPU generated kernels run in Triton's interpreter, which triton.jit selects from this
    # variable when it decorates a function.  Set before triton is imported, its standard library is
    # decorated for the interpreter too; if triton came first, the kernel loader re-decorates it.
    _os.environ.setdefault("TRITON_INTERPRET", "1")

from .api import compile, compile_onnx, compile_prims
from .cost.target import Target
from .errors import (InputError, ModelLoadError, TargetAbsentError, TilefuseError, UnsupportedAttribute,
                     UnsupportedOperator)
from .log import from_environment as _logs_from_environment, set_logs
from .minifier import MinifyError, minify
from .report.report import Report
from .runtime.compiled import CompiledModel
from .verify import VerifyError

__version__ = "0.1.0"

_logs_from_environment()

__all__ = ["compile", "compile_onnx", "compile_prims", "minify", "MinifyError", "VerifyError", "set_logs", "CompiledModel", "Report", "TilefuseError", "UnsupportedOperator",
           "UnsupportedAttribute", "ModelLoadError", "InputError", "TargetAbsentError", "Target", "__version__"]
