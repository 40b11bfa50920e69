"""The ATTUNE suite's bookkeeping on stand-in measurements: equal recipes timed once, the carried-over
recipe gated, the tracks read the right rows. (The measurements themselves: tests/impl/test_attune.py.)"""
import pytest

from claimbench.datasets import recipes
from claimbench.impl import attune_gate
from claimbench.suites import attune as suite


@pytest.fixture
def measured(monkeypatch):
    starts = {job: recipes.load(job) for job in ("moe-lm", "causal-lm")}
    fused = {"runtime.optimizer_impl": "fused"}

    def tune(job):
        start = starts[job]
        return {"start": start, "reference": {}, "noise": [1e-8, 2e-8], "tolerance": 2e-7, "start_tokens_per_s": 1.0,
                "proposers": {"grid search": {"best": start, "changes": {}, "trials": [], "used_s": 1.0, "deviation": 0.0},
                              "profiler-guided": {"best": {**start, **fused}, "changes": fused, "used_s": 2.0,
                                                  "deviation": 1e-7,
                                                  "trials": [{"status": "rejected", "changes": fused}]},
                              "external script": {"best": {**start, **fused}, "changes": fused, "trials": [],
                                                  "used_s": 3.0, "deviation": 1e-7}}}
    timed = []

    def rounds(candidates):
        timed.append(list(candidates))
        return {name: [2.0] * 6 if name == "start" else [1.0] * 6 for name in candidates}
    monkeypatch.setattr(suite, "JOBS", ["moe-lm", "causal-lm"])
    monkeypatch.setattr(suite, "tune", tune)
    monkeypatch.setattr(suite, "timed_rounds", rounds)
    monkeypatch.setattr(suite, "audit", lambda point: {"planted": {"a": {"accepted": False}}, "noise": [1e-8],
                                                       "legitimate": {"b": {"accepted": True, "loss_deviation": 3e-8}},
                                                       "dynamic_only": {"a": {"accepted": True}}, "tolerance": 2e-7})
    monkeypatch.setattr(attune_gate, "check", lambda *a, **k: attune_gate.GateDecision(True, "passed", [], 0.0))
    return suite.Tuning().setup_cache(), timed


def test_equal_recipes_are_timed_once_and_share_their_rounds(measured):
    r, timed = measured
    assert timed == [["start", "profiler-guided"]] * 2  # external = profiler-guided; carried = the same runtime
    point = r["jobs"]["moe-lm"]
    assert point["timed_as"] == {"start": "start", "grid search": "start", "profiler-guided": "profiler-guided",
                                 "external script": "profiler-guided", "carried": "profiler-guided"}
    tuning = suite.Tuning()
    assert tuning.track_audited_speedup.__wrapped__(tuning, r, "moe-lm", "grid search").value == 1.0
    assert tuning.track_audited_speedup.__wrapped__(tuning, r, "moe-lm", "profiler-guided").value == 2.0
    assert tuning.track_tunable_changes_rejected(r, "moe-lm", "profiler-guided") == 1
    tokens = point["start"]["train.tokens_per_step"]
    start = tuning.track_start_tokens_per_s.__wrapped__(tuning, r, "moe-lm", "external script")
    tuned = tuning.track_tuned_tokens_per_s.__wrapped__(tuning, r, "moe-lm", "external script")
    assert (start.value, tuned.value) == (tokens / 2, tokens)
    assert start.samples == (tokens / 2,) * 6  # every timed step, for the alerts' rank test between runs


def test_claim_rows_and_the_audit(measured):
    r, _ = measured
    claimed, gate = suite.Claimed(), suite.Gate()
    assert claimed.track_in_place_over_carried.__wrapped__(claimed, r, "causal-lm").value == 1.0
    assert claimed.track_tuned_deviation_share_of_tolerance(r, "moe-lm") == pytest.approx(0.5)
    assert gate.track_planted_caught_percent.__wrapped__(gate, r).value == 100.0
    assert gate.track_dynamic_only_caught_percent.__wrapped__(gate, r).value == 0.0
    assert gate.track_legitimate_rejected_percent.__wrapped__(gate, r).value == 0.0


def test_carried_takes_only_tunable_keys_the_other_job_has():
    moe, dense = recipes.load("moe-lm"), recipes.load("causal-lm")
    tuned = {**moe, "moe.dispatch": "sorted", "runtime.packing": True}
    moved = suite.carried(tuned, dense)
    assert "moe.dispatch" not in moved and moved["runtime.packing"] is True
    assert {k: moved[k] for k in recipes.LOCKED if k in dense} == {k: dense[k] for k in recipes.LOCKED if k in dense}


def test_the_transfer_rows_skip_in_quick_mode_and_fail_a_rejected_carried_recipe(measured):
    """One job (quick mode) has nothing to carry over: asv's skip, not a failure; a carried recipe the
    gate rejected fails both transfer rows as a gate failure."""
    from asv_runner.benchmarks.mark import SkipNotImplemented
    r, _ = measured
    claimed = suite.Claimed()
    rows = (claimed.track_in_place_over_carried, claimed.track_carried_speedup)
    alone = {"jobs": {"moe-lm": {**r["jobs"]["moe-lm"], "carried": None}}}
    rejected = {"jobs": {"moe-lm": {**r["jobs"]["moe-lm"], "carried": {**r["jobs"]["moe-lm"]["carried"],
                                                                       "gate": {"accepted": False, "reasons": ["x"]}}}}}
    for row in rows:
        with pytest.raises(SkipNotImplemented, match="full mode"):
            row.__wrapped__(claimed, alone, "moe-lm")
        with pytest.raises(suite.common.GateFailed, match="carried-over recipe failed the gate"):
            row.__wrapped__(claimed, rejected, "moe-lm")
