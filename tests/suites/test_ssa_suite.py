"""SSA's claim numbers from per-sample outcomes and its perplexity over seeds (the suite module itself,
as asv imports it)."""
import functools
import math

import pytest

from claimbench import evidence
from claimbench.suites import ssa as suite

from .smollm_stub import NEEDS_TOKENIZER, stand_in


def test_claims_are_paired_over_the_completion_samples():
    n = 24
    outcomes = {"dense": [1.0] * n, "ssa": [1.0] * 6 + [0.0] * 18, "pqcache": [1.0] * 12 + [0.0] * 12,
                "oracle-top-k": [1.0] * n, "quest": [0.0] * n, "importance-sampling": [1.0] * 3 + [0.0] * 21}
    out = suite.claim_estimates(outcomes)
    assert out["strongest"] == "pqcache"  # the oracle is not a practical baseline
    gain, share = out["gain"], out["share"]
    assert gain.value == pytest.approx(-25.0) and gain.low < -25.0 < gain.high < 0 and gain.n == n
    assert share.value == pytest.approx(25.0) and 0 < share.low < 25.0 < share.high < 94.0
    assert out["completion_accuracy"]["dense"].value == 1.0 and out["completion_accuracy"]["dense"].enough


@NEEDS_TOKENIZER
def test_perplexity_averages_the_methods_draws_over_seeds_and_decodes_the_rest_once(monkeypatch):
    model, tok = stand_in()
    monkeypatch.setattr(suite, "PERPLEXITY_TOKENS", 8)
    monkeypatch.setattr(suite, "PERPLEXITY_SEEDS", 2)
    calls = []
    decode = suite.evaluate_llm.teacher_forced_nll
    monkeypatch.setattr(suite.evaluate_llm, "teacher_forced_nll",
                        lambda *a, **k: calls.append(type(a[-1]).__name__) or decode(*a, **k))
    out = suite.perplexity(model, tok, 256, functools.partial(suite.make_methods, 50))
    seeded = {"SSA", "PQCache", "ImportanceSampling"}
    assert sorted(calls) == sorted([*seeded] * suite.PERPLEXITY_SEEDS + ["Dense", "OracleTopK", "Quest"])
    for estimate in out.values():
        assert estimate.n == len(estimate.samples) == suite.PERPLEXITY_TOKENS
        assert estimate.low <= estimate.value <= estimate.high
        assert estimate.value == pytest.approx(math.exp(sum(estimate.samples) / len(estimate.samples)))
    assert out["oracle-top-k"].value == pytest.approx(out["dense"].value, rel=0.5)


@NEEDS_TOKENIZER
def test_task_scores_average_the_methods_draws_over_seeds_and_decode_the_rest_once(monkeypatch):
    model, tok = stand_in()
    calls = []
    decode = suite.evaluate_llm.decode
    monkeypatch.setattr(suite.evaluate_llm, "decode",
                        lambda *a, **k: calls.append(type(a[2]).__name__) or decode(*a, **k))
    samples, seeds = 2, 3
    scores = suite.evaluate_llm.task_accuracy(model, tok, None, functools.partial(suite.make_methods, 50),
                                              {suite.longcontext.COMPLETION: samples}, 384, new_tokens=4, seeds=seeds)
    seeded = {"SSA", "PQCache", "ImportanceSampling"}
    assert sorted(calls) == sorted(([*seeded] * seeds + ["Dense", "OracleTopK", "Quest"]) * samples)
    for (name, _), per_sample in scores.items():
        assert len(per_sample) == samples
        assert all(seeds * score == pytest.approx(round(seeds * score)) for score in per_sample)  # a mean of 0/1 draws


@NEEDS_TOKENIZER
def test_chat_accuracy_share_of_dense_and_attention_error_carry_intervals_over_the_samples(monkeypatch):
    model, tok = stand_in()
    monkeypatch.setattr(suite.common, "smollm2", lambda: (model, tok, None))
    monkeypatch.setattr(suite, "PERPLEXITY_TOKENS", 4)
    monkeypatch.setattr(suite, "PERPLEXITY_SEEDS", 1)
    samples = 2
    r = suite.evaluate(512, functools.partial(suite.make_methods, 50), samples, seeds=2)
    assert len(r["chat"]) == samples * len(suite.longcontext.TASKS)
    for name, mean in r["mean"].items():
        scores = [item[name] for item in r["chat"]]
        assert mean.n == len(scores) and mean.value == pytest.approx(sum(scores) / len(scores))
        assert mean.value == pytest.approx(sum(r["accuracy"][name, task] for task in suite.longcontext.TASKS)
                                           / len(suite.longcontext.TASKS))
        assert mean.low <= mean.value <= mean.high
        assert suite.Sparse().track_mean_accuracy({("512", "50"): r}, "512", "50", name) == mean.value
    for name, error in r["error"].items():  # one decode step probed after every sample's prefill
        assert error.n == len(error.samples) == len(r["chat"]) and error.low <= error.value <= error.high
        assert error.value == pytest.approx(sum(error.samples) / error.n)
    assert r["error"]["dense"].value == r["error"]["dense"].high == 0.0 < r["error"]["ssa"].low


def test_proxy_sweep_share_of_dense_is_paired_over_the_chat_samples(monkeypatch, tmp_path):
    n = 12
    chat = [{"dense": 1.0 if i < 8 else 0.0, "ssa/exact": 1.0 if i < 4 else 0.0, "top-k/exact": 0.0} for i in range(n)]
    monkeypatch.setenv(evidence.ENV, str(tmp_path / "run.evidence.jsonl"))
    assert suite.ProxySweep().track_share_of_dense({"chat": chat}, "exact", "ssa") == pytest.approx(50.0)
    assert suite.ProxySweep().track_share_of_dense({"chat": chat}, "exact", "top-k") == 0.0
    recorded = evidence.read(tmp_path / "run.evidence.jsonl")
    share = recorded["ssa.ProxySweep.track_share_of_dense", evidence.params_key({"proxy": "exact", "method": "ssa"})]
    assert share["n"] == n and share["low"] < 50.0 < share["high"]
    assert math.isnan(suite.share_of_dense([{"dense": 0.0, "ssa": 0.0}] * n, "ssa").value)  # dense scored nothing
