"""The 2:4-vs-quantization suite end to end on a small random-weight Llama with SmolLM2's real tokenizer
(so the pinned corpus and the tasks tokenize as in the suite), every knob shrunk: each track either
returns a number or says why it has none."""
import pytest
from asv_runner.benchmarks._base import get_setup_cache_key

from claimbench.suites import sparsity24 as suite

from . import smollm_stub, tracks

pytestmark = smollm_stub.NEEDS_TOKENIZER

GRID = {"fp16": [16], "rtn": [5, 3], "gptq": [5], "magnitude-2:4": [8], "wanda-2:4": [16, 8], "sparsegpt-2:4": [8, 4]}
HELD_OUT = {"licenses": 2, "python-stdlib": 1}


@pytest.fixture(scope="module")
def result():
    model, tokenizer = smollm_stub.stand_in()
    patch = pytest.MonkeyPatch()
    formats = {fmt.name: fmt for family, grid in GRID.items() for fmt in (suite.make_format(family, b) for b in grid)}
    knobs = {"GRID": GRID, "FORMATS": formats, "CALIBRATION_TOKENS": 256, "CALIBRATION_ROW": 64, "PREFIX": 16,
             "SCORED": 32, "HELD_OUT": HELD_OUT,
             "TASKS": {suite.longcontext.COMPLETION: 2, "niah-single": 1}, "TASK_LENGTH": 160, "ROUNDS": 2}
    for name, value in knobs.items():
        patch.setattr(suite, name, value)
    patch.setattr(suite.common, "smollm2", lambda: (model, tokenizer, 0))
    try:
        yield suite.Formats().setup_cache()
    finally:
        patch.undo()


@pytest.fixture(scope="module")
def timed():
    """CpuMatmul's setup_cache, each of its processes run in this one (the stand-in is not SmolLM2)."""
    model, tokenizer = smollm_stub.stand_in()
    patch = pytest.MonkeyPatch()
    processes = []
    patch.setattr(suite, "ROUNDS", suite.TIMING_PROCESSES)  # a round per process
    patch.setattr(suite, "CALLS_PER_ROUND", 1)
    patch.setattr(suite.common, "smollm2", lambda: (model, tokenizer, 0))
    patch.setattr(suite.measure, "in_child", lambda fn, *args: processes.append(args) or fn(*args))
    try:
        yield suite.CpuMatmul().setup_cache(), processes
    finally:
        patch.undo()


def test_formats_and_pairs_share_a_setup_cache_and_the_cpu_timings_have_their_own():
    """The CPU timings run in a process of their own, after nothing but the model's load."""
    keys = {get_setup_cache_key(cls.setup_cache) for cls in (suite.Formats, suite.EqualBits)}
    assert len(keys) == 1 and get_setup_cache_key(suite.CpuMatmul.setup_cache) not in keys


def test_every_track_returns_a_number_or_says_why_not(result, timed, monkeypatch):
    monkeypatch.setattr(suite, "GRID", GRID)
    monkeypatch.setattr(suite, "HELD_OUT", HELD_OUT)
    measured = tracks.measured(result, {suite.Formats: (suite.BITS_PER_WEIGHT, list(GRID)),
                                        suite.EqualBits: (list(suite.PRUNERS),)})
    measured.update(tracks.measured(timed[0], {suite.CpuMatmul: suite.CpuMatmul.params}))
    assert measured["track_bits_per_weight", "5.25", "rtn"] == 5.25
    assert measured["track_bits_per_weight", "5.25", "wanda-2:4"] == 5.25
    assert measured["track_bits_per_weight", "9", "wanda-2:4"] == 9
    assert measured["track_perplexity_ratio_vs_fp16", "16", "fp16"] == 1.0
    assert ("track_perplexity", "8.25", "rtn") not in measured  # not in this grid
    for pruner in ("magnitude", "wanda", "sparsegpt"):
        assert measured["track_bits_gap_int8_vs_int5", pruner] == 0
        assert ("track_perplexity_ratio_int8_vs_int5", pruner) in measured
        assert ("track_perplexity_ratio_int8_vs_int5_on_docstrings", pruner) in measured
    assert ("track_perplexity_ratio_int4_vs_int3", "sparsegpt") not in measured  # GPTQ INT3 is not in this grid
    assert ("track_speedup_vs_fp32", "1", "int4-weight-only") in measured
    assert measured["track_speedup_vs_fp32", "256", "fp32"] == 1.0


def test_a_quick_compression_is_timed_every_round_and_its_median_tracked(result, monkeypatch):
    """The stand-in compresses in milliseconds, so every format gets ROUNDS back-to-back timings."""
    monkeypatch.setattr(suite, "GRID", GRID)
    assert all(len(seconds) == 2 for seconds in result["compress_s"].values())
    tracked = suite.Formats().track_compress_s(result, "5.25", "rtn")
    assert tracked == pytest.approx(sum(result["compress_s"]["rtn-int5"]) / 2)


def test_the_cpu_timings_pool_the_rounds_of_each_fresh_process(timed):
    rows, processes = timed
    assert processes == [(1,)] * suite.TIMING_PROCESSES  # the fixture's one round per process
    assert {len(seconds) for seconds in rows.values()} == {suite.TIMING_PROCESSES}
    assert set(rows) == {(tokens, kernel) for tokens in suite.TOKENS for kernel in suite.KERNELS}


def test_2_4_formats_are_worse_than_fp16_on_the_held_out_spans(result):
    """Even a random model loses perplexity when half its weights go (the direction, not a size)."""
    ratio = suite.perplexity_ratio(result["nll"], "magnitude-2:4+int8", "fp16")
    assert ratio.value > 1 and ratio.n == 3


def test_each_sources_ratio_is_over_its_own_spans_and_they_pool_to_the_claims(result, monkeypatch):
    monkeypatch.setattr(suite, "HELD_OUT", HELD_OUT)
    by_source = {source: suite.perplexity_ratio(result["nll"], "magnitude-2:4+int8", "fp16", source)
                 for source in HELD_OUT}
    pooled = suite.perplexity_ratio(result["nll"], "magnitude-2:4+int8", "fp16")
    assert [by_source[s].n for s in HELD_OUT] == [2, 1] and pooled.n == 3
    assert pooled.value == pytest.approx(by_source["licenses"].value ** (2 / 3)
                                         * by_source["python-stdlib"].value ** (1 / 3))
    with pytest.raises(KeyError, match="not a held-out source"):
        suite.source_spans("vim-docs")


def test_the_run_modes_spans_and_calibration_fit_the_pinned_corpus():
    """segment_nll would refuse too few held-out tokens only after the first format's compression."""
    _, tokenizer = smollm_stub.stand_in()
    calibration, licenses = suite.text.token_halves(tokenizer)
    span = suite.PREFIX + suite.SCORED + 1
    held_out = suite.held_out_text(tokenizer)
    assert len(held_out) == sum(suite.HELD_OUT.values()) * span
    assert held_out[:span] == licenses[:span] and suite.CALIBRATION_TOKENS <= len(calibration)
    stdlib = tokenizer.encode(suite.text.prose("python-stdlib")).ids
    count = suite.HELD_OUT["python-stdlib"]
    assert held_out[-count * span:] == suite.text.spread_spans(stdlib, span, count)


def test_spread_spans_sample_a_whole_source_and_refuse_overlap():
    ids = list(range(100))
    assert suite.text.spread_spans(ids, 3, 4) == [0, 1, 2, 25, 26, 27, 50, 51, 52, 75, 76, 77]
    with pytest.raises(ValueError, match="do not fit"):
        suite.text.spread_spans(ids, 30, 4)
