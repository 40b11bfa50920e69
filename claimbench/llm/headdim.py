"""Narrower keys on the LLM substrate (the family of RACE, PAPERS.md B2): the calibration
statistics every pair and channel rule reads, pair selection sliced into W_q/W_k through
`model.slice_qk`, the analytic FLOPs and KV bytes of a decode step, and the short recovery step.

RoPE rotates each pair (dims j and j + head_dim/2) by an angle, which keeps the pair's norm: pair
energies are the same before and after RoPE, so calibration reads the W_q/W_k outputs directly.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor

from claimbench.interfaces import HeadDimCompression, KeyShape
from claimbench.llm.model import Llama, LlamaConfig

MIN_CALIBRATION_TOKENS = 256  # fewer leave a pair's energy at a handful of tokens per head
BYTES_PER_NUMBER = 2  # KV bytes are counted at bf16/fp16, as a serving cache stores them


@dataclass(frozen=True)
class PairStatistics:
    """Means over calibration tokens, per (layer, KV head, rotary pair), and the calibration ids."""
    query_energy: Tensor  # (L, Hkv, half): E[|q pair|^2], summed over the KV head's query group
    key_energy: Tensor  # (L, Hkv, half): E[|k pair|^2]
    norm_product: Tensor  # (L, Hkv, half): E[|q pair| |k pair|], summed over the query group (MHA2MLA)
    key_covariance: Tensor  # (L, Hkv, head_dim, head_dim): E[k k^T] before RoPE (low-rank keys)
    ids: tuple[int, ...]  # the calibration tokens (the recovery step trains on them too)


def check_model(model: Llama) -> None:
    """Pair rules assume the rotate-half layout and full-width q/k (no compression active)."""
    if model.config.rope_layout != "rotate-half":
        raise ValueError(f"rotary pairs are (j, j + head_dim/2) only in the rotate-half layout; this model's is "
                         f"{model.config.rope_layout!r}")
    narrow = [b.attention.layer for b in model.layers if b.attention.qk_dim != model.config.head_dim]
    if narrow:
        raise ValueError(f"layers {narrow} already have narrowed q/k: calibrate and compress the full model")


def kept_pairs(retention: float, config: LlamaConfig) -> int:
    """Whole rotary pairs per KV head that `retention` of the key dims keeps."""
    half = config.head_dim // 2
    if not 0 < retention <= 1:
        raise ValueError(f"retention must be in (0, 1]; got {retention}")
    pairs = retention * half
    if abs(pairs - round(pairs)) > 1e-9:
        raise ValueError(f"retention {retention} keeps {pairs:g} of {half} rotary pairs per KV head; choose a "
                         f"multiple of 1/{half} so that whole pairs are kept")
    return round(pairs)


@torch.inference_mode()
def calibrate(model: Llama, ids, window: int = 1024) -> PairStatistics:
    """One pass of the full model over the calibration ids in windows, reading W_q/W_k outputs."""
    check_model(model)
    ids = [int(t) for t in ids]
    if len(ids) < MIN_CALIBRATION_TOKENS:
        raise ValueError(f"calibration needs at least {MIN_CALIBRATION_TOKENS} tokens to estimate pair energies; "
                         f"got {len(ids)}")
    c = model.config
    hd, half, group = c.head_dim, c.head_dim // 2, c.n_heads // c.n_kv_heads
    zeros = lambda *shape: torch.zeros(c.n_layers, c.n_kv_heads, *shape, dtype=torch.float64)
    q_energy, k_energy, norm_product, covariance = zeros(half), zeros(half), zeros(half), zeros(hd, hd)
    query_norms = {}

    def pair_norm_sq(x: Tensor, heads: int) -> Tensor:  # (T, heads * hd) -> (T, heads, half)
        x = x.reshape(-1, heads, hd).double()
        return x[..., :half] ** 2 + x[..., half:] ** 2

    def on_query(layer):
        def hook(module, args, out):
            q = pair_norm_sq(out, c.n_heads).view(-1, c.n_kv_heads, group, half)
            q_energy[layer] += q.sum((0, 2))
            query_norms[layer] = q.sqrt()
        return hook

    def on_key(layer):
        def hook(module, args, out):
            k = pair_norm_sq(out, c.n_kv_heads)
            k_energy[layer] += k.sum(0)
            norm_product[layer] += (query_norms.pop(layer) * k.sqrt()[:, :, None]).sum((0, 2))
            keys = out.reshape(-1, c.n_kv_heads, hd).double()
            covariance[layer] += torch.einsum("thd,the->hde", keys, keys)
        return hook

    handles = [h for b in model.layers for h in (b.attention.wq.register_forward_hook(on_query(b.attention.layer)),
                                                 b.attention.wk.register_forward_hook(on_key(b.attention.layer)))]
    try:
        for start in range(0, len(ids), window):
            model(torch.tensor([ids[start:start + window]]))
    finally:
        for h in handles:
            h.remove()
    n = len(ids)
    return PairStatistics((q_energy / n).float(), (k_energy / n).float(), (norm_product / n).float(),
                          (covariance / n).float(), tuple(ids))


@dataclass
class PairSelection(HeadDimCompression):
    """Keep the r highest-scoring rotary pairs of each KV head, sliced into W_q/W_k rows and the RoPE
    frequencies; the model runs natively at the narrower width (nothing is reconstructed)."""
    retention: float = 0.5
    pairs: dict[int, Tensor] = field(default_factory=dict, init=False, repr=False)
    weights: dict[str, Tensor] | None = field(default=None, init=False, repr=False)  # set by the recovery step

    def scores(self, statistics: PairStatistics) -> Tensor:
        """(L, Hkv, half): higher is kept."""
        raise NotImplementedError

    def fit(self, model: Llama, statistics: PairStatistics) -> None:
        check_model(model)
        r = kept_pairs(self.retention, model.config)
        top = self.scores(statistics).topk(r, dim=-1).indices.sort(-1).values  # (L, Hkv, r)
        self.pairs = {layer: top[layer] for layer in range(model.config.n_layers)}

    def apply(self, model: Llama):
        if not self.pairs:
            raise RuntimeError(f"{self.name}: fit it on calibration statistics first")
        return model.slice_qk(self.pairs, weights=self.weights)

    def key_shape(self, config: LlamaConfig) -> KeyShape:
        width = 2 * kept_pairs(self.retention, config)
        return KeyShape(query_projection=width, key_projection=width, score=width, cached=width)


def full_shape(config: LlamaConfig) -> KeyShape:
    hd = config.head_dim
    return KeyShape(query_projection=hd, key_projection=hd, score=hd, cached=hd)


def decode_flops(config: LlamaConfig, shape: KeyShape, context: int) -> dict[str, float]:
    """Analytic FLOPs (2 per multiply-add) of one decode token attending to `context` cached
    tokens: 'attention' (scores, values, key reconstruction) and 'total' (with the projections,
    SwiGLU and the LM head; norms, RoPE and softmax are left out, under 1% here)."""
    c = config
    hd = c.head_dim
    projections = 2 * c.dim * (c.n_heads * shape.query_projection + c.n_kv_heads * shape.key_projection
                               + c.n_kv_heads * hd + c.n_heads * hd)
    attention = 2 * c.n_heads * context * (shape.score + hd) + 2 * c.n_kv_heads * context * shape.reconstruct_rank * hd
    ffn = 2 * 3 * c.dim * c.ffn_dim
    return {"attention": c.n_layers * attention,
            "total": c.n_layers * (projections + attention + ffn) + 2 * c.dim * c.vocab_size}


def request_flops(config: LlamaConfig, shape: KeyShape, context: int, new_tokens: int = 0) -> float:
    """Total FLOPs of a request: prefilling `context` tokens (token t attends to t tokens) and
    decoding `new_tokens` after it; decode_flops is linear in the context, so the sum is closed-form."""
    at = lambda n: decode_flops(config, shape, n)["total"]
    slope = at(1) - at(0)

    def tokens(first: int, count: int) -> float:  # sum of at(n) for n = first .. first + count - 1
        return count * at(0) + slope * (count * first + count * (count - 1) / 2)
    return tokens(1, context) + tokens(context + 1, new_tokens)


def kv_bytes_per_token(config: LlamaConfig, shape: KeyShape) -> int:
    return config.n_layers * config.n_kv_heads * (shape.cached + config.head_dim) * BYTES_PER_NUMBER


def recover(model: Llama, method: PairSelection, statistics: PairStatistics, steps: int = 200,
            window: int = 256, lr: float = 5e-4, seed: int = 0) -> dict[str, float]:
    """The short recovery step: train only the kept W_q/W_k rows of a fitted pair selection to match
    the full model's next-token distribution (KL divergence of the logits) on random windows of the
    calibration tokens, Adam, `steps` steps; the trained rows become the method's weights. Returns
    the KL before and after (mean of the first and last 10 steps). Reconstructed: the digest says
    only that RACE "calibrates" attention into the reduced form; this recipe is ours."""
    if not method.pairs:
        raise RuntimeError(f"{method.name}: fit it before the recovery step")
    ids = torch.tensor(statistics.ids)
    if len(ids) < window + 1:
        raise ValueError(f"the recovery step needs more than {window} calibration tokens; got {len(ids)}")
    generator = torch.Generator().manual_seed(seed)
    teacher, losses = copy.deepcopy(model), []
    with model.slice_qk(method.pairs, trainable=True, weights=method.weights) as modules:
        optimizer = torch.optim.Adam([p for m in modules.values() for p in m.parameters()], lr=lr)
        for _ in range(steps):
            start = int(torch.randint(0, len(ids) - window, (1,), generator=generator))
            chunk = ids[None, start:start + window]
            with torch.no_grad():
                target = teacher(chunk).float().log_softmax(-1)
            student = model(chunk).float().log_softmax(-1)
            loss = torch.nn.functional.kl_div(student[0], target[0], log_target=True, reduction="batchmean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        method.weights = {name: m.weight.detach().clone() for name, m in modules.items()}
    head, tail = losses[:10], losses[-10:]
    return {"kl_before": sum(head) / len(head), "kl_after": sum(tail) / len(tail), "steps": steps}

