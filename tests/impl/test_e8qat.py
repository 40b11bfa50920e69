"""E8 lattice coding (nearest points against brute force, the 2^16-point Voronoi codebook), bits,
the straight-through estimator and QAT on the tiny model; the 2-bit baselines (RTN, E8P)."""
import itertools

import pytest
import torch

from claimbench.baselines import two_bit
from claimbench.impl import e8qat
from claimbench.interfaces import InputError
from claimbench.llm.model import Llama, LlamaConfig


def neighbourhood(point: torch.Tensor) -> torch.Tensor:
    """E8 points near `point`: D8 and D8 + 1/2 points within 1 of its rounding, by brute force."""
    base = torch.round(point)
    steps = torch.tensor(list(itertools.product((-1.0, 0.0, 1.0), repeat=8)))
    integer = base + steps
    integer = integer[torch.remainder(integer.sum(1), 2) == 0]
    half = torch.floor(point) + 0.5 + torch.tensor(list(itertools.product((-1.0, 0.0), repeat=8)))
    half = torch.cat([half, half + 1])
    half = half[torch.remainder((half - 0.5).sum(1), 2) == 0]
    return torch.cat([integer, half])


def test_nearest_e8_matches_brute_force_and_fixes_lattice_points():
    torch.manual_seed(0)
    x = torch.randn(60, 8) * 2
    nearest = e8qat.nearest_e8(x)
    for row, found in zip(x, nearest):
        candidates = neighbourhood(row)
        best = ((candidates - row) ** 2).sum(1).min()
        assert ((found - row) ** 2).sum() <= best + 1e-5
    assert torch.equal(e8qat.nearest_e8(nearest), nearest)  # lattice points are their own nearest
    assert torch.equal(e8qat.nearest_d8(torch.tensor([[0.6, 0.6, 0, 0, 0, 0, 0, 0.1]])),
                       torch.tensor([[1.0, 1.0, 0, 0, 0, 0, 0, 0]]))


def test_the_codebook_has_2_16_distinct_points_and_every_code_names_its_point():
    codes = torch.arange(2 ** 16)
    points = e8qat.from_code(codes)
    assert len({tuple(p) for p in (2 * points).round().int().tolist()}) == 2 ** 16
    assert torch.equal(e8qat.to_code(points), codes)
    assert e8qat.in_codebook(points).all()
    assert torch.equal(e8qat.nearest_e8(points), points)  # all of them E8 points
    wrapped = e8qat.nearest_e8(torch.randn(5000, 8) * 6)  # the fast cell test agrees with the wrap
    assert torch.equal(e8qat.in_codebook(wrapped), (e8qat.reduce(wrapped) == wrapped).all(-1))


def test_encoding_stays_in_the_codebook_and_beats_the_4_level_scalar_on_gaussian_data():
    torch.manual_seed(1)
    x = torch.randn(50_000, 8)
    best_e8 = min(float(((e8qat.encode(x / s) * s - x) ** 2).mean()) for s in (0.9, 1.0, 1.1))
    best_scalar = min(float(((torch.clamp(torch.floor(x / s), -2, 1) + 0.5) * s - x).pow(2).mean())
                      for s in (0.9, 1.0, 1.1))
    assert e8qat.in_codebook(e8qat.encode(x)).all()
    assert best_e8 < best_scalar < 0.13


def test_encoding_shrinks_each_overloaded_vector_until_its_nearest_point_is_a_codeword():
    torch.manual_seed(2)
    x = torch.randn(300, 8) * 1.5
    coded = e8qat.encode(x)
    for row, found in zip(x, coded):
        factor = 1.0
        while not e8qat.in_codebook(e8qat.nearest_e8(row * factor)):
            factor *= e8qat.SHRINK
        assert torch.equal(found, e8qat.nearest_e8(row * factor))
    with pytest.raises(InputError, match="groups of 8"):
        e8qat.encode(torch.zeros(3, 7))


def test_bits_per_weight_by_hand():
    assert e8qat.bits_per_weight(64) == 2.0 + 16 / 64 == 2.25
    assert e8qat.bits_per_weight(576) == pytest.approx(2.0278, abs=1e-4)
    assert two_bit.E8PQuantizer().bits_per_weight() == 2.25


def test_the_straight_through_estimator_passes_gradients_to_weights_and_scales():
    torch.manual_seed(0)
    weight = torch.randn(4, 64, requires_grad=True)
    scales = e8qat.initial_scales(weight, 64).requires_grad_(True)
    e8qat.quantize(weight, scales, 64).sum().backward()
    assert torch.equal(weight.grad, torch.ones_like(weight))  # identity through the lattice rounding
    assert scales.grad is not None and torch.isfinite(scales.grad).all()


def test_bad_group_sizes_are_refused():
    with pytest.raises(InputError, match="multiple of 8"):
        e8qat.initial_scales(torch.randn(4, 60), 12)
    with pytest.raises(InputError, match="group size"):
        e8qat.quantize(torch.randn(4, 72), torch.ones(4, 1), 64)
    with pytest.raises(InputError, match="quantizer"):
        e8qat.train(None, torch.zeros(1, 4, dtype=torch.long), e8qat.Training(quantizer="nf2"))


def tiny():
    """The tiny model with its block linears scaled up, so that the blocks (not the embeddings alone)
    decide its output and quantizing them costs something to train away."""
    from claimbench.baselines.weight_compression import block_linears
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny()).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    for module in block_linears(model).values():
        module.weight.mul_(8)
    return model


@pytest.mark.parametrize("quantizer", ["e8", "rtn2"])
def test_qat_on_the_tiny_model_lowers_its_loss_and_resumes_from_a_checkpoint(quantizer, tmp_path):
    model = tiny()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rows = torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(0))
    training = e8qat.Training(quantizer=quantizer, steps=30, batch=8, lr=3e-3, scale_lr=3e-3, checkpoint_every=10)
    weights = e8qat.train(model, rows, training, checkpoint=tmp_path / "qat.pt", progress=lambda *a, **k: None)
    assert sum(training.losses[-5:]) < sum(training.losses[:5])
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the teacher is untouched
    assert len(weights) == 7 * model.config.n_layers
    resumed = e8qat.Training(quantizer=quantizer, steps=35, batch=8, lr=3e-3, scale_lr=3e-3, checkpoint_every=10)
    e8qat.train(model, rows, resumed, checkpoint=tmp_path / "qat.pt", progress=lambda *a, **k: None)
    assert len(resumed.losses) == 35 and resumed.losses[:30] == training.losses[:30]


def test_a_diverged_step_is_named_and_stops_training(tmp_path, monkeypatch):
    model = tiny()
    rows = torch.randint(0, 256, (4, 16))
    per_step = 7 * model.config.n_layers
    calls = []
    real = e8qat.quantize

    def breaks_at_step_2(weight, scales, group_size):
        calls.append(1)
        out = real(weight, scales, group_size)
        return out * float("nan") if len(calls) > 2 * per_step else out
    monkeypatch.setattr(e8qat, "quantize", breaks_at_step_2)
    training = e8qat.Training(steps=5, batch=4, checkpoint_every=1)
    with pytest.raises(e8qat.TrainingDiverged, match="diverged at step 2"):
        e8qat.train(model, rows, training, checkpoint=tmp_path / "c.pt", progress=lambda *a, **k: None)
    assert torch.load(tmp_path / "c.pt", weights_only=False)["step"] == 2  # the last good one


def test_e8p_codebook_has_2_16_points_in_e8_plus_a_quarter_shift():
    book = two_bit.E8PCodebook()
    assert book.absolute.shape == (256, 8) and (book.absolute ** 2).sum(1).max() == 12
    points = book.decode_all()
    assert points.shape == (2 ** 16, 8) and len({tuple(p) for p in (4 * points).round().int().tolist()}) == 2 ** 16
    unshifted = torch.cat([points[:2 ** 15] - 0.25, points[2 ** 15:] + 0.25])
    assert torch.equal(e8qat.nearest_e8(unshifted), unshifted)  # in E8 (D8 + 1/2)
    torch.manual_seed(0)
    x = torch.randn(3000, 8)
    coded = book.encode(x)
    assert {tuple(p) for p in (4 * coded).round().int().tolist()} <= {tuple(p) for p in (4 * points).round().int().tolist()}


def test_ptq_baselines_keep_the_shape_and_beat_zero():
    torch.manual_seed(0)
    weight = torch.randn(32, 128)
    for compress in (two_bit.rtn_2bit, e8qat.E8Quantizer().compress, two_bit.E8PQuantizer().compress):
        out = compress(weight)
        assert out.shape == weight.shape and float((out - weight).pow(2).mean()) < 0.15
