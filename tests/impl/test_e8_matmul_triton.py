"""The E8 decode-matmul kernel (impl/e8_matmul_triton.py) equals decode-then-matmul (CPU: Triton's
interpreter), and the codebook table builds without numba (a GPU machine's bare image)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from claimbench.impl import e8_matmul_triton, e8qat

KERNEL = """
import torch
from claimbench.impl import e8_matmul_triton as kernel
gen = torch.Generator().manual_seed(0)
table = kernel.codebook_table(torch.float32)
for tokens, rows, cols in ((1, 72, 128), (19, 64, 192)):
    codes = torch.randint(0, 2 ** 16, (rows, cols // 8), generator=gen)
    scales = torch.rand(rows, cols // 64, generator=gen) * 0.1
    packed = kernel.pack(codes)
    x = torch.randn(tokens, cols, generator=gen)
    reference = x @ kernel.dequantize(packed, scales, table, 64).T
    out = kernel.e8_matmul(x, packed, scales, table, 64)
    assert out.shape == (tokens, rows) and torch.allclose(out, reference, atol=1e-4), (out - reference).abs().max()
print("ok")
"""

NO_NUMBA = """
import sys
sys.modules["numba"] = None  # as on an image without numba
import json
import torch
from claimbench.impl import e8qat
assert not hasattr(e8qat.njit, "__module__") or "numba" not in e8qat.njit.__module__
print(json.dumps(e8qat.from_code(torch.arange(0, 2 ** 16, 97)).mul(2).round().int().tolist()))
"""


@pytest.mark.skipif(e8_matmul_triton.triton is None, reason="triton is not installed")
def test_kernel_equals_decode_then_matmul_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", KERNEL], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


def test_codes_pack_into_16_bits_and_decode_to_their_points():
    codes = torch.tensor([[0, 1, 2 ** 15 - 1, 2 ** 15, 2 ** 16 - 1, 12345, 40000, 7]])
    packed = e8_matmul_triton.pack(codes)
    assert packed.dtype == torch.int16 and torch.equal(packed.long() & 0xFFFF, codes)
    table = e8_matmul_triton.codebook_table(torch.float32)
    weight = e8_matmul_triton.dequantize(packed, torch.ones(1, 1), table, 64)
    assert torch.equal(weight.reshape(8, 8), e8qat.from_code(codes[0]))
    with pytest.raises(ValueError):
        e8_matmul_triton.pack(torch.tensor([[2 ** 16]]))


def test_the_codebook_table_builds_without_numba():
    out = subprocess.run([sys.executable, "-c", NO_NUMBA], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    expected = e8qat.from_code(torch.arange(0, 2 ** 16, 97)).mul(2).round().int().tolist()
    assert json.loads(out.stdout) == expected
