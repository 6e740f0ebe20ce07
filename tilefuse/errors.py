"""User-facing errors: one clear line naming the operator/node and what to do."""
from __future__ import annotations


class TilefuseError(Exception):
    """Base class of errors meant for users (the CLI prints them without a traceback)."""


def _where(node) -> str:
    loc = getattr(node, "location", None)
    s = f"{node.op} (node '{node.name}'"
    return s + (f" at {loc})" if loc else ")")


class UnsupportedOperator(TilefuseError):
    def __init__(self, node, detail: str = ""):
        self.node = node
        self.op = node.op
        msg = f"unsupported operator {_where(node)}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg + ". Rewrite or remove the operator, or open an issue with the model.")


class UnsupportedAttribute(TilefuseError):
    def __init__(self, node, attr: str, value, detail: str = ""):
        self.node, self.op, self.attr = node, node.op, attr
        msg = f"unsupported attribute {attr}={value!r} of {_where(node)}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)


class ModelLoadError(TilefuseError):
    """The model file or object could not be read (missing, truncated, malformed)."""


class OptionError(TilefuseError, ValueError):
    """A compile option of the wrong type or out of range (names the option and what it takes)."""


class InputError(TilefuseError):
    """An input given at call time does not match what the model was compiled for."""


class FissionError(TilefuseError):
    """A fission rule produced something inconsistent with the operator's declared type (a bug)."""

    def __init__(self, node, detail: str):
        self.node = node
        super().__init__(f"internal error while splitting {_where(node)}: {detail}")


class PackageError(TilefuseError):
    """A saved model (``tilefuse.load``) that cannot be used here: another version built it, it is
    for another GPU, or the file is not a package."""


class TargetAbsentError(TilefuseError):
    """The model was compiled for a GPU that is not attached to this machine."""


class InterpreterWarning(UserWarning):
    """Kernels will run in Triton's interpreter on this CPU (no GPU here): results are checked,
    not fast.  Shown once per process."""
