"""Lychee's kernels beside IVF-Flat's scan (PAPERS.md A1), single thread, at the smallest nprobe
where IVF-Flat reaches recall@10 0.999: the whole search, the bound pass alone and the exact pass
over the bound's survivors alone (the ceiling's kernel). Every one must give IVF-Flat's answer."""
import numpy as np
import pytest

from claimbench.impl.lychee import set_threads
from claimbench.quality import identical_rows
from claimbench.suites import lychee as suite

INPUTS = ("glove-6b-50d",)  # the generated spectrum set reads nothing
DATASETS = ["glove-50-angular", "spectrum-256-decay1.5"]  # real and the steepest generated one
QUERIES, K = 200, 10


@pytest.fixture(scope="module", params=DATASETS)
def point(request):
    set_threads(1)
    ds, ivf, lychee = suite.prepare(request.param, quick=True)
    nprobe = suite.smallest_nprobe(ds, ivf, 0.999)
    for index in (ivf, lychee):
        index.set_query_params(nprobe=nprobe)
    q = np.ascontiguousarray(ds.queries[:QUERIES])
    return ivf, lychee, q, ivf.search(q, K)


def test_ivf_flat_scan(benchmark, point):
    ivf, _, q, (d, i) = point
    assert identical_rows(d, i, *benchmark(ivf.search, q, K)).all()


def test_lychee_search(benchmark, point):
    _, lychee, q, (d, i) = point
    assert identical_rows(d, i, *benchmark(lychee.search, q, K)).all()


def test_bound_pass(benchmark, point):
    """Every probed member screened once against the final k-th distance, nothing read: a true
    neighbour is never screened out."""
    _, lychee, q, (d, i) = point
    counts = benchmark(lychee.survivor_counts, q, d[:, -1])
    assert (counts >= (i >= 0).sum(1)).all()


def test_exact_pass_over_survivors(benchmark, point):
    _, lychee, q, (d, i) = point
    rows, offsets = lychee.survivors(q, d[:, -1])
    assert identical_rows(d, i, *benchmark(lychee.exact_pass, q, K, rows, offsets)).all()
