"""Every generated kernel of the zoo's GPU plans compiles natively (issue #22, item 4): for sm_90
from the h100 plans and sm_80 from the a100 plans, with no compile failure, no spill, shared
memory a block may have, and every
dot loop software-pipelined (cp.async or TMA in the binary); dot kernels whose tile has 64 rows
per warpgroup run on wgmma on sm_90, and the cost model's tensor-core rule says the same of every
kernel; on sm_90 and sm_80 (where the register model is fitted: warpgroup MMA, and warp-level
MMA's fragments) the model's registers per thread land within ±25% of the binary's for a share
``REGISTERS_WITHIN`` of the kernels, and on sm_90 never under half of them.  A failure names the kernel and
the rule.  One layer of BERT at hidden 256 and seq 128 by default; the zoo's models with --runslow."""
import pytest
import torch

import tilefuse
from tilefuse import zoo
from tilefuse.codegen.kernel import Dot, Loop
from tilefuse.cost.dot import tensor_cores, wgmma
from tilefuse.cost.target import Target

DEFAULT = [("bert", "h100")]
SLOW = [(m, t) for m in ("bert", "gpt2", "llama", "vit", "resnet") for t in ("h100", "a100") if (m, t) not in DEFAULT]


def _dots(kernel, body, looped=False):
    """(Dot, whether a loop of more than one trip runs it) for every Dot of a statement list."""
    for st in body:
        if isinstance(st, Dot):
            yield st, looped
        elif isinstance(st, Loop):
            yield from _dots(kernel, st.body, looped or kernel.axis(st.axis).chunks > 1)
        elif hasattr(st, "body"):
            yield from _dots(kernel, st.body, looped)


# The register model (cost/work.py: DOT_REGISTER_BASE, OPERAND_REGISTERS, EPILOGUE_REGISTERS,
# LIVE_SHARE) is fitted to the bench plans' and the zoo's sm_90 binaries (bench/README.md,
# "native.py": 94% of the bench plans' kernels within ±25%); it does not reach every kernel: ptxas
# spends registers freely where they are plentiful, which no tile-level count predicts, most of all
# in small models (one BERT layer at hidden 256: 5 of 7; the zoo's small h100 plans: 58 of 85,
# LLaMA's 9 of 22).  These floors catch a model that drifts further.
REGISTERS_WITHIN = {"default": 0.6, "zoo": 0.3}

# Known breaks of issue #22's rules (strict: the test fails when one is fixed, to be struck here)
KNOWN = {("vit", "h100"): "its MLP chains (GEMM -> GELU -> GEMM, 16 rows, mma.sync) hold 83-84 registers against "
                          "40-41 modelled: GELU's erf, computed over a thread's share of the second product's "
                          "operand before it, holds 4-5 registers a value (ReLU, exp or tanh there: 40-46, as "
                          "modelled); no spills",
         ("resnet", "h100"): "the stem convolution gathers the model's NCHW input (3 channels): no async copies",
         ("resnet", "a100"): "the stem convolution gathers the model's NCHW input (3 channels): no async copies"}


# fp32 models' known breaks (their dots run off the tensor cores, on FMA)
FMA_CHAIN = ("attention chains on FMA dots hold 2-4x the registers the model counts (156 against 65, 212 "
             "against 56: the register model counts a tensor-core dot's operands, streamed through shared memory; "
             "an FMA dot keeps slices of its operands in registers); no spills")
KNOWN_FP32 = {("bert", "h100"): FMA_CHAIN, ("llama", "h100"): FMA_CHAIN}


def _param(m, t, dtype=torch.float16):
    why = (KNOWN if dtype == torch.float16 else KNOWN_FP32).get((m, t))
    marks = [pytest.mark.slow] + ([pytest.mark.xfail(strict=True, reason=why)] if why else [])
    return pytest.param(m, t, dtype, marks=marks, id=f"{m}-{t}" + ("-fp32" if dtype == torch.float32 else ""))


# fp16 plans, and under --runslow fp32 ones too (their dots run off the tensor cores: FMA)
CASES = ([pytest.param(m, t, torch.float16, id=f"{m}-{t}") for m, t in DEFAULT] + [_param(m, t) for m, t in SLOW]
         + [_param(m, "h100", torch.float32) for m in ("bert", "llama", "resnet")])


@pytest.mark.parametrize("model,target,dtype", CASES)
def test_the_plans_kernels_compile_natively_without_spills_and_pipelined(model, target, dtype, tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path))
    if (model, target) in DEFAULT and dtype == torch.float16:      # one layer of the small BERT (hidden 256, seq 128): its kernels
        import transformers             # are every layer's
        cfg = transformers.BertConfig(vocab_size=512, hidden_size=256, num_hidden_layers=1, num_attention_heads=4,
                                      intermediate_size=1024, attn_implementation="sdpa")
        torch.manual_seed(0)
        m, args = transformers.BertModel(cfg).eval(), (torch.randint(0, 512, (1, 128)),)
        m = m.half()
    else:
        size = "small" if model in ("bert", "gpt2", "llama") else "tiny"
        m, inputs = zoo.build(model, size)
        args = tuple(a.to(dtype) if a.is_floating_point() else a for a in inputs[0])
    with torch.no_grad():
        cm = tilefuse.compile(m.to(dtype), args, target=target)
    rows = cm.native()                  # (a layer's kernels, the next layer's by another name: compiled once)
    tgt = Target.get(target)
    assert rows, "no generated kernel"
    broken, close = [], 0
    for r in rows:
        b = r.binary
        ratio = b.registers / r.model.regs_per_thread
        close += 0.75 <= 1 / ratio <= 1.25          # the model within ±25% of the binary (issue #22's words)
        if ratio > 2 and tgt.arch == 90:
            broken.append(f"{b.kernel}: {b.registers} registers, more than twice the model's {r.model.regs_per_thread}")
        kernel = next(k for built in cm.kernels for k in built.kernels if k.name == b.kernel)
        dots = list(_dots(kernel, kernel.body))
        if b.spills:
            broken.append(f"{b.kernel}: spills {b.spill_bytes} B per thread ({b.registers} registers)")
        if b.shared_bytes > tgt.smem_per_block:
            broken.append(f"{b.kernel}: {b.shared_bytes} B of shared memory, more than a block may have "
                          f"({tgt.smem_per_block}): it cannot launch")
        looped = any(lp or kernel.axis(d.k).chunks > 1 for d, lp in dots)
        if looped and not b.pipelined:
            broken.append(f"{b.kernel}: its dot loop is not pipelined (num_stages {kernel.num_stages})")
        if dots and tgt.arch == 90 and tensor_cores(dots[0][0].in_dtype, tgt):
            bm = kernel.axis(dots[0][0].m).block
            if (b.mma == "wgmma") != wgmma(bm, kernel.num_warps, tgt):
                broken.append(f"{b.kernel}: {b.mma} on sm_90 for BM={bm} at {kernel.num_warps} warps, "
                              f"the cost model says {'wgmma' if wgmma(bm, kernel.num_warps, tgt) else 'mma.sync'}")
    within = REGISTERS_WITHIN["default" if (model, target) in DEFAULT else "zoo"]
    if tgt.arch in (80, 90) and close < within * len(rows):
        broken.append(f"registers within ±25% of the model for {close} of {len(rows)} kernels")
    assert not broken, "\n".join(broken)


def test_fp32_dots_read_their_operands_without_tensor_descriptors_and_do_not_spill(tmp_path, monkeypatch):
    """An fp32 model's GEMMs run off the tensor cores (IEEE fp32: FMA); a tile read through a tensor
    descriptor would be pulled from shared memory into registers (sm_90: 255 registers and
    spills at 16x16x128, 40 with plain loads), so fp32 dots load their operands plainly."""
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down, self.norm = torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256), torch.nn.LayerNorm(256)

        def forward(self, x):
            return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))
    torch.manual_seed(0)
    cm = tilefuse.compile(Block().eval(), (torch.randn(1, 16, 256),), target="h100", time_limit=2.0)
    rows = cm.native()
    assert [r.family for r in rows].count("gemm") == 2
    for r in rows:
        assert not r.binary.spills and r.binary.mma == "none" and r.binary.tma_loads == 0, r.binary
