"""2:4 pruning (magnitude, Wanda, SparseGPT), group RTN and GPTQ on small planted problems."""
import itertools

import pytest
import torch

from claimbench.baselines import weight_compression as wc
from claimbench.interfaces import InputError
from claimbench.llm.model import Llama, LlamaConfig


def statistics(x: torch.Tensor) -> wc.LayerStatistics:
    return wc.LayerStatistics((x.T @ x).double(), x.shape[0])


def correlated_inputs(n=512, d=128, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    mixing = torch.randn(d, d, generator=gen) / d ** 0.5 + torch.eye(d)
    return torch.randn(n, d, generator=gen) @ mixing * torch.linspace(0.2, 3.0, d)


def output_error(x, weight, compressed) -> float:
    return float(((x @ (weight - compressed).T) ** 2).sum() / ((x @ weight.T) ** 2).sum())


def nonzeros_per_group(weight: torch.Tensor) -> torch.Tensor:
    return (weight.reshape(weight.shape[0], -1, 4) != 0).sum(-1)


@pytest.mark.parametrize("how", ["magnitude", "wanda", "sparsegpt", "sparsegpt+int4"])
def test_every_group_of_four_keeps_exactly_two(how):
    """Two stored values in every group of 4 (a kept value that quantizes to 0 is still stored)."""
    torch.manual_seed(0)
    weight, x = torch.randn(48, 128), correlated_inputs()
    if how == "magnitude":
        pruned = weight * wc.magnitude_24(weight)
    elif how == "wanda":
        pruned = weight * wc.wanda_24(weight, statistics(x).input_norms)
    else:
        pruned = wc.second_order(weight, statistics(x), prune_24=True, bits=4 if how.endswith("int4") else None)
    counts = nonzeros_per_group(pruned)
    assert (counts <= 2).all()
    assert (counts == 2).all() if how != "sparsegpt+int4" else (counts == 2).float().mean() > 0.95


def planted():
    """Orthogonal input features of very different norms, and weights whose largest magnitudes
    sit on the weakest features: the output-error-optimal 2:4 mask is not magnitude's."""
    gen = torch.Generator().manual_seed(1)
    d = 16
    q, _ = torch.linalg.qr(torch.randn(64, d, generator=gen))
    norms = torch.tensor([1.0, 10.0, 0.1, 5.0] * 4)
    x = q * norms  # X^T X = diag(norms^2)
    weight = torch.tensor([[3.0, 0.5, 4.0, 1.0], [1.0, 2.0, 30.0, 0.2]]).repeat(3, 4)
    best = torch.zeros_like(weight, dtype=torch.bool)
    for r, g in itertools.product(range(weight.shape[0]), range(d // 4)):
        cols = range(4 * g, 4 * g + 4)
        keep = min(itertools.combinations(cols, 2),
                   key=lambda kept: sum(float(weight[r, c] * norms[c]) ** 2 for c in cols if c not in kept))
        best[r, list(keep)] = True
    return weight, x, best


def test_wanda_and_sparsegpt_find_the_planted_best_mask_and_magnitude_does_not():
    weight, x, best = planted()
    assert torch.equal(wc.wanda_24(weight, statistics(x).input_norms), best)
    sparse = wc.second_order(weight, statistics(x), prune_24=True, damp=1e-6)
    assert torch.equal(sparse != 0, best)
    assert torch.allclose(sparse[best], weight[best], atol=1e-3)  # orthogonal features: nothing to compensate
    assert not torch.equal(wc.magnitude_24(weight), best)


def test_sparsegpt_compensates_correlated_inputs_better_than_wanda():
    torch.manual_seed(0)
    weight, x = torch.randn(64, 128), correlated_inputs()
    wanda = weight * wc.wanda_24(weight, statistics(x).input_norms)
    sparsegpt = wc.second_order(weight, statistics(x), prune_24=True)
    assert output_error(x, weight, sparsegpt) < output_error(x, weight, wanda)


@pytest.mark.parametrize("bits", [3, 4, 5, 8])
def test_rtn_error_is_at_most_half_a_step_and_zeros_stay_zero(bits):
    torch.manual_seed(bits)
    weight = torch.randn(32, 128) * torch.rand(32, 1) * 3
    weight[:, :4] = 0
    deq = wc.quantize_groups(weight, bits)
    step = wc.group_scales(weight, bits).repeat_interleave(wc.GROUP_SIZE, 1)
    assert ((deq - weight).abs() <= step / 2 * (1 + 1e-3)).all()
    assert (deq[:, :4] == 0).all()
    levels = (deq.reshape(32, -1, wc.GROUP_SIZE) / step.reshape(32, -1, wc.GROUP_SIZE)).round()
    assert levels.min() >= -2 ** (bits - 1) and levels.max() <= 2 ** (bits - 1) - 1
    assert torch.equal(step, step.half().float())  # the stored scales are fp16


@pytest.mark.parametrize("bits", [3, 4])
def test_gptq_lowers_the_layer_output_error_below_rtn(bits):
    torch.manual_seed(0)
    weight, x = torch.randn(64, 128), correlated_inputs()
    gptq = wc.second_order(weight, statistics(x), bits=bits)
    rtn = wc.quantize_groups(weight, bits)
    assert output_error(x, weight, gptq) < 0.9 * output_error(x, weight, rtn)
    step = wc.group_scales(gptq, bits).repeat_interleave(wc.GROUP_SIZE, 1)
    assert torch.allclose((gptq / step).round() * step, gptq)  # on its groups' integer grids


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(InputError, match="multiple of 4"):
        wc.magnitude_24(torch.randn(4, 6))
    with pytest.raises(InputError, match="group size"):
        wc.quantize_groups(torch.randn(4, 96), 4)
    with pytest.raises(InputError, match="not supported"):
        wc.quantize_groups(torch.randn(4, 64), 16)
    with pytest.raises(InputError, match="not supported"):
        wc.second_order(torch.randn(4, 64), statistics(torch.randn(80, 64)), bits=1)


def tiny_model() -> Llama:
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny()).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def test_compress_model_covers_every_block_linear_and_leaves_the_model_as_it_was():
    from claimbench.impl.sparsity24 import SemiStructured24
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calibration = torch.randint(0, 256, (4, 64))
    out = wc.compress_model(model, SemiStructured24("sparsegpt", 8), calibration)
    assert set(out) == {f"{name}.weight" for name in wc.block_linears(model)}
    assert len(out) == 7 * model.config.n_layers
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert all((nonzeros_per_group(w) <= 2).all() for w in out.values())


def test_compress_model_calibrates_each_block_on_the_compressed_blocks_before_it(monkeypatch):
    """Block 1's statistics differ from those of the uncompressed model's block 1."""
    from claimbench.impl.sparsity24 import SemiStructured24
    model = tiny_model()
    calibration = torch.randint(0, 256, (4, 64))
    seen = []
    monkeypatch.setattr(SemiStructured24, "compress",
                        lambda self, weight, stats: (seen.append(stats.gram.clone()), torch.zeros_like(weight))[1])
    wc.compress_model(model, SemiStructured24("wanda"), calibration)
    # with block 0 zeroed, block 1 reads the embeddings alone: its attention input's X^T X is that of
    # the RMS-normalised embeddings times the norm weight
    embeddings = model.tok_embeddings(calibration)
    normed = model.layers[1].attention_norm(embeddings).reshape(-1, model.config.dim)
    assert torch.allclose(seen[7].float(), normed.T @ normed, rtol=1e-4, atol=1e-3)


def test_too_few_calibration_tokens_names_the_minimum():
    from claimbench.impl.sparsity24 import Dense
    model = tiny_model()
    with pytest.raises(InputError, match="at least 128 calibration tokens"):
        wc.compress_model(model, Dense(4, "gptq"), torch.randint(0, 256, (1, 100)))
