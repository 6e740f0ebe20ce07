"""Size-generic kernel sources: one compiled kernel for every size of a bucket.

A kernel is generated for one size: extents, strides and loop bounds are literals in its source.
For a bucket of sizes (``orchestrate/buckets.py``) the same planned kernel is generated at a few
sample sizes ``t``; where the samples' sources are the same token for token except for integer
literals, and each literal that differs is one function of ``t`` at every sample (``Form``:
``a·t + b``, ``a·t² + b·t + c`` or ``a·⌈(t + c) / d⌉ + b``), the *generic* source replaces those
literals by the function of a new kernel argument, ``tf_size`` (anti-unification of the samples).

Serving a size does not trust the fit: the kernel is still generated for that size (cheap: no
compile), and the generic source is used only where it ``matches``: the same tokens, every
literal equal to its form at that size.  Then the generic kernel computes exactly what the size's
own source does, with the size an argument instead of a literal, and Triton compiles it once for
the bucket (``do_not_specialize``: not once per value).  A literal Triton needs at compile time
(a shape, an ``arange`` bound, a tensor descriptor) is never made an argument: such a kernel stays
per size.
"""
from __future__ import annotations

import io
import tokenize
from dataclasses import dataclass
from typing import Mapping, Sequence

PARAM = "tf_size"
# calls whose arguments Triton needs at compile time (or that the TMA path must see as literals)
_CONSTANT_CALLS = {"arange", "static_range", "full", "zeros", "reshape", "broadcast_to", "make_tensor_descriptor",
                   "multiple_of", "max_contiguous", "constexpr", "view", "permute", "trans", "split", "join"}
_SKIP = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING,
         tokenize.ENDMARKER}


@dataclass(frozen=True)
class Form:
    """An integer function of the size: ``a·t + b`` (affine), ``a·t² + b·t + c`` (square), or
    ``a·⌈(t + c) / d⌉ + b`` (tiles)."""
    kind: str
    a: int
    b: int
    c: int = 0
    d: int = 1

    def __call__(self, t: int) -> int:
        if self.kind == "affine":
            return self.a * t + self.b
        if self.kind == "square":
            return self.a * t * t + self.b * t + self.c
        return self.a * -(-(t + self.c) // self.d) + self.b

    def text(self) -> str:
        """The form over ``PARAM``, as a Triton (and Python) expression."""
        t = PARAM
        if self.kind == "affine":
            core = t if self.a == 1 else f"{self.a} * {t}"
        elif self.kind == "square":
            core = f"{self.a} * {t} * {t}" + (f" + {self.b} * {t}" if self.b else "")
            return f"({core} + {self.c})" if self.c else f"({core})"
        else:
            shifted = f"{t} + {self.c + self.d - 1}" if self.c + self.d - 1 else t
            core = f"({shifted}) // {self.d}" if self.a == 1 else f"{self.a} * (({shifted}) // {self.d})"
        return f"({core} + {self.b})" if self.b else f"({core})"


def fit(ts: Sequence[int], values: Sequence[int]) -> Form | None:
    """The simplest ``Form`` equal to ``values`` at every sample size ``ts`` (None if none is)."""
    pairs = list(zip(ts, values))
    if len(set(ts)) < 2:
        return None
    (t0, v0), (t1, v1) = pairs[0], next(p for p in pairs if p[0] != pairs[0][0])
    if (v1 - v0) % (t1 - t0) == 0:
        a = (v1 - v0) // (t1 - t0)
        form = Form("affine", a, v0 - a * t0)
        if all(form(t) == v for t, v in pairs):
            return form
    for d in (2 ** k for k in range(1, 13)):
        for c in range(-4, 5):
            got = _tiles(pairs, c, d)
            if got is not None:
                return got
    if len(set(ts)) >= 3:
        return _square(pairs)
    return None


def _tiles(pairs, c: int, d: int) -> Form | None:
    fs = [(-(-(t + c) // d), v) for t, v in pairs]
    distinct = dict(fs)
    if len(distinct) < 2 or len(set(fs)) != len(distinct):
        return None
    (f0, v0), (f1, v1) = list(distinct.items())[:2]
    if (v1 - v0) % (f1 - f0):
        return None
    a = (v1 - v0) // (f1 - f0)
    form = Form("tiles", a, v0 - a * f0, c, d)
    return form if a and all(form(t) == v for t, v in pairs) else None


def _square(pairs) -> Form | None:
    from fractions import Fraction
    pts = list(dict(pairs).items())[:3]
    (x0, y0), (x1, y1), (x2, y2) = pts
    # Lagrange: y = a x² + b x + c
    d0, d1, d2 = (x0 - x1) * (x0 - x2), (x1 - x0) * (x1 - x2), (x2 - x0) * (x2 - x1)
    a = Fraction(y0, d0) + Fraction(y1, d1) + Fraction(y2, d2)
    b = -(Fraction(y0 * (x1 + x2), d0) + Fraction(y1 * (x0 + x2), d1) + Fraction(y2 * (x0 + x1), d2))
    c = Fraction(y0 * x1 * x2, d0) + Fraction(y1 * x0 * x2, d1) + Fraction(y2 * x0 * x1, d2)
    if a == 0 or any(x.denominator != 1 for x in (a, b, c)):
        return None
    form = Form("square", int(a), int(b), int(c))
    return form if all(form(t) == v for t, v in pairs) else None


@dataclass(frozen=True)
class Generic:
    """A kernel's generic source and how to check that it is a size's own source."""
    name: str
    source: str
    tokens: tuple                          # the samples' token strings, None at each varying literal
    forms: Mapping[int, Form]              # token position -> its form

    def matches(self, source: str, t: int) -> bool:
        """Whether ``source`` (the kernel generated for size ``t``) is this source at ``t``."""
        toks = _tokens(source)
        if toks is None or len(toks) != len(self.tokens):
            return False
        for k, (tok, want) in enumerate(zip(toks, self.tokens)):
            if want is None:
                if tok[0] != tokenize.NUMBER or _int(tok[1]) != self.forms[k](t):
                    return False
            elif tok[1] != want:
                return False
        return True


def generalize(samples: Mapping[int, str], name: str) -> Generic | None:
    """The generic source of kernel ``name`` from its sources at sample sizes (size -> source), or
    None where they differ in more than integer literals that one ``Form`` each explains, or where
    a varying literal is one Triton needs at compile time.  Samples whose structure differs from
    the others' (a derived size a block divides: no mask there) are left out, if at least two
    remain alike; the sizes like them are then served by their own kernels."""
    seqs = {t: _tokens(src) for t, src in samples.items()}
    classes: dict[tuple, list[int]] = {}
    for t in sorted(seqs):
        if seqs[t] is not None:
            classes.setdefault(tuple(None if k[0] == tokenize.NUMBER else k[1] for k in seqs[t]), []).append(t)
    ts = max(classes.values(), key=lambda c: (len(c), -c[0]), default=[])
    if len(ts) < 2:
        return None
    first = seqs[ts[0]]
    tokens: list = []
    forms: dict[int, Form] = {}
    for k, tok in enumerate(first):
        column = [seqs[t][k] for t in ts]
        if all(c[1] == tok[1] for c in column):
            tokens.append(tok[1])
            continue
        values = [_int(c[1]) for c in column]
        if any(v is None for v in values) or _in_constant_call(first, k):
            return None
        form = fit(ts, values)
        if form is None:
            return None
        forms[k] = form
        tokens.append(None)
    if not forms:
        return None          # the same source at every size: nothing to make generic
    return Generic(name, _rewrite(samples[ts[0]], name, first, forms), tuple(tokens), forms)


def kernel_generics(samples: Mapping[int, Sequence]) -> tuple:
    """Per kernel of a plan, its generic source (or None) from the plan's built kernels at sample
    sizes (size -> ``Built`` tuple, plan order: the same plan carried to each size)."""
    ts = sorted(samples)
    count = len(samples[ts[0]])
    if any(len(samples[t]) != count for t in ts):
        return ()
    out = []
    for i in range(count):
        built = [samples[t][i] for t in ts]
        out.append(generalize({t: b.source for t, b in zip(ts, built)}, built[0].name)
                   if all(b.plain for b in built) else None)
    return tuple(out)


def serve(built, generic: "Generic | None", size: int | None):
    """``built`` (a kernel generated for ``size``) running ``generic`` where that is its own source
    with the size an argument; else ``built`` as it is."""
    if generic is None or size is None or not built.plain or built.name != generic.name \
            or not generic.matches(built.source, size):
        return built
    from dataclasses import replace

    from .launch import compile_generic
    return replace(built, run=compile_generic(built.kernels[0], generic, size), source=generic.source,
                   size_arg=size)


def _tokens(source: str) -> list | None:
    """(type, string, start, end) of each significant token (comments and layout skipped)."""
    try:
        return [(t.type, t.string, t.start, t.end) for t in tokenize.generate_tokens(io.StringIO(source).readline)
                if t.type not in _SKIP]
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None


def _int(text: str) -> int | None:
    try:
        return int(text, 0)
    except ValueError:
        return None


def _in_constant_call(toks: list, k: int) -> bool:
    """Whether token ``k`` lies inside the brackets of a shape list or of a call in
    ``_CONSTANT_CALLS`` (walking back over the open brackets that enclose it)."""
    depth = 0
    for j in range(k - 1, -1, -1):
        s = toks[j][1]
        if s in (")", "]"):
            depth += 1
        elif s in ("(", "["):
            if depth:
                depth -= 1
                continue
            if s == "[":
                return True             # a shape list (indexing is with names: `x[:, None]`)
            if j and toks[j - 1][0] == tokenize.NAME and toks[j - 1][1] in _CONSTANT_CALLS:
                return True
        elif s in ("def",) or toks[j][0] == tokenize.NAME and toks[j][1] == "jit":
            break
    return False


def _rewrite(source: str, name: str, toks: list, forms: Mapping[int, Form]) -> str:
    """``source`` with each varying literal replaced by its form, ``PARAM`` added to kernel
    ``name``'s parameters (before its constexprs) and kept from value specialization."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def at(pos) -> int:
        return starts[pos[0] - 1] + pos[1]
    edits = [(at(toks[k][2]), at(toks[k][3]), forms[k].text()) for k in forms]
    d = next(j for j in range(len(toks) - 1) if toks[j][1] == "def" and toks[j + 1][1] == name)
    close = next(j for j in range(d, len(toks)) if toks[j][1] == ")")
    params: list[list[int]] = [[]]            # the parameters' token positions
    for j in range(d + 3, close):
        if toks[j][1] == ",":
            params.append([])
        else:
            params[-1].append(j)
    params = [p for p in params if p]
    constexpr = [p for p in params if any(toks[j][1] == "constexpr" for j in p)]
    if constexpr:
        where, text = at(toks[constexpr[0][0]][2]), f"{PARAM}, "
    else:
        where, text = at(toks[close][2]), f", {PARAM}" if params else PARAM
    edits.append((where, where, text))
    deco = next(j for j in range(d - 1, -1, -1) if toks[j][1] == "jit")
    edits.append((at(toks[deco][3]), at(toks[deco][3]), f'(do_not_specialize=["{PARAM}"])'))
    out = source
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    return out

