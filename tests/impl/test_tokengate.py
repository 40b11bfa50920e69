"""TokenGate and its baselines on a tiny random-weight Llama (impl/tokengate.py, baselines/token_pruning.py)."""
import dataclasses

import pytest
import torch

from claimbench.baselines.token_pruning import (FastKV, FullPrefill, GemFilter, SnapKV, earliest_layer, needle_ranks,
                                                top_in_order, window_votes)
from claimbench.impl import tokengate
from claimbench.interfaces import InputError
from claimbench.llm import evaluate
from claimbench.llm.model import Llama, LlamaConfig

T = 96


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    config = dataclasses.replace(LlamaConfig.tiny(), n_layers=4, max_seq_len=256)
    model = Llama(config).eval()
    model.tok_embeddings.weight.data *= 0.1
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@pytest.fixture
def ids():
    return torch.randint(0, 256, (T,), generator=torch.Generator().manual_seed(3)).tolist()


def _gates(model, bias, layers=(1,)):
    gates = tokengate.Gates(model.config.dim, layers)
    for unit in gates.score.values():
        unit.bias.data.fill_(bias)
    return gates.eval().requires_grad_(False)


def test_with_every_token_kept_the_logits_are_the_full_models(tiny, ids):
    _, full = FullPrefill().prefill(tiny, ids)
    gate = tokengate.TokenGate(_gates(tiny, 8.0), threshold=0.01)
    cache, logits = gate.prefill(tiny, ids)
    assert torch.allclose(logits, full, atol=1e-5)
    assert cache.lengths == [T] * tiny.config.n_layers and gate.computed_share() == 1.0


def test_pruned_tokens_leave_later_layers_kv_and_the_always_kept_stay(tiny, ids):
    gate = tokengate.TokenGate(_gates(tiny, -8.0), threshold=0.5, sink=4, recent=16)
    cache, logits = gate.prefill(tiny, ids)
    assert cache.lengths[:2] == [T, T]  # layers up to the gate hold every token
    kept = sorted(range(4)) + list(range(T - 16, T))
    for layer in (2, 3):
        assert cache.lengths[layer] == 20
        assert cache.positions[layer][:20].tolist() == kept
        assert cache.k[layer].shape[2] == cache.v[layer].shape[2] == 20 + 64  # no room held for pruned tokens
    assert gate.computed_share() == pytest.approx((2 * T + 2 * 20) / (4 * T))
    out = evaluate.decode(tiny, cache, None, 4, token=ids[-1])  # decoding reads the pruned cache
    assert len(out) == 4


def test_a_threshold_that_keeps_nothing_keeps_the_always_kept_tokens(tiny, ids):
    gate = tokengate.TokenGate(_gates(tiny, -30.0), threshold=0.99, sink=2, recent=8)
    cache, _ = gate.prefill(tiny, ids)
    assert cache.lengths[-1] == 10 and gate.last_kept[-1] == 10
    for threshold in (0.0, 1.0):
        with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\)"):
            tokengate.TokenGate(_gates(tiny, 0.0), threshold=threshold)


def test_a_prompt_longer_than_the_window_is_refused(tiny):
    for method in (FullPrefill(), GemFilter(), FastKV(), SnapKV(), tokengate.TokenGate(_gates(tiny, 0.0))):
        with pytest.raises(InputError, match="longer than the model's window of 256"):
            method.prefill(tiny, list(range(250)), room=16)


def test_gates_refuse_another_model(tiny, tmp_path):
    path = tokengate.save_gates(_gates(tiny, 1.0), tiny, tmp_path / "gates.pt")
    loaded = tokengate.load_gates(tiny, path)
    assert loaded.layers == (1,) and float(loaded.score["1"].bias) == 1.0
    other = Llama(tiny.config).eval()
    with pytest.raises(InputError, match="gates trained for model .* not this one"):
        tokengate.load_gates(other, path)


def test_window_votes_and_gemfilter_pick_the_planted_tokens():
    """Keys at positions 10 and 40 point where the last queries do; every other key points away."""
    d, n = 8, 64
    k = torch.zeros(1, 1, n, d)
    k[0, 0, :, 1] = 1.0
    k[0, 0, [10, 40], 0] = 6.0
    k[0, 0, [10, 40], 1] = 0.0
    q = torch.zeros(1, 2, 4, d)
    q[..., 0] = 3.0
    votes = window_votes(q, k, pool=1)
    assert set(votes.topk(2).indices.tolist()) == {10, 40}
    gem = GemFilter(pool=1).scores(q[:, :, -1:], k)
    assert set(gem.topk(2).indices.tolist()) == {10, 40}
    assert top_in_order(votes, 2, torch.tensor([63])).tolist() == [10, 40, 63]


def test_the_needle_probe_ranks_every_layer_and_picks_the_earliest_that_finds_it(tiny, ids):
    scorers = {"gemfilter": GemFilter().scores, "fastkv": FastKV().scores}
    ranks = needle_ranks(tiny, [(ids, [10, 11]), (ids, [50])], scorers)
    assert set(ranks) == set(scorers)
    for worst in ranks.values():
        assert worst.shape == (tiny.config.n_layers,) and bool(((0 <= worst) & (worst < 1)).all())
    assert earliest_layer(torch.tensor([0.4, 0.03, 0.01, 0.2])) == 1
    assert earliest_layer(torch.tensor([0.4, 0.3, 0.2, 0.25]), top=0.05) == 2  # none within: the best


def test_fastkv_and_gemfilter_keep_their_share_and_snapkv_compresses_every_layer(tiny, ids):
    fast = FastKV(keep=0.25, layer=1, window=8)
    cache, _ = fast.prefill(tiny, ids)
    assert cache.lengths[:2] == [T, T] and cache.lengths[2:] == [24, 24]
    assert set(range(T - 8, T)) <= set(cache.positions[3][:24].tolist())  # the window goes on
    gem = GemFilter(keep=0.25, filter_layer=1)
    kept = gem.selection(tiny, ids)
    assert len(kept) == 24 and int(kept[-1]) == T - 1
    cache, _ = gem.prefill(tiny, ids)
    assert cache.lengths == [24] * 4 and cache.positions[0][:24].tolist() == list(range(24))  # fresh positions
    snap = SnapKV(keep=0.25, window=8)
    cache, logits = snap.prefill(tiny, ids)
    assert cache.lengths == [24] * 4
    assert torch.allclose(logits, FullPrefill().prefill(tiny, ids)[1], atol=1e-5)  # prefill itself is full


def test_a_training_step_lowers_the_gates_loss(tiny):
    rows = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(5))
    knobs = tokengate.GateTraining(steps=30, length=64, batch=4, lr=0.05, recent=8, target_keep=0.3)
    gates, log = tokengate.train_gates(tiny, rows, knobs, layers=(1, 2))
    assert log[-1]["loss"] < log[0]["loss"]
    assert log[-1]["mean_keep"] < log[0]["mean_keep"]  # the budget pushes the keep-probabilities down
    assert not any(p.requires_grad for p in tiny.parameters())  # the base weights stayed frozen
    assert not any(p.requires_grad for p in gates.parameters())


def test_gates_train_once_per_recipe(tiny, tmp_path, monkeypatch):
    rows = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(6))
    knobs = tokengate.GateTraining(steps=2, length=32, batch=2, recent=8)
    gates, log, seconds = tokengate.trained_gates(tiny, rows, knobs, tmp_path, layers=(1,))
    assert len(log) == 2 and seconds > 0 and len(list(tmp_path.iterdir())) == 1

    def no_training(*args, **kwargs):
        raise AssertionError("the same recipe trained again")
    monkeypatch.setattr(tokengate, "train_gates", no_training)
    said = []
    again, log_again, seconds_again = tokengate.trained_gates(tiny, rows, knobs, tmp_path, layers=(1,), say=said.append)
    assert (log_again, seconds_again) == (log, seconds)
    assert said == [f"tokengate: trained before, loaded from {next(tmp_path.iterdir())}"]
    assert all(torch.equal(a, b) for a, b in zip(gates.state_dict().values(), again.state_dict().values()))
    monkeypatch.undo()
    tokengate.trained_gates(tiny, rows, dataclasses.replace(knobs, target_keep=0.5), tmp_path, layers=(1,))
    assert len(list(tmp_path.iterdir())) == 2  # another recipe, another file
