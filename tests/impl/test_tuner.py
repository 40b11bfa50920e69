import json

import numpy as np
import pytest

from claimbench.impl.tuner import GateSpec, Knob, Tuner, default_route, fast_routes, full_routes, gate, route_key
from tests.impl.tuner_toy import ToyBackend, ToyWorkload

KNOBS = [Knob("a", (1, 2, 3), 1), Knob("b", ("x", "y"), "x")]


def test_route_expansion():
    assert default_route(KNOBS) == {"a": 1, "b": "x"}
    assert fast_routes(KNOBS) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}, {"a": 3, "b": "x"}, {"a": 1, "b": "y"}]
    assert len(full_routes(KNOBS)) == 6 and {"a": 3, "b": "y"} in full_routes(KNOBS)
    with pytest.raises(ValueError, match="default"):
        Knob("c", (1, 2), 5)


def test_gate_on_hand_made_tensors():
    spec = GateSpec(atol=0.125, rtol=0.0, max_outside=0.25, min_cosine=0.99)
    ref = [np.array([1.0, 2.0, 3.0, 4.0])]
    assert gate([ref[0] + 0.125], ref, spec).passed  # exactly at the tolerance edge
    one_out = gate([ref[0] + np.array([0, 0, 0, 0.25])], ref, spec)
    assert one_out.passed and one_out.outside == 0.25
    two_out = gate([ref[0] + np.array([0, 0, 0.25, 0.25])], ref, spec)
    assert not two_out.passed and "outside tolerance" in two_out.reason
    nan = gate([np.array([1.0, np.nan, 3.0, 4.0])], ref, spec)
    assert not nan.passed and "NaN" in nan.reason
    assert not gate([-ref[0]], ref, GateSpec(atol=10, max_outside=1.0, min_cosine=0.99)).passed  # cosine -1
    assert not gate([np.ones(3)], ref, spec).passed


def test_tuner_records_crashes_and_picks_the_fastest_passing_route(tmp_path):
    cache = tmp_path / "routes.jsonl"
    tuner = Tuner(ToyBackend(), ToyWorkload(), mode="fast", repeats=3, cache=cache, workdir=tmp_path,
                  route_timeout_s=60)
    result = tuner.run(progress=lambda m: None)
    by_route = {route_key(r.route): r for r in result["tried"]}
    crashed = by_route[route_key({"speed": "slow", "noise": 0.0, "crash": True})]
    assert crashed.status == "crashed"
    noisy = by_route[route_key({"speed": "slow", "noise": 1.0, "crash": False})]
    assert noisy.status == "ok" and not noisy.passed
    assert result["winner"].route == {"speed": "fast", "noise": 0.0, "crash": False}
    assert result["default"].passed and result["winner"].latency_s < result["default"].latency_s
    default_s, winner_s = result["interleaved"]  # re-timed in one child, interleaved
    assert winner_s < default_s
    assert len(cache.read_text().splitlines()) == 4


def test_resume_skips_done_routes(tmp_path):
    cache = tmp_path / "routes.jsonl"
    done = {"route": {"speed": "slow", "noise": 0.0, "crash": False}, "status": "ok", "latency_s": 0.004,
            "gate": {"passed": True}, "held_out": 1.0, "held_out_passed": True, "error": ""}
    cache.write_text(json.dumps(done) + "\n")
    tuner = Tuner(ToyBackend(), ToyWorkload(), mode="fast", repeats=2, cache=cache, workdir=tmp_path)
    messages = []
    result = tuner.run(progress=messages.append)
    tried = [m for m in messages if "gate" in m]  # one line per route run
    assert len(tried) == 3  # the cached default is not run again
    assert "finalists re-timed interleaved" in messages[-1]
    assert len(result["tried"]) == 4


def test_mixed_mode_combines_helpful_knobs(tmp_path):
    tuner = Tuner(ToyBackend(), ToyWorkload(), mode="mixed", repeats=2, workdir=tmp_path)
    result = tuner.run(progress=lambda m: None)
    assert len(result["tried"]) == 4  # only one knob helped: nothing to combine
    with pytest.raises(ValueError, match="unknown mode"):
        Tuner(ToyBackend(), ToyWorkload(), mode="greedy", workdir=tmp_path).run(progress=lambda m: None)
