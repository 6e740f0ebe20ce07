"""Hidet task mappings (codegen/mapping.py): the listings of shared/papers/hidet-notes.md §7, the
composition laws, and the symbolic expansion (what the Triton printer emits) against the integer
semantics."""
from __future__ import annotations

import itertools

import pytest

from tilefuse.ir.expr import Binary, Const, Var
from tilefuse.codegen.mapping import group_m, repeat, spatial

_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
        "floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "min": min}


def _eval(e, w: int) -> int:
    if isinstance(e, Var):
        return w
    if isinstance(e, Const):
        return int(e.value)
    assert isinstance(e, Binary), e
    return _OPS[e.op](_eval(e.a, w), _eval(e.b, w))


def _symbolic(m, w: int):
    return [tuple(_eval(x, w) for x in t) for t in m.expand(Var("w"))]


def test_repeat_and_spatial_listings():
    assert repeat(2, 2)(0) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [spatial(2, 2)(w) for w in range(4)] == [[(0, 0)], [(0, 1)], [(1, 0)], [(1, 1)]]


def test_composition_is_not_commutative():
    a = spatial(2, 2) * repeat(2, 2)        # each warp a contiguous 2x2 block (Fig. 13)
    assert a.workers == 4 and a.shape == (4, 4)
    assert a(1) == [(0, 2), (0, 3), (1, 2), (1, 3)]
    assert a(2) == [(2, 0), (2, 1), (3, 0), (3, 1)]
    b = repeat(2, 2) * spatial(2, 2)        # strided, interleaved
    assert b(0) == [(0, 0), (0, 2), (2, 0), (2, 2)]
    assert b(3) == [(1, 1), (1, 3), (3, 1), (3, 3)]


def test_figure_8_load_mapping_covers_the_tile_once():
    m = repeat(4, 1) * spatial(16, 8)
    assert m.workers == 128 and m.shape == (64, 8)
    assert m(0) == [(0, 0), (16, 0), (32, 0), (48, 0)]
    assert m(8) == [(1, 0), (17, 0), (33, 0), (49, 0)]
    assert m(127) == [(15, 7), (31, 7), (47, 7), (63, 7)]
    tasks = [t for w in range(m.workers) for t in m(w)]
    assert sorted(tasks) == sorted(itertools.product(range(64), range(8)))


def test_cuda_core_matmul_mapping():
    m = spatial(4, 2) * repeat(2, 2) * spatial(4, 8) * repeat(4, 4)
    assert m.workers == 256 and m.shape == (128, 128)
    t0 = m(0)
    assert len(t0) == 64 and t0[:5] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    assert {r for r, _ in t0} == set(range(4)) | set(range(16, 20))
    assert {c for _, c in t0} == set(range(4)) | set(range(32, 36))
    assert m(1)[0] == (0, 4) and m(8)[0] == (4, 0) and m(32)[0] == (0, 64)
    assert {r for r, _ in m(255)} == set(range(108, 112)) | set(range(124, 128))
    assert {c for _, c in m(255)} == set(range(92, 96)) | set(range(124, 128))
    tasks = [t for w in range(m.workers) for t in m(w)]
    assert len(set(tasks)) == len(tasks) == 128 * 128


def test_composition_is_associative():
    f1, f2, f3 = spatial(2, 1), repeat(1, 2), spatial(2, 2)
    a, b = (f1 * f2) * f3, f1 * (f2 * f3)
    assert a.workers == b.workers == 8 and a.shape == b.shape == (4, 4)
    assert all(a(w) == b(w) for w in range(8))


def test_composition_checks_rank_and_workers():
    with pytest.raises(ValueError, match="rank"):
        spatial(2, 2) * repeat(2)
    with pytest.raises(ValueError, match="outside"):
        spatial(2, 2)(4)


@pytest.mark.parametrize("rows,cols,g", [(10, 3, 8), (16, 5, 8), (3, 7, 8), (9, 1, 4)])
def test_group_m_is_a_bijection_walking_groups_column_by_column(rows, cols, g):
    m = group_m(rows, cols, g)
    tiles = [m(w)[0] for w in range(m.workers)]
    assert sorted(tiles) == sorted(itertools.product(range(rows), range(cols)))
    # the first min(g, rows) programs are the first column of the first group
    first = min(g, rows)
    assert tiles[:first] == [(r, 0) for r in range(first)]


@pytest.mark.parametrize("mapping", [
    spatial(3, 5), spatial(1, 4), spatial(4, 1, 3), repeat(2, 3), spatial(2, 2) * repeat(2, 2),
    repeat(2, 2) * spatial(2, 2), spatial(4, 2) * repeat(2, 2) * spatial(4, 8) * repeat(4, 4),
    group_m(10, 3, 8), group_m(16, 4, 8)], ids=lambda m: m.name)
def test_symbolic_expansion_matches_the_integer_mapping(mapping):
    for w in range(mapping.workers):
        assert _symbolic(mapping, w) == mapping(w)


@pytest.mark.parametrize("mapping", [spatial(3, 5), spatial(7), group_m(10, 6, 4), group_m(3, 5, 8),
                                     spatial(2, 3) * repeat(2, 1)], ids=lambda m: m.name)
def test_the_window_of_the_first_workers(mapping):
    """``window(w)``: the distinct coordinates per dimension the first w workers' tasks take,
    in closed form where the mapping has one, by enumeration otherwise; group-M order's window
    is one group tall (it errs towards more re-reads when the workers span several groups)."""
    for w in range(1, mapping.workers + 3):
        seen = [set() for _ in mapping.shape]
        for k in range(min(w, mapping.workers)):
            for t in mapping(k):
                for s, x in zip(seen, t):
                    s.add(x)
        got, enumerated = mapping.window(w), tuple(len(s) for s in seen)
        if mapping.name.startswith("group_m"):
            rows, cols = mapping.shape
            g = int(mapping.name.rstrip(")").split(", ")[-1])
            assert got == (min(rows, g), max(min(cols, min(w, mapping.workers) // min(rows, g)), 1))
            assert got[1] >= enumerated[1] - 1 or min(w, mapping.workers) > g * cols
        else:
            assert got == enumerated, (w, got, enumerated)
