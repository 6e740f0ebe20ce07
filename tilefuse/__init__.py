"""tilefuse: optimal kernel orchestration and Triton code generation for DL inference."""
from .api import compile, compile_onnx
from .cost.target import Target
from .errors import (InputError, ModelLoadError, TargetAbsentError, TilefuseError, UnsupportedAttribute,
                     UnsupportedOperator)
from .report.report import Report
from .runtime.compiled import CompiledModel

__version__ = "0.1.0"

__all__ = ["compile", "compile_onnx", "CompiledModel", "Report", "TilefuseError", "UnsupportedOperator",
           "UnsupportedAttribute", "ModelLoadError", "InputError", "TargetAbsentError", "Target", "__version__"]
