"""The per-combination table the paper pages and the leaderboard's claim reader share."""
from claimbench import report


def test_combinations_show_each_value_and_gate_value_with_its_interval():
    detail = [{"params": {"provider": "anthropic"}, "value": -32.79, "low": -34.28, "high": -31.37, "gate_value": 1.25,
               "gate_interval": [1.0, 3.0], "gate_passed": True, "explain": {"pruned fraction": 0.5}},
              {"params": {"provider": "google"}, "value": None, "gate_value": 0.5, "gate_passed": False}]
    headers, rows = report.combinations("%", ["pruned fraction"], detail)
    assert headers == ["params", "%", "gate value", "gate", "pruned fraction"]
    assert rows == [["provider=anthropic", "-32.79 [-34.28, -31.37]", "1.25 [1, 3]", "passed", "0.5"],
                    ["provider=google", "—", "0.5", "failed", "—"]]
