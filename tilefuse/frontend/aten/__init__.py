"""ATen -> canonical operators (docs/canonical-ops.md): a table of converters, one per ATen overload.

A converter receives the ``Emitter`` and the ATen node's arguments bound by name from the
overload's schema (``a.self``, ``a.dim``, ...): tensors as value names (``str``), everything else
as the Python value.  A scalar may stand where the schema says Tensor (``add.Tensor(x, 2)``).  The
converter emits canonical nodes with ``em.op`` and returns the value name(s) of the result (a tuple
for ATen ops with several outputs, ``None`` for an output nobody uses).

``KEEP_WHOLE`` lists the ATen ops kept out of the decomposition table because a canonical node
says more than their decomposition (attention, linear, matmul, activations, norms).

One module per operator family registers its converters in ``registry.CONVERTERS`` with
``@converts``; importing this package imports them all.
"""
from __future__ import annotations

import importlib

from .emitter import Emitter, bind, op_name, tensor_type
from .registry import AS_WRITTEN, CONVERTERS, KEEP_WHOLE, NO_OPS, Converter, converts

FAMILIES = ("elementwise", "layout", "linear", "conv", "norm", "reduce", "pool", "indirect", "scatter", "signal", "attention",
            "collective")

for _family in FAMILIES:
    importlib.import_module(f"{__name__}.{_family}")

__all__ = ["AS_WRITTEN", "CONVERTERS", "KEEP_WHOLE", "NO_OPS", "Converter", "Emitter", "FAMILIES", "bind", "converts", "op_name",
           "tensor_type"]
