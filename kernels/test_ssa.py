"""SSA's decode-step kernels beside its baselines' (PAPERS.md A2), on one real decode step of
SmolLM2-135M (layer 15's q, k and v after a 4K prefill of the completion task's first prompt, on the
pinned corpus): the stratified selection at 50x, and whole decode attention per method (proxies
built before the timing, as from the second decode step on)."""
import pytest
import torch

from claimbench.baselines.sparse_attention import PQCache
from claimbench.datasets import longcontext
from claimbench.impl.ssa import SSA, ssa_select, water_fill
from claimbench.llm import evaluate, smollm
from claimbench.llm.model import dense_attention
from claimbench.llm.sparse import head_probs

INPUTS = ("corpus", "smollm2-135m")
CONTEXT, LAYER, KV_HEADS, SPARSITY = 4096, 15, 3, 50


@pytest.fixture(scope="module")
def step():
    model, tok, _ = smollm.load()
    sample = longcontext.make(longcontext.COMPLETION, CONTEXT - 120, evaluate.token_counter(tok), 0)
    ids = tok.encode(sample.prompt()).ids
    cache, _ = evaluate.prefill(model, ids[:-1])
    with torch.inference_mode(), model.capture_qk() as captured:
        model(torch.tensor([ids[-1:]]), cache)
    q = captured[LAYER][1]  # (1, H, 1, 64)
    k, v = (x[LAYER][:, :, :cache.lengths[LAYER]] for x in (cache.k, cache.v))  # (1, Hkv, n, 64)
    torch.set_num_threads(1)
    return q, k, v, dense_attention(q, k, v)


def test_ssa_selection(benchmark, step):
    """Water-filling plus the draws for every KV head: the certainty stratum is the top of p, the
    selection fits the budget, and no weight is below 1."""
    q, k, _, _ = step
    p = head_probs(q, k[0]).double()
    p = p / p.sum(-1, keepdim=True)
    m = k.shape[2] // SPARSITY
    gen = torch.Generator().manual_seed(0)
    rows = benchmark(lambda: [ssa_select(p[h], m, gen) for h in range(KV_HEADS)])
    for h, (ids, log_w) in enumerate(rows):
        kept, _ = water_fill(p[h].sort(descending=True).values, m)
        assert len(ids) <= m and len(ids.unique()) == len(ids) and (log_w >= -1e-6).all()
        assert set(ids[:kept].tolist()) == set(p[h].argsort(descending=True)[:kept].tolist())


@pytest.mark.parametrize("method", ["ssa", "pqcache"])
def test_sparse_decode_attention(benchmark, step, method):
    """One decode step of every head with the method (its proxy already built): finite, and nearer
    to dense attention than a method returning nothing would be, on the median head."""
    q, k, v, dense = step
    attention = {"ssa": SSA, "pqcache": PQCache}[method](sparsity=SPARSITY)
    attention.attend(LAYER, q, k, v)  # builds the PQ codebooks, as the first decode step does
    out = benchmark(attention.attend, LAYER, q, k, v)
    error = ((out - dense).norm(dim=-1) / dense.norm(dim=-1)).median()  # one flat head can sit near 0
    assert torch.isfinite(out).all() and error < 1.0


def test_dense_decode_attention(benchmark, step):
    q, k, v, dense = step
    assert torch.allclose(benchmark(dense_attention, q, k, v), dense)
