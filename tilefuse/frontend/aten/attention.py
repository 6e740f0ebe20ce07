"""ATen converters: scaled dot-product attention."""
from __future__ import annotations

from .emitter import Emitter
from .registry import converts


def _sdpa(em: Emitter, q, k, v, mask, dropout_p, is_causal, scale, enable_gqa=False) -> str:
    if dropout_p:
        raise em.bad_attr("dropout_p", dropout_p, "attention dropout (inference only: call model.eval())")
    attrs = {"is_causal": int(bool(is_causal)), "enable_gqa": int(bool(enable_gqa))}
    if scale is not None:
        attrs["scale"] = float(scale)
    return em.op("ScaledDotProductAttention", [q, k, v, mask] if mask is not None else [q, k, v], attrs,
                 em.out_type(0))


@converts("aten.scaled_dot_product_attention.default")
def _sdpa_default(em, a):
    return _sdpa(em, a.query, a.key, a.value, a.attn_mask, a.dropout_p, a.is_causal, a.scale, a.enable_gqa)


@converts("aten._scaled_dot_product_flash_attention_for_cpu.default",
          "aten._scaled_dot_product_flash_attention.default",
          "aten._scaled_dot_product_efficient_attention.default",
          "aten._scaled_dot_product_cudnn_attention.default")
def _sdpa_fused(em, a):
    if em.used_outputs() - {0}:
        raise em.unsupported("only the attention output is supported (not logsumexp or debug outputs)")
    mask = getattr(a, "attn_mask", None)
    if mask is None:
        mask = getattr(a, "attn_bias", None)
    n = len(em.fx.meta["val"])
    # the CPU's fused kernel takes grouped-query key/value heads as they are (no enable_gqa flag)
    gqa = em.rank(a.query) >= 3 and em.shape(a.query)[-3] != em.shape(a.key)[-3]
    return (_sdpa(em, a.query, a.key, a.value, mask, a.dropout_p, a.is_causal, a.scale, gqa),) + (None,) * (n - 1)
