"""tilefuse on a CUDA GPU: generated Triton kernels compiled for the device, library kernels on
cuBLAS/cuDNN, CUDA-graph replay, the torch.compile backend, and the device check of inputs.

Every test is marked ``gpu`` and skipped without CUDA (tests/conftest.py).  Compiles use
``target="auto"`` (the attached GPU) with inputs and models on ``cuda``.

Tolerances: fp32 as the CPU suite, 1e-4 relative to the largest reference value (contractions run
on cuBLAS in fp32, not tf32); fp16 1e-2 relative plus 1e-2 of the largest reference value: two
fp16 implementations of the same network differ by a few fp16 ulps (2^-11 relative) per rounding,
accumulated over a few layers, while a real fault (a wrong mask, a stale buffer, a bad index)
moves outputs by O(1).
"""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import tilefuse
from tilefuse.demo import demo_model
from tilefuse.errors import InputError

pytestmark = pytest.mark.gpu

TIME_LIMIT = 2.0      # orchestration is not under test here
FP32_TOL = 1e-4
FP16_TOL = 1e-2


def to_cuda(model: torch.nn.Module, inputs: tuple, dtype: torch.dtype):
    """The model in ``dtype`` and the inputs (floating ones in ``dtype``) on the GPU."""
    model = model.to(device="cuda", dtype=dtype).eval()
    return model, tuple(t.to(device="cuda", dtype=dtype if t.is_floating_point() else t.dtype) for t in inputs)


def leaves(out) -> list[torch.Tensor]:
    from torch.utils import _pytree as pytree
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def assert_matches(got, want, tol: float, what: str) -> None:
    got_t, want_t = leaves(got), leaves(want)
    assert len(got_t) == len(want_t), f"{what}: {len(got_t)} outputs, eager has {len(want_t)}"
    for k, (g, w) in enumerate(zip(got_t, want_t)):
        assert g.device.type == "cuda", f"{what} output {k} is on {g.device}"
        scale = w.abs().max().item()
        assert scale > 1e-3, f"{what} output {k}: degenerate reference (max |x| = {scale:.1e})"
        assert g.dtype == w.dtype and g.shape == w.shape, f"{what} output {k}: {g.dtype}{list(g.shape)} != " \
                                                          f"{w.dtype}{list(w.shape)}"
        torch.testing.assert_close(g, w, rtol=tol, atol=tol * scale, msg=lambda m: f"{what} output {k}: {m}")


def eager(model, inputs):
    with torch.no_grad():
        return model(*inputs)


def new_demo_inputs(inputs: tuple, seed: int) -> tuple:
    """Inputs of the same shapes with other values: other tokens, another padding length."""
    ids, mask = inputs
    g = torch.Generator().manual_seed(seed)
    ids2 = torch.randint(0, 128, tuple(ids.shape), generator=g).to(ids.device)
    mask2 = torch.ones_like(mask)
    mask2[0, -3:] = 0
    return ids2, mask2


@pytest.fixture(scope="module")
def demo32():
    """The demo encoder block in fp32 on the GPU, its inputs, and its tilefuse compile."""
    model, inputs = to_cuda(*demo_model(), torch.float32)
    return model, inputs, tilefuse.compile(model, inputs, target="auto", time_limit=TIME_LIMIT)


def test_demo_fp32_matches_eager(demo32):
    model, inputs, compiled = demo32
    assert compiled.target.device == "cuda" and compiled.device.type == "cuda", compiled.target.name
    assert compiled.report.num_kernels < compiled.report.num_ops
    assert_matches(compiled(*inputs), eager(model, inputs), FP32_TOL, "demo fp32")


def test_demo_fp16_matches_eager():
    model, inputs = to_cuda(*demo_model(), torch.float16)
    compiled = tilefuse.compile(model, inputs, target="auto", time_limit=TIME_LIMIT)
    got = compiled(*inputs)
    assert got.dtype == torch.float16
    assert_matches(got, eager(model, inputs), FP16_TOL, "demo fp16")


def test_cuda_graph_matches_plain_and_refreshes_inputs(demo32):
    model, inputs, plain = demo32
    graphed = tilefuse.compile(model, inputs, target="auto", time_limit=TIME_LIMIT, cuda_graph=True)
    second = new_demo_inputs(inputs, seed=1)
    g1 = graphed(*inputs)       # captures the graph
    g2 = graphed(*second)       # replays it on the new values copied into its static inputs
    p1, p2 = plain(*inputs), plain(*second)
    assert not torch.allclose(p1, p2), "the two input sets should give different outputs"
    torch.testing.assert_close(g1, p1, rtol=1e-6, atol=1e-6, msg=lambda m: f"first call (capture): {m}")
    torch.testing.assert_close(g2, p2, rtol=1e-6, atol=1e-6, msg=lambda m: f"second call (replay): {m}")
    # The first result is the caller's own tensor: the replay did not overwrite it.
    torch.testing.assert_close(g1, p1, rtol=1e-6, atol=1e-6, msg=lambda m: f"first result after replay: {m}")
    assert_matches(g2, eager(model, second), FP32_TOL, "cuda graph vs eager")


@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_zoo_fp16_matches_eager(name):
    from test_models import MODELS, build
    model, inputs = to_cuda(*build(name, MODELS[name][1][-1]), torch.float16)
    compiled = tilefuse.compile(model, inputs, target="auto", time_limit=TIME_LIMIT)
    assert compiled.device.type == "cuda"
    assert compiled.report.num_kernels < compiled.report.num_ops
    got, want = compiled(*inputs), eager(model, inputs)
    assert type(got) is type(want)
    assert_matches(got, want, FP16_TOL, f"{name} fp16")


def test_torch_compile_backend_on_cuda(monkeypatch):
    import torch._dynamo
    from tilefuse.frontend.dynamo import TilefuseFallbackWarning   # also registers the backend
    from tilefuse.runtime.executor import Program
    model, inputs = to_cuda(*demo_model(), torch.float32)
    devices = []
    real_run = Program.run
    monkeypatch.setattr(Program, "run", lambda self, feeds: devices.append(self.device.type) or real_run(self, feeds))
    torch._dynamo.reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", TilefuseFallbackWarning)   # no silent eager fallback
            compiled = torch.compile(model, backend="tilefuse", options={"time_limit": TIME_LIMIT})
            with torch.no_grad():
                got = compiled(*inputs)
    finally:
        torch._dynamo.reset()
    assert devices and set(devices) == {"cuda"}, f"tilefuse programs ran on {devices}"
    assert_matches(got, eager(model, inputs), FP32_TOL, "torch.compile(backend='tilefuse')")


def test_cpu_inputs_to_cuda_model_raise_input_error(demo32):
    _, inputs, compiled = demo32
    with pytest.raises(InputError, match=r"is on cpu.*runs on cuda"):
        compiled(*(t.cpu() for t in inputs))


def test_measure_fills_measured_times_and_the_tuning_cache(demo32, tmp_path, monkeypatch):
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path))
    model, inputs, _ = demo32
    tuned = tilefuse.compile(model, inputs, measure=True, time_limit=TIME_LIMIT)
    r = tuned.report
    assert r.measurement["schedules_measured"] > 0 and r.measurement["from_cache"] == 0
    assert all(k.measured_us is not None and k.measured_us > 0 for k in r.kernels)
    assert any((tmp_path / "tuning").rglob("*.json"))
    assert_matches(tuned(*inputs), eager(model, inputs), FP32_TOL, "demo fp32, measured plan")
    again = tilefuse.compile(model, inputs, measure=True, time_limit=TIME_LIMIT).report
    assert again.measurement["from_cache"] == again.measurement["schedules_measured"]


@pytest.mark.slow       # (bench/gpu_suite.sh runs it in a step of its own: "persistent")
@pytest.mark.parametrize("name", ["bert", "llama"])
def test_persistent_kernels_equal_eager_call_after_call(name):
    """Issue #25 on the GPU: the plan's kernels as persistent kernels (every run one launch, one
    program per SM, phases behind barriers) equal eager; called again and again on new inputs (a
    race between phases shows as a rare mismatch, a deadlock as a hang: the step has a timeout in
    bench/gpu_suite.sh).  300 calls; ``TILEFUSE_PERSISTENT_CALLS=10000`` for the issue's count."""
    from test_models import MODELS, build
    model, inputs = to_cuda(*build(name, MODELS[name][1][-1]), torch.float16)
    compiled = tilefuse.compile(model, inputs, target="auto", time_limit=TIME_LIMIT, persistent=True)
    assert compiled.persistent and compiled.program._persistent
    calls = int(os.environ.get("TILEFUSE_PERSISTENT_CALLS", "300"))
    g = torch.Generator(device="cuda").manual_seed(0)
    for k in range(calls):
        if inputs[0].dtype.is_floating_point:
            args = (torch.randn(inputs[0].shape, generator=g, device="cuda", dtype=inputs[0].dtype), *inputs[1:])
        else:
            vocab = model.config.vocab_size       # an id past it is a device-side assert in eager's embedding
            args = (torch.randint(0, vocab, inputs[0].shape, generator=g, device="cuda"), *inputs[1:])
        if k % 50 == 0 or k == calls - 1:
            assert_matches(compiled(*args), eager(model, args), FP16_TOL, f"{name} persistent, call {k}")
        else:
            compiled(*args)
    torch.cuda.synchronize()


def _graphed_generation(mode="reduce-overhead", options=None, **kw):
    """(eager's tokens, tilefuse's under ``mode``, the CompiledModels the generation made) of the
    tiny LLaMA's greedy generation on the GPU, no graph run eagerly.  The models are taken before
    ``torch._dynamo.reset()``, which frees them (``compiled_graphs`` holds weak references)."""
    from test_generation import _llama
    from tilefuse.frontend.dynamo import TilefuseFallbackWarning
    torch.manual_seed(0)
    model = _llama(positions=64).eval().to("cuda")
    ids = torch.randint(1, 128, (1, 5), device="cuda")
    kw = dict(max_new_tokens=12, do_sample=False, **kw)
    with torch.no_grad():
        want = model.generate(ids, **kw)
    torch._dynamo.reset()
    try:
        # torch.compile takes a mode or options, not both: a mode's test plans with the default time limit
        how = {"mode": mode} if mode else {"options": {"time_limit": TIME_LIMIT, **(options or {})}}
        model.forward = torch.compile(model.forward, backend="tilefuse", **how)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("error", TilefuseFallbackWarning)
            got = model.generate(ids, **kw)
        graphs = tilefuse.compiled_graphs()
    finally:
        torch._dynamo.reset()
    return want, got, graphs


@pytest.mark.slow       # (bench/gpu_suite.sh: the "persistent" step)
def test_generation_with_cuda_graphs_replays_one_graph_per_size():
    """Issue #24 on the GPU: under mode="reduce-overhead" every size the dynamic cache gives is
    served by its bucket's plan carried to it and replayed as its own CUDA graph (a graph fixes
    sizes and pointers, so one graph per size: what the sizes allow); tokens equal eager."""
    from tilefuse.runtime.cudagraph import GraphReplay
    replays = []
    real = GraphReplay.run
    # the replays themselves kept (not their ids: a freed one's id can be another's)
    GraphReplay.run = lambda self, feeds: replays.append(self) or real(self, feeds)
    try:
        want, got, _ = _graphed_generation()
    finally:
        GraphReplay.run = real
    assert torch.equal(got, want)
    assert len({id(r) for r in replays}) >= 12, "one graph per size (prefill and each decode length)"


@pytest.mark.slow       # (bench/gpu_suite.sh: the "persistent" step)
def test_generation_with_cuda_graphs_and_a_static_cache_writes_it_in_place():
    """A static cache under mode="reduce-overhead": each decode step replays one graph that writes
    the new rows into the cache's own memory (``runtime/cudagraph.py``); tokens equal eager."""
    want, got, graphs = _graphed_generation(cache_implementation="static")
    assert torch.equal(got, want)
    decode = [c for c in graphs if c.program._aliases]
    assert decode and decode[-1]._replay is not None and decode[-1]._replay.donated


@pytest.mark.slow       # (bench/gpu_suite.sh: the "persistent" step)
def test_static_cache_decode_steps_as_one_persistent_kernel_equal_eager():
    """Issue #25 item 5 on the GPU: each decode step of a static cache is one persistent kernel
    (the cache writes side by side, the attention, the projections as phases; the weights'
    prefetches compiled in) and the greedy tokens equal eager's."""
    want, got, graphs = _graphed_generation(mode=None, options={"persistent": True}, cache_implementation="static")
    assert torch.equal(got, want)
    decode = [c for c in graphs if c.program._aliases]
    assert decode, f"no decode graph among the {len(graphs)} compiled"
    assert decode[-1].persistent == ((0, len(decode[-1].kernels)),), decode[-1].persistent


@pytest.mark.parametrize("case", ["flash-decoding", "gemm-chain"])
def test_a_key_split_combined_in_its_launch_equals_eager_call_after_call(case):
    """A chain's keys split across programs, combined by the last split of each tile to arrive
    (``ChainTile.in_launch``: counters with acquire/release; the shares read back through L2) on
    the GPU: decode attention over a masked cache and a GEMM chain, each built with that tile and
    called 300 times on new inputs against eager (a race shows as a rare mismatch); its counters
    are back at zero after every call."""
    import torch.nn.functional as F
    from tilefuse.families.chain import ChainFamily, _schedule, chain_body
    from tilefuse.families.chain.space import ChainTile
    from tilefuse.ir.samples import allocate
    from gemm_eval import H100, compile_h100, feeds_of, whole
    if case == "flash-decoding":
        fn = lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)  # noqa: E731
        shapes = ((2, 8, 1, 64), (2, 2, 1024, 64), (2, 2, 1024, 64))
        tile = ChainTile(16, 64, 64, 64, 4, 2, split=8, in_launch=True)
    else:
        fn = lambda a, b, d: torch.relu(a @ b) @ d  # noqa: E731
        shapes = ((512, 256), (256, 512), (512, 256))
        tile = ChainTile(64, 64, 256, 256, 4, 2, split=4, in_launch=True)
    g = torch.Generator().manual_seed(0)

    def inputs():
        ts = [torch.randn(*s, generator=g).half() for s in shapes]
        if case == "flash-decoding":
            keep = torch.zeros(2, 1, 1, 1024, dtype=torch.bool)
            keep[0, ..., :300], keep[1, ..., 700] = True, True
            ts.append(keep)
        return ts
    first = inputs()
    cm = compile_h100(fn, *first)
    body = chain_body(whole(cm.primgraph))
    built = ChainFamily().build(_schedule(body, tile, H100), "chain_in_launch")
    pg = cm.primgraph
    consts = {c.name: c.data.cuda() for c in pg.constants}
    outs = [torch.empty(pg.types[o].shape, dtype=pg.types[o].dtype.to_torch(), device="cuda") for o in built.outputs]
    scratch = allocate(built.scratch, torch.device("cuda"))
    for call in range(300):
        args = first if call == 0 else inputs()
        cuda = [t.cuda() for t in args]
        env = consts | feeds_of(cm, cuda)
        built.run([env[n] for n in built.inputs], outs + scratch)
        if call % 25 == 0 or call == 299:
            assert_matches(outs[0], eager(fn, cuda), FP16_TOL, f"{case}, call {call}")
            assert not any(s.zeroed and buf.any() for s, buf in zip(built.scratch, scratch)), f"{case}, call {call}"
    torch.cuda.synchronize()
