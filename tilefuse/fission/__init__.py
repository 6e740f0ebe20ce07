"""Operator fission: one module per operator family registers its rules in ``registry.RULES``."""
from __future__ import annotations

import importlib

from .registry import RULES, Fission, TensorRef, fission, rule

FAMILIES = ("elementwise", "reduce", "norm", "linear", "conv", "quantize", "signal", "sample", "recurrent", "pool",
            "layout", "indirect", "scatter", "attention", "opaque", "collective")


def load_rules() -> None:
    for fam in FAMILIES:
        importlib.import_module(f"{__name__}.{fam}")


__all__ = ["RULES", "Fission", "TensorRef", "fission", "rule", "load_rules", "FAMILIES"]
