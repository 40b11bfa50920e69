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

import math
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


def ssa_select_batched(p: Tensor, m: int, gen: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """ssa_select for every row of p (R, n; rows sum to 1) at once, on p's device and without a host
    sync, as a GPU decode step runs it: the top m + 1 probabilities give each row's water-filling t
    (water_fill's equation); m draws per row of which the first m - t count; duplicates, unused draws
    and the kept tokens' unused slots are padding (log w = -inf); each row compacted to width m. gen
    None: torch's default generator (the one a CUDA graph can capture)."""
    rows, n = p.shape
    assert 0 < m < n, (m, n)
    top, order = p.topk(m + 1, dim=-1)  # descending
    top = top.double()
    before = torch.cat([torch.zeros_like(top[:, :1]), top.cumsum(-1)[:, :-1]], -1)
    suffix = p.double().sum(-1, keepdim=True) - before  # suffix[:, t] = sum of p below the t largest
    c = (m - torch.arange(m + 1, device=p.device, dtype=torch.double)) / suffix.clamp(min=1e-300)
    above = torch.cat([torch.ones_like(top[:, :1], dtype=torch.bool), c[:, 1:] * top[:, :-1] >= 1], -1)
    solved = above & (c * top < 1)
    t = torch.where(solved.any(-1), solved.int().argmax(-1), m)  # first solution; none: keep the top m
    slots = torch.arange(m, device=p.device)
    kept = slots[None] < t[:, None]
    rest = p.scatter(-1, order[:, :m], top[:, :m].to(p.dtype) * ~kept)  # the kept tokens' p set to 0
    rest_share = rest / rest.sum(-1, keepdim=True)
    draws = torch.multinomial(rest_share, m, replacement=True, generator=gen)
    draws = torch.where(slots[None] < (m - t)[:, None], draws, n).sort(-1).values  # n: an unused draw
    first = torch.cat([torch.ones_like(draws[:, :1], dtype=torch.bool), draws[:, 1:] != draws[:, :-1]], -1)
    drawn = draws.clamp(max=n - 1)
    inclusion = 1 - (1 - rest_share.gather(-1, drawn).double()) ** (m - t)[:, None]
    log_w_drawn = torch.where(first & (draws < n), -inclusion.log(), -math.inf).float()
    index = torch.cat([order[:, :m], drawn], -1)
    log_w = torch.cat([torch.where(kept, 0.0, -math.inf), log_w_drawn], -1)
    compact = (log_w == -math.inf).to(torch.int8).argsort(dim=-1, stable=True)[:, :m]
    return index.gather(-1, compact), log_w.gather(-1, compact)


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
