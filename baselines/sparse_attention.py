"""SSA's baselines at the same fixed token budget (the shared split and proxies: claimbench.llm.sparse).

Every method keeps the same `sink` first tokens and `local` last tokens and picks the rest of its
budget from the middle; it is applied through the model's attention hook
(`with model.attention_method(method)`), so it acts at decode only.
Methods: Dense, OracleTopK (exact scores), PQCache (top-k by product-quantization scores:
PQCache's defaults of 2 sub-vectors x 6 bits per head; its default sink/recent sizes of 32/32
are replaced by the shared split), Quest (pages of 16 tokens ranked by the per-channel min/max
upper bound), ImportanceSampling (draws proportional to the proxy, Horvitz-Thompson weights,
no certainty stratum: MagicPIG/vAttention-style).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from claimbench.llm.model import dense_attention
from claimbench.llm.sparse import KeyProxy, PQProxy, SparseAttention, draw_with_replacement, head_probs


@dataclass
class Dense(SparseAttention):
    name = "dense"

    def attend(self, layer, q, k, v):
        self.selected.append(k.shape[2])
        return dense_attention(q, k, v)


def top_k(scores: Tensor, m: int) -> tuple[Tensor, Tensor]:
    idx = scores.topk(min(m, scores.shape[-1]), dim=-1).indices
    return idx, torch.zeros(idx.shape)


@dataclass
class OracleTopK(SparseAttention):
    name = "oracle-top-k"

    def select(self, layer, q, k, lo, hi, m):
        return top_k(head_probs(q, k[0, :, lo:hi]), m)


@dataclass
class PQCache(SparseAttention):
    proxy: KeyProxy = field(default_factory=PQProxy)
    name = "pqcache"

    def select(self, layer, q, k, lo, hi, m):
        return top_k(head_probs(q, self.proxy.keys(layer, k)[:, lo:hi]), m)


@dataclass
class Quest(SparseAttention):
    page: int = 16
    name = "quest"

    def select(self, layer, q, k, lo, hi, m):
        keys = k[0, :, lo:hi].float()  # (Hkv, n, d)
        hkv, n, d = keys.shape
        pages = math.ceil(n / self.page)
        pad = pages * self.page - n
        padded = torch.cat([keys, keys[:, -1:].expand(hkv, pad, d)], 1).view(hkv, pages, self.page, d)
        kmin, kmax = padded.amin(2), padded.amax(2)  # (Hkv, pages, d)
        qg = q[0, :, 0].float().view(hkv, -1, d)  # (Hkv, group, d)
        bound = torch.maximum(qg[:, :, None] * kmin[:, None], qg[:, :, None] * kmax[:, None]).sum(-1).amax(1)
        n_pages = max(1, m // self.page)
        top = bound.topk(min(n_pages, pages), -1).indices  # (Hkv, n_pages)
        tokens = (top[..., None] * self.page + torch.arange(self.page)).flatten(1)
        tokens = tokens.clamp(max=n - 1).sort(-1).values
        keep = torch.cat([torch.ones(hkv, 1, dtype=torch.bool), tokens[:, 1:] != tokens[:, :-1]], 1)
        width = int(keep.sum(1).min())  # the clamped last page may repeat a token: drop repeats
        tokens = torch.stack([row[mask][:width] for row, mask in zip(tokens, keep)])
        return tokens, torch.zeros(tokens.shape)


@dataclass
class ImportanceSampling(SparseAttention):
    proxy: KeyProxy = field(default_factory=PQProxy)
    name = "importance-sampling"

    def __post_init__(self):
        self._gen = torch.Generator().manual_seed(self.seed)

    def select(self, layer, q, k, lo, hi, m):
        p = head_probs(q, self.proxy.keys(layer, k)[:, lo:hi]).double()
        return draw_with_replacement((p / p.sum(-1, keepdim=True)).float(), m, self._gen)
