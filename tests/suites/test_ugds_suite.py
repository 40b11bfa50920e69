import os
import statistics

import pytest
from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import evidence, inputs
from claimbench.datasets import traces
from claimbench.suites import ugds as suite


def test_ttft_model_on_a_small_trace():
    rows = [{"timestamp": 0, "input_length": 9000, "output_length": 1, "hash_ids": list(range(18))},
            {"timestamp": 1, "input_length": 10000, "output_length": 1, "hash_ids": list(range(18)) + [50, 51]},
            {"timestamp": 2, "input_length": 100, "output_length": 1, "hash_ids": [0]}]
    out = suite.ttft(rows, {"slow": 0.01, "fast": 0.001}, prefill_tokens_per_s=1000.0)
    # request 1: nothing cached; request 2: 18 cached blocks, 784 tokens to prefill; request 3 is short
    assert out["recompute"][0] == (9.0 + 10.0) / 2
    assert out["slow"][0] == (9.0 + 18 * 0.01 + 0.784) / 2
    assert out["fast"][0] < out["slow"][0] < out["recompute"][0]


def test_mooncake_trace_ships_with_the_repository():
    first = next(traces.requests())
    assert set(first) >= {"timestamp", "input_length", "output_length", "hash_ids"}
    assert sum(1 for _ in traces.requests()) == 12031  # the README's count
    assert inputs.digest("mooncake-conversation") == inputs.manifest()["mooncake-conversation"]["sha256"]


def test_read_paths_time_every_point_in_rounds_and_report_the_median_with_its_interval(tmp_path, monkeypatch):
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(4096))
    monkeypatch.setattr(suite, "data_file", lambda: data)
    monkeypatch.setattr(os, "O_DIRECT", 0)  # a temporary folder's file system may refuse O_DIRECT
    monkeypatch.setattr(suite, "SIZES", [4096])
    monkeypatch.setattr(suite, "DEPTHS", [1, 32])
    calls = []

    def timed(fd, path, size, depth, budget_bytes):
        calls.append((path, depth))
        return {"iops": float(len(calls)), "bandwidth": 4096.0 * len(calls), "submit_share": 0.1}
    monkeypatch.setattr(suite, "read_point", timed)
    monkeypatch.setenv(evidence.ENV, str(tmp_path / "e.evidence.jsonl"))
    paths = suite.ReadPaths()
    r = paths.setup_cache()
    per_round = len(suite.PATHS) * 2 - 1  # sync pread at queue depth 1 only
    assert len(calls) == suite.ROUNDS * per_round
    assert calls[:per_round] == calls[per_round:2 * per_round]  # the paths alternate within every round
    samples = r["thread-pool", 4096, 32]["iops"]
    assert len(samples) == suite.ROUNDS
    assert paths.track_iops(r, "thread-pool", 4096, 32) == statistics.median(samples)
    params = {"path": "thread-pool", "block_bytes": 4096, "queue_depth": 32}
    recorded = evidence.read(tmp_path / "e.evidence.jsonl")["ugds.ReadPaths.track_iops", evidence.params_key(params)]
    assert recorded["n"] == suite.ROUNDS and recorded["low"] <= recorded["value"] <= recorded["high"]
    with pytest.raises(SkipNotImplemented):
        paths.track_iops(r, "sync-pread", 4096, 32)
