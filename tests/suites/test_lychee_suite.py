"""The suite's measurement logic on a tiny dataset (the suite module itself, as asv imports it)."""

import numpy as np
import pytest

from claimbench.suites import lychee as suite

from claimbench import evidence, intervals
from claimbench.baselines.ivf_flat import IVFFlat
from claimbench.datasets.vectors import VectorDataset, ground_truth
from claimbench.impl.lychee import Lychee


@pytest.fixture(scope="module")
def tiny():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((3100, 24)) * np.arange(1, 25) ** -1.2).astype(np.float32)
    base, queries = x[:3000], x[3000:]
    dist, ids = ground_truth(base, queries)
    ds = VectorDataset("tiny", base, queries, ids, dist)
    ivf = IVFFlat(nlist=32)
    ivf.build(base)
    return ds, ivf, Lychee.from_ivf(ivf, base, anchor_stride=8)


def test_compare_reports_quality_beside_speed(tiny):
    point = suite.compare(*tiny, nprobe=8, rounds=2)
    assert point["identical"] == 1.0
    assert point["recall"] == point["recall_lychee"]
    assert point["speedup"] > 0
    for side in ("ivf", "lychee"):  # queries/s with the interval and samples of its rounds, in queries/s
        qps = point[f"qps_{side}_estimate"]
        assert qps.n == 2 and 0 < qps.low <= qps.value <= qps.high and min(qps.samples) <= qps.value <= max(qps.samples)
    assert 0 < point["read_fraction"] <= 1
    assert point["memory_bandwidth_estimate"].value > 0 and point["memory_bandwidth_estimate"].n == 2
    assert point["ivf_bandwidth_share"].value > 0  # IVF-Flat's scan rate over the copy rate of its rounds


def test_ceiling_times_the_exact_pass_over_the_survivors_and_the_bound_pass(tiny):
    ds, ivf, lychee = tiny
    for index in (ivf, lychee):
        index.set_query_params(nprobe=8)
    caps = suite.ceiling(ds, ivf, lychee, Lychee.from_ivf(ivf, ds.base, m=lychee.m_used, code_bits=16))
    assert caps["ceiling"] > 0 and caps["screening_cap"] > 0 and caps["probe_cap"] > 0


def test_smallest_nprobe_reaches_the_target(tiny):
    ds, ivf, _ = tiny
    nprobe = suite.smallest_nprobe(ds, ivf, 0.999)
    assert 1 <= nprobe <= 32
    assert suite.compare(*tiny, nprobe=nprobe, rounds=1)["recall"] >= 0.999


def test_failed_gate_is_not_a_number():
    identical = intervals.rate([True] * 97 + [False] * 3)
    point = {("d", "0.999"): {"identical": identical.value, "identical_estimate": identical,
                              "speedup_estimate": intervals.ratio_of_rounds([5.0] * 7, [1.0] * 7)}}
    with pytest.raises(suite.common.GateFailed, match="97.00%.*the gate is lychee.ClaimSpeedup.track_identical_rate >= 1"):
        suite.ClaimSpeedup().track_speedup(point, "d", "0.999")
    assert suite.ClaimSpeedup().track_identical_rate(point, "d", "0.999") == 0.97


def test_claim_rows_write_their_interval_to_the_evidence_file(tmp_path, monkeypatch):
    monkeypatch.setenv(evidence.ENV, str(tmp_path / "c.evidence.jsonl"))
    identical = intervals.rate([True] * 100)
    point = {("d", "0.999"): {"identical": 1.0, "identical_estimate": identical,
                              "speedup_estimate": intervals.ratio_of_rounds([5.0, 6, 5, 5, 7, 5, 5], [1.0] * 7)}}
    assert suite.ClaimSpeedup().track_speedup(point, "d", "0.999") == 5.0
    found = evidence.read(tmp_path / "c.evidence.jsonl")
    rec = found["lychee.ClaimSpeedup.track_speedup", evidence.params_key({"dataset": "d", "target_recall": "0.999"})]
    assert (rec["low"], rec["high"], rec["n"]) == (5.0, 7.0, 7)
    point["d", "0.999"]["qps_lychee_estimate"] = intervals.median_of([0.5, 0.4, 0.5, 0.6, 0.5, 0.5, 0.4]).map(
        lambda seconds: 100 / seconds)
    assert suite.ClaimSpeedup().track_qps_lychee(point, "d", "0.999") == 200.0
    rec = evidence.read(tmp_path / "c.evidence.jsonl")[
        "lychee.ClaimSpeedup.track_qps_lychee", evidence.params_key({"dataset": "d", "target_recall": "0.999"})]
    assert rec["low"] < 200 < rec["high"] and rec["n"] == 7
