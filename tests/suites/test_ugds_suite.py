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


def test_one_latency_round_compares_the_medians_of_both_sides_on_a_real_file(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "O_DIRECT", 0)
    target = tmp_path / "latency.bin"
    target.write_bytes(bytes(2 * 8 * 4096))
    issued = []
    real = suite.write_latency

    def recorded(path, ordered, threads, writes):
        issued.append(ordered)
        return real(path, ordered, threads, writes)
    monkeypatch.setattr(suite, "write_latency", recorded)
    change = suite.write_latency_change(target, ordered_first=False, writes=8)
    assert issued == [False, True] and change > -100.0
    assert len(real(target, True, 2, 8)) == 16  # one latency per write and issuer


def test_claim_interleaves_every_side_of_every_claim_in_each_round(tmp_path, monkeypatch):
    """Each round times reads, block reads, writes and LATENCY_ROUNDS latency rounds back to back; the
    latency claim's interval is over those rounds (their order alternating), not over single writes."""
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(4096))
    monkeypatch.setattr(suite, "data_file", lambda: data)
    monkeypatch.setattr(os, "O_DIRECT", 0)
    monkeypatch.setattr(suite.vectors, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(suite.traces, "requests", lambda limit=None: iter(
        [{"timestamp": 0, "input_length": 9000, "output_length": 1, "hash_ids": list(range(18))}]))
    events = []
    monkeypatch.setattr(suite, "read_point", lambda fd, p, size, depth, budget: events.append("read") or
                        {"iops": 2.0 if p == "io-uring-batched" else 1.0})
    monkeypatch.setattr(suite, "block_read_seconds", lambda fd, p: events.append("block") or 0.01)
    monkeypatch.setattr(suite, "write_point", lambda p, target: events.append("write") or (1.0, True))
    changes = iter(range(100))
    monkeypatch.setattr(suite, "write_latency_change",
                        lambda target, ordered_first: events.append(("latency", ordered_first)) or float(next(changes)))
    monkeypatch.setattr(suite, "identical_bytes", lambda fd: 1.0)
    monkeypatch.setattr(suite, "fio_iops", lambda path, depth, seconds: None)
    monkeypatch.setenv(evidence.ENV, str(tmp_path / "e.evidence.jsonl"))
    claim = suite.Claim()
    r = claim.setup_cache()
    one_round = ["read", "read", "block", "block", "write", "write"] + ["latency"] * suite.LATENCY_ROUNDS
    assert [e if isinstance(e, str) else e[0] for e in events] == one_round * suite.ROUNDS
    assert [e[1] for e in events if not isinstance(e, str)][:4] == [True, False, True, False]
    assert claim.track_batch_read_speedup_4k(r) == 2.0
    latency = claim.track_sync_write_latency_change_2_threads(r)
    n = suite.ROUNDS * suite.LATENCY_ROUNDS
    assert latency == statistics.median(range(n))
    recorded = evidence.read(tmp_path / "e.evidence.jsonl")["ugds.Claim.track_sync_write_latency_change_2_threads",
                                                             evidence.params_key({})]
    assert recorded["n"] == n and recorded["method"].startswith("order statistics")
    assert recorded["low"] < latency < recorded["high"]
