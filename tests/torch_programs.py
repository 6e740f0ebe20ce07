"""Random PyTorch programs as users write them, for differential fuzzing against eager PyTorch
(``tests/test_fuzz_torch.py``).

A ``Program`` is a few input tensors and a list of ``Step``s, each one PyTorch call on earlier
values: views and layouts (reshape/view/unflatten/flatten, transpose, permute, movedim,
select/integer indexing, narrow and strided slicing with negative and open bounds, expand,
squeeze/unsqueeze, flip, roll, chunk/split/unbind, cat/stack, index_select, gather, advanced
indexing), elementwise arithmetic with broadcasting and Python scalars, casts, reductions,
softmax, layer norm, matmul/bmm/linear/conv/SDPA, attention masked as transformers' eager path
masks it (a row masked whole included), and in-place updates of slices of a clone.

``programs()`` draws one step at a time and runs it eagerly on the example inputs while drawing,
so every step is valid by construction (a call eager PyTorch refuses is never drawn) and shapes
and dtypes are known without re-deriving PyTorch's rules.  Weights and index tensors are
constants of the module (drawn from the program's seed).  ``Program.source()`` prints the program
as a self-contained Python function, so a failure reads as the regression test to write.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from hypothesis import assume
from hypothesis import strategies as st

FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Step:
    op: str
    args: tuple[int, ...]         # indices of earlier values
    params: tuple = ()            # the op's own arguments (printable Python values)
    consts: tuple[int, ...] = ()  # indices into Program.consts


@dataclass(frozen=True)
class Program:
    inputs: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    consts: tuple[torch.Tensor, ...] = field(default=(), compare=False)
    seed: int = 0

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(self.seed)
        return tuple(_tensor(shape, dtype, g) for shape, dtype in self.inputs)

    def module(self) -> torch.nn.Module:
        return ProgramModule(self)

    def source(self) -> str:
        """The program as Python (a function of its inputs; constants shown by shape, or inline
        when small)."""
        n_in = len(self.inputs)
        lines = ["def program(" + ", ".join(f"v{k}" for k in range(n_in)) + "):"]
        for k, (shape, dtype) in enumerate(self.inputs):
            lines.append(f"    # v{k}: {str(dtype).replace('torch.', '')}{list(shape)}")
        for k, c in enumerate(self.consts):
            shown = c.tolist() if c.numel() <= 12 else f"<{str(c.dtype).replace('torch.', '')}{list(c.shape)}>"
            lines.append(f"    c{k} = {shown}")
        for k, s in enumerate(self.steps):
            names = [f"v{a}" for a in s.args]
            consts = [f"c{c}" for c in s.consts]
            spec, out = OPS[s.op], f"v{n_in + k}"
            statements = spec.lines(out, names, consts, s.params) if spec.lines else \
                [f"{out} = {spec.fmt(names, consts, s.params)}"]
            lines += [f"    {line}" for line in statements]
        lines.append("    return " + ", ".join(f"v{o}" for o in self.outputs))
        return "\n".join(lines)


class ProgramModule(torch.nn.Module):
    def __init__(self, program: Program):
        super().__init__()
        self.program = program
        for k, c in enumerate(program.consts):
            self.register_buffer(f"c{k}", c.clone())

    def forward(self, *inputs):
        vals = list(inputs)
        consts = [getattr(self, f"c{k}") for k in range(len(self.program.consts))]
        for s in self.program.steps:
            vals.append(OPS[s.op].fn([vals[a] for a in s.args], [consts[c] for c in s.consts], *s.params))
        outs = tuple(vals[o] for o in self.program.outputs)
        return outs[0] if len(outs) == 1 else outs


def _tensor(shape, dtype, g) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if dtype is torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    return torch.randint(-4, 5, shape, generator=g).to(dtype)


# ---------------------------------------------------------------- the operator table

@dataclass(frozen=True)
class Op:
    """``draw(d, x, pool) -> (args, params, consts) | None`` picks operands (``x`` the value the
    step is about, ``pool`` every value so far) and parameters; ``fn(tensors, consts, *params)``
    runs it; ``fmt(names, consts, params)`` prints it."""
    draw: Callable
    fn: Callable
    fmt: Callable
    floats_only: bool = False
    lines: Callable | None = None    # (out, names, consts, params) -> statements, where one line won't do


OPS: dict[str, Op] = {}


def op(name: str, draw, fn, fmt, floats_only=False, lines=None):
    OPS[name] = Op(draw, fn, fmt, floats_only, lines)


def _dim(d, rank: int) -> int:
    """A dim in [-rank, rank) (negative dims half the time)."""
    k = d(st.integers(0, rank - 1))
    return k - rank if d(st.booleans()) else k


def _factor(n: int) -> list[tuple[int, int]]:
    """Ways to split n into two dims, proper splits first (a split off a dim of 1 composes to
    nothing; draws lean towards the first entries)."""
    if n == 0:
        return [(0, 3), (0, 1), (1, 0)]
    pairs = [(a, n // a) for a in range(1, n + 1) if n % a == 0]
    return sorted(pairs, key=lambda ab: min(ab) == 1)


# views and layouts ------------------------------------------------------

def _draw_reshape(d, x, pool):
    shape = list(x.shape)
    if not shape:
        return [], ((1,) * d(st.integers(1, 2)),), []
    kind = d(st.sampled_from(["split", "merge", "flat", "minus1"]))
    if kind == "split":
        k = _splittable(d, x) % len(shape)
        a, b = d(st.sampled_from(_factor(shape[k])))
        new = shape[:k] + [a, b] + shape[k + 1:]
    elif kind == "merge" and len(shape) >= 2:
        k = d(st.integers(0, len(shape) - 2))
        new = shape[:k] + [shape[k] * shape[k + 1]] + shape[k + 2:]
    elif kind == "flat":
        new = [math.prod(shape)]
    else:
        new = list(shape)
        if math.prod(shape) > 0:
            new[d(st.integers(0, len(new) - 1))] = -1
    return [], (tuple(new),), []


op("reshape", _draw_reshape, lambda t, c, s: t[0].reshape(s), lambda n, c, p: f"{n[0]}.reshape{p[0]}")
op("view", _draw_reshape, lambda t, c, s: t[0].view(s), lambda n, c, p: f"{n[0]}.view{p[0]}")


def _splittable(d, x) -> int:
    """A dim to split: one with a proper split half the time, if there is one."""
    proper = [k for k, n in enumerate(x.shape) if min(_factor(n)[0]) > 1]
    return d(st.sampled_from(proper)) if proper and d(st.booleans()) else _dim(d, x.dim())


def _draw_unflatten(d, x, pool):
    if x.dim() == 0:
        return None
    k = _splittable(d, x)
    a, b = d(st.sampled_from(_factor(x.shape[k])))
    sizes = (a, b) if d(st.booleans()) or a * b == 0 else (-1, b)
    return [], (k, sizes), []


op("unflatten", _draw_unflatten, lambda t, c, k, s: t[0].unflatten(k, s),
   lambda n, c, p: f"{n[0]}.unflatten({p[0]}, {p[1]})")


def _draw_flatten(d, x, pool):
    if x.dim() < 2:
        return [], (0, -1), []
    a = d(st.integers(0, x.dim() - 2))
    b = d(st.integers(a + 1, x.dim() - 1))
    return [], (a, b - x.dim() if d(st.booleans()) else b), []


op("flatten", _draw_flatten, lambda t, c, a, b: t[0].flatten(a, b), lambda n, c, p: f"{n[0]}.flatten({p[0]}, {p[1]})")


def _draw_two_dims(d, x, pool):
    if x.dim() < 2:
        return None
    return [], (_dim(d, x.dim()), _dim(d, x.dim())), []


op("transpose", _draw_two_dims, lambda t, c, a, b: t[0].transpose(a, b),
   lambda n, c, p: f"{n[0]}.transpose({p[0]}, {p[1]})")
op("movedim", _draw_two_dims, lambda t, c, a, b: t[0].movedim(a, b),
   lambda n, c, p: f"{n[0]}.movedim({p[0]}, {p[1]})")


def _draw_permute(d, x, pool):
    if x.dim() < 2:
        return None
    return [], (tuple(d(st.permutations(range(x.dim())))),), []


op("permute", _draw_permute, lambda t, c, p: t[0].permute(p), lambda n, c, p: f"{n[0]}.permute{p[0]}")


def _position(d, n: int) -> int:
    """An index into a dim of size n, often an end (0 and -1 are where index maps fold)."""
    return d(st.one_of(st.sampled_from([0, -1, n - 1]), st.integers(-n, n - 1)))


def _draw_select(d, x, pool):
    if x.dim() == 0 or 0 in x.shape:
        return None
    wide = [k for k, n in enumerate(x.shape) if n > 1]      # selecting from a dim of 1 is a squeeze
    k = d(st.sampled_from(wide)) if wide and d(st.booleans()) else _dim(d, x.dim())
    return [], (k, _position(d, x.shape[k])), []


op("select", _draw_select, lambda t, c, k, i: t[0].select(k, i), lambda n, c, p: f"{n[0]}.select({p[0]}, {p[1]})")


def _index_tuple(k: int, i) -> tuple:
    return (slice(None),) * k + (i,)


def _draw_int_index(d, x, pool):     # x[0], x[:, -1], x[..., 2]
    got = _draw_select(d, x, pool)
    if got is None:
        return None
    _, (k, i), _ = got
    return [], (k % x.dim(), i, d(st.booleans())), []


def _int_index(t, c, k, i, ellipsis_form):
    x = t[0]
    if ellipsis_form and k == x.dim() - 1:
        return x[..., i]
    return x[_index_tuple(k, i)]


op("int_index", _draw_int_index, _int_index,
   lambda n, c, p: f"{n[0]}[..., {p[1]}]" if p[2] else f"{n[0]}[{', '.join([':'] * p[0] + [str(p[1])])}]")


def _draw_narrow(d, x, pool):
    if x.dim() == 0:
        return None
    k = _dim(d, x.dim())
    n = x.shape[k]
    start = d(st.integers(-n, n)) if n else 0
    lo = start + n if start < 0 else start
    length = d(st.integers(0, n - lo))
    return [], (k, start, length), []


op("narrow", _draw_narrow, lambda t, c, k, s, l: t[0].narrow(k, s, l),
   lambda n, c, p: f"{n[0]}.narrow({p[0]}, {p[1]}, {p[2]})")


def _draw_slice(d, x, pool):
    """x[a:b:s, ...] with negative, open and out-of-range bounds, steps 1-3."""
    if x.dim() == 0:
        return None
    parts = []
    for n in x.shape[:d(st.integers(1, x.dim()))]:
        bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
        parts.append((d(bound), d(bound), d(st.sampled_from([None, 1, 2, 3]))))
    return [], (tuple(parts),), []


def _fmt_slice(part):
    a, b, s = part
    txt = f"{'' if a is None else a}:{'' if b is None else b}"
    return txt + (f":{s}" if s is not None else "")


op("slice", _draw_slice, lambda t, c, parts: t[0][tuple(slice(*p) for p in parts)],
   lambda n, c, p: f"{n[0]}[{', '.join(_fmt_slice(q) for q in p[0])}]")


def _draw_expand(d, x, pool):
    shape = list(x.shape)
    new = [d(st.sampled_from([1, 2, 3])) if n == 1 else n for n in shape]
    lead = d(st.lists(st.integers(1, 3), max_size=2))
    spec = tuple(lead) + tuple(-1 if (b == a and d(st.booleans())) else b for a, b in zip(shape, new))
    return [], (spec,), []


op("expand", _draw_expand, lambda t, c, s: t[0].expand(s), lambda n, c, p: f"{n[0]}.expand{p[0]}")


def _draw_squeeze(d, x, pool):
    ones = [k for k, n in enumerate(x.shape) if n == 1]
    if not ones:
        return [], (None,), []
    return [], (d(st.sampled_from(ones + [None])),), []


op("squeeze", _draw_squeeze, lambda t, c, k: t[0].squeeze() if k is None else t[0].squeeze(k),
   lambda n, c, p: f"{n[0]}.squeeze({'' if p[0] is None else p[0]})")
op("unsqueeze", lambda d, x, pool: ([], (d(st.integers(-x.dim() - 1, x.dim())),), []),
   lambda t, c, k: t[0].unsqueeze(k), lambda n, c, p: f"{n[0]}.unsqueeze({p[0]})")


def _draw_flip(d, x, pool):
    if x.dim() == 0:
        return None
    return [], (tuple(sorted(set(d(st.lists(st.integers(0, x.dim() - 1), min_size=1, max_size=2))))),), []


op("flip", _draw_flip, lambda t, c, dims: t[0].flip(dims), lambda n, c, p: f"{n[0]}.flip({p[0]})")


def _draw_roll(d, x, pool):
    if x.dim() == 0:
        return None
    k = _dim(d, x.dim())
    return [], (d(st.integers(-3, 3)), k), []


op("roll", _draw_roll, lambda t, c, s, k: torch.roll(t[0], s, k), lambda n, c, p: f"torch.roll({n[0]}, {p[0]}, {p[1]})")


def _draw_pieces(d, x, pool):
    if x.dim() == 0 or 0 in x.shape:
        return None
    k = _dim(d, x.dim())
    n = x.shape[k]
    kind = d(st.sampled_from(["chunk", "split", "unbind"]))
    size = d(st.integers(1, n))
    count = {"chunk": len(x.chunk(size, k)), "split": len(x.split(size, k)), "unbind": n}[kind]
    return [], (kind, size, k, d(st.integers(-count, count - 1))), []


def _pieces(t, c, kind, size, k, i):
    x = t[0]
    return {"chunk": lambda: x.chunk(size, k), "split": lambda: x.split(size, k), "unbind": lambda: x.unbind(k)}[kind]()[i]


op("pieces", _draw_pieces, _pieces,
   lambda n, c, p: f"{n[0]}.{p[0]}({'' if p[0] == 'unbind' else f'{p[1]}, '}{p[2]})[{p[3]}]")


def _draw_cat(d, x, pool):
    """torch.cat with a pool value matching x but in dim k, or torch.stack of x and 2x."""
    if x.dim() == 0:
        return None
    k = _dim(d, x.dim())
    if d(st.booleans()):
        return [], (k, True), []
    others = [j for j, y in enumerate(pool) if y.dim() == x.dim() and y.dtype == x.dtype
              and all(a == b for i, (a, b) in enumerate(zip(x.shape, y.shape)) if i != k % x.dim())]
    return [d(st.sampled_from(others))], (k, False), []


def _cat(t, c, k, stack):
    if stack:
        x = t[0]
        return torch.stack([x, x * 2 if x.dtype.is_floating_point else x], k)
    return torch.cat(t, k)


op("cat", _draw_cat, _cat,
   lambda n, c, p: f"torch.stack([{n[0]}, {n[0]} * 2], {p[0]})" if p[1] else f"torch.cat([{n[0]}, {n[1]}], {p[0]})")


def _draw_index_select(d, x, pool):
    if x.dim() == 0 or 0 in x.shape:
        return None
    k = _dim(d, x.dim())
    n = x.shape[k]
    idx = torch.tensor(d(st.lists(st.integers(0, n - 1), min_size=1, max_size=5)), dtype=torch.int64)
    return [], (k,), [idx]


op("index_select", _draw_index_select, lambda t, c, k: t[0].index_select(k, c[0]),
   lambda n, c, p: f"{n[0]}.index_select({p[0]}, {c[0]})")


def _draw_gather(d, x, pool):
    if x.dim() == 0 or 0 in x.shape:
        return None
    k = _dim(d, x.dim())
    shape = [d(st.integers(1, n)) for n in x.shape]
    shape[k] = d(st.integers(1, 4))
    g = torch.Generator().manual_seed(d(st.integers(0, 1000)))
    idx = torch.randint(0, x.shape[k], shape, generator=g)
    return [], (k,), [idx]


op("gather", _draw_gather, lambda t, c, k: t[0].gather(k, c[0]), lambda n, c, p: f"{n[0]}.gather({p[0]}, {c[0]})")


def _draw_advanced(d, x, pool):
    """x[idx], x[:, idx], x[idx0, idx1] (broadcast index tensors, negative indices)."""
    if x.dim() == 0 or 0 in x.shape:
        return None
    g = torch.Generator().manual_seed(d(st.integers(0, 1000)))
    k = d(st.integers(0, x.dim() - 1))
    two = x.dim() > k + 1 and d(st.booleans())
    shape = tuple(d(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    idx = [torch.randint(-x.shape[k], x.shape[k], shape, generator=g)]
    if two:
        idx.append(torch.randint(-x.shape[k + 1], x.shape[k + 1], shape[-1:], generator=g))
    return [], (k,), idx


def _advanced(t, c, k):
    return t[0][(slice(None),) * k + tuple(c)]


op("advanced_index", _draw_advanced, _advanced,
   lambda n, c, p: f"{n[0]}[{', '.join([':'] * p[0] + c)}]")


# elementwise -------------------------------------------------------------

UNARY = {
    "relu": torch.relu, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "abs": torch.abs, "neg": torch.neg,
    "sin": torch.sin, "gelu": F.gelu, "silu": F.silu, "exp_tanh": lambda x: torch.exp(torch.tanh(x)),
    "square": lambda x: x * x, "softplus": F.softplus, "rsqrt_1p": lambda x: torch.rsqrt(1 + x * x),
}
op("unary", lambda d, x, pool: ([], (d(st.sampled_from(sorted(UNARY))),), []),
   lambda t, c, f: UNARY[f](t[0]), lambda n, c, p: f"{p[0]}({n[0]})", floats_only=True)


BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "maximum": torch.maximum, "minimum": torch.minimum,
    "div": lambda a, b: a / (1 + b.abs()) if b.dtype.is_floating_point else a,
}


def _broadcastable(x, y) -> bool:
    try:
        torch.broadcast_shapes(x.shape, y.shape)
        return True
    except RuntimeError:
        return False


def _draw_binary(d, x, pool):
    others = [j for j, y in enumerate(pool) if y.dtype == x.dtype and _broadcastable(x, y)
              and math.prod(torch.broadcast_shapes(x.shape, y.shape)) <= 4096]
    return [d(st.sampled_from(others))], (d(st.sampled_from(sorted(BINARY))),), []


op("binary", _draw_binary, lambda t, c, f: BINARY[f](t[0], t[1]), lambda n, c, p: f"{p[0]}({n[0]}, {n[1]})",
   floats_only=True)


def _draw_scalar(d, x, pool):
    return [], (d(st.sampled_from(["+", "*", "-", "/", "r-"])), d(st.sampled_from([0.5, 2.0, -1.5, 3.0]))), []


def _scalar(t, c, how, s):
    x = t[0]
    return {"+": lambda: x + s, "*": lambda: x * s, "-": lambda: x - s, "/": lambda: x / s, "r-": lambda: s - x}[how]()


op("scalar", _draw_scalar, _scalar, lambda n, c, p: f"{p[1]} - {n[0]}" if p[0] == "r-" else f"{n[0]} {p[0]} {p[1]}",
   floats_only=True)


def _draw_where(d, x, pool):
    others = [j for j, y in enumerate(pool) if y.dtype == x.dtype and _broadcastable(x, y)
              and math.prod(torch.broadcast_shapes(x.shape, y.shape)) <= 4096]
    return [d(st.sampled_from(others))], (d(st.sampled_from([0.0, 0.3])),), []


op("where", _draw_where, lambda t, c, th: torch.where(t[0] > th, t[0], t[1]),
   lambda n, c, p: f"torch.where({n[0]} > {p[0]}, {n[0]}, {n[1]})", floats_only=True)

op("cast", lambda d, x, pool: ([], (d(st.sampled_from(["float32", "float16", "bfloat16", "int64", "bool"])),), []),
   lambda t, c, to: t[0].to(getattr(torch, to)) if to != "bool" else (t[0] > 0),
   lambda n, c, p: f"({n[0]} > 0)" if p[0] == "bool" else f"{n[0]}.to(torch.{p[0]})")


def _draw_clamp(d, x, pool):
    return [], (d(st.sampled_from([-1.0, -0.5, None])), d(st.sampled_from([0.5, 1.0, None]))), []


op("clamp", _draw_clamp, lambda t, c, lo, hi: t[0].clamp(lo, hi) if (lo, hi) != (None, None) else t[0].clamp(min=0),
   lambda n, c, p: f"{n[0]}.clamp({p[0]}, {p[1]})", floats_only=True)


# reductions --------------------------------------------------------------

REDUCE = ("sum", "mean", "amax", "amin")


def _draw_reduce(d, x, pool):
    if x.dim() == 0:
        return [], (d(st.sampled_from(REDUCE)), None, False), []
    if 0 in x.shape:
        return None
    dims = tuple(sorted(set(d(st.lists(st.integers(0, x.dim() - 1), min_size=1, max_size=2)))))
    return [], (d(st.sampled_from(REDUCE)), dims, d(st.booleans())), []


def _reduce(t, c, how, dims, keep):
    x = t[0]
    if dims is None:
        return getattr(x, how)()
    return getattr(x, how)(dim=dims, keepdim=keep)


op("reduce", _draw_reduce, _reduce,
   lambda n, c, p: f"{n[0]}.{p[0]}()" if p[1] is None else f"{n[0]}.{p[0]}(dim={p[1]}, keepdim={p[2]})",
   floats_only=True)


def _draw_softmax(d, x, pool):
    if x.dim() == 0:
        return None
    return [], (d(st.sampled_from(["softmax", "log_softmax", "cumsum", "argmax"])), _dim(d, x.dim())), []


def _softmax(t, c, how, k):
    x = t[0]
    if how == "argmax":
        return x.argmax(k)
    return getattr(x, how)(k)


op("softmax", _draw_softmax, _softmax, lambda n, c, p: f"{n[0]}.{p[0]}({p[1]})", floats_only=True)


def _draw_layer_norm(d, x, pool):
    if x.dim() == 0 or x.shape[-1] < 2:
        return None
    w = torch.randn(x.shape[-1], generator=torch.Generator().manual_seed(d(st.integers(0, 99)))).to(x.dtype)
    return [], (), [w]


op("layer_norm", _draw_layer_norm, lambda t, c: F.layer_norm(t[0], t[0].shape[-1:], c[0]),
   lambda n, c, p: f"F.layer_norm({n[0]}, {n[0]}.shape[-1:], {c[0]})", floats_only=True)


# contractions ------------------------------------------------------------

def _weight(d, shape, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(d(st.integers(0, 999)))
    return (torch.randn(shape, generator=g) / math.sqrt(max(1, shape[-1]))).to(dtype)


def _draw_linear(d, x, pool):
    if x.dim() == 0 or x.shape[-1] == 0:
        return None
    n = d(st.sampled_from([1, 3, 8, 16]))
    consts = [_weight(d, (n, x.shape[-1]), x.dtype)]
    if d(st.booleans()):
        consts.append(_weight(d, (n,), x.dtype))
    return [], (), consts


op("linear", _draw_linear, lambda t, c: F.linear(t[0], *c), lambda n, c, p: f"F.linear({n[0]}, {', '.join(c)})",
   floats_only=True)


def _draw_matmul(d, x, pool):
    """x @ y for a pool value y of a matching inner size (batched, broadcast, or a vector)."""
    if x.dim() == 0:
        return None
    k = x.shape[-1]
    others = []
    for j, y in enumerate(pool):
        if y.dtype != x.dtype or y.dim() == 0:
            continue
        inner = y.shape[0] if y.dim() == 1 else y.shape[-2]
        if inner == k:
            try:
                out = torch.matmul(x, y)
            except RuntimeError:
                continue
            if out.numel() <= 4096:
                others.append(j)
    if not others:
        return None
    return [d(st.sampled_from(others))], (), []


op("matmul", _draw_matmul, lambda t, c: torch.matmul(t[0], t[1]), lambda n, c, p: f"torch.matmul({n[0]}, {n[1]})",
   floats_only=True)


def _draw_bmm(d, x, pool):
    if x.dim() != 3:
        return None
    w = _weight(d, (x.shape[0], x.shape[2], d(st.sampled_from([2, 5]))), x.dtype)
    return [], (), [w]


op("bmm", _draw_bmm, lambda t, c: torch.bmm(t[0], c[0]), lambda n, c, p: f"torch.bmm({n[0]}, {c[0]})",
   floats_only=True)


def _draw_conv(d, x, pool):
    """conv1d/conv2d, batched or not ([C, L], [N, C, L], [C, H, W], [N, C, H, W])."""
    if x.dim() not in (2, 3, 4) or min(x.shape) == 0:
        return None
    nd = {2: 1, 3: d(st.sampled_from([1, 2])), 4: 2}[x.dim()]
    cin = x.shape[-nd - 1]
    groups = d(st.sampled_from([g for g in (1, 2, cin) if cin % g == 0]))
    cout = groups * d(st.integers(1, 2))
    kernel = d(st.integers(1, 3))
    stride, pad, dil = d(st.integers(1, 2)), d(st.integers(0, 1)), d(st.integers(1, 2))
    if kernel == 1 and x.dtype in (torch.float16, torch.bfloat16):
        dil = 1     # a one-tap kernel's dilation changes nothing, and eager's 16-bit CPU convolution
                    # segfaults on it with stride 2 and padding (torch 2.13; torch fuzzer, seed 69)
    if any(n + 2 * pad < dil * (kernel - 1) + 1 for n in x.shape[-nd:]):
        return None
    w = _weight(d, (cout, cin // groups) + (kernel,) * nd, x.dtype)
    return [], (nd, stride, pad, dil, groups), [w]


op("conv", _draw_conv, lambda t, c, nd, *p: (F.conv1d if nd == 1 else F.conv2d)(t[0], c[0], None, *p),
   lambda n, c, p: f"F.conv{p[0]}d({n[0]}, {c[0]}, None, {p[1]}, {p[2]}, {p[3]}, {p[4]})", floats_only=True)


def _draw_sdpa(d, x, pool):
    """Attention over x's last two dims: q = x, keys and values one pool value of the same layout."""
    if x.dim() not in (2, 3, 4) or min(x.shape) == 0:
        return None
    kv = [j for j, y in enumerate(pool) if y.dtype == x.dtype and y.dim() == x.dim()
          and y.shape[:-2] == x.shape[:-2] and y.shape[-1] == x.shape[-1]]
    causal = d(st.booleans())
    j = d(st.sampled_from(kv))
    return [j, j], (causal, d(st.sampled_from([None, 0.5]))), []


op("sdpa", _draw_sdpa,
   lambda t, c, causal, scale: F.scaled_dot_product_attention(t[0], t[1], t[2], is_causal=causal, scale=scale),
   lambda n, c, p: f"F.scaled_dot_product_attention({n[0]}, {n[1]}, {n[2]}, is_causal={p[0]}, scale={p[1]})",
   floats_only=True)


def _draw_masked_attention(d, x, pool):
    """transformers' eager attention: q = x, keys and values one pool value of the same layout,
    the scores masked by a boolean constant (with a row masked whole half the time) as models
    write it: the type's most negative finite value filled in or added (a row masked whole is
    uniform), or -inf filled in (NaN there, in eager as here); softmax; the product with the
    values."""
    if x.dim() not in (2, 3, 4) or min(x.shape) == 0:
        return None
    kv = [j for j, y in enumerate(pool) if y.dtype == x.dtype and y.dim() == x.dim()
          and y.shape[:-2] == x.shape[:-2] and y.shape[-1] == x.shape[-1] and min(y.shape) > 0]
    j = d(st.sampled_from(kv))
    lq, lk = x.shape[-2], pool[j].shape[-2]
    g = torch.Generator().manual_seed(d(st.integers(0, 999)))
    keep = torch.rand(lq, lk, generator=g) < 0.6
    if d(st.booleans()):
        keep[d(st.integers(0, lq - 1))] = False
    return [j, j], (d(st.sampled_from(["min_filled", "min_added", "inf_filled"])),), [keep]


def _masked_attention(t, c, how):
    q, k, v = t
    s = q @ k.transpose(-1, -2)
    if how == "min_added":
        # the bias in s's type from the start: made in float32 and cast, float64's min (the
        # float64 run that checks a 16-bit program) would overflow
        s = s + torch.where(c[0], s.new_zeros(()), torch.finfo(s.dtype).min)
    else:
        s = s.masked_fill(~c[0], torch.finfo(s.dtype).min if how == "min_filled" else float("-inf"))
    return torch.softmax(s, -1) @ v


def _masked_attention_fmt(n, c, p):
    s = f"{n[0]} @ {n[1]}.transpose(-1, -2)"
    low = f"torch.finfo({n[0]}.dtype).min"
    masked = {"min_added": f"{s} + torch.where({c[0]}, {n[0]}.new_zeros(()), {low})",
              "min_filled": f"({s}).masked_fill(~{c[0]}, {low})",
              "inf_filled": f"({s}).masked_fill(~{c[0]}, float('-inf'))"}[p[0]]
    return f"torch.softmax({masked}, -1) @ {n[2]}"


op("masked_attention", _draw_masked_attention, _masked_attention, _masked_attention_fmt, floats_only=True)


# in-place updates of slices (functionalized by torch.export) ---------------

def _draw_setitem(d, x, pool):
    """y = x.clone(); y[slice] = value (a scalar, or a broadcast pool value); or += through an index."""
    if x.dim() == 0 or 0 in x.shape:
        return None
    k = d(st.integers(0, x.dim() - 1))
    n = x.shape[k]
    a = d(st.integers(-n, n - 1))
    b = d(st.one_of(st.none(), st.integers(a % n + 1, n)))
    how = d(st.sampled_from(["scalar", "value", "mul_", "index_add"]))
    target = list(x.shape)
    target[k] = len(range(n)[slice(a, b)])
    if how == "value":
        others = [j for j, y in enumerate(pool) if y.dtype == x.dtype and y.dim() <= x.dim()
                  and _broadcastable(torch.empty(target), torch.empty(y.shape))
                  and torch.broadcast_shapes(tuple(target), y.shape) == tuple(target)]
        if not others:
            how = "scalar"
        else:
            return [d(st.sampled_from(others))], (k, a, b, how), []
    return [], (k, a, b, how), []


def _setitem(t, c, k, a, b, how):
    y = t[0].clone()
    where = (slice(None),) * k + (slice(a, b),)
    if how == "scalar":
        y[where] = 0.5
    elif how == "value":
        y[where] = t[1]
    elif how == "mul_":
        y[where].mul_(2)
    else:
        y[where] += 1
    return y


def _setitem_lines(out, n, c, p):
    k, a, b, how = p
    where = ", ".join([":"] * k + [f"{a}:{'' if b is None else b}"])
    update = {"scalar": f"{out}[{where}] = 0.5", "value": f"{out}[{where}] = {n[-1]}",
              "mul_": f"{out}[{where}].mul_(2)", "index_add": f"{out}[{where}] += 1"}[how]
    return [f"{out} = {n[0]}.clone()", update]


op("setitem", _draw_setitem, _setitem, None, floats_only=True, lines=_setitem_lines)


# ---------------------------------------------------------------- drawing programs

SPLITS = ["unflatten", "reshape", "view", "flatten"]
PERMUTES = ["transpose", "permute", "movedim", "flip", "roll", "unsqueeze", "squeeze"]
# x[i] and x.select are what models write most (qkv[0], x[:, 0]): drawn twice as often
PICKS = ["select", "int_index", "select", "int_index", "narrow", "slice", "pieces", "index_select",
         "advanced_index", "gather"]
ARITH = ["scalar", "unary", "binary", "reduce", "matmul", "setitem"]
VIEWS = ["reshape", "unflatten", "transpose", "select", "int_index", "permute", "movedim", "view", "flatten",
         "narrow", "slice", "expand", "squeeze", "unsqueeze", "flip", "roll", "pieces", "cat", "index_select",
         "gather", "advanced_index", "setitem"]

def _apply(step: Step, vals: list[torch.Tensor], consts: list[torch.Tensor]) -> torch.Tensor:
    return OPS[step.op].fn([vals[a] for a in step.args], [consts[c] for c in step.consts], *step.params)


@st.composite
def programs(draw, max_steps: int = 8, dtypes=FLOATS) -> Program:
    """A random program: 1-2 inputs of rank 0-4 (dims 1-6), 2-``max_steps`` steps, 1-2 outputs."""
    d = draw
    dtype = d(st.sampled_from(dtypes))
    n_inputs = d(st.integers(1, 2))
    inputs = []
    for _ in range(n_inputs):
        rank = d(st.sampled_from([2, 3, 4, 1, 3, 4, 0]))     # mostly 2-4-D, as models' tensors
        # composite sizes first: they split (unflatten, reshape) into two proper dims
        shape = tuple(d(st.lists(st.sampled_from([4, 6, 2, 3, 8, 1, 5]), min_size=rank, max_size=rank)))
        inputs.append((shape, dtype))
    seed = d(st.integers(0, 2 ** 16))
    g = torch.Generator().manual_seed(seed)
    vals = [_tensor(s, t, g) for s, t in inputs]
    consts: list[torch.Tensor] = []
    steps = []
    # Half the programs are chains of views and layouts ending in arithmetic (where composed
    # index maps go wrong); the others mix every kind of op.
    views = d(st.booleans())
    want = d(st.integers(4 if views else 2, max_steps))
    for _ in range(4 * want):          # draws eager refuses are retried, a bounded number of times
        if len(steps) == want:
            break
        if views:   # split a dim, move dims or pick from them, pick, more views, then compute
            names = ([SPLITS, PICKS + PERMUTES, PICKS][len(steps)] if len(steps) < 3 else
                     ARITH if len(steps) == want - 1 else VIEWS)
        else:
            names = list(OPS)        # table order: views first (draws lean that way)
        k = d(st.integers(0, len(vals) - 1))
        x = vals[-1] if views or d(st.booleans()) else vals[k]      # chains more often than not
        xi = len(vals) - 1 if x is vals[-1] else k
        name = d(st.sampled_from(names))
        spec = OPS[name]
        if spec.floats_only and not x.dtype.is_floating_point:
            continue
        got = spec.draw(d, x, vals)
        if got is None:
            continue
        others, params, new_consts = got
        step = Step(name, (xi, *others), tuple(params), tuple(range(len(consts), len(consts) + len(new_consts))))
        try:
            y = _apply(step, vals, consts + list(new_consts))
        except (RuntimeError, IndexError, ValueError, TypeError):
            continue                                      # eager refuses it: not a program
        if not isinstance(y, torch.Tensor) or y.numel() > 4096 or y.dim() > 5:
            continue
        consts += list(new_consts)
        vals.append(y)
        steps.append(step)
    assume(steps)
    n = len(vals)
    outs = [n - 1]
    if n - 2 >= n_inputs and d(st.booleans()):
        outs.insert(0, d(st.integers(n_inputs, n - 2)))
    return Program(tuple(inputs), tuple(steps), tuple(outs), tuple(consts), seed)
