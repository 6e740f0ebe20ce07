"""MCFuser's tiling expressions, placement, pruning rules, analytic model and search
(bench/mcfuser.py, the paper's model beside the product): the test cases of shared/papers/mcfuser-notes.md §7 (T1–T9, T12), and the
Triton template's space, traffic and FLOPs against the notes' closed form (§3.4)."""
from __future__ import annotations

import itertools
import random
import sys
from dataclasses import astuple
from pathlib import Path

import pytest

from tilefuse.cost.target import Target
from tilefuse.ir.dtypes import DType

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from mcfuser import (  # noqa: E402
    NK, Candidate, ChainShape, ChainTile, ModelParams, bind, caches_intermediate,
                                      chain_flops, chain_tiles, chain_traffic, classes, deep, estimate, expand,
                                      extents, fits_smem, flat, mutate, parse, phi, place, pruned_space, search,
                                      smem_bytes, space_size, tile_sizes, tilings, trips, volumes)

A100_PAPER = ModelParams(bandwidth=1.555e12, peak=312e12, sm_count=108)   # notes T8: A100-PCIE 40 GB
G1 = ChainShape(batch=1, m=512, n=256, k=64, h=64, itemsize=2)
T1 = ChainShape(batch=1, m=1024, n=1024, k=512, h=512, itemsize=2)
BERT = ChainShape(batch=12, m=128, n=128, k=64, h=64, itemsize=2)


# ---------------------------------------------------------------- expressions (T1, T2)

def test_t1_space_size():
    assert space_size(T1) == 26 * 64 ** 2 * 32 ** 2 == 109_051_904


def test_t2_generators_and_canonical_strings():
    d = [str(e) for e in deep()]
    assert len(d) == len(set(d)) == 24 and "mhnk" in d and "mnkh" in d
    assert [str(e) for e in flat()] == ["mn(k,h)", "nm(k,h)"]
    for text in d + ["mn(k,h)", "nm(k,h)", "(k,h)", "n(k,h)", "m"]:
        assert str(parse(text)) == text
    for bad in ("mhnkx", "mm", "m(k", "mn(k,)", "", "m)"):
        with pytest.raises(ValueError):
            parse(bad)


def test_t2_rule1_binds_spatial_loops():
    assert str(bind(parse("mhnk")).sub) == str(bind(parse("mnkh")).sub) == "nk"
    assert bind(parse("mhnk")) == bind(parse("mnkh"))
    assert str(bind(parse("khnm"))) == "hm|kn"
    # h sits in a sequence in the flat forms: it encloses nothing of C, so it is not bound
    assert [str(bind(e)) for e in flat()] == ["m|n(k,h)", "m|n(k,h)"]
    assert str(bind(parse("mhnk")).expr) == "mhnk" and str(bind(parse("nm(k,h)")).expr) == "mn(k,h)"


def test_t2_rule1_and_rule2_counts():
    exprs = deep() + flat()
    assert len(exprs) == 26
    # the paper's 26 -> 5 -> 3 under its own (literal) trip counts, where the binding order matters
    assert [str(t) for t in classes(exprs, convention="literal")] == ["mh|nk", "mh|kn", "hm|nk", "hm|kn",
                                                                      "m|n(k,h)"]
    assert [str(t) for t in tilings(convention="literal")] == ["mh|nk", "hm|nk", "m|n(k,h)"]
    # block-aware counting makes the binding order irrelevant: 3 -> 2
    assert [str(t) for t in classes(exprs, convention="block")] == ["mh|nk", "mh|kn", "m|n(k,h)"]
    assert [str(t) for t in tilings(convention="block")] == ["mh|nk", "m|n(k,h)"]
    assert caches_intermediate(bind(parse("mhkn")))               # Rule 2 removes kn (Fig. 6)
    assert not caches_intermediate(bind(parse("mhnk"))) and not caches_intermediate(bind(parse("mn(k,h)")))


# ---------------------------------------------------------------- placement (T3)

def test_t3_expansion_relocation_and_trip_counts():
    e = parse("mhnk")
    ext = {"m": 8, "n": 4, "k": 3, "h": 2}
    x, r = expand(e, ext), place(e, ext)
    assert str(x.tree) == "mhn(k(LA,LB,CC),LD,CE,SE)"
    assert str(r.tree) == "mh(n(k(LA,LB,CC),LD,CE),SE)"
    before, after = (trips(p, ext, convention="literal") for p in (x, r))
    assert before["SE"] == 8 * 2 * 4 and after["SE"] == 8 * 2
    assert after == {"LA": 192, "LB": 192, "CC": 192, "LD": 64, "CE": 64, "SE": 16}


def test_t3_dead_k_hoists_the_a_load():
    e = parse("mhnk")
    ext = {"m": 8, "n": 4, "k": 1, "h": 2}
    x, r = expand(e, ext), place(e, ext)
    assert str(x.tree) == "mhn(LA,LB,CC,LD,CE,SE)"
    assert str(r.tree) == "m(LA,h(n(LB,CC,LD,CE),SE))"
    lit_x, lit_r = (trips(p, ext, convention="literal") for p in (x, r))
    assert lit_x["LA"] == 8 * 2 * 4 and lit_r["LA"] == 8                 # the paper: divided by h·n
    blk = trips(r, ext, convention="block", bound=("m", "h"), batch=3)
    assert blk["LA"] == 3 * 8 * 2                                          # each (m, h) block loads its A tile
    assert blk["LD"] == 3 * 8 * 2 * 4 and blk["SE"] == 3 * 8 * 2


def test_order_dependences():
    # CE needs the whole C: it cannot run inside k (an unbound mnkh, or kn per block)
    for text in ("mnkh", "mhkn"):
        with pytest.raises(ValueError, match="reduction loop of CC"):
            expand(parse(text))
    # the flat form's SE waits for E's reduction loop n to close, outside h
    ext = {"m": 8, "n": 4, "k": 3, "h": 2}
    assert str(place(parse("mn(k,h)"), ext).tree) == "m(n(k(LA,LB,CC),h(LD,CE)),SE)"
    assert str(place(parse("mn(k,h)"), ext | {"k": 1}).tree) == "m(LA,n(LB,CC,h(LD,CE)),SE)"
    # loads hoisted out of every loop come before the loop that uses them
    assert str(place(parse("mhnk"), {"m": 32, "n": 1, "k": 1, "h": 1}).tree) == "(LB,LD,m(LA,CC,CE,SE))"
    with pytest.raises(ValueError, match="convention"):
        trips(place(parse("mhnk")), ext, convention="paper")


def test_flat_store_covers_every_h_tile():
    s = ChainShape(batch=2, m=256, n=512, k=128, h=256, itemsize=2)
    flat_tiling = bind(parse("mn(k,h)"))
    w = volumes(s, flat_tiling, ChainTile(64, 64, 32, 64), convention="literal")
    assert w["SE"] == 2 * 256 * 256                       # E stored once, all h tiles after n closes
    assert w["LD"] == 2 * 512 * 256 * 4                   # D reloaded per m tile
    assert w["LA"] == 2 * 256 * 128 * 8                   # A per n tile, not per h tile
    assert w["CC"] == 2 * 2 * 256 * 512 * 128             # C computed once (no recomputation per h)


# ---------------------------------------------------------------- ϕ, Rule 3, Rule 4, α (T4–T7)

def test_t4_phi():
    got = [round(phi(256, 256, k), 3) for k in (1024, 256, 64, 16, 1)]
    assert got == [204.8, 128.0, 51.2, 15.059, 0.996]


def test_t5_rule3_tile_lists():
    table = {
        64: (16, 32, 64), 80: (16, 80), 128: (16, 32, 64, 128), 256: (16, 32, 64, 128, 256),
        384: (16, 32, 48, 64, 80, 96, 128, 192, 384), 512: (16, 32, 64, 128, 256, 512),
        768: (16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256, 384, 400, 768),
        1024: (16, 32, 64, 128, 256, 512, 1024),
    }
    assert {d: tile_sizes(d) for d in table} == table
    assert len(tile_sizes(1024)) ** 2 * len(tile_sizes(512)) ** 2 == 1764


def test_t6_rule4():
    a100 = Target.get("a100").smem_per_block
    assert a100 == 166_912
    t128, t256 = ChainTile(128, 128, 128, 128), ChainTile(256, 256, 256, 256)
    assert smem_bytes(t128, 2) == 163_840 and smem_bytes(t256, 2) == 655_360
    assert fits_smem(t128, 2, a100) and not fits_smem(t256, 2, a100)
    assert not fits_smem(t128, 2, 101_376)                                 # RTX 3080 (sm86)
    assert smem_bytes(ChainTile(16, 32, 64, 128), 2) == 2 * (16 * 64 + 64 * 32 + 16 * 32 + 32 * 128 + 16 * 128)


def test_t1_pruned_space_sizes():
    a100 = Target.get("a100").smem_per_block
    lit, blk = (pruned_space(T1, a100, convention=c) for c in ("literal", "block"))
    assert len(lit) == 3 * 751 and len(blk) == 2 * 751                    # Rule 4 keeps 751 of 1764


def test_t7_alpha():
    alpha = {}
    for m in (64, 8, 1):                                                    # 8, 64 and 512 blocks
        c = Candidate(NK, ChainTile(m, 64, 64, 64))
        alpha[512 // m] = estimate(G1, c, A100_PAPER, convention="literal").alpha
    assert alpha[8] == 14.5 and alpha[64] == (64 + 108) / 64 and alpha[512] == pytest.approx(1.21, abs=0.01)
    c108 = Candidate(NK, ChainTile(16, 64, 64, 64))
    assert estimate(ChainShape(1, 16 * 108, 64, 64, 64, 2), c108, A100_PAPER, convention="block").alpha == 2.0


def test_model_params_from_target():
    h100 = Target.get("h100")
    p = ModelParams.of(h100)
    assert (p.bandwidth, p.peak, p.sm_count) == (3.35e12, 989.4e12, 132)
    assert ModelParams.of(h100, DType.float32).peak == 494.7e12


# ---------------------------------------------------------------- the model (T8, T9)

def test_t8_model_on_g1():
    e = estimate(G1, Candidate(NK, ChainTile(64, 64, 64, 64)), A100_PAPER, convention="literal")
    assert extents(G1, ChainTile(64, 64, 64, 64)) == {"m": 8, "n": 4, "k": 1, "h": 1}
    assert volumes(G1, NK, ChainTile(64, 64, 64, 64), convention="literal") == {
        "LA": 32_768, "LB": 131_072, "CC": 16_777_216, "LD": 131_072, "CE": 16_777_216, "SE": 32_768}
    assert (e.bytes, e.flops, e.alpha) == (655_360, 33_554_432, 14.5)
    assert round(e.t_mem * 1e6, 3) == 0.421 and round(e.t_comp * 1e6, 4) == 0.1075
    assert round(e.seconds * 1e6, 2) == 7.67
    variants = {tm: estimate(G1, Candidate(NK, ChainTile(tm, 64, 64, 64)), A100_PAPER, convention="literal")
                for tm in (32, 16, 128)}
    assert {tm: v.alpha for tm, v in variants.items()} == {32: 7.75, 16: 4.375, 128: 28.0}
    assert {tm: round(v.seconds * 1e6, 2) for tm, v in variants.items()} == {32: 6.71, 16: 6.74, 128: 10.09}


def test_t9_trip_count_conventions():
    c = Candidate(NK, ChainTile(16, 256, 64, 64))
    lit, blk = (estimate(G1, c, A100_PAPER, convention=v) for v in ("literal", "block"))
    assert round(lit.seconds * 1e6, 2) == 1.02 and round(blk.seconds * 1e6, 2) == 6.74
    assert lit.flops == blk.flops and lit.alpha == blk.alpha == 4.375
    # literal: B and D hoisted out of the bound m loop, loaded once; block-aware: once per m block
    assert lit.bytes == 2 * (512 * 64 + 64 * 256 + 256 * 64 + 512 * 64)
    assert blk.bytes == 2 * (512 * 64 + 32 * 64 * 256 + 32 * 256 * 64 + 512 * 64)


# ---------------------------------------------------------------- search (T12)

def _fake_device(calls: list):
    """Measured time: the block-aware model with a deterministic per-tile perturbation."""
    params = ModelParams.of(Target.get("a100"))

    def measure(cands):
        calls.append(list(cands))
        return [estimate(T1, c, params, convention="block").seconds
                * (1 + 0.04 * (sum(astuple(c.tile)) // 16 % 5)) for c in cands]
    return measure


def test_t12_search_rounds_measure_eight_and_converge():
    calls: list = []
    smem = Target.get("a100").smem_per_block
    r = search(T1, _fake_device(calls), A100_PAPER, smem, convention="literal", population=64, seed=3)
    assert r.converged and 2 <= len(r.rounds) < 20
    assert all(len(rd.top) == 8 for rd in r.rounds)
    flat_calls = [c for call in calls for c in call]
    assert len(flat_calls) == len(set(flat_calls)) == sum(rd.new for rd in r.rounds)   # never twice
    best_of = [min(t for _, t in rd.top) for rd in r.rounds]
    assert r.seconds == min(best_of)
    assert abs(best_of[-1] - min(best_of[:-1])) / min(best_of[:-1]) < 0.01
    space = set(pruned_space(T1, smem, convention="literal"))
    assert all(c in space for rd in r.rounds for c, _ in rd.top) and r.best in space
    again = search(T1, _fake_device([]), A100_PAPER, smem, convention="literal", population=64, seed=3)
    assert again == r                                                   # deterministic given the seed


def test_search_stops_at_the_round_limit():
    r = search(G1, _fake_device([]), A100_PAPER, Target.get("a100").smem_per_block, convention="block",
               population=16, eps=0.0, max_rounds=3)
    assert not r.converged and len(r.rounds) == 3


def test_t12_mutation_changes_exactly_one_loop():
    smem = Target.get("a100").smem_per_block
    sizes = {x: tile_sizes(getattr(T1, x)) for x in "mnkh"}
    rng = random.Random(0)

    def ok(t: ChainTile) -> bool:
        return fits_smem(t, 2, smem)

    for c in pruned_space(T1, smem, convention="block")[::37]:
        child = mutate(c, sizes, ok, rng)
        changed = [x for x in "mnkh" if child.tile.size(x) != c.tile.size(x)]
        assert len(changed) == 1 and child.tiling == c.tiling and ok(child.tile)
        assert child.tile.size(changed[0]) in sizes[changed[0]]


# ---------------------------------------------------------------- the Triton space

def test_chain_tiles_powers_of_two_within_rules_3_and_4():
    h100 = Target.get("h100")
    for shape in (BERT, G1, T1, ChainShape(4, 1100, 300, 80, 80, 2)):
        tiles = chain_tiles(shape, h100)
        assert tiles
        for t in tiles:
            for x in "mnkh":
                d, b = getattr(shape, x), t.size(x)
                assert 16 <= b <= 256 and b & (b - 1) == 0
                whole = b >= d
                if x in "kh":     # Rule 3 there; M and N take every power of two (padding is costed)
                    assert whole or (d & (d - 1) == 0 and d % b == 0) or (-(-d // b) * b - d) / d < 0.05
                assert b <= max(16, 1 << (d - 1).bit_length())              # not beyond the padded extent
            assert smem_bytes(t, shape.itemsize) <= 1.2 * h100.smem_per_block
    odd = chain_tiles(ChainShape(4, 1100, 300, 80, 80, 2), h100)
    assert {t.bm for t in odd} == {16, 32, 64, 128, 256} and {t.bn for t in odd} >= {16, 32, 64, 128}
    assert {t.bk for t in odd} == {t.bh for t in odd} == {16, 128}        # 80: 16 divides it, or whole
    assert len(chain_tiles(T1, h100, max_smem=64 * 1024)) < len(chain_tiles(T1, h100))


def test_bert_attention_has_k_and_h_whole():
    tiles = chain_tiles(BERT, Target.get("h100"))
    assert {t.bm for t in tiles} == {t.bn for t in tiles} == {16, 32, 64, 128}
    assert {t.bk for t in tiles} == {t.bh for t in tiles} == {16, 32, 64}
    whole = ChainTile(128, 128, 64, 64)
    assert whole in tiles
    b, m, n, k, h = 12, 128, 128, 64, 64
    assert chain_traffic(BERT, whole) == {"LA": b * m * k, "LB": b * k * n, "LD": b * n * h, "SE": b * m * h}
    assert sum(chain_traffic(BERT, whole).values()) == b * (m * k * 1 * 1 + k * n * 1 * 1 + n * h * 1 + m * h)
    # two m and n tiles, k whole: A once per (m, h) block, not once per n tile as the closed form has it
    assert chain_traffic(BERT, ChainTile(64, 64, 64, 64)) == {
        "LA": b * m * k, "LB": b * k * n * 2, "LD": b * n * h * 2, "SE": b * m * h}


def _closed_form(s: ChainShape, t: ChainTile) -> dict[str, int]:
    """Notes §3.4: s·(M·K·h·n + K·N·m·h + N·H·m + M·H), per statement, in elements, times the batch."""
    e = extents(s, t)
    return {"LA": s.batch * s.m * s.k * e["h"] * e["n"], "LB": s.batch * s.k * s.n * e["m"] * e["h"],
            "LD": s.batch * s.n * s.h * e["m"], "SE": s.batch * s.m * s.h}


def test_chain_traffic_closed_form_and_dead_loops():
    s = ChainShape(batch=2, m=256, n=512, k=128, h=256, itemsize=2)
    tile = ChainTile(64, 64, 32, 64)
    assert all(v > 1 for v in extents(s, tile).values())
    assert chain_traffic(s, tile) == chain_traffic(s, tile, "literal") == _closed_form(s, tile)
    # h whole (extent 1): the closed form with h = 1
    h_whole = ChainTile(64, 64, 32, 256)
    assert extents(s, h_whole)["h"] == 1 and chain_traffic(s, h_whole) == _closed_form(s, h_whole)
    # k whole (extent 1): A hoisted out of the n loop, loaded once per (m, h) block
    k_whole = ChainTile(64, 64, 128, 64)
    got = chain_traffic(s, k_whole)
    assert got == _closed_form(s, k_whole) | {"LA": 2 * 256 * 128 * 4}
    assert got["LA"] * 8 == _closed_form(s, k_whole)["LA"]                # saved a factor n = 8
    assert chain_traffic(s, k_whole, "literal")["LA"] == 2 * 256 * 128   # the paper also drops h
    # ragged tiles: masked loads move only in-bounds elements
    r = ChainShape(batch=1, m=100, n=200, k=40, h=40, itemsize=2)
    assert chain_traffic(r, ChainTile(64, 64, 64, 64)) == {"LA": 100 * 40, "LB": 40 * 200 * 2, "LD": 200 * 40 * 2,
                                                           "SE": 100 * 40}


def test_chain_flops_padded_and_recomputed_per_h_tile():
    s = ChainShape(batch=2, m=256, n=512, k=128, h=256, itemsize=2)
    t = ChainTile(64, 64, 32, 64)
    b, m, n, k, h, ht = 2, 256, 512, 128, 256, 4
    assert chain_flops(s, t) == 2 * b * m * n * k * ht + 2 * b * m * n * h
    assert chain_flops(s, ChainTile(64, 64, 32, 256)) == 2 * b * m * n * k + 2 * b * m * n * h
    r = ChainShape(batch=1, m=100, n=200, k=40, h=40, itemsize=2)            # padded to 128 × 256 × 64 × 64
    assert chain_flops(r, ChainTile(64, 64, 64, 64)) == 2 * 128 * 256 * 64 + 2 * 128 * 256 * 64
    for tile in itertools.islice(chain_tiles(BERT, Target.get("h100")), 0, None, 17):
        e = extents(BERT, tile)
        pm, pn, pk, ph = (tile.size(x) * e[x] for x in "mnkh")
        assert chain_flops(BERT, tile) == 2 * 12 * pm * pn * (pk * e["h"] + ph)
