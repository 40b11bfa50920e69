"""4-bit weight-only quantization of a model's linear layers, per group of input channels
(asymmetric: a scale and a zero point per group of GROUP_SIZE weights of one output row).

- RTN: each group's min and max span the 2^bits levels, weights rounded to nearest.
- LearnedCalibration (reconstructed from OmniQuant's LWC and AutoRound's signed rounding offsets):
  per-group clip factors on the max and the min through a sigmoid, sigmoid(g) / sigmoid(4) with g
  initialised at 4 (a factor of exactly 1: RTN at initialisation, at most 1.018), and per-weight
  rounding offsets 0.5 * tanh(r) added before rounding, r initialised at 0; rounding passes
  gradients straight through. Trained with Adam to match the fp32 model's last hidden states on
  calibration text (mean squared error over real tokens, relative to the fp32 states' mean square).
  The learning rate sets how far clips and offsets move from RTN: the paper's "dose".
A layer whose input width is not a multiple of the group size is refused (InputError), not padded.
"""
from __future__ import annotations

import math
import random
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from claimbench.interfaces import InputError

BITS, GROUP_SIZE = 4, 32
_INIT = 4.0  # OmniQuant's initial clip logit


def linear_weights(model, skip: tuple[str, ...] = ("pooler",)) -> dict[str, torch.Tensor]:
    """name of every nn.Linear's weight -> the tensor (layers under a name part in skip left out: BERT's
    pooler is not on the mean-pooled embedding's path)."""
    out = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not any(part in skip for part in name.split(".")):
            out[f"{name}.weight"] = module.weight
    return out


def _groups(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    rows, cols = weight.shape
    if cols % group_size:
        raise InputError(f"a linear layer of input width {cols} is not a multiple of the group size {group_size}")
    return weight.reshape(rows, cols // group_size, group_size)


def _round(x: torch.Tensor) -> torch.Tensor:
    """Round to nearest, the gradient passed straight through."""
    return x + (torch.round(x) - x).detach()


def fake_quantize(weight: torch.Tensor, bits: int = BITS, group_size: int = GROUP_SIZE, clip_max=None, clip_min=None,
                  offset=None) -> torch.Tensor:
    """The dequantized weight: clip factors (rows, groups) scale each group's max and min, offset
    (rows, groups, group_size) shifts each weight before rounding; None = RTN's 1, 1 and 0."""
    grouped = _groups(weight, group_size)
    high, low = grouped.amax(-1), grouped.amin(-1)
    if clip_max is not None:
        high, low = high * clip_max, low * clip_min
    levels = 2 ** bits - 1
    scale = ((high - low) / levels).clamp(min=1e-8).unsqueeze(-1)
    zero = _round(-low.unsqueeze(-1) / scale)
    shifted = grouped / scale + (offset if offset is not None else 0)
    q = torch.clamp(_round(shifted) + zero, 0, levels)
    return ((q - zero) * scale).reshape(weight.shape)


def rtn(model, bits: int = BITS, group_size: int = GROUP_SIZE) -> dict[str, torch.Tensor]:
    """name -> RTN's dequantized weight, for every linear layer."""
    with torch.no_grad():
        return {name: fake_quantize(w, bits, group_size) for name, w in linear_weights(model).items()}


@contextmanager
def quantized(model, weights: dict[str, torch.Tensor]):
    """The model with these (dequantized) weights in place of its linear layers' own, restored after."""
    params = dict(model.named_parameters())
    saved = {name: params[name].detach().clone() for name in weights}
    try:
        with torch.no_grad():
            for name, w in weights.items():
                params[name].copy_(w)
        yield model
    finally:
        with torch.no_grad():
            for name, w in saved.items():
                params[name].copy_(w)


@dataclass
class Calibrated:
    weights: dict[str, torch.Tensor]  # name -> dequantized weight (RTN's where the run diverged)
    losses: list[float] = field(default_factory=list)  # per step, relative MSE
    diverged: bool = False  # the loss went NaN or infinite: the run is reported, never adopted

    @property
    def final_loss(self) -> float:
        tail = self.losses[-10:]
        return math.inf if self.diverged or not tail else sum(tail) / len(tail)


@dataclass
class LearnedCalibration:
    """Learnable clipping and rounding (see the module docstring)."""
    lr: float = 1e-3
    steps: int = 100
    seed: int = 0
    batch_size: int = 8
    bits: int = BITS
    group_size: int = GROUP_SIZE
    rounding: bool = True  # learn the rounding offsets too (False: clipping only, OmniQuant's LWC)

    def parameters_for(self, weights: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
        out = {}
        for name, w in weights.items():
            rows, cols = w.shape
            groups = _groups(w, self.group_size).shape[1]
            entry = {"clip_max": torch.full((rows, groups), _INIT), "clip_min": torch.full((rows, groups), _INIT)}
            if self.rounding:
                entry["offset"] = torch.zeros((rows, groups, self.group_size))
            out[name] = {k: v.requires_grad_(True) for k, v in entry.items()}
        return out

    def dequantized(self, weights, learned) -> dict[str, torch.Tensor]:
        unit = torch.sigmoid(torch.tensor(_INIT))
        return {name: fake_quantize(w, self.bits, self.group_size, torch.sigmoid(p["clip_max"]) / unit,
                                    torch.sigmoid(p["clip_min"]) / unit,
                                    0.5 * torch.tanh(p["offset"]) if "offset" in p else None)
                for name, w in weights.items() for p in (learned[name],)}

    def calibrate(self, model, tokenizer, texts: list[str]) -> Calibrated:
        """Train on texts (batches of batch_size, reshuffled each pass with seed) for steps steps."""
        from claimbench import embedder
        weights = linear_weights(model)
        learned = self.parameters_for(weights)
        optimizer = torch.optim.Adam([t for p in learned.values() for t in p.values()], lr=self.lr)
        order, losses = [], []
        rng = random.Random(self.seed)
        for _ in range(self.steps):
            if len(order) < self.batch_size:
                order += rng.sample(range(len(texts)), len(texts))
            chunk, order = order[:self.batch_size], order[self.batch_size:]
            (_, ids, mask), = embedder.batches(tokenizer, [texts[i] for i in chunk], self.batch_size)
            with torch.no_grad():
                target = model(input_ids=ids, attention_mask=mask).last_hidden_state
            hidden = torch.func.functional_call(model, self.dequantized(weights, learned),
                                                kwargs={"input_ids": ids, "attention_mask": mask}).last_hidden_state
            real = mask.unsqueeze(-1).bool()
            loss = ((hidden - target) ** 2).masked_select(real).mean() / (target ** 2).masked_select(real).mean()
            if not torch.isfinite(loss):
                return Calibrated(rtn(model, self.bits, self.group_size), losses + [float("nan")], diverged=True)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        with torch.no_grad():
            final = self.dequantized(weights, learned)
        if not all(torch.isfinite(w).all() for w in final.values()):
            return Calibrated(rtn(model, self.bits, self.group_size), losses, diverged=True)
        return Calibrated(final, losses)
