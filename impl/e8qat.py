"""E8-QAT (PAPERS.md C3): 2-bit weights coded jointly in groups of eight as points of the E8 lattice,
with no explicit codebook search, trained with the codes in the loop (quantization-aware training).

- Nearest points (Conway & Sloane, SPLAG ch. 20): D8, round every coordinate and, if the sum is
  odd, round the worst one the other way; E8 = D8 u (D8 + 1/2), the closer of the two candidates.
- The implicit codebook is the Voronoi code E8 / 4E8 (Conway & Sloane 1983; NestQuant's
  construction): the 4^8 = 2^16 cosets of 4E8 in E8, each named by the point of its coset in the
  Voronoi cell of 4E8 around 0, so 16 bits per 8 weights, exactly 2.0 code bits. Points on the
  cell's boundary are shared by several cosets; a fixed generic offset (`TIE`) moves the cell off
  them, so each coset has exactly one point (2^16 distinct, tested). Why this and not a ball of E8:
  no ball holds exactly 2^16 points (56,881 have norm^2 <= 10, 117,361 <= 12), and the Voronoi code
  needs no table: a code is the coset's coordinates mod 4 in a basis of E8 (`to_code`, `from_code`).
- Overload (reconstructed; the paper's handling is not in the digest): a scaled 8-vector whose
  nearest E8 point lies outside the cell would wrap to a far point of its coset; instead it is
  shrunk toward 0 (x 0.9 per step) until its nearest point is inside: the codeword stored is the
  one the weights decode to, as clipping does for a scalar quantizer. On Gaussian data at the best
  scale its MSE is 0.108 vs 0.119 for the 4-level scalar quantizer (tests check it beats it).
- Scales: one per group of `group_size` weights of a row (a multiple of 8), fp16; bits per weight
  = 2.0 + 16 / group_size (`bits_per_weight`).
- QAT (`train`): every block linear's weight and its group scales are trained through a
  straight-through estimator (the lattice point's gradient is the input's; the scale gets the
  LSQ-style gradient of s * q), loss = KL from the fp32 model's next-token distribution
  (distillation) on rows of the pinned corpus, Adam; checkpoints every `checkpoint_every` steps,
  resumable; a NaN loss or weight stops training with the step named, the last good checkpoint kept.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
try:
    from numba import njit, prange
except ImportError:  # a GPU machine's bare image: the same functions as plain Python, enough for the
    prange = range   # 2^16-point table of the decode kernel (seconds); QAT needs numba (a dependency)

    def njit(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda function: function)

from claimbench.interfaces import InputError

log = logging.getLogger(__name__)

CODE_BITS = 2.0
GROUP = 8
SHRINK, MAX_SHRINKS = 0.9, 60
TIE = 1e-3 * torch.tensor([2, 3, 5, 7, 11, 13, 17, 19], dtype=torch.float32).sqrt() * \
    torch.tensor([1.0, -1, 1, -1, 1, -1, 1, -1])
# a basis of E8 (rows; SPLAG ch. 4, eq. (98)): D8's simple roots and the all-halves vector
BASIS = torch.tensor([[2, 0, 0, 0, 0, 0, 0, 0]] + [[0] * i + [-1, 1] + [0] * (6 - i) for i in range(7)],
                     dtype=torch.float64)
BASIS[7] = 0.5


@njit(cache=True, nogil=True, inline="always")
def _d8_into(x, row, factor, shift, out, out_row):
    """The nearest D8 point to factor * x[row] - shift, plus shift, into out[out_row]; its squared
    distance to factor * x[row]. Round every coordinate; an odd sum re-rounds the worst one."""
    total, worst, worst_error = 0.0, 0, -1.0
    for j in range(GROUP):
        value = x[row, j] * factor - shift
        rounded = np.rint(value)
        out[out_row, j] = rounded
        total += rounded
        if abs(value - rounded) > worst_error:
            worst, worst_error = j, abs(value - rounded)
    if int(total) % 2:
        value = x[row, worst] * factor - shift
        out[out_row, worst] += 1.0 if value - out[out_row, worst] > 0 else -1.0
    distance = 0.0
    for j in range(GROUP):
        out[out_row, j] += shift
        gap = x[row, j] * factor - out[out_row, j]
        distance += gap * gap
    return distance


@njit(cache=True, nogil=True, inline="always")
def _e8_into(x, row, factor, out, scratch):
    """The nearest E8 point to factor * x[row] into out[row]: the closer of the D8 and D8 + 1/2 points."""
    integer = _d8_into(x, row, factor, 0.0, out, row)
    if _d8_into(x, row, factor, 0.5, scratch, 0) < integer:
        out[row] = scratch[0]


@njit(cache=True, nogil=True, inline="always")
def _inside(points, row, tie):
    """points[row] - tie inside the Voronoi cell of 4E8 around 0: <y, r> < 4 for all 240 roots r of E8.
    Over the roots +-e_i +- e_j the largest <y, r> is the sum of the two largest |y_i|; over the roots
    (+-1/2)^8 with an even number of minus signs, sum |y_i| / 2, less the smallest |y_i| when y has an
    odd number of negative entries."""
    largest, second, smallest, total, negatives = 0.0, 0.0, np.inf, 0.0, 0
    for j in range(GROUP):
        value = points[row, j] - tie[j]
        size = abs(value)
        negatives += value < 0
        total += size
        smallest = min(smallest, size)
        if size > largest:
            largest, second = size, largest
        elif size > second:
            second = size
    halves = 0.5 * total - (smallest if negatives % 2 else 0.0)
    return max(largest + second, halves) < 4


CHUNK = 4096


@njit(cache=True, parallel=True)
def _nearest_rows(x, out, d8_only):
    for chunk in prange((x.shape[0] + CHUNK - 1) // CHUNK):
        scratch = np.empty((1, GROUP), x.dtype)
        for row in range(chunk * CHUNK, min(x.shape[0], (chunk + 1) * CHUNK)):
            if d8_only:
                _d8_into(x, row, 1.0, 0.0, out, row)
            else:
                _e8_into(x, row, 1.0, out, scratch)


@njit(cache=True, parallel=True)
def _inside_rows(points, tie, out):
    for row in prange(points.shape[0]):
        out[row] = _inside(points, row, tie)


@njit(cache=True, parallel=True)
def _encode_rows(x, tie, out):
    for chunk in prange((x.shape[0] + CHUNK - 1) // CHUNK):
        scratch = np.empty((1, GROUP), x.dtype)
        for row in range(chunk * CHUNK, min(x.shape[0], (chunk + 1) * CHUNK)):
            factor = 1.0
            for _ in range(MAX_SHRINKS + 1):
                _e8_into(x, row, factor, out, scratch)
                if _inside(out, row, tie):
                    break
                factor *= SHRINK
            else:  # unreachable in practice: 0.9^60 shrinks anything onto the origin's cell
                out[row] = 0.0


def _rows(x: torch.Tensor) -> np.ndarray:
    if x.shape[-1] != GROUP:
        raise InputError(f"E8 codes groups of 8 coordinates; got a last dimension of {x.shape[-1]}")
    return np.ascontiguousarray(x.detach().reshape(-1, GROUP).numpy())


def _tie(dtype) -> np.ndarray:
    return TIE.numpy().astype(dtype)


def nearest_d8(x: torch.Tensor) -> torch.Tensor:
    """(..., 8) -> the nearest point of D8 (integer vectors of even sum)."""
    rows = _rows(x)
    out = np.empty_like(rows)
    _nearest_rows(rows, out, True)
    return torch.from_numpy(out).reshape(x.shape)


def nearest_e8(x: torch.Tensor) -> torch.Tensor:
    """(..., 8) -> the nearest point of E8 = D8 u (D8 + 1/2)."""
    rows = _rows(x)
    out = np.empty_like(rows)
    _nearest_rows(rows, out, False)
    return torch.from_numpy(out).reshape(x.shape)


def _cell_origin(points: torch.Tensor) -> torch.Tensor:
    """The 4E8 point whose (offset) Voronoi cell holds each E8 point."""
    return 4 * nearest_e8((points - TIE.to(points.dtype)) / 4)


def in_codebook(points: torch.Tensor) -> torch.Tensor:
    """bool (...): the E8 point is its coset's codeword (`_inside`)."""
    rows = _rows(points)
    out = np.empty(len(rows), np.bool_)
    _inside_rows(rows, _tie(rows.dtype), out)
    return torch.from_numpy(out).reshape(points.shape[:-1])


def reduce(points: torch.Tensor) -> torch.Tensor:
    """Each E8 point's coset representative in the codebook (the naive wrap, for codes and tests)."""
    return points - _cell_origin(points)


def encode(x: torch.Tensor) -> torch.Tensor:
    """(..., 8) scaled weights -> codebook points: the nearest E8 point, the vector shrunk toward 0
    (x 0.9 per step) until that point is in the codebook (overload handling, module docstring). A numba
    kernel over the 8-vectors: QAT encodes all 13.3M of SmolLM2's every step."""
    rows = _rows(x)
    out = np.empty_like(rows)
    _encode_rows(rows, _tie(rows.dtype), out)
    return torch.from_numpy(out).reshape(x.shape)


def to_code(points: torch.Tensor) -> torch.Tensor:
    """(..., 8) codebook points -> int64 codes in [0, 2^16): the coset's basis coordinates mod 4."""
    coords = torch.round(points.double() @ torch.linalg.inv(BASIS)).long() % 4
    return (coords * 4 ** torch.arange(8)).sum(-1)


def from_code(codes: torch.Tensor) -> torch.Tensor:
    """int codes -> (..., 8) codebook points (float32)."""
    digits = (codes.unsqueeze(-1) // 4 ** torch.arange(8)) % 4
    return reduce((digits.double() @ BASIS).float())


def bits_per_weight(group_size: int, scale_bits: int = 16) -> float:
    """2.0 code bits plus one fp16 scale per group_size weights."""
    return CODE_BITS + scale_bits / group_size


def _check(weight: torch.Tensor, group_size: int) -> None:
    if group_size % GROUP:
        raise InputError(f"group size {group_size} is not a multiple of 8 (E8 codes 8 weights at a time)")
    if weight.shape[-1] % group_size:
        raise InputError(f"a linear layer of input width {weight.shape[-1]} is not a multiple of the group size "
                         f"({group_size})")


def initial_scales(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """(rows, cols / group_size): the group's RMS, the scale at which Gaussian weights code best."""
    _check(weight, group_size)
    grouped = weight.detach().reshape(weight.shape[0], -1, group_size)
    return grouped.pow(2).mean(-1).sqrt().clamp(min=1e-8).to(torch.float16).float()


def quantize(weight: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """The dequantized weight, differentiable by the straight-through estimator in weight and scales."""
    _check(weight, group_size)
    rows, cols = weight.shape
    s = scales.repeat_interleave(group_size, 1).reshape(rows, cols // GROUP, GROUP)
    x = weight.reshape(rows, cols // GROUP, GROUP) / s
    points = encode(x.detach())
    straight = x + (points - x).detach()
    return (straight * s).reshape(rows, cols)


@dataclass
class E8Quantizer:
    """E8 codes with per-group scales, post-training (the scale at the group's RMS, no training)."""
    group_size: int = 64
    name = "e8-ptq"

    def bits_per_weight(self) -> float:
        return bits_per_weight(self.group_size)

    def compress(self, weight: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return quantize(weight, initial_scales(weight, self.group_size), self.group_size)


@dataclass
class Training:
    """QAT's knobs; `quantizer`: 'e8' (the method) or 'rtn2' (the same budget with 4-level scalars)."""
    quantizer: str = "e8"
    steps: int = 200
    batch: int = 4
    length: int = 128
    lr: float = 1e-5
    scale_lr: float = 1e-3
    group_size: int = 64
    seed: int = 0
    checkpoint_every: int = 50
    losses: list[float] = field(default_factory=list, repr=False)


class TrainingDiverged(RuntimeError):
    pass


def _quantizer(training: Training):
    if training.quantizer == "e8":
        return quantize
    if training.quantizer == "rtn2":
        from claimbench.baselines.two_bit import quantize_2bit
        return quantize_2bit
    raise InputError(f"quantizer must be 'e8' or 'rtn2'; got {training.quantizer!r}")


def train(model, rows: torch.Tensor, training: Training, checkpoint: Path | None = None,
          progress=log.info) -> dict[str, torch.Tensor]:
    """QAT of every block linear of model on token rows (n, length); returns name -> dequantized weight
    (the model's own weights are never changed: they are the distillation teacher). With checkpoint,
    training resumes from it when it exists and saves to it every checkpoint_every steps."""
    from claimbench.baselines.weight_compression import block_linears
    quantizer = _quantizer(training)
    originals = {f"{name}.weight": module.weight.detach() for name, module in block_linears(model).items()}
    weights = {name: w.clone().requires_grad_(True) for name, w in originals.items()}
    scales = {name: initial_scales(w, training.group_size).requires_grad_(True) for name, w in originals.items()}
    optimizer = torch.optim.Adam([{"params": list(weights.values()), "lr": training.lr},
                                  {"params": list(scales.values()), "lr": training.scale_lr}])
    start = 0
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        for name in weights:
            weights[name].data.copy_(state["weights"][name])
            scales[name].data.copy_(state["scales"][name])
        optimizer.load_state_dict(state["optimizer"])
        start, training.losses = state["step"], state["losses"]
        progress(f"e8-qat: resumed {training.quantizer} at step {start} from {checkpoint}")
    generator = torch.Generator().manual_seed(training.seed)
    order = torch.randperm(len(rows), generator=generator)
    params = {name: p.detach() for name, p in model.named_parameters()}
    for step in range(start, training.steps):
        index = order[(step * training.batch + torch.arange(training.batch)) % len(rows)]
        batch = rows[index]
        with torch.no_grad():
            target = torch.log_softmax(model(batch).float(), -1)
        dequantized = {name: quantizer(weights[name], scales[name], training.group_size) for name in weights}
        logits = torch.func.functional_call(model, {**params, **dequantized}, (batch,))
        loss = torch.nn.functional.kl_div(torch.log_softmax(logits.float(), -1), target, log_target=True,
                                          reduction="batchmean") / batch.shape[1]
        if not torch.isfinite(loss):
            raise TrainingDiverged(f"{training.quantizer} QAT diverged at step {step} (loss {loss.item()}); "
                                   f"the last good checkpoint is kept{f' at {checkpoint}' if checkpoint else ''}")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            for s in scales.values():
                s.clamp_(min=1e-6)
        if any(not torch.isfinite(w).all() for w in weights.values()):
            raise TrainingDiverged(f"{training.quantizer} QAT produced non-finite weights at step {step}; the "
                                   f"last good checkpoint is kept{f' at {checkpoint}' if checkpoint else ''}")
        training.losses.append(loss.item())
        if checkpoint is not None and (step + 1) % training.checkpoint_every == 0:
            torch.save({"weights": {k: w.detach() for k, w in weights.items()},
                        "scales": {k: s.detach() for k, s in scales.items()},
                        "optimizer": optimizer.state_dict(), "step": step + 1, "losses": training.losses,
                        "training": asdict(training) | {"losses": None}}, checkpoint)
        if (step + 1) % max(1, training.steps // 10) == 0:
            progress(f"e8-qat: {training.quantizer} step {step + 1}/{training.steps}: KL {loss.item():.4f}")
    with torch.no_grad():
        return {name: quantizer(weights[name], scales[name], training.group_size) for name in weights}
