"""The dose gate and the policies it is compared with, on planted per-query scores."""
import numpy as np
import pytest

from claimbench import intervals, quality
from claimbench.baselines.adoption import AlwaysAdopt, DoseThreshold, LowestLoss
from claimbench.impl.dose_gate import DoseGate, embedding_dose
from claimbench.interfaces import CalibrationRun


def test_ndcg_at_10_on_a_hand_computed_case():
    ranked = np.array([[7, 1, 9, 2, 3, 4, 5, 6, 8, 0], [0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9, 0]])
    relevant = [{1, 2}, {42}, {0}]
    # query 0: hits at ranks 2 and 4: (1/log2 3 + 1/log2 5) / (1 + 1/log2 3)
    expected = (1 / np.log2(3) + 1 / np.log2(5)) / (1 + 1 / np.log2(3))
    scores = quality.ndcg_at_k(ranked, relevant, 10)
    assert scores[0] == pytest.approx(expected) and scores[0] == pytest.approx(0.6509, abs=1e-4)
    assert scores[1] == 0 and scores[2] == pytest.approx(1 / np.log2(11))


def test_the_sign_flip_test_on_planted_better_worse_and_equal_scores():
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.1, 300)
    assert intervals.sign_flip_pvalue(noise + 0.05, 2000) < 0.01  # better
    assert intervals.sign_flip_pvalue(noise - 0.05, 2000) > 0.99  # worse: one-sided
    assert 0.05 < intervals.sign_flip_pvalue(noise - noise.mean(), 2000) < 0.95  # equal
    assert intervals.sign_flip_pvalue(np.zeros(50), 2000) == 1.0  # no difference at all is never "better"


def test_holm_steps_down():
    assert intervals.holm([0.001, 0.02, 0.04, 0.3], 0.05) == [True, False, False, False]  # 0.02 > 0.05 / 3
    assert intervals.holm([0.01, 0.012, 0.02], 0.05) == [True, True, True]
    assert intervals.holm([0.2, 0.01], 0.05) == [False, True]


def _run(lr, delta, dose, loss=0.1, diverged=False, steps=20, seed=0, n=200, calibration=None):
    rng = np.random.default_rng(int(lr * 1e6) + seed)
    scores = {split: np.clip(0.5 + delta + rng.normal(0, 0.05, n), 0, 1) for split in ("gate", "test")}
    scores["calibration"] = np.full(n, 0.5 + (delta if calibration is None else calibration))
    return CalibrationRun(lr, steps, seed, loss, diverged, dose, 0.0, scores)


RTN = {split: np.full(200, 0.5) for split in ("calibration", "gate", "test")}


def test_the_gate_adopts_clearly_better_runs_only_and_never_a_diverged_one():
    runs = [_run(1e-4, 0.03, 0.01), _run(1e-3, 0.0, 0.02), _run(1e-2, -0.2, 0.3), _run(1.0, 0.0, 2.0, diverged=True)]
    assert DoseGate(permutations=2000).decide(runs, RTN) == [True, False, False, False]
    assert AlwaysAdopt().decide(runs, RTN) == [True, True, True, False]


def test_lowest_loss_adopts_one_run_per_learning_rate_sweep():
    runs = [_run(1e-4, 0, 0.01, loss=0.3), _run(1e-2, -0.2, 0.3, loss=0.1), _run(1e-4, 0, 0.01, loss=0.2, seed=1),
            _run(1e-2, 0, 0.3, loss=0.5, seed=1)]
    assert LowestLoss().decide(runs, RTN) == [False, True, True, False]


def test_the_dose_threshold_stops_below_the_first_dose_that_hurt_the_calibration_split():
    runs = [_run(1e-4, 0.01, 0.01), _run(1e-3, 0.0, 0.05), _run(1e-2, -0.1, 0.2), _run(3e-2, 0.02, 0.5)]
    policy = DoseThreshold()
    assert policy.threshold(runs, RTN) == 0.05
    assert policy.decide(runs, RTN) == [True, True, False, False]


def test_embedding_dose():
    x = np.eye(3, dtype=np.float32)
    assert embedding_dose(x, x) == 0
    assert embedding_dose(-x, x) == 2
