"""Tensor element types and tensor types, with conversions to torch, numpy and ONNX."""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import torch


class DType(enum.Enum):
    float64 = "float64"
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"
    int64 = "int64"
    int32 = "int32"
    int16 = "int16"
    int8 = "int8"
    uint8 = "uint8"
    bool = "bool"

    def __repr__(self) -> str:
        return f"dt.{self.value}"

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        return self in _INTS

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    def to_torch(self) -> torch.dtype:
        return _TO_TORCH[self]

    def to_numpy(self) -> np.dtype:
        if self is DType.bfloat16:
            raise TypeError("numpy has no bfloat16; convert through torch")
        return np.dtype(self.value if self is not DType.bool else np.bool_)

    @staticmethod
    def from_torch(dtype: torch.dtype) -> "DType":
        try:
            return _FROM_TORCH[dtype]
        except KeyError:
            raise TypeError(f"unsupported torch dtype {dtype}") from None

    @staticmethod
    def from_numpy(dtype) -> "DType":
        dtype = np.dtype(dtype)
        if dtype == np.bool_:
            return DType.bool
        try:
            return DType(dtype.name)
        except ValueError:
            raise TypeError(f"unsupported numpy dtype {dtype}") from None

    @staticmethod
    def from_onnx(elem_type: int) -> "DType":
        try:
            return _FROM_ONNX[elem_type]
        except KeyError:
            raise TypeError(f"unsupported ONNX element type {elem_type}") from None

    def to_onnx(self) -> int:
        return _TO_ONNX[self]


_FLOATS = {DType.float64, DType.float32, DType.float16, DType.bfloat16}
_INTS = {DType.int64, DType.int32, DType.int16, DType.int8, DType.uint8}
_ITEMSIZE = {DType.float64: 8, DType.float32: 4, DType.float16: 2, DType.bfloat16: 2, DType.int64: 8,
             DType.int32: 4, DType.int16: 2, DType.int8: 1, DType.uint8: 1, DType.bool: 1}
_TO_TORCH = {DType.float64: torch.float64, DType.float32: torch.float32, DType.float16: torch.float16,
             DType.bfloat16: torch.bfloat16, DType.int64: torch.int64, DType.int32: torch.int32,
             DType.int16: torch.int16, DType.int8: torch.int8, DType.uint8: torch.uint8, DType.bool: torch.bool}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}
# onnx.TensorProto.DataType numbers (stable across onnx versions).
_TO_ONNX = {DType.float32: 1, DType.uint8: 2, DType.int8: 3, DType.int16: 5, DType.int32: 6, DType.int64: 7,
            DType.bool: 9, DType.float16: 10, DType.float64: 11, DType.bfloat16: 16}
_FROM_ONNX = {v: k for k, v in _TO_ONNX.items()}


def promote(a: DType, b: DType) -> DType:
    """Result type of a binary op on a and b (torch's rules for tensors of equal rank)."""
    return DType.from_torch(torch.promote_types(a.to_torch(), b.to_torch()))


@dataclass(frozen=True, slots=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self):
        if not all(isinstance(d, int) and d >= 0 for d in self.shape):
            raise ValueError(f"shape must be non-negative ints, got {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.value}[{', '.join(map(str, self.shape))}]"
