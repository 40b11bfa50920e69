import math

import pytest
import torch

from claimbench.baselines.sparse_attention import Dense, ImportanceSampling, OracleTopK, PQCache, Quest
from claimbench.impl.ssa import SSA, ssa_select, ssa_select_pq, water_fill
from claimbench.llm.model import Llama, LlamaConfig, dense_attention
from claimbench.llm.sparse import ExactProxy, LowRankProxy, PQProxy, draw_with_replacement

from . import pq_selection_checks


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("m", [1, 10, 61, 500])
def test_water_filling_solves_its_equation(seed, m):
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(1000, generator=gen) * (1 + seed), 0).sort(descending=True).values.double()
    t, c = water_fill(p, m)
    assert t + c * p[t:].sum().item() == pytest.approx(m, rel=1e-9)
    assert (c * p[:t] >= 1).all() and (c * p[t:] < 1).all()


def test_unbiased_numerator_and_denominator():
    """Over many seeded draws the weighted numerator and denominator match the dense sums."""
    gen = torch.Generator().manual_seed(0)
    n, m, d = 300, 30, 4
    s = torch.randn(n, generator=gen, dtype=torch.double) * 2
    v = torch.randn(n, d, generator=gen, dtype=torch.double)
    p = s.softmax(0)
    dense_num, dense_den = (s.exp()[:, None] * v).sum(0), s.exp().sum()
    draws = torch.Generator().manual_seed(1)
    nums, dens = [], []
    for _ in range(3000):
        idx, log_w = ssa_select(p, m, draws)
        w = log_w.double().exp()
        nums.append((w[:, None] * s[idx].exp()[:, None] * v[idx]).sum(0))
        dens.append((w * s[idx].exp()).sum())
    nums, dens = torch.stack(nums), torch.stack(dens)
    se_num = nums.std(0) / math.sqrt(len(nums))
    se_den = dens.std() / math.sqrt(len(dens))
    assert ((nums.mean(0) - dense_num).abs() <= 4 * se_num + 1e-12).all()
    assert (dens.mean() - dense_den).abs() <= 4 * se_den + 1e-12


def test_pq_code_probabilities_equal_the_proxy_probabilities_of_the_tokens_carrying_them():
    q, _, probs, buckets = pq_selection_checks.pq(6, 2, 200, 16, seed=0)
    by_code = buckets.code_probs(q)
    for head in range(2):
        for code in range(by_code.shape[1]):
            tokens = buckets.order[head, buckets.starts[head, code]:buckets.starts[head, code + 1]]
            assert torch.allclose(probs[head, tokens], by_code[head, code].expand(len(tokens)), rtol=1e-5)


@pytest.mark.parametrize("m", [1, 10, 61])
@pytest.mark.parametrize("sharpness", [1.0, 4.0])  # 4: most heads keep some tokens outright
def test_the_pq_selection_keeps_what_water_filling_keeps_and_weighs_its_draws_as_horvitz_thompson(m, sharpness):
    pq_selection_checks.check_keeps_and_weighs(ssa_select_pq, m, sharpness)


def test_the_pq_selection_is_unbiased_too():
    """As test_unbiased_numerator_and_denominator, over 3000 KV heads with the same keys and query."""
    pq_selection_checks.check_unbiased(ssa_select_pq, heads=3000)


def test_draws_with_replacement_count_duplicates_once():
    p = torch.tensor([[0.7, 0.2, 0.1]])
    idx, log_w = draw_with_replacement(p, 5, torch.Generator().manual_seed(0))
    finite = idx[0][log_w[0].isfinite()]
    assert len(set(finite.tolist())) == len(finite)
    incl = 1 - (1 - p[0, finite].double()) ** 5
    assert torch.allclose(log_w[0][log_w[0].isfinite()].double(), -incl.log(), atol=1e-6)


METHODS = [OracleTopK, PQCache, Quest, ImportanceSampling, SSA]


@pytest.mark.parametrize("cls", METHODS)
def test_every_method_respects_the_budget(cls):
    gen = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 6, 1, 16, generator=gen), torch.randn(1, 2, 2000, 16, generator=gen), \
        torch.randn(1, 2, 2000, 16, generator=gen)
    method = cls(sparsity=50)
    out = method.attend(0, q, k, v)
    assert out.shape == (1, 6, 1, 16) and torch.isfinite(out).all()
    assert len(method.selected) == 1 and method.selected[0] <= 40  # budget: 2000 / 50 tokens


@pytest.mark.parametrize("cls", METHODS + [Dense])
def test_budget_at_least_n_is_dense(cls):
    gen = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 4, 1, 8, generator=gen), torch.randn(1, 2, 30, 8, generator=gen), \
        torch.randn(1, 2, 30, 8, generator=gen)
    assert torch.allclose(cls(sparsity=1.0).attend(0, q, k, v), dense_attention(q, k, v), atol=1e-6)


def test_ssa_is_closer_than_top_k_on_peaked_scores_with_the_exact_proxy():
    """With exact scores as the proxy, SSA's error is no worse than top-k's on average."""
    gen = torch.Generator().manual_seed(4)
    errs = {"ssa": [], "top": []}
    for trial in range(20):
        q = torch.randn(1, 3, 1, 32, generator=gen) * 2
        k = torch.randn(1, 3, 3000, 32, generator=gen)
        v = torch.randn(1, 3, 3000, 32, generator=gen)
        dense = dense_attention(q, k, v)
        for name, m in (("ssa", SSA(sparsity=50, proxy=ExactProxy(), seed=trial)), ("top", OracleTopK(sparsity=50))):
            errs[name].append(((m.attend(0, q, k, v) - dense).norm() / dense.norm()).item())
    assert sum(errs["ssa"]) <= sum(errs["top"]) * 1.1


def test_methods_run_inside_the_model():
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny()).eval()
    ids = torch.randint(0, 256, (1, 300))
    cache = model.new_cache()
    with torch.inference_mode():
        model(ids, cache)
        for cls in METHODS:
            c = cache.clone()
            with model.attention_method(cls(sparsity=10)):
                out = model(torch.tensor([[5]]), c)
            assert torch.isfinite(out).all() and c.length == 301


def test_finer_pq_proxy_reconstructs_keys_better():
    k = torch.randn(1, 3, 2000, 64, generator=torch.Generator().manual_seed(1))
    errors = [float((proxy.keys(0, k) - k[0]).norm()) for proxy in (PQProxy(2, 6), PQProxy(8, 8))]
    assert errors[1] < errors[0]
    assert torch.equal(ExactProxy().keys(0, k), k[0])
    low = [float((LowRankProxy(r).keys(0, k) - k[0]).norm()) for r in (8, 32)]
    assert low[1] < low[0]
    torch.testing.assert_close(LowRankProxy(64).keys(0, k), k[0], atol=1e-4, rtol=1e-4)  # full rank: exact
    assert torch.equal(PQCache(sparsity=50, proxy=ExactProxy()).attend(0, k[:, :, :1], k, k),
                       OracleTopK(sparsity=50).attend(0, k[:, :, :1], k, k))  # exact proxy top-k is the oracle


def test_pq_proxies_share_codebooks_only_over_equal_keys(monkeypatch):
    from claimbench.llm import sparse
    built, kmeans = [], sparse.kmeans
    monkeypatch.setattr(sparse, "kmeans", lambda *a: built.append(1) or kmeans(*a))
    gen = torch.Generator().manual_seed(2)
    k = torch.randn(1, 3, 500, 64, generator=gen)
    grown = torch.cat([k, torch.randn(1, 3, 7, 64, generator=gen)], 2)  # keys decoding appended later
    alone = PQProxy()
    expected = [alone.keys(0, k), alone.keys(0, grown)]
    books = {}
    first, second = PQProxy(shared=books), PQProxy(shared=books)
    built.clear()
    assert torch.equal(first.keys(0, k), expected[0]) and torch.equal(second.keys(0, k), expected[0])
    assert torch.equal(second.keys(0, grown), expected[1]) and torch.equal(first.keys(0, grown), expected[1])
    assert len(built) == 1  # one k-means for both
    other = PQProxy(shared=books)
    assert torch.equal(other.keys(0, k + 1), PQProxy().keys(0, k + 1))  # other keys: its own codebooks
    assert len(built) == 3 and torch.equal(first.keys(0, grown), expected[1])
