from claimbench import inputs
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
