"""The RemoteANN suite end to end on a toy dataset, against a real S3 API server on 127.0.0.1 through
the network-model proxy (no delay: the test measures nothing), every knob shrunk: each track either
returns a number or says why it has none."""
import numpy as np
import pytest
from asv_runner.benchmarks._base import get_setup_cache_key

from claimbench import evidence, intervals, quality
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


def test_recall_and_the_gate_record_intervals_over_the_queries(monkeypatch, tmp_path):
    """Made-up per-query recalls (no server): the recall's Wilson interval, and the gate's margin (the lower
    method's recall minus the target) with a bootstrap over queries that draws each query's pair of recalls."""
    queries = 70
    ivf = [1.0] * 66 + [0.9] * 4  # mean 0.9943
    remote = [1.0] * 63 + [0.9] * 7  # mean 0.99
    rows = {("0.99", "object-store-ivf"): {"params": {"nprobe": 8}, "query_recalls": ivf},
            ("0.99", "remoteann"): {"params": {"nprobe": 8, "rerank": 32}, "query_recalls": remote}}
    monkeypatch.setenv(evidence.ENV, str(tmp_path / "run.evidence.jsonl"))
    r = {"toy": rows}
    assert suite.Search().track_recall(r, "toy", "0.99", "remoteann") == pytest.approx(0.99)
    assert suite.Claim().track_recall_margin(r, "toy", "0.99") == pytest.approx(0.0, abs=1e-12)
    recorded = evidence.read(tmp_path / "run.evidence.jsonl")
    recall = recorded["remoteann.Search.track_recall",
                      evidence.params_key({"dataset": "toy", "target_recall": "0.99", "method": "remoteann"})]
    assert recall["method"] == "Wilson" and recall["n"] == queries and recall["low"] < 0.99 < recall["high"]
    margin = recorded["remoteann.Claim.track_recall_margin",
                      evidence.params_key({"dataset": "toy", "target_recall": "0.99"})]
    assert margin["method"] == "paired bootstrap over items" and margin["n"] == queries
    assert margin["low"] < -0.005 < 0 < margin["high"]  # 70 queries cannot tell a 0.005 shortfall
    # drawn in pairs: two methods with the same per-query recalls have the margin interval of one mean alone
    rows["0.99", "object-store-ivf"]["query_recalls"] = remote
    alone = intervals.bootstrap(remote, lambda xs: float(np.mean(xs)) - 0.99)
    same = suite.Claim().recall_margin(r, "toy", "0.99")
    assert (same.low, same.high) == pytest.approx((alone.low, alone.high))


def test_the_tail_latency_keeps_the_latencies_it_has_no_interval_from(monkeypatch, tmp_path):
    latencies = list(np.linspace(0.1, 0.2, 70))
    r = {"toy": {("0.99", "remoteann"): {"params": {"nprobe": 8, "rerank": 32}, "warm_latency": latencies}}}
    monkeypatch.setenv(evidence.ENV, str(tmp_path / "run.evidence.jsonl"))
    assert suite.Search().track_p99_s(r, "toy", "0.99", "remoteann") == pytest.approx(np.percentile(latencies, 99))
    p99 = evidence.read(tmp_path / "run.evidence.jsonl")[
        "remoteann.Search.track_p99_s", evidence.params_key({"dataset": "toy", "target_recall": "0.99",
                                                            "method": "remoteann"})]
    assert p99["method"].startswith("percentile 99 ") and p99["low"] is None and p99["min_n"] == 299
    assert p99["samples"] == latencies  # what alerts test two runs' tails on


def test_recall_per_query_is_what_recall_at_k_averages():
    truth = np.array([[0, 1, 2, 3], [4, 5, 6, 7]])
    found = np.array([[3, 2, 9, 9], [4, 5, 6, 7]])
    assert quality.recall_per_query(found, truth, 4).tolist() == [0.5, 1.0]
    assert quality.recall_at_k(found, truth, 4) == 0.75
