"""What every sparse decode-attention method shares (SSA and its baselines alike): the budget
split (sink + local + chosen middle), attention over a weighted selection, and the key proxies
(compressed keys built once per layer at the first decode step).

The budget is max(sink + local + 1, n / sparsity) tokens; at 50x on 4,096 tokens that is 81, of
which 61 are chosen. Selection is per KV head; a KV head's query group shares one selection, its
proxy probabilities averaged over the group. Attention over the selection is softmax(s + log w) V
(weights 1 for kept tokens). Proxies: PQProxy (PQCache's product quantization, its defaults of 2
sub-vectors x 6 bits per head), LowRankProxy (Loki-style principal directions), ExactProxy (the limit).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from claimbench.interfaces import DecodeAttention
from claimbench.llm.model import dense_attention


def weighted_attention(q: Tensor, k: Tensor, v: Tensor, index: Tensor, log_w: Tensor) -> Tensor:
    """Decode attention over selected tokens: q (B, H, 1, d); k, v (B, Hkv, n, d);
    index (Hkv, m) token ids per KV head; log_w (Hkv, m). Returns (B, H, 1, d)."""
    B, H, _, d = q.shape
    hkv = k.shape[1]
    group = H // hkv
    idx = index[None, :, :, None].expand(B, hkv, index.shape[1], d)
    ks = k.gather(2, idx).repeat_interleave(group, 1)  # (B, H, m, d)
    vs = v.gather(2, idx).repeat_interleave(group, 1)
    scores = (q @ ks.transpose(-1, -2)) / math.sqrt(d) + log_w.repeat_interleave(group, 0)[None, :, None, :]
    return scores.softmax(-1) @ vs


def head_probs(q: Tensor, keys: Tensor) -> Tensor:
    """softmax(q k / sqrt d) averaged over each KV head's query group: (Hkv, n). q (B=1, H, 1, d), keys (Hkv, n, d)."""
    H, hkv = q.shape[1], keys.shape[0]
    qg = q[0, :, 0].view(hkv, H // hkv, -1)  # (Hkv, group, d)
    s = (qg @ keys.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (Hkv, group, n)
    return s.softmax(-1).mean(1)


@dataclass
class SparseAttention(DecodeAttention):
    """Base: the budget split and the attention over [sink, chosen middle, local]."""
    sparsity: float = 50.0
    sink: int = 4
    local: int = 16
    seed: int = 0
    name = "sparse"
    selected: list[int] = field(default_factory=list, init=False, repr=False)  # tokens attended, per call

    def budget(self, n: int) -> int:
        return max(self.sink + self.local + 1, int(n / self.sparsity))

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        n = k.shape[2]
        budget = self.budget(n)
        if budget >= n:
            return dense_attention(q, k, v)
        lo, hi = self.sink, n - self.local
        chosen, log_w = self.select(layer, q, k, lo, hi, budget - self.sink - self.local)
        hkv = k.shape[1]
        fixed = torch.cat([torch.arange(lo), torch.arange(hi, n)]).expand(hkv, -1)
        index = torch.cat([fixed, chosen + lo], 1)
        weights = torch.cat([torch.zeros(fixed.shape), log_w], 1).to(q.dtype)
        self.selected.append(int(index.shape[1]))
        return weighted_attention(q, k, v, index, weights)

    def select(self, layer, q, k, lo, hi, m) -> tuple[Tensor, Tensor]:
        """(Hkv, <= m) middle-token offsets (from lo) and their log weights."""
        raise NotImplementedError


def kmeans(x: Tensor, k: int, iters: int, gen: torch.Generator) -> Tensor:
    """Batched k-means: x (G, n, d) -> centroids (G, k, d)."""
    G, n, _ = x.shape
    cent = x[:, torch.randperm(n, generator=gen)[:k]].clone()
    for _ in range(iters):
        assign = torch.cdist(x, cent).argmin(-1)  # (G, n)
        onehot = torch.zeros(G, n, cent.shape[1]).scatter_(2, assign[..., None], 1.0)
        counts = onehot.sum(1)[..., None]
        new = onehot.transpose(1, 2) @ x / counts.clamp(min=1)
        cent = torch.where(counts > 0, new, cent)
    return cent


@dataclass
class PQProxy:
    """Product-quantized keys per (layer, KV head): codebooks built at the first decode step from
    the prefill's keys (all but the step's own), every key encoded with them as it comes.

    `shared` (a dict the caller owns, e.g. one per prefill) lets proxies of the same settings reuse
    one another's codebooks and prefill codes: a proxy takes them only where its prefill keys are
    equal to those they were built from, so the numbers are the ones it would have built itself
    (SSA, PQCache and importance sampling decode from one prefill: k-means once, not three times)."""
    subvectors: int = 2
    bits: int = 6
    iters: int = 10
    seed: int = 0
    shared: dict | None = field(default=None, repr=False)
    _books: dict = field(default_factory=dict, repr=False)

    def keys(self, layer: int, k: Tensor) -> Tensor:
        """Reconstructed keys (Hkv, n, d) from the PQ codes."""
        kk = k[0].float()  # (Hkv, n, d)
        hkv, n, d = kk.shape
        sub = kk.view(hkv, n, self.subvectors, d // self.subvectors).transpose(1, 2).reshape(hkv * self.subvectors, n, -1)
        if layer not in self._books:
            self._books[layer] = self._built(layer, sub[:, :-1] if n > 1 else sub)
        books, codes = self._books[layer]
        if codes.shape[1] < n:  # encode keys the codes do not cover yet
            new = torch.cdist(sub[:, codes.shape[1]:], books).argmin(-1)
            codes = self._books[layer][1] = torch.cat([codes, new], 1)
        recon = books.gather(1, codes[:, :n, None].expand(-1, -1, books.shape[-1]))
        return recon.view(hkv, self.subvectors, n, -1).transpose(1, 2).reshape(hkv, n, d)

    def _built(self, layer: int, sub: Tensor) -> list[Tensor]:
        """[codebooks, codes of sub] for a layer's prefill keys: from `shared` where they were built
        from equal keys with these settings, else k-means (then offered to `shared`)."""
        key = (layer, self.subvectors, self.bits, self.iters, self.seed)
        if self.shared is not None and key in self.shared and torch.equal(self.shared[key][0], sub):
            return list(self.shared[key][1:])
        gen = torch.Generator().manual_seed(self.seed + layer)
        books = kmeans(sub, min(2 ** self.bits, sub.shape[1]), self.iters, gen)
        codes = torch.cdist(sub, books).argmin(-1)
        if self.shared is not None:
            self.shared[key] = (sub.clone(), books, codes)
        return [books, codes]


@dataclass
class LowRankProxy:
    """Keys projected on their top `rank` principal directions per (layer, KV head), the mean and
    directions fitted on the keys present at the first decode step (the prefill) and applied to
    later keys alike: `rank` numbers per key. Loki-style low-rank keys (Singhania et al., 2024),
    reconstructed here as a proxy the methods share (Loki fits its PCA offline)."""
    rank: int = 8
    _bases: dict = field(default_factory=dict, repr=False)

    def keys(self, layer: int, k: Tensor) -> Tensor:
        """Reconstructed keys (Hkv, n, d): mean + the projection of k - mean on the directions."""
        kk = k[0].float()  # (Hkv, n, d)
        if layer not in self._bases:
            mean = kk.mean(1, keepdim=True)
            cov = (kk - mean).transpose(1, 2) @ (kk - mean)  # (Hkv, d, d)
            directions = torch.linalg.eigh(cov.double()).eigenvectors[..., -self.rank:].float()  # largest last
            self._bases[layer] = mean, directions
        mean, directions = self._bases[layer]
        return mean + (kk - mean) @ directions @ directions.transpose(1, 2)


@dataclass
class ExactProxy:
    """The exact keys as the proxy: the limit a finer compression approaches (not practical)."""

    def keys(self, layer: int, k: Tensor) -> Tensor:
        return k[0].float()


KeyProxy = PQProxy | LowRankProxy | ExactProxy  # keys(layer, k) -> the compressed keys, reconstructed


def draw_with_replacement(p: Tensor, m: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """m draws per row proportional to p (rows sum to 1); unique tokens and their log HT weights
    1/(1 - (1 - p_i)^m). Rows are padded with their first token at weight 0 (log w = -inf)."""
    draws = torch.multinomial(p, m, replacement=True, generator=gen)  # (R, m)
    rows = []
    for r in range(p.shape[0]):
        uniq = draws[r].unique()
        incl = 1 - (1 - p[r, uniq].double()) ** m
        rows.append((uniq, (-incl.log()).float()))
    width = max(len(u) for u, _ in rows)
    idx = torch.stack([torch.cat([u, u[:1].expand(width - len(u))]) for u, _ in rows])
    log_w = torch.stack([torch.cat([w, torch.full((width - len(w),), -math.inf)]) for _, w in rows])
    return idx, log_w
