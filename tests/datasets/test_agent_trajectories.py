from pathlib import Path

import pytest

from claimbench.datasets import agent_trajectories

DATA = Path(__file__).resolve().parents[1] / "data"


def words(text):
    return len(text.split())


def test_swe_agent_reader():
    traj = agent_trajectories.read_swe_agent(DATA / "swe_agent_sample.traj", words)
    assert [t.kind for t in traj.turns] == ["system", "user", "tool_call", "tool_output", "tool_call",
                                            "tool_output", "assistant"]
    assert traj.turns[5].tokens == 2 and traj.calls == [2, 4, 6]


def test_openhands_reader():
    traj = agent_trajectories.read_openhands(DATA / "openhands_sample.json", words)
    assert [t.kind for t in traj.turns] == ["user", "tool_call", "tool_output", "tool_call", "tool_output",
                                            "assistant"]


def test_jsonl_round_trip(tmp_path):
    traj = agent_trajectories.generate(agent_trajectories.GeneratorParams(calls_mean=10, calls_sd=0), seed=1)
    agent_trajectories.write_jsonl(traj, tmp_path / "t.jsonl")
    assert agent_trajectories.read_jsonl(tmp_path / "t.jsonl").turns == traj.turns


@pytest.mark.parametrize("text, message", [
    ('{"kind": "system", "tokens": 5}\n{"kind": "tool_call", "tok', r"t.jsonl:2: not valid JSON"),
    ('{"kind": "system", "tokens": 5}\n{"kind": "oracle", "tokens": 5}', r"t.jsonl:2: unknown span kind 'oracle'"),
    ('{"kind": "tool_call", "tokens": -3}', r"t.jsonl:1: token count must be a non-negative integer"),
    ('{"kind": "tool_call", "role": "user", "tokens": 3}', r"t.jsonl:1: role 'user' does not fit"),
    ('{"kind": "system", "tokens": 3}', r"no model turns"),
])
def test_bad_jsonl_names_file_and_line(tmp_path, text, message):
    (tmp_path / "t.jsonl").write_text(text)
    with pytest.raises(agent_trajectories.TrajectoryError, match=message):
        agent_trajectories.read_jsonl(tmp_path / "t.jsonl")


def test_bad_agent_logs(tmp_path):
    (tmp_path / "x.traj").write_text('{"history": [{"role": "system", "content": "a"}, {"role": "oracle"}]}')
    with pytest.raises(agent_trajectories.TrajectoryError, match=r"x.traj: history\[1\]: unknown role 'oracle'"):
        agent_trajectories.read_swe_agent(tmp_path / "x.traj", words)
    (tmp_path / "y.traj").write_text('{"history": [\n{"role": "system",')
    with pytest.raises(agent_trajectories.TrajectoryError, match=r"y.traj:2: not valid JSON"):
        agent_trajectories.read_swe_agent(tmp_path / "y.traj", words)
    (tmp_path / "e.json").write_text('[{"source": "robot", "content": "x"}]')
    with pytest.raises(agent_trajectories.TrajectoryError, match=r"e.json: event\[0\]: unknown source 'robot'"):
        agent_trajectories.read_openhands(tmp_path / "e.json", words)


def test_generator_is_seeded():
    params = agent_trajectories.GeneratorParams()
    a, b = agent_trajectories.generate(params, 7), agent_trajectories.generate(params, 7)
    assert a == b and a != agent_trajectories.generate(agent_trajectories.GeneratorParams(), 8)
    assert a.turns[0].kind == "system" and a.turns[-1].kind == "tool_call"
    assert all(t.tokens >= 0 for t in a.turns)
