"""Flow drafter (PAPERS.md C4, "Large Flow Language Models"): a block of k tokens drafted at once by
a continuous flow on the target model's last hidden state, then verified token by token by the
target (claimbench.llm.speculative.generate), so the output stays the target's own.

Reconstructed (our reading of the digest, not the paper's code or scale: the paper turns the whole
pretrained model into the block generator; here a small head beside a frozen target):
- the block lives in the target's token-embedding space, scaled to unit RMS: x1 = E[tokens] / rms(E),
  (k, dim) for the k tokens after the target's next one;
- a velocity field v(x_t, t, h) (an MLP over the flattened block, the time's sinusoidal features
  and the hidden state h) is trained by flow matching (Lipman et al. 2023, rectified-flow path):
  x_t = (1 - t) x0 + t x1, x0 ~ N(0, I), loss |v - (x1 - x0)|^2, the target frozen;
- drafting integrates dx/dt = v from x0 = 0 (the noise's mean: a deterministic draft, as greedy
  verification wants) in `steps` Euler steps and reads each row out to the token whose scaled
  embedding is nearest (L2) through the tied embedding.
Same data and training budget as the Medusa heads (claimbench.llm.speculative.HeadTraining).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from claimbench.interfaces import Drafter, InputError
from claimbench.llm import speculative
from claimbench.llm.model import Llama

TIME_FEATURES = 32


def time_features(t: Tensor) -> Tensor:
    """(B,) times in [0, 1] -> (B, TIME_FEATURES) sinusoids."""
    frequencies = torch.exp(torch.arange(TIME_FEATURES // 2) * (-math.log(1000.0) / (TIME_FEATURES // 2)))
    angles = 1000.0 * t[:, None] * frequencies[None, :]
    return torch.cat([angles.sin(), angles.cos()], -1)


class FlowDrafter(nn.Module, Drafter):
    """k tokens per block from `steps` Euler steps of a learned velocity field (module docstring)."""
    name = "flow"

    def __init__(self, dim: int, block: int, width: int = 1024, steps: int = 4):
        super().__init__()
        if block < 1 or steps < 1:
            raise InputError(f"the flow drafter needs block >= 1 and steps >= 1; got block {block}, steps {steps}")
        self.dim, self.block, self.width, self.steps = dim, block, width, steps
        self.velocity = nn.Sequential(nn.Linear(block * dim + dim + TIME_FEATURES, width), nn.SiLU(),
                                      nn.Linear(width, width), nn.SiLU(), nn.Linear(width, block * dim))
        self._read_out: dict = {}  # a plain dict: the model it holds is not a submodule

    def knobs(self) -> dict:
        return {"dim": self.dim, "block": self.block, "width": self.width, "steps": self.steps}

    @staticmethod
    def scaled_embeddings(model: Llama) -> Tensor:
        """The tied embedding (vocab, dim) at unit RMS, detached: the space the flow runs in."""
        weight = model.tok_embeddings.weight.detach()
        return weight / weight.pow(2).mean().sqrt()

    def _read_out_table(self, model: Llama) -> tuple[Tensor, Tensor]:
        """(scaled embeddings, their squared norms), computed once per model: drafting reads them every pass."""
        cached = self._read_out.get("table")
        if cached is None or cached[0] is not model:
            embeddings = self.scaled_embeddings(model)
            cached = self._read_out["table"] = (model, embeddings, embeddings.pow(2).sum(-1))
        return cached[1:]

    def field(self, x: Tensor, t: Tensor, hidden: Tensor) -> Tensor:
        """v(x_t, t, h): x (B, block, dim), t (B,), hidden (B, dim) -> (B, block, dim)."""
        inputs = torch.cat([x.flatten(1), hidden, time_features(t)], -1)
        return self.velocity(inputs).view_as(x)

    def loss(self, model: Llama, hidden: Tensor, future: Tensor) -> Tensor:
        """Flow matching on the rectified-flow path from noise to the block's scaled embeddings."""
        target = self.scaled_embeddings(model)[future[:, :self.block]]
        noise = torch.randn_like(target)
        t = torch.rand(len(target))
        x = (1 - t[:, None, None]) * noise + t[:, None, None] * target
        return F.mse_loss(self.field(x, t, hidden), target - noise)

    def sample(self, hidden: Tensor, steps: int | None = None) -> Tensor:
        """(B, dim) hidden states -> (B, block, dim) blocks, Euler from x0 = 0."""
        steps = steps or self.steps
        x = hidden.new_zeros(len(hidden), self.block, self.dim)
        for i in range(steps):
            x = x + self.field(x, torch.full((len(hidden),), i / steps), hidden) / steps
        return x

    @staticmethod
    def read_out(x: Tensor, embeddings: Tensor, squared_norms: Tensor | None = None) -> Tensor:
        """(..., dim) -> (...) the token whose embedding is nearest in L2."""
        norms = embeddings.pow(2).sum(-1) if squared_norms is None else squared_norms
        return (2 * x @ embeddings.T - norms).argmax(-1)

    @torch.inference_mode()
    def propose(self, context, k: int) -> list[int]:
        block = self.sample(context.hidden[None])[0, :k]
        return self.read_out(block, *self._read_out_table(context.model)).tolist()


def train_flow(model: Llama, hidden: Tensor, future: Tensor, knobs: speculative.HeadTraining, steps: int = 4,
               width: int = 1024, say=None) -> tuple[FlowDrafter, list[float]]:
    """A flow drafter over blocks as wide as `future`, trained with the shared budget."""
    drafter = FlowDrafter(model.config.dim, future.shape[1], width, steps)
    return drafter, speculative.train_head(drafter, model, hidden, future, knobs, say)
