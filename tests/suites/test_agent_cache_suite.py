"""The agent-cache suite's accuracy rows (the suite module itself, as asv imports it), on made-up outcomes."""
import pytest

from claimbench import evidence
from claimbench.suites import agent_cache as suite


def test_accuracy_rows_and_the_gate_record_intervals_over_the_sessions(monkeypatch, tmp_path):
    sessions = 10
    outcomes = {(policy, about): [i < 7 for i in range(sessions)]
                for policy in suite.POLICIES for about in ("recent", "old")}
    outcomes["kv-drop", "recent"] = [i < 6 for i in range(sessions)]
    monkeypatch.setenv(evidence.ENV, str(tmp_path / "run.evidence.jsonl"))
    claim = suite.Claim()
    assert claim.track_accuracy_kv_drop_recent({"accuracy": outcomes}, "anthropic") == pytest.approx(0.6)
    assert claim.track_recent_accuracy_vs_full({"accuracy": outcomes}, "anthropic") == pytest.approx(0.6 / 0.7)
    recorded = evidence.read(tmp_path / "run.evidence.jsonl")
    row = recorded["agent_cache.Claim.track_accuracy_kv_drop_recent", evidence.params_key({"provider": "anthropic"})]
    assert row["method"] == "Wilson" and row["n"] == sessions and row["low"] < 0.6 < row["high"]
    assert suite.Claim.track_accuracy_kv_drop_recent.unit == "accuracy"
    gate = recorded["agent_cache.Claim.track_recent_accuracy_vs_full", evidence.params_key({"provider": "anthropic"})]
    assert gate["method"] == "paired bootstrap over items" and gate["n"] == sessions
    assert gate["low"] < 0.6 / 0.7 < gate["high"]  # 10 sessions cannot tell 6 right from 7 right
