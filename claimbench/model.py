"""A compact Llama in torch (in the spirit of gpt-fast's model.py) with a hookable KV cache.

RMSNorm, RoPE in rotate-half layout (pair j is dims (j, j + head_dim/2)), grouped-query
attention, SwiGLU, tied embeddings. The KV cache keeps each entry's original position, so
entries can be dropped or kept without re-prefilling (agent cache engineering, KV eviction).
Hooks, each a context manager so methods compose the way kvpress's presses do:
- `model.attention_method(m)`: m.attend(layer, q, k, v) replaces decode attention (sparse
  selection with per-token weights); a second method while one is active raises.
- `cache.keep(idx)` / `cache.drop(idx)`: keep or drop entries, positions preserved.
- `model.capture_qk()`: q and k activations (after RoPE) per layer, for calibration.
- `model.swap_weights({name: tensor})`: sliced or quantized projection weights, restored after.
The default attention path is torch SDPA. Works in fp32 and bf16.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    max_seq_len: int = 8192
    tie_embeddings: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @classmethod
    def smollm2_135m(cls) -> "LlamaConfig":
        return cls(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536,
                   rope_theta=100_000.0, norm_eps=1e-5, max_seq_len=8192)

    @classmethod
    def tiny(cls) -> "LlamaConfig":
        """Same architecture, random weights, for fast unit tests."""
        return cls(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                   rope_theta=10_000.0, max_seq_len=1024)


class HookError(RuntimeError):
    """Two methods that cannot be active together."""


class KVCache:
    """Keys and values of every layer, (n_layers, B, n_kv_heads, capacity, head_dim), the first
    `length` entries valid, with the original position of each entry."""

    def __init__(self, config: LlamaConfig, batch: int = 1, capacity: int = 256, dtype=torch.float32,
                 device="cpu"):
        shape = (config.n_layers, batch, config.n_kv_heads, capacity, config.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.positions = torch.zeros(capacity, dtype=torch.long, device=device)
        self.length = 0
        self.next_position = 0  # positions keep counting after drops

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def reserve(self, n: int) -> tuple[int, Tensor]:
        """Room for n new entries at the end; returns (start, their positions)."""
        need = self.length + n
        if need > self.capacity:
            grow = max(need, 2 * self.capacity) - self.capacity
            pad = list(self.k.shape)
            pad[3] = grow
            self.k = torch.cat([self.k, self.k.new_zeros(pad)], dim=3)
            self.v = torch.cat([self.v, self.v.new_zeros(pad)], dim=3)
            self.positions = torch.cat([self.positions, self.positions.new_zeros(grow)])
        start = self.length
        pos = torch.arange(self.next_position, self.next_position + n, device=self.positions.device)
        self.positions[start:need] = pos
        self.length = need
        self.next_position += n
        return start, pos

    def write(self, layer: int, start: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store one layer's new keys/values at start; return that layer's valid keys/values."""
        end = start + k.shape[2]
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def keep(self, index: Tensor) -> None:
        """Keep only these entries (indices into the valid range), in order; nothing is recomputed."""
        index = torch.as_tensor(index, dtype=torch.long, device=self.positions.device).sort().values
        if len(index) and (index[0] < 0 or index[-1] >= self.length):
            raise IndexError(f"keep: indices must be in [0, {self.length})")
        n = len(index)
        self.k[:, :, :, :n] = self.k[:, :, :, :self.length].index_select(3, index)
        self.v[:, :, :, :n] = self.v[:, :, :, :self.length].index_select(3, index)
        self.positions[:n] = self.positions[:self.length][index]
        self.length = n

    def drop(self, index: Tensor) -> None:
        mask = torch.ones(self.length, dtype=torch.bool, device=self.positions.device)
        mask[torch.as_tensor(index, dtype=torch.long, device=mask.device)] = False
        self.keep(mask.nonzero().flatten())

    def clone(self) -> "KVCache":
        """An independent copy (e.g. one prefill shared by several decode-time methods)."""
        other = object.__new__(KVCache)
        other.k, other.v, other.positions = self.k.clone(), self.v.clone(), self.positions.clone()
        other.length, other.next_position = self.length, self.next_position
        return other

    def valid_positions(self) -> Tensor:
        return self.positions[:self.length]


def rope_cos_sin(positions: Tensor, inv_freq: Tensor, dtype) -> tuple[Tensor, Tensor]:
    freqs = positions.float()[:, None] * inv_freq[None, :]  # (T, head_dim/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (T, head_dim)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, H, T, head_dim), rotate-half layout."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def grouped_sdpa(q, k, v, **kw):
    """SDPA with fewer KV heads than query heads. The legacy ONNX exporter has no grouped-query
    SDPA, so under export the KV heads are repeated explicitly (same result)."""
    if torch.onnx.is_in_onnx_export():
        rep = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), **kw)
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        self.layer, self.config = layer, config
        hd = config.head_dim
        self.wq = nn.Linear(config.dim, config.n_heads * hd, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(config.n_heads * hd, config.dim, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None, start: int, hooks: "Hooks") -> Tensor:
        B, T, _ = x.shape
        c = self.config
        hd = c.head_dim
        q = self.wq(x).view(B, T, c.n_heads, hd).transpose(1, 2)  # (B, H, T, hd)
        k = self.wk(x).view(B, T, c.n_kv_heads, hd).transpose(1, 2)  # (B, Hkv, T, hd)
        v = self.wv(x).view(B, T, c.n_kv_heads, -1).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if hooks.captured is not None:
            hooks.captured.append((self.layer, q.detach(), k.detach()))
        past = 0
        if cache is not None:
            past = start
            k, v = cache.write(self.layer, start, k, v)
        if T == 1 and hooks.attention is not None:
            out = hooks.attention.attend(self.layer, q, k, v)
        elif T == 1 or past == 0:
            out = grouped_sdpa(q, k, v, is_causal=bool(T > 1))
        else:  # a chunk after cached entries: all of those, causal within the chunk
            mask = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(past)
            out = grouped_sdpa(q, k, v, attn_mask=mask)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))


class FeedForward(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(config.dim, config.ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(config.ffn_dim, config.dim, bias=False)  # down

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        self.attention_norm = RMSNorm(config.dim, config.norm_eps)
        self.attention = Attention(config, layer)
        self.ffn_norm = RMSNorm(config.dim, config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x, cos, sin, cache, start, hooks):
        x = x + self.attention(self.attention_norm(x), cos, sin, cache, start, hooks)
        return x + self.feed_forward(self.ffn_norm(x))


class Hooks:
    """What methods have plugged into a model; see the module docstring."""

    def __init__(self):
        self.attention = None
        self.captured: list | None = None


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        hd = config.head_dim
        self.register_buffer("inv_freq", 1.0 / config.rope_theta ** (torch.arange(0, hd, 2).float() / hd),
                             persistent=False)
        self.hooks = Hooks()

    def new_cache(self, batch: int = 1, capacity: int = 256) -> KVCache:
        p = self.tok_embeddings.weight
        return KVCache(self.config, batch, capacity, p.dtype, p.device)

    def forward(self, tokens: Tensor, cache: KVCache | None = None, last_only: bool = False) -> Tensor:
        """tokens (B, T) -> logits (B, T, vocab) (or (B, 1, vocab) with last_only).

        With a cache, the tokens continue it: their positions follow the cache's last position
        and they attend to every entry the cache holds.
        """
        B, T = tokens.shape
        if cache is not None:
            start, positions = cache.reserve(T)
        else:
            start, positions = 0, torch.arange(T, device=tokens.device)
        x = self.tok_embeddings(tokens)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        for block in self.layers:
            x = block(x, cos, sin, cache, start, self.hooks)
        if last_only:
            x = x[:, -1:]
        return self.output(self.norm(x))

    @contextmanager
    def attention_method(self, method):
        """Replace decode attention: method.attend(layer, q (B,H,1,hd), k, v (B,Hkv,n,hd)) -> (B,H,1,hd)."""
        if self.hooks.attention is not None:
            raise HookError(f"attention is already replaced by {self.hooks.attention!r}; "
                            f"{method!r} cannot be active at the same time")
        self.hooks.attention = method
        try:
            yield method
        finally:
            self.hooks.attention = None

    @contextmanager
    def capture_qk(self):
        """Collect (layer, q, k) after RoPE for every forward inside the block."""
        if self.hooks.captured is not None:
            raise HookError("q/k capture is already active")
        self.hooks.captured = []
        try:
            yield self.hooks.captured
        finally:
            self.hooks.captured = None

    @contextmanager
    def swap_weights(self, weights: dict[str, Tensor]):
        """Temporarily replace parameters by name (e.g. 'layers.3.attention.wq.weight')."""
        params = dict(self.named_parameters())
        missing = sorted(set(weights) - set(params))
        if missing:
            raise KeyError(f"no such parameter(s): {', '.join(missing)}")
        saved = {}
        for name, value in weights.items():
            module_name, _, attr = name.rpartition(".")
            module = self.get_submodule(module_name)
            saved[name] = getattr(module, attr)
            setattr(module, attr, nn.Parameter(value.to(saved[name].dtype), requires_grad=False))
        try:
            yield self
        finally:
            for name, value in saved.items():
                module_name, _, attr = name.rpartition(".")
                setattr(self.get_submodule(module_name), attr, value)


def dense_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Reference decode attention (B, H, 1, hd) over all of k, v (B, Hkv, n, hd), GQA by repetition."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return scores.softmax(-1) @ v


@torch.inference_mode()
def generate(model: Llama, prompt: Tensor, max_new_tokens: int, eos_id: int | None = None,
             cache: KVCache | None = None) -> Tensor:
    """Greedy decoding with the KV cache; returns the new token ids (1-D)."""
    cache = cache or model.new_cache(capacity=prompt.shape[-1] + max_new_tokens)
    logits = model(prompt.view(1, -1), cache, last_only=True)
    out = []
    for _ in range(max_new_tokens):
        token = logits[0, -1].argmax()
        out.append(token)
        if eos_id is not None and int(token) == eos_id:
            break
        logits = model(token.view(1, 1), cache)
    return torch.stack(out) if out else prompt.new_zeros(0)
