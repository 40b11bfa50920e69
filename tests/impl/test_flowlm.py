"""The flow drafter (impl/flowlm.py) on a tiny random-weight Llama: training lowers the flow-matching
loss, sampling and read-out shapes, bad knobs; speculative identity is in the drafter contract test."""
import pytest
import torch

from claimbench.impl import flowlm
from claimbench.interfaces import InputError
from claimbench.llm import speculative
from claimbench.llm.model import Llama, LlamaConfig


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return Llama(LlamaConfig.tiny()).eval()


def test_training_lowers_the_flow_matching_loss_and_drafts_k_tokens(tiny):
    rows = torch.randint(0, 256, (6, 32), generator=torch.Generator().manual_seed(0))
    hidden, future = speculative.future_pairs(tiny, rows, 3)
    drafter, losses = flowlm.train_flow(tiny, hidden, future, speculative.HeadTraining(steps=40, batch=64, lr=1e-3),
                                        steps=3, width=64)
    assert sum(losses[-5:]) < sum(losses[:5])
    assert drafter.sample(hidden[:2]).shape == (2, 3, 64)
    context = speculative.DraftContext(rows[0].tolist(), hidden[0], tiny, tiny.new_cache())
    draft = drafter.propose(context, 2)
    assert len(draft) == 2 and all(0 <= t < 256 for t in draft)


def test_read_out_picks_the_nearest_embedding(tiny):
    embeddings = flowlm.FlowDrafter.scaled_embeddings(tiny)
    assert embeddings.pow(2).mean().item() == pytest.approx(1.0, rel=1e-4)
    picks = flowlm.FlowDrafter.read_out(embeddings[[3, 77, 200]] + 0.01, embeddings)
    assert picks.tolist() == [3, 77, 200]


def test_bad_knobs_are_refused():
    with pytest.raises(InputError):
        flowlm.FlowDrafter(64, 0)
    with pytest.raises(InputError):
        flowlm.FlowDrafter(64, 3, steps=0)
