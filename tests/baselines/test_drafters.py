"""The baseline drafters (baselines/drafters.py) on a tiny random-weight Llama."""
import pytest
import torch

from claimbench.baselines import drafters
from claimbench.interfaces import InputError
from claimbench.llm import speculative
from claimbench.llm.model import Llama, LlamaConfig


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return Llama(LlamaConfig.tiny()).eval()


def _context(model, tokens):
    cache = model.new_cache()
    with torch.inference_mode():
        hidden = model.hidden_states(torch.tensor([tokens[:-1]]), cache)[0, -1]
    return speculative.DraftContext(list(tokens), hidden, model, cache)


def test_prompt_lookup_proposes_what_followed_the_latest_match(tiny):
    lookup = drafters.PromptLookup(max_ngram=2)
    tokens = [5, 6, 7, 1, 5, 6, 9, 9, 2, 5, 6]
    assert lookup.propose(_context(tiny, tokens), 3) == [9, 9, 2]  # "5 6" last seen before "9 9 2"
    assert lookup.propose(_context(tiny, [1, 2, 3, 4]), 3) == []
    assert lookup.propose(_context(tiny, [3, 8, 3]), 2) == [8, 3]  # falls back to a 1-gram
    with pytest.raises(InputError):
        drafters.PromptLookup(max_ngram=0)


def test_medusa_heads_start_as_the_lm_head_and_training_lowers_their_loss(tiny):
    heads = drafters.MedusaHeads(64, 3)
    hidden = torch.randn(5, 64)
    assert torch.equal(heads(hidden)[:, 1], hidden)  # zero-initialised residual blocks
    rows = torch.randint(0, 256, (6, 32), generator=torch.Generator().manual_seed(0))
    pairs = speculative.future_pairs(tiny, rows, 3)
    heads, losses = drafters.train_medusa(tiny, *pairs, speculative.HeadTraining(steps=30, batch=64, lr=3e-3))
    assert losses[-1] < losses[0]
    assert all(p.grad is None for p in tiny.parameters())  # the target never trains
    with pytest.raises(InputError):
        drafters.MedusaHeads(64, 0)


def test_early_exit_drafts_from_the_first_layers_and_leaves_the_cache_as_it_was(tiny):
    tokens = list(range(10, 30))
    context = _context(tiny, tokens)
    before = (context.cache.next_position, list(context.cache.lengths))
    exit_ = drafters.EarlyExit(layers=1)
    exit_.start(tiny, tokens)
    draft = exit_.propose(context, 4)
    assert len(draft) == 4 and (context.cache.next_position, context.cache.lengths) == before
    with torch.inference_mode():  # its first token is the one-layer model's greedy choice
        first = tiny.output(tiny.hidden_states(torch.tensor([tokens]), layers=1)[0, -1]).argmax()
    assert draft[0] == int(first)
    with pytest.raises(InputError):
        drafters.EarlyExit(layers=2).start(tiny, tokens)
