"""Bit accounting against hand counts, the formats behind WeightFormat, and the CPU kernels' results."""
import pytest
import torch

from claimbench.baselines import weight_compression as wc
from claimbench.impl import sparsity24 as s
from claimbench.interfaces import InputError


def test_bits_per_weight_by_hand():
    # dense INTb: b value bits + one 16-bit scale per 64 weights
    assert [s.dense_bits(b) for b in (8, 6, 5, 4, 3)] == [8.25, 6.25, 5.25, 4.25, 3.25]
    assert s.dense_bits(16) == 16  # fp16: no scale
    assert s.dense_bits(4, group_size=128) == 4.125
    # 2:4 + INTb: per group of 4 weights, 2 values of b bits and a 4-bit position code; 16-bit scale per 64
    assert s.semi_structured_bits(8) == (2 * 8 + 4) / 4 + 16 / 64 == 5.25
    assert s.semi_structured_bits(6) == 4.25
    assert s.semi_structured_bits(4) == 3.25
    assert s.semi_structured_bits(16) == (2 * 16 + 4) / 4 == 9
    # before scales, the counts: 2:4 + INT8 = 5, 2:4 + INT4 = 3
    assert s.semi_structured_bits(8, scale_bits=0) == 5 and s.semi_structured_bits(4, scale_bits=0) == 3
    # unstructured, half the weights kept: a bitmap (1 bit each) + 8-bit values; CSR: 8 + 10 index bits per
    # kept value over 576 inputs, + a 32-bit row pointer per row
    assert s.unstructured_bits(8, 0.5, 576) == 5.0
    assert s.unstructured_bits(8, 0.5, 576, "csr") == pytest.approx(0.5 * 18 + 32 / 576)


def test_each_2_4_format_meets_its_dense_partner_at_equal_bits():
    for pruner in s.PRUNERS:
        for bits, partner_bits in ((8, 5), (6, 4), (4, 3)):
            sparse = s.SemiStructured24(pruner, bits)
            dense = s.dense_partner(sparse)
            assert dense.bits == partner_bits and dense.bits_per_weight() == sparse.bits_per_weight()
            assert dense.quantizer == ("gptq" if pruner == "sparsegpt" else "rtn")
    with pytest.raises(InputError, match="no dense integer format"):
        s.dense_partner(s.SemiStructured24("wanda"))


def test_format_names_and_calibration_needs():
    assert s.Dense().name == "fp16" and not s.Dense().needs_calibration
    assert s.Dense(5, "gptq").name == "gptq-int5" and s.Dense(5, "gptq").needs_calibration
    assert not s.Dense(5).needs_calibration
    assert s.SemiStructured24("magnitude", 8).name == "magnitude-2:4+int8"
    assert not s.SemiStructured24("magnitude", 8).needs_calibration
    assert s.SemiStructured24("sparsegpt").name == "sparsegpt-2:4" and s.SemiStructured24("sparsegpt").needs_calibration


def test_formats_store_what_they_count():
    torch.manual_seed(0)
    weight = torch.randn(16, 128)
    fp16 = s.SemiStructured24("magnitude").compress(weight, None)
    assert torch.equal(fp16, fp16.half().float()) and s.two_of_four_share(fp16) == 1.0
    int8 = s.SemiStructured24("magnitude", 8).compress(weight, None)
    step = wc.group_scales(int8, 8).repeat_interleave(64, 1)
    assert torch.allclose((int8 / step).round() * step, int8) and s.two_of_four_share(int8) == 1.0
    assert s.two_of_four_share(weight) == 0.0


def test_bad_formats_are_refused():
    with pytest.raises(InputError, match="pruner"):
        s.SemiStructured24("random")
    with pytest.raises(InputError, match="quantizer"):
        s.Dense(4, "awq")
    with pytest.raises(InputError, match="not supported"):
        s.Dense(12)
    with pytest.raises(InputError, match="density"):
        s.unstructured_bits(8, 1.5, 64)


def test_cpu_kernels_compute_what_their_formats_store():
    torch.manual_seed(0)
    weights = [torch.randn(96, 128), torch.randn(64, 192)]
    xs = [torch.randn(3, 128), torch.randn(3, 192)]
    kernels = s.cpu_matmuls(weights)
    assert {how for _, how in kernels.values()} == {"native", "emulated"}
    reference = kernels["fp32"][0](xs)
    tolerance = {"fp32": 1e-6, "int8-weight-only": 0.02, "int4-weight-only": 0.15, "int5-dequantize": 0.08}
    for name, limit in tolerance.items():
        for out, ref in zip(kernels[name][0](xs), reference):
            assert float((out - ref).norm() / ref.norm()) < limit, name
    int5_twice = kernels["int5-dequantize"][0](xs), kernels["int5-dequantize"][0](xs)  # its buffer is reused
    assert all(torch.equal(first, second) for first, second in zip(*int5_twice))
    for out, w, x in zip(kernels["2:4-csr"][0](xs), weights, xs):
        assert torch.allclose(out, x @ (w * wc.magnitude_24(w)).T, atol=1e-4)
