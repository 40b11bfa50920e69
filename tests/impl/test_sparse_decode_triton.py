"""The Triton sparse decode kernel equals the torch reference (CPU: Triton's interpreter)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

SCRIPT = """
import torch
from claimbench.llm.sparse import weighted_attention
from claimbench.impl.sparse_decode_triton import sparse_decode_attention
gen = torch.Generator().manual_seed(0)
for n, m in ((500, 37), (4096, 81)):
    q = torch.randn(1, 9, 1, 64, generator=gen)
    k, v = torch.randn(1, 3, n, 64, generator=gen), torch.randn(1, 3, n, 64, generator=gen)
    index = torch.stack([torch.randperm(n, generator=gen)[:m] for _ in range(3)])
    log_w = torch.rand(3, m, generator=gen).log()
    log_w[0, -5:] = float("-inf")  # padding entries: a whole last chunk of them where a chunk is a block
    ref = weighted_attention(q, k, v, index, log_w)
    for max_chunks in (1, 2, 128):  # one chunk; chunks of several blocks; a chunk per block
        out = sparse_decode_attention(q, k, v, index, log_w, block=16, max_chunks=max_chunks)
        assert torch.allclose(out, ref, atol=1e-5), (max_chunks, (out - ref).abs().max())
print("ok")
"""


def test_kernel_equals_reference_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


def test_a_kernel_on_the_cpu_without_the_interpreter_says_what_it_needs(monkeypatch):
    import torch

    from claimbench.impl import triton_support
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not triton_support.available("cpu")
    with pytest.raises(RuntimeError, match="the sparse decode kernel needs a CUDA device"):
        triton_support.require(torch.device("cpu"), "the sparse decode kernel")
