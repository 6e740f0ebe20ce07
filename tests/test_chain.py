"""The chain family (MCFuser): attention and GEMM → elementwise → GEMM chains in one kernel, the
intermediate on chip, under the interpreter against the reference executor and eager torch.

Forced tiles cover ragged shapes (rows and keys that do not divide the tile, several key chunks,
the value head dim split across programs, the first product's K looped); the planner tests check
that h100 plans choose the chain kernel for attention.
"""
import math
import re

import pytest
import torch
import torch.nn.functional as F

import tilefuse

from tilefuse.families.chain import ChainTile, chain_body

from gemm_eval import _cache, _seed, HALF_TOL, compile_h100, forced, gemm_kernels, run_cpu, whole  # noqa: F401

TOL = dict(rtol=1e-5, atol=1e-5)



def tile(bm=16, bn=16, bk=16, bh=16, warps=4, stages=2):
    return ChainTile(bm, bn, bk, bh, warps, stages)


def qkv(b=2, h=3, lq=20, lk=24, e=16, ev=None, dtype=torch.float32, hk=None):
    ev = ev or e
    hk = hk or h
    return (torch.randn(b, h, lq, e).to(dtype), torch.randn(b, hk, lk, e).to(dtype),
            torch.randn(b, hk, lk, ev).to(dtype))


def sdpa(**kw):
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw)


# ---------------------------------------------------------------- attention

@pytest.mark.parametrize("t", [tile(), tile(32, 16, 16, 16), tile(16, 32, 16, 8), tile(16, 16, 8, 16)],
                         ids=["ragged", "taller", "h-split", "k-looped"])
def test_attention_without_mask(t):
    """20 queries, 24 keys (ragged in tiles of 16 and 32), two key chunks: the online softmax's
    rescaling across chunks; H split across programs; K looped inside the key loop."""
    built, body = forced(sdpa(), t, *qkv(), tol=TOL, family="chain")
    assert body.softmax is not None and "tl.dot" in built.source


def test_a_warp_specialized_attention_reads_flat_descriptors_and_matches_eager():
    """``ChainTile.ws``: the key loop split between a producer warp group and two consumers
    (``tl.range(..., warp_specialize=True)``), each [batch, heads, keys, d] operand read through a
    2-D descriptor over its flattened rows (Triton's pass fails on a reshaped 4-D box), the rows
    of one head and the next never in one tile (256 keys, BN 64); fp16 against eager, by the
    interpreter; causal, one loop to the diagonal masking every chunk (Triton's pass fails on
    FlashAttention's two).  8 warps (left unspecialized by the pass) and ragged keys (200: not
    flattened) are clear errors."""
    t = ChainTile(128, 64, 32, 32, 4, 3, tma=True, ws=True)
    q, k, v = qkv(1, 2, 256, 256, 32, dtype=torch.float16)
    built, _ = forced(sdpa(), t, q, k, v, tol=HALF_TOL[torch.float16], family="chain")
    src = built.source
    assert "tl.range(0, 256, BLOCK_N, warp_specialize=True)" in src
    assert src.count("tl.make_tensor_descriptor(") == 3 and src.count(", [512, 32], [32, 1], [") == 3
    assert built.kernels[0].launched_warps == 12
    with pytest.raises(ValueError, match="chain\\w*: a warp-specialized key loop needs tensor descriptors, 4 warps"):
        forced(sdpa(), ChainTile(128, 64, 32, 32, 8, 3, tma=True, ws=True), q, k, v, tol=HALF_TOL[torch.float16],
               family="chain")
    with pytest.raises(ValueError, match="a warp-specialized loop reads its operands through tensor descriptors"):
        forced(sdpa(), t, *qkv(1, 2, 256, 200, 32, dtype=torch.float16), tol=HALF_TOL[torch.float16], family="chain")
    built, _ = forced(sdpa(is_causal=True), t, q, k, v, tol=HALF_TOL[torch.float16], family="chain")
    assert built.source.count("for n_start in ") == 1 and \
        "for n_start in tl.range(0, tl.minimum(256, (tl.program_id(0) + 1) * BLOCK_M + 0), BLOCK_N, " \
        "warp_specialize=True):" in built.source


def _attention_with_sinks(q, k, v, sinks):
    """GPT-OSS/Flint attention: a learned logit per head joins the softmax, then is sliced off."""
    w = q @ k.transpose(2, 3) * 0.25
    w = torch.cat([w, sinks.reshape(1, -1, 1, 1).expand(*w.shape[:-1], 1)], dim=-1)
    return F.softmax(w, dim=-1)[..., :-1] @ v


def test_a_softmax_over_more_columns_than_the_keys_is_not_a_chain():
    # the sink column was dropped: the chain kernel's online softmax ran over the 24 keys of the
    # second product while the softmax's max and sum range over 25 (found by the sweep: flint)
    q, k, v = qkv()
    sinks = torch.randn(3)
    pg = compile_h100(_attention_with_sinks, q, k, v, sinks).primgraph
    assert chain_body(whole(pg)) is None
    want = _attention_with_sinks(q, k, v, sinks)
    for target in ("cpu", "h100"):
        cm = tilefuse.compile(_attention_with_sinks, (q, k, v, sinks), target=target)
        got = cm(q, k, v, sinks) if target == "cpu" else cm.emulate(q, k, v, sinks)
        torch.testing.assert_close(got, want, **TOL)


def test_attention_additive_mask_and_alibi_bias():
    """A float mask is added to the scaled scores; an ALiBi bias (slope per head times the key's
    distance) computed in the graph from an input is too."""
    q, k, v = qkv()
    mask = torch.randn(20, 24)
    forced(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), tile(), q, k, v, mask,
           tol=TOL, family="chain")

    def alibi(q, k, v, slopes):
        dist = torch.arange(24)[None, :] - torch.arange(20)[:, None]
        bias = slopes[:, None, None] * dist.to(q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    forced(alibi, tile(), q, k, v, torch.rand(3), tol=TOL, family="chain")


def test_attention_boolean_mask_with_fully_masked_rows():
    """A boolean mask (keep where True) in which some query rows see no key: those rows are zero
    (the reference's guard), never NaN, through the online softmax."""
    q, k, v = qkv()
    keep = torch.rand(2, 1, 20, 24) > 0.4
    keep[:, :, 3] = False               # row 3 sees nothing
    keep[1, :, 17] = False
    keep[:, :, 5, :16] = False          # row 5's first key chunk is all masked
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m)  # noqa: E731
    want = fn(q, k, v, keep)
    assert not torch.isnan(want).any() and torch.count_nonzero(want[:, :, 3]) == 0
    forced(fn, tile(), q, k, v, keep, tol=TOL, family="chain")     # NaN would not compare equal to 0


def _finfo_min_masked(additive: bool):
    """transformers' masks: the type's most negative finite value filled in (DeBERTa's
    ``masked_fill(~mask, finfo.min)``) or added to the scores (a 4-D float mask), softmax in the
    scores' type."""
    def fn(q, k, v, keep):
        s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        low = torch.finfo(s.dtype).min
        s = s + torch.where(keep, 0.0, low).to(s.dtype) if additive else s.masked_fill(~keep, low)
        return torch.softmax(s, -1) @ v
    return fn


@pytest.mark.parametrize("additive", [False, True], ids=["filled", "added"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_mask_of_the_types_most_negative_value_with_fully_masked_rows(dtype, additive):
    """Rows that see no key under a finite fill are uniform over the keys in eager (every score
    equal), not NaN: log2(e) times fp32's or bf16's most negative value overflows to -inf, and
    -inf - -inf is NaN; the kernel takes the difference first there (found by the sweep:
    DeBERTa's padded row). Scores the product times constants keep the folded scale."""
    q, k, v = (x.to(dtype) for x in qkv())
    keep = torch.rand(2, 1, 20, 24) > 0.4
    keep[:, :, 3] = False               # row 3 sees nothing
    keep[:, :, 5, :16] = False          # row 5's first key chunk is all masked
    fn = _finfo_min_masked(additive)
    want = fn(q, k, v, keep)
    assert not torch.isnan(want).any() and torch.count_nonzero(want[:, :, 3]) > 0
    built, _ = forced(fn, tile(), q, k, v, keep, tol=TOL if dtype is torch.float32 else HALF_TOL[dtype],
                      family="chain")
    folded_scale = repr(0.25 * 1.4426950408889634)       # 1/sqrt(16)·log2(e): one multiply-add a score
    assert "tl.exp2(" in built.source and folded_scale not in built.source
    if dtype is torch.float32 and not additive:     # (once) scores times a constant keep the fold
        folded, _ = forced(sdpa(), tile(), *qkv(), tol=TOL, family="chain")
        assert folded_scale in folded.source


@pytest.mark.parametrize("kw,shapes", [({"is_causal": True}, dict(lq=40, lk=40)), ({}, dict(lq=20, lk=24)),
                                       ({"enable_gqa": True}, dict(h=6, hk=2))], ids=["causal", "plain", "gqa"])
def test_attention_operands_through_tensor_descriptors(kw, shapes):
    """On sm_90 plans the chain reads Q, K and V through tensor descriptors (K's [keys, dim]
    blocks transposed on chip; a GQA head's K/V at its group's position): the same values as
    eager (the interpreter's descriptors), the causal split's two loops both through them."""
    q, k, v = qkv(**shapes)
    built, _ = forced(sdpa(**kw), ChainTile(16, 16, 16, 16, 4, 2, True), q, k, v, tol=TOL, family="chain")
    assert built.source.count("tl.make_tensor_descriptor(") == 3
    assert built.source.count(".load([") == (6 if kw.get("is_causal") else 3)


@pytest.mark.parametrize("lq,lk", [(40, 40), (20, 40), (40, 24)])
def test_causal_attention_from_the_index_predicate(lq, lk):
    """is_causal: the mask is an index predicate (query l sees keys s <= l); no mask tensor is
    read, and each row tile's key loop stops after its last row (rows past the keys, or keys
    past the rows, in the ragged cases).  The loop is split as FlashAttention's: the chunks
    before the tile's first row run without the predicate, the diagonal ones after with it;
    and the softmax's exponentials are base 2 with log2(e) folded into the scale."""
    q, k, v = qkv(lq=lq, lk=lk)
    built, body = forced(sdpa(is_causal=True), tile(), q, k, v, tol=TOL, family="chain")
    assert len(body.inputs) == 3 and body.causal == 0
    src = built.source
    assert f"n_split = tl.maximum(tl.minimum({lk}, tl.program_id(0) * BLOCK_M + 1) // BLOCK_N * BLOCK_N, 0)" in src
    unmasked, diagonal = src.split("for n_start in range(")[1:]
    assert unmasked.startswith("0, n_split, BLOCK_N)") and "ns <= ms" not in unmasked
    assert diagonal.startswith(f"n_split, tl.minimum({lk}, (tl.program_id(0) + 1) * BLOCK_M + 0), BLOCK_N)")
    assert "ns <= ms" in diagonal
    assert "tl.exp(" not in src and f"{0.25 * 1.4426950408889634!r}" in src     # scale 1/sqrt(16)


def test_the_causal_split_is_costed_as_the_loop_it_replaces_and_checked():
    """The two loops of the split walk, between them, the chunks the one bounded loop walked: the
    same modelled product flops, key/value bytes and tensor-core steps (the unmasked chunks skip
    the mask's compares: fewer CUDA-core flops), more registers (the second loop's own pipeline, as the
    sm_90 binaries show); a loop that resumes without the split before it is refused."""
    import dataclasses
    from tilefuse.codegen.kernel import Loop, check
    from tilefuse.cost.work import work
    from gemm_eval import H100
    q, k, v = qkv(b=1, h=2, lq=256, lk=256, e=64, dtype=torch.float16)
    b = chain_body(whole(compile_h100(sdpa(is_causal=True), q, k, v).primgraph))
    from tilefuse.families.chain.template import chain_kernel
    kernel = chain_kernel(b, tile(64, 64, 64, 64), "c")
    loops = [st for st in kernel.body if isinstance(st, Loop)]
    assert [(lp.until, lp.stop, lp.resume) for lp in loops] == [(("m", 0), None, False), (None, ("m", 0), True)]
    rest = tuple(st for st in kernel.body if not isinstance(st, Loop))
    one = dataclasses.replace(kernel, body=(dataclasses.replace(loops[1], resume=False),) + rest)
    split, single = work(kernel, H100), work(one, H100)
    assert split.dram_bytes == pytest.approx(single.dram_bytes) and split.l2_bytes == pytest.approx(single.l2_bytes)
    assert split.chunks == single.chunks and split.flops < single.flops
    # each chunk, in either loop, runs the two products once (the split was charged each loop's
    # products over both loops' chunks: twice the tensor-core steps)
    assert split.dot_steps == single.dot_steps == 2 * single.chunks
    assert split.res.regs_per_thread > single.res.regs_per_thread
    assert split.res.smem_bytes == single.res.smem_bytes
    with pytest.raises(ValueError, match="resumes"):
        check(dataclasses.replace(kernel, body=(loops[1],) + rest))


def test_causal_attention_is_modelled_at_about_half_the_work():
    """The key loops of a causal plan walk half the keys on average: about half the flops and
    key/value traffic of the same attention without the mask."""
    from tilefuse.families.chain import _schedule
    from gemm_eval import H100
    q, k, v = qkv(b=1, h=8, lq=1024, lk=1024, e=64, dtype=torch.float16)
    works = []
    for causal in (False, True):
        cm = compile_h100(sdpa(is_causal=causal), q, k, v)
        b = chain_body(whole(cm.primgraph))
        works.append(_schedule(b, tile(64, 64, 64, 64), H100).work)
    full, half = works
    assert 0.45 < half.flops / full.flops < 0.6 and half.l2_bytes < 0.75 * full.l2_bytes


def test_grouped_query_attention_reads_shared_kv_heads():
    """GQA: 6 query heads over 2 kv heads; each program reads its kv head through the index map."""
    q, k, v = qkv(h=6, hk=2)
    built, body = forced(sdpa(enable_gqa=True), tile(), q, k, v, tol=TOL, family="chain")
    assert body.group.types[body.inputs[1]].shape[1] == 2


# ---------------------------------------------------------------- flash-decoding (keys split)

def split_tile(split, bm=16, bn=16, bk=16, bh=16, in_launch=False):
    return ChainTile(bm, bn, bk, bh, 4, 2, split=split, in_launch=in_launch)


@pytest.mark.parametrize("split,in_launch", [(2, False), (4, False), (4, True)], ids=["2", "4", "4-one-launch"])
def test_decode_attention_with_the_keys_split_matches_eager(split, in_launch):
    """Flash-decoding: one query row per head over 64 cached keys, the keys split 2 or 4 ways
    (several chunks per split), a boolean mask of a static cache that hides whole splits (their
    running max stays -inf: weight 0 in the combine) and, in one batch row, all but one key; GQA
    (6 query heads over 2 kv heads), 16-bit: the partials and the combine against eager, as two
    kernels or in one launch (the last split of a tile to finish combines, an online softmax over
    the splits; its counters left at zero for the next launch)."""
    q, k, v = qkv(b=2, h=6, hk=2, lq=1, lk=64, e=16, dtype=torch.float16)
    keep = torch.zeros(2, 1, 1, 64, dtype=torch.bool)
    keep[0, ..., :21] = True            # a prompt of 21 tokens in the cache
    keep[1, ..., 40] = True             # one key, in the third quarter
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)  # noqa: E731
    built, body = forced(fn, split_tile(split, in_launch=in_launch), q, k, v, keep, tol=HALF_TOL[torch.float16],
                         family="chain")
    assert body.causal is None and built.scratch[0].type.shape == (split, 2, 6, 1, 16)
    if not in_launch:
        assert [kn.name for kn in built.kernels] == ["chain_test_partials", "chain_test"] and len(built.scratch) == 3
        return
    (kernel,) = built.kernels
    assert [s.zeroed for s in built.scratch] == [False, False, False, True]
    assert built.scratch[3].type.shape == (2 * 6,)          # a counter per (row tile, batch position)
    assert "tl.atomic_add(" in built.source and "sem=\"acq_rel\"" in built.source


def test_an_in_launch_combine_walking_the_splits_reads_them_without_a_pipeline(monkeypatch):
    """The in-launch combine walked one share at a time (not unrolled) reads what this launch's
    other programs stored, through L2 after the counter's acquire: a plain ``range`` (a loop of no
    ``tl.dot`` is otherwise a ``tl.range`` at the kernel's stages, which would copy the shares
    ahead, ``emit._streams``); against eager."""
    from tilefuse.families.chain import template
    monkeypatch.setattr(template, "UNROLLED_VALUES", 0)
    q, k, v = qkv(b=1, h=2, lq=1, lk=64, e=16, dtype=torch.float16)
    built, _ = forced(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), split_tile(4, in_launch=True),
                      q, k, v, tol=HALF_TOL[torch.float16], family="chain")
    assert re.search(r"for r_start in range\(0, 4, RBLOCK\):", built.source), built.source
    assert "tl.range(" not in built.source


@pytest.mark.parametrize("split", [1, 4])
def test_grouped_query_heads_packed_into_rows(split):
    """GQA packing: 6 query heads over 2 kv heads become 2 batch positions of 3 rows each (the
    head split into kv head x group, the group joining the rows): the key and value operands no
    longer depend on the group, and the kernel (and, split, the partials and the combine) equals
    eager, a boolean cache mask included."""
    from tilefuse.families.chain import grouped
    q, k, v = qkv(b=2, h=6, hk=2, lq=1, lk=64, e=16, dtype=torch.float16)
    keep = torch.zeros(2, 1, 1, 64, dtype=torch.bool)
    keep[0, ..., :33] = True
    keep[1, ..., 5:9] = True
    fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)  # noqa: E731
    built, body = forced(fn, split_tile(split), q, k, v, keep, tol=HALF_TOL[torch.float16], family="chain",
                         form=grouped)
    (g,) = set(body.mvars) - {v for v in body.mvars if body.ext[v] == 1}
    assert body.ext[g] == 3 and body.extent(body.bvars) == 2 * 2
    from tilefuse.ir.expr import free_vars
    assert g not in free_vars(body.b) | free_vars(body.d)


def test_grouping_needs_heads_read_through_a_floor_division():
    """Plain multi-head attention (each query head its own kv head) is not grouped, nor is a
    causal loop (its bound needs one row variable)."""
    from tilefuse.families.chain import grouped
    plain = chain_body(whole(compile_h100(sdpa(), *qkv(h=4, lq=1, lk=32)).primgraph))
    assert grouped(plain) is None
    causal = chain_body(whole(compile_h100(sdpa(is_causal=True, enable_gqa=True),
                                           *qkv(h=4, hk=2, lq=32, lk=32)).primgraph))
    assert causal.causal == 0 and grouped(causal) is None


@pytest.mark.parametrize("in_launch", [False, True], ids=["two-kernels", "one-launch"])
def test_split_keys_with_an_additive_mask_and_several_query_rows(in_launch):
    """The split with several query rows (4, in a tile of 16), a float mask added to the scores,
    the value head dim (32) split across programs (a counter per row tile and column tile, in one
    launch), fp32: against eager."""
    q, k, v = qkv(b=1, h=3, lq=4, lk=96, e=16, ev=32)
    mask = torch.randn(4, 96)
    built, _ = forced(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                      split_tile(2, in_launch=in_launch), q, k, v, mask, tol=TOL, family="chain")
    assert len(built.kernels) == (1 if in_launch else 2)
    if in_launch:
        assert built.scratch[-1].zeroed and built.scratch[-1].type.shape == (3 * 2,)   # heads x H tiles


def test_the_split_is_offered_only_where_the_grid_leaves_sms_idle_and_is_costed_as_its_kernels():
    """Splits are in the space for a decode-shaped attention (8 programs on 132 SMs), not for a
    prefill one whose grid fills the SMs (160 heads), nor for a causal loop (bounded per row tile); a split
    schedule's work is its two kernels' (``then``: the combine), or, the combine in the launch, one
    kernel's with a tail phase (the last split of each tile)."""
    from gemm_eval import H100
    from tilefuse.families.chain import ranked_tiles
    from tilefuse.families.chain.template import chain_kernels
    from tilefuse.cost.work import work
    decode = chain_body(whole(compile_h100(sdpa(), *qkv(b=1, h=8, lq=1, lk=1024, e=64, dtype=torch.float16)).primgraph))
    splits = {t.split for t in ranked_tiles(decode, H100)}
    assert {1, 2, 4, 8, 16} <= splits
    prefill = chain_body(whole(compile_h100(sdpa(), *qkv(b=2, h=80, lq=256, lk=256, e=64,
                                                          dtype=torch.float16)).primgraph))
    assert {t.split for t in ranked_tiles(prefill, H100)} == {1}
    causal = chain_body(whole(compile_h100(sdpa(is_causal=True), *qkv(b=1, h=2, lq=64, lk=1024, e=64)).primgraph))
    assert {t.split for t in ranked_tiles(causal, H100)} == {1}
    # a GEMM chain of few row tiles (512 rows, as MCFuser's G4) may split its intermediate
    # columns too, without a softmax
    g4 = chain_body(whole(compile_h100(lambda a, b, d: torch.relu(a @ b) @ d, torch.randn(512, 64).half(),
                                       torch.randn(64, 256).half(), torch.randn(256, 64).half()).primgraph))
    tiles = ranked_tiles(g4, H100)
    assert g4.softmax is None and {t.split for t in tiles} == {1, 2, 4}
    assert all(t.bh >= 64 for t in tiles if t.split > 1)        # (H split too would recompute)
    with pytest.raises(ValueError, match="keys split only evenly, and only where the key loop has no bounds"):
        chain_kernels(causal, ChainTile(16, 64, 64, 64, 4, 1, split=2), "k")
    from tilefuse.families.chain import _schedule
    for one in (False, True):       # the combine a second kernel, or in the launch (a tail phase)
        t = next(t for t in ranked_tiles(decode, H100) if t.split == 8 and t.in_launch == one)
        s = _schedule(decode, t, H100)
        assert [s.work, *s.then] == [work(kn, H100) for kn in chain_kernels(decode, t, "k")]
        assert s.work.programs == 8 * 8 and len(s.then) == (0 if one else 1)
        assert (s.work.tail is not None) == one


@pytest.mark.parametrize("e", [24, 40, 80])
def test_odd_head_dims(e):
    """Head dims that are not powers of two: the head dim is padded to the next power of two in
    the tile and masked."""
    forced(sdpa(), tile(16, 16, 128 if e > 64 else 64, 128 if e > 64 else 64), *qkv(e=e), tol=TOL, family="chain")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_attention_accumulates_in_fp32(dtype):
    """16-bit Q, K, V: the scores' product runs on 16-bit operands (exact) accumulating in fp32,
    the probabilities are rounded to the values' type for the second product (FlashAttention)."""
    built, body = forced(sdpa(), tile(), *qkv(dtype=dtype), tol=HALF_TOL[dtype], family="chain")
    assert body.in1 is body.in2 and body.in1.value == str(dtype).split(".")[1]


@pytest.mark.xfail(strict=True, reason="the probabilities are rounded to fp16 for the second product (FlashAttention's "
                   "choice): a weight of 6e-9 becomes 0 and 0 x inf = NaN where eager's fp32 softmax gives -inf; keeping "
                   "tiny weights nonzero costs the softmax's hot loop two operations a score (the kernel fuzzer, seed 99)")
def test_fp16_attention_over_infinite_values_keeps_their_infinity():
    q = torch.tensor([[[[-3.4629]]]], dtype=torch.float16)
    k = torch.tensor([-2.3809, 0.6191, 3.0723, -0.2488, -1.707, -0.1227, -0.1874], dtype=torch.float16).view(1, 1, 7, 1)
    v = torch.randn(1, 1, 7, 5, dtype=torch.float16)
    v[0, 0, 2, 0], v[0, 0, 2, 4] = -math.inf, math.inf     # (key 2's weight: exp(-18.9), 6e-9)
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v)  # noqa: E731
    want = fn(q, k, v)
    assert want[0, 0, 0, 0] == -math.inf and want[0, 0, 0, 4] == math.inf     # (the expectation)
    cm = tilefuse.compile(fn, (q, k, v), target="cpu")
    assert [b.family for b in cm.kernels] == ["chain"]
    torch.testing.assert_close(cm(q, k, v), want, **HALF_TOL[torch.float16])


def test_attention_with_head_transposes_in_prologue_and_epilogue():
    """BERT's shape: Q, K, V are reshaped and transposed into heads on the way in (operand loads),
    the output is transposed and reshaped back on the way out (a store order)."""
    def fn(x, wq, wk, wv):
        b, s, _ = x.shape
        heads = lambda t: t.view(b, s, 2, 8).transpose(1, 2)  # noqa: E731
        q, k, v = heads(x @ wq), heads(x @ wk), heads(x @ wv)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, 16)
    args = torch.randn(1, 20, 16), torch.randn(16, 16), torch.randn(16, 16), torch.randn(16, 16)
    cm = compile_h100(fn, *args)
    fams = [k.family for k in cm.report.kernels]
    assert "chain" in fams
    torch.testing.assert_close(run_cpu(cm, *args)[0], fn(*args), **TOL)


# ---------------------------------------------------------------- GEMM chains

@pytest.mark.parametrize("act", [torch.relu, F.gelu], ids=["relu", "gelu"])
@pytest.mark.parametrize("t", [tile(16, 16, 16, 16), tile(32, 16, 16, 8)], ids=["whole-k", "h-split"])
def test_gemm_activation_gemm_chain_with_tails(act, t):
    """(A @ B) -> activation -> @ D with M, N, K, H not multiples of the tiles (MCFuser's G
    benchmarks, shrunk)."""
    fn = lambda a, b, d: act(a @ b) @ d  # noqa: E731
    built, body = forced(fn, t, torch.randn(20, 12), torch.randn(12, 40), torch.randn(40, 10),
                         tol=TOL, family="chain")
    assert body.softmax is None


@pytest.mark.parametrize("split,bh,in_launch", [(2, 16, False), (4, 8, False), (4, 16, True)],
                         ids=["split2", "split4-h-split", "split4-one-launch"])
def test_gemm_chain_with_the_keys_split_matches_eager(split, bh, in_launch):
    """A GEMM chain's intermediate columns (its "keys") split across programs: each split's share
    of the second product's sum in an fp32 workspace (one, no running max or sum), the combine
    summing them and running the epilogue (a bias and a cast to fp16) — fp16, batched, a ragged M,
    a bias on the intermediate columns (indexed by the split's keys: an FFN's first bias), H whole
    or split across programs; the combine's workspace is the only scratch (with the combine in the
    launch, beside the tiles' counters)."""
    fn = lambda a, b, d, c, e: (torch.relu(a @ b + e) @ d + c).half()  # noqa: E731
    args = (torch.randn(2, 20, 32).half(), torch.randn(2, 32, 64).half(), torch.randn(2, 64, 16).half(),
            torch.randn(16).half(), torch.randn(64).half())
    built, body = forced(fn, split_tile(split, bh=bh, in_launch=in_launch), *args, tol=HALF_TOL[torch.float16],
                         family="chain")
    assert body.softmax is None
    if in_launch:
        assert [kn.name for kn in built.kernels] == ["chain_test"]
        assert [s.type.shape for s in built.scratch] == [(split, 2, 20, 16), (2 * 2,)]
        return
    assert [kn.name for kn in built.kernels] == ["chain_test_partials", "chain_test"]
    assert [s.type.shape for s in built.scratch] == [(split, 2, 20, 16)]
    assert f"(in5: {split} splits' accumulators)" in built.source and "maxima" not in built.source


def test_batched_gemm_chain_in_half_precision():
    fn = lambda a, b, d: torch.relu(a @ b) @ d  # noqa: E731
    args = (torch.randn(3, 20, 32).half(), torch.randn(3, 32, 24).half(), torch.randn(3, 24, 16).half())
    forced(fn, tile(), *args, tol=HALF_TOL[torch.float16], family="chain")


# ---------------------------------------------------------------- what is not a chain

def test_a_reduction_other_than_the_softmax_rejects_the_chain():
    """LayerNorm between two GEMMs is no softmax: no chain kernel (it would need whole rows)."""
    ln = torch.nn.LayerNorm(24).eval()
    cm = compile_h100(lambda a, b, d: ln(a @ b) @ d, torch.randn(8, 12), torch.randn(12, 24), torch.randn(24, 8))
    assert chain_body(whole(cm.primgraph)) is None


def test_scores_written_out_reject_the_chain():
    """When the probabilities are an output too, they cannot stay on chip."""
    def fn(q, k, v):
        p = torch.softmax(q @ k.transpose(-1, -2), -1)
        return p @ v, p
    cm = compile_h100(fn, *qkv())
    assert chain_body(whole(cm.primgraph)) is None


def test_planner_fuses_attention_into_one_chain_kernel():
    """Planned for h100, scaled dot-product attention (8 heads of 64 over 256 positions, fp16) is
    one chain kernel; it runs right under the interpreter."""
    q, k, v = qkv(b=1, h=2, lq=64, lk=64, e=64, dtype=torch.float16)
    cm = compile_h100(sdpa(), q, k, v)
    assert [k_.family for k_ in cm.kernels] == ["chain"]
    torch.testing.assert_close(run_cpu(cm, q, k, v)[0].float(), sdpa()(q, k, v).float(), **HALF_TOL[torch.float16])


def test_chain_kernel_source_keeps_the_query_tile_out_of_the_key_loop():
    """K whole: the query tile is loaded once, before the key loop (MCFuser's redundant-access
    elimination); the loop carries the running max, sum and accumulator."""
    built, _ = forced(sdpa(), tile(), *qkv(), tol=TOL, family="chain")
    src = built.source
    loop = src.index("for n_start")
    assert src.index("tl.load(in0") < loop
    assert src.count("tl.load(in0") == 1
    assert re.search(r"^\s+st\d+, st\d+, st\d+ = \w+, \w+, \w+$", src, re.M)


@pytest.mark.parametrize("x", [float("inf"), -2.5])
def test_a_chain_zeroes_the_scores_past_the_keys_before_the_second_product(x):
    # (x·xᵀ)·xᵀ of a broadcast scalar: the first product's padded key columns held inf (its B
    # operand, a broadcast, is not a masked load), and 0 · inf in the second product gave NaN
    # where eager gives inf (found by the ONNX fuzzer)
    def f(s):
        v = s.reshape(1, 1).expand(3, 3)
        return (v @ v.t()) @ v.t() - 0.5
    s = torch.tensor(x)
    for target in ("cpu", "h100"):
        cm = tilefuse.compile(f, (s,), target=target)
        got = cm(s) if target == "cpu" else cm.emulate(s)
        torch.testing.assert_close(got, f(s), **TOL)


def test_an_epilogue_member_reading_the_first_product_rejects_the_chain():
    """(x @ w) @ w + (x + 0.6 (x @ w)): the second term reads the first product at the output's
    coordinates, which a chain holds only as a tile of the scores; the chain is refused (it was a
    KeyError in the epilogue's inliner, found by the strategies' property test) and the plan
    matches eager."""
    def fn(x, w):
        t1 = x @ w
        return t1 @ w + (x + t1 * 0.6)
    x, w = torch.randn(16, 32), torch.randn(32, 32) / 6
    cm = compile_h100(fn, x, w)
    assert chain_body(whole(cm.primgraph)) is None
    torch.testing.assert_close(run_cpu(cm, x, w)[0], fn(x, w), rtol=1e-4, atol=1e-4)


def test_chain_tiles_read_through_tensor_descriptors_only_where_they_loop():
    """TMA on sm_90 only for tiles that stream keys or K through a loop: a loopless program loads
    one tile (no copy to overlap), and on the H200 the loopless 64-row TMA kernels of MCFuser's
    S4/S5 (Triton 3.6) returned NaN while the looping ones were right (bench/README.md)."""
    from tilefuse.cost.target import Target
    from tilefuse.families.chain.space import ChainShape, chain_tiles
    s4 = ChainShape(batch=12, m=256, n=256, k=64, h=64, itemsize=2)
    tiles = chain_tiles(s4, Target.get("h200"))
    loopless = [t for t in tiles if t.bn >= s4.n and t.bk >= s4.k]
    looping = [t for t in tiles if t.bn < s4.n or t.bk < s4.k]
    assert loopless and looping
    assert not any(t.tma for t in loopless) and all(t.tma for t in looping)
    assert not any(t.tma for t in chain_tiles(s4, Target.get("a100")))


def test_the_tiles_triton_miscompiles_on_sm90_are_left_out_and_their_neighbours_kept():
    """MEASURED on an H200 (Triton 3.6, bench/gpu_chain_tiles.py): S4's chain at BM 64, 4 warps
    (wgmma), K whole, H split, one stage gave wrong values (loopless and over a key loop); BH
    whole, BK 32, BM 16 and two stages over a key loop were right.  The sm_90 space leaves the
    first class out and keeps the others; sm_80 (no wgmma) keeps every tile."""
    from tilefuse.cost.target import Target
    from tilefuse.families.chain.space import ChainShape, chain_tiles
    s4 = ChainShape(batch=12, m=256, n=256, k=64, h=64, itemsize=2)
    keys = lambda tiles: {(t.bm, t.bn, t.bk, t.bh, t.warps, t.stages) for t in tiles}  # noqa: E731
    h200, a100 = keys(chain_tiles(s4, Target.get("h200"))), keys(chain_tiles(s4, Target.get("a100")))
    wrong = {(64, 256, 64, 32, 4, 1), (64, 128, 64, 32, 4, 1), (64, 256, 64, 32, 4, 2)}   # the last: same PTX as s1
    right = {(64, 256, 64, 64, 4, 1), (64, 256, 32, 32, 4, 2), (16, 256, 64, 32, 4, 1), (64, 128, 64, 32, 4, 2)}
    assert not wrong & h200 and right <= h200
    assert wrong | right <= a100
    # a loop through descriptors on sm_90 is pipelined: BK 32 (a K loop) at one stage was right
    # on the H200 too, but the space offers only two stages and more there (issue #22)
    assert (64, 256, 32, 32, 4, 1) in a100 and (64, 256, 32, 32, 4, 1) not in h200
    assert all(t.stages >= 2 for t in chain_tiles(s4, Target.get("h200")) if t.tma)
