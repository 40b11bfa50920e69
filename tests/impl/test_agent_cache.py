import pytest
import torch

from claimbench import agentcost
from claimbench.baselines.agent_context import FullHistory, ObservationMasking, ThresholdSummarization
from claimbench.datasets.agent_trajectories import Trajectory, Turn
from claimbench.impl.agent_cache import KVDrop, KVDropSession
from claimbench.llm.model import Llama, LlamaConfig, dense_attention

# system 100, user 50, then calls of 10 tokens and tool outputs of 200
TRAJ = Trajectory("hand", (Turn("system", 100), Turn("user", 50), Turn("tool_call", 10), Turn("tool_output", 200),
                           Turn("tool_call", 10), Turn("tool_output", 200), Turn("tool_call", 10),
                           Turn("tool_output", 200), Turn("tool_call", 10)))


def tokens(bills):
    return [(b.read, b.written, b.uncached, b.output) for b in bills]


def test_full_history_reads_the_previous_prompt():
    bills = agentcost.replay(FullHistory(), TRAJ, window=10_000, min_cacheable=0)
    assert tokens(bills) == [(0, 150, 0, 10), (150, 210, 0, 10), (360, 210, 0, 10), (570, 210, 0, 10)]


def test_min_cacheable_prefix():
    bills = agentcost.replay(FullHistory(), TRAJ, window=10_000, min_cacheable=300)
    assert tokens(bills)[0] == (0, 0, 150, 10)  # too short to cache at all
    assert tokens(bills)[1] == (0, 360, 0, 10)  # the 150-token prefix is below the minimum


def test_kv_drop_never_rewrites():
    bills = agentcost.replay(KVDrop(keep_last=1), TRAJ, window=10_000, min_cacheable=0)
    # call 3: output 1 dropped (not read), nothing rewritten; call 4: output 2 dropped as well
    assert tokens(bills) == [(0, 150, 0, 10), (150, 210, 0, 10), (160, 210, 0, 10), (170, 210, 0, 10)]
    assert all(b.written <= 210 for b in bills)


def test_observation_masking_invalidates_from_the_edit():
    masking = ObservationMasking(keep_last=1, placeholder_tokens=5)
    bills = agentcost.replay(masking, TRAJ, window=10_000, min_cacheable=0)
    # call 3: output 1 becomes a 5-token placeholder: cache valid only up to tool_call 1
    assert tokens(bills)[2] == (160, 5 + 10 + 200, 0, 10)


def test_summarization_at_the_threshold():
    policy = ThresholdSummarization(threshold=0.5, summary_tokens=40)
    bills = agentcost.replay(policy, TRAJ, window=1000, min_cacheable=0)
    kinds = [b.kind for b in bills]
    assert kinds == ["agent", "agent", "summary", "agent", "agent"]  # 570 tokens > 0.5 x 1000 at the third call
    summary, after = bills[2], bills[3]
    assert (summary.read, summary.written, summary.output) == (360, 210, 40)
    assert (after.read, after.written) == (150, 40)  # system + task cached, the summary is new


def test_pricing():
    table = agentcost.PriceTable("p", "m", input=3.0, cache_write=3.75, cache_read=0.3, output=15.0, min_cacheable=0,
                                 ttl_s=300, date="", source="")
    cost = table.cost([agentcost.CallBill(read=1_000_000, written=1_000_000, uncached=0, output=100_000)])
    assert cost == pytest.approx({"uncached": 0.0, "written": 3.75, "read": 0.3, "output": 1.5, "total": 5.55})
    assert {p.name for p in agentcost.load_prices()} >= {"anthropic", "openai"}


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return Llama(LlamaConfig.tiny()).eval()


def test_session_prefills_only_new_tokens_and_equals_masking(tiny):
    gen = torch.Generator().manual_seed(1)
    turns = [("system", 6), ("user", 4)] + [("tool_call", 3), ("tool_output", 8)] * 4
    ids = [torch.randint(0, 256, (n,), generator=gen).tolist() for _, n in turns]
    session = KVDropSession(tiny, keep_last=2)
    for (kind, _), turn_ids in zip(turns, ids):
        session.add(kind, turn_ids)
    assert session.prefilled == [n for _, n in turns]  # every turn prefilled once, nothing again
    dropped = session.dropped_positions()
    assert len(dropped) == 16 and session.cache.length == sum(n for _, n in turns) - 16

    question = [1, 2, 3]
    logits = session.add("user", question)

    # reference: every token through dense attention over the full cache, hiding each old tool
    # output from the moment the policy drops it
    class Masked:
        def __init__(self, cache):
            self.cache, self.hidden = cache, set()

        def attend(self, layer, q, k, v):
            visible = torch.tensor([int(p) not in self.hidden for p in self.cache.valid_positions(layer)])
            return dense_attention(q, k[:, :, visible], v[:, :, visible])

    full = tiny.new_cache()
    masked, spans, reference = Masked(full), [], None
    with tiny.attention_method(masked):
        for (kind, _), turn_ids in zip(turns + [("user", 3)], ids + [question]):
            start = full.next_position
            for token in turn_ids:
                reference = tiny(torch.tensor([[token]]), full)[0, -1]
            if kind == "tool_output":
                spans.append(range(start, start + len(turn_ids)))
                masked.hidden = {p for span in spans[:-2] for p in span}
    assert masked.hidden == dropped
    assert torch.allclose(logits, reference, atol=1e-4)
