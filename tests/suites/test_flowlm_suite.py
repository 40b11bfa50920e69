"""The Flow LM suite end to end on a small random-weight Llama with SmolLM2's real tokenizer, every knob
shrunk: each track returns a number or says why it has none, and every drafter's output is greedy's."""
import itertools

import pytest
from asv_runner.benchmarks._base import get_setup_cache_key

from claimbench.llm import speculative
from claimbench.suites import flowlm as suite

from . import smollm_stub, tracks

pytestmark = smollm_stub.NEEDS_TOKENIZER


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    model, tokenizer = smollm_stub.stand_in()
    patch = pytest.MonkeyPatch()
    knobs = {"PROMPTS": 2, "PROMPT_TOKENS": 40, "NEW_TOKENS": 8, "COPY_PASSAGE": 16, "COPY_CUE": 4, "ROUNDS": 2,
             "ROWS": 3, "ROW_TOKENS": 24, "KS": ["2", "4"], "K_MAX": 4, "FLOW_STEPS": ["1", "2"],
             "TRAINING": speculative.HeadTraining(steps=2, batch=8)}
    for name, value in knobs.items():
        patch.setattr(suite, name, value)
    patch.setattr(suite.common, "smollm2", lambda: (model, tokenizer, 0))
    patch.setattr(suite.vectors, "cache_dir", lambda: tmp_path_factory.mktemp("cache"))
    try:
        yield suite.Decoding().setup_cache()
    finally:
        patch.undo()


def test_the_classes_share_one_setup_cache():
    classes = (suite.Decoding, suite.BlockSize, suite.FlowSteps, suite.Training)
    assert len({get_setup_cache_key(c.setup_cache) for c in classes}) == 1


def test_every_track_returns_a_number_and_every_output_is_greedys(result, monkeypatch):
    monkeypatch.setattr(suite, "KS", ["2", "4"])
    monkeypatch.setattr(suite, "FLOW_STEPS", ["1", "2"])
    grids = {suite.Decoding: (suite.TASKS, suite.DRAFTERS), suite.BlockSize: (suite.DRAFTERS, ["2", "4"]),
             suite.FlowSteps: (suite.TASKS, ["1", "2"]), suite.Training: (["medusa", "flow"],)}
    measured = tracks.measured(result, grids, skipped=lambda name, params, why:
                               name == "track_speedup_claim" and params != ("continuation", "flow"))
    assert ("track_speedup_claim", "continuation", "flow") in measured
    for task, drafter in itertools.product(suite.TASKS, suite.DRAFTERS):
        assert measured["track_mismatched_outputs", task, drafter] == 0
        assert measured["track_acceptance_length", task, drafter] >= 1.0
    # the copy prompts repeat their passage's first words: lookup has something to find
    assert result["references"]["copy"][0] and len(result["timing"]["copy", "plain"]) == 2
    # the plain rows (the step time's source) are timed in the same rounds and decode one token per pass
    plain = result["generations"]["continuation", "plain"]
    assert [g["tokens"] for g in plain] == result["references"]["continuation"]
    assert all(g["forwards"] == len(g["tokens"]) for g in plain)


def test_the_timed_rows_explaining_the_speedup_are_medians_over_the_timed_rounds(result):
    """Each timed round's sums are kept (the warmup round's dropped), so drafting and verify costs, and
    the speedup they imply, carry samples; the last round's sums are its generations'."""
    for task, drafter in itertools.product(suite.TASKS, ["plain", *suite.DRAFTERS]):
        rounds = result["rounds"][task, drafter]
        assert len(rounds) == 2 and all(one["passes"] > 0 for one in rounds)
        last = result["generations"][task, drafter]
        assert rounds[-1]["passes"] == sum(g["forwards"] - 1 for g in last)
        assert rounds[-1]["draft_s"] == sum(g["draft_s"] for g in last)
    steps = suite.step_seconds(result, "copy")
    implied = [one["tokens"] / (one["passes"] + one["draft_s"] / step)
               for one, step in zip(result["rounds"]["copy", "flow"], steps)]
    tracked = suite.Decoding().track_speedup_if_verify_cost_one_step(result, "copy", "flow")
    assert tracked == pytest.approx(sum(implied) / 2)
