"""2-bit baselines of E8-QAT (PAPERS.md C3), at the same total bits (2.0 code bits + an fp16 scale
per group of 64 weights of a row):

- RTN 2-bit (`quantize_2bit`): four levels {-1.5, -0.5, 0.5, 1.5} x s per group (the best uniform
  4-level grid for a symmetric bell: no level wasted on exact zero), s learnable in QAT through the
  straight-through estimator; post-training, s is searched over multiples of the group's RMS for
  the least squared error (`rtn_2bit`).
- E8P (QuIP#, Tseng et al. 2024; reconstructed: our reading of the paper, not its code): an explicit
  codebook of 2^16 points of E8 + 1/4 shifts. 256 "absolute" vectors with entries in {1/2, 3/2,
  5/2}: the 227 of squared norm <= 10 and the first 29 (lexicographic) of norm 12; a codeword
  flips the signs of one (7 free sign bits: an even sum keeps it in D8 + 1/2, which fixes the 8th)
  and adds +1/4 or -1/4 to every coordinate (1 bit): 8 + 7 + 1 = 16 bits per 8 weights. Encoding
  as QuIP# does, without a search of all 2^16: per shift, the nearest absolute vector to |x - shift|,
  the signs of x - shift, the parity fixed by flipping the cheapest coordinate; the better shift.
  Incoherence processing: the weight is rotated by random orthogonal matrices on both sides
  (seeded) before coding and rotated back after (QuIP#'s randomized Hadamard transform, replaced by
  dense random rotations, since 576 and 1536 are not powers of two); a scale per group, the group's
  RMS times one multiple per matrix searched on a sample of its groups (QuIP# scales per matrix).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from claimbench.interfaces import InputError

GROUP_SIZE = 64
SCALE_MULTIPLES = [0.5 + 0.1 * i for i in range(16)]  # x the group RMS, searched post-training


def _grouped(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size % 8 or weight.shape[-1] % group_size:
        raise InputError(f"a linear layer of input width {weight.shape[-1]} is not a multiple of the group size "
                         f"({group_size}, itself a multiple of 8)")
    return weight.reshape(weight.shape[0], -1, group_size)


def quantize_2bit(weight: torch.Tensor, scales: torch.Tensor, group_size: int = GROUP_SIZE) -> torch.Tensor:
    """Four-level RTN with per-group scales (rows, groups), straight-through in weight and scales."""
    grouped = _grouped(weight, group_size)
    x = grouped / scales.unsqueeze(-1)
    levels = torch.clamp(torch.floor(x), -2, 1) + 0.5
    return ((x + (levels - x).detach()) * scales.unsqueeze(-1)).reshape(weight.shape)


def _best_scales(weight: torch.Tensor, group_size: int, code) -> torch.Tensor:
    """Per group, the multiple of its RMS whose coding (code(grouped / s) * s) errs least; fp16."""
    grouped = _grouped(weight, group_size)
    rms = grouped.pow(2).mean(-1).sqrt().clamp(min=1e-8)
    best, best_error = rms.clone(), torch.full_like(rms, float("inf"))
    for multiple in SCALE_MULTIPLES:
        scale = (rms * multiple).to(torch.float16).float()
        error = ((code(grouped / scale.unsqueeze(-1)) * scale.unsqueeze(-1) - grouped) ** 2).sum(-1)
        better = error < best_error
        best, best_error = torch.where(better, scale, best), torch.where(better, error, best_error)
    return best


def rtn_2bit(weight: torch.Tensor, group_size: int = GROUP_SIZE) -> torch.Tensor:
    """Post-training RTN 2-bit, scales searched for the least squared error."""
    with torch.no_grad():
        code = lambda x: torch.clamp(torch.floor(x), -2, 1) + 0.5  # noqa: E731
        return quantize_2bit(weight, _best_scales(weight, group_size, code), group_size)


def absolute_vectors() -> torch.Tensor:
    """(256, 8): E8P's absolute vectors (module docstring)."""
    entries = (0.5, 1.5, 2.5)
    found = sorted(v for v in itertools.product(entries, repeat=8) if sum(e * e for e in v) <= 12)
    small = [v for v in found if sum(e * e for e in v) <= 10]
    twelve = [v for v in found if sum(e * e for e in v) == 12][:256 - len(small)]
    assert len(small) == 227 and len(small) + len(twelve) == 256, (len(small), len(twelve))
    return torch.tensor(small + twelve, dtype=torch.float32)


class E8PCodebook:
    """Encoding into E8P's 2^16 points (module docstring); `decode_all` lists them (for tests)."""

    def __init__(self):
        self.absolute = absolute_vectors()
        self.norms = (self.absolute ** 2).sum(1)

    def encode(self, x: torch.Tensor, chunk: int = 1 << 16) -> torch.Tensor:
        """(n, 8) -> (n, 8), the codeword each vector is coded to."""
        out = torch.empty_like(x)
        for start in range(0, len(x), chunk):
            part = x[start:start + chunk]
            best, best_error = None, None
            for shift in (0.25, -0.25):
                y = part - shift
                nearest = self.absolute[(self.norms - 2 * y.abs() @ self.absolute.T).argmin(1)]
                signs = torch.where(y < 0, -1.0, 1.0)
                point = signs * nearest
                odd = torch.remainder(point.sum(1), 2) != 0  # D8 + 1/2 needs an even sum
                cheapest = (y.abs() * nearest).argmin(1)
                flip = torch.ones_like(point)
                flip[torch.arange(len(point)), cheapest] = -1.0
                point = torch.where(odd.unsqueeze(1), point * flip, point) + shift
                error = ((point - part) ** 2).sum(1)
                if best is None:
                    best, best_error = point, error
                else:
                    better = (error < best_error).unsqueeze(1)
                    best = torch.where(better, point, best)
            out[start:start + chunk] = best
        return out

    def decode_all(self) -> torch.Tensor:
        """(65536, 8): every codeword."""
        signs = torch.tensor(list(itertools.product((1.0, -1.0), repeat=8)))
        points = (self.absolute.unsqueeze(1) * signs.unsqueeze(0)).reshape(-1, 8)
        points = points[torch.remainder(points.sum(1), 2) == 0]
        return torch.cat([points + 0.25, points - 0.25])


def random_rotation(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    return (q * torch.sign(torch.diagonal(r))).float()


@dataclass
class E8PQuantizer:
    """QuIP#-style E8P post-training quantization with incoherence processing (module docstring)."""
    group_size: int = GROUP_SIZE
    seed: int = 0
    name = "e8p-ptq"

    def __post_init__(self):
        self.codebook = E8PCodebook()

    def bits_per_weight(self) -> float:
        return 2.0 + 16 / self.group_size

    def compress(self, weight: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            rows, cols = weight.shape
            left, right = random_rotation(rows, self.seed), random_rotation(cols, self.seed + 1)
            rotated = left @ weight @ right.T

            def code(x):
                return self.codebook.encode(x.reshape(-1, 8)).reshape(x.shape)
            grouped = _grouped(rotated, self.group_size)
            rms = grouped.pow(2).mean(-1, keepdim=True).sqrt().clamp(min=1e-8)
            sample = grouped[:, ::max(1, grouped.shape[1] // 4)][:64]  # a few groups of a few rows
            sample_rms = sample.pow(2).mean(-1, keepdim=True).sqrt().clamp(min=1e-8)
            multiple = min(SCALE_MULTIPLES, key=lambda m: float(
                ((code(sample / (sample_rms * m)) * sample_rms * m - sample) ** 2).sum()))
            scales = (rms * multiple).to(torch.float16).float()
            coded = (code(grouped / scales) * scales).reshape(rows, cols)
            return left.T @ coded @ right
