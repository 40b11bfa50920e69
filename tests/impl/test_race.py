"""RACE and its baselines on the tiny random-weight Llama (claimbench/llm/headdim.py, impl/race.py,
baselines/head_dim.py)."""
import dataclasses

import pytest
import torch

from claimbench.baselines.head_dim import FrequencyPairs, FullModel, LowRankKeys, NormProduct, RandomPairs, ThinK
from claimbench.impl.race import RACE
from claimbench.interfaces import KeyShape
from claimbench.llm import evaluate, headdim
from claimbench.llm.model import Llama, LlamaConfig


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny()).eval()
    model.tok_embeddings.weight.data *= 0.1  # softer logits, so that a KL divergence has something to measure
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@pytest.fixture(scope="module")
def statistics(tiny):
    ids = torch.randint(0, 256, (600,), generator=torch.Generator().manual_seed(1)).tolist()
    return headdim.calibrate(tiny, ids, window=200)


def tokens(n, seed=0):
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


def test_rotating_sliced_q_and_k_equals_slicing_the_rotated_full_ones(tiny):
    c = tiny.config
    half = c.head_dim // 2
    pairs = torch.tensor([[0, 3, 5], [1, 2, 7]])  # one row per KV head
    ids = tokens(12, seed=2)
    with tiny.capture_qk() as full:
        tiny(ids)
    with tiny.slice_qk({0: pairs}), tiny.capture_qk() as sliced:
        tiny(ids)
    group = c.n_heads // c.n_kv_heads
    dims = torch.cat([pairs, pairs + half], 1)
    (_, q_full, k_full), (_, q_cut, k_cut) = full[0], sliced[0]
    assert q_cut.shape[-1] == k_cut.shape[-1] == 6
    for head in range(c.n_heads):
        assert torch.allclose(q_cut[:, head], q_full[:, head][..., dims[head // group]], atol=1e-5)
    for kv in range(c.n_kv_heads):
        assert torch.allclose(k_cut[:, kv], k_full[:, kv][..., dims[kv]], atol=1e-5)


def test_full_retention_equals_the_full_model_for_every_method(tiny, statistics):
    ids = tokens(30, seed=3)
    full = tiny(ids)
    for method in (RACE(1.0), RACE(1.0, rule="product"), NormProduct(1.0), RandomPairs(1.0, seed=4),
                   FrequencyPairs(1.0, band="high"), ThinK(1.0), LowRankKeys(1.0), FullModel()):
        method.fit(tiny, statistics)
        with method.apply(tiny):
            cache = tiny.new_cache(capacity=8)
            stepped = torch.cat([tiny(ids[:, :20], cache)] + [tiny(ids[:, t:t + 1], cache) for t in range(20, 30)], 1)
        assert torch.allclose(stepped, full, atol=1e-4), method.name


def test_the_cache_holds_only_the_kept_key_numbers(tiny, statistics):
    ids = tokens(20, seed=5)
    full = tiny(ids)
    for method in (RACE(0.5), ThinK(0.25), LowRankKeys(0.75)):
        method.fit(tiny, statistics)
        width = method.key_shape(tiny.config).cached
        with method.apply(tiny):
            cache = tiny.new_cache()
            out = torch.cat([tiny(ids[:, :15], cache)] + [tiny(ids[:, t:t + 1], cache) for t in range(15, 20)], 1)
        assert width == {0.5: 8, 0.25: 4, 0.75: 12}[method.retention]
        assert all(k.shape[-1] == width for k in cache.k) and all(v.shape[-1] == 16 for v in cache.v)
        assert torch.isfinite(out).all() and not torch.allclose(out, full, atol=1e-3)
    assert all(b.attention.qk_dim == 16 for b in tiny.layers)  # restored


def test_narrow_prefill_and_decode_agree_and_match_plain_attention(tiny, statistics):
    """A chunked prefill plus decode steps equals one full forward under RACE (fused padded prefill,
    plain decode), and the plain kernel gives the same logits as the fused one, full width or narrow."""
    ids = tokens(40, seed=6)
    race = RACE(0.5)
    race.fit(tiny, statistics)
    with race.apply(tiny):
        whole = tiny(ids)
        cache = tiny.new_cache(capacity=4)
        parts = [tiny(ids[:, :17], cache), tiny(ids[:, 17:30], cache)] + [tiny(ids[:, t:t + 1], cache) for t in range(30, 40)]
        with tiny.attention_kernel("plain"):
            plain = tiny(ids)
    assert torch.allclose(torch.cat(parts, 1), whole, atol=1e-5) and torch.allclose(plain, whole, atol=1e-5)
    with tiny.attention_kernel("plain"):
        assert torch.allclose(tiny(ids), tiny.forward(ids), atol=1e-5)
    assert all(b.attention.fused for b in tiny.layers)
    with pytest.raises(ValueError, match="fused"):
        with tiny.attention_kernel("flash"):
            pass


def test_energy_rules_keep_the_pairs_that_carry_the_energy(tiny, statistics):
    planted = dataclasses.replace(statistics, query_energy=torch.zeros_like(statistics.query_energy),
                                  key_energy=torch.zeros_like(statistics.key_energy))
    planted.key_energy[:, :, [1, 6]] = 5.0
    planted.query_energy[:, :, [1, 6, 3]] = 1.0
    for rule in ("sum", "product"):
        race = RACE(0.25, rule=rule)
        race.fit(tiny, planted)
        assert all(p.tolist() == [[1, 6], [1, 6]] for p in race.pairs.values()), rule
    # the 2-norm rule reads its own statistic
    norm = NormProduct(0.25)
    norm.fit(tiny, dataclasses.replace(statistics, norm_product=planted.key_energy))
    assert norm.pairs[0].tolist() == [[1, 6], [1, 6]]


def test_pair_rules_are_deterministic_per_seed(tiny, statistics):
    def fitted(method):
        method.fit(tiny, statistics)
        return [p.tolist() for p in method.pairs.values()]
    assert fitted(RandomPairs(0.5, seed=1)) == fitted(RandomPairs(0.5, seed=1)) != fitted(RandomPairs(0.5, seed=2))
    assert fitted(RACE(0.5)) == fitted(RACE(0.5))
    assert fitted(FrequencyPairs(0.5, band="high"))[0] == [[0, 1, 2, 3]] * 2
    assert fitted(FrequencyPairs(0.5, band="low"))[0] == [[4, 5, 6, 7]] * 2


def test_flops_formula_against_a_hand_count():
    c = LlamaConfig.tiny()  # dim 64, 2 layers, 4 heads, 2 KV heads, head_dim 16, ffn 128, vocab 256
    n = 100
    full = headdim.decode_flops(c, headdim.full_shape(c), n)
    projections = 2 * 64 * (4 * 16 + 2 * 16 + 2 * 16 + 4 * 16)  # q, k, v, o
    attention = 2 * 4 * n * 16 + 2 * 4 * n * 16  # scores over 16 dims, values over 16
    assert full["attention"] == 2 * attention
    assert full["total"] == 2 * (projections + attention + 2 * 3 * 64 * 128) + 2 * 64 * 256
    race = headdim.decode_flops(c, RACE(0.5).key_shape(c), n)
    assert full["total"] - race["total"] == 2 * (2 * 64 * (4 * 8 + 2 * 8) + 2 * 4 * n * 8)
    low_rank = headdim.decode_flops(c, LowRankKeys(0.5).key_shape(c), n)
    assert low_rank["attention"] - full["attention"] == 2 * (2 * 2 * n * 8 * 16)  # every key rebuilt from 8 numbers
    # a request: prefill sums the per-token count over contexts 1..n, then the decoded tokens
    assert headdim.request_flops(c, headdim.full_shape(c), 5, 2) == pytest.approx(
        sum(headdim.decode_flops(c, headdim.full_shape(c), t)["total"] for t in range(1, 8)))
    assert headdim.kv_bytes_per_token(c, RACE(0.5).key_shape(c)) == 2 * 2 * (8 + 16) * 2
    assert RACE(0.5).key_shape(c) == KeyShape(8, 8, 8, 8)


def test_the_recovery_step_trains_only_the_kept_rows_and_lowers_the_divergence(tiny, statistics):
    race = RACE(0.5)
    race.fit(tiny, statistics)
    before = {name: p.clone() for name, p in tiny.named_parameters()}
    log = headdim.recover(tiny, race, statistics, steps=40, window=64, lr=3e-3)
    assert log["kl_after"] < log["kl_before"] and log["steps"] == 40
    assert all(torch.equal(p, before[name]) for name, p in tiny.named_parameters())
    assert all(not p.requires_grad for p in tiny.parameters())
    assert set(race.weights) == {f"layers.{i}.attention.{w}" for i in range(2) for w in ("wq", "wk")}
    untrained = RACE(0.5)
    untrained.fit(tiny, statistics)
    ids = torch.tensor([statistics.ids[:200]])  # what it trained on: the tiny model has nothing to generalize
    reference = tiny(ids).log_softmax(-1)

    def divergence(method):
        with method.apply(tiny):
            out = tiny(ids).log_softmax(-1)
        return torch.nn.functional.kl_div(out[0], reference[0], log_target=True, reduction="batchmean").item()
    assert divergence(race) < divergence(untrained)


def test_bad_inputs_are_refused_with_clear_errors(tiny, statistics):
    for retention in (0.0, 1.5, -0.5):
        with pytest.raises(ValueError, match=r"retention must be in \(0, 1\]"):
            RACE(retention).fit(tiny, statistics)
    with pytest.raises(ValueError, match="whole pairs"):
        RACE(0.3).fit(tiny, statistics)  # 2.4 of 8 pairs
    with pytest.raises(ValueError, match="at least 256 tokens"):
        headdim.calibrate(tiny, list(range(100)))
    with pytest.raises(ValueError, match="only rotate-half"):
        Llama(dataclasses.replace(LlamaConfig.tiny(), rope_layout="interleaved"))
    other = Llama(LlamaConfig.tiny())
    other.config = dataclasses.replace(other.config, rope_layout="interleaved")
    with pytest.raises(ValueError, match="rotate-half layout"):
        RACE(0.5).fit(other, statistics)
    with pytest.raises(ValueError, match="rule"):
        RACE(0.5, rule="max")
    with pytest.raises(RuntimeError, match="fit it"):
        RACE(0.5).apply(tiny)
    race = RACE(0.5)
    race.fit(tiny, statistics)
    with race.apply(tiny), pytest.raises(ValueError, match="already have narrowed"):
        headdim.calibrate(tiny, list(range(300)))


def test_segment_nll_equals_teacher_forced_decoding(tiny):
    ids = tokens(80, seed=8)[0].tolist()
    spans = evaluate.segment_nll(tiny, ids, prefix=20, scored=12, segments=2)
    for s, value in enumerate(spans):
        span = ids[s * 33:(s + 1) * 33]
        cache, _ = evaluate.prefill(tiny, span[:19], room=16)
        nll = evaluate.teacher_forced_nll(tiny, cache, span[19], span[20:33])
        assert value == pytest.approx(sum(nll[1:]) / 12, rel=1e-4)
    with pytest.raises(ValueError, match="need 99 tokens"):
        evaluate.segment_nll(tiny, ids, prefix=20, scored=12, segments=3)
