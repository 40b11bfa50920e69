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


@dataclass
class PQBuckets:
    """Every KV head's tokens bucketed by their PQ code (all S sub-vectors' codes as one number),
    built once at prefill: a token's proxy probability depends on its code alone, so SSA's selection
    can work over the K^S codes instead of the n tokens (`ssa_select_pq`). Reconstructed (not in the
    paper's digest): the buckets, and keeping them as new tokens arrive, which a step's time leaves out.
    books (Hkv * S, K, d / S) and codes (Hkv * S, n) as PQProxy keeps them."""
    books: Tensor
    order: Tensor  # (Hkv, n) token ids sorted by code
    starts: Tensor  # (Hkv, K^S + 1): code c's tokens are order[:, starts[c]:starts[c + 1]]

    @classmethod
    def build(cls, books: Tensor, codes: Tensor, subvectors: int) -> "PQBuckets":
        per_book = books.shape[1]
        assert per_book ** subvectors <= 2 ** 16, f"{per_book}^{subvectors} codes: too many to bucket"
        hkv = codes.shape[0] // subvectors
        code = torch.zeros_like(codes[:hkv])
        for sub in range(subvectors):
            code = code * per_book + codes.view(hkv, subvectors, -1)[:, sub]
        counts = torch.stack([row.bincount(minlength=per_book ** subvectors) for row in code])
        starts = torch.cat([torch.zeros_like(counts[:, :1]), counts.cumsum(-1)], -1)
        return cls(books, code.argsort(dim=-1, stable=True), starts)

    def code_probs(self, q: Tensor) -> Tensor:
        """(Hkv, K^S): head_probs(q, the reconstructed keys) of a token with each code; the softmax's
        sum over the tokens is one over the codes, each counted as often as tokens carry it."""
        H, d = q.shape[1], q.shape[-1]
        hkv, per_book, sub_dim = self.order.shape[0], self.books.shape[1], self.books.shape[-1]
        subvectors = d // sub_dim
        qs = q[0, :, 0].float().view(hkv, H // hkv, subvectors, sub_dim)
        books = self.books.float().view(hkv, subvectors, per_book, sub_dim)
        table = torch.einsum("hgsc,hskc->hgsk", qs, books) / math.sqrt(d)  # (Hkv, group, S, K)
        scores = table[:, :, 0]
        for sub in range(1, subvectors):  # every combination of the sub-vectors' codewords
            scores = (scores[..., :, None] + table[:, :, sub, None, :]).flatten(-2)
        counts = self.starts.diff(dim=-1)[:, None]
        weights = (scores - scores.max(-1, keepdim=True).values).exp()
        return (weights / (weights * counts).sum(-1, keepdim=True)).mean(1)


def ssa_select_pq(buckets: PQBuckets, q: Tensor, m: int, gen: torch.Generator | None = None
                  ) -> tuple[Tensor, Tensor]:
    """ssa_select for every KV head at once from the PQ proxy, without a host sync (a GPU decode step):
    water_fill's equation solved over the codes sorted by probability (tokens sharing a code share a
    probability, so the certainty stratum is whole codes), m draws per head of which the first m - t
    count (a code by its probability mass, then a token of it uniformly); duplicates, unused draws and
    the certainty stratum's unused slots are padding (log w = -inf); each row compacted to width m.
    gen None: torch's default generator (the one a CUDA graph can capture)."""
    probs = buckets.code_probs(q)
    counts = buckets.starts.diff(dim=-1)
    n = buckets.order.shape[1]
    assert 0 < m < n, (m, n)
    probs = torch.where(counts > 0, probs, 0.0)  # codes no token carries sort last
    sorted_probs, rank = probs.double().sort(-1, descending=True)
    sorted_counts = counts.gather(-1, rank)
    mass = sorted_probs * sorted_counts
    zero = torch.zeros_like(mass[:, :1])
    tokens_before = torch.cat([zero, sorted_counts.cumsum(-1).double()], -1)  # t at each code boundary
    suffix = mass.sum(-1, keepdim=True) - torch.cat([zero, mass.cumsum(-1)], -1)
    c = (m - tokens_before) / suffix.clamp(min=1e-300)
    after = torch.cat([sorted_probs, zero], -1)
    above = torch.cat([torch.ones_like(zero, dtype=torch.bool), c[:, 1:] * sorted_probs >= 1], -1)
    solved = above & (c * after < 1) & (tokens_before <= m)
    boundary = solved.int().argmax(-1)
    t = torch.where(solved.any(-1), tokens_before.gather(-1, boundary[:, None])[:, 0].long(), m)
    slots = torch.arange(m, device=probs.device)

    def token(code_rank, within):  # the `within`-th token of the code at `code_rank` in sorted order
        code = rank.gather(-1, code_rank)
        return buckets.order.gather(-1, buckets.starts.gather(-1, code) + within)
    kept_rank = torch.searchsorted(tokens_before[:, 1:].contiguous(), slots.double().expand(len(t), m).contiguous(),
                                   right=True).clamp(max=rank.shape[1] - 1)
    kept = token(kept_rank, slots - tokens_before.gather(-1, kept_rank).long())
    rest_mass = torch.where(torch.arange(mass.shape[1], device=mass.device)[None] >= boundary[:, None], mass, 0.0)
    cdf = rest_mass.cumsum(-1)
    draw_rank = torch.searchsorted(cdf, torch.rand(len(t), m, generator=gen, device=probs.device, dtype=torch.double)
                                   * cdf[:, -1:], right=True).clamp(max=rank.shape[1] - 1)
    draw_counts = sorted_counts.gather(-1, draw_rank)
    within = (torch.rand(len(t), m, generator=gen, device=probs.device) * draw_counts).long()
    drawn = token(draw_rank, torch.minimum(within, draw_counts - 1))
    share = sorted_probs.gather(-1, draw_rank) / cdf[:, -1:]  # p_i / P_rest
    drawn = torch.where(slots[None] < (m - t)[:, None], drawn, n)  # n: an unused draw
    drawn, by_token = drawn.sort(-1)
    share = share.gather(-1, by_token)
    first = torch.cat([torch.ones_like(drawn[:, :1], dtype=torch.bool), drawn[:, 1:] != drawn[:, :-1]], -1)
    inclusion = 1 - (1 - share) ** (m - t)[:, None]
    log_w_drawn = torch.where(first & (drawn < n), -inclusion.log(), -math.inf).float()
    index = torch.cat([kept, drawn.clamp(max=n - 1)], -1)
    log_w = torch.cat([torch.where(slots[None] < t[:, None], 0.0, -math.inf), log_w_drawn], -1)
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
