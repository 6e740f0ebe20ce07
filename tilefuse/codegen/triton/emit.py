"""Triton source of a tile-level kernel (codegen/kernel.py): one ``@triton.jit`` function as text.

Tiles have the kernel's rank; a value that does not vary along a tile dimension has size 1 there
and Triton broadcasts.  Every value is placed in the outermost scope where what it depends on is
defined (loop-invariant loads and arithmetic are hoisted out of loops) and computed once per scope
(expressions are interned, so equal subexpressions are one value).  Index arithmetic runs in the
kernel's index type (int32 when every offset fits) with literal constants, and each load or store
offset is built from its affine form: variables that enumerate an axis contiguously become the
axis's linear index (or a ``//``/``%`` slice of it) instead of being unravelled one by one.  Masks
cover only axes whose block does not divide the extent, plus bounds a load's index may leave.
"""
from __future__ import annotations

import math
import re
from typing import Iterable

from ...analysis.index import bounds, linear_form
from ...ir.dtypes import DType
from ...ir.expr import INDEX, Binary, Cast, Const, Expr, Load, Select, Unary, Value, Var, walk
from ..kernel import (Arrive, Dot, Kernel, Loop, Reduce, Store, TileAxis, check, descriptor_dims, guarded_load,
                      piece_descriptors, piece_tests, tile_shift, uniform_test)
from .ops import (BINARY, BINARY_F32, BOOL_BINARY, COMBINE_FLOAT, COMBINE_INT, COMPARE, HALF, HELPERS,
                  INT_DIVISION, LIBDEVICE, REDUCE_FLOAT, REDUCE_INT, TL, UNARY, UNARY_INT, UNARY_NATIVE_HALF)


def triton_source(kernel: Kernel) -> str:
    """The kernel's module source (deterministic for a kernel); a kernel whose slots or axes do
    not hold together (``codegen/kernel.check``) is refused."""
    check(kernel)
    return _Printer(kernel).source()


def literal(value, dtype: DType) -> str:
    """A Python literal Triton reads as ``value``; non-finite floats as ``float("inf")`` etc."""
    if dtype is DType.bool:
        return str(int(bool(value)))
    if dtype.is_int:
        return str(int(value))
    if math.isnan(value):
        return 'float("nan")'
    if math.isinf(value):
        return 'float("inf")' if value > 0 else 'float("-inf")'
    return repr(float(value))


class _Value:
    __slots__ = ("text", "axes", "depth")

    def __init__(self, text: str, axes: frozenset, depth: int):
        self.text, self.axes, self.depth = text, axes, depth


class _Scope:
    def __init__(self, parent: "_Scope | None", bound: frozenset, indent: str, fence: bool = False,
                 full: frozenset = frozenset()):
        self.parent, self.bound, self.indent = parent, bound, indent
        # axes whose every chunk here lies within the extent (a causal loop's chunks before its
        # split): no masks
        self.full = full | (parent.full if parent is not None else frozenset())
        self.fence = fence          # nothing computed inside is hoisted out (a conditional body)
        self.depth = 0 if parent is None else parent.depth + 1
        self.lines: list[str] = []
        self.memo: dict = {}


class _Printer:
    def __init__(self, k: Kernel):
        self.k = k
        self.idt = k.index_dtype()
        self.rank = k.rank
        self.axis_of = {v: a for a in k.axes for v in a.vars}
        self.axis_info = {v: (a.name, a.vars, a.ext[0] if len(a.ext) == 1 else None, a.dim)
                          for a in k.axes for v in a.vars}
        self.axis_by_name = {a.name: a for a in k.axes}
        self.extents = {v: n for a in k.axes for v, n in zip(a.vars, a.ext)}
        self.ranges = {v: (0, n - 1) for v, n in self.extents.items()}
        self.nin = len(k.inputs)
        self.count = 0
        self.results: dict[int, _Value] = {}       # Reduce/Dot slot -> value
        # an axis and its aliases are bound together (by the axis's loop, or from the start)
        self.binds = {a.name: frozenset({a.name} | {b.name for b in k.axes if b.alias == a.name})
                      for a in k.axes if not a.alias}
        whole = frozenset().union(*(self.binds[a.name] for a in k.axes if not a.alias and not a.looped))
        self.scopes = [_Scope(None, whole, "    ")]
        self.scalar = frozenset(a.name for a in k.axes if a.dim < 0)
        self.flat_rows = k.rank > 1 and not _has_dot(k.body)      # (``_reduction``)

    def tiled(self, v: _Value) -> frozenset:
        """The tile axes ``v`` varies along (a scalar axis, one position per program, is none)."""
        return v.axes - self.scalar

    # ---------------------------------------------------------------- scopes and placement
    @property
    def scope(self) -> _Scope:
        return self.scopes[-1]

    def _home(self, axes: frozenset, depth: int) -> _Scope:
        """Outermost open scope at or below ``depth`` (and inside any fence) where every axis in
        ``axes`` is bound."""
        floor = max((s.depth for s in self.scopes if s.fence), default=0)
        for s in self.scopes[max(depth, floor):]:
            if axes <= s.bound:
                return s
        raise AssertionError(f"axes {sorted(axes)} are not bound in any open scope")

    def _lookup(self, key):
        for s in reversed(self.scopes):
            got = s.memo.get(key)
            if got is not None:
                return got
        return None

    def emit(self, text: str, axes: Iterable[str] = (), deps: Iterable[_Value] = (), key=None,
             name: str | None = None, reduced: Iterable[str] = ()) -> _Value:
        """``name = text`` placed in the outermost scope it can live in; memoized under ``key``.
        ``reduced``: axes the value is reduced over (needed where it is computed, not after)."""
        deps = list(deps)
        axes = frozenset(axes).union(*(d.axes for d in deps))
        depth = max((d.depth for d in deps), default=0)
        home = self._home(axes, depth)
        if name is None:
            self.count += 1
            name = f"t{self.count}"
        home.lines.append(f"{home.indent}{name} = {text}")
        v = _Value(name, axes - frozenset(reduced), home.depth)
        if key is not None:
            home.memo[key] = v
        return v

    def shape(self, axes: Iterable[str]) -> str:
        """A tile over ``axes``: each axis's block in its dimension, 1 elsewhere."""
        blocks = {self.axis_by_name[a].dim: self.axis_by_name[a].block_name for a in axes}
        return "[" + ", ".join(blocks.get(d, "1") for d in range(self.rank)) + "]"

    def _expand(self, dim: int) -> str:
        if self.rank == 1:
            return ""
        return "[" + ", ".join(":" if d == dim else "None" for d in range(self.rank)) + "]"

    # ---------------------------------------------------------------- axes
    def linear(self, a: TileAxis) -> _Value:
        """The axis's linear positions in this tile (``xs``), defined where the axis is bound."""
        key = ("lin", a.name)
        got = self._lookup(key)
        if got is not None:
            return got
        ar = f"tl.arange(0, {a.block_name})"
        target = self.axis_by_name[a.alias] if a.alias else a
        if a.grid is not None:
            pid = self._pid(a) + (".to(tl.int64)" if self.idt is DType.int64 else "")
            text = pid if a.dim < 0 else f"({pid} * {a.block_name} + {ar}){self._expand(a.dim)}"
        elif a.within:     # the program's tile of another axis, a block at a time
            p = self.axis_by_name[a.within]
            start = f"{self._pid(p)}{'.to(tl.int64)' if self.idt is DType.int64 else ''} * {p.block_name}"
            text = f"({start} + {a.name + '_start + ' if a.looped else ''}{ar}){self._expand(a.dim)}"
        elif target.looped and a.dim < 0:      # one position per iteration: a scalar
            text = f"{target.name}_start"
        elif target.looped:
            text = f"{target.name}_start + {ar}{self._expand(a.dim)}"
        elif a.dim < 0:         # a scalar axis in one chunk (a single position): its position is 0
            text = "0"
        else:
            text = f"{ar}{self._expand(a.dim)}"
        if self.idt is DType.int64 and a.grid is None and text != "0":
            text = f"({text}).to(tl.int64)"
        home = self._home(frozenset({a.name}), 0)
        home.lines.append(f"{home.indent}{a.name}s = {text}")
        v = _Value(f"{a.name}s", frozenset({a.name}), home.depth)
        home.memo[key] = v
        return v

    def _pid(self, a: TileAxis) -> str:
        """The program index along ``a``: its program-id dimension, or its coordinate in the task
        mapping (codegen/mapping.py) from that program id to the tiles of the axes sharing it:
        row-major (``spatial``), or group-M order under the kernel's ``swizzle``."""
        axes = self.k.sharing(a.grid)
        if len(axes) == 1:
            return f"pid{a.grid}" if self.k.phase else f"tl.program_id({a.grid})"
        top = self.scopes[0]
        if ("pid", a.grid) not in top.memo:
            g = a.grid
            (coords,) = self.k.task_mapping(g).expand(Var(f"pid{g}"))
            if not self.k.phase:            # (a phase is given its program ids)
                top.lines.append(f"{top.indent}pid{g} = tl.program_id({g})")
            for b, e in zip(axes, coords):
                top.lines.append(f"{top.indent}pid_{b.name} = {_index_text(e)}")
            top.memo[("pid", a.grid)] = True
        return f"pid_{a.name}"

    def mask(self, a: TileAxis) -> _Value:
        key = ("mask", a.name)
        got = self._lookup(key)
        if got is not None:
            return got
        lin = self.linear(a)
        return self.emit(f"{lin.text} < {a.extent}", deps=[lin], key=key, name=f"{a.name}mask")

    def masks(self, axes: Iterable[str]) -> list[_Value]:
        out = [self.axis_by_name[n] for n in sorted(axes, key=lambda n: (self.axis_by_name[n].dim, n))]
        return [self.mask(a) for a in out if self.masked(a)]

    def masked(self, a: TileAxis) -> bool:
        """The axis's tile may run past its extent here."""
        return a.masked and a.name not in self.scope.full

    def run(self, a: TileAxis, j: int, l: int) -> _Value:
        """Positions of variables j..l (a contiguous run) of an axis: a slice of its linear index."""
        key = ("run", a.name, j, l)
        got = self._lookup(key)
        if got is not None:
            return got
        lin = self.linear(a)
        inner, size = math.prod(a.ext[l + 1:]), math.prod(a.ext[j:l + 1])
        text = lin.text if inner == 1 else f"{lin.text} // {inner}"
        if math.prod(a.ext[:j]) > 1:     # outer variables of extent 1 are always 0: no wrap
            text = f"({text}) % {size}" if inner != 1 else f"{text} % {size}"
        if text == lin.text:
            return lin
        return self.emit(text, deps=[lin], key=key, name=f"{a.name}_{j}" if j == l else None)

    # ---------------------------------------------------------------- offsets
    def offset(self, index: tuple[Expr, ...], shape: tuple[int, ...]) -> _Value:
        """Row-major element offset of ``index`` into a tensor of ``shape``, in the index type."""
        return self._offset(*_offset_form(index, shape))

    def _offset(self, terms: dict, const: int) -> _Value:
        """The offset ``Σ atom·coefficient + const`` (``_offset_form``) as a tile."""
        key = ("off", frozenset(terms.items()), const)
        got = self._lookup(key)
        if got is not None:
            return got
        pieces: list[tuple[_Value, int]] = []
        byaxis: dict[str, dict[int, int]] = {}
        for atom, c in terms.items():
            a = self.axis_of.get(atom) if isinstance(atom, Var) else None
            if a is None:
                pieces.append((self.value(atom, index=True), c))
            elif a.ext[a.vars.index(atom)] != 1:
                byaxis.setdefault(a.name, {})[a.vars.index(atom)] = c
        for name in sorted(byaxis, key=lambda n: self.axis_by_name[n].dim):
            a = self.axis_by_name[name]
            for j, l, s in _runs(a.ext, byaxis[name]):
                pieces.append((self.run(a, j, l), s))
        text = " + ".join(v.text if c == 1 else f"{v.text} * {c}" for v, c in pieces)
        if const or not text:
            text = f"{text} + {const}" if text else str(const)
        if not pieces:
            return self.emit(f"tl.full({self.shape(())}, {const}, {TL[self.idt]})", key=key)
        if len(pieces) == 1 and pieces[0][1] == 1 and not const:
            return pieces[0][0]
        return self.emit(text, deps=[v for v, _ in pieces], key=key)

    # ---------------------------------------------------------------- expressions
    def value(self, e: Expr, index: bool = False) -> _Value:
        """``e`` as a tile; ``index``: integer index arithmetic (kernel index type, literals)."""
        index = index and e.dtype is INDEX
        # keyed by the (interned) expression, not its id: the memo keeps a transient one (a joined
        # guard) alive, so no later expression can take its id and read its tile (Zamba2)
        key = (e, index)
        got = self._lookup(key)
        if got is not None:
            return got
        if isinstance(e, Var):
            out = self._var(e, index)
        elif isinstance(e, Const):
            if index:
                return _Value(str(int(e.value)), frozenset(), 0)
            out = self.emit(f"tl.full({self.shape(())}, {literal(e.value, e.dtype)}, {TL[e.dtype]})")
        elif isinstance(e, Load):
            out = self._load(e)
        elif isinstance(e, Value):          # a statement's result
            return self.results[e.slot]
        elif isinstance(e, Cast):
            x = self.value(e.x)
            text = x.text
            # to bf16 from anything but fp32/fp16 through fp32: the interpreter would write the
            # value as bf16's raw bits (an int 5 became 4.6e-40); torch rounds via fp32 too
            if e.dtype is DType.bfloat16 and e.x.dtype not in (DType.float32, DType.float16, DType.bfloat16):
                text = f"{text}.to(tl.float32)"
            out = self.emit(f"{text}.to({TL[e.dtype]})", deps=[x])
        elif isinstance(e, Select) and not index and (guarded := guarded_load(e)):
            out = self._load(*guarded)
        elif isinstance(e, Select):
            got = None if index else self._pointers(e)
            if got is not None:             # a load from one piece per tile
                ptr, mask = got
                extra = f", mask={mask.text}, other=0" if mask is not None else ""
                out = self.emit(f"tl.load({ptr.text}{extra})", deps=[ptr] + ([mask] if mask is not None else []))
            else:
                c, a, b = self.value(e.cond), self.value(e.a, index), self.value(e.b, index)
                out = self.emit(f"tl.where({c.text}, {a.text}, {b.text})", deps=[c, a, b])
        elif isinstance(e, Unary):
            out = self._unary(e, index)
        elif isinstance(e, Binary):
            out = self._binary(e, index)
        else:
            raise TypeError(f"cannot emit {type(e).__name__}")
        home = self.scopes[out.depth]
        home.memo[key] = out
        return out

    def _var(self, v: Var, index: bool) -> _Value:
        a = self.axis_of.get(v)
        if a is None:
            raise KeyError(f"variable {v.name} is on no tile axis of kernel {self.k.name}")
        j = a.vars.index(v)
        pos = self.run(a, j, j)
        if index or self.idt is v.dtype:
            return pos
        return self.emit(f"{pos.text}.to({TL[v.dtype]})", deps=[pos])

    def _unary(self, e: Unary, index: bool) -> _Value:
        x = self.value(e.x, index)
        dt = e.x.dtype
        if dt.is_float:
            rule = UNARY[e.op]
            if dt is DType.bfloat16 or (dt in HALF and e.op not in UNARY_NATIVE_HALF):
                w = self.emit(f"{x.text}.to(tl.float32)", deps=[x])
                return self.emit(f"({rule.format(x=w.text)}).to({TL[e.dtype]})", deps=[w])   # isnan: bool
            text = rule.format(x=x.text)
            if e.op in ("sign", "reciprocal"):
                text = f"({text}).to({TL[dt]})"
        else:
            rule = UNARY_INT.get(e.op, UNARY[e.op])
            text = rule.format(x=x.text)
            if not index and e.dtype is not DType.bool and _may_retype(rule, e.dtype):
                text = f"({text}).to({TL[e.dtype]})"
        return self.emit(text, deps=[x])

    def _binary(self, e: Binary, index: bool) -> _Value:
        if e.op in COMPARE and e.a.dtype is INDEX:
            index = True      # comparing positions (padding guards): index arithmetic
        a, b = self.value(e.a, index), self.value(e.b, index)
        dt = e.a.dtype
        if index and e.op in ("div", "floordiv", "mod", "fmod") and self._nonnegative(e.a, e.b):
            op = "//" if e.op in ("div", "floordiv") else "%"
            return self.emit(f"{_paren(a.text)} {op} {_paren(b.text)}", deps=[a, b])
        if dt is DType.bool and e.op in BOOL_BINARY:
            return self.emit(BOOL_BINARY[e.op].format(a=a.text, b=b.text), deps=[a, b])
        # index arithmetic runs in the kernel's index type only on positions; a comparison of int64
        # data is printed as index arithmetic too, and its values must keep their 64 bits
        t = TL[self.idt] if index and _positions_only(e) else TL[dt]
        if not dt.is_float and e.op in INT_DIVISION and not isinstance(e.b, Const):
            # an untaken Select branch (or a masked lane) may divide by zero: divide by 1 there
            b = self.emit(f"tl.where({b.text} == 0, 1, {b.text}).to({t})", deps=[b])
        rule = BINARY[e.op][0 if dt.is_float else 1]
        # bf16 arithmetic runs in fp32 and rounds once (what the GPU computes; the interpreter
        # would otherwise operate on bf16's raw bits)
        if dt in HALF and (e.op in BINARY_F32 or dt is DType.bfloat16):
            a = self.emit(f"{a.text}.to(tl.float32)", deps=[a])
            b = self.emit(f"{b.text}.to(tl.float32)", deps=[b])
        f = self.emit(f"libdevice.fmod({a.text}, {b.text})", deps=[a, b]) if "{f}" in rule else None
        text = rule.format(a=a.text, b=b.text, t=t, f=f.text if f else "")
        if e.op in COMPARE:
            return self.emit(text, deps=[a, b])
        if (not index and e.op not in COMPARE and e.dtype is not DType.bool and _may_retype(rule, e.dtype)):
            text = f"({text}).to({TL[e.dtype]})"
        return self.emit(text, deps=[a, b] + ([f] if f else []))

    def _nonnegative(self, *es: Expr) -> bool:
        return all(bounds(x, self.ranges)[0] >= 0 for x in es)

    def _load(self, e: Load, guard: Expr | None = None) -> _Value:
        """``e``; with ``guard``, the load where it holds and 0 elsewhere (``guarded_load``)."""
        t = self.k.inputs[e.tensor]
        checks = self._bounds_checks(e.index, t.shape, _conjuncts(guard) if guard is not None else frozenset())
        off = self.offset(e.index, t.shape)
        tests = ([self.value(guard)] if guard is not None else []) + checks
        # the tile's positions past an axis's extent read nothing, also where only the guard
        # varies along it (a padded window one wide: past K, a value times the other operand's
        # zero would be NaN for an infinite one)
        axes = off.axes.union(*(c.axes for c in tests))
        conds = self.masks(axes) + tests
        extra = ""
        if conds:
            extra += f", mask={' & '.join(c.text for c in conds)}, other=0"
        if e in self.k.reused:
            extra += ', eviction_policy="evict_last"'
        elif e.tensor in self.k.streamed and e.tensor not in self.k.written:    # (ptxas: not with .cg)
            extra += ', eviction_policy="evict_first"'
        if e.tensor in self.k.written:      # stored by other programs of this launch: not from L1
            extra += ', cache_modifier=".cg"'
        ptr = f"in{e.tensor} + {_paren(off.text)}"
        if self.shape(axes) != self.shape(off.axes):
            # the same element at every position a guard tests (a padded window one wide): a
            # block mask needs a block of pointers
            ptr = f"tl.broadcast_to({ptr}, {self.shape(axes)})"
        return self.emit(f"tl.load({ptr}{extra})", deps=[off] + conds)

    def _pointers(self, e: Expr) -> tuple[_Value, _Value | None] | None:
        """(pointers, mask or None) of a select among loads whose tests hold alike over each
        tile (``kernel.piece_tests``, every block dividing its threshold: a concatenation read in
        place): the pointers of the piece the tile's first position chooses, so that the tile is
        one plain load, vectorized and copied asynchronously, not one masked load per piece; None
        for anything else (before printing anything)."""
        tests = piece_tests(e, self.axis_info)
        if not tests or any(ld.tensor in self.k.written for ld in walk(e) if isinstance(ld, Load)):
            return None
        for name, threshold, _ in tests:
            a = self.axis_by_name[name]
            if a.within or threshold % a.block:
                return None
        leaves = [n for n in walk(e) if isinstance(n, Load)]
        forms = [_offset_form(ld.index, self.k.inputs[ld.tensor].shape) for ld in leaves]
        if all(f[0] == forms[0][0] for f in forms):
            # the pieces' offsets differ by constants: one offset tile, a scalar base per tile
            base = self._piece(e, {ld: c for ld, (_, c) in zip(leaves, forms)})
            off = self._offset(forms[0][0], 0)
            ptr = self.emit(f"{base.text} + {_paren(off.text)}", deps=[base, off])
            axes = [off.axes] * len(leaves)
        else:
            ptr = self._piece(e, None)
            axes = [self.offset(ld.index, self.k.inputs[ld.tensor].shape).axes for ld in leaves]
        masks = {ld: self._and(self.masks(ax) + self._bounds_checks(ld.index, self.k.inputs[ld.tensor].shape))
                 for ld, ax in zip(leaves, axes)}
        if all(m is None for m in masks.values()):
            return ptr, None
        return ptr, self._piece_mask(e, masks)

    def _piece(self, e: Expr, consts: dict | None) -> _Value:
        """The pointers (or, given each load's ``consts`` offset, the scalar base pointer) of the
        piece each tile reads."""
        if isinstance(e, Load):
            if consts is not None:
                return self.emit(f"in{e.tensor} + {consts[e]}")
            off = self.offset(e.index, self.k.inputs[e.tensor].shape)
            return self.emit(f"in{e.tensor} + {_paren(off.text)}", deps=[off])
        c = self._uniform(e.cond)
        a, b = self._piece(e.a, consts), self._piece(e.b, consts)
        return self.emit(f"tl.where({c.text}, {a.text}, {b.text})", deps=[c, a, b])

    def _piece_mask(self, e: Expr, masks: dict) -> _Value:
        """The mask of the piece each tile reads (``masks``: each load's, or None)."""
        if isinstance(e, Load):
            return masks[e] or self.emit("True")
        a, b = self._piece_mask(e.a, masks), self._piece_mask(e.b, masks)
        if a.text == b.text:
            return a
        c = self._uniform(e.cond)
        return self.emit(f"tl.where({c.text}, {a.text}, {b.text})", deps=[c, a, b])

    def _uniform(self, cond: Expr) -> _Value:
        """A test that holds alike over the tile (``uniform_test``), as a scalar: the tile's first
        position tested, placed where the axis's tile is known (its program, or its loop's chunk)."""
        name, threshold, below = uniform_test(cond, self.axis_info)
        key = ("uniform", name, threshold, below)
        got = self._lookup(key)
        if got is not None:
            return got
        a = self.axis_by_name[name]
        return self.emit(f"{self._start(a)} {'<' if below else '>='} {threshold}", deps=[self.linear(a)], key=key)

    def _and(self, conds: list[_Value]) -> _Value | None:
        if len(conds) > 1:
            return self.emit(" & ".join(c.text for c in conds), deps=conds)
        return conds[0] if conds else None

    def _bounds_checks(self, index, shape, tested=frozenset()) -> list[_Value]:
        """Conditions keeping an index inside its dims where analysis cannot prove it (padding),
        but those among ``tested`` (a guard's own tests)."""
        out = []
        for e, n in zip(index, shape):
            lo, hi = bounds(e, self.ranges)
            if n == 0:
                # an empty dim: its tensor holds nothing, the value is never used (a padded window
                # over it has tests that contradict each other, whose range analysis finds the
                # index range empty, which the test below would take for in bounds), and the load,
                # which Triton runs at every position, must read nothing
                out.append(self.emit(f"tl.full({self.shape(())}, False, tl.int1)", key=("never",)))
                continue
            if lo >= 0 and hi <= n - 1:
                continue
            v = None
            if lo < 0 and Binary("ge", e, Const(0, e.dtype)) not in tested:
                v = self.value(e, index=True)
                out.append(self.emit(f"{v.text} >= 0", deps=[v], key=("ge0", e)))
            if hi > n - 1 and Binary("lt", e, Const(n, e.dtype)) not in tested:
                v = v or self.value(e, index=True)
                out.append(self.emit(f"{v.text} < {n}", deps=[v], key=("lt", e, n)))
        return out

    # ---------------------------------------------------------------- statements
    def statements(self, body) -> None:
        for st in body:
            if isinstance(st, Loop):
                self._loop(self.axis_by_name[st.axis], lambda st=st: self.statements(st.body), st.state, st.stop,
                           st.start, st.until, st.resume, st.unroll, self._streams((st,)), self._specialized(st))
            elif isinstance(st, Reduce):
                self._reduce(st)
            elif isinstance(st, Store):
                self._store(st)
            elif isinstance(st, Dot):
                self._dot(st)
            elif isinstance(st, Arrive):
                self._arrive(st)
            else:
                raise TypeError(f"unknown statement {type(st).__name__}")

    def _streams(self, body) -> bool:
        """Whether a loop over ``body`` is one Triton pipelines only when its ``tl.range`` asks
        (``num_stages``): no tensor-core product inside (a loop of ``tl.dot`` takes the kernel's
        stages by itself) and no load of what this launch's other programs store (read through
        L2 after an acquire, not copied ahead of it).  A plain ``range`` over loads reduced on
        CUDA cores (a GEMV's K loop, a long row's reduction) waits each chunk's round trip: the
        sm_90 binaries show 16-byte loads and no cp.async at any ``num_stages``; through
        ``tl.range`` they are cp.async copies ``num_stages - 1`` chunks ahead."""
        if self.k.num_stages <= 1:
            return False
        for st in body:
            if isinstance(st, (Dot, Arrive)):
                return False
            if isinstance(st, Loop):
                if not self._streams(st.body):
                    return False
                exprs = [x.next for x in st.state]
            elif isinstance(st, Reduce):
                exprs = [st.value]
            else:
                exprs = list(st.index) + [st.value] + list(st.guards)
            if any(isinstance(n, Load) and n.tensor in self.k.written for x in exprs for n in walk(x)):
                return False
        return True

    def _specialized(self, loop: Loop) -> bool:
        """Whether ``loop`` is the one Triton's pass splits between warp groups (``Kernel.specialized``):
        the loop of the kernel's products, from its first chunk."""
        if not self.k.specialized or not _has_dot(loop.body):
            return False
        if loop.start or loop.until or loop.resume or loop.unroll:
            # (a loop split in two fails in the pass, sm_90, Triton 3.6 and 3.9; one ending per row
            # tile, a causal key loop, compiles)
            raise ValueError(f"kernel {self.k.name}: a warp-specialized loop over {loop.axis} is one loop "
                             f"from the first chunk")
        return True

    def _range(self, first: str, end: str, a: TileAxis, streams: bool, specialized: bool = False) -> str:
        """A loop's iterator over ``a``'s chunks (``_streams``, ``_specialized``)."""
        if specialized:
            return f"tl.range({first}, {end}, {a.block_name}, warp_specialize=True)"
        if self.k.phase or streams:   # (a persistent kernel's phases each keep their own depth)
            return f"tl.range({first}, {end}, {a.block_name}, num_stages={self.k.num_stages})"
        return f"range({first}, {end}, {a.block_name})"

    def _loop(self, a: TileAxis, body, state=(), stop=None, start=None, until=None, resume=False,
              unroll=False, streams=False, specialized=False) -> None:
        """``body`` over every chunk of ``a`` (no loop at all when the axis is whole), carrying
        ``state``: each state is a loop variable ``st<slot>``, set before the loop and replaced
        by all the states' next values at once at the end of every iteration; ``stop`` ends the
        loop early (``Loop.stop``), ``start`` begins it late (``Loop.start``), ``until`` ends it
        before the chunks the program's first row would mask, at ``<axis>_split``, where the
        next loop ``resume``s with the states as they are (``Loop.until``, ``Loop.resume``);
        ``unroll``: ``tl.static_range`` (``Loop.unroll``)."""
        looped = a.looped and a.name not in self.scope.bound
        if not looped and until is not None:
            return                  # one chunk: the loop that resumes runs it, from the states' start
        resume = resume and looped
        if not looped and not state:
            body()
            return
        outer = self.scope
        # a state of a one-chunk loop still gets its own scope: what reads the state before the
        # update must not be reused after it
        inner = _Scope(outer, outer.bound | self.binds[a.name], outer.indent + ("    " if looped else ""),
                       full=self.binds[a.name] if until is not None else frozenset())
        names = [f"st{st.slot}" for st in state]
        for st, name in zip(state, names):
            shape, ty = self.shape(st.axes), TL[st.next.dtype]
            if resume:          # the states go on from the loop before
                pass
            elif isinstance(st.init, Const):
                outer.lines.append(f"{outer.indent}{name} = tl.full({shape}, {literal(st.init.value, st.next.dtype)}, {ty})")
            else:
                v = self.value(st.init)
                outer.lines.append(f"{outer.indent}{name} = tl.broadcast_to({v.text}, {shape}).to({ty})")
            self.results[st.slot] = _Value(name, frozenset(st.axes), inner.depth)
        self.scopes.append(inner)
        body()
        if state:
            nexts = []
            for st in state:
                v = self.value(st.next)
                if self.tiled(v) != frozenset(st.axes):
                    v = self.emit(f"tl.broadcast_to({v.text}, {self.shape(st.axes)})", axes=st.axes, deps=[v])
                nexts.append(v)
            inner.lines.append(f"{inner.indent}{', '.join(names)} = {', '.join(v.text for v in nexts)}")
        self.scopes.pop()
        if looped:
            end = str(a.reach)
            if stop is not None:
                p = self.axis_by_name[stop[0]]
                end = f"tl.minimum({a.reach}, ({self._pid(p)} + 1) * {p.block_name} + {stop[1]})"
            first = "0"
            if start is not None:
                p = self.axis_by_name[start[0]]
                first = (f"tl.maximum({self._pid(p)} * {p.block_name} - {start[1]}, 0) // {a.block_name} "
                         f"* {a.block_name}")
            if resume:
                first = f"{a.name}_split"
            if until is not None:
                p = self.axis_by_name[until[0]]
                end = f"{a.name}_split"
                outer.lines.append(f"{outer.indent}{end} = tl.maximum(tl.minimum({a.reach}, {self._pid(p)} * "
                                   f"{p.block_name} + {until[1] + 1}) // {a.block_name} * {a.block_name}, {first})")
            if unroll:
                head = f"tl.static_range({first}, {end}, {a.block_name})"
            else:
                head = self._range(first, end, a, streams, specialized)
            outer.lines.append(f"{outer.indent}for {a.name}_start in {head}:")
        outer.lines.extend(inner.lines or [f"{inner.indent}pass"])
        for st, name in zip(state, names):
            self.results[st.slot] = _Value(name, frozenset(st.axes), outer.depth)

    def _arrive(self, st: Arrive) -> None:
        """Count the arrival (after a barrier, so the program's stores precede it, and with
        acquire-release semantics, so the last program sees every other's) and run the body in the
        last program of the group; its loads of ``written`` inputs bypass L1."""
        group = ""
        for name in st.axes:
            a = self.axis_by_name[name]
            pid = self._pid(a)
            group = pid if not group else f"{_paren(group)} * {max(a.chunks, 1)} + {pid}"
        outer = self.scope
        ind = outer.indent
        inner = _Scope(outer, outer.bound, ind + "    ", fence=True)
        self.scopes.append(inner)
        self.statements(st.body)
        self.scopes.pop()
        ptr = f"out{st.counter} + {_paren(group or '0')}"
        outer.lines += [f"{ind}tl.debug_barrier()",
                        f"{ind}arrived = tl.atomic_add({ptr}, 1, sem=\"acq_rel\")",
                        f"{ind}if arrived == {st.count - 1}:",
                        f"{ind}    tl.store({ptr}, 0)"]
        outer.lines.extend(inner.lines)

    def _reduce(self, r: Reduce) -> None:
        a = self.axis_by_name[r.axis]
        fl = r.acc_dtype.is_float
        red, comb = (REDUCE_FLOAT, COMBINE_FLOAT) if fl else (REDUCE_INT, COMBINE_INT)
        init = literal(r.init, r.acc_dtype)
        if not a.looped or a.name in self.scope.bound:     # whole, or this chunk of an enclosing loop
            tile = self._padded(self._typed(r), a, init, r.acc_dtype)
            out = self.emit(self._reduction(red[r.combiner], tile.text, a, tile.axes, r.acc_dtype), deps=[tile],
                            reduced=(a.name,))
        else:
            outer = self.scope
            acc = f"acc{r.slot}"
            inner = _Scope(outer, outer.bound | {a.name}, outer.indent + "    ")
            self.scopes.append(inner)
            tile = self._padded(self._typed(r), a, init, r.acc_dtype)
            axes = tile.axes | {a.name}
            inner.lines.append(f"{inner.indent}{acc} = {comb[r.combiner].format(a=acc, b=tile.text)}")
            self.scopes.pop()
            outer.lines.append(f"{outer.indent}{acc} = tl.full({self.shape(axes)}, {init}, {TL[r.acc_dtype]})")
            head = self._range("0", str(a.reach), a, self._streams((r,)))
            outer.lines.append(f"{outer.indent}for {a.name}_start in {head}:")
            outer.lines.extend(inner.lines)
            out = self.emit(self._reduction(red[r.combiner], acc, a, axes, r.acc_dtype),
                            axes=axes - {a.name}, deps=[_Value(acc, frozenset(), outer.depth)])
        if r.out_dtype is DType.bool:
            out = self.emit(f"{out.text} != 0", deps=[out])
        elif r.out_dtype is not r.acc_dtype:
            out = self.emit(f"{out.text}.to({TL[r.out_dtype]})", deps=[out])
        self.results[r.slot] = out

    def _reduction(self, rule: str, text: str, a: TileAxis, axes: frozenset, dt: DType) -> str:
        """``rule`` over axis ``a`` of the tile ``text`` (over ``axes``).  Without a tensor-core
        product, a tile that varies along ``a`` alone is reduced as a 1-D row and its sum put back
        in the kernel's rank: reduced in place, a [1, 1, 2048] row summed before a pipelined K loop
        on CUDA cores (a decode GEMV's RMSNorm prologue) spills 6 KB a thread in the sm_90 binary,
        through the 1-D row it holds 113 registers and spills nothing.  Not before a ``tl.dot``:
        there the 1-D row's sum takes the product's operand to 203 registers from 108 (the same
        prologue at 16 x 256 x 128 on mma.sync; tests/test_native.py)."""
        if self.flat_rows and axes - self.scalar == {a.name}:
            row = _typed_reduction(rule.format(v=f"tl.reshape({text}, [{a.block_name}])", d=0), dt)
            return f"tl.reshape({row}, {self.shape(())})"
        return _typed_reduction(rule.format(v=text, d=a.dim), dt)

    def _dot(self, d: Dot) -> None:
        """``acc += a @ b`` over the chunks of K (one ``tl.dot`` when K is whole), accumulating in
        fp32; the product is then rounded to the contraction's type, as the library rounds its
        output.  Operand positions past K's extent are zeroed after the prologue arithmetic (a
        masked load reads 0, but what the prologue computes from it need not be 0)."""
        k = self.axis_by_name[d.k]
        prec = ', input_precision="ieee"' if d.in_dtype is DType.float32 else ""
        acc_axes = frozenset({d.m, d.n})
        looped = k.looped and k.name not in self.scope.bound     # else one chunk: an enclosing loop's
        start = None
        if d.init is not None:
            start = self.value(d.init)
            if self.tiled(start) != acc_axes:
                start = self.emit(f"tl.broadcast_to({start.text}, {self.shape(acc_axes)})", axes=acc_axes,
                                  deps=[start])
        outer = self.scope
        if looped:
            inner = _Scope(outer, outer.bound | self.binds[k.name], outer.indent + "    ")
            self.scopes.append(inner)
        a = self._operand(d.a, (d.m, d.ka), d.ka, d.in_dtype)
        b = self._operand(d.b, (d.k, d.n), d.k, d.in_dtype)
        if looped:
            acc = f"acc{d.slot}"
            self.scope.lines.append(f"{self.scope.indent}{acc} = tl.dot({a.text}, {b.text}, {acc}{prec})")
            body = self.scopes.pop().lines
            first = start.text if start is not None else f"tl.zeros({self.shape(acc_axes)}, dtype=tl.float32)"
            outer.lines.append(f"{outer.indent}{acc} = {first}")
            head = (f"tl.range(0, {k.extent}, {k.block_name}, warp_specialize=True)"
                    if self.k.specialized else f"range(0, {k.extent}, {k.block_name})")
            outer.lines.append(f"{outer.indent}for {k.name}_start in {head}:")
            outer.lines.extend(body)
            out = _Value(acc, acc_axes, max(outer.depth, start.depth if start is not None else 0))
        else:
            into = f", {start.text}" if start is not None else ""
            out = self.emit(f"tl.dot({a.text}, {b.text}{into}{prec})", axes=acc_axes,
                            deps=[a, b] + ([start] if start is not None else []),
                            reduced=(d.k, d.ka), name=f"acc{d.slot}")
        if d.out_dtype is not DType.float32:
            out = self.emit(f"{out.text}.to({TL[d.out_dtype]})", deps=[out])
        self.results[d.slot] = out

    def _operand(self, e: Expr, axes: tuple[str, str], kaxis: str, dt: DType) -> _Value:
        """A dot operand as a whole 2-D tile over ``axes`` in ``dt``, zero past K's extent."""
        v = self._described(e, axes) if self.k.tma else None
        if v is None and self.k.specialized and \
                any(isinstance(n, Load) and n.index for n in walk(e)):
            # Triton's pass moves the loop's loads to the producer group: copies, not arithmetic
            # (an operand computed from memory in registers fails inside the pass: sm_90, Triton 3.6
            # and 3.9); one the consumers computed on chip (a chain's probabilities) stays theirs
            raise ValueError(f"kernel {self.k.name}: a warp-specialized loop reads its operands through "
                             f"tensor descriptors; the one over {axes} is not a whole input tile")
        if v is None:
            v = self.value(e)
        if e.dtype is not dt:
            v = self.emit(f"{v.text}.to({TL[dt]})", deps=[v])
        ka = self.axis_by_name[kaxis]
        # a masked memory load over K reads 0 past it (a guarded one too); an on-chip tile (a
        # chain's scores: Load of a result slot, no index) holds whatever the first product made
        # of its padded columns
        guarded = guarded_load(e)
        ld = guarded[0] if guarded else e
        if self.masked(ka) and not (isinstance(ld, Load) and ld.index and kaxis in v.axes):
            m = self.mask(ka)
            v = self.emit(f"tl.where({m.text}, {v.text}, 0.0).to({TL[dt]})", deps=[v, m])
        if self.tiled(v) != frozenset(axes):
            v = self.emit(f"tl.broadcast_to({v.text}, {self.shape(axes)})", axes=axes, deps=[v])
        return v

    def _described(self, e: Expr, axes: tuple[str, str]) -> _Value | None:
        """The operand read through a tensor descriptor (TMA on sm_90: one bulk copy per tile, no
        per-value addresses or masks; positions past the tensor read as zeros), or None where it
        is not a whole input tile: each tile axis one variable indexing a dim of its own extent,
        the innermost dim among them, the other dims per-program positions (a batch), every
        stride a whole number of 16 bytes.  A concatenation read in place is read through the
        descriptor of the piece the program's tile lies in (``_described_pieces``)."""
        if self.rank != 2 or self.idt is DType.int64:
            return None         # (descriptor coordinates are 32-bit)
        if isinstance(e, Select):
            return self._described_pieces(e, axes)
        if not isinstance(e, Load) or e.tensor in self.k.written:
            return None
        t = self.k.inputs[e.tensor]
        # (a split-K program's chunk: at a shift, where no tile runs past the chunk)
        whole = tuple(n for n in axes if not self.axis_by_name[n].masked)
        where = descriptor_dims(e, t.shape, self.axis_info, axes, self.extents, shifted=whole)
        if where is None or any(self.axis_by_name[n].block * e.dtype.itemsize < 16 for n in axes):
            return None
        shifts = {}
        for d in where.values():
            _, shift = tile_shift(e.index[d], self.axis_info)
            if shift is not None:
                shifts[d] = self.value(shift, index=True)
        offsets, blocks, deps = self._box(e.index, where, shifts)
        shape = t.shape
        if self.k.specialized and t.rank > 2:
            # Triton's pass fails on a reshaped box of more than two dims (sm_90, Triton 3.6 and
            # 3.9): the leading dims flattened into the rows, where no row tile crosses them
            flat = self._flattened(t.shape, where, offsets, blocks)
            if flat is None:
                return None
            shape, offsets, blocks, where = flat
        top = self.scopes[0]
        key = ("desc", e.tensor, tuple(blocks))
        desc = top.memo.get(key)
        if desc is None:
            desc = f"desc{e.tensor}_{sum(isinstance(k, tuple) and k[0] == 'desc' for k in top.memo)}"
            strides = [str(math.prod(shape[d + 1:])) for d in range(len(shape))]
            top.lines.insert(0, f"{top.indent}{desc} = tl.make_tensor_descriptor(in{e.tensor}, "
                                f"[{', '.join(map(str, shape))}], [{', '.join(strides)}], [{', '.join(blocks)}])")
            top.memo[key] = desc
        return self._boxed(desc, offsets, where, axes, deps)

    def _flattened(self, shape: tuple, where: dict[str, int], offsets: list[str], blocks: list[str]):
        """A box over the last two dims of ``shape`` as one over ``[rows, columns]``, the dims before
        the columns flattened into rows: (shape, offsets, blocks, where), or None where a tile of the
        rows could run past its dim (ragged: the flat rows would read the next position's, not zeros)."""
        r = len(shape)
        dims = {d: n for n, d in where.items()}
        if sorted(dims) != [r - 2, r - 1] or self.axis_by_name[dims[r - 2]].masked:
            return None
        terms = [f"{_paren(o)} * {math.prod(shape[d + 1:r - 1])}" for d, o in enumerate(offsets[:r - 2]) if o != "0"]
        row = " + ".join(terms + [offsets[r - 2]])
        return ((math.prod(shape[:r - 1]), shape[r - 1]), [row, offsets[r - 1]], blocks[r - 2:],
                {dims[r - 2]: 0, dims[r - 1]: 1})

    def _described_pieces(self, e: Select, axes: tuple[str, str]) -> _Value | None:
        """A concatenation read in place (a merged Q/K/V weight) through one descriptor a program:
        made on the base and extents of the piece its tile lies in (each tested axis split across
        programs, every block dividing its threshold), read at the tile's position less the
        piece's start (``kernel.piece_descriptors``)."""
        got = piece_descriptors(e, [t.shape for t in self.k.inputs], self.axis_info, axes, self.extents)
        if got is None:
            return None
        where, index, shifts = got
        if any(ld.tensor in self.k.written for ld in shifts) or \
                any(self.axis_by_name[n].block * e.dtype.itemsize < 16 for n in axes):
            return None
        for name, threshold, _ in piece_tests(e, self.axis_info):
            a = self.axis_by_name[name]
            if a.grid is None or a.within or threshold % a.block:
                return None
        rank = len(index)
        if self.k.specialized and rank > 2:
            return None             # (``_flattened``: one descriptor's rows, not a piece's)

        def chosen(leaf) -> _Value:
            return self._chosen(e, lambda ld: _Value(leaf(ld), frozenset(), 0))
        base = chosen(lambda ld: f"in{ld.tensor}")
        extents = [chosen(lambda ld, d=d: str(self.k.inputs[ld.tensor].shape[d])) for d in range(rank)]
        offsets, blocks, deps = self._box(index, where, {d: chosen(lambda ld, d=d: str(shifts[ld][d]))
                                                          for d in range(rank)})
        shape = self.k.inputs[next(iter(shifts)).tensor].shape
        strides = [str(math.prod(shape[d + 1:])) for d in range(rank)]
        desc = self.emit(f"tl.make_tensor_descriptor({base.text}, [{', '.join(x.text for x in extents)}], "
                         f"[{', '.join(strides)}], [{', '.join(blocks)}])", deps=[base, *extents])
        return self._boxed(desc.text, offsets, where, axes, deps + [desc])

    def _box(self, index: tuple, where: dict[str, int], shifts: dict[int, _Value]):
        """(offsets, block shape, what they read) of a descriptor's box at the tile: the tile's
        start (plus ``shifts[d]``, a piece's) along its axes' dims, a position elsewhere."""
        offsets: list[str] = []
        blocks: list[str] = []
        deps: list[_Value] = []
        tile_dims = {d: n for n, d in where.items()}
        for d, x in enumerate(index):
            if d in tile_dims:
                a = self.axis_by_name[tile_dims[d]]
                deps.append(self.linear(a))         # (placed where the axis is bound)
                shift = shifts.get(d)
                if shift is not None and shift.text != "0":
                    deps.append(shift)
                    offsets.append(f"{self._start(a)} + {_paren(shift.text)}")
                else:
                    offsets.append(self._start(a))
                blocks.append(a.block_name)
            elif isinstance(x, Var) and self.extents.get(x) == 1:
                offsets.append("0")                 # (descriptor_dims: a variable of extent 1)
                blocks.append("1")
            else:
                v = self.value(x, index=True)
                deps.append(v)
                offsets.append(v.text)
                blocks.append("1")
        return offsets, blocks, deps

    def _boxed(self, desc: str, offsets: list[str], where: dict[str, int], axes: tuple[str, str],
               deps: list[_Value]) -> _Value:
        """The box loaded through ``desc`` as a tile over ``axes`` (transposed where its dims are
        stored the other way)."""
        stored = sorted(axes, key=lambda n: where[n])            # the tile's axes in memory order
        wanted = sorted(axes, key=lambda n: self.axis_by_name[n].dim)
        text = (f"tl.reshape({desc}.load([{', '.join(offsets)}]), "
                f"[{', '.join(self.axis_by_name[n].block_name for n in stored)}])")
        if stored != wanted:
            text = f"tl.trans({text})"
        return self.emit(text, axes=axes, deps=deps)

    def _chosen(self, e: Expr, leaf) -> _Value:
        """``leaf(load)`` of the piece of a concatenation the tile lies in (a scalar)."""
        if isinstance(e, Load):
            return leaf(e)
        a, b = self._chosen(e.a, leaf), self._chosen(e.b, leaf)
        if a.text == b.text:
            return a
        c = self._uniform(e.cond)
        return self.emit(f"tl.where({c.text}, {a.text}, {b.text})", deps=[c, a, b])

    def _start(self, a: TileAxis) -> str:
        """The first position of the program's (or this chunk's) tile of axis ``a``."""
        target = self.axis_by_name[a.alias] if a.alias else a
        if a.grid is not None:
            return f"{self._pid(a)} * {a.block_name}"
        if target.looped:
            return f"{target.name}_start"
        return "0"

    def _typed(self, r: Reduce) -> _Value:
        v = self.value(r.value)
        return v if r.value.dtype is r.acc_dtype else self.emit(f"{v.text}.to({TL[r.acc_dtype]})", deps=[v])

    def _padded(self, v: _Value, a: TileAxis, init: str, dt: DType) -> _Value:
        """``v`` over the whole tile of axis ``a``, the identity where the axis runs past its extent."""
        axes = v.axes | {a.name}
        if self.masked(a):
            m = self.mask(a)
            text = f"tl.where({m.text}, {v.text}, {init})"
            if dt not in _LITERAL_EXACT:
                text = f"{text}.to({TL[dt]})"
            return self.emit(text, deps=[v, m])
        if a.name not in v.axes:
            return self.emit(f"tl.broadcast_to({v.text}, {self.shape(axes)})", axes=axes, deps=[v])
        return v

    def _store(self, s: Store) -> None:
        t = self.k.outputs[s.output]
        off = self.offset(s.index, t.shape)
        val = self.value(s.value)
        guards = [self.value(g) for g in s.guards]
        axes = off.axes | val.axes | frozenset().union(*(g.axes for g in guards))
        conds = self.masks(axes) + guards
        ptr = f"out{s.output} + {_paren(off.text)}"
        # (a position on no tile axis is still stored as a [1, ..., 1] tile: its value may be one,
        # a constant or a reduction kept in its dims, where every tile axis has one position)
        if self.tiled(off) != axes - self.scalar or not axes - self.scalar:
            ptr = f"out{s.output} + tl.broadcast_to({off.text}, {self.shape(axes)})"
        text = val.text if s.value.dtype is t.dtype else f"{val.text}.to({TL[t.dtype]})"
        mask = f", mask={' & '.join(c.text for c in conds)}" if conds else ""
        deps = [off, val] + conds
        home = self._home(axes, max(d.depth for d in deps))
        home.lines.append(f"{home.indent}tl.store({ptr}, {text}{mask})")

    # ---------------------------------------------------------------- the module
    def source(self) -> str:
        k = self.k
        self.statements(k.body)
        ins = [f"in{j}" for j in range(len(k.inputs))]
        outs = [f"out{j}" for j in range(len(k.outputs))]
        consts = [f"{b}: tl.constexpr" for b in dict.fromkeys(a.block_name for a in k.axes)]
        if k.phase:
            outs += [f"pid{g}" for g in range(len(k.grid))]
        head = [f"# {line}" for line in k.comments]
        body = self.scopes[0].lines or ["    pass"]
        text = "\n".join(body)
        # only what the body calls: libdevice and the combiners
        imports = ["import triton", "import triton.language as tl"] + ([LIBDEVICE] if "libdevice." in text else [])
        helpers = [src.rstrip("\n") for name, src in HELPERS.items() if re.search(rf"\b{name}\b", text)]
        kernel = "\n".join(["@triton.jit", f"def {k.name}({', '.join(ins + outs + consts)}):", *body])
        return "\n".join(head + imports) + "\n\n\n" + "\n\n\n".join(helpers + [kernel]) + "\n"


# Types a Python literal combined with a tile of them leaves unchanged.
_LITERAL_EXACT = (DType.float32, DType.float64, DType.int32, DType.int64)


def _has_dot(body) -> bool:
    return any(isinstance(st, Dot) or isinstance(st, (Loop, Arrive)) and _has_dot(st.body) for st in body)


def _typed_reduction(text: str, dt: DType) -> str:
    """Triton widens narrow integer sums; floats keep their type."""
    return text if dt.is_float else f"{text}.to({TL[dt]})"


def _offset_form(index: tuple[Expr, ...], shape: tuple[int, ...]) -> tuple[dict, int]:
    """Row-major element offset of ``index`` into ``shape`` as ({atom: coefficient}, constant)."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    total = None
    for e, st in zip(index, strides):
        lin = linear_form(e) if e.dtype is INDEX else None
        if lin is None:
            part = {e: st}, 0
        else:
            part = {a: c * st for a, c in lin.terms.items()}, lin.const * st
        total = part if total is None else _add_forms(total, part)
    return total if total is not None else ({}, 0)


def _add_forms(x, y):
    terms = dict(x[0])
    for a, c in y[0].items():
        terms[a] = terms.get(a, 0) + c
    return {a: c for a, c in terms.items() if c}, x[1] + y[1]


def _runs(ext: tuple[int, ...], coeffs: dict[int, int]) -> list[tuple[int, int, int]]:
    """Split the axis's variables with coefficients into maximal runs j..l that enumerate a
    contiguous row-major block (coeff[m] = s·prod(ext[m+1..l]) for every m in j..l; variables of
    extent 1 are skipped).  Returns (j, l, s) per run: the run's position is a slice of the axis's
    linear index, scaled by s."""
    runs: list[tuple[int, int, int]] = []
    for j in sorted(coeffs):
        if runs and _extends(ext, coeffs, runs[-1][0], j):
            runs[-1] = (runs[-1][0], j, coeffs[j])
        else:
            runs.append((j, j, coeffs[j]))
    return runs


def _extends(ext, coeffs, j0: int, l: int) -> bool:
    """Whether variables j0..l (with coefficients) enumerate a row-major block ending at l."""
    s = coeffs[l]
    return all(coeffs.get(m, 0) == s * math.prod(ext[m + 1:l + 1]) for m in range(j0, l + 1) if ext[m] != 1)


def _positions_only(e: Expr) -> bool:
    """Whether ``e`` computes positions only (tile variables and literals), reading no data."""
    return not any(isinstance(n, (Load, Value)) for n in walk(e))


_INDEX_OPS = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "mod": "%"}


def _index_text(e: Expr) -> str:
    """Triton text of a non-negative scalar index expression (a task mapping's coordinate)."""
    if isinstance(e, Var):
        return e.name
    if isinstance(e, Const):
        return str(int(e.value))
    if isinstance(e, Binary) and e.op == "min":
        return f"tl.minimum({_index_text(e.a)}, {_index_text(e.b)})"
    if isinstance(e, Binary) and e.op in _INDEX_OPS:
        return f"{_paren(_index_text(e.a))} {_INDEX_OPS[e.op]} {_paren(_index_text(e.b))}"
    raise TypeError(f"not an index expression: {e!r}")


def _paren(text: str) -> str:
    return text if re.fullmatch(r"[\w.]+", text) else f"({text})"


def _may_retype(rule: str, dtype: DType) -> bool:
    """Whether Triton's promotion could change the result type (literals, narrow types)."""
    return dtype not in (DType.float32, DType.int64) or re.search(r"\b\d", rule) is not None


def _conjuncts(e: Expr) -> frozenset:
    """The tests a conjunction is made of (``a & b & c``: a, b and c)."""
    if isinstance(e, Binary) and e.op == "and":
        return _conjuncts(e.a) | _conjuncts(e.b)
    return frozenset({e})
