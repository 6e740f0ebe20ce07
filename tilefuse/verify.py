"""Translation validation: every stage of the pipeline checked against its own input.

``compile(..., verify=True)`` (or ``TILEFUSE_VERIFY=1``) evaluates the program before and after
each stage on the same inputs and raises ``VerifyError`` naming the first stage whose output
differs and, in it, the first value that differs (in topological order) with its source operator:

- ``import``: the frontend's graph split into prims, evaluated by the reference executor, against
  the model itself (eager PyTorch, or onnxruntime for ONNX when it is installed);
- every graph-to-graph stage (``simplify``, ``fold``, ``vertical``, ``horizontal``): every tensor
  the stage kept (a prim, or a prim folded into a constant, keeps its name) against the same
  tensor before it;
- ``plan``: the plan's kernels evaluated one after another by the reference executor (the
  grouping, what each kernel reads and writes);
- ``kernels``: each generated or library kernel run alone on the reference values of its inputs
  (on the target's GPU when attached, else in Triton's interpreter), every output it writes
  against the reference.

The reference executor is the meaning of the IR, so a stage is blamed only for what it changed;
a kernel run on exact inputs is blamed only for its own error.  Floats are compared within the
tolerance of their type, scaled by the tensor's largest finite magnitude (a reduction's rounding
grows with its values); NaN must match NaN, infinities themselves, integers and bools exactly.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable, Mapping, Sequence

import torch

from .errors import TilefuseError
from .ir.dtypes import DType
from .ir.evaluate import eval_prim, retype
from .ir.expr import transform, unary, walk
from .ir.prim import Prim, PrimGraph, TensorDecl
from .ir.samples import allocate

_log = logging.getLogger("tilefuse.plan")

# (rtol, atol relative to the tensor's largest finite magnitude) per float type
TOLERANCE = {
    DType.float64: (1e-9, 1e-9),
    DType.float32: (1e-4, 1e-5),
    DType.float16: (1e-2, 1e-3),
    DType.bfloat16: (2e-2, 8e-3),
}


class VerifyError(TilefuseError):
    """A stage of the pipeline changed what the program computes (a bug in tilefuse).

    ``stage`` is the first stage whose output differs from its input; ``value`` the first tensor
    (in topological order) that differs, ``origin`` its source operator."""

    def __init__(self, stage: str, value: str | None, detail: str, origin=None):
        self.stage, self.value, self.origin = stage, value, origin
        where = f" {value!r}" if value else ""
        src = f" (from {origin})" if origin else ""
        super().__init__(f"verify: stage '{stage}' changed the program: value{where}{src} {detail}. "
                         "This is a bug in tilefuse; please report it with `tilefuse minify`'s test case")


def enabled(verify: bool | None) -> bool:
    """The option as given, else ``TILEFUSE_VERIFY`` (1/true/yes/on)."""
    if verify is not None:
        return bool(verify)
    return os.environ.get("TILEFUSE_VERIFY", "").strip().lower() in ("1", "true", "yes", "on")


def random_feeds(inputs: Sequence[TensorDecl], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random inputs for a graph: normal floats, small non-negative integers (valid as token ids
    and indices for most models), fair bools."""
    g = torch.Generator().manual_seed(seed)
    feeds = {}
    for d in inputs:
        shape, dt = d.type.shape, d.type.dtype
        if dt.is_float:
            t = torch.randn(shape, generator=g).to(dt.to_torch())
        elif dt is DType.bool:
            t = torch.rand(shape, generator=g) < 0.5
        else:
            t = torch.randint(0, 8, shape, generator=g).to(dt.to_torch())
        feeds[d.name] = t
    return feeds


def floor(types) -> DType | None:
    """The least precise float type among ``types`` (TensorTypes): a value computed from a
    16-bit one carries its rounding, even when it is cast to fp32 afterwards."""
    floats = [t.dtype for t in types if t.dtype in TOLERANCE]
    return max(floats, key=lambda d: TOLERANCE[d][0], default=None)


def difference(got: torch.Tensor, want: torch.Tensor, floor: DType | None = None,
               magnitude: torch.Tensor | None = None) -> str | None:
    """None when ``got`` equals ``want`` within the tolerance of ``want``'s type (or of ``floor``,
    the least precise float type it was computed through, if looser), else what differs.  The
    absolute tolerance scales with the largest value of ``want`` (at least 1), or, per element,
    with ``magnitude`` where given: a sum's rounding is relative to the sum of its terms' sizes,
    not to the sum (a centered sum, ``Σ(x - mean)``, is rounding noise itself)."""
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return (f"is {str(got.dtype).replace('torch.', '')}{list(got.shape)}, "
                f"want {str(want.dtype).replace('torch.', '')}{list(want.shape)}")
    if want.numel() == 0:
        return None
    g, w = got.detach().cpu(), want.detach().cpu()
    if w.is_floating_point():
        rtol, atol = max(TOLERANCE[DType.from_torch(w.dtype)], TOLERANCE.get(floor, (0.0, 0.0)))
        g64, w64 = g.double(), w.double()
        finite = w64[torch.isfinite(w64)]
        scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
        err = (g64 - w64).abs()
        both_nan = torch.isnan(g64) & torch.isnan(w64)
        same_inf = torch.isinf(w64) & (g64 == w64)
        if magnitude is not None:
            scale = torch.clamp(magnitude.detach().cpu().double(), min=scale)
        close = torch.isfinite(w64) & (err <= atol * scale + rtol * w64.abs())
        bad = ~(close | both_nan | same_inf)
    else:
        bad = g != w
        err = None
    if not bad.any():
        return None
    first = tuple(bad.nonzero()[0].tolist())
    worst = f"max abs error {err[bad & torch.isfinite(err)].max().item():.4g}, " \
        if err is not None and torch.isfinite(err[bad]).any() else ""
    return (f"differs at {int(bad.sum())} of {w.numel()} elements ({worst}first at {list(first)}: "
            f"got {g[first].item()}, want {w[first].item()})")


def _sums(p) -> bool:
    return not p.is_opaque and p.reduce is not None and p.reduce.combiner == "sum" and p.out.dtype.is_float


def _terms_size(p):
    """The prim summing its terms' absolute values: the scale of its rounding."""
    return dataclasses.replace(p, body=unary("abs", p.body))


def mismatch(got: torch.Tensor, want: torch.Tensor, floor: DType | None,
             exact: Callable[[], torch.Tensor | None]) -> str | None:
    """``difference`` of ``got`` (computed by tilefuse) from ``want`` (by the model itself), except
    that through a 16-bit program, where the two round in different places and their differences
    compound layer by layer, both are held to ``exact()`` (the model run in float64, None where it
    cannot be), as torch's own accuracy check does: ``got`` may be at most twice as far from it
    as ``want`` is (RMS)."""
    bad = difference(got, want, floor)
    if bad and floor in HALF and not got.is_floating_point():
        # a discrete value (a Cast to an integer, a comparison, an argmax) of 16-bit values flips
        # where two runs round differently (-3.9998 truncates to -3, its fp16 rounding -4.0 to -4):
        # each element must equal the model's own run or the wider one
        ref = exact()
        if ref is not None and tuple(ref.shape) == tuple(got.shape):
            if bool(((got == want) | (got == ref.to(got.dtype))).all()):
                return None
            bad += "; the wider run disagrees too"
    if bad and floor in HALF and got.is_floating_point():
        ref = exact()
        if ref is not None:
            odd = _non_finite(got, want, ref)
            if odd:
                return f"{bad}; {odd}"
            ours, theirs = _rms(got, ref), _rms(want, ref)
            if ours <= 2 * theirs + 1e-6:
                return None
            bad += f"; against a float64 run RMS error {ours:.3g}, the model's {theirs:.3g}"
    return bad


def evaluate(pg: PrimGraph, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every tensor of ``pg`` (inputs, constants and prims) by name, by the reference executor."""
    env: dict[str, torch.Tensor] = {c.name: c.data for c in pg.constants}
    env.update((d.name, feeds[d.name]) for d in pg.inputs)
    for p in pg.prims:
        env[p.name] = eval_prim(p, [env[n] for n in p.inputs])
    return env


class Verifier:
    """Checks the stages of one compilation on one set of inputs (``feeds``: graph input name ->
    tensor).  ``expected`` gives the model's own outputs (eager PyTorch, onnxruntime), flattened
    as ``leaves`` flattens the reference's graph outputs, for the ``import`` check."""

    def __init__(self, feeds: Mapping[str, torch.Tensor],
                 expected: Callable[[], list[torch.Tensor]] | None = None,
                 leaves: Callable[[list[torch.Tensor]], list[torch.Tensor]] = list,
                 exact: Callable[[], list[torch.Tensor]] | None = None):
        self.feeds = {n: t.detach().cpu() for n, t in feeds.items()}
        self.expected, self.leaves = expected, leaves
        self.exact = exact       # the model's outputs computed in float64, where it can be
        self._graph: PrimGraph | None = None
        self._values: dict[str, torch.Tensor] = {}
        self.stages: list[str] = []        # the stages checked, in order

    def values(self, pg: PrimGraph) -> dict[str, torch.Tensor]:
        if pg is not self._graph:
            self._graph, self._values = pg, evaluate(pg, self.feeds)
        return self._values

    def imported(self, pg: PrimGraph) -> None:
        """The prims of the frontend's graph against the model's own outputs."""
        self.stages.append("import")
        if self.expected is None:
            _log.info("verify: no oracle for the model itself; the import stage is not checked")
            return
        vals = self.values(pg)
        got = self.leaves([vals[o] for o in pg.outputs])
        want = self.expected()
        if len(got) != len(want):
            raise VerifyError("import", None, f"gives {len(got)} outputs, the model {len(want)}")
        lo = floor(pg.types.values())
        exact: list[torch.Tensor] | None = None

        def wide(k: int) -> torch.Tensor | None:
            nonlocal exact
            exact = exact if exact is not None else (self.exact() if self.exact else [])
            return exact[k] if k < len(exact) else None
        for k, (g, w) in enumerate(zip(got, want)):
            bad = mismatch(g, w.detach().cpu(), lo, lambda k=k: wide(k))
            if bad:
                name = pg.outputs[k] if len(got) == len(pg.outputs) else f"output {k}"
                raise VerifyError("import", name, bad + " (against the model itself)", _origin(pg, name))

    def stage(self, name: str, before: PrimGraph, after: PrimGraph) -> None:
        """Every tensor ``after`` shares with ``before`` (by name) and every output (by position)
        against ``before``'s; the first that differs is blamed.  Each prim of ``after`` is
        evaluated on ``before``'s values of the tensors they share (as each kernel is, below): a
        rewrite is held to what it computes itself, not to rounding of an earlier, legitimate
        reordering that an ill-conditioned op downstream amplifies (a merged projection's sums,
        then a normalization of a near-zero vector: Swin2SR's cosine attention).  The values kept
        for the next stage are ``after``'s own (each prim on ``after``'s values of its inputs), so
        a kernel recomputing a chain of them gets what they hold."""
        self.stages.append(name)
        if after is before:
            return
        old = self.values(before)
        lo = floor(before.types.values())
        new: dict[str, torch.Tensor] = {c.name: c.data for c in after.constants}
        new.update((d.name, self.feeds[d.name]) for d in after.inputs)
        folded = [c.name for c in after.constants if c.name in old and c.name not in before.constant_map]
        for n in folded:
            bad = difference(new[n], old[n], lo)
            if bad:
                raise VerifyError(name, n, bad, _origin(after, n) or _origin(before, n))
        own = dict(new)           # after's values, each prim on after's values of its inputs
        moved = set(folded)       # the tensors whose own value is not before's
        judged: set[str] = set()  # the shared tensors judged here
        for p in after.prims:
            if p.name in old and p == before.producers.get(p.name) and not moved.intersection(p.inputs):
                own[p.name] = new[p.name] = old[p.name]         # the same prim on the same values
                continue
            ins = [old[n] if n in old else new[n] for n in p.inputs]
            new[p.name] = eval_prim(p, ins)
            own[p.name] = (eval_prim(p, [own[n] for n in p.inputs]) if moved.intersection(p.inputs)
                           else new[p.name])
            moved.add(p.name)
            if p.name in old:
                judged.add(p.name)
                bad = difference(new[p.name], old[p.name], lo)
                if bad and _sums(p):
                    bad = difference(new[p.name], old[p.name], lo, eval_prim(_terms_size(p), ins))
                if bad and any(n not in old for n in p.inputs) and _same_function(p.name, before, after, old, new, lo):
                    bad = None
                if bad:
                    raise VerifyError(name, p.name, bad, _origin(after, p.name) or _origin(before, p.name))
        for k, (a, b) in enumerate(zip(after.outputs, before.outputs)):
            if a == b and (a in judged or a not in moved):
                continue
            bad = difference(new[a], old[b], lo)
            if bad:
                raise VerifyError(name, a, f"(output {k}) {bad}", _origin(after, a))
        self._graph, self._values = after, own

    def plan(self, plan, pg: PrimGraph) -> None:
        """The plan's kernels, each evaluated by the reference on the reference values of what it
        reads (not on what earlier kernels wrote: as in ``stage``, rounding is not compounded)."""
        self.stages.append("plan")
        vals = self.values(pg)
        lo = floor(pg.types.values())
        for i, k in enumerate(plan.kernels):
            local: dict[str, torch.Tensor] = {}
            for p in k.prims:
                local[p.name] = eval_prim(p, [local[n] if n in local else vals[n] for n in p.inputs])
            for t in k.outputs:
                bad = difference(local[t], vals[t], lo)
                if bad:
                    raise VerifyError("plan", t, f"as kernel {i} {k.candidate} computes it {bad}", _origin(pg, t))

    def kernels(self, built: Sequence, pg: PrimGraph, device: torch.device, plan=None) -> None:
        """Each built kernel alone, on the reference values of its inputs, on ``device``.  Where a
        16-bit output differs from the reference, it may instead match the kernel's prims computed
        without rounding between them (``unrounded``): a fused kernel keeps its intermediates in
        fp32 registers, and a difference one rounding of a large intermediate makes survives a
        cancellation downstream (an attention output minus its input, in bf16); or be at most
        twice as far from its prims computed in float64 as the reference is (RMS).  A sum is judged
        against its terms' sizes, as in ``stage`` (a kernel adds in its own order: MaskFormer's
        GroupNorm, a centered sum of 2,048 terms, differs by 1.4e-5 where it is 1e-5 itself)."""
        self.stages.append("kernels")
        vals = self.values(pg)
        lo = floor(pg.types.values())
        owner = {t: k for k in plan.kernels for t in k.outputs} if plan is not None else {}
        for i, b in enumerate(built):
            ins = [vals[n].to(device).contiguous() for n in b.inputs]
            outs = [torch.empty(vals[n].shape, dtype=vals[n].dtype, device=device) for n in b.outputs]
            try:
                b.run(ins, outs + allocate(b.scratch, device))
            except Exception as e:
                raise VerifyError("kernels", b.outputs[0] if b.outputs else None,
                                  f"could not be computed: kernel {i} {b.name} ({b.family}) raised "
                                  f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}",
                                  _origin(pg, b.outputs[0]) if b.outputs else None) from e
            wide: dict[str, torch.Tensor] | None = None
            for n, o in zip(b.outputs, outs):
                bad = difference(o, vals[n], lo)
                made = pg.producers.get(n)
                if bad and made is not None and _sums(made):     # as in ``stage``: a centered sum's rounding
                    bad = difference(o, vals[n], lo, eval_prim(_terms_size(made), [vals[i] for i in made.inputs]))
                if bad and o.dtype in HALF_TORCH and n in owner:
                    wide = wide if wide is not None else unrounded(owner[n].prims, vals, pg)
                    if difference(o, wide[n].to(o.dtype), lo) is None:
                        continue
                    # the kernel rounds elsewhere still (a tensor-core product of attention's P
                    # rounded to bf16), and an ill-conditioned prim after it (a LayerNorm over two
                    # nearly equal values) magnifies that: held to its prims in float64, at most
                    # twice as far from them as the reference (RMS), as ``mismatch`` holds outputs
                    mine = {q.name for q in owner[n].prims}
                    exact = _float64(n, pg, lambda m: m not in mine, vals)
                    if exact is not None and _rms(o, exact) <= 2 * _rms(vals[n], exact) + 1e-6:
                        continue
                if bad:
                    raise VerifyError("kernels", n, f"as kernel {i} {b.name} ({b.family}) writes it {bad}",
                                      _origin(pg, n))


def _same_function(name: str, before: PrimGraph, after: PrimGraph, old: Mapping[str, torch.Tensor],
                   new: Mapping[str, torch.Tensor], lo: DType | None) -> bool:
    """Whether ``name``, read through tensors the rewrite made (not in ``before``), differs from
    ``before``'s only by rounding.  Both graphs compute it again in float64 from the same tensors:
    those of ``before`` that ``after``'s new tensors are made from.  Where those agree (to the
    program's own tolerance) the rewrite computes the same function, and ``after``'s value must
    be at most twice as far from the float64 one as ``before``'s is (RMS), as ``mismatch`` holds a
    16-bit program.  A rewrite's new sums (Swin2SR's merged q/k/v projection) round differently,
    and a normalization of a near-zero vector downstream magnifies that past any tolerance."""
    leaves: set[str] = set()

    def after_leaf(n: str) -> bool:
        if n in old and n != name:
            leaves.add(n)
            return True
        return False

    mine = _float64(name, after, after_leaf, {**new, **old})
    theirs = _float64(name, before, lambda n: n in leaves and n != name, old)
    if mine is None or theirs is None or difference(mine, theirs, lo) is not None:
        return False
    return _rms(new[name], theirs) <= 2 * _rms(old[name], theirs) + 1e-6


def _float64(name: str, pg: PrimGraph, leaf: Callable[[str], bool],
             vals: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """``name`` computed in float64 (opaque prims in their own types) from ``vals`` at the tensors
    where ``leaf`` holds and at ``pg``'s inputs and constants; None where it is not a float."""
    done: dict[str, torch.Tensor] = {}
    todo = [name]
    while todo:
        n = todo[-1]
        if n in done:                 # (asked for by two consumers before either was computed)
            todo.pop()
            continue
        p = pg.producers.get(n)
        if p is None or leaf(n):
            v = vals[n]
            done[n] = v.double() if v.is_floating_point() else v
            todo.pop()
            continue
        missing = [i for i in p.inputs if i not in done]
        if missing:
            todo.extend(missing)
            continue
        ins = [done[i] for i in p.inputs]
        if p.is_opaque:
            v = eval_prim(p, [x.to(pg.types[i].dtype.to_torch()) for i, x in zip(p.inputs, ins)])
        else:
            v = eval_prim(_widened(p, DType.float64), ins)
        done[n] = v.double() if v.is_floating_point() else v
        todo.pop()
    out = done[name]
    return out if out.is_floating_point() else None


def unrounded(prims: Sequence[Prim], vals: Mapping[str, torch.Tensor], pg: PrimGraph) -> dict[str, torch.Tensor]:
    """The values of one kernel's ``prims`` (in order) from the reference values of what they read,
    each computed in fp32 where its type is 16-bit and passed on unrounded; an opaque prim reads
    its inputs in their own types."""
    local: dict[str, torch.Tensor] = {}
    for p in prims:
        ins = [local[n] if n in local else vals[n] for n in p.inputs]
        if p.is_opaque:
            local[p.name] = eval_prim(p, [x.to(pg.types[n].dtype.to_torch()) for n, x in zip(p.inputs, ins)])
        else:
            local[p.name] = eval_prim(_widened(p), ins)
    return local


def _widened(p: Prim, to: DType = DType.float32) -> Prim:
    """``p`` computed in ``to`` wherever its float types are narrower (16-bit into fp32; into
    float64, fp32 too)."""
    narrow = HALF if to is DType.float32 else HALF + (DType.float32,)
    if p.out.dtype not in narrow and not any(n.dtype in narrow for n in walk(p.body)):
        return p
    body = transform(p.body, lambda n: retype(n, to) if n.dtype in narrow else None)
    return dataclasses.replace(p, body=body, out=dataclasses.replace(p.out, dtype=body.dtype))


HALF = (DType.float16, DType.bfloat16)
HALF_TORCH = (torch.float16, torch.bfloat16)


def _non_finite(got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor) -> str | None:
    """Where ``got`` and ``want`` differ in finiteness (one finite, or two different non-finite
    values), ``got`` must be what ``exact`` rounds to in ``got``'s type there: its infinities,
    NaNs and finite values alike (the RMS comparison cannot see those elements).  What differs,
    else None."""
    g, w = got.detach().cpu().double(), want.detach().cpu().double()
    e = exact.detach().cpu().to(got.dtype).double()
    if e.shape != g.shape:
        return None
    apart = (torch.isfinite(g) != torch.isfinite(w)) | (~torch.isfinite(g) & ~torch.isfinite(w) &
                                                          ~(g == w) & ~(torch.isnan(g) & torch.isnan(w)))
    agree = (torch.isnan(g) & torch.isnan(e)) | (g == e) | (torch.isfinite(g) & torch.isfinite(e))
    wrong = apart & ~agree
    if not wrong.any():
        return None
    first = tuple(wrong.nonzero()[0].tolist())
    return (f"at {int(wrong.sum())} elements where the model is not finite or tilefuse is not, the wider run "
            f"disagrees with tilefuse (first at {list(first)}: got {g[first].item()}, want {w[first].item()}, "
            f"wider {exact[first].item()})")


def _rms(got: torch.Tensor, exact: torch.Tensor) -> float:
    d = got.detach().cpu().double() - exact.detach().cpu().double()
    d = d[torch.isfinite(d)]
    return float(d.pow(2).mean().sqrt()) if d.numel() else 0.0


def _origin(pg: PrimGraph, name: str):
    p = pg.producers.get(name)
    return p.origin if p is not None else None


def kernel_device(target) -> torch.device | None:
    """Where the ``kernels`` check runs a plan's kernels: the target's GPU when attached, the CPU
    when kernels run in Triton's interpreter, else nowhere (a GPU plan for another GPU)."""
    if target.is_present():
        return torch.device(target.device)
    from .codegen.triton.interpreter import interpreted
    return torch.device("cpu") if interpreted() else None


def eager_oracle(model, args: tuple, kwargs: Mapping) -> Callable[[], list[torch.Tensor]]:
    """The model's own outputs (eval mode, no gradients), as tensor leaves."""
    from torch.utils import _pytree as pytree

    def run() -> list[torch.Tensor]:
        was = getattr(model, "training", False)
        if isinstance(model, torch.nn.Module):
            model.eval()
        try:
            with torch.no_grad():
                out = model(*args, **kwargs)
        finally:
            if isinstance(model, torch.nn.Module):
                model.train(was)
        return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    return run


def eager_float64(model, args: tuple, kwargs: Mapping) -> Callable[[], list[torch.Tensor]] | None:
    """The model's outputs computed in float64 (a copy of its weights and float inputs widened),
    or None where the model is not a module; a model that cannot run in float64 gives []."""
    import copy
    if not isinstance(model, torch.nn.Module):
        return None

    def widen(x):
        return x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    def run() -> list[torch.Tensor]:
        from torch.utils import _pytree as pytree
        try:
            wide = copy.deepcopy(model).double()
            return eager_oracle(wide, pytree.tree_map(widen, args), pytree.tree_map(widen, dict(kwargs)))()
        except Exception:       # noqa: BLE001 - an op without a float64 kernel: no float64 run
            return []
    return run


def tensor_leaves(unflatten: Callable[[list], object]) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """Graph outputs -> the tensor leaves of the structure the model returns (its order)."""
    from torch.utils import _pytree as pytree
    return lambda outs: [t for t in pytree.tree_leaves(unflatten(list(outs))) if isinstance(t, torch.Tensor)]


def onnx_oracle(model_or_path, feeds: Mapping[str, torch.Tensor]) -> Callable[[], list[torch.Tensor]] | None:
    """onnxruntime's outputs for ``feeds`` (None when onnxruntime is not installed)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    from .frontend.onnx_load import load_model

    def run() -> list[torch.Tensor]:
        model, _ = load_model(model_or_path)
        return _ort_run(ort, model, feeds)
    return run


def _ort_run(ort, model, feeds: Mapping[str, torch.Tensor], cast=lambda t: t) -> list[torch.Tensor]:
    """onnxruntime's outputs of ``model`` for ``feeds`` (each through ``cast`` first)."""
    options = ort.SessionOptions()
    options.log_severity_level = 4
    # the model's operators as written: onnxruntime's graph optimizer fuses patterns into
    # kernels of their own rounding, and once crashed this process in a fuzzed model's session
    # (tests/test_fuzz_onnx.py computes its expected outputs the same way)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    outs = sess.run(None, {n: _numpy(cast(t)) for n, t in feeds.items() if n in names})
    return [torch.from_numpy(o.copy()) if o.dtype.kind != "V" else torch.tensor(o) for o in outs]


def onnx_wide(model_or_path, feeds: Mapping[str, torch.Tensor]) -> Callable[[], list[torch.Tensor]] | None:
    """onnxruntime's outputs of the model computed in a wider type, each value still rounded to
    its declared type: every float type of its tensors, initializers, casts and constants widened
    (to float64, or where onnxruntime has no float64 kernel for one of its operators, its 16-bit
    types to float32), and a Cast to the declared 16-bit type and back after each operator whose
    output is declared so.  So each operator is computed exactly from the rounded values the
    model defines, the ONNX counterpart of ``eager_float64`` that onnxruntime's own 16-bit run is
    not (it computes an operator without a 16-bit kernel in float32 between casts, and drops the
    casts between two such operators: the value between them is never rounded).  [] where it
    runs in neither type; None without onnxruntime."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    import onnx
    from onnx import TensorProto as TP
    from .frontend.onnx_load import load_model

    def run() -> list[torch.Tensor]:
        model, _ = load_model(model_or_path)
        try:
            model = onnx.shape_inference.infer_shapes(model)
        except Exception:       # noqa: BLE001 - without inferred types, values are not rounded
            pass
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 21)
        for to, dtype, widened in ((TP.DOUBLE, torch.float64, {TP.FLOAT16, TP.BFLOAT16, TP.FLOAT}),
                                   (TP.FLOAT, torch.float32, {TP.FLOAT16, TP.BFLOAT16})):
            wide = onnx.ModelProto()
            wide.CopyFrom(model)
            _widen_graph(wide.graph, to, widened, opset)
            try:
                return _ort_run(ort, wide, feeds, lambda t, d=dtype: t.to(d) if t.is_floating_point() and
                                t.dtype.itemsize <= d.itemsize else t)
            except Exception:       # noqa: BLE001 - an operator without a kernel of that type
                continue
        return []
    return run


def _widen_graph(g, to: int, widened: set, opset: int) -> None:
    """``g`` (in place, with its subgraphs) with every tensor type in ``widened`` made ``to``, and
    each operator output declared 16-bit rounded to that type (a Cast to it and back)."""
    from onnx import AttributeProto as AP
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper
    np_type = {TP.FLOAT: "float32", TP.DOUBLE: "float64"}[to]
    declared = {vi.name: vi.type.tensor_type.elem_type for vi in (*g.input, *g.output, *g.value_info)
                if vi.type.HasField("tensor_type")}

    def tensor(t):
        if t.data_type in widened:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np_type), t.name))
    for vi in (*g.input, *g.output, *g.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type in widened:
            vi.type.tensor_type.elem_type = to
    for t in g.initializer:
        tensor(t)
    nodes = []
    for n in g.node:
        for a in n.attribute:
            if a.type == AP.INT and a.name in ("to", "dtype") and a.i in widened:
                a.i = to
            elif a.type == AP.TENSOR:
                tensor(a.t)
            elif a.type == AP.GRAPH:
                _widen_graph(a.g, to, widened, opset)
            elif a.type == AP.GRAPHS:
                for sub in a.graphs:
                    _widen_graph(sub, to, widened, opset)
        if n.op_type == "Clip" and opset >= 11 and declared.get(n.input[0]) in widened - {to}:
            _clip_bounds(g, n, declared[n.input[0]], np_type)
        nodes.append(n)
        for k, out in enumerate(n.output):
            narrow = declared.get(out)
            if out and narrow in (TP.FLOAT16, TP.BFLOAT16):
                n.output[k] = f"{out}__wide"
                nodes.append(helper.make_node("Cast", [f"{out}__wide"], [f"{out}__narrow"], to=narrow))
                nodes.append(helper.make_node("Cast", [f"{out}__narrow"], [out], to=to))
    del g.node[:]
    g.node.extend(nodes)


def _clip_bounds(g, n, narrow: int, np_type: str) -> None:
    """A Clip's absent bounds (opset 11 on) made explicit: they are its input type's limits, which
    widening would move (a 16-bit Clip without max takes +inf to 65504)."""
    import numpy as np
    from onnx import TensorProto as TP
    from onnx import numpy_helper
    limits = torch.finfo({TP.FLOAT16: torch.float16, TP.BFLOAT16: torch.bfloat16, TP.FLOAT: torch.float32}[narrow])
    ins = list(n.input) + [""] * (3 - len(n.input))
    for k, bound in ((1, limits.min), (2, limits.max)):
        if not ins[k]:
            name = f"{n.output[0]}__clip{k}"
            g.initializer.append(numpy_helper.from_array(np.array(float(bound), dtype=np_type), name))
            ins[k] = name
    del n.input[:]
    n.input.extend(ins)


def _numpy(t: torch.Tensor):
    return (t.float() if t.dtype is torch.bfloat16 else t).numpy()

