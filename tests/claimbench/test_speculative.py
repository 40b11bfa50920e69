"""The speculative-decoding harness (claimbench/llm/speculative.py) on a tiny random-weight Llama:
greedy identity, acceptance counting on planted drafts, cache rollback, bad input, speculative
sampling's acceptance rule, drafter files keyed by the model's digest."""
import dataclasses

import pytest
import torch

from claimbench.interfaces import Drafter, InputError
from claimbench.llm import evaluate, speculative
from claimbench.impl import flowlm
from claimbench.llm.model import Llama, LlamaConfig, load_for_model, save_for_model


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = Llama(dataclasses.replace(LlamaConfig.tiny(), max_seq_len=128)).eval()
    model.tok_embeddings.weight.data *= 0.3  # less repetitive greedy text than at full scale
    return model


@pytest.fixture
def ids():
    return torch.randint(0, 256, (24,), generator=torch.Generator().manual_seed(1)).tolist()


class Planted(Drafter):
    """Proposes the reference continuation, with every `wrong`-th proposal (1-based) replaced."""

    def __init__(self, reference, prompt_length, wrong=None, junk=None):
        self.reference, self.prompt_length, self.wrong, self.junk = reference, prompt_length, wrong, junk

    def propose(self, context, k):
        done = len(context.tokens) - self.prompt_length
        draft = list(self.reference[done:done + k])
        if self.wrong is not None and len(draft) >= self.wrong:
            draft[self.wrong - 1] = (draft[self.wrong - 1] + 1) % 256
        return draft + list(self.junk or [])


def test_planted_drafts_are_counted_exactly(tiny, ids):
    reference = evaluate.generate(tiny, ids, 25)
    perfect = speculative.generate(tiny, ids, Planted(reference, len(ids)), 25, k=4)
    assert perfect.tokens == reference
    # 1 token from the prefill, then passes of 4 accepted + 1 bonus: 1 + 5 + 5 + 5 + 5 + (4 left: 3 + 1)
    assert perfect.accepted_per_pass == [4, 4, 4, 4, 3] and perfect.forwards == 6
    assert perfect.acceptance_length == pytest.approx(25 / 6)
    second_wrong = speculative.generate(tiny, ids, Planted(reference, len(ids), wrong=2), 25, k=4)
    assert second_wrong.tokens == reference and set(second_wrong.accepted_per_pass[:-1]) == {1}
    plain = speculative.generate(tiny, ids, None, 25)
    assert plain.tokens == reference and plain.forwards == 25 and plain.acceptance_length == 1.0


def test_invalid_proposals_are_rejected_never_a_crash(tiny, ids):
    reference = evaluate.generate(tiny, ids, 12)
    for junk in ([-1], [10 ** 9], ["x"], [1.5], [None]):
        generation = speculative.generate(tiny, ids, Planted(reference, len(ids), junk=junk), 12, k=6)
        assert generation.tokens == reference


def test_rollback_leaves_the_cache_equal_to_a_fresh_prefill_of_the_accepted_text(tiny, ids):
    reference = evaluate.generate(tiny, ids, 20)
    checked = []

    class Checking(Planted):
        def propose(self, context, k):
            fresh, _ = evaluate.prefill(tiny, context.tokens[:-1])
            cache = context.cache
            assert cache.next_position == len(context.tokens) - 1 == fresh.next_position
            for layer in range(tiny.config.n_layers):
                n = cache.lengths[layer]
                assert n == fresh.lengths[layer]
                assert torch.allclose(cache.k[layer][:, :, :n], fresh.k[layer][:, :, :n], atol=1e-5)
                assert torch.allclose(cache.v[layer][:, :, :n], fresh.v[layer][:, :, :n], atol=1e-5)
                assert torch.equal(cache.valid_positions(layer), fresh.valid_positions(layer))
            checked.append(len(context.tokens))
            return super().propose(context, k)
    assert speculative.generate(tiny, ids, Checking(reference, len(ids), wrong=3), 20, k=4).tokens == reference
    assert len(checked) >= 4


def test_eos_stops_before_it_as_greedy_decoding_does(tiny, ids):
    reference = evaluate.generate(tiny, ids, 20)
    eos = reference[7]
    expected = evaluate.generate(tiny, ids, 20, eos=eos)
    assert speculative.generate(tiny, ids, Planted(reference, len(ids)), 20, k=4, eos=eos).tokens == expected


def test_bad_input_is_refused(tiny, ids):
    with pytest.raises(InputError, match="block size"):
        speculative.generate(tiny, ids, None, 5, k=0)
    with pytest.raises(InputError, match="window"):
        speculative.generate(tiny, list(range(120)), None, 10, k=4)


def test_speculative_sampling_emits_the_targets_distribution():
    """One row: a drafted token d is kept with p(d), else the token is drawn from p without d; the first
    emitted token is then distributed as p itself."""
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05], [0.2] * 5]))
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(5)
    trials = 20_000
    for _ in range(trials):
        accepted, following = speculative._accept_sampled(logits, [1], 1.0, generator)
        counts[1 if accepted else following] += 1
    assert torch.allclose(counts / trials, torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]), atol=0.015)


def test_sampled_generation_runs_with_a_seed(tiny, ids):
    reference = evaluate.generate(tiny, ids, 16)
    a = speculative.generate(tiny, ids, Planted(reference, len(ids)), 16, k=4, temperature=0.8, seed=3)
    b = speculative.generate(tiny, ids, Planted(reference, len(ids)), 16, k=4, temperature=0.8, seed=3)
    assert a.tokens == b.tokens and len(a.tokens) == 16


def test_future_pairs_align_each_hidden_state_with_the_tokens_after_the_next(tiny):
    rows = torch.arange(40).reshape(2, 20)
    hidden, future = speculative.future_pairs(tiny, rows, 3)
    usable = 20 - 3 - 1
    assert hidden.shape == (2 * usable, 64) and future.shape == (2 * usable, 3)
    assert future[0].tolist() == [2, 3, 4] and future[usable].tolist() == [22, 23, 24]
    with torch.inference_mode():
        assert torch.allclose(hidden[5], tiny.hidden_states(rows[:1])[0, 5], atol=1e-6)
    with pytest.raises(InputError):
        speculative.future_pairs(tiny, rows[:, :4], 3)


def test_a_head_trained_for_another_model_is_refused(tiny, tmp_path):
    head = flowlm.FlowDrafter(64, 3, width=16)
    path = save_for_model(tmp_path / "head.pt", tiny, knobs=head.knobs(), state=head.state_dict())
    saved = load_for_model(path, tiny, "a drafter")
    again = flowlm.FlowDrafter(**saved["knobs"])
    again.load_state_dict(saved["state"])
    assert all(torch.equal(a, b) for a, b in zip(head.state_dict().values(), again.state_dict().values()))
    other = Llama(dataclasses.replace(LlamaConfig.tiny(), max_seq_len=128)).eval()
    with pytest.raises(InputError, match="a drafter trained for model .* not this one"):
        load_for_model(path, other, "a drafter")
