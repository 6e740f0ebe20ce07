"""One CompiledModel called from many threads at once, and called many times: right answers,
flat memory (runtime/compiled.py: a pool of programs, each with its own arena; the interpreter
runs one kernel at a time)."""
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import tilefuse


class Block(torch.nn.Module):
    """GEMM + bias + residual + LayerNorm, twice, and a softmax head: several kernels whose
    intermediates live in the arena between them."""

    def __init__(self, d=24):
        super().__init__()
        self.lin = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(3))
        self.ln = torch.nn.ModuleList(torch.nn.LayerNorm(d) for _ in range(3))
        self.head = torch.nn.Linear(d, 10)

    def forward(self, x):
        h = x
        for lin, ln in zip(self.lin, self.ln):
            h = ln(torch.relu(lin(h)) + h)
        return torch.softmax(self.head(h), -1), h


def _rss_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_threads_calling_one_model_get_their_own_answers():
    """16 calls from 8 threads, each with its own input: every result is the eager model's for
    that input (a shared arena would mix them), and the pool made at most one program per
    concurrent call."""
    torch.manual_seed(0)
    model = Block().eval()
    x0 = torch.randn(6, 24)
    cm = tilefuse.compile(model, (x0,))
    inputs = [torch.randn(6, 24) for _ in range(16)]
    start = threading.Barrier(8)

    def call(x):
        start.wait(timeout=30)           # eight calls in flight together
        return cm(x)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)          # threads take turns inside each other's calls
    try:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(call, inputs))
    finally:
        sys.setswitchinterval(switch)
    assert cm.memory.arena_bytes > 0
    with torch.no_grad():
        for x, (p, h) in zip(inputs, results):
            want_p, want_h = model(x)
            torch.testing.assert_close(p, want_p, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(h, want_h, rtol=1e-5, atol=1e-5)
    assert 1 <= len(cm._idle) <= 8


def _memory_growth(calls: int, rows: int) -> float:
    """Resident bytes gained over ``calls`` calls after a warm-up, for a model whose every call
    makes ``rows`` x 64 fp32 intermediates (a call leaking them would grow by rows * 256 bytes)."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).eval()
    x = torch.randn(rows, 64)
    cm = tilefuse.compile(model, (x,))
    for _ in range(50):
        cm(x)
    before = _rss_bytes()
    for _ in range(calls):
        y = cm(x)
    grown = _rss_bytes() - before
    with torch.no_grad():
        torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)
    return grown


def test_four_hundred_calls_keep_memory_flat():
    """400 calls grow resident memory by less than 3 MB; a leaked 16 KB intermediate per call
    would be 6.4 MB (intermediates live in the pooled arena; outputs are freed by the caller)."""
    grown = _memory_growth(400, 64)
    assert grown < 3 * 2**20, f"resident memory grew by {grown / 2**20:.1f} MB over 400 calls"


@pytest.mark.slow
def test_ten_thousand_calls_keep_memory_flat():
    grown = _memory_growth(10_000, 2)
    assert grown < 16 * 2**20, f"resident memory grew by {grown / 2**20:.1f} MB over 10,000 calls"


@pytest.mark.parametrize("dtype", [torch.float32])
def test_two_models_in_two_threads(dtype):
    """Two different compiled models called concurrently (their kernels share the interpreter)."""
    torch.manual_seed(1)
    a, b = Block(16).eval(), torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU()).eval()
    x = torch.randn(4, 16)
    ca, cb = tilefuse.compile(a, (x,)), tilefuse.compile(b, (x,))
    with ThreadPoolExecutor(2) as pool:
        fa = [pool.submit(ca, x) for _ in range(4)]
        fb = [pool.submit(cb, x) for _ in range(4)]
        got_a = [f.result() for f in fa]
        got_b = [f.result() for f in fb]
    with torch.no_grad():
        for (p, h) in got_a:
            torch.testing.assert_close(p, a(x)[0], rtol=1e-5, atol=1e-5)
        for y in got_b:
            torch.testing.assert_close(y, b(x), rtol=1e-5, atol=1e-5)
