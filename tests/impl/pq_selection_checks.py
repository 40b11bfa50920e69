"""Checks every implementation of SSA's selection over PQ codes passes (impl.ssa.ssa_select_pq, and the
Triton one under the interpreter, whose test imports this module in a child process):
select(buckets, q, m, generator) -> (index, log w) of shape (Hkv, m)."""
import math

import torch

from claimbench.impl.ssa import PQBuckets, water_fill
from claimbench.llm.sparse import PQProxy, head_probs


def pq(heads: int, kv_heads: int, n: int, d: int, seed: int, sharpness: float = 1.0):
    """A query, keys, their PQ proxy's probabilities and the keys' buckets (2 sub-vectors x 3 bits)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, heads, 1, d, generator=gen) * sharpness, torch.randn(1, kv_heads, n, d, generator=gen) * 2
    proxy = PQProxy(subvectors=2, bits=3)
    probs = head_probs(q, proxy.keys(0, k))
    books, codes = proxy._books[0]
    return q, k, probs, PQBuckets.build(books, codes, 2)


def rest_after_water_filling(probs_row: torch.Tensor, m: int) -> tuple[torch.Tensor, set]:
    """(the probabilities with the certainty stratum's zeroed, the certainty stratum) of one KV head."""
    p = probs_row.double() / probs_row.double().sum()
    order = p.argsort(descending=True)
    t, _ = water_fill(p[order], m)
    rest = p.clone()
    rest[order[:t]] = 0
    return rest, set(order[:t].tolist())


def check_keeps_and_weighs(select, m: int, sharpness: float):
    """It keeps what water filling keeps, draws each other token at most once, none of them kept, and
    weighs each draw as Horvitz-Thompson. Returns the buckets, the query and the selection (index, log w)."""
    q, _, probs, buckets = pq(8, 4, 300, 16, seed=m, sharpness=sharpness)
    idx, log_w = select(buckets, q, m, torch.Generator().manual_seed(1))
    assert idx.shape == log_w.shape == (4, m), (idx.shape, log_w.shape)
    for row in range(4):
        rest, certain = rest_after_water_filling(probs[row], m)
        kept = set(idx[row][log_w[row] == 0].tolist())
        assert kept == certain, (m, row, len(certain), len(kept))
        is_drawn = (log_w[row] != 0) & log_w[row].isfinite()
        drawn = idx[row][is_drawn]
        assert len(set(drawn.tolist())) == len(drawn) and not kept & set(drawn.tolist()), (m, row)
        inclusion = 1 - (1 - rest[drawn] / rest.sum()) ** (m - len(kept))
        assert torch.allclose(log_w[row][is_drawn].double(), -inclusion.log(), rtol=1e-4), (m, row)
    return buckets, q, idx, log_w


def check_unbiased(select, heads: int, m: int = 30) -> None:
    """Over `heads` KV heads with the same keys and query, the weighted numerator and denominator of
    attention match the dense ones (within 4 standard errors), and each token is among a head's draws
    as often as its inclusion probability says (Pearson's chi-square, binomial cells of >= 5 expected)."""
    q, k, probs, one = pq(1, 1, 300, 8, seed=3)
    buckets = PQBuckets(one.books.repeat(heads, 1, 1), one.order.repeat(heads, 1), one.starts.repeat(heads, 1))
    idx, log_w = select(buckets, q.repeat(1, heads, 1, 1), m, torch.Generator().manual_seed(1))
    s = (k[0, 0].double() @ q[0, 0, 0].double()) / math.sqrt(8)
    v = torch.randn(300, 4, generator=torch.Generator().manual_seed(4), dtype=torch.double)
    w = log_w.double().exp()
    nums = (w[..., None] * s[idx].exp()[..., None] * v[idx]).sum(1)
    dens = (w * s[idx].exp()).sum(1)
    dense_num, dense_den = (s.exp()[:, None] * v).sum(0), s.exp().sum()
    assert ((nums.mean(0) - dense_num).abs() <= 4 * nums.std(0) / math.sqrt(heads) + 1e-9).all()
    assert (dens.mean() - dense_den).abs() <= 4 * dens.std() / math.sqrt(heads) + 1e-9
    rest, certain = rest_after_water_filling(probs[0], m)
    inclusion = 1 - (1 - rest / rest.sum()) ** (m - len(certain))
    drawn = idx[(log_w != 0) & log_w.isfinite()]
    observed = torch.bincount(drawn, minlength=300).double()
    cells = (heads * inclusion >= 5) & (heads * (1 - inclusion) >= 5)
    expected = heads * inclusion[cells]
    chi2 = float(((observed[cells] - expected) ** 2 / (expected * (1 - inclusion[cells]))).sum())
    df = int(cells.sum())
    assert df >= 10 and chi2 < df + 5 * math.sqrt(2 * df), (chi2, df)
