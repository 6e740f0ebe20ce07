"""Registers of one-pass fused kernels: the sm_90 binary against the cost model, no GPU.

    python bench/fused_registers.py [--json bench/results/fused_registers_h100.json]

Each case is a small function of the kinds a plan fuses without a tensor-core product (rows:
RMSNorm, LayerNorm, softmax; reductions: split-K partial sums, row and column sums, spatial
means; windows: padded max pools, a pool after BatchNorm + ReLU, an unpadded average pool, a
depthwise convolution; elementwise; a transpose; long rows: argmax, log-softmax).  It is planned
for ``h100`` (fp16; the plan is MODELLED), and every generated kernel without a Dot is compiled
natively for sm_90 on this machine (registers FROM THE COMPILED BINARY, Triton's bundled
cuobjdump) beside the model's registers per thread (``cost/work.py``).  Nothing is measured on a GPU.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path


def cases():
    import torch
    import torch.nn.functional as F
    h = torch.float16

    def r(*s):
        return torch.randn(*s, dtype=h)

    def rms(x, w):
        return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).half() * w

    def partial_sums(p, res):
        return (p.float().sum(0) + res.float()).half()

    return {
        "partial_sums 4x512x2048": (partial_sums, (r(4, 512, 2048), r(512, 2048))),
        "partial_sums 4x128x768": (partial_sums, (r(4, 128, 768), r(128, 768))),
        "partial_sums 8x64x4096": (lambda p: p.float().sum(0).half(), (r(8, 64, 4096),)),
        "rmsnorm 512x2048": (rms, (r(512, 2048), r(2048))),
        "rmsnorm 64x4096": (rms, (r(64, 4096), r(4096))),
        "layernorm 128x768": (lambda x, w, b: F.layer_norm(x, (768,), w, b), (r(128, 768), r(768), r(768))),
        "add_layernorm 128x1024": (lambda x, y, w, b: F.layer_norm(x + y, (1024,), w, b),
                                   (r(128, 1024), r(128, 1024), r(1024), r(1024))),
        "softmax 256x1024": (lambda x: torch.softmax(x, -1), (r(256, 1024),)),
        "softmax 12x128x128": (lambda x: torch.softmax(x, -1), (r(12, 128, 128),)),
        "row_sum 512x2048": (lambda x: x.float().sum(-1), (r(512, 2048),)),
        "column_sum 512x2048": (lambda x: x.float().sum(0), (r(512, 2048),)),
        "spatial_mean 512x7x7": (lambda x: x.mean((2, 3)), (r(1, 512, 7, 7),)),
        "bn_relu_spatial_mean 1280x7x7": (lambda x, s, b: F.relu(x * s + b).mean((2, 3)),
                                          (r(1, 1280, 7, 7), r(1, 1280, 1, 1), r(1, 1280, 1, 1))),
        "max_pool 3x3/2 pad 1, 64x112x112": (lambda x: F.max_pool2d(x, 3, 2, 1), (r(1, 64, 112, 112),)),
        "max_pool 3x3/2 pad 1, 64x56x56": (lambda x: F.max_pool2d(x, 3, 2, 1), (r(1, 64, 56, 56),)),
        "bn_relu_max_pool 64x112x112": (lambda x, s, b: F.max_pool2d(F.relu(x * s + b), 3, 2, 1),
                                        (r(1, 64, 112, 112), r(1, 64, 1, 1), r(1, 64, 1, 1))),
        "avg_pool 2x2, 128x56x56": (lambda x: F.avg_pool2d(x, 2), (r(1, 128, 56, 56),)),
        "depthwise 3x3 pad 1, 32x28x28": (lambda x, w: F.conv2d(x, w, padding=1, groups=32),
                                          (r(1, 32, 28, 28), r(32, 1, 3, 3))),
        "gelu 128x3072": (F.gelu, (r(128, 3072),)),
        "silu_mul 512x5632": (lambda x, y: F.silu(x) * y, (r(512, 5632), r(512, 5632))),
        "add_relu 256x56x56": (lambda x, y: F.relu(x + y), (r(1, 256, 56, 56), r(1, 256, 56, 56))),
        "transpose 12x128x64": (lambda x: x.transpose(1, 2).contiguous(), (r(12, 128, 64),)),
        "argmax 128x32000": (lambda x: x.argmax(-1), (r(128, 32000),)),
        "log_softmax 8x32000": (lambda x: torch.log_softmax(x.float(), -1), (r(8, 32000),)),
    }


def run() -> list[dict]:
    import tilefuse
    from native import _has_dot         # bench/native.py (this folder is on the path when run)
    rows = []
    for name, (fn, args) in cases().items():
        cm = tilefuse.compile(fn, args, target="h100")
        kernels = {k.name: k for built in cm.kernels for k in built.kernels}
        for r in cm.native():
            k = kernels[r.binary.kernel]
            if _has_dot(k):
                continue
            ratio = r.model.regs_per_thread / r.binary.registers
            rows.append({"case": name, "kernel": r.binary.kernel, "warps": k.num_warps,
                         "blocks": {a.block_name: a.block for a in k.axes if a.block_name},
                         "registers": r.binary.registers, "model_registers": r.model.regs_per_thread,
                         "model_over_binary": round(ratio, 3), "within_25": 0.75 <= ratio <= 1.25,
                         "spills": r.binary.spills})
            print(f"{name:36s} {r.binary.kernel:34s} binary {r.binary.registers:4d}  model "
                  f"{r.model.regs_per_thread:4d}  {ratio:5.2f}{'' if 0.75 <= ratio <= 1.25 else '  outside ±25%'}",
                  flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    rows = run()
    within = sum(r["within_25"] for r in rows)
    print(f"model registers within ±25% of the binary: {within} of {len(rows)}")
    if a.json:
        write_record(a.json, "registers of one-pass fused kernels, sm_90 binary (compiled here, no GPU) vs the "
                     "cost model", argv, within_25=within, kernels=len(rows), rows=rows)
    return 0


def write_record(path: Path, what: str, argv, **fields) -> None:
    """A register bench's JSON: what it is, the command, date, commit, machine and versions, then
    ``fields`` (shared with ``dot_registers.py``)."""
    import torch
    import triton
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    path.write_text(json.dumps({
        "what": what, "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit, "machine": platform.platform(),
        "versions": {"torch": torch.__version__, "triton": triton.__version__}, **fields}, indent=1))
    print("written", path)


if __name__ == "__main__":
    sys.exit(main())
