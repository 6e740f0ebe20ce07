"""Count the global-memory traffic of Triton kernels run by Triton's interpreter.

Usage::

    with count_traffic() as t:
        kernel[grid](...)            # any number of launches, through tilefuse or by hand
    t.load_bytes, t.store_bytes, t.total_bytes, t.loads, t.stores

    with count_traffic(tensors={"x": x, "out": out}) as t:
        ...
    t.by_tensor["x"].load_bytes, t.unattributed.load_bytes

What is counted
---------------
Every load or store a program instance executes, as the interpreter executes it:

* ``load_bytes`` / ``store_bytes``: for each executed load/store, the number of lanes whose mask
  is true (every lane when it has no mask) times the size in bytes of the pointed-to element type
  (``primitive_bitwidth // 8``, at least 1: ``int1`` pointers move bytes).  Masked-off lanes cost
  nothing, also when ``tl.load(..., mask=m, other=v)`` fills them with ``v``: ``other`` is not read
  from memory.  A scalar load/store is one lane.
* ``loads`` / ``stores``: how many load/store operations were executed (once per program instance
  per executed ``tl.load``/``tl.store``, fully masked-off ones included; a loop body counts once per
  iteration).
* ``distinct_load_bytes`` / ``distinct_store_bytes``: the same, with each address counted once
  per executed operation (lanes of one program reading one element, such as a bias broadcast
  along a tile, are one transfer for the memory system).
* ``sector_load_bytes`` / ``sector_store_bytes``: the distinct 32-byte sectors each operation
  touches, times 32: what the memory system moves (a 2-byte read costs a whole sector).
* Loading the same address twice counts twice.  There is no cache model: these are the bytes the
  program requests, before any L1/L2 or coalescing credit, i.e. an upper bound on DRAM traffic
  and the exact traffic a cache-less machine would see.
* Tensor descriptors (``tl.make_tensor_descriptor``/host ``TensorDescriptor``: load, store,
  gather, scatter) and, on Triton versions that still have them, block pointers
  (``tl.make_block_ptr`` loads/stores with ``boundary_check``) count as loads/stores of the
  in-bounds lanes of the block: the interpreter lowers them to masked loads/stores.
* ``tl.atomic_load``/``tl.atomic_store``/``tl.atomic_poll`` (Triton >= 3.9) are lowered to masked
  loads/stores and count as such (a poll once per attempt).
* Read-modify-write atomics (``tl.atomic_add``/``max``/``min``/``and``/``or``/``xor``/``xchg``
  and ``tl.atomic_cas``): each counts one operation in ``atomics``, and its lanes (those under a
  true mask; every lane for ``atomic_cas``, which has no mask) times the element size in
  ``atomic_bytes`` and in *both* ``load_bytes`` and ``store_bytes`` (the element is read and
  written).  They are not counted in ``loads``/``stores``.  ``count_traffic(reject_atomics=True)``
  raises :class:`UnsupportedMemoryOp` instead.
* Any other path by which the interpreter touches memory raises :class:`UnsupportedMemoryOp`
  rather than being silently missed (a guard on the interpreter's native load/store/atomic entry
  points checks that each call came through one of the counted methods).

Per-tensor breakdown (``tensors={name: tensor}``): each counted lane is attributed to the first
named tensor (in the mapping's order) whose address span ``[data_ptr, data_ptr + extent)``
contains the lane's address; lanes in none of them go to ``unattributed``.  This needs the kernel
to address the tensor's own memory: it holds for CPU tensors (the interpreter runs on them in
place) but not for a copy made on the way (tilefuse's launcher passes ``t.contiguous()``, a copy
for non-contiguous inputs), nor for device tensors (the interpreter runs on host copies, so
``tensors`` must be CPU tensors).

Scope: counters are process-wide, not per thread (the interpreter itself keeps its grid state in
one global builder); a counter sees every interpreted launch while it is open.  Counters nest:
each open counter sees every access made while it is open, so an outer one includes an inner one.
Only interpreted kernels are seen; opening a counter when Triton is not in interpreter mode
(``TRITON_INTERPRET=1``, or a machine without CUDA, where tilefuse runs its kernels in the
interpreter) raises ``RuntimeError``.

Triton internals patched while at least one counter is open (restored when the last one closes):
the methods ``create_masked_load``, ``create_masked_store``, ``create_atomic_rmw`` and
``create_atomic_cas`` of ``triton.runtime.interpreter.InterpreterBuilder`` (the four builder
methods that call the native ``_interpreter.load``/``store``/``atomic_rmw``/``atomic_cas``; every
other memory op of the builder is implemented through them in Triton 3.6 and 3.9), and the
module global ``triton.runtime.interpreter._interpreter`` (wrapped by the guard above).  The
wrappers take the pointer and mask by position (``ptrs, mask`` for loads, ``ptrs, value, mask``
for stores), which is stable across the builder signature changes (cache/eviction arguments).
"""
from __future__ import annotations

import contextlib
import functools
import os
import threading
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Optional

import numpy as np

__all__ = ["Traffic", "TensorTraffic", "UnsupportedMemoryOp", "count_traffic"]


class UnsupportedMemoryOp(RuntimeError):
    """A kernel touched memory by a path the traffic counter does not count (or rejects)."""


@dataclass
class TensorTraffic:
    """Bytes moved to and from one tensor (or the unattributed rest)."""
    load_bytes: int = 0
    store_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return self.load_bytes + self.store_bytes


@dataclass
class Traffic:
    """What one :func:`count_traffic` block counted; see the module docstring for the rules."""
    load_bytes: int = 0
    store_bytes: int = 0
    loads: int = 0
    stores: int = 0
    atomics: int = 0
    atomic_bytes: int = 0
    # the same, counting each address once per executed operation: lanes of one program reading
    # one element (a broadcast bias) are one transfer for the memory system
    distinct_load_bytes: int = 0
    distinct_store_bytes: int = 0
    # the same in whole 32-byte sectors, the unit in which the memory system moves data
    sector_load_bytes: int = 0
    sector_store_bytes: int = 0
    by_tensor: dict = field(default_factory=dict)  # name -> TensorTraffic, when tensors= was given
    unattributed: Optional[TensorTraffic] = None  # lanes in none of the named tensors (tensors= only)
    reject_atomics: bool = field(default=False, repr=False)
    _spans: list = field(default_factory=list, repr=False)  # [(name, lo, hi)]

    @property
    def total_bytes(self) -> int:
        return self.load_bytes + self.store_bytes

    @property
    def distinct_bytes(self) -> int:
        return self.distinct_load_bytes + self.distinct_store_bytes

    @property
    def sector_bytes(self) -> int:
        return self.sector_load_bytes + self.sector_store_bytes


# ---------------------------------------------------------------------------------------------
# Global state: the open counters and the installed patches.

_LOCK = threading.RLock()
_ACTIVE: list[Traffic] = []
_PATCHES: list[tuple] = []  # (owner, name, original, wrapper, had_own_attribute)
_TLS = threading.local()  # .depth: >0 while inside a counted builder method on this thread

SECTOR = 32   # bytes: the granularity of L2 and DRAM transfers on NVIDIA GPUs
_METHODS = ("create_masked_load", "create_masked_store", "create_atomic_rmw", "create_atomic_cas")
_NATIVE_MEMORY_FNS = frozenset({"load", "store", "atomic_rmw", "atomic_cas"})


def _interpreting() -> bool:
    from ..codegen.triton.interpreter import interpreted
    if interpreted():        # tilefuse runs its kernels in the interpreter (inside ``interpreting()``)
        return True
    try:
        from triton import knobs
        return bool(knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _itemsize(ptrs) -> int:
    get = getattr(ptrs, "get_element_ty", None)
    if get is not None:
        elt = get()
    else:
        elt = ptrs.dtype
        while hasattr(elt, "element_ty"):
            elt = elt.element_ty
    return max(1, int(elt.primitive_bitwidth) // 8)


def _lanes(ptrs, mask):
    """(addresses of the active lanes, their count)."""
    addr = np.asarray(ptrs.data)
    if mask is None:
        active = np.ones(addr.shape, dtype=bool)
    else:
        m = np.asarray(mask.data if hasattr(mask, "data") else mask)
        if m.dtype != np.bool_:
            m = m != 0
        active = np.broadcast_to(m, addr.shape) if m.shape != addr.shape else m
    return addr, active


def _record(kind: str, ptrs, mask) -> None:
    """Add one executed memory op to every open counter.  kind: 'load', 'store' or 'atomic'."""
    with _LOCK:
        counters = list(_ACTIVE)
    if not counters:
        return
    if kind == "atomic" and any(c.reject_atomics for c in counters):
        raise UnsupportedMemoryOp("an atomic operation was executed inside count_traffic(reject_atomics=True)")
    addr, active = _lanes(ptrs, mask)
    size = _itemsize(ptrs)
    nbytes = int(np.count_nonzero(active)) * size
    touched = addr[active].astype(np.uint64, copy=False)
    distinct = int(np.unique(touched).size) * size
    sectors = _sectors(touched, size) * SECTOR
    need_addresses = any(c.unattributed is not None for c in counters)
    lane_addr = addr[active].astype(np.uint64, copy=False).ravel() if need_addresses else None
    with _LOCK:
        for c in counters:
            if kind == "load":
                c.loads += 1
                c.load_bytes += nbytes
                c.distinct_load_bytes += distinct
                c.sector_load_bytes += sectors
            elif kind == "store":
                c.stores += 1
                c.store_bytes += nbytes
                c.distinct_store_bytes += distinct
                c.sector_store_bytes += sectors
            else:
                c.atomics += 1
                c.atomic_bytes += nbytes
                c.load_bytes += nbytes
                c.store_bytes += nbytes
            if c.unattributed is None:
                continue
            rest = lane_addr
            for name, lo, hi in c._spans:
                if rest.size == 0:
                    break
                inside = (rest >= lo) & (rest < hi)
                n = int(np.count_nonzero(inside)) * size
                if n:
                    _add(c.by_tensor[name], kind, n)
                    rest = rest[~inside]
            if rest.size:
                _add(c.unattributed, kind, int(rest.size) * size)


def _sectors(addr, size: int) -> int:
    """Distinct 32-byte sectors the elements at ``addr`` (each ``size`` bytes) touch."""
    if addr.size == 0:
        return 0
    first, last = addr // SECTOR, (addr + np.uint64(size - 1)) // SECTOR
    if np.array_equal(first, last):
        return int(np.unique(first).size)
    return int(np.unique(np.concatenate([first, last])).size)


def _add(tt: TensorTraffic, kind: str, nbytes: int) -> None:
    if kind in ("load", "atomic"):
        tt.load_bytes += nbytes
    if kind in ("store", "atomic"):
        tt.store_bytes += nbytes


@contextlib.contextmanager
def _inside():
    _TLS.depth = getattr(_TLS, "depth", 0) + 1
    try:
        yield
    finally:
        _TLS.depth -= 1


# Counted builder method -> (what it is, position of its pointer argument, of its mask or None).
# Positions are the same in Triton 3.6 and 3.9; the rest of each signature (cache policy / cache
# modifier + eviction policy, volatility, semantics) passes through untouched.
_SIGNATURES = {
    "create_masked_load": ("load", 0, 1),        # (ptrs, mask, other, ...)
    "create_masked_store": ("store", 0, 2),      # (ptrs, value, mask, ...)
    "create_atomic_rmw": ("atomic", 1, 3),       # (rmw_op, ptr, val, mask, ...)
    "create_atomic_cas": ("atomic", 0, None),    # (ptr, cmp, val, ...): no mask
}


def _counted(name: str, orig):
    kind, at_ptr, at_mask = _SIGNATURES[name]

    def wrapper(self, *args, **kwargs):
        with _inside():
            ret = orig(self, *args, **kwargs)
        _record(kind, args[at_ptr], None if at_mask is None else args[at_mask])
        return ret
    return functools.wraps(orig)(wrapper)


class _GuardedNative:
    """Stands in for the interpreter's native module: memory entry points reached other than
    through a counted builder method raise instead of moving uncounted bytes."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if callable(attr) and (name in _NATIVE_MEMORY_FNS or "load" in name or "store" in name
                               or "atomic" in name):
            def guarded(*args, **kwargs):
                if not getattr(_TLS, "depth", 0) and _ACTIVE:
                    raise UnsupportedMemoryOp(
                        f"the Triton interpreter called _interpreter.{name} outside the builder methods "
                        f"count_traffic counts ({', '.join(_METHODS)}); this memory operation would not be "
                        f"counted on this Triton version")
                return attr(*args, **kwargs)
            return guarded
        return attr


def _install() -> None:
    from triton.runtime import interpreter as interp
    cls = interp.InterpreterBuilder
    missing = [n for n in _METHODS if not callable(getattr(cls, n, None))]
    if missing or not hasattr(interp, "_interpreter"):
        import triton
        raise RuntimeError(
            f"count_traffic does not support this Triton ({triton.__version__}): "
            f"triton.runtime.interpreter lacks {missing or ['_interpreter']}")
    patches = []
    for n in _METHODS:
        orig = getattr(cls, n)
        wrapper = _counted(n, orig)
        patches.append((cls, n, orig, wrapper, n in cls.__dict__))
    native = interp._interpreter
    patches.append((interp, "_interpreter", native, _GuardedNative(native), True))
    for owner, n, _orig, wrapper, _own in patches:
        setattr(owner, n, wrapper)
    _PATCHES[:] = patches


def _uninstall() -> None:
    for owner, n, orig, wrapper, own in reversed(_PATCHES):
        current = owner.__dict__.get(n)
        if current is not wrapper:
            continue  # patched over by someone else since: leave theirs (ours passes through idle)
        if own:
            setattr(owner, n, orig)
        else:
            delattr(owner, n)
    _PATCHES.clear()


def _span(t) -> tuple[int, int]:
    """[lo, hi) byte addresses spanned by tensor t's elements."""
    if t.numel() == 0:
        return 0, 0
    extent = 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride()))
    lo = t.data_ptr() + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if st < 0) * t.element_size()
    return lo, lo + extent * t.element_size()


@contextlib.contextmanager
def count_traffic(tensors: Optional[Mapping[str, object]] = None, *,
                  reject_atomics: bool = False) -> Iterator[Traffic]:
    """Count the bytes interpreted Triton kernels load and store inside the ``with`` block.

    ``tensors``: optional ``{name: torch.Tensor}`` (CPU tensors) for a per-tensor breakdown in
    ``by_tensor[name]`` and ``unattributed``.  ``reject_atomics``: raise
    :class:`UnsupportedMemoryOp` on an atomic read-modify-write instead of counting it.
    """
    if not _interpreting():
        raise RuntimeError("count_traffic counts kernels run by Triton's interpreter only, and Triton is not "
                           "in interpreter mode (set TRITON_INTERPRET=1 before importing triton)")
    counter = Traffic(reject_atomics=reject_atomics)
    if tensors is not None:
        counter.unattributed = TensorTraffic()
        for name, t in tensors.items():
            if getattr(t, "device", None) is not None and t.device.type != "cpu":
                raise ValueError(f"count_traffic(tensors=...): {name!r} is on {t.device}; the interpreter "
                                 f"runs on host copies, so only CPU tensors can be attributed")
            lo, hi = _span(t)
            counter.by_tensor[name] = TensorTraffic()
            counter._spans.append((name, lo, hi))
    with _LOCK:
        if not _ACTIVE:
            _install()
        _ACTIVE.append(counter)
    try:
        yield counter
    finally:
        with _LOCK:
            for i, c in enumerate(_ACTIVE):
                if c is counter:
                    del _ACTIVE[i]
                    break
            if not _ACTIVE:
                _uninstall()
