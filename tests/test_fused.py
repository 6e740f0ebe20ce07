"""The fused family: inlining, row/inner split and stores are checked by evaluating schedules."""
import random

import torch
from fused_eval import all_values, evaluate_schedule, layernorm_group, op_graph, transpose_scale_group

from tilefuse.cost.target import Target
from tilefuse.families.base import Group
from tilefuse.families.fused import FusedFamily
from tilefuse.fission import fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.orchestrate.candidates import enumerate_candidates
from tilefuse.orchestrate.segment import split_segments

H100 = Target.get("h100")


def _check_group(group, env):
    scheds = FusedFamily().schedules(group, H100)
    assert scheds
    s = scheds[0]
    got = evaluate_schedule(s, [env[n] for n in s.body.inputs])
    assert set(got) == set(group.outputs)
    for name, t in got.items():
        torch.testing.assert_close(t, env[name], rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
    return s


def test_softmax_is_one_fused_kernel_with_two_reductions():
    x = torch.randn(6, 33)
    pg, feeds = op_graph("Softmax", [x], (6, 33), {"axis": -1})
    env = all_values(pg, feeds)
    s = _check_group(Group(pg.prims, ("x0",), pg.outputs, dict(pg.types)), env)
    assert [i.combiner for i in s.body.instances] == ["max", "sum"]
    assert s.body.xext == (6,) and s.body.iext == (33,)


def test_layernorm_row_outputs_and_full_outputs_in_one_kernel():
    s = _check_group(*layernorm_group())
    assert sum(st.row_only for st in s.body.stores) == 2


def test_transpose_then_add_stores_both_layouts():
    s = _check_group(*transpose_scale_group())
    assert s.body.ivars == ()


def test_rejects_mixed_shapes_it_cannot_store():
    x = torch.randn(4, 6)
    pg, feeds = op_graph("ReduceSum", [x], (6,), {"axes": (0,), "keepdims": 0})
    from tilefuse.fission.registry import Fission
    fx = Fission({p.name for p in pg.prims} | {"x0"})
    xs = fx.ref("x0", TensorType((4, 6), DType.float32))
    z = fx.compute((6, 4), lambda i: xs[i[1], i[0]] + 1.0)   # unrelated output, other shape
    prims = pg.prims + tuple(fx.prims)
    types = dict(pg.types) | {z.name: z.type}
    assert FusedFamily().schedules(Group(prims, ("x0",), (pg.outputs[0], z.name), types), H100) == []


def test_every_fused_candidate_of_an_encoder_block_computes_the_reference():
    from tilefuse.demo import demo_model
    from tilefuse.frontend.torch import import_torch
    model, inputs = demo_model(batch=2, seq=8)
    imp = import_torch(model, inputs)
    pg = fission(imp.graph)
    feeds = {d.name: t for d, t in zip(pg.inputs, inputs)}
    env = all_values(pg, feeds)
    fam = FusedFamily()
    rng = random.Random(0)
    checked = 0
    for seg in split_segments(pg):
        accepted = []
        enumerate_candidates(seg, lambda c: accepted.append(c) if fam.schedules(
            Group(c.prims, c.inputs, c.outputs, pg.types), H100) else None)
        for c in rng.sample(accepted, min(len(accepted), 40)):
            _check_group(Group(c.prims, c.inputs, c.outputs, pg.types), env)
            checked += 1
    assert checked >= 40


def _whole_model(fn, *inputs):
    from tilefuse.frontend.torch import import_torch
    pg = fission(import_torch(fn, inputs).graph)
    made = {p.name for p in pg.prims}
    ins = tuple(dict.fromkeys(n for p in pg.prims for n in p.inputs if n not in made))
    return Group(pg.prims, ins, pg.outputs, dict(pg.types)), all_values(pg, {d.name: t for d, t in zip(pg.inputs, inputs)})


def test_uneven_split_is_one_kernel_storing_each_part_where_it_fits():
    group, env = _whole_model(lambda x: tuple(t + 1.0 for t in torch.split(x, [2, 5, 3], dim=-1)), torch.randn(3, 10))
    s = _check_group(group, env)
    assert sorted(n for st in s.body.stores for _, n in st.limits) == [2, 3]     # the 5-wide part is the anchor


def test_uneven_parts_with_reductions_are_not_fused():
    # a reduction's rows would run past the smaller part: such groups stay separate kernels
    group, env = _whole_model(lambda x: tuple(t.softmax(-1) for t in torch.split(x, [3, 5], dim=0)), torch.randn(8, 6))
    assert FusedFamily().schedules(group, H100) == []
