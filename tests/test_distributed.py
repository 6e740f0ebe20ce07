"""Tensor-parallel models through tilefuse on two real processes (gloo on the CPU).

Each test starts two ranks (``torch.multiprocessing``, spawn, a free port on 127.0.0.1, a timeout),
shards a model with ``torch.distributed.tensor.parallel`` (column-wise then row-wise linears) and
compiles it with ``torch.compile(backend="tilefuse")``; the kernels run in Triton's interpreter.
Every rank checks that no graph fell back to eager, that the collectives are kernels of the plan
and that its output equals the unsharded eager model's; a collective with work beside it that
does not need its result is issued before that work and waited for after it.
"""
from __future__ import annotations

import os
import queue as queue_module
import socket
import time
import traceback
import warnings

import pytest
import torch

TIMEOUT_S = 240
WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MLP(torch.nn.Module):
    def __init__(self, d: int = 16, hidden: int = 32):
        super().__init__()
        self.up, self.down = torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, d)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _mlp(mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    model, x = MLP().eval(), torch.randn(4, 16)
    ref = model(x)
    return parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()}), (x,), ref


def _llama_layer(mesh):
    """One LLaMA decoder layer (4 query heads over 2 KV heads) inside a one-layer model: q/k/v and
    gate/up column-wise, o and down row-wise."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    cfg._attn_implementation = "sdpa"
    model = LlamaModel(cfg).eval()
    ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        ref = model(ids).last_hidden_state
    layer = model.layers[0]
    plan = {f"self_attn.{p}": ColwiseParallel() for p in ("q_proj", "k_proj", "v_proj")}
    plan |= {f"mlp.{p}": ColwiseParallel() for p in ("gate_proj", "up_proj")}
    plan |= {"self_attn.o_proj": RowwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    parallelize_module(layer, mesh, plan)

    class Hidden(torch.nn.Module):       # the last hidden state, as a tensor
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(ids).last_hidden_state
    return Hidden(model), (ids,), ref


class Collectives(torch.nn.Module):
    """Each functional collective once, with computation between (the input differs per rank)."""

    def forward(self, x):
        import torch.distributed as dist
        import torch.distributed._functional_collectives as fc
        group = dist.group.WORLD
        gather = getattr(fc, "all_gather_single", None) or fc.all_gather_tensor        # torch >= 2.12's name
        reduce_scatter = getattr(fc, "reduce_scatter_single", None) or fc.reduce_scatter_tensor
        gathered = gather(x * 2, 0, group)                                    # [2 x 4, 8]
        scattered = reduce_scatter(gathered + 1, "sum", 0, group)             # [4, 8]
        exchanged = fc.all_to_all_single(scattered.relu(), [2, 2], [2, 2], group)
        return fc.all_reduce(exchanged, "max", group) * 3


def _collectives(mesh):
    import torch.distributed as dist
    x = torch.randn(4, 8) + dist.get_rank()
    model = Collectives()
    return model, (x,), model(x)


class Overlapped(torch.nn.Module):
    """An all-reduce, and work that does not need its result (issued before it, waited for after)."""

    def forward(self, x):
        import torch.distributed as dist
        import torch.distributed._functional_collectives as fc
        reduced = fc.all_reduce(x * 2, "sum", dist.group.WORLD)
        side = torch.tanh(x @ x.t()).sum(-1, keepdim=True)
        return reduced + side


def _overlapped(mesh):
    import torch.distributed as dist
    x = torch.randn(4, 8) + dist.get_rank()
    model = Overlapped()
    return model, (x,), model(x)


CASES = {"mlp": _mlp, "llama_layer": _llama_layer, "collectives": _collectives, "overlap": _overlapped}
# the collectives each case's plan must hold, in plan order (row-wise layers end in an all-reduce)
COLLECTIVES = {"mlp": ["AllReduce"], "llama_layer": ["AllReduce", "AllReduce"],
               "collectives": ["AllGather", "ReduceScatter", "AllToAll", "AllReduce"], "overlap": ["AllReduce"]}


def _rank(rank: int, port: int, cases: list[str], queue) -> None:
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        torch.set_num_threads(1)            # two ranks beside the other test workers on a small machine
        dist.init_process_group("gloo", rank=rank, world_size=WORLD)
        import tilefuse
        from tilefuse.frontend.dynamo import TilefuseFallbackWarning
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cpu", (WORLD,))
        results = {}
        for case in cases:
            torch.manual_seed(0)                       # the same weights and inputs on every rank
            torch._dynamo.reset()
            model, args, ref = CASES[case](mesh)
            before = len(tilefuse.compiled_graphs())
            with warnings.catch_warnings():
                warnings.simplefilter("error", TilefuseFallbackWarning)
                compiled = torch.compile(model, backend="tilefuse", options={"interpreter": True, "time_limit": 2.0})
                with torch.no_grad():
                    out = compiled(*args)
            graphs = tilefuse.compiled_graphs()[before:]
            kernels = [(k.family, k.ops) for c in graphs for k in c.report.kernels]
            results[case] = {"err": (out - ref).abs().max().item(), "scale": ref.abs().max().item(),
                             "kernels": kernels, "overlap": [row for c in graphs for row in c.report.overlap]}
        queue.put((rank, "ok", results))
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(cases: list[str]) -> dict[int, dict]:
    """Every case on the same two ranks (one start-up), each rank's results by case."""
    ctx = torch.multiprocessing.get_context("spawn")
    queue, port = ctx.Queue(), _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, cases, queue), daemon=True) for r in range(WORLD)]
    for p in procs:
        p.start()
    results, deadline = {}, time.monotonic() + TIMEOUT_S
    try:
        while len(results) < WORLD:
            try:
                rank, status, value = queue.get(timeout=1.0)
            except queue_module.Empty:
                dead = [p.exitcode for p in procs if not p.is_alive()]
                if len(dead) == WORLD and queue.empty():      # a rank died without a word
                    raise AssertionError(f"the ranks exited with {dead} before reporting") from None
                assert time.monotonic() < deadline, f"no result from every rank within {TIMEOUT_S} s"
                continue
            assert status == "ok", f"rank {rank} failed:\n{value}"
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return results


# the default run: the MLP's column-then-row pattern, every collective, the overlap; the LLaMA
# layer (the pattern twice, with sharded attention heads) with --runslow
DEFAULT_CASES = ["collectives", "mlp", "overlap"]


def test_tensor_parallel_models_run_through_tilefuse_kernels_on_every_rank(request):
    cases = sorted(CASES) if request.config.getoption("--runslow", default=False) else DEFAULT_CASES
    results = _run(cases)
    assert sorted(results) == list(range(WORLD))
    for case in cases:
        for rank in range(WORLD):
            r = results[rank][case]
            assert r["err"] <= 1e-5 * max(1.0, r["scale"]), f"{case}, rank {rank}: max error {r['err']:.2e} " \
                                                           f"against eager"
            families = [f for f, _ in r["kernels"]]
            collectives = [op.split(":")[0] for f, ops in r["kernels"] if f == "collective" for op in ops]
            assert collectives == COLLECTIVES[case], (case, r["kernels"])
            assert "opaque" not in families, (case, r["kernels"])
        assert results[0][case]["kernels"] == results[1][case]["kernels"]   # one plan, the same on both ranks
    # the all-reduce is issued before the matmul that does not need it, and waited for at the add
    (row,) = results[0]["overlap"]["overlap"]
    assert row["collective"].startswith("collective") and row["between"], row
    assert any("matmul" in name or "tanh" in name for name in row["between"]), row
    assert row["waited_before"] is not None and row["waited_before"] not in row["between"]


# --- in this process: the collective family's cost, and a clear error without a process group ---

def _collective_graph(op: str, attrs: dict, shape=(256, 1024)):
    from tilefuse.ir.dtypes import DType, TensorType
    from tilefuse.ir.graph import Attrs, Graph, Node, TensorDecl
    t = TensorType(shape, DType.float16)
    out = {"AllGather": TensorType((shape[0] * attrs["group_size"], *shape[1:]), DType.float16),
           "ReduceScatter": TensorType((shape[0] // attrs["group_size"], *shape[1:]), DType.float16)}.get(op, t)
    return Graph((TensorDecl("x", t),), ("y",), (Node(op, "c", ("x",), ("y",), Attrs(attrs)),), (),
                 {"x": t, "y": out})


@pytest.mark.parametrize("op,attrs,passes,moved", [
    ("AllReduce", {"reduce": "sum", "group": "0", "group_size": 8}, 2, 256 * 1024 * 2),
    ("AllGather", {"group": "0", "group_size": 8}, 1, 8 * 256 * 1024 * 2),
    ("ReduceScatter", {"reduce": "sum", "group": "0", "group_size": 8}, 1, 256 * 1024 * 2),
])
def test_a_collective_is_one_kernel_costed_by_the_link(op, attrs, passes, moved):
    from tilefuse.api import orchestrate, prims
    from tilefuse.cost.target import Target
    h100 = Target.get("h100")
    plans, coster = orchestrate(prims(_collective_graph(op, attrs)), h100, time_limit=5)
    (kernel,) = plans["optimal"].kernels
    cost, sched = coster.best(kernel.candidate)
    assert sched.family == "collective" and cost.bound == "link"
    from tilefuse.families import build
    assert "collective kernel" in build(sched, "k").source and "(8 ranks)" in build(sched, "k").source
    ring = passes * 7 / 8 * moved / h100.link_bw            # a ring over 8 ranks
    assert cost.seconds == pytest.approx(h100.launch_s + h100.link_latency_s + ring)
    if op == "AllReduce":                                    # a group of one sends nothing
        plans1, coster1 = orchestrate(prims(_collective_graph(op, {**attrs, "group_size": 1})), h100, time_limit=5)
        (alone,) = plans1["optimal"].kernels
        assert coster1.best(alone.candidate)[0].seconds == pytest.approx(h100.launch_s)


def test_a_collective_without_a_process_group_names_the_operator():
    import torch.fx as fx

    from tilefuse.errors import UnsupportedOperator
    from tilefuse.frontend.torch import fx_to_graph
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(4, 8)
    r = g.call_function(torch.ops._c10d_functional.all_reduce.default, (x, "sum", "0"))
    r.meta["val"] = torch.empty(4, 8)
    w = g.call_function(torch.ops._c10d_functional.wait_tensor.default, (r,))
    w.meta["val"] = torch.empty(4, 8)
    g.output(w)
    with pytest.raises(UnsupportedOperator, match=r"_c10d_functional\.all_reduce.*process group"):
        fx_to_graph(g, inputs={x: "x"})


def _one_op_graph(op, args_after_x, shape=(4, 8)):
    import torch.fx as fx
    g = fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(shape)
    r = g.call_function(op, (x, *args_after_x))
    r.meta["val"] = torch.empty(shape)
    g.output(r)
    return g, x


def test_collectives_the_group_cannot_run_are_refused_by_name():
    import torch.distributed as dist

    from tilefuse.errors import UnsupportedAttribute
    from tilefuse.frontend.torch import fx_to_graph
    c10d = torch.ops._c10d_functional
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = dist.group.WORLD.group_name
        cases = [(c10d.all_reduce.default, ("bxor", group), r"reduce_op.*supported: sum, avg"),
                 (c10d.all_gather_into_tensor.default, (2, group), r"group_size.*has 1 ranks"),
                 (c10d.all_to_all_single.default, ([4], [3], group), r"split_sizes.*one split per rank"),
                 (c10d.all_reduce.default, ("sum", "no-such-group"), r"group_name.*no such process group")]
        for op, args, message in cases:
            g, x = _one_op_graph(op, args)
            with pytest.raises(UnsupportedAttribute, match=message):
                fx_to_graph(g, inputs={x: "x"})
    finally:
        dist.destroy_process_group()
