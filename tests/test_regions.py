"""Each program's bounding boxes of what it reads and writes (``codegen/regions.py``): what a
persistent kernel's tile-level dependencies rest on, so a box must cover everything the program
touches (checked here against the tiles the kernel's own programs write when run)."""
import torch

import tilefuse
from tilefuse.codegen.regions import program_boxes


def test_a_gemms_programs_write_their_tile_and_read_their_rows_and_columns_whole_along_k():
    """A 96 x 64 @ 64 x 80 product planned for the H100 in tiles: each program writes its output
    tile (the boxes of all programs cover the output exactly once between them), reads its rows of
    A and its columns of B over the whole of K."""
    lin = torch.nn.Linear(64, 80, bias=False)
    x = torch.randn(96, 64)
    cm = tilefuse.compile(lin, (x,), target="h100", time_limit=1.0)
    (b,) = [b for b in cm.kernels if b.family == "gemm"]
    (k,) = b.kernels
    ins, outs = list(b.inputs), list(b.outputs)
    boxes = program_boxes(k, ins, outs, set(ins) | set(outs))
    assert boxes is not None and len(boxes) == int(torch.tensor(k.grid).prod()) > 1
    covered = torch.zeros(96, 80, dtype=torch.int32)
    a_name = next(n for n in ins if cm.primgraph.types[n].shape == (96, 64))
    for read, written in boxes:
        (r0, r1), (c0, c1) = written[outs[0]]
        covered[r0:r1 + 1, c0:c1 + 1] += 1
        (ar0, ar1), (ak0, ak1) = read[a_name]
        assert (ar0, ar1) == (r0, r1) and (ak0, ak1) == (0, 63)
    assert bool((covered == 1).all())
    # the answer is kept (a persistent run re-analysed with one kernel re-tiled): the same list,
    # and no more than MEMO_PROGRAMS programs' boxes are kept in all
    from tilefuse.codegen import regions
    assert program_boxes(k, ins, outs, set(ins) | set(outs)) is boxes
    was = regions.MEMO_PROGRAMS
    try:
        regions.MEMO_PROGRAMS = len(boxes)
        other = program_boxes(k, ins, outs, set(outs))
        assert regions._memo_programs <= len(boxes) and program_boxes(k, ins, outs, set(outs)) is other
        assert program_boxes(k, ins, outs, set(ins) | set(outs)) is not boxes      # (pushed out)
    finally:
        regions.MEMO_PROGRAMS = was


def test_a_gather_reads_its_table_whole_and_an_arrive_has_no_boxes():
    """An index read from data spans its dimension (which rows is not known); a kernel whose
    tail's writes belong to whichever program arrives last has no boxes."""
    from tilefuse.codegen.kernel import Arrive, Kernel, Store, TileAxis
    from tilefuse.ir.dtypes import DType, TensorType
    from tilefuse.ir.expr import Load, Var
    i, j = Var("i"), Var("j")
    ids, table = TensorType((8,), DType.int64), TensorType((100, 16), DType.float32)
    out = TensorType((8, 16), DType.float32)
    axes = (TileAxis("x", (i,), (8,), 4, 0, grid=0, block_name="XBLOCK"),
            TileAxis("y", (j,), (16,), 16, 1, block_name="YBLOCK"))
    body = (Store(0, (i, j), Load(1, (Load(0, (i,), DType.int64), j), DType.float32)),)
    k = Kernel("gather", (ids, table), (out,), axes, body, 4, 1)
    boxes = program_boxes(k, ["ids", "table"], ["out"], {"ids", "table", "out"})
    assert [b[0]["table"] for b in boxes] == [((0, 99), (0, 15))] * 2
    assert [b[0]["ids"] for b in boxes] == [((0, 3),), ((4, 7),)]
    assert [b[1]["out"] for b in boxes] == [((0, 3), (0, 15)), ((4, 7), (0, 15))]
    counters = TensorType((2,), DType.int32)
    tail = Kernel("tail", (ids, table), (out, counters), axes, (Arrive(1, ("x",), 1, body),), 4, 1,
                  counters=frozenset({1}))
    assert program_boxes(tail, ["ids", "table"], ["out", "c"], {"out"}) is None
