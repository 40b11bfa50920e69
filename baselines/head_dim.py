"""RACE's baselines (PAPERS.md B2), every one at the same number of cached key numbers per token.

- FullModel: no compression (retention 1).
- NormProduct: MHA2MLA's 2-norm pair rule, E[|q pair| |k pair|] summed over the KV head's query group.
- RandomPairs (per seed), FrequencyPairs ("high": the fastest-rotating pairs, "low": the slowest).
- ThinK: channel pruning that ignores the pairing. Per prompt, at prefill, each KV head scores its
  rotated key channels by the mean squared query over the prompt's last 32 queries (summed over
  the query group) times the mean squared key, and the cache keeps the top channels; later queries
  and keys are cut to the same channels. Its q/k projections and RoPE stay full width (the pruned
  channels are mixed by the rotation), and the prompt's own attention runs in full.
  Reconstructed: one channel set per KV head for every cached key (ThinK keeps recent keys whole).
- LowRankKeys (Palu-style): the cache stores an R-number latent per key and KV head, R equal to the
  kept width; every decode step rebuilds all cached keys from their latents, then applies RoPE at
  their positions. Reconstructed: the latent basis is the top-R principal directions of the
  calibration keys before RoPE (Palu's SVD of W_k, activation-aware), one per KV head, not Palu's
  grouped heads and Fisher-allocated ranks.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from claimbench.interfaces import HeadDimCompression, KeyShape
from claimbench.llm.headdim import PairSelection, PairStatistics, check_model, full_shape, kept_pairs
from claimbench.llm.model import Attention, Llama, LlamaConfig, apply_rope, rope_cos_sin


@dataclass
class FullModel(HeadDimCompression):
    name = "full"
    retention = 1.0

    def fit(self, model, statistics) -> None:
        pass

    def apply(self, model):
        return nullcontext(model)

    def key_shape(self, config: LlamaConfig) -> KeyShape:
        return full_shape(config)


@dataclass
class NormProduct(PairSelection):
    name = "2-norm"

    def scores(self, statistics: PairStatistics) -> Tensor:
        return statistics.norm_product


@dataclass
class RandomPairs(PairSelection):
    seed: int = 0

    def __post_init__(self):
        self.name = f"random-{self.seed}"

    def scores(self, statistics: PairStatistics) -> Tensor:
        return torch.rand(statistics.key_energy.shape, generator=torch.Generator().manual_seed(self.seed))


@dataclass
class FrequencyPairs(PairSelection):
    band: str = "low"  # pair j rotates at theta^(-2j/head_dim): "high" keeps the first pairs, "low" the last

    def __post_init__(self):
        if self.band not in ("high", "low"):
            raise ValueError(f"band must be 'high' or 'low'; got {self.band!r}")
        self.name = f"{self.band}-frequency"

    def scores(self, statistics: PairStatistics) -> Tensor:
        j = torch.arange(statistics.key_energy.shape[-1], dtype=torch.float32).expand_as(statistics.key_energy)
        return -j if self.band == "high" else j


class _WrappedAttention(Attention):
    """An attention layer sharing another's projections (nothing copied)."""

    def __init__(self, original: Attention):
        nn.Module.__init__(self)
        self.layer, self.config, self.rope_index, self.fused = original.layer, original.config, None, original.fused
        self.wq, self.wk, self.wv, self.wo = original.wq, original.wk, original.wv, original.wo

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Full-width q, k after RoPE, and v."""
        B, T, _ = x.shape
        c = self.config
        q = self.wq(x).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v


class _ThinKAttention(_WrappedAttention):
    def __init__(self, original: Attention, channels: int, window: int):
        super().__init__(original)
        self.channels, self.window = channels, window
        self.kept: Tensor | None = None  # (Hkv, channels), chosen at the prompt's prefill

    @property
    def qk_dim(self) -> int:
        return self.channels

    def forward(self, x, cos, sin, cache, positions, hooks):
        q, k, v = self.project(x, cos, sin)
        if cache is None:  # nothing is cached: ThinK has nothing to prune
            return self.attend(q, k, v, None, positions, hooks)
        group = self.config.n_heads // self.config.n_kv_heads
        if cache.lengths[self.layer] == 0:  # the prompt: choose channels, attend in full, cache the kept ones
            recent = q[0, :, -self.window:].pow(2).mean(1).view(self.config.n_kv_heads, group, -1).sum(1)
            score = recent * k[0].pow(2).mean(1)  # (Hkv, head_dim)
            self.kept = score.topk(self.channels, dim=-1).indices.sort(-1).values
            out = self.attend(q, k, v, None, positions, hooks)
            cache.append(self.layer, self._cut(k, self.kept), v, positions)
            return out
        return self.attend(self._cut(q, self.kept.repeat_interleave(group, 0)), self._cut(k, self.kept), v, cache,
                           positions, hooks)

    @staticmethod
    def _cut(x: Tensor, channels: Tensor) -> Tensor:  # x (B, heads, T, head_dim), channels (heads, m)
        return x.gather(-1, channels[None, :, None, :].expand(x.shape[0], -1, x.shape[2], -1))


@dataclass
class ThinK(HeadDimCompression):
    name = "think"
    retention: float = 0.5
    window: int = 32  # the prompt's last queries that score the channels

    def fit(self, model, statistics) -> None:
        check_model(model)
        kept_pairs(self.retention, model.config)  # the same widths as the pair rules

    def apply(self, model: Llama):
        channels = self.key_shape(model.config).cached
        return model.swap_modules({f"layers.{b.attention.layer}.attention": _ThinKAttention(b.attention, channels,
                                                                                            self.window)
                                   for b in model.layers})

    def key_shape(self, config: LlamaConfig) -> KeyShape:
        width = 2 * kept_pairs(self.retention, config)
        return KeyShape(query_projection=config.head_dim, key_projection=config.head_dim, score=width, cached=width)


class _LowRankKeyAttention(_WrappedAttention):
    def __init__(self, original: Attention, down: nn.Linear, up: Tensor, inv_freq: Tensor):
        super().__init__(original)
        self.down, self.inv_freq = down, inv_freq
        self.register_buffer("up", up, persistent=False)  # (Hkv, head_dim, R)

    @property
    def qk_dim(self) -> int:
        return self.up.shape[-1]

    def forward(self, x, cos, sin, cache, positions, hooks):
        B, T, _ = x.shape
        c = self.config
        q = apply_rope(self.wq(x).view(B, T, c.n_heads, c.head_dim).transpose(1, 2), cos, sin)
        latent = self.down(x).view(B, T, c.n_kv_heads, self.qk_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        k = None if cache is not None else self.expand_keys(latent, positions)
        return self.attend(q, k, v, cache, positions, hooks, stored=latent)

    def expand_keys(self, stored: Tensor, positions: Tensor) -> Tensor:
        """Every cached key rebuilt from its latent, then rotated at its position: the decode-time tax."""
        keys = torch.einsum("bhtr,hdr->bhtd", stored, self.up)
        cos, sin = rope_cos_sin(positions, self.inv_freq, keys.dtype)
        return apply_rope(keys, cos, sin)


@dataclass
class LowRankKeys(HeadDimCompression):
    name = "low-rank"
    retention: float = 0.5
    bases: dict[int, Tensor] = field(default_factory=dict, init=False, repr=False)  # layer -> (Hkv, head_dim, R)

    def fit(self, model: Llama, statistics: PairStatistics) -> None:
        check_model(model)
        rank = self.key_shape(model.config).cached
        _, eigenvectors = torch.linalg.eigh(statistics.key_covariance.double())  # eigenvalues ascending
        self.bases = {layer: eigenvectors[layer, :, :, -rank:].float() for layer in range(model.config.n_layers)}

    def apply(self, model: Llama):
        if not self.bases:
            raise RuntimeError("low-rank: fit it on calibration statistics first")
        c = model.config
        swaps = {}
        for block in model.layers:
            attention, up = block.attention, self.bases[block.attention.layer]
            w = attention.wk.weight.view(c.n_kv_heads, c.head_dim, c.dim)
            down = nn.Linear(c.dim, c.n_kv_heads * up.shape[-1], bias=False, dtype=w.dtype, device=w.device)
            down.weight.data.copy_(torch.einsum("hdr,hdi->hri", up.to(w.dtype), w).reshape(-1, c.dim))
            swaps[f"layers.{attention.layer}.attention"] = _LowRankKeyAttention(attention, down, up.to(w.dtype),
                                                                               model.inv_freq)
        return model.swap_modules(swaps)

    def key_shape(self, config: LlamaConfig) -> KeyShape:
        rank = 2 * kept_pairs(self.retention, config)
        return KeyShape(query_projection=config.head_dim, key_projection=rank, score=config.head_dim, cached=rank,
                        reconstruct_rank=rank)
