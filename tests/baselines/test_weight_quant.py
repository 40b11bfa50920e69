"""4-bit group quantization: RTN's error bound, learned calibration at initialisation = RTN, bad input."""
import pytest
import torch

from claimbench.baselines import weight_quant
from claimbench.interfaces import InputError


def test_rtn_round_trip_is_within_half_a_step_of_each_group():
    torch.manual_seed(0)
    w = torch.randn(16, 96) * torch.logspace(-2, 1, 96)  # groups of very different ranges
    deq = weight_quant.fake_quantize(w, bits=4, group_size=32)
    groups, back = w.reshape(16, 3, 32), deq.reshape(16, 3, 32)
    step = (groups.amax(-1) - groups.amin(-1)) / 15
    assert ((back - groups).abs() <= step.unsqueeze(-1) / 2 * (1 + 1e-4) + 1e-7).all()
    assert all(len(torch.unique(g)) <= 16 for g in back.reshape(-1, 32))  # 4 bits: at most 16 levels a group
    w[:, 5] = 0  # the zero point is an integer: 0 is a level of every group that spans it
    assert (weight_quant.fake_quantize(w, bits=4, group_size=32)[:, 5] == 0).all()


def _tiny():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 64))
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def test_learned_calibration_at_initialisation_equals_rtn():
    model = _tiny()
    weights = weight_quant.linear_weights(model)
    method = weight_quant.LearnedCalibration()
    start = method.dequantized(weights, method.parameters_for(weights))
    rtn = weight_quant.rtn(model)
    assert set(start) == set(rtn) == {"0.weight", "2.weight"}
    assert all(torch.equal(start[k], rtn[k]) for k in rtn)


def test_quantized_puts_weights_in_place_and_restores_them():
    model = _tiny()
    before = model[0].weight.clone()
    rtn = weight_quant.rtn(model)
    with weight_quant.quantized(model, rtn):
        assert torch.equal(model[0].weight, rtn["0.weight"])
    assert torch.equal(model[0].weight, before)


def test_a_width_that_is_not_a_multiple_of_the_group_size_is_refused():
    with pytest.raises(InputError, match="not a multiple of the group size 32"):
        weight_quant.fake_quantize(torch.randn(4, 40))
