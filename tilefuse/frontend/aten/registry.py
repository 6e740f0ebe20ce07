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


# Ops torch's decomposition would rewrite (CompositeImplicitAutograd, or in its table) that the
# converters take as written, into the canonical nodes their decomposition converts to: an exported
# graph of these and the frontend's opset alone skips torch's ``run_decompositions`` (a fixed
# ~0.3 s a call; ``frontend/torch.decomposed_already``).  ``tests/test_torch_frontend.py`` checks
# each gives the canonical graph the decomposed one does.
AS_WRITTEN = frozenset({
    "aten.transpose.int", "aten.t.default", "aten.reshape.default", "aten.flatten.using_ints",
    "aten.unflatten.int", "aten.contiguous.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
    "aten.type_as.default", "aten.dropout.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.unbind.int",
    "aten.chunk.default", "aten.narrow.default", "aten.split.Tensor", "aten.expand_as.default",
    "aten.softmax.int", "aten.log_softmax.int", "aten.layer_norm.default", "aten.batch_norm.default",
    "aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default",
})


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
