"""Hardware targets as data.

Figures are the vendors' published specifications (dense, i.e. without structured sparsity);
each preset cites its source.  Launch overheads are typical measured values for a kernel launch
from a Python host (eager) and for a launch replayed inside a CUDA graph; they are estimates,
and on a GPU ``cost/measure.py`` (later) calibrates them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Mapping

from ..ir.dtypes import DType

KiB = 1024
MiB = 1024 * KiB
TB = 1e12
TFLOPS = 1e12


@dataclass(frozen=True)
class Target:
    name: str
    sm_count: int
    dram_bw: float                          # bytes/s
    peak_simt: Mapping[str, float]          # FLOP/s on CUDA cores, by dtype name
    peak_tensor: Mapping[str, float]        # FLOP/s on tensor cores, by dtype name (absent: none)
    smem_per_sm: int                        # bytes
    smem_per_block: int                     # bytes (max opt-in)
    regs_per_sm: int                        # 32-bit registers
    regs_per_block: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    l2_bytes: int
    launch_s: float                         # per-kernel launch overhead, eager
    launch_graph_s: float                   # per-kernel overhead inside a CUDA graph
    warp_size: int = 32
    transaction_bytes: int = 32             # DRAM sector size: the unit of coalescing
    present: bool = False                   # a device of this kind is attached
    program_s: float = 0.0                  # per program and loop chunk of a generated kernel,
                                            # on targets that interpret them sequentially (cpu)

    @property
    def device(self) -> str:
        """The torch device type plans for this target run on."""
        return "cpu" if self.name == "cpu" else "cuda"

    def peak(self, dtype: DType, tensor_cores: bool) -> float:
        """Peak FLOP/s for arithmetic in dtype (falls back to CUDA cores when no tensor-core figure)."""
        key = dtype.value
        if tensor_cores and key in self.peak_tensor:
            return self.peak_tensor[key]
        return self.peak_simt.get(key, self.peak_simt["float32"])

    def is_present(self) -> bool:
        """A device of this kind is attached (the interpreter target ``cpu`` always is)."""
        if self.present or self.name == "cpu":
            return True
        import torch
        if not torch.cuda.is_available():
            return False
        return self.name.split(":")[0].upper() in torch.cuda.get_device_properties(0).name.upper()

    @staticmethod
    def get(name: str | "Target") -> "Target":
        if isinstance(name, Target):
            return name
        if name == "auto":
            return Target.detect()
        try:
            return PRESETS[name]
        except KeyError:
            raise ValueError(f"unknown target {name!r}; choose one of {sorted(PRESETS)} or 'auto'") from None

    @staticmethod
    def detect() -> "Target":
        """The present CUDA device (nearest preset, with the device's own SM count), else ``cpu``."""
        import torch
        if not torch.cuda.is_available():
            return replace(PRESETS["cpu"], present=True)
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        name = props.name.upper()
        base = next((PRESETS[k] for k in ("h200", "h100", "a100") if k.upper() in name), PRESETS["h100"])
        return replace(base, name=f"{base.name}:{props.name}", sm_count=props.multi_processor_count,
                       present=True)


def _ro(d: dict) -> Mapping[str, float]:
    return MappingProxyType(d)


# NVIDIA H100 SXM5: "NVIDIA H100 Tensor Core GPU" datasheet and Hopper architecture whitepaper
# (132 SMs, 3.35 TB/s HBM3, FP32 67 TFLOPS, TF32 494.7 / FP16, BF16 989.4 TFLOPS dense tensor core,
# 228 KB shared memory per SM with 227 KB usable per block, 64K registers per SM, 50 MB L2).
H100 = Target(
    name="h100", sm_count=132, dram_bw=3.35 * TB,
    peak_simt=_ro({"float32": 67 * TFLOPS, "float16": 133.8 * TFLOPS, "bfloat16": 133.8 * TFLOPS,
                   "float64": 34 * TFLOPS}),
    peak_tensor=_ro({"float16": 989.4 * TFLOPS, "bfloat16": 989.4 * TFLOPS, "float32": 494.7 * TFLOPS,
                     "float64": 67 * TFLOPS, "int8": 1978.9 * TFLOPS}),
    smem_per_sm=228 * KiB, smem_per_block=227 * KiB, regs_per_sm=65536, regs_per_block=65536,
    max_threads_per_block=1024, max_threads_per_sm=2048, max_blocks_per_sm=32, l2_bytes=50 * MiB,
    launch_s=4.0e-6, launch_graph_s=1.0e-6,
)

# NVIDIA H200 SXM: "NVIDIA H200 Tensor Core GPU" datasheet: the H100 SXM compute (same GH100 SMs and
# clocks) with 141 GB HBM3e at 4.8 TB/s.
H200 = replace(H100, name="h200", dram_bw=4.8 * TB)

# NVIDIA A100 SXM4 80GB: "NVIDIA A100 Tensor Core GPU" datasheet and Ampere whitepaper
# (108 SMs, 2.039 TB/s HBM2e, FP32 19.5 TFLOPS, TF32 156 / FP16, BF16 312 TFLOPS dense tensor core,
# FP16 on CUDA cores 78 TFLOPS, 164 KB shared memory per SM with 163 KB per block, 40 MB L2).
A100 = Target(
    name="a100", sm_count=108, dram_bw=2.039 * TB,
    peak_simt=_ro({"float32": 19.5 * TFLOPS, "float16": 78 * TFLOPS, "bfloat16": 39 * TFLOPS,
                   "float64": 9.7 * TFLOPS}),
    peak_tensor=_ro({"float16": 312 * TFLOPS, "bfloat16": 312 * TFLOPS, "float32": 156 * TFLOPS,
                     "float64": 19.5 * TFLOPS, "int8": 624 * TFLOPS}),
    smem_per_sm=164 * KiB, smem_per_block=163 * KiB, regs_per_sm=65536, regs_per_block=65536,
    max_threads_per_block=1024, max_threads_per_sm=2048, max_blocks_per_sm=32, l2_bytes=40 * MiB,
    launch_s=4.0e-6, launch_graph_s=1.0e-6,
)

# The Triton interpreter on a CPU host (for tests): not a GPU; numbers are of the right order for a
# 2-core machine interpreting kernels, so that plans made for it are sensible, not to predict time.
CPU = Target(
    name="cpu", sm_count=2, dram_bw=10e9,
    peak_simt=_ro({"float32": 20e9, "float16": 5e9, "bfloat16": 5e9, "float64": 10e9}),
    peak_tensor=_ro({}),
    smem_per_sm=1 * MiB, smem_per_block=1 * MiB, regs_per_sm=1 << 20, regs_per_block=1 << 20,
    max_threads_per_block=1024, max_threads_per_sm=2048, max_blocks_per_sm=32, l2_bytes=32 * MiB,
    launch_s=200e-6, launch_graph_s=200e-6, program_s=1e-3,
)

PRESETS: Mapping[str, Target] = MappingProxyType({t.name: t for t in (H100, H200, A100, CPU)})
