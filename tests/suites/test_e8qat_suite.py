"""The E8-QAT suite end to end on a small random-weight Llama with SmolLM2's real tokenizer, every knob
shrunk: each track either returns a number or says why it has none."""
import itertools
import math

import pytest
from asv_runner.benchmarks._base import get_setup_cache_key

from claimbench.suites import e8qat as suite

from . import smollm_stub

pytestmark = smollm_stub.NEEDS_TOKENIZER


@pytest.fixture(scope="module")
def result():
    model, tokenizer = smollm_stub.stand_in()
    patch = pytest.MonkeyPatch()
    knobs = {"STEPS": 2, "BATCH": 2, "LENGTH": 32, "CURVE": ["1", "2"], "PREFIX": 16, "SCORED": 32, "SPANS": 3,
             "TASKS": {suite.longcontext.COMPLETION: 2}, "TASK_LENGTH": 160}
    for name, value in knobs.items():
        patch.setattr(suite, name, value)
    patch.setattr(suite.common, "smollm2", lambda: (model, tokenizer, 0))
    try:
        yield suite.Methods().setup_cache()
    finally:
        patch.undo()


def test_the_classes_share_one_setup_cache():
    assert len({get_setup_cache_key(c.setup_cache) for c in (suite.Methods, suite.Training, suite.Claim)}) == 1


def test_every_track_returns_a_number(result, monkeypatch):
    monkeypatch.setattr(suite, "CURVE", ["1", "2"])
    measured = {}
    for cls, grid in ((suite.Methods, (suite.METHODS,)), (suite.Training, (list(suite.QAT), ["1", "2"])),
                      (suite.Claim, ())):
        for name in (n for n in dir(cls) if n.startswith("track_")):
            for params in itertools.product(*grid):
                value = getattr(cls(), name)(result, *params)
                assert isinstance(value, (int, float)) and not math.isnan(value), (name, params)
                measured[name, *params] = value
    assert measured["track_bits_per_weight", "e8-qat"] == 2.25 and measured["track_code_bits_per_weight", "e8-qat"] == 2
    assert measured["track_perplexity_ratio_vs_fp32", "fp32"] == 1.0
    assert measured["track_bits_gap_vs_rtn2_qat",] == 0 and measured["track_bits_gap_vs_e8p_ptq",] == 0
    assert len(result["losses"]["e8-qat"]) == 2


def test_post_training_passes_are_timed_back_to_back(result):
    """The stand-in quantizes in milliseconds, so RTN gets PTQ_ROUNDS timings (E8's first pass may compile
    its kernel); fp32 needs no quantization and QAT trains once; the track is their median."""
    seconds = result["seconds"]
    assert seconds["fp32"] == [0.0] and len(seconds["rtn2-qat"]) == len(seconds["e8-qat"]) == 1
    assert len(seconds["rtn2-ptq"]) == suite.PTQ_ROUNDS
    assert all(1 <= len(seconds[method]) <= suite.PTQ_ROUNDS for method in suite.PTQ)
    median = suite.Methods().track_quantize_s(result, "rtn2-ptq")
    assert median == suite.measure.median(seconds["rtn2-ptq"])
