"""ONNX standard-domain operators tilefuse does not compile, with the reason for each.

The ONNX frontend refuses a node of one of these types (unless it is folded at import time because
its inputs are constants) with this reason; ``scripts/gen_ops_doc.py`` lists them in docs/ops.md;
``tests/test_onnx_unsupported.py`` checks that every operator of the latest ONNX opset is either
supported (a fission rule, folding, normalization, a function body to expand) or listed here.
"""
from __future__ import annotations

_DATA_DEPENDENT = "the output shape depends on the input values (tilefuse compiles static shapes)"
_RANDOM = "random outputs (inference graphs fold them away, or they are test-only)"
_STRINGS = "string tensors are not supported"
_OPTIONAL = "optional values are not tensors (tilefuse graphs take and return tensors)"

UNSUPPORTED: dict[str, str] = {
    "NonZero": _DATA_DEPENDENT,
    "Unique": _DATA_DEPENDENT,
    "NonMaxSuppression": _DATA_DEPENDENT,
    "ImageDecoder": _DATA_DEPENDENT + "; decodes image bytes",
    "MelWeightMatrix": _DATA_DEPENDENT + "; folded at import time when its inputs are constants",
    "Optional": _OPTIONAL,
    "OptionalGetElement": _OPTIONAL,
    "OptionalHasElement": _OPTIONAL,
    "StringConcat": _STRINGS,
    "StringNormalizer": _STRINGS,
    "StringSplit": _STRINGS,
    "RegexFullMatch": _STRINGS,
    "RandomNormal": _RANDOM,
    "RandomNormalLike": _RANDOM,
    "RandomUniform": _RANDOM,
    "RandomUniformLike": _RANDOM,
    "Multinomial": _RANDOM,
    "TfIdfVectorizer": "n-gram counting against a pool: not implemented (text preprocessing)",
}
