"""tilefuse: optimal kernel orchestration and Triton code generation for DL inference."""
# Importing tilefuse changes no environment and patches nothing: without a GPU, generated kernels
# switch Triton's interpreter on around their own loading and launches (codegen/triton/interpreter.py).
from .api import compile, compile_onnx, compile_prims, compiled_graphs, load
from .cost.target import Target
from .errors import (InputError, InterpreterWarning, ModelLoadError, PackageError, TargetAbsentError,
                     TilefuseError, UnsupportedAttribute, UnsupportedOperator)
from .log import from_environment as _logs_from_environment, set_logs
from .minifier import MinifyError, minify
from .report.report import Report
from .runtime.compiled import CompiledModel
from .runtime.dynamic import DynamicModel
from .verify import VerifyError

__version__ = "0.1.0"

_logs_from_environment()

__all__ = ["compile", "compile_onnx", "compile_prims", "compiled_graphs", "load", "PackageError", "minify", "MinifyError", "VerifyError", "set_logs", "CompiledModel", "DynamicModel", "Report", "TilefuseError", "UnsupportedOperator",
           "UnsupportedAttribute", "ModelLoadError", "InputError", "InterpreterWarning", "TargetAbsentError", "Target", "__version__"]
