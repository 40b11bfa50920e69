"""SSA's Triton selection passes the checks the torch selection passes (tests/impl/pq_selection_checks.py:
it keeps what water filling keeps, weighs its draws as Horvitz-Thompson, draws each token as often as
its inclusion probability says, and is unbiased), keeps the same tokens as the torch selection, and
pads repeated draws in place (CPU: Triton's interpreter, in a child process that sets it before
triton loads)."""
import os
import subprocess
import sys

import pytest

from claimbench.registry import REPO_ROOT

pytest.importorskip("triton")

SCRIPT = """
import math
import torch
from claimbench.impl.ssa import ssa_select_pq
from claimbench.impl.ssa_select_triton import ssa_select_pq_triton
from tests.impl import pq_selection_checks as checks


def select(buckets, q, m, gen):
    return ssa_select_pq_triton(buckets, q, m, gen, block=16)


for m, sharpness in ((1, 1.0), (10, 1.0), (61, 1.0), (10, 4.0), (61, 4.0), (290, 4.0)):
    buckets, q, idx, log_w = checks.check_keeps_and_weighs(select, m, sharpness)
    torch_idx, torch_log_w = ssa_select_pq(buckets, q, m, torch.Generator().manual_seed(1))
    assert idx.dtype == torch.int64
    for row in range(4):
        kept = log_w[row] == 0
        assert set(idx[row][kept].tolist()) == set(torch_idx[row][torch_log_w[row] == 0].tolist()), (m, row)
        t = int(kept.sum())
        assert kept[:t].all(), "the kept tokens come first"
        repeats = m - t - len(set(idx[row][t:].tolist()))
        assert int((log_w[row] == -math.inf).sum()) == repeats, "every repeated draw, and only those, is padding"

# two calls draw anew (the seed comes from the generator); one generator state draws the same
q, _, _, buckets = checks.pq(4, 2, 300, 16, seed=0)
gen = torch.Generator().manual_seed(5)
first, second = select(buckets, q, 40, gen), select(buckets, q, 40, gen)
again = select(buckets, q, 40, torch.Generator().manual_seed(5))
assert not torch.equal(first[0], second[0]) and torch.equal(first[0], again[0])

checks.check_unbiased(select, heads=200)
print("ok")
"""


def test_triton_selection_matches_the_torch_selection_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]
