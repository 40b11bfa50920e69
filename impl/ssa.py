"""Stratified Sparse Attention, SSA (PAPERS.md A2; baselines in claimbench.baselines.sparse_attention).

Per decode step and KV head, over the middle tokens (outside the shared sink and local window):
proxy probabilities p = softmax of scores against compressed keys; the water-filling factor c
with #{c p_i >= 1} + sum_{c p_i < 1} c p_i = m (the middle budget), solved exactly on sorted p;
tokens with c p_i >= 1 are kept with weight 1 (the certainty stratum); the remaining budget
m' = m - |kept| is drawn with replacement proportional to p over the rest, duplicates counted once,
each drawn token weighted 1 / (1 - (1 - p_i / P_rest)^m') (Horvitz-Thompson); attention over the
selection with exact keys is softmax(s + log w) V.

Reconstructed: the proxy is a product quantization of the keys built at prefill (PQCache's own
defaults, 2 sub-vectors x 6 bits per head, so SSA and PQCache see the same proxy); a KV head's
query group shares one selection, its probabilities averaged over the group.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from claimbench.llm.sparse import KeyProxy, PQProxy, SparseAttention, draw_with_replacement, head_probs


def water_fill(p: Tensor, m: int) -> tuple[int, float]:
    """(t, c) for probabilities p sorted in decreasing order: the t largest have c p >= 1 and
    t + c * sum(p[t:]) == m. Requires 0 < m < len(p)."""
    n = p.shape[0]
    assert 0 < m < n, (m, n)
    p = p.double()
    suffix = p.flip(0).cumsum(0).flip(0)  # suffix[t] = sum(p[t:])
    t = torch.arange(0, m + 1, dtype=torch.double)
    c = (m - t) / suffix[: m + 1].clamp(min=1e-300)
    above = torch.cat([torch.ones(1, dtype=torch.bool), c[1:] * p[: m] >= 1])  # c p_{t-1} >= 1
    below = c * p[: m + 1] < 1  # c p_t < 1
    valid = (above & below).nonzero()
    if len(valid) == 0:  # numerically everything above the line: keep the top m
        return m, float("inf")
    first = int(valid[0])
    return first, float(c[first])


def ssa_select(p: Tensor, m: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """One KV head: (token ids, log weights) of the certainty stratum plus the sampled rest."""
    order = p.argsort(descending=True)
    t, _ = water_fill(p[order], m)
    kept = order[:t]
    rest = order[t:]
    if m - t <= 0 or len(rest) == 0:
        return kept, torch.zeros(len(kept))
    q = p[rest].double()
    q = (q / q.sum()).float()
    drawn, log_w = draw_with_replacement(q[None], m - t, gen)
    return torch.cat([kept, rest[drawn[0]]]), torch.cat([torch.zeros(len(kept)), log_w[0]])


@dataclass
class SSA(SparseAttention):
    proxy: KeyProxy = field(default_factory=PQProxy)
    name = "ssa"

    def __post_init__(self):
        self._gen = torch.Generator().manual_seed(self.seed)

    def select(self, layer, q, k, lo, hi, m):
        p = head_probs(q, self.proxy.keys(layer, k)[:, lo:hi])
        rows = [ssa_select(p[h].double() / p[h].double().sum(), m, self._gen) for h in range(p.shape[0])]
        width = max(len(i) for i, _ in rows)
        idx = torch.stack([torch.cat([i, i[:1].expand(width - len(i))]) for i, _ in rows])
        log_w = torch.stack([torch.cat([w, torch.full((width - len(w),), float("-inf"))]) for _, w in rows])
        return idx, log_w
