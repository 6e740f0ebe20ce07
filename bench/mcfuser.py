"""MCFuser's schedule space for a chain of two contractions (SC'24 §III–IV; the specification is
shared/papers/mcfuser-notes.md §2.2–3.5): tiling expressions, statement placement, the four
pruning rules, the analytic model, the short evolutionary search, and the sub-space the chain
family's Triton template implements.

**The chain.**  ``C = A×B`` (M×K by K×N), ``E = f(C)×D`` (M×N by N×H), optionally batched.  Each
dimension has a cross-tile loop (m, n, k, h) of extent ⌈D/T_D⌉ for a tile size T_D.  The chain is
a rule table (``DIMS``, ``REDUCE``, ``READS``) of six primitive statements in program order,
``LA LB CC LD CE SE`` (Load, Compute, Store), each with its *related loops*, those indexing its tile.

**Tiling expressions** are trees: ``Loop(name, children)`` runs its children in order inside the
loop, ``Seq`` is a sequence outside every loop, ``Stmt`` a statement.  The canonical string writes
a loop with one loop child by juxtaposition (``mhnk``), otherwise with parentheses:
``mh(n(k(LA,LB,CC),LD,CE),SE)``.  ``deep()`` is every nesting of the four loops (24), ``flat()``
the shared loops (m, n) in either order around one sub-nest per compute: ``mn(k,h)``, ``nm(k,h)``.

**Placement** (§2.4–2.5).  ``expand`` eliminates dead loops (extent 1: the variable is the
constant 0, so the loop goes and its body hoists), puts each Compute in its innermost related loop
and attaches Loads and Stores to their Compute: ``mhnk`` gives ``mhn(k(LA,LB,CC),LD,CE,SE)``.
``relocate`` moves each memory statement out to its innermost related loop (``mh(n(k(LA,LB,CC),
LD,CE),SE)``); a Store also leaves its Compute's reduction loop, since E is final only when n
closes.  Statements in one scope are ordered by their dependences (loads before their compute, CC
before CE, CE before SE).  CE placed inside k, C's reduction loop, would read a partial C; such an
expression (``kn`` per block, or an unbound ``mnkh``) raises: it needs several C tiles cached,
which is what Rule 2 prunes.  ``place`` = ``relocate`` ∘ ``expand``.

**Trip counts** multiply the extents of a statement's loops, times the batch.  Two conventions
(notes §3.2, "open ambiguity"; test T9): ``literal``, the paper's, counts the loops written around
the statement, so hoisting a load out of the blockIdx-bound m loop divides its traffic by m even
though every thread block loads its own tile; ``block`` (block-aware) always counts the bound loops,
as the hardware does.  Placement is the same under both; only the counting differs.

**Volumes** (Eq. 3–4).  A memory statement moves, over the grid, the in-bounds elements of its
tensor (Π of its dimensions: masked loads move nothing outside) times the extents of its trip
loops that do not index it; a compute does 2·Π(padded tile dims) FLOPs per trip (tensor cores
compute whole tiles).  With tiles that divide their dimensions this is the paper's "tile size ×
trip count"; a statement placed outside one of its related loops (the flat form's SE after n
closes) covers that loop's whole range, which the paper's formula would miss.

**Rules** (§3.3).  Rule 1 (``bind``) binds the output's spatial loops (m, h) on the spine (loops
that enclose everything) to blockIdx and removes them, leaving the per-block *sub-tiling*: ``mhnk``
and ``mnkh`` both give ``nk``.  Rule 2 (``caches_intermediate``) prunes sub-tilings in which C's
reduction loop k encloses C's spatial loop n (``kn``).  Rule 3 (``tile_sizes``) keeps multiples of
16 up to D (⌈D/16⌉ options, as the paper counts the space): divisors for a power-of-two
dimension, else padding (⌈D/T⌉·T − D)/D below 5%; it keeps nothing for some dimensions (M = 100:
112 pads 12%, 16 pads 12%), and then the space is empty.  Rule 4
(``fits_smem``) keeps Eq. 1, Σ tile areas of the five 2-D tensors × element size, within 1.2× the
shared memory a block may use.  Eq. 1 counts one E tile; the flat ``n(k,h)`` keeps h of them live
across n, which it does not see.

*The 26 → 5 → 3 expressions the paper reports.*  The paper does not list them.  Binding m and h
reduces every deep permutation to ``nk`` or ``kn`` and both flat ones to ``n(k,h)`` (h sits in a
sequence there, enclosing no statement of C, so it is not bound): 3 classes, 2 after Rule 2.
That is what ``classes(..., convention="block")`` gives, and under the block-aware count it is
exact: the order of the bound loops changes nothing.  Under the ``literal`` count it does: with k
dead, ``mh|nk`` hoists LA to m (m trips) but ``hm|nk`` leaves it inside h (h·m), so the class must
keep the binding order, and ``classes(..., convention="literal")`` gives 5 (``mh|nk``, ``hm|nk``,
``mh|kn``, ``hm|kn``, ``m|n(k,h)``), 3 after Rule 2: the paper's counts.  That this is how the
paper counted is our inference, not something it states.

**Model** (Eq. 2–5, ``estimate``): t_mem = bytes / 𝒲, t_comp = FLOPs / 𝒫, α = (blocks + SMs) /
blocks with blocks = batch × Π bound extents, t = (t_mem + t_comp)·α.  α comes from
``cost.model.parallelism``; it multiplies a time only inside this ranking model (tilefuse's own
cost model never does).

**Search** (Alg. 1, ``search``): N random candidates of the pruned space; each round ranks the
population's distinct candidates by the model, measures the top n (8) with the caller's
``measure``, stops when the round's best differs from the running best by less than ε
(relatively), else draws N parents with weights 1/estimate and mutates one loop's tile size in
each.  Choices the paper leaves open (notes §3.5): the difference is relative; parents are drawn
with replacement; a mutation picks a loop uniformly among those with another allowed size that
keeps Rule 4, then one of those sizes uniformly (a candidate with none is kept as it is); the
tiling expression never mutates (the first population draws it uniformly); measurements are
cached, so no candidate is measured twice (a round whose fastest is the running best again
converges at once); on convergence the faster of the round's best and the running best is
returned (Alg. 1 returns the round's); a round limit bounds the search.

**The Triton space** (``chain_tiles``, ``chain_traffic``, ``chain_flops``).  ``tl.arange`` needs
power-of-two extents, and ``n(k,h)`` with h > 1 would keep all of E's H columns live, so the
kernel template implements the ``nk`` sub-tiling only: a grid over (batch, m tiles, h tiles), an n
loop, the k loop inside it, or k whole (extent 1: the A tile hoisted out of the n loop).  Each
tile size is the whole dimension padded to a power of two (up to 256; Rule 3 does not apply, the
template pads to a power of two anyway) or a smaller power of two from 16 that Rule 3 keeps; Rule
4 bounds the five tiles a program holds.  Traffic and FLOPs come from the same placement and
counting as the model's, under the block-aware convention by default.
"""
from __future__ import annotations

import itertools
import math
import random
from dataclasses import astuple, dataclass, replace
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

from tilefuse.codegen.kernel import pow2
from tilefuse.cost.model import parallelism
from tilefuse.cost.target import Target
from tilefuse.families.chain.space import ChainShape, held_sizes, streamed_sizes
from tilefuse.ir.dtypes import DType

# ---------------------------------------------------------------- the chain, as rule tables

LOOPS = ("m", "n", "k", "h")
DIMS = {"A": ("m", "k"), "B": ("k", "n"), "C": ("m", "n"), "D": ("n", "h"), "E": ("m", "h")}
REDUCE = {"C": "k", "E": "n"}               # each compute's reduction loop
READS = {"C": ("A", "B"), "E": ("C", "D")}  # what each compute reads
OUTPUT = "E"
SPATIAL = DIMS[OUTPUT]                      # loops Rule 1 binds to blockIdx
CONVENTIONS = ("literal", "block")


@dataclass(frozen=True)
class Stmt:
    kind: str                   # L (load), C (compute), S (store)
    tensor: str
    loops: tuple[str, ...]      # related loops: those indexing its tile (a compute's: all of its own)

    def __str__(self) -> str:
        return self.kind + self.tensor


STMTS = (Stmt("L", "A", DIMS["A"]), Stmt("L", "B", DIMS["B"]), Stmt("C", "C", DIMS["C"] + (REDUCE["C"],)),
         Stmt("L", "D", DIMS["D"]), Stmt("C", "E", DIMS["E"] + (REDUCE["E"],)), Stmt("S", "E", DIMS["E"]))
_BY_NAME = {str(s): s for s in STMTS}
_ORDER = {s: i for i, s in enumerate(STMTS)}


def _producer(tensor: str) -> Stmt:
    """The statement that makes ``tensor`` available to a compute: its load, or its compute."""
    return _BY_NAME.get("L" + tensor) or _BY_NAME["C" + tensor]


def _deps(s: Stmt) -> tuple[Stmt, ...]:
    """Statements that must run before ``s`` (the DAG's order-dependent edges)."""
    if s.kind == "C":
        return tuple(_producer(t) for t in READS[s.tensor])
    return (_BY_NAME["C" + s.tensor],) if s.kind == "S" else ()


def _owner(s: Stmt) -> Stmt:
    """The compute a memory statement is attached to before relocation."""
    if s.kind == "S":
        return _BY_NAME["C" + s.tensor]
    return next(c for c in STMTS if c.kind == "C" and s.tensor in READS[c.tensor])


# ---------------------------------------------------------------- tiling expressions

@dataclass(frozen=True)
class Loop:
    name: str
    children: tuple[Node, ...] = ()

    def __str__(self) -> str:
        if not self.children:
            return self.name
        if len(self.children) == 1 and isinstance(self.children[0], Loop):
            return self.name + str(self.children[0])
        return f"{self.name}({','.join(map(str, self.children))})"


@dataclass(frozen=True)
class Seq:
    children: tuple[Node, ...]

    def __str__(self) -> str:
        if len(self.children) == 1:
            return str(self.children[0])
        return f"({','.join(map(str, self.children))})"


Node = Loop | Seq | Stmt


def parse(text: str) -> Loop | Seq:
    """A loop-only tiling expression: ``mhnk``, ``mn(k,h)``, ``(k,h)``."""
    s = text.replace(" ", "")
    err = ValueError(f"not a tiling expression over loops {''.join(LOOPS)}: {text!r}")

    def at(i: int) -> str:
        return s[i] if i < len(s) else ""

    def group(i: int) -> tuple[tuple[Loop, ...], int]:          # at(i) == "("
        out = []
        while True:
            node, i = one(i + 1)
            out.append(node)
            if at(i) == ")":
                return tuple(out), i + 1
            if at(i) != ",":
                raise err

    def one(i: int) -> tuple[Loop, int]:
        if at(i) not in LOOPS:
            raise err
        name, i = s[i], i + 1
        if at(i) in LOOPS:
            child, i = one(i)
            return Loop(name, (child,)), i
        if at(i) == "(":
            kids, i = group(i)
            return Loop(name, kids), i
        return Loop(name), i

    kids, i = group(0) if at(0) == "(" else ((), 0)
    node, i = (Seq(kids), i) if kids else one(0)
    letters = [c for c in s if c.isalpha()]
    if i != len(s) or len(letters) != len(set(letters)):
        raise err
    return node


def _nest(loops: Sequence[str], inner: tuple[Loop, ...] = ()) -> Loop:
    """``loops`` nested outer to inner around ``inner``."""
    node = Loop(loops[-1], inner)
    for name in reversed(loops[:-1]):
        node = Loop(name, (node,))
    return node


def deep() -> list[Loop]:
    """Deep tilings: every nesting of all the loops (24 for the chain's four)."""
    return [_nest(p) for p in itertools.permutations(LOOPS)]


def flat() -> list[Loop]:
    """Flat tilings: the loops both computes share, in any order, around a sequence of one sub-nest
    per compute over its private loops: ``mn(k,h)``, ``nm(k,h)`` (notes §3.1's pattern)."""
    computes = [s for s in STMTS if s.kind == "C"]
    shared = [x for x in LOOPS if all(x in c.loops for c in computes)]
    private = tuple(_nest([x for x in LOOPS if x in c.loops and x not in shared]) for c in computes)
    return [_nest(p, private) for p in itertools.permutations(shared)]


def _skeleton(nodes: Sequence[Node], drop: frozenset[str] = frozenset()) -> tuple[Loop, ...]:
    """The loops of ``nodes`` without statements, loops named in ``drop`` spliced into their parent."""
    out: list[Loop] = []
    for x in nodes:
        if isinstance(x, Seq):
            out += _skeleton(x.children, drop)
        elif isinstance(x, Loop):
            kids = _skeleton(x.children, drop)
            out += kids if x.name in drop else (Loop(x.name, kids),)
    return tuple(out)


def _loop_paths(loops: Sequence[Loop], above: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """Each loop's enclosing loops, outer to inner, itself last."""
    out = {}
    for x in loops:
        out[x.name] = above + (x.name,)
        out.update(_loop_paths(x.children, above + (x.name,)))
    return out


def _root(nodes: tuple[Loop, ...]) -> Loop | Seq:
    return nodes[0] if len(nodes) == 1 else Seq(nodes)


# ---------------------------------------------------------------- placement (§2.4–2.5)

@dataclass(frozen=True)
class Placement:
    tree: Seq                                 # live loops and the statements placed in them
    paths: Mapping[str, tuple[str, ...]]      # statement name -> its enclosing loops, outer to inner


def expand(expr: Node, ext: Mapping[str, int] | None = None) -> Placement:
    """Dead loops (extent 1) eliminated, each compute in its innermost related loop, loads and
    stores attached to their compute."""
    dead = frozenset(x for x, e in (ext or {}).items() if e == 1)
    loops = _skeleton((expr,), dead)
    where = _loop_paths(loops)
    paths: dict[str, tuple[str, ...]] = {}
    for c in (s for s in STMTS if s.kind == "C"):
        rel = sorted((where[x] for x in c.loops if x in where), key=len)
        path = rel[-1] if rel else ()
        if any(p != path[:len(p)] for p in rel):
            raise ValueError(f"{c}'s loops {'/'.join(p[-1] for p in rel)} are not nested in {expr}")
        for t in READS[c.tensor]:
            if t in REDUCE and REDUCE[t] in path:     # reads a partial intermediate
                raise ValueError(f"{c} would run inside {REDUCE[t]}, the reduction loop of C{t}, in "
                                 f"{expr}: several {t} tiles would have to be cached (Rule 2)")
        paths[str(c)] = path
    for s in STMTS:
        if s.kind != "C":
            paths[str(s)] = paths[str(_owner(s))]
    return Placement(_build(loops, paths), MappingProxyType(paths))


def relocate(p: Placement) -> Placement:
    """Each load and store moved out to its innermost related loop; a store also out of its
    compute's reduction loop (the value is final only when that loop closes)."""
    paths = dict(p.paths)
    for s in STMTS:
        if s.kind == "C":
            continue
        path = paths[str(s)]
        path = path[:max((i + 1 for i, x in enumerate(path) if x in s.loops), default=0)]
        if s.kind == "S" and REDUCE[s.tensor] in path:
            path = path[:path.index(REDUCE[s.tensor])]
        paths[str(s)] = path
    return Placement(_build(_skeleton((p.tree,)), paths), MappingProxyType(paths))


def place(expr: Node, ext: Mapping[str, int] | None = None) -> Placement:
    """Expansion, then relocation (``ext``: loop extents; absent loops are live)."""
    return relocate(expand(expr, ext))


def _build(loops: Sequence[Loop], paths: Mapping[str, tuple[str, ...]]) -> Seq:
    def scope(nodes: Sequence[Loop], here: tuple[str, ...]) -> tuple[Node, ...]:
        items = [Loop(x.name, scope(x.children, here + (x.name,))) for x in nodes]
        return _ordered(items + [s for s in STMTS if paths[str(s)] == here])
    return Seq(scope(loops, ()))


def _contents(x: Node) -> set[Stmt]:
    if isinstance(x, Stmt):
        return {x}
    return set().union(*map(_contents, x.children)) if x.children else set()


def _ordered(items: list[Node]) -> tuple[Node, ...]:
    """The items of one scope in dependence order; ties in program order."""
    inside = [_contents(x) for x in items]
    first = [min((_ORDER[s] for s in c), default=len(STMTS)) for c in inside]
    left, out = list(range(len(items))), []
    while left:
        ready = [i for i in left if not any(j != i and any(d in inside[j] for s in inside[i] for d in _deps(s))
                                            for j in left)]
        if not ready:
            raise ValueError(f"no order satisfies the dependences of {', '.join(map(str, items))}")
        i = min(ready, key=first.__getitem__)
        out.append(items[i])
        left.remove(i)
    return tuple(out)


def _check(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown trip-count convention {convention!r}; choose one of {CONVENTIONS}")


def _trip_loops(p: Placement, s: Stmt, bound: tuple[str, ...], convention: str) -> tuple[str, ...]:
    _check(convention)
    path = p.paths[str(s)]
    return tuple(dict.fromkeys(bound + path)) if convention == "block" else path


def trips(p: Placement, ext: Mapping[str, int], *, convention: str, bound: tuple[str, ...] = (),
          batch: int = 1) -> dict[str, int]:
    """How many times each statement runs over the whole grid (``bound``: the blockIdx loops)."""
    return {str(s): batch * math.prod(ext[x] for x in _trip_loops(p, s, bound, convention)) for s in STMTS}


# ---------------------------------------------------------------- shapes, tiles, candidates
# (ChainShape: the chain family's, ``families/chain/space.py``)


@dataclass(frozen=True)
class ChainTile:
    """Tile sizes T_M, T_N, T_K, T_H.  In the Triton space powers of two: bk ≥ K is K whole (one
    chunk), bh ≥ H is H whole; in MCFuser's space multiples of 16."""
    bm: int
    bn: int
    bk: int
    bh: int

    def size(self, loop: str) -> int:
        return getattr(self, "b" + loop)


def extents(shape: ChainShape, tile: ChainTile) -> dict[str, int]:
    """Cross-tile loop extents ⌈D / T_D⌉."""
    return {x: -(-getattr(shape, x) // tile.size(x)) for x in LOOPS}


@dataclass(frozen=True)
class Tiling:
    """Rule 1's class of an expression: the loops bound to blockIdx (in expression order) and the
    per-block sub-tiling expression."""
    bound: tuple[str, ...]
    sub: Loop | Seq

    @property
    def expr(self) -> Loop | Seq:
        """The bound form: the bound loops outermost, around the sub-tiling."""
        kids = _skeleton((self.sub,))
        return _nest(self.bound, kids) if self.bound else _root(kids)

    def __str__(self) -> str:
        return f"{''.join(self.bound)}|{self.sub}"


@dataclass(frozen=True)
class Candidate:
    tiling: Tiling
    tile: ChainTile

    def __str__(self) -> str:
        return f"{self.tiling} {astuple(self.tile)}"


def volumes(shape: ChainShape, tiling: Tiling, tile: ChainTile, *, convention: str) -> dict[str, float]:
    """Per statement over the whole grid: elements moved by loads and stores, FLOPs of computes
    (module docstring, Volumes)."""
    ext = extents(shape, tile)
    p = place(tiling.expr, ext)
    out = {}
    for s in STMTS:
        loops = _trip_loops(p, s, tiling.bound, convention)
        reps = shape.batch * math.prod(ext[x] for x in loops if x not in s.loops)
        if s.kind == "C":
            out[str(s)] = 2 * reps * math.prod(tile.size(x) * ext[x] for x in s.loops)
        else:
            out[str(s)] = reps * math.prod(getattr(shape, x) for x in s.loops)
    return out


# ---------------------------------------------------------------- pruning rules (§3.3)

def bind(expr: Loop | Seq) -> Tiling:
    """Rule 1: the output's spatial loops that enclose everything go to blockIdx; the rest is the
    per-block sub-tiling."""
    spine, node = [], expr
    while isinstance(node, Loop):
        spine.append(node.name)
        if len(node.children) != 1:
            break
        node = node.children[0]
    bound = tuple(x for x in spine if x in SPATIAL)
    return Tiling(bound, _root(_skeleton((expr,), frozenset(bound))))


def classes(exprs: Sequence[Loop | Seq], *, convention: str) -> list[Tiling]:
    """Rule 1's equivalence classes, first member's binding order kept: the sub-tiling alone under
    the block-aware count; with the binding order under the literal one, where it changes trip
    counts (module docstring)."""
    _check(convention)
    seen: dict[object, Tiling] = {}
    for e in exprs:
        t = bind(e)
        seen.setdefault(str(t.sub) if convention == "block" else str(t), t)
    return list(seen.values())


def caches_intermediate(t: Tiling) -> bool:
    """Rule 2: an intermediate's reduction loop encloses one of its unbound spatial loops, so the
    block caches several partial tiles of it (``kn``)."""
    where = _loop_paths(_skeleton((t.sub,)))
    return any(REDUCE[x] in where.get(s, ())[:-1]
               for x in REDUCE if x != OUTPUT for s in DIMS[x] if s not in t.bound)


def tilings(*, convention: str) -> list[Tiling]:
    """The expressions left by Rules 1 and 2."""
    return [t for t in classes(deep() + flat(), convention=convention) if not caches_intermediate(t)]


TILE_STEP = 16                  # tensor cores need 16×16×16
MAX_PADDING = 0.05


def keeps_padding(d: int, t: int) -> bool:
    """Rule 3 for one size: a divisor of a power-of-two dimension, else padding below 5%."""
    if d == pow2(d):
        return d % t == 0
    return (-(-d // t) * t - d) / d < MAX_PADDING


def tile_sizes(d: int) -> tuple[int, ...]:
    """Rule 3 over MCFuser's options for a dimension: the multiples of 16 up to D (rounded up to
    a multiple of 16, so there are ⌈D/16⌉ options, as the paper counts)."""
    return tuple(t for t in range(TILE_STEP, -(-d // TILE_STEP) * TILE_STEP + 1, TILE_STEP) if keeps_padding(d, t))


def space_size(shape: ChainShape) -> int:
    """Candidates before pruning: expressions × ⌈D/16⌉ sizes per loop (T1)."""
    return len(deep() + flat()) * math.prod(-(-getattr(shape, x) // TILE_STEP) for x in LOOPS)


SMEM_SLACK = 1.2                # Rule 4 absorbs the estimate's error


def smem_bytes(tile: ChainTile, itemsize: int) -> int:
    """Eq. 1: the tile areas of the five 2-D tensors, in bytes."""
    return itemsize * sum(tile.size(a) * tile.size(b) for a, b in DIMS.values())


def fits_smem(tile: ChainTile, itemsize: int, smem_max: int) -> bool:
    """Rule 4."""
    return smem_bytes(tile, itemsize) <= SMEM_SLACK * smem_max


def pruned_space(shape: ChainShape, smem_max: int, *, convention: str) -> list[Candidate]:
    """Every candidate left by the four rules."""
    tiles = _tiles(shape, smem_max)
    return [Candidate(t, tile) for t in tilings(convention=convention) for tile in tiles]


def _sizes(shape: ChainShape) -> dict[str, tuple[int, ...]]:
    return {x: tile_sizes(getattr(shape, x)) for x in LOOPS}


def _tiles(shape: ChainShape, smem_max: int) -> list[ChainTile]:
    sizes = _sizes(shape)
    tiles = itertools.starmap(ChainTile, itertools.product(*(sizes[x] for x in LOOPS)))
    return [t for t in tiles if fits_smem(t, shape.itemsize, smem_max)]


# ---------------------------------------------------------------- analytic model (Eq. 2–5)

@dataclass(frozen=True)
class ModelParams:
    bandwidth: float            # 𝒲, bytes/s
    peak: float                 # 𝒫, FLOP/s
    sm_count: int               # 𝒩_SM

    @staticmethod
    def of(target: Target, dtype: DType = DType.float16) -> ModelParams:
        return ModelParams(target.dram_bw, target.peak(dtype, tensor_cores=True), target.sm_count)


@dataclass(frozen=True)
class Estimate:
    bytes: float
    flops: float
    t_mem: float
    t_comp: float
    alpha: float

    @property
    def seconds(self) -> float:
        return (self.t_mem + self.t_comp) * self.alpha


def estimate(shape: ChainShape, c: Candidate, params: ModelParams, *, convention: str) -> Estimate:
    """Eq. 2: (t_mem + t_comp)·α."""
    w = volumes(shape, c.tiling, c.tile, convention=convention)
    nbytes = shape.itemsize * sum(v for s, v in w.items() if s[0] != "C")
    flops = sum(v for s, v in w.items() if s[0] == "C")
    ext = extents(shape, c.tile)
    blocks = shape.batch * math.prod(ext[x] for x in c.tiling.bound)
    # parallelism reads only the SM count, which the params carry
    alpha = parallelism(blocks, params)  # type: ignore[arg-type]
    return Estimate(nbytes, flops, nbytes / params.bandwidth, flops / params.peak, alpha)


def phi(tm: int, tn: int, k: int) -> float:
    """§II's ϕ: a GEMM tile's FLOPs per element moved (C read and written, the A and B panels);
    the operator is memory-bound when ϕ < 𝒫/𝒲."""
    return 2 * tm * tn * k / (2 * tm * tn + tm * k + tn * k)


# ---------------------------------------------------------------- heuristic search (Alg. 1)

@dataclass(frozen=True)
class Round:
    top: tuple[tuple[Candidate, float], ...]     # the n best by the model, with measured times
    new: int                                     # how many of them were measured this round


@dataclass(frozen=True)
class SearchResult:
    best: Candidate
    seconds: float
    rounds: tuple[Round, ...]
    converged: bool


def mutate(c: Candidate, sizes: Mapping[str, Sequence[int]], ok: Callable[[ChainTile], bool],
           rng: random.Random) -> Candidate:
    """One loop's tile size changed to another allowed size that keeps ``ok``."""
    options = {x: [v for v in sizes[x] if v != c.tile.size(x) and ok(replace(c.tile, **{"b" + x: v}))]
               for x in LOOPS}
    loops = [x for x in LOOPS if options[x]]
    if not loops:
        return c
    x = rng.choice(loops)
    return Candidate(c.tiling, replace(c.tile, **{"b" + x: rng.choice(options[x])}))


def search(shape: ChainShape, measure: Callable[[list[Candidate]], Sequence[float]], params: ModelParams,
           smem_max: int, *, convention: str, population: int = 128, top: int = 8, eps: float = 0.01,
           max_rounds: int = 20, seed: int = 0) -> SearchResult:
    """Alg. 1 over the pruned space (module docstring, Search)."""
    rng = random.Random(seed)
    exprs, tiles = tilings(convention=convention), _tiles(shape, smem_max)
    if not tiles:
        raise ValueError(f"no tile of {shape} passes Rules 3 and 4")
    sizes = _sizes(shape)

    def ok(t: ChainTile) -> bool:
        return fits_smem(t, shape.itemsize, smem_max)

    pop = [Candidate(rng.choice(exprs), rng.choice(tiles)) for _ in range(population)]
    est: dict[Candidate, float] = {}
    measured: dict[Candidate, float] = {}
    best, best_t, rounds = None, math.inf, []
    for _ in range(max_rounds):
        for c in pop:
            if c not in est:
                est[c] = estimate(shape, c, params, convention=convention).seconds
        chosen = sorted(dict.fromkeys(pop), key=est.__getitem__)[:top]
        fresh = [c for c in chosen if c not in measured]
        if fresh:
            times = list(measure(fresh))
            if len(times) != len(fresh):
                raise ValueError(f"measure returned {len(times)} times for {len(fresh)} candidates")
            measured.update(zip(fresh, times))
        rounds.append(Round(tuple((c, measured[c]) for c in chosen), len(fresh)))
        top1 = min(chosen, key=measured.__getitem__)
        t1 = measured[top1]
        converged = best is not None and abs(t1 - best_t) / best_t < eps
        if t1 < best_t:
            best, best_t = top1, t1
        if converged:
            return SearchResult(best, best_t, tuple(rounds), True)
        parents = rng.choices(pop, weights=[1 / est[c] for c in pop], k=population)
        pop = [mutate(c, sizes, ok, rng) for c in parents]
    return SearchResult(best, best_t, tuple(rounds), False)


# ---------------------------------------------------------------- the Triton-expressible space

NK = bind(parse("mhnk"))        # the template's tiling: grid (batch, m, h), n loop, k inside


def chain_tiles(shape: ChainShape, target: Target, *, max_smem: int | None = None) -> list[ChainTile]:
    """The Triton template's tiles: power-of-two sizes within Rule 4 for the tiles a program holds
    (A bm×bk, B bk×bn, C bm×bn, D bn×bh, E bm×bh).  K and H, held whole or in a few chunks, keep
    Rule 3 (``held_sizes``); M and N are walked in many tiles whose padding is bounded by one
    tile and which tilefuse's cost model charges (padded flops, masked lanes), so every power of
    two up to the padded extent is offered there (Rule 3's 5% would leave M = 300 only 16-row
    tiles)."""
    limit = target.smem_per_block if max_smem is None else max_smem
    sizes = [streamed_sizes(getattr(shape, x)) if x in ("m", "n") else held_sizes(getattr(shape, x))
             for x in LOOPS]
    return [t for t in itertools.starmap(ChainTile, itertools.product(*sizes)) if fits_smem(t, shape.itemsize, limit)]


def chain_traffic(shape: ChainShape, tile: ChainTile, convention: str = "block") -> dict[str, float]:
    """Elements each load and store of the ``nk`` template moves over the whole grid."""
    return {s: v for s, v in volumes(shape, NK, tile, convention=convention).items() if s[0] != "C"}


def chain_flops(shape: ChainShape, tile: ChainTile) -> float:
    """FLOPs of the ``nk`` template on padded tiles: C recomputed for every h tile."""
    return sum(v for s, v in volumes(shape, NK, tile, convention="block").items() if s[0] == "C")
