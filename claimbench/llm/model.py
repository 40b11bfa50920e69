"""A compact Llama in torch (in the spirit of gpt-fast's model.py) with a hookable KV cache.

RMSNorm, RoPE in rotate-half layout (pair j is dims (j, j + head_dim/2)), grouped-query
attention, SwiGLU, tied embeddings; fp32 and bf16. The KV cache keeps each entry's original
position, so entries can be dropped, kept or rewound without re-prefilling.
Hook points, each a context manager; they compose the way kvpress's presses do (every point
but decode attention chains in the order entered):
- `model.attention_method(m)`: m.attend(layer, q, k, v) replaces decode attention (exclusive);
- `model.select_tokens(s)`: prefill rows kept after each layer (GemFilter, FastKV, TokenGate);
- `model.swap_modules({name: module}, trainable=...)`: quantized, sparse or trainable modules;
- `model.capture_qk()`: q and k after RoPE per layer, for calibration;
- `model.attention_kernel("plain")`: attention in plain torch ops instead of fused SDPA (timing);
- `model.slice_qk({layer: pairs})`: the rotary pairs q/k keep per layer and KV head (RACE's sliced
  projections; an attention module of one's own goes in with `swap_modules`);
- `cache.keep(idx)` / `cache.drop(idx)` / `cache.truncate(position)`: edit the cache in place.
`model.hidden_states(tokens, cache, layers=n)` is forward without the LM head, optionally of the first n
blocks only (drafters read it; an early exit drafts with it). `model.train_forward(tokens, positions, mask)`
is the training pass over packed or padded rows
(ATTUNE's training jobs): per-row positions, a per-document mask, optional activation checkpointing.
"""
from __future__ import annotations

import hashlib
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn

from claimbench.interfaces import InputError


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
    rope_layout: str = "rotate-half"  # pair j is dims (j, j + head_dim/2); the only layout implemented

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @classmethod
    def smollm2_135m(cls) -> "LlamaConfig":
        return cls(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, ffn_dim=1536,
                   rope_theta=100_000.0, norm_eps=1e-5, max_seq_len=8192)

    @classmethod
    def llama32_3b(cls) -> "LlamaConfig":
        """Llama-3.2-3B's published shapes (its config.json), for analytic FLOPs only: no weights here."""
        return cls(vocab_size=128256, dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, ffn_dim=8192,
                   rope_theta=500_000.0, max_seq_len=131072)

    @classmethod
    def tiny(cls) -> "LlamaConfig":
        """Same architecture, random weights, for fast unit tests."""
        return cls(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128,
                   rope_theta=10_000.0, max_seq_len=1024)


def model_digest(model: nn.Module) -> str:
    """sha256 over the model's configuration and weights: whatever was trained for one model (gates,
    drafters) refuses another."""
    digest = hashlib.sha256(repr(getattr(model, "config", None)).encode())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().float().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def save_for_model(path: Path, model: nn.Module, **payload) -> Path:
    """Save what was trained for `model` (gates, drafter heads) with the model's digest."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model_digest": model_digest(model), **payload}, path)
    return path


def load_for_model(path: Path, model: nn.Module, what: str) -> dict:
    """What save_for_model stored; InputError when it was trained for another model."""
    saved = torch.load(path, weights_only=True)
    here = model_digest(model)
    if saved["model_digest"] != here:
        raise InputError(f"{path}: {what} trained for model {saved['model_digest'][:12]}, not this one ({here[:12]}); "
                         f"train them for this model")
    return saved


def check_window(model: "Llama", ids, room: int) -> None:
    """InputError unless a prompt of len(ids) tokens and `room` more fit the model's window."""
    if len(ids) + room > model.config.max_seq_len:
        raise InputError(f"a prompt of {len(ids)} tokens (+{room} to decode) is longer than the model's window "
                         f"of {model.config.max_seq_len}")


class HookError(RuntimeError):
    """Two methods that cannot be active together; the message names both."""


class KVCache:
    """Keys and values per layer, k (B, n_kv_heads, capacity, qk_dim of the layer) and v
    (B, n_kv_heads, capacity, head_dim), the first `lengths[layer]` entries valid, with the original
    position of each entry. Layers hold the same entries unless a prefill token selection dropped
    rows after some layer (then later layers hold fewer).

    A layer's buffers are allocated at its first entries: room for them plus the spare the cache's
    first entries left of `capacity` (the decode room), so a layer a selection pruned holds only what
    reaches it, as a paged cache would; without a selection every layer gets `capacity`, doubling when
    it overflows."""

    def __init__(self, config: LlamaConfig, batch: int = 1, capacity: int = 256, dtype=torch.float32,
                 device="cpu", qk_dims: list[int] | None = None):
        qk_dims = qk_dims or [config.head_dim] * config.n_layers
        self.k = [torch.zeros(batch, config.n_kv_heads, 0, d, dtype=dtype, device=device) for d in qk_dims]
        self.v = [torch.zeros(batch, config.n_kv_heads, 0, config.head_dim, dtype=dtype, device=device)
                  for _ in qk_dims]
        self.positions = [torch.zeros(0, dtype=torch.long, device=device) for _ in qk_dims]
        self.lengths = [0] * len(qk_dims)
        self.next_position = 0  # positions keep counting after drops
        self.capacity, self.spare = capacity, None  # spare: set by the cache's first entries

    @property
    def length(self) -> int:
        """Entries held (the same in every layer; see `lengths` after a prefill token selection)."""
        if len(set(self.lengths)) > 1:
            raise ValueError(f"layers hold different numbers of entries ({min(self.lengths)}-{max(self.lengths)}) "
                             "after a prefill token selection; read cache.lengths")
        return self.lengths[0]

    def new_positions(self, n: int) -> Tensor:
        """Positions for n new tokens, after every position handed out so far."""
        positions = torch.arange(self.next_position, self.next_position + n, device=self.positions[0].device)
        self.next_position += n
        return positions

    def append(self, layer: int, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Store one layer's new keys/values (their positions given); return that layer's valid
        keys, values and key positions."""
        start, n = self.lengths[layer], k.shape[2]
        end = start + n
        if self.spare is None:
            self.spare = max(self.capacity - n, 0)
        if end > self.k[layer].shape[2]:
            size = max(end, 2 * self.k[layer].shape[2]) if self.k[layer].shape[2] else end + self.spare
            self.k[layer], self.v[layer], self.positions[layer] = (
                _grown(buffer, size, dim) for buffer, dim in
                ((self.k[layer], 2), (self.v[layer], 2), (self.positions[layer], 0)))
        self.k[layer][:, :, start:end] = k
        self.v[layer][:, :, start:end] = v
        self.positions[layer][start:end] = positions
        self.lengths[layer] = end
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end], self.positions[layer][:end]

    def keep(self, index: Tensor, layer: int | None = None) -> None:
        """Keep only these entries (indices into the valid range, the same in every layer, or of one
        layer), in order; nothing is recomputed."""
        length = self.length if layer is None else self.lengths[layer]
        index = torch.as_tensor(index, dtype=torch.long, device=self.positions[0].device).sort().values
        if len(index) and (index[0] < 0 or index[-1] >= length):
            raise IndexError(f"keep: indices must be in [0, {length})")
        n = len(index)
        for layer in range(len(self.lengths)) if layer is None else [layer]:
            self.k[layer][:, :, :n] = self.k[layer][:, :, :length].index_select(2, index)
            self.v[layer][:, :, :n] = self.v[layer][:, :, :length].index_select(2, index)
            self.positions[layer][:n] = self.positions[layer][:length][index]
            self.lengths[layer] = n

    def drop(self, index: Tensor) -> None:
        mask = torch.ones(self.length, dtype=torch.bool, device=self.positions[0].device)
        mask[torch.as_tensor(index, dtype=torch.long, device=mask.device)] = False
        self.keep(mask.nonzero().flatten())

    def truncate(self, position: int) -> None:
        """Forget every entry at `position` or later, in every layer, and continue from there
        (speculative decoding rewinds to the last accepted token this way)."""
        if not 0 <= position <= self.next_position:
            raise IndexError(f"truncate: position must be in [0, {self.next_position}]; got {position}")
        for layer, length in enumerate(self.lengths):
            self.lengths[layer] = int((self.positions[layer][:length] < position).sum())
        self.next_position = position

    def clone(self) -> "KVCache":
        """An independent copy (e.g. one prefill shared by several decode-time methods)."""
        other = object.__new__(KVCache)
        other.k, other.v = [k.clone() for k in self.k], [v.clone() for v in self.v]
        other.positions = [p.clone() for p in self.positions]
        other.lengths, other.next_position = list(self.lengths), self.next_position
        other.capacity, other.spare = self.capacity, self.spare
        return other

    def valid_positions(self, layer: int | None = None) -> Tensor:
        """Positions of the entries held (of one layer, or of all when they hold the same)."""
        return self.positions[0 if layer is None else layer][:self.length if layer is None else self.lengths[layer]]


def _grown(buffer: Tensor, size: int, dim: int) -> Tensor:
    """A zeroed buffer of `size` along dim holding `buffer` at its start; a normal tensor even when grown
    inside a prefill's inference mode, so the cache can still be changed after it."""
    with torch.inference_mode(False):
        out = buffer.new_zeros(*buffer.shape[:dim], size, *buffer.shape[dim + 1:])
        out.narrow(dim, 0, buffer.shape[dim]).copy_(buffer)
    return out


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


def plain_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, positions: Tensor, key_positions: Tensor,
                     block: int = 256) -> Tensor:
    """Attention in plain torch ops, q/k as wide as v or narrower (torch's fused kernels need equal
    widths): a query group shares its KV head without copying it, queries go in blocks of `block`,
    and entry j is visible to query i when key_positions[j] <= positions[i] (keys are held in
    position order, so each block reads only the keys up to its last position)."""
    B, H, T, d = q.shape
    n_kv, dv = k.shape[1], v.shape[-1]
    group = H // n_kv
    grouped = q.view(B, n_kv, group, T, d)
    out = q.new_empty(B, n_kv, group, T, dv)
    for start in range(0, T, block):
        end = min(T, start + block)
        visible = int(torch.searchsorted(key_positions, positions[end - 1], right=True))
        rows = grouped[:, :, :, start:end].reshape(B, n_kv, group * (end - start), d)
        scores = (rows @ k[:, :, :visible].transpose(-1, -2) * scale).view(B, n_kv, group, end - start, visible)
        if end - start > 1:
            scores = scores.masked_fill(key_positions[None, :visible] > positions[start:end, None], float("-inf"))
        probs = scores.softmax(-1).view(B, n_kv, group * (end - start), visible)
        out[:, :, :, start:end] = (probs @ v[:, :, :visible]).view(B, n_kv, group, end - start, dv)
    return out.reshape(B, H, T, -1)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int):
        super().__init__()
        self.layer, self.config = layer, config
        hd = config.head_dim
        self.wq = nn.Linear(config.dim, config.n_heads * hd, bias=False)
        self.wk = nn.Linear(config.dim, config.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(config.dim, config.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(config.n_heads * hd, config.dim, bias=False)
        self.rope_index: Tensor | None = None  # the rotary dims q/k keep, when `slice_qk` narrowed them
        self.fused = True  # torch's fused SDPA where it applies (model.attention_kernel)

    @property
    def qk_dim(self) -> int:
        return self.wk.out_features // self.config.n_kv_heads

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None, positions: Tensor,
                hooks: "Hooks") -> Tensor:
        B, T, _ = x.shape
        c = self.config
        q = self.wq(x).view(B, T, c.n_heads, self.qk_dim).transpose(1, 2)  # (B, H, T, qk_dim)
        k = self.wk(x).view(B, T, c.n_kv_heads, self.qk_dim).transpose(1, 2)  # (B, Hkv, T, qk_dim)
        v = self.wv(x).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        if self.rope_index is not None:  # (Hkv, qk_dim): the rotary dims each KV head (and its query group) kept
            cos_k, sin_k = cos[:, self.rope_index].transpose(0, 1), sin[:, self.rope_index].transpose(0, 1)
            group = c.n_heads // c.n_kv_heads
            q = apply_rope(q, cos_k.repeat_interleave(group, 0), sin_k.repeat_interleave(group, 0))
            k = apply_rope(k, cos_k, sin_k)
        else:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        for captured in hooks.captures:
            captured.append((self.layer, q.detach(), k.detach()))
        return self.attend(q, k, v, cache, positions, hooks)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, cache: KVCache | None, positions: Tensor,
               hooks: "Hooks", stored: Tensor | None = None) -> Tensor:
        """Append k (or `stored`, what the cache keeps in its place) and v to the cache, attend and
        project out; subclasses that change what is cached call this after their own projections."""
        B, _, T, _ = q.shape
        past, key_positions = 0, positions
        if cache is not None:
            past = cache.lengths[self.layer]
            k_all, v, key_positions = cache.append(self.layer, k if stored is None else stored, v, positions)
            k = k_all if stored is None else self.expand_keys(k_all, key_positions)
        if T == 1 and hooks.attention is not None:
            out = hooks.attention.attend(self.layer, q, k, v)
        elif not self.fused or (T == 1 and q.shape[-1] != v.shape[-1]):
            # decode over narrower keys: the plain path reads the narrow cache as it is; scores keep the
            # full head's 1/sqrt(head_dim), since they approximate its dot products
            out = plain_attention(q, k, v, 1 / math.sqrt(self.config.head_dim), positions, key_positions)
        else:
            if q.shape[-1] != v.shape[-1]:  # torch's fused kernels need equal widths: zero-padded q/k, same scores
                q, k = (F.pad(x, (0, v.shape[-1] - x.shape[-1])) for x in (q, k))
            if hooks.mask is not None:  # training over packed rows: causal within each document
                out = grouped_sdpa(q, k, v, attn_mask=hooks.mask)
            elif T == 1 or past == 0:  # new tokens come in position order, so causal is the right mask
                out = grouped_sdpa(q, k, v, is_causal=bool(T > 1))
            else:  # a chunk after cached entries: each token sees every entry at or before its position
                out = grouped_sdpa(q, k, v, attn_mask=key_positions[None, :] <= positions[:, None])
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))

    def expand_keys(self, stored: Tensor, positions: Tensor) -> Tensor:
        """Keys to attend with from what the cache stored (for a subclass that caches something else)."""
        raise NotImplementedError(f"{type(self).__name__} caches keys as they are")


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

    def forward(self, x, cos, sin, cache, positions, hooks):
        x = x + self.attention(self.attention_norm(x), cos, sin, cache, positions, hooks)
        return x + self.feed_forward(self.ffn_norm(x))


class Hooks:
    """What methods have plugged into a model; see the module docstring."""

    def __init__(self):
        self.attention = None
        self.captures: list[list] = []
        self.selectors: list = []
        self.mask: Tensor | None = None  # (B, 1, T, T) bool, set by Llama.train_forward for its call


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        if config.rope_layout != "rotate-half":
            raise ValueError(f"rope_layout {config.rope_layout!r}: only rotate-half (pair j is dims j and "
                             "j + head_dim/2) is implemented; a GGUF's interleaved Q/K rows are unpermuted on load")
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
        return KVCache(self.config, batch, capacity, p.dtype, p.device,
                       qk_dims=[block.attention.qk_dim for block in self.layers])

    def forward(self, tokens: Tensor, cache: KVCache | None = None, last_only: bool = False) -> Tensor:
        """tokens (B, T) -> logits (B, T, vocab) (or (B, 1, vocab) with last_only).

        With a cache, the tokens continue it: their positions follow the cache's last position
        and they attend to every entry the cache holds. Under a prefill token selection, the
        logits are those of the rows that reach the last layer.
        """
        return self.output(self.hidden_states(tokens, cache, last_only=last_only))

    def hidden_states(self, tokens: Tensor, cache: KVCache | None = None, layers: int | None = None,
                      last_only: bool = False) -> Tensor:
        """forward's last hidden states (B, T, dim) (or (B, 1, dim)), after the final norm (`output` maps
        them to logits); with `layers`, of the first that many blocks only (an early exit: the cache
        gains entries in those layers alone)."""
        B, T = tokens.shape
        positions = cache.new_positions(T) if cache is not None else torch.arange(T, device=tokens.device)
        x = self.tok_embeddings(tokens)
        cos, sin = rope_cos_sin(positions, self.inv_freq, x.dtype)
        for block in self.layers[:layers]:
            x = block(x, cos, sin, cache, positions, self.hooks)
            if self.hooks.selectors and T > 1:
                for selector in self.hooks.selectors:
                    index = selector.select(block.attention.layer, x, positions)
                    if index is not None:
                        index = torch.as_tensor(index, dtype=torch.long, device=x.device).sort().values
                        x, positions, cos, sin = x[:, index], positions[index], cos[index], sin[index]
        return self.norm(x[:, -1:] if last_only else x)

    def train_forward(self, tokens: Tensor, positions: Tensor, mask: Tensor | None = None,
                      checkpointing: bool = False) -> Tensor:
        """tokens (B, T) at positions (B, T) -> logits (B, T, vocab), no cache: rows of several documents
        (packed) give each token its position in its document and `mask` (B, 1, T, T) bool, True where a
        query may see a key (causal within its document); without a mask, attention is causal over the
        row. `checkpointing` recomputes each block's activations in the backward pass."""
        B, T = tokens.shape
        assert positions.shape == (B, T), f"positions {tuple(positions.shape)} != {(B, T)}"
        x = self.tok_embeddings(tokens)
        cos, sin = (t.view(B, 1, T, -1) for t in rope_cos_sin(positions.flatten(), self.inv_freq, x.dtype))

        def run_block(block, x):  # the mask is set for each call, so a checkpoint's recomputation sees it too
            self.hooks.mask = mask
            try:
                return block(x, cos, sin, None, positions, self.hooks)
            finally:
                self.hooks.mask = None
        for block in self.layers:
            if checkpointing:
                x = torch.utils.checkpoint.checkpoint(run_block, block, x, use_reentrant=False)
            else:
                x = run_block(block, x)
        return self.output(self.norm(x))

    @contextmanager
    def attention_method(self, method):
        """Replace decode attention: method.attend(layer, q (B,H,1,hd), k, v (B,Hkv,n,hd)) -> (B,H,1,hd).
        The one exclusive hook point: two methods cannot both produce the attention output."""
        if self.hooks.attention is not None:
            raise HookError(f"decode attention is already replaced by {self.hooks.attention!r}; "
                            f"{method!r} cannot replace it at the same time")
        self.hooks.attention = method
        try:
            yield method
        finally:
            self.hooks.attention = None

    def select_tokens(self, selector):
        """During prefill, after every layer: selector.select(layer, x (B, T, dim), positions (T,))
        returns the rows to keep (indices, any order) or None for all; later layers, their cache
        entries and the logits see only the kept rows. Selectors chain in the order entered."""
        return _in_chain(self.hooks.selectors, selector)

    def capture_qk(self, layers=None, last_queries: int | None = None):
        """Collect (layer, q, k) after RoPE for every forward inside the block (captures nest); only
        of these layers, and only the last `last_queries` query rows, when given."""
        return _in_chain(self.hooks.captures, _Captured(layers, last_queries))

    @contextmanager
    def swap_modules(self, modules: dict[str, nn.Module], trainable: bool = False):
        """Replace submodules by name (e.g. 'layers.3.attention.wq'), restored on exit. The new
        modules' parameters train (requires_grad) only with trainable=True; parameters a new module
        shares with an old one get their flags back on exit. Swaps of the same name nest: the inner
        one sees, and may wrap, the outer one's module."""
        missing = sorted(name for name in modules if not _has_submodule(self, name))
        if missing:
            raise KeyError(f"no such module(s): {', '.join(missing)}")
        saved, flags = {}, {p: p.requires_grad for module in modules.values() for p in module.parameters()}
        for name, module in modules.items():
            parent, _, attr = name.rpartition(".")
            owner = self.get_submodule(parent)
            saved[name] = getattr(owner, attr)
            module.requires_grad_(trainable)
            setattr(owner, attr, module)
        try:
            yield self
        finally:
            for name, module in reversed(saved.items()):
                parent, _, attr = name.rpartition(".")
                setattr(self.get_submodule(parent), attr, module)
            for parameter, flag in flags.items():
                parameter.requires_grad_(flag)

    @contextmanager
    def attention_kernel(self, kernel: str):
        """"fused": torch's SDPA kernels wherever they apply (the default; decode over narrower keys
        always takes the plain path); "plain": every layer's attention in plain torch ops
        (`plain_attention`), so that full and narrowed attention can be timed in the same code."""
        if kernel not in ("fused", "plain"):
            raise ValueError(f"attention kernel must be 'fused' or 'plain'; got {kernel!r}")
        saved = [block.attention.fused for block in self.layers]
        for block in self.layers:
            block.attention.fused = kernel == "fused"
        try:
            yield self
        finally:
            for block, fused in zip(self.layers, saved):
                block.attention.fused = fused

    @contextmanager
    def slice_qk(self, pairs: dict[int, Tensor], trainable: bool = False, weights: dict[str, Tensor] | None = None):
        """Per layer, keep only these rotary pairs (pair j is dims j and j + head_dim/2): a list of r
        pairs for every KV head, or an (n_kv_heads, r) tensor, one row per KV head (its query group
        keeps the same). The layer's q/k width becomes 2r, attention scores keep the full head's
        scale and caches made inside hold keys at that width. The sliced W_q/W_k rows are new
        modules (trainable as swap_modules says), or the given `weights` by module name; yields
        {module name: module}."""
        c = self.config
        half, group = c.head_dim // 2, c.n_heads // c.n_kv_heads
        swaps, blocks = {}, {}
        for layer, kept in pairs.items():
            kept = torch.as_tensor(kept, dtype=torch.long)
            kept = kept.expand(c.n_kv_heads, -1) if kept.dim() == 1 else kept
            if (kept.shape[0] != c.n_kv_heads or kept.shape[1] == 0 or kept.min() < 0 or kept.max() >= half
                    or any(len(row.unique()) != len(row) for row in kept)):
                raise ValueError(f"slice_qk: layer {layer} needs, per KV head ({c.n_kv_heads}), the same number of "
                                 f"distinct pairs in [0, {half}); got {kept.tolist()}")
            dims = torch.cat([kept, kept + half], dim=1)  # rotate-half layout: first halves, then second halves
            heads = {"wq": torch.arange(c.n_heads) // group, "wk": torch.arange(c.n_kv_heads)}
            for name, kv_of in heads.items():
                old = getattr(self.layers[layer].attention, name)
                rows = (torch.arange(len(kv_of))[:, None] * c.head_dim + dims[kv_of]).flatten()
                key = f"layers.{layer}.attention.{name}"
                new = nn.Linear(old.in_features, len(rows), bias=False, device=old.weight.device, dtype=old.weight.dtype)
                new.weight.data.copy_(old.weight.data[rows] if weights is None else weights[key])
                swaps[key] = new
            blocks[layer] = dims.to(self.inv_freq.device)
        with self.swap_modules(swaps, trainable=trainable):
            saved = {layer: self.layers[layer].attention.rope_index for layer in blocks}
            for layer, dims in blocks.items():
                self.layers[layer].attention.rope_index = dims
            try:
                yield swaps
            finally:
                for layer, dims in saved.items():
                    self.layers[layer].attention.rope_index = dims


class _Captured(list):
    """A capture_qk list that keeps only some layers and the last query rows (a prefill's q at 8K is
    20 MB a layer)."""

    def __init__(self, layers=None, last_queries: int | None = None):
        super().__init__()
        self.layers = None if layers is None else set(layers)
        self.last_queries = last_queries

    def append(self, item) -> None:
        layer, q, k = item
        if self.layers is None or layer in self.layers:
            super().append((layer, q if self.last_queries is None else q[:, :, -self.last_queries:], k))


@contextmanager
def _in_chain(chain: list, item):
    """item at the end of a hook chain for the block; taken out by identity (lists of tensors do not
    compare) on exit."""
    chain.append(item)
    try:
        yield item
    finally:
        del chain[next(i for i, x in enumerate(chain) if x is item)]


def _has_submodule(model: nn.Module, name: str) -> bool:
    try:
        model.get_submodule(name)
    except AttributeError:
        return False
    return True


def dense_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Reference decode attention (B, H, 1, hd) over all of k, v (B, Hkv, n, hd), GQA by repetition."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return scores.softmax(-1) @ v
