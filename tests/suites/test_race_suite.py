"""The RACE suite end to end on a small random-weight Llama with SmolLM2's real tokenizer (so the
pinned corpus and the needle task tokenize as in the suite), every knob shrunk: each track either
returns a number or says why it has none."""
import pytest
from asv_runner.benchmarks._base import get_setup_cache_key

from claimbench import evidence
from claimbench.suites import race as suite

from . import smollm_stub, tracks

pytestmark = smollm_stub.NEEDS_TOKENIZER


@pytest.fixture(scope="module")
def result():
    model, tokenizer = smollm_stub.stand_in()
    patch = pytest.MonkeyPatch()
    knobs = {"RETENTIONS": ["75", "50"], "CALIBRATION_TOKENS": 512, "PREFIX": 32, "SCORED": 32, "SPANS": 3,
             "ACCURACY_CONTEXTS": dict(zip(suite.ACCURACY_CONTEXTS, (160, 200))), "ACCURACY_SAMPLES": 2,
             "RECOVERY_STEPS": 2, "TIMING_CONTEXTS": dict(zip(suite.TIMING_CONTEXTS, (64, 96, 128))), "ROUNDS": 2,
             "DECODE_STEPS": 2}
    for name, value in knobs.items():
        patch.setattr(suite, name, value)
    patch.setattr(suite.common, "smollm2", lambda: (model, tokenizer, 0))
    try:
        yield suite.Compression().setup_cache()
    finally:
        patch.undo()


def test_compression_and_timing_share_one_setup_cache():
    """asv runs a setup_cache once per key (the function's module and line): one measurement for both."""
    assert get_setup_cache_key(suite.Compression.setup_cache) == get_setup_cache_key(suite.Timing.setup_cache)
    assert suite.Compression.param_names == suite.Timing.param_names
    assert not {name for name in dir(suite.Compression) if name.startswith("track_")} \
        & {name for name in dir(suite.Timing) if name.startswith("track_")}


def test_every_track_returns_a_number_or_says_why_not(result):
    measured = tracks.measured(result, {cls: (suite.RETENTIONS, cls.params[1]) for cls in (suite.Compression, suite.Timing)})
    claim = ("50", "race")
    for name in ("track_request_flops_change_256k_llama3b", "track_decode_speedup", "track_ttft_speedup",
                 "track_quality_loss_vs_tolerance"):
        assert (name, *claim) in measured, name
    assert measured["track_request_flops_change_256k_llama3b", *claim] < 0
    assert measured["track_perplexity_change", "50", "full"] == 0
    assert measured["track_kv_bytes_per_token", "50", "race"] == 0.75 * measured["track_kv_bytes_per_token", "50", "full"]
    assert ("track_perplexity", "75", "race+recovery") not in measured  # recovery runs at the claim's retention
    assert ("track_recovery_kl_after", "50", "2-norm+recovery") in measured
    assert measured["track_attention_flops_8k", "50", "low-rank"] > measured["track_attention_flops_8k", "50", "full"]
    assert ("track_decode_speedup_fused", "50", "low-rank") in measured
    assert ("track_prefill_s", "50", "low-rank") not in measured  # low-rank keys prefill as the full model does


def test_the_gate_reads_perplexity_and_accuracy_against_their_tolerances(result, monkeypatch, tmp_path):
    compression = suite.Compression()
    ppl = compression.perplexity_change(result, "50", "race").value
    acc = compression.accuracy_change(result, list(suite.ACCURACY_CONTEXTS)[-1], "50", "race").value
    monkeypatch.setenv(evidence.ENV, str(tmp_path / "run.evidence.jsonl"))
    assert compression.track_quality_loss_vs_tolerance(result, "50", "race") == pytest.approx(max(ppl / 10, -acc / 5))
    assert compression.track_quality_loss_vs_tolerance(result, "50", "full") == 0
    gate = evidence.read(tmp_path / "run.evidence.jsonl")[
        "race.Compression.track_quality_loss_vs_tolerance", evidence.params_key({"retention": "50", "method": "race"})]
    assert gate["method"] == "bootstrap over items, each group on its own"
    assert gate["low"] <= gate["value"] <= gate["high"]
    longest = list(suite.ACCURACY_CONTEXTS)[-1]
    assert gate["n"] == min(len(result["nll"]["50", "race"]), len(result["accuracy"][longest, "50", "race"]))
