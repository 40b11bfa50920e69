"""SSA's Triton selection keeps what the torch selection keeps, weighs its draws as Horvitz-Thompson,
draws by the rest's probabilities and is unbiased (CPU: Triton's interpreter, in a child process that
sets it before triton loads)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

SCRIPT = """
import math
import torch
from claimbench.impl.ssa import PQBuckets, ssa_select_pq, water_fill
from claimbench.impl.ssa_select_triton import ssa_select_pq_triton
from claimbench.llm.sparse import PQProxy, head_probs


def pq(heads, kv_heads, n, d, seed, sharpness):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, heads, 1, d, generator=gen) * sharpness, torch.randn(1, kv_heads, n, d, generator=gen) * 2
    proxy = PQProxy(subvectors=2, bits=3)
    probs = head_probs(q, proxy.keys(0, k))
    books, codes = proxy._books[0]
    return q, k, probs, PQBuckets.build(books, codes, 2)


# the certainty stratum is the torch selection's and water filling's; the draws are HT-weighted, once each
for m, sharpness in ((1, 1.0), (10, 1.0), (61, 1.0), (10, 4.0), (61, 4.0), (290, 4.0)):
    q, _, probs, buckets = pq(8, 4, 300, 16, seed=m, sharpness=sharpness)
    idx, log_w = ssa_select_pq_triton(buckets, q, m, torch.Generator().manual_seed(1), block=16)
    torch_idx, torch_log_w = ssa_select_pq(buckets, q, m, torch.Generator().manual_seed(1))
    assert idx.shape == log_w.shape == (4, m) and idx.dtype == torch.int64, (idx.shape, idx.dtype)
    for row in range(4):
        p = probs[row].double() / probs[row].double().sum()
        order = p.argsort(descending=True)
        t, _ = water_fill(p[order], m)
        kept = set(idx[row][log_w[row] == 0].tolist())
        assert kept == set(order[:t].tolist()) == set(torch_idx[row][torch_log_w[row] == 0].tolist()), (m, row, t)
        assert (log_w[row, :t] == 0).all(), "the kept tokens come first"
        is_drawn = (log_w[row] != 0) & log_w[row].isfinite()
        drawn = idx[row][is_drawn]
        assert len(set(drawn.tolist())) == len(drawn) and not kept & set(drawn.tolist()), (m, row)
        slots = torch.arange(m)
        assert ((slots >= t) | ~is_drawn).all()
        repeats = len(idx[row][t:]) - len(set(idx[row][t:].tolist()))
        assert int((log_w[row] == -math.inf).sum()) == repeats, "every repeated draw, and only those, is padding"
        rest = p.clone()
        rest[order[:t]] = 0
        inclusion = 1 - (1 - rest[drawn] / rest.sum()) ** (m - t)
        assert torch.allclose(log_w[row][is_drawn].double(), -inclusion.log(), rtol=1e-4), (m, row)

# two calls draw anew (the seed comes from the generator), one generator state draws the same
q, _, _, buckets = pq(4, 2, 300, 16, seed=0, sharpness=1.0)
gen = torch.Generator().manual_seed(5)
first, second = ssa_select_pq_triton(buckets, q, 40, gen, block=16), ssa_select_pq_triton(buckets, q, 40, gen, block=16)
again = ssa_select_pq_triton(buckets, q, 40, torch.Generator().manual_seed(5), block=16)
assert not torch.equal(first[0], second[0]) and torch.equal(first[0], again[0])

# unbiased: over 200 KV heads with the same keys and query, the weighted sums match the dense ones, and
# the raw draws (repeats included) follow the rest's probabilities (chi-square, cells of >= 5 expected)
q, k, probs, one = pq(1, 1, 300, 8, seed=3, sharpness=1.0)
heads, m = 200, 30
buckets = PQBuckets(one.books.repeat(heads, 1, 1), one.order.repeat(heads, 1), one.starts.repeat(heads, 1))
idx, log_w = ssa_select_pq_triton(buckets, q.repeat(1, heads, 1, 1), m, torch.Generator().manual_seed(1), block=32)
s = (k[0, 0].double() @ q[0, 0, 0].double()) / math.sqrt(8)
v = torch.randn(300, 4, generator=torch.Generator().manual_seed(4), dtype=torch.double)
w = log_w.double().exp()
nums = (w[..., None] * s[idx].exp()[..., None] * v[idx]).sum(1)
dens = (w * s[idx].exp()).sum(1)
dense_num, dense_den = (s.exp()[:, None] * v).sum(0), s.exp().sum()
assert ((nums.mean(0) - dense_num).abs() <= 4 * nums.std(0) / math.sqrt(heads) + 1e-9).all()
assert (dens.mean() - dense_den).abs() <= 4 * dens.std() / math.sqrt(heads) + 1e-9
p = probs[0].double() / probs[0].double().sum()
order = p.argsort(descending=True)
t, _ = water_fill(p[order], m)
rest = p.clone()
rest[order[:t]] = 0
expected = heads * (m - t) * rest / rest.sum()
observed = torch.bincount(idx[:, t:].flatten(), minlength=300).double()
big = expected >= 5
cells_expected = torch.cat([expected[big], expected[~big].sum()[None]])
cells_observed = torch.cat([observed[big], observed[~big].sum()[None]])
chi2, df = float(((cells_observed - cells_expected) ** 2 / cells_expected).sum()), len(cells_expected) - 1
assert chi2 < df + 5 * math.sqrt(2 * df), (chi2, df)
print("ok")
"""


def test_triton_selection_matches_the_torch_selection_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]
