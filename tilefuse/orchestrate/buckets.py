"""Buckets of sizes: the sizes one plan serves, for programs whose sizes change from call to call.

A size symbol (a sequence or key length, a batch) falls in a power-of-two bucket: 1, 2, 3–4,
5–8, ..., 2^(k-1)+1 – 2^k, so sizes up to ``n`` need at most ⌈log2 n⌉ + 1 buckets.  A bucket is
planned once, at its largest size but one (so the plan does not depend on which size came
first), and every size in it is served by that plan carried to the size (``instantiate``).  Not
at the largest: a power of two often equals one of the model's own dims (a head dim of 64), and
where two dims coincide a plan may fuse what no other size of the bucket can (a kernel writing
a [S, 64] and an [S, S] tensor over one tile space), so it would not carry.  The bucket's *bound*
is how much slower, modelled, the carried plan is than the size's own optimal plan at the
bucket's smallest size (planned once more to check: the size farthest from the one planned).
Buckets and plans are chosen together: where the bound exceeds ``TOLERANCE`` the bucket is
narrowed (its far end moved halfway to the planned size) and checked again there, until it holds
or the bucket is the planned size alone; the sizes cut off form buckets of their own, planned when
a call needs them (``clipped``).  Sizes between the checked ones are not planned, so the bound is
checked at the bucket's ends, not proven for every size (``bench/buckets.py`` checks sizes across
a range).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from ..log import logger
from .instantiate import PlanMismatch, PlanTemplate

TOLERANCE = 0.10
SAMPLES = 4          # sizes a bucket's kernels are generated at to make their sources size-generic
_log = logger("recompile")


def bucket(n: int) -> tuple[int, int]:
    """The bucket of size ``n``: its (first, last) size."""
    if n <= 2:
        return n, n
    last = 1 << (n - 1).bit_length()
    return last // 2 + 1, last


def planned_size(first: int, last: int) -> int:
    """Where a bucket is planned: its largest size but one (odd), or its only size."""
    return last - 1 if last > first else last


def checked_size(first: int, last: int) -> int:
    """Where its bound is checked: the size farthest from the planned one."""
    return first if first != planned_size(first, last) else last


@dataclass(frozen=True)
class Bucket:
    ranges: Mapping[str, tuple[int, int]]      # symbol -> (first, last) size served
    template: PlanTemplate                     # the plan, at ``planned_size``
    planned_us: float                          # its modelled time there
    checked_at: Mapping[str, int] | None = None    # where the bound was checked (``checked_size``)
    own_us: float | None = None                # modelled: those sizes' own optimal plan ...
    carried_us: float | None = None            # ... and the bucket's plan carried there
    asked: Mapping[str, tuple[int, int]] | None = None   # the ranges asked for, when narrowed

    @property
    def narrowed(self) -> bool:
        return self.asked is not None and dict(self.asked) != dict(self.ranges)

    def holds(self, sizes: Mapping[str, int]) -> bool:
        """Whether the bucket serves ``sizes`` (symbol -> size)."""
        return set(sizes) == set(self.ranges) and all(a <= sizes[s] <= b for s, (a, b) in self.ranges.items())

    @property
    def slower(self) -> float | None:
        """How much slower (modelled) the carried plan is than the own one at ``checked_at``."""
        if self.own_us is None or self.carried_us is None:
            return None
        return self.carried_us / self.own_us - 1.0 if self.own_us > 0 else 0.0

    def describe(self) -> str:
        """The bound, for a log line ("" when not checked)."""
        if self.slower is None:
            return ""
        return (f"; at {self.checked_at} {100 * self.slower:+.1f}% against its own plan "
                f"({self.carried_us:.1f} vs {self.own_us:.1f} us, modelled)")

    def record(self) -> dict[str, Any]:
        """What a report's ``specialization`` says about the bucket."""
        return {"ranges": {s: list(r) for s, r in self.ranges.items()},
                "planned_at": dict(self.template.sizes), "planned_us": round(self.planned_us, 3),
                "checked_at": dict(self.checked_at) if self.checked_at else None,
                "own_us": None if self.own_us is None else round(self.own_us, 3),
                "carried_us": None if self.carried_us is None else round(self.carried_us, 3),
                "slower": None if self.slower is None else round(self.slower, 4),
                "generic_kernels": sum(g is not None for g in self.template.generics),
                "generic_over": list(self.template.generic_over),
                "narrowed_from": {s: list(r) for s, r in self.asked.items()} if self.narrowed else None}


# compile_at(sizes, template) -> a CompiledModel of the program at ``sizes`` (symbol -> size):
# planned when ``template`` is None, else ``template`` carried there
CompileAt = Callable[[Mapping[str, int], "PlanTemplate | None"], Any]


def generic_samples(ranges: Mapping[str, tuple[int, int]]) -> tuple[tuple[str, ...], list[int]]:
    """(the symbols a bucket's size-generic kernels are over: those of its widest range, moving
    together; the sizes they are generated at: up to ``SAMPLES`` sizes spread over that range, odd
    and, where the range has two such, with no multiple of 8 beside them, so that no block divides
    the sizes the program derives (a key length one past the cache's) and every mask a size may
    need is there)."""
    wide = {s: r for s, r in ranges.items() if r[1] > r[0]}
    if not wide:
        return (), []
    widest = max(r[1] - r[0] for r in wide.values())
    over = tuple(s for s, r in wide.items() if r[1] - r[0] == widest)
    first, last = wide[over[0]]
    odd = [t for t in range(first, last) if t % 2]
    apart = [t for t in odd if (t - 1) % 8 and (t + 1) % 8]
    pick = apart if len(apart) >= 2 else odd
    if len(pick) > SAMPLES:
        pick = sorted({pick[round(k * (len(pick) - 1) / (SAMPLES - 1))] for k in range(SAMPLES)})
    return over, pick


def clipped(ranges: Mapping[str, tuple[int, int]], sizes: Mapping[str, int], taken) -> dict:
    """``ranges`` (holding ``sizes``) less, per symbol, the sizes that the narrowed buckets
    ``taken`` (their ranges) serve: what a narrowing cut off is a bucket of its own."""
    out = dict(ranges)
    for other in taken:
        if set(other) != set(out):
            continue
        for s, (a, b) in other.items():
            lo, hi = out[s]
            n = sizes[s]
            if b < lo or a > hi or a <= n <= b:
                continue
            out[s] = (lo, min(hi, a - 1)) if a > n else (max(lo, b + 1), hi)
    return out


def _narrow(ranges: Mapping[str, tuple[int, int]], at: Mapping[str, int]) -> dict:
    """Each range's checked end moved halfway to the planned size."""
    out = {}
    for s, (first, last) in ranges.items():
        end = checked_size(first, last)
        if end == at[s]:
            out[s] = (first, last)
        elif end < at[s]:
            out[s] = (end + (at[s] - end + 1) // 2, last)
        else:
            out[s] = (first, end - (end - at[s] + 1) // 2)
    return out


def plan_bucket(ranges: Mapping[str, tuple[int, int]], compile_at: CompileAt, *, check: bool = True):
    """The bucket of these ranges (symbol -> (first, last) size: ``bucket``, or one size): planned
    at ``planned_size``; with ``check``, its bound checked at ``checked_size`` and the ranges
    narrowed until it holds (the Bucket's ``ranges`` may then be narrower than asked: what they
    no longer hold needs a bucket of its own); its kernels made size-generic from their sources at
    ``generic_samples`` (``codegen/triton/generic.py``).  Returns (the Bucket, the CompiledModel
    it was planned on)."""
    asked = ranges = dict(ranges)
    at = {s: planned_size(*r) for s, r in ranges.items()}
    top = compile_at(at, None)
    template = PlanTemplate(top.template.plan, top.template.rewrites, top.template.strategy, dict(at),
                            persistent=top.template.persistent)
    made = {tuple(at.items()): top}
    bound = ()
    while check:
        first = {s: checked_size(*r) for s, r in ranges.items()}
        if first == at:
            break
        own = compile_at(first, None).report.est_total_us
        try:
            carried = made[tuple(first.items())] = compile_at(first, template)
        except PlanMismatch as e:        # the plan does not carry there at all: as if far slower
            _log.info("the plan for sizes %s does not carry to %s (%s): narrowed to %s", describe_ranges(ranges),
                      first, e, describe_ranges(_narrow(ranges, at)))
            ranges = _narrow(ranges, at)
            continue
        bound = (dict(first), own, carried.report.est_total_us)
        slower = carried.report.est_total_us / own - 1.0 if own > 0 else 0.0
        if slower <= TOLERANCE:
            break
        _log.info("the plan for sizes %s is %.0f%% slower (modelled) at %s than that size's own plan (tolerance "
                  "%.0f%%): narrowed to %s", describe_ranges(ranges), 100 * slower, first, 100 * TOLERANCE,
                  describe_ranges(_narrow(ranges, at)))
        ranges = _narrow(ranges, at)
    if bound and not all(a <= bound[0][s] <= b for s, (a, b) in ranges.items()):
        bound = ()          # narrowed to the planned sizes alone: nothing left to check
    over, ts = generic_samples(ranges)
    if len(ts) >= 2:
        from ..codegen.triton.generic import kernel_generics
        samples = {}
        for t in ts:
            where = {**at, **{s: t for s in over}}
            try:
                samples[t] = (made.get(tuple(where.items())) or compile_at(where, template)).kernels
            except PlanMismatch:
                continue                 # (that size will be planned on its own when it comes)
        generics = kernel_generics(samples) if len(samples) >= 2 else ()
        if any(generics):
            template = replace(template, generics=generics, generic_over=over,
                               generic_fixed={s: n for s, n in at.items() if s not in over})
    result = Bucket(ranges, template, top.report.est_total_us, *bound, asked=asked)
    return result, top


def describe_ranges(ranges: Mapping[str, tuple[int, int]]) -> str:
    return ", ".join(f"{s} {a}..{b}" for s, (a, b) in ranges.items())
