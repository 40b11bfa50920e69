"""The TokenGate suite end to end on a small random-weight Llama with SmolLM2's real tokenizer (the
pinned corpus and the needle task tokenize as in the suite), every knob shrunk: each track returns a
number or says why it has none, and the claim row reads TokenGate's own speedup."""
import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import intervals, registry, verdicts
from claimbench.baselines import token_pruning
from claimbench.baselines.token_pruning import SnapKV
from claimbench.suites import tokengate as suite

from . import smollm_stub, tracks

pytestmark = smollm_stub.NEEDS_TOKENIZER


@pytest.fixture(scope="module")
def patched(tmp_path_factory):
    model, tokenizer = smollm_stub.stand_in(n_layers=6, max_seq_len=512)
    cache = tmp_path_factory.mktemp("cache")
    contexts = dict(zip(suite.CONTEXTS, (256, 320)))
    knobs = {"CONTEXTS": contexts, "CLAIM_CONTEXT": list(contexts)[-1], "PERPLEXITY_CONTEXT": list(contexts)[0],
             "SAMPLES": {label: 2 for label in contexts}, "SEGMENTS": 2, "SCORED": 8, "ROUNDS": 2,
             "CHAT_SAMPLES": 1, "CHAT_NEW_TOKENS": 4,
             "TRAINING": dataclasses.replace(suite.TRAINING, steps=2, length=160, recent=8)}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in knobs.items():
            patch.setattr(suite, name, value)
        patch.setattr(suite.common, "smollm2", lambda: (model, tokenizer, 0))
        patch.setattr(suite.vectors, "cache_dir", lambda: cache)
        patch.setattr(suite.measure, "in_child", lambda fn, *args: fn(*args, model=model))  # in process, tiny model
        # the baselines' layers, scaled to six layers
        patch.setattr(suite, "make", lambda method, keep, gates, make=suite.make: _scaled(make(method, keep, gates)))
        yield


@pytest.fixture(scope="module")
def result(patched):
    return suite.Prefill().setup_cache()


def _scaled(method):
    for field, layer in (("filter_layer", 2), ("layer", 2)):
        if hasattr(method, field):
            setattr(method, field, layer)
    return method


def test_every_track_returns_a_number_or_says_why_not(result):
    measured = tracks.measured(result, {suite.Prefill: (suite.CONTEXTS, suite.METHODS, suite.KEEPS)})
    claim = suite.CLAIM_CONTEXT
    assert measured["track_ttft_speedup", claim, "full", suite.KEEPS[0]] == pytest.approx(1.0, abs=0.5)
    assert ("track_ttft_speedup", claim, "snapkv", suite.KEEPS[0]) not in measured  # never timed
    assert ("track_ttft_speedup_claim", claim, "gemfilter", suite.KEEPS[0]) not in measured
    for keep in suite.KEEPS:
        assert measured["track_ttft_speedup_claim", claim, "tokengate", keep] == \
            measured["track_ttft_speedup", claim, "tokengate", keep]
        assert 0 < measured["track_computed_share", claim, "fastkv", keep] < 1
    assert measured["track_computed_share", claim, "full", suite.KEEPS[0]] == 1.0
    assert ("track_continuation_perplexity_change", claim, "full", suite.KEEPS[0]) not in measured  # 4K only
    assert set(result["memory"]) == {(claim, m, k) for m, k in suite.configurations() if m in suite.TIMED}
    for keep in suite.KEEPS:
        assert suite.Training().track_training_seconds(result, keep) > 0
        assert math.isfinite(suite.Training().track_final_kl(result, keep))
    for method in suite.PROBED:  # the probe's layers are recorded (the fixture pins them to layer 2 after)
        assert 0 <= suite.Probe().track_selection_layer(result, method) < 6
        assert 0 <= suite.Probe().track_needle_rank_share(result, method) < 1


def test_training_rows_hold_needles_followed_by_their_answer():
    _, tokenizer = smollm_stub.stand_in(n_layers=2, max_seq_len=512)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(suite, "TRAINING", dataclasses.replace(suite.TRAINING, length=160))
        rows = suite.training_rows(tokenizer)
        texts = [tokenizer.decode(row.tolist()) for row in rows]
    needled = [text for text in texts if "special magic number" in text]
    assert rows.shape[1] == 160 and len(needled) >= 16
    for text in needled:
        value = text.rsplit(": ", 1)[-1].rstrip(".")
        assert text.endswith(f" is: {value}.") and text.count(value) == 2  # in the needle, then as the answer
    sample, ids, needle = suite.needle_prompt(tokenizer, 300, seed=3)
    assert ids == tokenizer.encode(sample.prompt()).ids  # the prompt accuracy evaluates
    assert tokenizer.decode([ids[i] for i in needle]).strip() == sample.answers[0]


def test_the_chat_tasks_have_rows_per_task_and_pooled(patched):
    result = suite.ChatTasks().setup_cache()
    chat = suite.ChatTasks()
    for task, method, keep in itertools.product(chat.params[0], suite.METHODS, suite.KEEPS):
        if method == "full" and keep != suite.KEEPS[0]:
            with pytest.raises(SkipNotImplemented):
                chat.track_accuracy(result, task, method, keep)
            continue
        assert 0 <= chat.track_accuracy(result, task, method, keep) <= 1
        assert math.isfinite(chat.track_accuracy_change_points(result, task, method, keep))
        assert 0 < chat.track_computed_share(result, task, method, keep) <= 1.5
    first = ("full", suite.KEEPS[0])
    assert len(result["accuracy"][("all", *first)]) == len(suite.CHAT_TASKS) * suite.CHAT_SAMPLES
    assert chat.track_accuracy_change_points(result, "all", *first) == 0.0


def test_full_prefill_and_snapkv_share_one_prefill_and_equal_their_own(patched):
    model, _ = smollm_stub.stand_in(n_layers=6, max_seq_len=512)
    ids = list(range(5, 205))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(suite, "configurations", lambda: [("full", "0.25"), ("snapkv", "0.25"), ("snapkv", "0.5")])
        shared = list(suite.prefills(model, {}, ids, room=8))
    assert [cache.lengths[0] for *_, cache in shared] == [200, 50, 100]  # each on its own copy
    for method, keep, pruning, cache in shared:
        own, _ = pruning.prefill(model, ids, room=8)
        assert cache.lengths == own.lengths, (method, keep)
        for layer, n in enumerate(own.lengths):
            assert torch.equal(cache.k[layer][:, :, :n], own.k[layer][:, :, :n])
            assert torch.equal(cache.v[layer][:, :, :n], own.v[layer][:, :, :n])
            assert torch.equal(cache.positions[layer][:n], own.positions[layer][:n])
    with pytest.raises(ValueError, match="window is 8"):
        SnapKV(0.5, window=8).compress(*token_pruning.observed_prefill(model, ids, 8, window=16))


def _knobs(quick: bool) -> str:
    probe = ("from claimbench import intervals; from claimbench.suites import tokengate as suite; "
             "print(repr(suite.TRAINING), suite.ROUNDS >= intervals.MIN_ROUNDS, "
             "min(suite.SAMPLES.values()) >= intervals.MIN_ITEMS)")
    env = {**os.environ, "CLAIMBENCH_QUICK": "1" if quick else "0"}
    return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout


def test_quick_mode_trains_the_gates_as_full_mode_does_with_enough_rounds_and_samples_to_call():
    """The gates are the method: quick mode's 4 steps on 128-token rows (until dd7d927) pruned the needle
    from every sample at 1K, so its failed gate said nothing about TokenGate."""
    quick, full = _knobs(quick=True), _knobs(quick=False)
    assert quick == full and quick.endswith("True True\n")


def test_the_gate_margin_carries_the_methods_interval_so_a_pass_the_samples_cannot_tell_says_so():
    """11 of 12 against full prefill's 12 of 12 passes on its value (bound 75.7%), but the method's own
    interval reaches below the bound: the verdict adds that the samples cannot tell."""
    context, keep = suite.CLAIM_CONTEXT, suite.KEEPS[0]
    r = {"accuracy": {(context, "full", keep): [1.0] * 12, (context, "tokengate", keep): [1.0] * 11 + [0.0]}}
    prefill = suite.Prefill()
    margin = prefill.track_accuracy_margin_points.__wrapped__(prefill, r, context, "tokengate", keep)
    bound = intervals.rate([1.0] * 12).low
    own = intervals.rate([1.0] * 11 + [0.0])
    assert margin.value == pytest.approx(100 * (11 / 12 - bound)) and margin.value > 0
    assert (margin.low, margin.high) == pytest.approx((100 * (own.low - bound), 100 * (own.high - bound)))
    assert margin.low < 0 < margin.high and margin.n == 12
    claim = next(c for c in registry.load().paper("tokengate").claims if c.id == "ttft-speedup")
    params = json.dumps({"context": context, "keep": keep, "method": "tokengate"}, sort_keys=True)
    verdict = verdicts.judge(claim, {params: 1.5}, {params: margin.value},
                             gate_intervals={params: {"low": margin.low, "high": margin.high}})
    assert verdict.gate == "passed"
    assert "the gate passed on its value, but its interval spans the bound" in verdict.reason


@pytest.mark.model
def test_the_memory_measurement_runs_in_a_fresh_process_on_the_real_model():
    """What asv runs: the function and the method travel to a spawned child by name and by pickle."""
    from claimbench import measure
    from claimbench.baselines.token_pruning import FastKV
    from claimbench.llm import smollm
    assert measure.in_child(smollm.prefill_peak_rss_above_model, FastKV(0.25), list(range(256))) >= 0
