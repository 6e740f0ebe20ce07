"""A generated kernel compiled ahead of time for a GPU architecture, on any machine.

Triton compiles for a GPU it does not have: ``triton.compile(ASTSource(...), target=
GPUTarget("cuda", arch, 32))`` runs the whole pipeline down to the cubin, and the ``cuobjdump``
Triton bundles reads the binary's resource usage and its instructions (SASS).  ``compile_native``
does that for a tile-level kernel (``codegen/kernel.py``), printed by the same printer that
builds it to run, bound to its block sizes, warps and stages, with every pointer 16-byte aligned
as the runtime passes them (the memory planner's arena offsets are multiples of 256) and Triton's
launch-time default of fused multiply-adds.  What it returns are facts of the binary, not of a
model: registers, spills, shared memory, the tensor-core path, the width of global loads, async
copies and TMA.  Results are cached by the kernel's content and the compiler's version, beside the
kernel cache, so a plan's kernels are compiled once per machine.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from ...ir.dtypes import DType
from ...paths import cache_root
from ..kernel import TMA_ARCH, Kernel
from .emit import triton_source
from .interpreter import KERNEL_MODULE

# Triton's signature names of pointer element types.
_POINTER = {DType.float64: "*fp64", DType.float32: "*fp32", DType.float16: "*fp16", DType.bfloat16: "*bf16",
            DType.int64: "*i64", DType.int32: "*i32", DType.int16: "*i16", DType.int8: "*i8",
            DType.uint8: "*u8", DType.bool: "*i1"}
_VERSION = 5          # of what is cached: bump when Binary's fields or their reading change
_NAME = "kernel"      # the name every kernel is compiled under (the binary does not depend on it)
TMA_BOX_BYTES = 128   # a TMA box: blocks of 16-byte rows at least (counted as wide as a load can be)
_LOCK = threading.Lock()
_SOURCES: list[Path] = []


class NativeCompileError(RuntimeError):
    """A kernel that Triton cannot compile for the architecture, or a Triton without the NVIDIA
    backend's tools (names the kernel and the architecture)."""


@dataclass(frozen=True)
class Binary:
    """What the compiled kernel is, read off the cubin (per thread where it says so)."""
    kernel: str
    arch: int                      # compute capability, 90 = sm_90
    num_warps: int
    registers: int                 # per thread
    spill_bytes: int               # local memory per thread (stack frame) when the SASS stores
                                   # and loads it (STL, LDL); else 0
    spill_instructions: int        # STL + LDL in the SASS
    shared_bytes: int              # per program: Triton's dynamic allocation
    static_shared: int             # per program: cuobjdump's SHARED (on sm_90 the 1 KiB the
                                   # system reserves per block)
    mma: str                       # "wgmma" (HGMMA), "mma.sync" (HMMA) or "none"
    mma_instructions: int
    loads: dict = field(default_factory=dict)     # global load width in bytes -> LDG instructions
    async_copies: dict = field(default_factory=dict)   # cp.async width in bytes -> LDGSTS instructions
    tma_loads: int = 0             # UTMALDG (bulk tensor copies)
    stores: dict = field(default_factory=dict)    # global store width in bytes -> STG instructions
    prefetches: int = 0            # CCTL.E.PF2: L2 prefetches (a persistent kernel's, for the next phase)
    frame_instructions: int = 0    # STL + LDL of a stack frame that ptxas says holds no spill (registers
                                   # saved across a call to a noinline function: a persistent kernel's phases)
    triton: str = ""               # the compiler's version

    @property
    def spills(self) -> bool:
        return self.spill_instructions > 0

    @property
    def pipelined(self) -> bool:
        """Operands copied asynchronously into shared memory (cp.async or TMA): software-pipelined."""
        return bool(self.async_copies) or self.tma_loads > 0

    def wide_share(self, width: int = 16) -> float:
        """Share of global load instructions (plain, async and TMA) that move ``width`` bytes or
        more; a TMA copy moves a whole box (``TMA_BOX_BYTES``, at least)."""
        n = {TMA_BOX_BYTES: self.tma_loads} if self.tma_loads else {}
        for d in (self.loads, self.async_copies):
            for w, c in d.items():
                n[int(w)] = n.get(int(w), 0) + c
        total = sum(n.values())
        return sum(c for w, c in n.items() if w >= width) / total if total else 1.0

    def as_dict(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict) -> "Binary":
        """The inverse of ``as_dict`` through JSON (whose keys are strings: widths back to ints)."""
        widths = {k: {int(w): int(n) for w, n in d[k].items()} for k in ("loads", "async_copies", "stores")}
        return Binary(**{**d, **widths})


def compile_native(kernel: Kernel, arch: int) -> Binary:
    """The kernel compiled for compute capability ``arch`` (80, 90, ...), from the cache when an
    identical kernel was compiled before by this Triton (under any name: a layer's kernels are the
    next layer's, named and commented apart, and one compile serves them all).  Below sm_90 a
    kernel reads through pointers, not tensor descriptors (Triton lowers those to plain loads
    there, without async copies)."""
    plain = replace(kernel, name=_NAME, comments=(), tma=kernel.tma and arch >= TMA_ARCH)
    source = triton_source(plain)
    blocks = {a.block_name: a.block for a in kernel.axes}
    key = [arch, source, sorted(blocks.items()), [_POINTER[t.dtype] for t in kernel.inputs + kernel.outputs],
           kernel.num_warps, kernel.num_stages]
    return _cached(key, kernel.name, lambda: _compile(plain, source, blocks, arch))


def compile_native_generic(kernel: Kernel, generic, arch: int) -> Binary:
    """A bucket's size-generic source of ``kernel`` (``generic.py``) compiled for ``arch``, its
    size a 32-bit argument as the runtime passes it (not cached: a check, not a planning input)."""
    from .generic import PARAM
    blocks = {a.block_name: a.block for a in kernel.axes}
    return _compile(kernel, generic.source, blocks, arch, {PARAM: "i32"})


def compile_native_persistent(name: str, kernels, reads, writes, types, arch: int, trace: bool = False,
                              maxnreg: int | None = None) -> Binary:
    """A persistent kernel of ``kernels`` as phases (``persistent.py``; tensors named by ``reads``
    and ``writes``, typed by ``types``) compiled for ``arch``, with ``trace`` its tasks' clock
    readings, at most ``maxnreg`` registers a thread where given (ptxas's cap, as the launch
    passes it); cached like ``compile_native`` (under one name: the binary does not depend on it)."""
    from .persistent import COUNTERS, NEEDS, TRACE, persistent_module
    source, params, table = persistent_module(_NAME, kernels, reads, writes, trace=trace)
    signature = {f"p{k}": _POINTER[types[n].dtype] for k, n in enumerate(params)}
    signature[COUNTERS] = "*i32"
    if table is not None:
        signature[NEEDS] = "*i32"
    if trace:
        signature[TRACE] = "*i64"
    warps, stages = max(k.num_warps for k in kernels), max(k.num_stages for k in kernels)
    key = ["persistent", arch, source, signature, warps, stages] + ([maxnreg] if maxnreg else [])
    return _cached(key, name, lambda: _build(_jit_function(source, _NAME), signature, {}, len(signature), warps,
                                             stages, _NAME, arch, maxnreg))


def _cached(key: list, name: str, build) -> Binary:
    """The binary ``build()`` makes, from the cache by ``key`` (with this Triton's version) when it
    was made before, named ``name``; a compile error is named as the caller knows the kernel."""
    import triton
    digest = hashlib.sha256(json.dumps([_VERSION, triton.__version__, *key]).encode()).hexdigest()[:24]
    path = cache_root() / "native" / f"{digest}.json"
    try:
        return replace(Binary.from_dict(json.loads(path.read_text())), kernel=name)
    except (OSError, ValueError, TypeError, AttributeError):
        pass
    try:
        binary = build()
    except NativeCompileError as e:
        raise NativeCompileError(str(e).replace(f"kernel {_NAME}:", f"kernel {name}:", 1)) from e.__cause__
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(binary.as_dict(), sort_keys=True))
        os.replace(tmp, path)
    except OSError:
        pass                       # an unusable cache costs a recompile, not the answer
    return replace(binary, kernel=name)


def _compile(kernel: Kernel, source: str, blocks: dict, arch: int, scalars: dict | None = None) -> Binary:
    fn = _jit_function(source, kernel.name)
    signature = {f"in{j}": _POINTER[t.dtype] for j, t in enumerate(kernel.inputs)}
    signature.update({f"out{j}": _POINTER[t.dtype] for j, t in enumerate(kernel.outputs)})
    signature.update(scalars or {})
    signature.update({b: "constexpr" for b in blocks})
    signature = {name: signature[name] for name in fn.arg_names}     # in the parameters' order
    return _build(fn, signature, blocks, len(kernel.inputs) + len(kernel.outputs), kernel.num_warps,
                  kernel.num_stages, kernel.name, arch)


def _build(fn, signature: dict, constexprs: dict, pointers: int, warps: int, stages: int, name: str,
           arch: int, maxnreg: int | None = None) -> Binary:
    """``fn`` compiled for ``arch`` with its first ``pointers`` arguments 16-byte aligned (as the
    runtime passes them) and Triton's launch-time default of fused multiply-adds; its binary read."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    aligned = {(j,): [["tt.divisibility", 16]] for j in range(pointers)}
    options = {"num_warps": warps, "num_stages": stages, "enable_fp_fusion": True}
    if maxnreg:
        options["maxnreg"] = maxnreg
    try:
        compiled = triton.compile(ASTSource(fn, signature, constexprs, aligned), target=GPUTarget("cuda", arch, 32),
                                  options=options)
    except Exception as e:          # Triton raises its own compilation errors and plain ones alike
        last = (str(e).strip().splitlines() or [""])[-1]
        raise NativeCompileError(f"kernel {name}: Triton {triton.__version__} cannot compile it for "
                                 f"sm_{arch}: {type(e).__name__}: {last}") from e
    usage, sass = _objdump(compiled.asm["cubin"], name, arch)
    # the warps the launch runs: a warp-specialized loop adds its producer group (Kernel.launched_warps)
    launched = int(getattr(compiled.metadata, "num_warps", warps))
    binary = read_binary(name, arch, launched, usage, sass, int(compiled.metadata.shared), triton.__version__)
    if binary.spill_instructions and _ptxas_spill_bytes(compiled.asm["ptx"], arch) == 0:
        # local stores and loads, but none a spill: a call's saved registers (a persistent kernel's
        # phases are noinline functions) or a local array
        binary = replace(binary, spill_bytes=0, spill_instructions=0, frame_instructions=binary.spill_instructions)
    return binary


_SPILLED = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _ptxas_spill_bytes(ptx: str, arch: int) -> int | None:
    """Bytes of spill stores and loads ``ptxas -v`` reports for the PTX, every function summed (the
    assembler Triton itself uses for ``arch``, else a bundled one that takes the PTX); None where
    none can be asked."""
    m = re.search(r"^\.target\s+(\w+)", ptx, re.M)
    if m is None:
        return None
    for ptxas in _assemblers(arch):
        with tempfile.TemporaryDirectory(prefix="tilefuse-ptx-") as d:
            path = Path(d) / "kernel.ptx"
            path.write_text(ptx)
            try:
                done = subprocess.run([ptxas, "-v", "--gpu-name", m.group(1), str(path), "-o", str(Path(d) / "k.cubin")],
                                      capture_output=True, text=True)
            except OSError:
                continue
        found = _SPILLED.findall(done.stdout + done.stderr)
        if done.returncode == 0 and found:
            return sum(int(a) + int(b) for a, b in found)
    return None


def _assemblers(arch: int) -> list[str]:
    """ptxas binaries to try: the one Triton picks for ``arch`` (where this Triton says), then the
    ones its NVIDIA backend bundles (newest name first)."""
    import triton
    out = []
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        try:
            out.append(get_ptxas(arch).path)
        except TypeError:                  # a Triton whose get_ptxas takes no architecture
            out.append(get_ptxas().path)
    except (ImportError, AttributeError, RuntimeError):
        pass
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    out += [str(bundled / n) for n in ("ptxas-blackwell", "ptxas") if (bundled / n).is_file()]
    return list(dict.fromkeys(out))


def _jit_function(source: str, name: str):
    """The kernel as a GPU ``JITFunction`` (never the interpreter's, whatever the environment says),
    imported from a file as Triton needs its source."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    modname = f"{KERNEL_MODULE}native_{digest}"
    mod = sys.modules.get(modname)
    if mod is None:
        with _LOCK:
            if not _SOURCES:                # one folder a process for the sources Triton reads
                _SOURCES.append(Path(tempfile.mkdtemp(prefix="tilefuse-native-")))
            path = _SOURCES[0] / f"{digest}.py"
            path.write_text(source)
            saved = os.environ.pop("TRITON_INTERPRET", None)
            try:
                spec = importlib.util.spec_from_file_location(modname, path)
                mod = importlib.util.module_from_spec(spec)
                sys.modules[modname] = mod
                spec.loader.exec_module(mod)
            finally:
                if saved is not None:
                    os.environ["TRITON_INTERPRET"] = saved
    return getattr(mod, name)


def cuobjdump() -> Path:
    """Triton's bundled ``cuobjdump`` (the NVIDIA backend ships it; no CUDA toolkit needed)."""
    import triton
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not path.is_file():
        raise NativeCompileError(f"Triton {triton.__version__} has no bundled cuobjdump at {path}: "
                                 f"install a Triton with its NVIDIA backend to read compiled kernels")
    return path


def _objdump(cubin: bytes, name: str, arch: int) -> tuple[str, str]:
    with tempfile.TemporaryDirectory(prefix="tilefuse-cubin-") as d:
        path = Path(d) / "kernel.cubin"
        path.write_bytes(cubin)
        out = []
        for flag in ("--dump-resource-usage", "-sass"):
            done = subprocess.run([str(cuobjdump()), flag, str(path)], capture_output=True, text=True)
            if done.returncode != 0:
                raise NativeCompileError(f"kernel {name}: cuobjdump {flag} failed on its sm_{arch} binary: "
                                         f"{done.stderr.strip()}")
            out.append(done.stdout)
    return out[0], out[1]


# ---------------------------------------------------------------- reading cuobjdump's text

_USAGE = re.compile(r"REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")
_INSTR = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)")
_WIDTHS = {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}


def read_binary(name: str, arch: int, num_warps: int, usage: str, sass: str, dynamic_shared: int,
                version: str = "") -> Binary:
    """A ``Binary`` from ``cuobjdump --dump-resource-usage`` and ``-sass`` output (one function)."""
    m = _USAGE.search(usage)
    if m is None:
        raise NativeCompileError(f"kernel {name}: no resource usage in cuobjdump's output for sm_{arch}")
    regs, stack, static_shared, local = map(int, m.groups())
    counts: dict[str, int] = {}
    for op in _INSTR.findall(sass):
        counts[op] = counts.get(op, 0) + 1

    def widths(prefix: str) -> dict[int, int]:
        out: dict[int, int] = {}
        for op, n in counts.items():
            parts = op.split(".")
            if parts[0] == prefix:
                w = next((_WIDTHS[p] for p in parts[1:] if p in _WIDTHS), 4)
                out[w] = out.get(w, 0) + n
        return dict(sorted(out.items()))

    def total(prefix: str) -> int:
        return sum(n for op, n in counts.items() if op.split(".")[0] == prefix)

    wgmma, sync = total("HGMMA"), total("HMMA")
    spill_instructions = total("STL") + total("LDL")
    # a spill is a local store and load; ptxas may reserve a small stack frame that no
    # instruction touches (8 bytes beside an atomic's branch, seen on sm_90): not a spill
    return Binary(kernel=name, arch=arch, num_warps=num_warps, registers=regs,
                  spill_bytes=max(stack, local) if spill_instructions else 0,
                  spill_instructions=spill_instructions, shared_bytes=dynamic_shared, static_shared=static_shared,
                  mma="wgmma" if wgmma else "mma.sync" if sync else "none", mma_instructions=wgmma + sync,
                  loads=widths("LDG"), async_copies=widths("LDGSTS"), tma_loads=total("UTMALDG"),
                  stores=widths("STG"), triton=version,
                  prefetches=sum(n for op, n in counts.items() if op.startswith("CCTL") and "PF2" in op))
