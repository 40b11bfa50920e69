"""Speculative-decoding drafters the flow drafter is measured against (PAPERS.md C4), each behind
claimbench.interfaces.Drafter and verified by claimbench.llm.speculative.generate:

- `PromptLookup` (Saxena 2023, "prompt lookup decoding"; in HF transformers as
  `prompt_lookup_num_tokens`): the context's trailing n-gram (n from `max_ngram` down to 1) is looked
  up earlier in the context and the tokens that followed it are proposed. HF proposes 10 tokens
  after a match of at most 2 tokens, taking the first match; here the block size is the harness's k,
  n-grams up to 3 and the latest match (our choice: the most recent repetition is the likeliest to
  continue).
- `MedusaHeads` (Cai et al. 2024, Medusa-1): k heads on the target's last hidden state, head i a
  residual block h + SiLU(W_i h) read out through the target's (tied) LM head, predicting the token
  i + 1 places after the target's next one; W_i start at zero (so each head starts as the LM head,
  as Medusa initialises them) and train by cross-entropy with the target frozen. Reconstructed
  simplifications: the LM head is shared rather than copied per head, and drafts are the top-1 chain
  (Medusa's tree of top-k candidates needs tree attention in the verifier).
- `EarlyExit` (self-speculative decoding: Draft & Verify, Zhang et al. 2024; LayerSkip, Elhoushi et
  al. 2024): the first `layers` blocks of the target, its final norm and LM head draft tokens one at a
  time, with the target's own cache for those layers (the draft's entries are truncated before
  verification). No early-exit training here (LayerSkip trains for it), so the exit is at half
  depth by default.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from claimbench.interfaces import Drafter, InputError
from claimbench.llm import speculative
from claimbench.llm.model import Llama


@dataclass
class PromptLookup(Drafter):
    """Proposes what followed the latest earlier occurrence of the context's trailing n-gram."""
    max_ngram: int = 3
    name: str = "prompt-lookup"

    def __post_init__(self):
        if self.max_ngram < 1:
            raise InputError(f"max_ngram must be at least 1; got {self.max_ngram}")

    def propose(self, context, k: int) -> list[int]:
        tokens = context.tokens
        for n in range(min(self.max_ngram, len(tokens) - 1), 0, -1):
            tail = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):  # latest match first, never the tail itself
                if tokens[start:start + n] == tail:
                    return tokens[start + n:start + n + k]
        return []


class MedusaHeads(nn.Module, Drafter):
    """k Medusa-1 heads (module docstring); `propose` drafts min(k, heads) tokens in one pass."""
    name = "medusa"

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if heads < 1:
            raise InputError(f"Medusa needs at least one head; got {heads}")
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(heads))
        for block in self.blocks:
            nn.init.zeros_(block.weight)
            nn.init.zeros_(block.bias)

    def knobs(self) -> dict:
        return {"dim": self.blocks[0].in_features, "heads": len(self.blocks)}

    def forward(self, hidden: Tensor) -> Tensor:
        """(..., dim) -> (..., heads, dim): each head's hidden state for the LM head."""
        return torch.stack([hidden + F.silu(block(hidden)) for block in self.blocks], -2)

    def loss(self, model: Llama, hidden: Tensor, future: Tensor) -> Tensor:
        logits = F.linear(self(hidden), model.output.weight.detach())
        return F.cross_entropy(logits.flatten(0, 1), future.flatten())

    @torch.inference_mode()
    def propose(self, context, k: int) -> list[int]:
        heads = self(context.hidden)[:k]
        return context.model.output(heads).argmax(-1).tolist()


@dataclass
class EarlyExit(Drafter):
    """The target's first `layers` blocks (None: half of them) as the draft model, greedy."""
    layers: int | None = None
    name: str = "early-exit"
    _depth: int = field(default=0, init=False, repr=False)

    def start(self, model, prompt) -> None:
        depth = model.config.n_layers // 2 if self.layers is None else self.layers
        if not 1 <= depth < model.config.n_layers:
            raise InputError(f"early exit after {depth} layers: it must be in [1, {model.config.n_layers})")
        self._depth = depth

    @torch.inference_mode()
    def propose(self, context, k: int) -> list[int]:
        model, cache = context.model, context.cache
        start, token, out = cache.next_position, context.tokens[-1], []
        for _ in range(k):
            hidden = model.hidden_states(torch.tensor([[token]]), cache, layers=self._depth)[0, -1]
            token = int(model.output(hidden).argmax())
            out.append(token)
        cache.truncate(start)
        return out


def train_medusa(model: Llama, hidden: Tensor, future: Tensor, knobs: speculative.HeadTraining,
                 say=None) -> tuple[MedusaHeads, list[float]]:
    """Medusa heads, one per future column, trained with the shared budget."""
    heads = MedusaHeads(model.config.dim, future.shape[1])
    return heads, speculative.train_head(heads, model, hidden, future, knobs, say)
