"""The RemoteANN suite end to end on a toy dataset, against a real S3 API server on 127.0.0.1 through
the network-model proxy (no delay: the test measures nothing), every knob shrunk: each track either
returns a number or says why it has none."""
import numpy as np
import pytest
from asv_runner.benchmarks._base import get_setup_cache_key

from claimbench.datasets import vectors
from claimbench.netmodel import NetworkModel
from claimbench.suites import remoteann as suite

from . import tracks

pytest.importorskip("moto")


@pytest.fixture(scope="module")
def result():
    rng = np.random.default_rng(0)
    base, queries = rng.standard_normal((4000, 16)).astype(np.float32), rng.standard_normal((12, 16)).astype(np.float32)
    gt_d, gt_i = vectors.ground_truth(base, queries)
    toy = vectors.VectorDataset("toy", base, queries, gt_i, gt_d)
    patch = pytest.MonkeyPatch()
    knobs = {"DATASETS": ["toy"], "TARGETS": ["0.9", "1.01"], "ROUNDS": 2, "PER_ROUND": 6,
             "MODEL": NetworkModel(first_byte_s=0.0, bandwidth_bytes_per_s=1e12)}
    for name, value in knobs.items():
        patch.setattr(suite, name, value)
    patch.setattr(suite.vectors, "load", lambda name, quick=False: toy)
    try:
        yield suite.Search().setup_cache()
    finally:
        patch.undo()


def test_search_and_claim_share_one_setup_cache():
    assert get_setup_cache_key(suite.Search.setup_cache) == get_setup_cache_key(suite.Claim.setup_cache)


def test_every_track_returns_a_number_or_says_why_not(result):
    measured = tracks.measured(result, {suite.Search: (["toy"], ["0.9", "1.01"], list(suite.METHODS)),
                                        suite.Claim: (["toy"], ["0.9", "1.01"])})
    assert measured["track_recall", "toy", "0.9", "remoteann"] >= 0.9
    assert measured["track_recall", "toy", "0.9", "object-store-ivf"] >= 0.9
    assert measured["track_recall_margin", "toy", "0.9"] >= 0
    assert ("track_throughput_ratio", "toy", "0.9") in measured
    assert ("track_cache_hit_rate", "toy", "0.9", "object-store-ivf") not in measured  # no cache
    assert measured["track_cache_hit_rate", "toy", "0.9", "remoteann"] > 0
    assert ("track_qps", "toy", "1.01", "remoteann") not in measured  # a recall above 1 is never reached
    assert measured["track_bytes_per_query", "toy", "0.9", "remoteann"] < \
        measured["track_bytes_per_query_cold", "toy", "0.9", "remoteann"]
