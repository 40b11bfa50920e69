"""TokenGate: learned per-layer token pruning in prefill (PAPERS.md C2).

A light gate after some layers scores every token from its hidden state; during prefill, tokens
whose keep-probability (the product of the gates they passed) falls below a threshold leave the
sequence from that layer on: no further compute for them and no KV entries in later layers. The
first `sink` tokens and the last `recent` prompt tokens are always kept.

Reconstructed from the digest (our reading, not the paper's code):
- the gate is one linear unit per gated layer on the RMS-normalised hidden state, every third layer
  from layer 3 (a "light learned component" per group of layers);
- training is differentiable through attention: each token's cumulative log keep-probability is
  added to every later layer's attention scores as a key-side bias, so a token on its way out is
  seen less and less, which is the hard drop's soft version;
- the loss is the KL divergence from the unpruned model's next-token distribution at the last
  `recent` positions (the always-kept tokens, which read the pruned context), plus a budget
  penalty (mean keep-probability - target)^2 over the gated layers' prunable tokens;
- only the gates train (the base weights are frozen), on the pinned corpus: windows of the license
  texts' first half and completion-style needle samples with seeds far from any evaluated one.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from claimbench.interfaces import PromptPrefill, TokenSelector
from claimbench.llm.model import (KVCache, Llama, check_window, load_for_model, model_digest, rope_cos_sin,
                                  save_for_model)


def protected(positions: Tensor, length: int, sink: int, recent: int) -> Tensor:
    """True for the always-kept tokens: the first `sink` and the last `recent` of a prompt of `length`."""
    return (positions < sink) | (positions >= length - recent)


class Gates(nn.Module):
    """One linear unit per gated layer on the RMS-normalised hidden state: log keep-probability per token."""

    def __init__(self, dim: int, layers: tuple[int, ...], eps: float = 1e-5):
        super().__init__()
        self.layers, self.eps = tuple(layers), eps
        self.score = nn.ModuleDict({str(layer): nn.Linear(dim, 1) for layer in layers})
        for unit in self.score.values():  # start by keeping everything (p = sigmoid(4) = 0.98)
            nn.init.zeros_(unit.weight)
            nn.init.constant_(unit.bias, 4.0)

    def log_keep(self, layer: int, x: Tensor) -> Tensor:
        """x (B, T, dim) -> (B, T) log keep-probability at this layer."""
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return F.logsigmoid(self.score[str(layer)](normed).squeeze(-1))


def default_layers(n_layers: int, every: int = 3) -> tuple[int, ...]:
    return tuple(range(every, n_layers - 1, every))


@dataclass
class TokenGate(PromptPrefill, TokenSelector):
    """Prefill with learned per-layer token pruning; `threshold` is the keep-rate knob (a token leaves
    once the product of its gates' keep-probabilities is below it)."""
    gates: Gates
    threshold: float = 0.5
    sink: int = 4
    recent: int = 32
    name: str = "tokengate"
    last_kept: list[int] = field(default_factory=list, repr=False)  # rows after each layer, of the last prefill

    def __post_init__(self):
        if not 0.0 < self.threshold < 1.0:
            raise ValueError(f"TokenGate threshold must be in (0, 1); got {self.threshold}")

    def prefill(self, model: Llama, ids, room: int = 64):
        check_window(model, ids, room)
        self._length, self._log_keep, self.last_kept = len(ids), None, []
        cache = model.new_cache(capacity=len(ids) + room)
        with torch.inference_mode(), model.select_tokens(self):
            logits = model(torch.tensor([list(ids)]), cache, last_only=True)[0, -1]
        return cache, logits

    def select(self, layer: int, x: Tensor, positions: Tensor):
        if layer not in self.gates.layers:
            self.last_kept.append(x.shape[1])
            return None
        step = self.gates.log_keep(layer, x)[0].masked_fill(
            protected(positions, self._length, self.sink, self.recent), 0.0)
        self._log_keep = step if self._log_keep is None else self._log_keep + step
        keep = (self._log_keep >= torch.log(torch.tensor(self.threshold))).nonzero().flatten()
        self._log_keep = self._log_keep[keep]
        self.last_kept.append(len(keep))
        return keep

    def computed_share(self) -> float:
        """Token rows computed over the layers in the last prefill, over full prefill's."""
        return sum([self._length, *self.last_kept[:-1]]) / (self._length * len(self.last_kept))


def soft_forward(model: Llama, gates: Gates, tokens: Tensor, sink: int, recent: int) -> tuple[Tensor, Tensor]:
    """The training pass: every token stays, each later layer's attention sees a key's cumulative log
    keep-probability as an additive bias. Returns logits (B, T, vocab) and the keep-probabilities
    (n_gated, B, T) after each gate."""
    B, T = tokens.shape
    positions = torch.arange(T)
    x = model.tok_embeddings(tokens)
    cos, sin = rope_cos_sin(positions, model.inv_freq, x.dtype)
    causal = torch.zeros(T, T).masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    always = protected(positions, T, sink, recent)
    log_keep, keeps = torch.zeros(B, T), []
    try:
        for block in model.layers:
            model.hooks.mask = (causal + log_keep[:, None, None, :]).to(x.dtype)
            x = block(x, cos, sin, None, positions, model.hooks)
            layer = block.attention.layer
            if layer in gates.layers:
                log_keep = log_keep + gates.log_keep(layer, x).masked_fill(always, 0.0)
                keeps.append(log_keep.exp())
    finally:
        model.hooks.mask = None
    return model.output(model.norm(x)), torch.stack(keeps)


@dataclass
class GateTraining:
    """Knobs of the gates' training (base weights frozen)."""
    target_keep: float = 0.3  # mean keep-probability the budget penalty aims at, over gated layers
    budget_weight: float = 4.0
    steps: int = 60
    length: int = 512
    batch: int = 2
    lr: float = 0.05
    sink: int = 4
    recent: int = 32
    seed: int = 0


def training_step(model: Llama, gates: Gates, tokens: Tensor, knobs: GateTraining, optimizer) -> dict:
    """One step on a batch of token rows; returns the loss and its parts."""
    with torch.no_grad():
        teacher = model(tokens)[:, -knobs.recent:].float().log_softmax(-1)
    logits, keeps = soft_forward(model, gates, tokens, knobs.sink, knobs.recent)
    student = logits[:, -knobs.recent:].float().log_softmax(-1)
    kl = F.kl_div(student, teacher, log_target=True, reduction="batchmean") / knobs.recent
    prunable = ~protected(torch.arange(tokens.shape[1]), tokens.shape[1], knobs.sink, knobs.recent)
    mean_keep = keeps[:, :, prunable].mean()
    loss = kl + knobs.budget_weight * (mean_keep - knobs.target_keep) ** 2
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return {"loss": loss.item(), "kl": kl.item(), "mean_keep": mean_keep.item()}


def train_gates(model: Llama, rows: Tensor, knobs: GateTraining = GateTraining(),
                layers: tuple[int, ...] | None = None, say=None) -> tuple[Gates, list[dict]]:
    """Gates trained on rows (N, length) of token ids, `knobs.steps` steps of `knobs.batch` rows drawn
    with the seed; the model's weights do not change. Returns the gates and each step's log."""
    torch.manual_seed(knobs.seed)
    gates = Gates(model.config.dim, layers or default_layers(model.config.n_layers))
    flags = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.Adam(gates.parameters(), lr=knobs.lr)
    generator = torch.Generator().manual_seed(knobs.seed)
    log, started = [], time.monotonic()
    try:
        for step in range(knobs.steps):
            batch = rows[torch.randint(0, len(rows), (knobs.batch,), generator=generator)]
            log.append(training_step(model, gates, batch, knobs, optimizer))
            if say and (step % 10 == 0 or step + 1 == knobs.steps):
                say(f"tokengate: step {step + 1}/{knobs.steps} loss {log[-1]['loss']:.4f} kl {log[-1]['kl']:.4f} "
                    f"mean keep {log[-1]['mean_keep']:.2f} ({time.monotonic() - started:.0f} s)")
    finally:
        for p, flag in zip(model.parameters(), flags):
            p.requires_grad_(flag)
    return gates.eval().requires_grad_(False), log


def save_gates(gates: Gates, model: Llama, path: Path, **extra) -> Path:
    """The gates (and `extra`) as a small file keyed by the model's digest."""
    return save_for_model(path, model, layers=list(gates.layers), state=gates.state_dict(), **extra)


def load_gates(model: Llama, path: Path) -> Gates:
    return _gates_from(load_for_model(path, model, "gates"), model.config.dim)


def _gates_from(saved: dict, dim: int) -> Gates:
    gates = Gates(dim, tuple(saved["layers"]))
    gates.load_state_dict(saved["state"])
    return gates.eval().requires_grad_(False)


def recipe_digest(model: Llama, rows: Tensor, knobs: GateTraining, layers: tuple[int, ...]) -> str:
    """sha256 over what decides the trained gates: the model, the rows, the knobs, the gated layers, this
    module's code and torch's version."""
    digest = hashlib.sha256(f"{model_digest(model)} {sorted(asdict(knobs).items())} {layers} {torch.__version__}"
                            .encode())
    digest.update(rows.contiguous().numpy().tobytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()


def trained_gates(model: Llama, rows: Tensor, knobs: GateTraining, folder: Path,
                  layers: tuple[int, ...] | None = None, say=None) -> tuple[Gates, list[dict], float]:
    """train_gates once per recipe: the gates, their training log and the seconds that training took,
    loaded from `folder` when gates of the same recipe (recipe_digest) were trained there before."""
    layers = layers or default_layers(model.config.n_layers)
    path = folder / f"gates-{recipe_digest(model, rows, knobs, layers)[:16]}.pt"
    if path.exists():
        if say:
            say(f"tokengate: trained before, loaded from {path}")
        saved = load_for_model(path, model, "gates")
        return _gates_from(saved, model.config.dim), saved["log"], saved["seconds"]
    started = time.monotonic()
    gates, log = train_gates(model, rows, knobs, layers, say)
    seconds = time.monotonic() - started
    save_gates(gates, model, path, log=log, seconds=seconds)
    return gates, log, seconds


def full_prefill(model: Llama, ids, room: int) -> tuple[KVCache, Tensor]:
    """The model's own prefill (what every pruning method is measured against)."""
    check_window(model, ids, room)
    cache = model.new_cache(capacity=len(ids) + room)
    with torch.inference_mode():
        logits = model(torch.tensor([list(ids)]), cache, last_only=True)[0, -1]
    return cache, logits
