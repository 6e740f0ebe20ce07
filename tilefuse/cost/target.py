"""Hardware targets as data.

Every figure names its source.  Vendor figures are the published specifications (dense, i.e.
without structured sparsity).  Figures no vendor publishes (achievable DRAM fraction, latencies,
L2 bandwidth, launch overheads, per-program cost) come from published measurements, cited, and are
checked by the calibration table (``tests/test_calibration.py``, docs/cost-model.md).  On a GPU,
``cost/measure.py`` replaces modelled kernel times with measured ones.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Mapping

from ..errors import OptionError
from ..ir.dtypes import DType

KiB = 1024
MiB = 1024 * KiB
TB = 1e12
GB = 1e9
TFLOPS = 1e12


@dataclass(frozen=True)
class Target:
    name: str
    sm_count: int
    dram_bw: float                          # bytes/s, peak
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
    launch_s: float                         # per-kernel launch overhead from a Python host (eager)
    launch_graph_s: float                   # per-kernel overhead as a node of a replayed CUDA graph
    clock_hz: float = 1.0e9                 # SM clock under load
    l2_bw: float = 0.0                      # bytes/s, L2 -> SMs (0: same as DRAM)
    l1_bytes: int = 0                       # L1 data cache + shared memory per SM (0: no L1 model)
    dram_efficiency: float = 1.0            # fraction of dram_bw a large streaming copy reaches
    dram_latency_s: float = 0.0             # loaded DRAM round trip: bytes in flight / latency
    l2_latency_s: float = 0.0               # bound the bandwidth a small grid can draw
    program_cycles: float = 0.0             # SM cycles each program costs (dispatch, prologue)
    warp_schedulers: int = 4                # issue slots per SM: a program's warps fill them
    warp_size: int = 32
    transaction_bytes: int = 32             # DRAM sector size: the unit of coalescing
    present: bool = False                   # a device of this kind is attached
    smem_bytes_per_clk: int = 128           # shared-memory bandwidth per SM (feeds the tensor cores)
    warpgroup_mma_rows: int = 0             # rows a warpgroup MMA (Hopper wgmma) needs per 4 warps; 0: none
    legacy_mma_share: float = 1.0           # tensor-core rate of warp-level mma.sync where wgmma exists
    program_s: float = 0.0                  # per program and loop chunk of a generated kernel,
                                            # on targets that interpret them sequentially (cpu)
    arch: int = 0                           # CUDA compute capability (90: sm_90) kernels compile
                                            # for natively; 0: none (the interpreter)
    link_bw: float = 0.0                    # bytes/s one rank sends to the others in a collective
                                            # (per direction); 0: no interconnect modelled
    link_latency_s: float = 0.0             # a collective's fixed cost over the link
    dot_step_s: float = 0.0                 # a tensor-core product step's least time in one program
    dot_program_s: float = 0.0              # a tensor-core program's fixed latency beyond its
                                            # bytes and flops (both: cost/model.estimate)
    two_stage_k_s: float = 0.0              # a tensor-core K loop at two pipeline stages: its
                                            # chunks' products wait this long per K position

    def __hash__(self) -> int:
        # by value, the mappings as their sorted items: caches are keyed by what a target is
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(tuple(tuple(sorted(v.items())) if isinstance(v, Mapping) else v
                           for v in (getattr(self, f.name) for f in fields(self))))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def device(self) -> str:
        """The torch device type plans for this target run on."""
        return "cpu" if self.name == "cpu" else "cuda"

    @property
    def dram_rate(self) -> float:
        """Achievable DRAM bandwidth of a large streaming kernel (bytes/s)."""
        return self.dram_bw * self.dram_efficiency

    @property
    def l2_rate(self) -> float:
        return self.l2_bw or self.dram_rate

    def launch(self, cuda_graph: bool) -> float:
        """Launch overhead of one kernel, as the plan will run: eager or inside a CUDA graph."""
        return self.launch_graph_s if cuda_graph else self.launch_s

    def peak(self, dtype: DType, tensor_cores: bool) -> float:
        """Peak FLOP/s for arithmetic in dtype (falls back to CUDA cores when no tensor-core figure)."""
        key = dtype.value
        if tensor_cores and key in self.peak_tensor:
            return self.peak_tensor[key]
        return self.peak_simt.get(key, self.peak_simt["float32"])

    def has_tensor_cores(self, dtype: DType) -> bool:
        return dtype.value in self.peak_tensor

    def __reduce__(self):
        # (pickled in a saved model: plain dicts for the read-only tables; whether the device is
        # attached is the loading machine's question)
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values = {k: dict(v) if isinstance(v, MappingProxyType) else v for k, v in values.items()}
        return _unpickled, (values | {"present": False},)

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
        if not isinstance(name, str):
            raise OptionError(f"target must be a name or a Target, got {type(name).__name__}")
        if name.lower() == "auto":
            return Target.detect()
        try:
            return PRESETS[name.lower()]
        except KeyError:
            raise OptionError(f"unknown target {name!r}; choose one of {sorted(PRESETS)} or 'auto'") from None

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
                       present=True, arch=props.major * 10 + props.minor)


def _unpickled(values: dict) -> Target:
    return Target(**{k: _ro(v) if isinstance(v, dict) else v for k, v in values.items()})


def _ro(d: dict) -> Mapping[str, float]:
    return MappingProxyType(d)


# NVIDIA H100 SXM5.  [1] "NVIDIA H100 Tensor Core GPU" datasheet and Hopper architecture
# whitepaper: 132 SMs, 3.35 TB/s HBM3, FP32 67 TFLOPS, FP16 on CUDA cores 133.8 TFLOPS,
# TF32 494.7 / FP16, BF16 989.4 / INT8 1978.9 TFLOPS dense tensor core, 228 KB shared memory per SM
# (227 KB per block), 64K registers per SM, 2048 threads and 32 blocks per SM, 50 MB L2, 1.98 GHz
# max boost (1.755 GHz on the PCIe card).  [2] Chips and Cheese, "Nvidia's H100: Funny L2, and Tons
# of Bandwidth" (2023): L2 bandwidth several times DRAM's (about 5.5 TB/s on the PCIe card's 114
# SMs) and loaded memory latencies of a few hundred ns.  [3] Measured device-to-device copies reach
# about 90% of the HBM peak (issue #8's calibration figure; H200: 4.3 of 4.8 TB/s).  [4] Kernel
# launch from Python 2-5 us; about 1 us per kernel node inside a CUDA graph (PyTorch CUDA-graph
# documentation and Souffle's ~2 us per launch on A100).  [5] program_cycles: not published;
# the cost of dispatching a program and running its prologue, an assumption to be replaced by
# measurement.  [6] L2 bandwidth is not published; [2] measured ~5.5 TB/s on the PCIe card (114
# SMs, power-limited clock), and an 8192³ GEMM at the recorded ~790 TFLOP/s with 256x128 tiles
# moves 12.9 GB from L2 to the SMs in 1.39 ms, so the SXM part sustains at least ~9.3 TB/s.
# [7] CUDA C++ Programming Guide, compute capability 8.x/9.x: shared memory has 32 banks of 4 bytes,
# 128 bytes per clock per SM.  [8] Hopper tuning guide: warpgroup MMA (wgmma) runs on 4 warps with
# a 64-row tile per warpgroup; warp-level mma.sync remains available.  Its share of the wgmma rate
# is an assumption from FlashAttention-2 (mma.sync, ~350 TFLOP/s fp16 forward on H100) against
# FlashAttention-3 (wgmma, ~740): about half; to be replaced by measurement.  [9] H100 SXM
# datasheet: NVLink 4 at 900 GB/s per GPU, both directions together (18 links x 25 GB/s each way);
# a collective's fixed cost (NCCL's small-message latency, ~10 us within a node) is an assumption.
# [10] MEASURED on an H200 (same SMs and clocks; Triton 3.6; 2026-11-28): BERT-small's persistent
# kernel traced (each task's GPU clock; bench/results/gpu_h200_2026-11-28/gpu_models_small.json):
# its tensor-core tasks ran 2.0-4.1 us longer than modelled, their bytes and flops a fraction of
# that; least squares over its five kinds of dot task (2-9 product steps): 2.1 us a program plus
# 0.3 us a step, each task then within 15% (docs/cost-model.md).  One model's trace: a lead.
# [11] MEASURED on the H200 (Triton 3.6; 2026-11-28, the fourth GPU session;
# bench/results/gpu_h200_2026-11-28_s24/gpu_kernels*.json): the same GEMM tile at two pipeline
# stages against three, TMA and warpgroup MMA, K looped 22-64 times: 4096^3 at 128x256x64
# 284.6 us against 193.9, 2048^3 44.7 against 33.5, 512x5632x2048 at 128x128x64 44.6 against 33.3;
# 0.34 us more a chunk of BK 64 and 0.65 of BK 128 (BN 128 and 256 alike): 5.3 ns per K position
# of a chunk; the four same-tile pairs' ratios (1.32-1.47) then modelled within 8% each
# (docs/cost-model.md; tests/test_calibration.py).
H100 = Target(
    name="h100", sm_count=132, dram_bw=3.35 * TB,
    peak_simt=_ro({"float32": 67 * TFLOPS, "float16": 133.8 * TFLOPS, "bfloat16": 133.8 * TFLOPS,
                   "float64": 34 * TFLOPS}),
    peak_tensor=_ro({"float16": 989.4 * TFLOPS, "bfloat16": 989.4 * TFLOPS, "float32": 494.7 * TFLOPS,
                     "float64": 67 * TFLOPS, "int8": 1978.9 * TFLOPS}),
    smem_per_sm=228 * KiB, smem_per_block=227 * KiB, regs_per_sm=65536, regs_per_block=65536,
    max_threads_per_block=1024, max_threads_per_sm=2048, max_blocks_per_sm=32, l2_bytes=50 * MiB,
    launch_s=4.0e-6, launch_graph_s=1.0e-6,
    clock_hz=1.755e9,                        # [1], [2]: sustained clock under load
    l1_bytes=256 * KiB,                      # [1]: 256 KB combined L1 data cache / shared memory per SM
    l2_bw=10 * TB,                           # [2], [6]
    dram_efficiency=0.9,                     # [3]
    dram_latency_s=0.6e-6, l2_latency_s=0.25e-6,   # [2], loaded latencies (Little's law)
    program_cycles=16,                       # [5]
    warpgroup_mma_rows=64, legacy_mma_share=0.5,   # [8]
    arch=90,
    link_bw=450 * GB, link_latency_s=10e-6,  # [9]
    dot_step_s=0.3e-6, dot_program_s=2.1e-6,   # [10]
    two_stage_k_s=5.3e-9,                    # [11]
)

# NVIDIA H200 SXM: "NVIDIA H200 Tensor Core GPU" datasheet: the H100 SXM compute (same GH100 SMs and
# clocks) with 141 GB HBM3e at 4.8 TB/s; a device-to-device copy measures about 4.3 TB/s [3].
H200 = replace(H100, name="h200", dram_bw=4.8 * TB)

# NVIDIA A100 SXM4 80GB: "NVIDIA A100 Tensor Core GPU" datasheet and Ampere whitepaper
# (108 SMs, 2.039 TB/s HBM2e, FP32 19.5 TFLOPS, TF32 156 / FP16, BF16 312 TFLOPS dense tensor core,
# FP16 on CUDA cores 78 TFLOPS, 164 KB shared memory per SM with 163 KB per block, 40 MB L2,
# 1.41 GHz boost, L2 "2.3x V100's": about 5120 B/clk, 7.2 TB/s at 1.41 GHz); latencies as H100 [2].
A100 = Target(
    name="a100", sm_count=108, dram_bw=2.039 * TB,
    peak_simt=_ro({"float32": 19.5 * TFLOPS, "float16": 78 * TFLOPS, "bfloat16": 39 * TFLOPS,
                   "float64": 9.7 * TFLOPS}),
    peak_tensor=_ro({"float16": 312 * TFLOPS, "bfloat16": 312 * TFLOPS, "float32": 156 * TFLOPS,
                     "float64": 19.5 * TFLOPS, "int8": 624 * TFLOPS}),
    smem_per_sm=164 * KiB, smem_per_block=163 * KiB, regs_per_sm=65536, regs_per_block=65536,
    max_threads_per_block=1024, max_threads_per_sm=2048, max_blocks_per_sm=32, l2_bytes=40 * MiB,
    launch_s=4.0e-6, launch_graph_s=1.0e-6,
    clock_hz=1.41e9, l2_bw=7.2 * TB, l1_bytes=192 * KiB, dram_efficiency=0.9, dram_latency_s=0.6e-6, l2_latency_s=0.25e-6,
    program_cycles=16, arch=80,
    link_bw=300 * GB, link_latency_s=10e-6,  # NVLink 3: 12 links x 25 GB/s per direction; latency as [9]
)

# The Triton interpreter on a CPU host (for tests): not a GPU; numbers are of the right order for a
# 2-core machine interpreting kernels, so that plans made for it are sensible, not to predict time.
# The interpreter runs programs and each program's loop chunks one after another in Python:
# ``program_s`` per program and chunk dominates (a 1280-row kernel of 1-row programs took 6.7 s).
CPU = Target(
    name="cpu", sm_count=2, dram_bw=10e9,
    peak_simt=_ro({"float32": 20e9, "float16": 5e9, "bfloat16": 5e9, "float64": 10e9}),
    peak_tensor=_ro({}),
    smem_per_sm=1 * MiB, smem_per_block=1 * MiB, regs_per_sm=1 << 20, regs_per_block=1 << 20,
    max_threads_per_block=1024, max_threads_per_sm=2048, max_blocks_per_sm=32, l2_bytes=32 * MiB,
    launch_s=200e-6, launch_graph_s=200e-6, program_s=1e-3,
    link_bw=1 * GB, link_latency_s=100e-6,   # gloo over loopback TCP: the order of it, not a measurement
)

PRESETS: Mapping[str, Target] = MappingProxyType({t.name: t for t in (H100, H200, A100, CPU)})
