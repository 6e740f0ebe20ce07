"""One attention shape's chain kernel under several tiles, each run in its own process on the GPU
and checked against fp32 SDPA: pins which property of a tile a fault or a wrong answer follows
(a fault ends a process's CUDA context, so one tile's fault cannot hide the next tile's result).

MCFuser's S4 (12 heads x 256 x 256, d 64) on the H200 with Triton 3.6: its planned tile (BM 64,
BN 256: one key block, no loop; wgmma) returned NaN through tensor descriptors (2026-11-26) and
faulted with an illegal address through pointers (2026-11-28), where the same tiles with a loop
(S1-S3) were right.

    python3 bench/gpu_chain_tiles.py --shape 12,256,256,64 --out results.json
    python3 bench/gpu_chain_tiles.py --device cpu --shape 2,64,64,16 --tiles 16,64,16,16,4,1   # the interpreter
    python3 bench/gpu_chain_tiles.py --shape 32,4096,4096,128 --time --tiles "128,128,128,128,8,2,tma;128,128,128,128,8,3,tma"
    python3 bench/gpu_chain_tiles.py --shape 32,4096,4096,128 --causal --time --tiles "128,128,128,128,8,3,tma"
    python3 bench/gpu_chain_tiles.py --shape 16,4096,4096,128 --time --tiles "128,128,128,128,8,3,tma;128,64,128,128,4,3,tma,ws"
Tiles: ``BM,BN,BK,BH,WARPS,STAGES[,tma][,ws]`` (ws: the key loop warp-specialized, 4 warps a
group; not causal), several separated by ``;``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

DEFAULT_TILES = ("64,256,64,32,4,1;64,256,64,64,4,1;64,256,64,32,8,1;64,128,64,32,4,1;64,128,64,32,4,2;"
                 "64,256,64,32,4,1,tma;16,256,64,32,4,1;128,256,64,32,8,1")


def run_one(shape: tuple, tile_text: str, device: str, timed: bool = False, causal: bool = False) -> dict:
    """The chain of SDPA over ``shape`` built with one tile and run once on fresh inputs; its
    relative L2 error against fp32 SDPA and whether every output was written (poisoned with NaN
    first); ``timed``: also its median time (``tilefuse.cost.measure``'s timer: L2 flushed, CUDA
    events) and the TFLOP/s of its two products (their useful half where ``causal``: query i
    attends to keys 0..i)."""
    import torch
    import torch.nn.functional as F
    import tilefuse
    from tilefuse.families.chain import ChainFamily, _schedule, chain_body
    from attention import whole_group            # (bench/attention.py: the shared helpers)
    from tilefuse.families.chain.space import ChainTile
    heads, m, n, d = shape
    parts = tile_text.split(",")
    tile = ChainTile(*map(int, parts[:6]), tma="tma" in parts[6:], ws="ws" in parts[6:])
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, heads, s, d, generator=g).half() for s in (m, n, n))
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
    cm = tilefuse.compile(fn, (q, k, v), target="h200", backend="reference")
    pg = cm.primgraph
    body = chain_body(whole_group(pg))
    built = ChainFamily().build(_schedule(body, tile, cm.target), "chain_probe")
    dev = torch.device(device)
    feeds = dict(zip(cm.input_names, (q.to(dev), k.to(dev), v.to(dev))))
    env = {c.name: c.data.to(dev) for c in pg.constants} | feeds
    out = torch.full(pg.types[built.outputs[0]].shape, float("nan"), dtype=torch.float16, device=dev)
    built.run([env[x] for x in built.inputs], [out])
    if device == "cuda":
        torch.cuda.synchronize()
    ref = fn(q.double(), k.double(), v.double())
    got = out.double().cpu().reshape(ref.shape)
    rel = ((got - ref).norm() / ref.norm()).item()
    row = {"tile": tile_text, "text": str(tile), "causal": causal, "rel_l2": rel, "nan": int(torch.isnan(got).sum()),
           "ok": bool(rel < 1e-2)}
    if timed:
        from gpu_kernels import timer_for
        args = [env[x] for x in built.inputs]
        seconds = timer_for(device)(lambda: built.run(args, [out])).median_s
        pairs = sum(min(i + 1, n) for i in range(m)) if causal else m * n   # (SDPA's mask: top-left aligned)
        row |= {"measured_us": round(seconds * 1e6, 2), "tflops": float(f"{4 * heads * pairs * d / seconds / 1e12:.4g}")}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="12,256,256,64", help="heads,M,N,d")
    ap.add_argument("--tiles", default=DEFAULT_TILES)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per tile's process")
    ap.add_argument("--out", default=None)
    ap.add_argument("--time", action="store_true", help="time each tile too (median, L2 flushed) and its TFLOP/s")
    ap.add_argument("--causal", action="store_true", help="causal attention (the LLM prefills')")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    shape = tuple(int(x) for x in args.shape.split(","))
    if args.child:
        print(json.dumps(run_one(shape, args.child, args.device, args.time, args.causal)))
        return
    rows = []
    for t in args.tiles.split(";"):
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, __file__, "--shape", args.shape, "--device", args.device, "--child", t]
                               + ["--time"] * args.time + ["--causal"] * args.causal,
                               capture_output=True, text=True, timeout=args.timeout)
            lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
            row = json.loads(lines[-1]) if p.returncode == 0 and lines else \
                {"tile": t, "ok": False, "error": (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1][:300]}
        except subprocess.TimeoutExpired:
            row = {"tile": t, "ok": False, "error": f"timeout after {args.timeout} s"}
        row["seconds"] = round(time.time() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        import torch
        with open(args.out, "w") as f:
            json.dump({"command": " ".join(sys.argv), "shape": shape, "causal": args.causal, "device": args.device,
                       "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                       "versions": {"torch": torch.__version__, "triton": __import__("triton").__version__},
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
