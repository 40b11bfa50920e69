"""SSA's claim numbers from per-sample outcomes (the suite module itself, as asv imports it)."""

import pytest

from claimbench.suites import ssa as suite


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
