"""A model input that a torch.compile'd graph updates in place (a static KV cache's
``index_copy_``): AOT autograd makes the graph return the cache's new value and copies it back into
the cache; tilefuse writes that value into the cache's own memory (``IndexPut``,
``frontend/aten/scatter.py``), so a decode step writes the new rows, not the whole cache, and
AOT's copy back is a copy of the cache onto itself (which torch skips).  A row write is a
generated kernel (``families/scatter.py``: a phase of a persistent kernel like any other), other
writes an in-place torch call.  Checked against eager: the outputs and the cache after every step."""
from __future__ import annotations

import pytest
import torch

import tilefuse


class _Step(torch.nn.Module):
    """One attention-like step over a cache of 64 positions: the new key written at ``pos`` (or,
    ``two_indices``, at ``pos`` of batch row 0: two index tensors), then read back with the rest."""

    def __init__(self, read_old: bool = False, two_indices: bool = False):
        super().__init__()
        self.register_buffer("cache", torch.randn(1, 2, 64, 8))
        self.proj = torch.nn.Linear(16, 16)
        self.read_old, self.two_indices = read_old, two_indices

    def forward(self, x, pos):
        old = self.cache.sum() if self.read_old else 0.0
        k = self.proj(x).view(1, 1, 2, 8).transpose(1, 2)
        if self.two_indices:
            self.cache[torch.zeros_like(pos), :, pos] = k[0].transpose(0, 1)
        else:
            self.cache.index_copy_(2, pos, k)
        return (self.cache * 2).sum(-1) + old


def _steps(read_old: bool = False, two_indices: bool = False, **options):
    torch.manual_seed(0)
    model, twin = _Step(read_old, two_indices).eval(), _Step(read_old, two_indices).eval()
    twin.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="tilefuse",
                             options={"interpreter": True, "time_limit": 1.0, **options})
    with torch.no_grad():
        for step in range(3):
            x, pos = torch.randn(1, 1, 16), torch.tensor([5 + 7 * step])
            torch.testing.assert_close(compiled(x, pos), twin(x, pos), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(model.cache, twin.cache, rtol=1e-6, atol=1e-6)
    return tilefuse.compiled_graphs()[-1]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_cache_row_is_written_in_the_caches_own_memory_by_a_generated_kernel():
    from tilefuse.codegen.triton.native import compile_native
    from tilefuse.cost.work import work
    cm = _steps()
    (put,) = [b for b in cm.kernels if b.inplace]
    assert put.family == "scatter" and put.language == "triton" and "tl.store" in put.source
    assert cm.program._aliases == {put.outputs[0]: put.inputs[0]}
    # the whole cache is neither transposed nor copied: one projection, the write, the reader
    assert len(cm.kernels) == 3, [b.name for b in cm.kernels]
    # costed from the kernel it prints, as the rows written, not the cache copied
    k = cm.kernels.index(put)
    schedule = cm.plan.kernels[k].schedule
    assert work(put.kernels[0], cm.target) == schedule.work
    # what the values are computed from (the projection's product and bias: the add and the
    # transpose are the write's), the index and the rows written; not the cache (4 KiB)
    assert cm.report.kernels[k].bytes <= 3 * 16 * 4 + 8, cm.report.kernels[k].bytes
    binary = compile_native(put.kernels[0], 90)
    assert not binary.spills and binary.stores, binary


def test_the_cache_write_is_a_phase_of_a_persistent_kernel():
    cm = _steps(persistent=True)
    (k,) = [k for k, b in enumerate(cm.kernels) if b.inplace]
    launched = [(i, end) for i, (_, end) in cm.program._persistent.items()]      # (first, past the last)
    assert any(i <= k < j for i, j in launched), (k, launched)


def test_a_write_through_two_index_tensors_is_an_in_place_torch_call():
    cm = _steps(two_indices=True, verify=True)       # every stage checked on random inputs too
    assert cm.report.verified[-1] == "kernels"
    (put,) = [b for b in cm.kernels if b.inplace]
    assert put.family == "opaque" and cm.program._aliases == {put.outputs[0]: put.inputs[0]}


def test_a_cache_also_read_before_the_write_is_updated_as_a_new_tensor():
    """Where something else reads the old cache, writing into it would change what that reads:
    the update is a scatter into a new tensor (still equal to eager)."""
    cm = _steps(read_old=True)
    assert not any(b.inplace for b in cm.kernels) and not cm.program._aliases


class _FakeGraph:
    """A CUDA graph's bookkeeping without a GPU: captured by running the program (as the warm-up
    and capture runs do), replayed by running it again on the captured inputs and writing the
    results into the captured outputs (a real replay writes them in place)."""

    def __init__(self, replay):
        self.replay_of = replay

    def replay(self):
        cap = next(c for c in self.replay_of.graphs.values() if c.graph is self)
        for static, out in zip(cap.static_out, self.replay_of.program.run(cap.static_in)):
            if static.data_ptr() != out.data_ptr():
                static.copy_(out)


def test_cuda_graph_replay_writes_a_donated_cache_in_place_and_captures_per_cache():
    """``runtime/cudagraph.py`` (its bookkeeping; the GPU's capture is not run here): the cache is
    not copied into a static buffer nor its output cloned; a call with another cache tensor gets
    a graph of its own, and the first cache is not written by it."""
    import contextlib

    from tilefuse.runtime.compiled import CompiledModel
    from tilefuse.runtime.cudagraph import GraphReplay
    torch.manual_seed(0)
    model = _Step().eval()
    compiled = torch.compile(model, backend="tilefuse", options={"interpreter": True, "time_limit": 1.0})
    seen = []
    real = CompiledModel._execute
    CompiledModel._execute = lambda self, feeds: seen.append(dict(feeds)) or real(self, feeds)
    try:
        with torch.no_grad():
            compiled(torch.randn(1, 1, 16), torch.tensor([3]))
    finally:
        CompiledModel._execute = real
    cm = tilefuse.compiled_graphs()[-1]
    (cache,) = set(cm.program._aliases.values())
    feeds = seen[-1]
    assert feeds[cache].data_ptr() == model.cache.data_ptr()
    # the Linear's weight and bias, lifted into inputs by dynamo, are static: read in place, not copied
    weight = next(n for n, t in feeds.items() if t.data_ptr() == model.proj.weight.data_ptr())
    assert weight in cm.static_inputs and cache in cm.static_inputs and len(cm.static_inputs) == 3
    replay = GraphReplay(cm.program, graph=lambda: _FakeGraph(replay), capture=lambda g: contextlib.nullcontext(),
                         static=cm.static_inputs)
    before = model.cache.clone()
    feeds = {**feeds, next(n for n, t in feeds.items() if t.dtype == torch.int64): torch.tensor([9])}
    outs = replay.run(feeds)
    written = dict(zip(cm.plan.outputs, outs))[next(iter(cm.program._aliases))]
    assert written.data_ptr() == model.cache.data_ptr()            # the caller's cache, not a copy
    assert not torch.equal(model.cache[:, :, 9], before[:, :, 9])
    torch.testing.assert_close(model.cache[:, :, :9], before[:, :, :9])
    replay.run(feeds)
    assert len(replay.graphs) == 1
    (captured,) = replay.graphs.values()
    assert captured.static_in[weight].data_ptr() == model.proj.weight.data_ptr()
    x = next(n for n, t in feeds.items() if t.dtype == torch.float32 and t.dim() == 3)
    assert captured.static_in[x].data_ptr() != feeds[x].data_ptr()       # an activation: copied in
    with torch.no_grad():                     # a weight changed in place: the next replay reads it
        model.proj.weight.mul_(2)
        want = model.cache.clone().index_copy_(2, torch.tensor([9]), model.proj(feeds[x]).view(1, 1, 2, 8).transpose(1, 2))
    replay.run(feeds)
    torch.testing.assert_close(model.cache, want, rtol=1e-5, atol=1e-5)
    first = model.cache.clone()
    other = {**feeds, cache: before.clone()}
    replay.run(other)
    assert len(replay.graphs) == 2                                 # another cache: its own graph
    assert not torch.equal(other[cache][:, :, 9], before[:, :, 9])
    assert torch.equal(model.cache, first)                         # the first cache untouched


class _Decode(torch.nn.Module):
    """A decode step of grouped-query attention over a static cache of 64 positions (4 query heads
    over 2 key/value heads), the new key and value written at ``pos``, the cache read through a
    mask of the positions written so far: what transformers' static cache gives torch.compile."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (torch.nn.Linear(32, n, bias=False) for n in (32, 16, 16, 32))
        self.register_buffer("kc", torch.zeros(1, 2, 64, 8))
        self.register_buffer("vc", torch.zeros(1, 2, 64, 8))

    def forward(self, x, pos):
        q = self.q(x).view(1, 1, 4, 8).transpose(1, 2)
        self.kc.index_copy_(2, pos, self.k(x).view(1, 1, 2, 8).transpose(1, 2))
        self.vc.index_copy_(2, pos, self.v(x).view(1, 1, 2, 8).transpose(1, 2))
        mask = (torch.arange(64) <= pos).view(1, 1, 1, 64)
        a = torch.nn.functional.scaled_dot_product_attention(q, self.kc, self.vc, attn_mask=mask, enable_gqa=True)
        return x + self.o(a.transpose(1, 2).reshape(1, 1, 32))


def test_a_decode_step_keeps_its_attention_whole_and_runs_as_one_persistent_kernel():
    """On a CPU torch.compile's trace of attention is the CPU's fused kernel, which torch's
    decompositions would turn into fp32 math (casts of the whole cache, two matmuls); kept whole,
    it is one attention kernel as on a GPU, and the step — projections, both cache writes (side by
    side: neither waits for the other), the attention, the output projection — one launch."""
    torch.manual_seed(0)
    model, twin = _Decode().eval(), _Decode().eval()
    twin.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="tilefuse",
                             options={"interpreter": True, "time_limit": 10.0, "persistent": True})
    with torch.no_grad():
        for step in range(3):
            x, pos = torch.randn(1, 1, 32), torch.tensor([3 + 9 * step])
            torch.testing.assert_close(compiled(x, pos), twin(x, pos), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(model.kc, twin.kc, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(model.vc, twin.vc, rtol=1e-6, atol=1e-6)
    cm = tilefuse.compiled_graphs()[-1]
    families = [b.family for b in cm.kernels]
    assert families.count("chain") == 1 and families.count("scatter") == 2, [b.name for b in cm.kernels]
    assert "library" not in families, [b.name for b in cm.kernels]
    assert [(i, end) for i, (_, end) in cm.program._persistent.items()] == [(0, len(cm.kernels))]
    (row,) = cm.report.persistent
    writes = [p for p, ph in enumerate(row["phases"]) if ph["kernel"].startswith("scatter")]
    first, second = (row["phases"][p]["after"] for p in writes)
    assert first == second, row["phases"]          # both wait for the same phases, not for each other
    assert not set(writes) & {d for p in writes for d in row["phases"][p]["after"]}, row["phases"]


def test_plan_only_plans_a_static_cache_decode_step_for_a_gpu_this_machine_lacks():
    """``options={"target": "h100", "plan_only": True}``: the graph runs through PyTorch (the step's
    output and the cache as eager's), and its plan is the H100's: transformers' static-cache decode
    step as one persistent kernel that compiles for sm_90 without spills (the phases
    are calls, which keep registers in a stack frame: ptxas says those are no spills).  Without
    ``plan_only`` the absent GPU is an error that says what to do."""
    from transformers import LlamaConfig, LlamaModel, StaticCache

    from tilefuse.codegen.triton.native import compile_native_persistent
    from tilefuse.errors import TargetAbsentError
    from tilefuse.runtime.executor import run_phases
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaModel(cfg).eval()
    caches = [StaticCache(config=cfg, max_cache_len=64) for _ in range(2)]
    with torch.no_grad():                # the prompt, eagerly: the caches allocated, 5 rows written
        for cache in caches:
            model(input_ids=torch.arange(1, 6)[None], past_key_values=cache, cache_position=torch.arange(5))
    step = dict(input_ids=torch.tensor([[7]]), cache_position=torch.tensor([5]), use_cache=True)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match=f"{TargetAbsentError.__name__}.*plan_only"):
        torch.compile(model, backend="tilefuse", options={"target": "h100"})(past_key_values=caches[0], **step)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="tilefuse",
                             options={"target": "h100", "plan_only": True, "persistent": True, "time_limit": 2.0})
    with torch.no_grad():
        got = compiled(past_key_values=caches[0], **step).last_hidden_state
        want = model(past_key_values=caches[1], **step).last_hidden_state
    torch.testing.assert_close(got, want)
    for a, b in zip(caches[0].layers, caches[1].layers):
        torch.testing.assert_close(a.keys, b.keys)
        torch.testing.assert_close(a.values, b.values)
    cm = tilefuse.compiled_graphs()[-1]
    assert cm.target.name == "h100" and cm.persistent == ((0, len(cm.kernels)),), [b.name for b in cm.kernels]
    assert sum(b.family == "scatter" for b in cm.kernels) == 2          # the key and value caches
    tiles, reads, writes, scratch = run_phases(cm.kernels, 0, len(cm.kernels))
    binary = compile_native_persistent("decode", tiles, reads, writes, {**cm.primgraph.types, **scratch}, 90)
    assert not binary.spills and binary.frame_instructions > 0, binary
