"""Is 2:4 sparsity still worth it? (PAPERS.md C5): weight formats with every stored bit counted, so
that 2:4 sparsity plus quantization meets dense quantization at equal storage bits.

Bit accounting, per original weight (scales are fp16, one per group of `group_size` original
weights of a row):
- dense INTb: b + 16 / group_size (INT8 per group of 64: 8.25; INT5: 5.25; INT4: 4.25; INT3: 3.25);
  fp16: 16, no scale.
- 2:4 + INTb: the hardware format keeps 2 values and a 4-bit position code (2 bits per kept value)
  in every group of 4: b/2 + 1, plus 16 / group_size (a group spans group_size original positions,
  half of them stored); 2:4 + INT8 = 5.25 = INT5, 2:4 + INT6 = 4.25 = INT4, 2:4 + INT4 = 3.25 = INT3;
  2:4 + fp16: 9. (log2(6) = 2.58 bits would name the pair; the hardware spends 4.)
- unstructured sparsity at density d (for context): a bitmap, 1 + d * b, or CSR, d * (b + ceil(log2
  in)) + 32 / in for the row pointers (at d = 0.5 and b = 8 over 576 inputs: 5.0 and 9.06).
The formats (`Dense`, `SemiStructured24`) implement `WeightFormat`; their weights come from
baselines/weight_compression.py: RTN or GPTQ for dense; magnitude, Wanda (values then rounded by
RTN) or SparseGPT (values quantized jointly by its second-order loop) for 2:4. `equal_bits_pairs`
pairs each 2:4 format with the dense format of the same bits per weight: one precision tier
lower at the same nominal compute tier, the paper's comparison.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from claimbench.baselines import weight_compression as wc
from claimbench.interfaces import InputError, WeightFormat

SCALE_BITS = 16
FP16 = 16
POSITION_BITS_PER_WEIGHT = 1.0  # a 4-bit code per group of 4
QUANTIZERS = ("rtn", "gptq")
PRUNERS = ("magnitude", "wanda", "sparsegpt")


def dense_bits(value_bits: int, group_size: int = wc.GROUP_SIZE, scale_bits: int = SCALE_BITS) -> float:
    """Bits per weight of dense INT value_bits with a scale per group (fp16 weights: 16)."""
    return float(FP16) if value_bits == FP16 else value_bits + scale_bits / group_size


def semi_structured_bits(value_bits: int, group_size: int = wc.GROUP_SIZE, scale_bits: int = SCALE_BITS) -> float:
    """Bits per original weight of 2:4 sparsity with INT value_bits (or fp16) kept values."""
    scales = 0.0 if value_bits == FP16 else scale_bits / group_size
    return value_bits / 2 + POSITION_BITS_PER_WEIGHT + scales


def unstructured_bits(value_bits: int, density: float, in_features: int, index: str = "bitmap") -> float:
    """Bits per original weight of unstructured sparsity (no scales), its index as a bitmap or CSR."""
    if not 0 <= density <= 1:
        raise InputError(f"density must be in [0, 1]; got {density}")
    if index == "bitmap":
        return 1 + density * value_bits
    if index == "csr":
        return density * (value_bits + math.ceil(math.log2(in_features))) + 32 / in_features
    raise InputError(f"index must be 'bitmap' or 'csr'; got {index!r}")


def _fp16(weight: torch.Tensor) -> torch.Tensor:
    return weight.to(torch.float16).to(weight.dtype)


@dataclass
class Dense(WeightFormat):
    """Dense weights: fp16 (bits=16) or INT bits per group, by RTN or GPTQ."""
    bits: int = FP16
    quantizer: str = "rtn"
    group_size: int = wc.GROUP_SIZE

    def __post_init__(self):
        if self.quantizer not in QUANTIZERS:
            raise InputError(f"quantizer must be one of {', '.join(QUANTIZERS)}; got {self.quantizer!r}")
        if self.bits != FP16:
            wc._check_bits(self.bits)
        self.needs_calibration = self.quantizer == "gptq" and self.bits != FP16
        self.name = "fp16" if self.bits == FP16 else f"{self.quantizer}-int{self.bits}"

    def bits_per_weight(self) -> float:
        return dense_bits(self.bits, self.group_size)

    def compress(self, weight, statistics):
        if self.bits == FP16:
            return _fp16(weight)
        if self.quantizer == "gptq":
            return wc.second_order(weight, statistics, bits=self.bits, group_size=self.group_size)
        return wc.quantize_groups(weight, self.bits, self.group_size)


@dataclass
class SemiStructured24(WeightFormat):
    """2:4 sparsity (2 kept weights in every 4 consecutive inputs of a row) by a pruner, the kept values
    in fp16 (bits=16) or INT bits per group: RTN after magnitude or Wanda, jointly with SparseGPT."""
    pruner: str = "wanda"
    bits: int = FP16
    group_size: int = wc.GROUP_SIZE

    def __post_init__(self):
        if self.pruner not in PRUNERS:
            raise InputError(f"pruner must be one of {', '.join(PRUNERS)}; got {self.pruner!r}")
        if self.bits != FP16:
            wc._check_bits(self.bits)
        self.needs_calibration = self.pruner != "magnitude"
        self.name = f"{self.pruner}-2:4" + ("" if self.bits == FP16 else f"+int{self.bits}")

    def bits_per_weight(self) -> float:
        return semi_structured_bits(self.bits, self.group_size)

    def compress(self, weight, statistics):
        quantized = self.bits != FP16
        if self.pruner == "sparsegpt":
            out = wc.second_order(weight, statistics, prune_24=True, bits=self.bits if quantized else None,
                                  group_size=self.group_size)
            return out if quantized else _fp16(out)
        mask = wc.magnitude_24(weight) if self.pruner == "magnitude" else wc.wanda_24(weight, statistics.input_norms)
        pruned = weight * mask
        return wc.quantize_groups(pruned, self.bits, self.group_size) if quantized else _fp16(pruned)


def dense_partner(fmt: SemiStructured24) -> Dense:
    """The dense format of the same bits per weight, quantized the way fmt's values are (GPTQ for
    SparseGPT's joint quantization, RTN after magnitude and Wanda): one precision tier lower."""
    if fmt.bits == FP16:
        raise InputError("2:4 with fp16 values (9 bits per weight) has no dense integer format of equal bits here")
    bits = fmt.bits // 2 + 1  # b/2 + 1 position bit per weight, the scales equal
    partner = Dense(bits, "gptq" if fmt.pruner == "sparsegpt" else "rtn", fmt.group_size)
    assert partner.bits_per_weight() == fmt.bits_per_weight(), (partner, fmt)
    return partner


def two_of_four_share(weight: torch.Tensor) -> float:
    """Share of groups of 4 consecutive inputs of a row holding at most 2 non-zeros (1.0: valid 2:4)."""
    rows, cols = weight.shape
    return float(((weight.reshape(rows, cols // 4, 4) != 0).sum(-1) <= 2).float().mean())


def cpu_matmuls(weights: list[torch.Tensor]) -> dict[str, tuple[Callable, str]]:
    """What PyTorch runs on a CPU for each storage format: kernel name -> (call(xs) applying each
    weight (out, in) to its input xs[i] (tokens, in), how it runs). 'native': a kernel of the format
    itself (fp32 GEMM; int8 weight-only with per-channel scales, aten::_weight_int8pack_mm; int4
    weight-only per group of 64 with scales and zeros, aten::_weight_int4pack_mm_for_cpu; the 2:4 matrix
    as CSR, aten's sparse-dense product, which knows nothing of the 2:4 pattern). 'emulated': no kernel
    for the format exists here, so the weight is dequantized on every call before an fp32 GEMM (INT5;
    2:4 + INT8 would be the same), into a buffer kept across calls (the codes cast, then scaled in
    place: the time is the arithmetic's, not the allocator's): its time is the emulation's, never the
    format's."""
    int8 = []
    for w in weights:
        scale = w.abs().amax(1).clamp(min=1e-8) / 127
        int8.append(((w / scale.unsqueeze(1)).round().to(torch.int8), scale))
    int4 = []
    for w in weights:
        grouped = w.reshape(w.shape[0], -1, 64)
        low, high = grouped.amin(-1), grouped.amax(-1)
        scale = ((high - low) / 15).clamp(min=1e-8)
        q = torch.clamp(torch.round((grouped - low.unsqueeze(-1)) / scale.unsqueeze(-1)), 0, 15).to(torch.int32)
        zero = low + 8 * scale  # the kernel computes (q - 8) * scale + zero
        int4.append((torch._convert_weight_to_int4pack_for_cpu(q.reshape(w.shape), 1),
                     torch.stack([scale.T, zero.T], -1).contiguous()))
    int5 = []
    for w in weights:
        scale = wc.group_scales(w, 5)
        codes = torch.round(w.reshape(w.shape[0], -1, 64) / scale.unsqueeze(-1)).clamp(-16, 15).to(torch.int8)
        int5.append((codes, scale.unsqueeze(-1), torch.empty(codes.shape)))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        csr = [(w * wc.magnitude_24(w)).to_sparse_csr() for w in weights]

    def fp32(xs):
        return [torch.nn.functional.linear(x, w) for x, w in zip(xs, weights)]

    def int8_weight_only(xs):
        return [torch._weight_int8pack_mm(x, q, scale) for x, (q, scale) in zip(xs, int8)]

    def int4_weight_only(xs):
        return [torch._weight_int4pack_mm_for_cpu(x, packed, 64, scale_zero)
                for x, (packed, scale_zero) in zip(xs, int4)]

    def two_four_csr(xs):
        return [torch.sparse.mm(w, x.T).T for x, w in zip(xs, csr)]

    def int5_dequantize(xs):
        return [torch.nn.functional.linear(x, dequantized.copy_(codes).mul_(scale).flatten(1))
                for x, (codes, scale, dequantized) in zip(xs, int5)]

    return {"fp32": (fp32, "native"), "int8-weight-only": (int8_weight_only, "native"),
            "int4-weight-only": (int4_weight_only, "native"), "2:4-csr": (two_four_csr, "native"),
            "int5-dequantize": (int5_dequantize, "emulated")}
