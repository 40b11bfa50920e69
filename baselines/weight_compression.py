"""2:4 semi-structured pruning and weight-only quantization of linear layers, and the calibration
statistics they read (the baselines of PAPERS.md C5; the formats built from them: impl/sparsity24.py).

- Group quantization (`quantize_groups`, RTN): symmetric, one scale per group of `group_size`
  consecutive input weights of a row, s = max|w| / (2^(b-1) - 1) rounded to fp16 (the stored
  scale), q = clamp(round(w / s), -2^(b-1), 2^(b-1) - 1): the dequantized weight is exactly what the
  format stores.
- Magnitude 2:4: in every group of 4 consecutive input weights of a row, the 2 largest |w| are kept.
- Wanda 2:4 (Sun et al., 2023): the score |w_ij| * ||X_j||_2, the input feature's norm over the
  calibration tokens, in the same groups of 4; no weight update.
- SparseGPT 2:4 (Frantar & Alistarh, 2023) and GPTQ (Frantar et al., 2022) share one second-order
  loop (`second_order`): columns in blocks of 128, the upper Cholesky factor U of the inverse of
  H = X^T X + 1% of its mean diagonal, each column's error (w - q) / U_jj spread over the columns
  after it. SparseGPT drops, at every 4th column, the 2 of the next 4 weights of each row with the
  smallest w^2 / U_jj^2; GPTQ rounds each column with its group's scale, set at the group's first
  column from the weights as updated so far; both at once is SparseGPT's joint sparsity + quantization.
  Defaults from the public code: block 128, damping 0.01.
- `compress_model` calibrates block by block: each block's inputs come from the blocks before it
  already compressed (the reference code's sequential order); X^T X is accumulated once per distinct
  input (wq, wk and wv read one, w1 and w3 another) over every calibration token.
Reconstructed (our reading of the papers and public code, not a copy): the scale of a group that is
pruned and quantized jointly is taken from its weights under the 2:4 choice the current weights would
make; the later groups of 4 inside it may choose otherwise once earlier errors have moved them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from claimbench.interfaces import InputError, WeightFormat

GROUP_SIZE = 64
SUPPORTED_BITS = tuple(range(2, 9))
BLOCK = 128
DAMP = 0.01
SHARED_INPUTS = {"attention.wq": ("attention.wk", "attention.wv"), "attention.wo": (),
                 "feed_forward.w1": ("feed_forward.w3",), "feed_forward.w2": ()}


@dataclass
class LayerStatistics:
    """What a linear layer saw on the calibration tokens: X^T X (in, in), float64, and the token count."""
    gram: Tensor
    tokens: int

    @property
    def input_norms(self) -> Tensor:
        """||X_j||_2 of every input feature j (Wanda's activation norm)."""
        return self.gram.diagonal().clamp(min=0).sqrt().float()


def _check_width(weight: Tensor, multiple: int, what: str) -> None:
    if weight.ndim != 2:
        raise InputError(f"a linear weight is (out, in); got shape {tuple(weight.shape)}")
    if weight.shape[1] % multiple:
        raise InputError(f"a linear layer of input width {weight.shape[1]} is not a multiple of {what} ({multiple})")


def _check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise InputError(f"{bits}-bit integers are not supported; supported: {', '.join(map(str, SUPPORTED_BITS))} "
                         "(and unquantized fp16 values)")


def group_scales(weight: Tensor, bits: int, group_size: int = GROUP_SIZE) -> Tensor:
    """(rows, cols / group_size) fp16-representable scales: max |w| of each group / (2^(bits-1) - 1)."""
    _check_bits(bits)
    _check_width(weight, group_size, "the group size")
    grouped = weight.reshape(weight.shape[0], -1, group_size)
    scale = (grouped.abs().amax(-1) / (2 ** (bits - 1) - 1)).to(torch.float16).float()
    return torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero group: any scale stores it


def _round_to_grid(x: Tensor, scale: Tensor, bits: int) -> Tensor:
    qmax = 2 ** (bits - 1) - 1
    return torch.clamp(torch.round(x / scale), -qmax - 1, qmax) * scale


def quantize_groups(weight: Tensor, bits: int, group_size: int = GROUP_SIZE) -> Tensor:
    """RTN: the dequantized weight, symmetric per group of group_size input weights (zeros stay zero)."""
    scale = group_scales(weight, bits, group_size)
    grouped = weight.reshape(weight.shape[0], -1, group_size)
    return _round_to_grid(grouped, scale.unsqueeze(-1), bits).reshape(weight.shape)


def _keep_two_of_four(score: Tensor) -> Tensor:
    """bool (rows, cols): True for the 2 highest scores of every 4 consecutive columns of a row."""
    rows, cols = score.shape
    groups = score.reshape(rows, cols // 4, 4)
    keep = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, groups.topk(2, dim=-1).indices, True)
    return keep.reshape(rows, cols)


def magnitude_24(weight: Tensor) -> Tensor:
    """The kept-weight mask of magnitude 2:4 pruning."""
    _check_width(weight, 4, "4 (2:4 sparsity)")
    return _keep_two_of_four(weight.abs())


def wanda_24(weight: Tensor, input_norms: Tensor) -> Tensor:
    """The kept-weight mask of Wanda 2:4: |w| times the input feature's calibration norm."""
    _check_width(weight, 4, "4 (2:4 sparsity)")
    assert input_norms.shape == (weight.shape[1],), (input_norms.shape, weight.shape)
    return _keep_two_of_four(weight.abs() * input_norms.unsqueeze(0))


def min_calibration_tokens(model) -> int:
    """X^T X of a layer has full rank only from as many tokens as the widest block linear has inputs."""
    return max(module.in_features for module in block_linears(model).values())


@torch.no_grad()
def second_order(weight: Tensor, statistics: LayerStatistics, prune_24: bool = False, bits: int | None = None,
                 group_size: int = GROUP_SIZE, block: int = BLOCK, damp: float = DAMP) -> Tensor:
    """SparseGPT (prune_24), GPTQ (bits) or both: the compressed weight, (out, in) like weight."""
    rows, cols = weight.shape
    assert statistics.gram.shape == (cols, cols), (statistics.gram.shape, weight.shape)
    if prune_24:
        _check_width(weight, 4, "4 (2:4 sparsity)")
    if bits is not None:
        _check_bits(bits)
        _check_width(weight, group_size, "the group size")
        if block % group_size:
            raise InputError(f"the column block ({block}) must be a multiple of the group size ({group_size})")
    w = weight.detach().float().clone()
    h = statistics.gram.double().clone()
    dead = h.diagonal() == 0  # inputs that were always zero: their weights cannot matter
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += damp * h.diagonal().mean() * torch.eye(cols, dtype=h.dtype)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True).float()
    out = torch.zeros_like(w)
    scale = None
    for start in range(0, cols, block):
        end = min(start + block, cols)
        w1, u1 = w[:, start:end].clone(), u[start:end, start:end]
        diag = u1.diagonal()
        keep = torch.ones_like(w1, dtype=torch.bool)
        errors = torch.zeros_like(w1)
        for i in range(end - start):
            if prune_24 and i % 4 == 0:
                score = w1[:, i:i + 4] ** 2 / diag[i:i + 4] ** 2
                keep[:, i:i + 4] = _keep_two_of_four(score)
            if bits is not None and (start + i) % group_size == 0:
                group = w1[:, i:i + group_size]
                if prune_24:
                    group = group * _keep_two_of_four(group ** 2 / diag[i:i + group_size] ** 2)
                scale = group_scales(group, bits, group_size)[:, 0]
            column = w1[:, i]
            q = column * keep[:, i]
            if bits is not None:
                q = _round_to_grid(q, scale, bits)
            out[:, start + i] = q
            error = (column - q) / u1[i, i]
            w1[:, i:] -= error.unsqueeze(1) * u1[i, i:].unsqueeze(0)
            errors[:, i] = error
        w[:, end:] -= errors @ u[start:end, end:]
    return out.to(weight.dtype)


def block_linears(model) -> dict[str, nn.Linear]:
    """'layers.{i}.attention.wq' etc. -> the module, for every linear layer of the blocks (the tied
    embedding and output head are not compressed)."""
    return {f"layers.{i}.{name}": block.get_submodule(name)
            for i, block in enumerate(model.layers) for first, shared in SHARED_INPUTS.items()
            for name in (first, *shared)}


def _block_statistics(block, x, cos, sin, positions, hooks) -> dict[str, LayerStatistics]:
    """Run x through the block once, accumulating X^T X of each distinct linear input."""
    stats: dict[str, LayerStatistics] = {}

    def capture(name):
        def pre_hook(module, args):
            flat = args[0].reshape(-1, args[0].shape[-1]).float()
            stats[name] = LayerStatistics((flat.T @ flat).double(), flat.shape[0])
        return pre_hook

    handles = [block.get_submodule(name).register_forward_pre_hook(capture(name)) for name in SHARED_INPUTS]
    try:
        block(x, cos, sin, None, positions, hooks)
    finally:
        for handle in handles:
            handle.remove()
    return {name: stats[first] for first, shared in SHARED_INPUTS.items() for name in (first, *shared)}


@torch.no_grad()
def compress_model(model, fmt: WeightFormat, calibration: Tensor | None = None,
                   progress: Callable[[str], None] | None = None) -> dict[str, Tensor]:
    """Parameter name of every block linear's weight -> the dequantized weight fmt stores. A format
    that needs calibration gets it from calibration (n, T) token ids, block by block (see the module
    docstring); the model's own weights are left as they were."""
    linears = block_linears(model)
    if not fmt.needs_calibration:
        return {f"{name}.weight": fmt.compress(module.weight, None) for name, module in linears.items()}
    if calibration is None:
        raise InputError(f"{fmt.name} needs calibration tokens")
    need = min_calibration_tokens(model)
    if calibration.numel() < need:
        raise InputError(f"{fmt.name} needs at least {need} calibration tokens (the widest layer's input width, "
                         f"for a full-rank X^T X); got {calibration.numel()}")
    from claimbench.llm.model import rope_cos_sin
    saved, out = {}, {}
    try:
        positions = torch.arange(calibration.shape[1])
        x = model.tok_embeddings(calibration)
        cos, sin = rope_cos_sin(positions, model.inv_freq, x.dtype)
        for layer, block in enumerate(model.layers):
            stats = _block_statistics(block, x, cos, sin, positions, model.hooks)
            for local, statistics in stats.items():
                module = block.get_submodule(local)
                name = f"layers.{layer}.{local}.weight"
                saved[name] = module.weight.detach().clone()
                out[name] = fmt.compress(module.weight, statistics)
                module.weight.copy_(out[name])
            x = block(x, cos, sin, None, positions, model.hooks)
            if progress is not None:
                progress(f"{fmt.name}: block {layer + 1}/{len(model.layers)} compressed")
    finally:
        params = dict(model.named_parameters())
        for name, weight in saved.items():
            params[name].copy_(weight)
    return out
