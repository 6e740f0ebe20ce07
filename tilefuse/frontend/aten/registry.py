"""The converter table (``CONVERTERS``), the ATen ops kept whole, and the ops that emit nothing."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import torch

from .emitter import Emitter


aten = torch.ops.aten

# Composite ops kept whole when decomposing (see the package docstring).
KEEP_WHOLE = (
    aten.scaled_dot_product_attention.default, aten.linear.default, aten.matmul.default,
    # what torch.compile's trace on a CPU makes of the one above: kept whole, as the GPU's fused
    # kernels are (decomposed, it is a math path of fp32 casts no GPU trace has)
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten.einsum.default, aten.silu.default, aten.hardswish.default, aten.hardsigmoid.default,
    aten.mish.default, aten.softplus.default, aten.rms_norm.default, aten.adaptive_avg_pool2d.default,
    aten.adaptive_avg_pool1d.default, aten.tril.default, aten.triu.default,
    # a SliceScatter (index arithmetic) instead of a Where through a constant mask:
    aten.select_scatter.default,
    # Resize and Pad(reflect/edge) instead of gathers through computed index tensors:
    *(getattr(aten, f"{name}{nd}").vec for nd in ("1d", "2d", "3d")
      for name in ("upsample_nearest", "_upsample_nearest_exact")),
    aten.upsample_linear1d.vec, aten.upsample_bilinear2d.vec, aten.upsample_trilinear3d.vec,
    aten.upsample_bicubic2d.vec,
    *(getattr(aten, f"{name}{nd}").default for nd in ("1d", "2d", "3d")
      for name in ("reflection_pad", "replication_pad")),
)


Converter = Callable[[Emitter, SimpleNamespace], object]
CONVERTERS: dict[str, Converter] = {}


def converts(*names: str):
    """Register a converter for ATen overloads named like ``"aten.add.Tensor"``."""
    def deco(fn: Converter) -> Converter:
        for n in names:
            if n in CONVERTERS:
                raise RuntimeError(f"two converters for {n}")
            CONVERTERS[n] = fn
        return fn
    return deco


# Ops that only check things at trace time; they produce nothing.
NO_OPS = frozenset({
    "aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten._assert_async.msg",
    "aten.sym_constrain_range_for_size.default", "aten.sym_constrain_range.default",
    "aten._assert_async.default", "aten._functional_assert_async.msg",
})
