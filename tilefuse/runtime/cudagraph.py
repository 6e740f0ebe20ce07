"""Whole-plan replay as one CUDA graph: a plan of many small kernels pays one launch, not one each.

The first call runs the program once outside the graph (Triton compiles kernels on their first
launch, which must not happen during capture), then captures it reading from static input
buffers; every later call copies its inputs into those buffers, replays, and returns clones of
the static outputs (the next replay overwrites them).

A donated input (a KV cache the program writes in place: ``Program._aliases``) is not copied: the
graph is captured on the caller's own tensor, so a replay writes the new rows straight into it and
its output is that tensor itself (no clone, and AOT's copy back is a self-copy). A graph is bound
to the pointers it was captured with, so replays are keyed by the donated tensors' addresses: a
call with other cache tensors (another ``generate()`` with a new cache) captures a graph of its
own (the last ``KEEP`` kept), never writing into the tensors of an earlier call.

A static input (``static``: the parameters and buffers a torch.compile'd graph receives as inputs,
and tensors marked with ``torch._dynamo.mark_static_address``) is not copied either: it is read
where it lies, like a donated one, and keys the graphs by its address the same way (copying a
model's weights into static buffers on every call would cost more than the graph saves).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from .executor import Program


@dataclass
class _Captured:
    graph: object
    static_in: dict
    static_out: list


class GraphReplay:
    KEEP = 4          # graphs kept, one per set of donated tensors (least recently used dropped)

    def __init__(self, program: Program, graph: Callable | None = None, capture: Callable | None = None,
                 static: frozenset[str] = frozenset()):
        """``graph``/``capture``: the graph type and its capture context (``torch.cuda.CUDAGraph``,
        ``torch.cuda.graph``; replaceable to test the bookkeeping without a GPU); ``static``: the
        names of the static inputs (module docstring), each one an input of the program."""
        if graph is None and program.device.type != "cuda":
            raise ValueError(f"CUDA-graph replay needs a CUDA device; this program runs on {program.device}")
        self.program = program
        self._graph = graph or torch.cuda.CUDAGraph
        self._capture_in = capture or torch.cuda.graph
        self.donated = sorted(set(program._aliases.values()))
        # read in place, not copied: donated and static inputs (the graphs are keyed by their addresses)
        self.held = sorted(set(self.donated) | set(static))
        self.graphs: collections.OrderedDict[tuple, _Captured] = collections.OrderedDict()

    def _capture(self, feeds: Mapping[str, torch.Tensor]) -> _Captured:
        # donated and static inputs are the caller's tensors (donated ones written in place); the
        # others copies the replays refresh
        static_in = {n: t if n in self.held else t.clone() for n, t in feeds.items()}
        if self.program.device.type == "cuda":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):     # warm-up: compiles every kernel, initializes cuBLAS
                self.program.run(static_in)
            torch.cuda.current_stream().wait_stream(side)
        else:
            self.program.run(static_in)
        graph = self._graph()
        try:
            with self._capture_in(graph):
                static_out = self.program.run(static_in)
        except RuntimeError as e:   # a kernel that synchronizes with the host cannot be captured
            raise RuntimeError(f"cuda_graph=True: the plan could not be captured as a CUDA graph "
                               f"({str(e).splitlines()[0]}); compile with cuda_graph=False") from e
        return _Captured(graph, static_in, static_out)

    def run(self, feeds: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        key = tuple(feeds[n].data_ptr() for n in self.held)
        got = self.graphs.get(key)
        if got is None:
            got = self.graphs[key] = self._capture(feeds)
            if len(self.graphs) > self.KEEP:
                self.graphs.popitem(last=False)
        else:
            self.graphs.move_to_end(key)
            for n, t in feeds.items():
                if n not in self.held:
                    got.static_in[n].copy_(t)
        got.graph.replay()
        # a donated tensor's output is the caller's own memory (the key matched its address)
        caller = {got.static_in[n].data_ptr() for n in self.donated}
        return [t if t.data_ptr() in caller else t.clone() for t in got.static_out]
