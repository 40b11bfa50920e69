"""The per-combination table the paper pages and the leaderboard's claim reader share, the index's
out-of-date table, and the shipped reports written from the reference results."""
import pytest

from claimbench import cli, registry, report, store, verdicts

from .test_alerts import PAPERS as ALERTS_PAPERS, write_history
from .test_comparable import PAPERS


def test_combinations_show_each_value_and_gate_value_with_its_interval():
    detail = [{"params": {"provider": "anthropic"}, "value": -32.79, "low": -34.28, "high": -31.37, "gate_value": 1.25,
               "gate_interval": [1.0, 3.0], "gate_passed": True, "explain": {"pruned fraction": 0.5}},
              {"params": {"provider": "google"}, "value": None, "gate_value": 0.5, "gate_passed": False}]
    headers, rows = report.combinations("%", ["pruned fraction"], detail)
    assert headers == ["params", "%", "gate value", "gate", "pruned fraction"]
    assert rows == [["provider=anthropic", "-32.79 [-34.28, -31.37]", "1.25 [1, 3]", "passed", "0.5"],
                    ["provider=google", "—", "0.5", "failed", "—"]]


def test_the_index_lists_what_each_machine_must_run_again(tmp_path):
    papers = tmp_path / "papers.toml"
    papers.write_text(PAPERS)
    reg = registry.load(papers)
    claim = reg.papers[0].claims[0]
    current = verdicts.Verdict(claim, "box", verdicts.REPRODUCED, measured=2.5, low=2.1, high=2.9, mode="full",
                               inputs="d", inputs_status=verdicts.CURRENT)
    quick = verdicts.Verdict(claim, "xeon", verdicts.PARTLY, measured=1.9, low=1.5, high=2.2, mode="quick",
                             inputs="d", inputs_status=verdicts.CURRENT)
    report.write(reg, [current, quick], tmp_path)
    index = (tmp_path / "index.md").read_text()
    assert "## Out of date" in index and "| xeon | quick runs only | p |" in index
    report.write(reg, [current], tmp_path)
    assert "Out of date" not in (tmp_path / "index.md").read_text()


def test_the_index_lists_the_claims_whose_same_code_runs_lie_apart(tmp_path, monkeypatch):
    papers = tmp_path / "papers.toml"
    papers.write_text(PAPERS)
    reg = registry.load(papers)
    claim = reg.papers[0].claims[0]

    def run(i, value, low, high):
        return verdicts.Verdict(claim, "box", verdicts.REPRODUCED, measured=value, low=low, high=high, mode="full",
                                inputs="d", commit_hash=f"{i:08x}" + "0" * 32, commit_date=i)
    history = [run(1, 2.5, 2.4, 2.6), run(2, 3.0, 2.9, 3.1), run(3, 3.05, 2.95, 3.2)]
    monkeypatch.setattr(verdicts.codepath, "unchanged", lambda *args: True)
    report.write(reg, history[-1:], tmp_path, history)
    index = (tmp_path / "index.md").read_text()
    assert "## Between runs" in index
    assert "| p/speed | box | 2 | 1 | 2.5x [2.4, 2.6] at 00000001, 3x [2.9, 3.1] at 00000002 |" in index
    monkeypatch.setattr(verdicts.codepath, "unchanged", lambda *args: False)  # the code changed between each
    report.write(reg, history[-1:], tmp_path, history)
    assert "Between runs" not in (tmp_path / "index.md").read_text()


def test_the_shipped_reports_are_written_from_the_reference_results_alone(tmp_path, monkeypatch, capsys):
    """`claimbench report --reference`: reports/ and its alerts.md from reports/results (and -quick) in a store of
    their own; the local store is neither read nor created; a file that does not load stops it, named."""
    papers = tmp_path / "papers.toml"
    papers.write_text(ALERTS_PAPERS)
    reg = registry.load(papers)
    write_history(tmp_path / "reports" / "results", [3.0] * 8 + [1.5] * 3, gate=[1.0] * 11)
    local = tmp_path / "local.duckdb"
    monkeypatch.setenv(store.ENV_DB, str(local))
    latest, found, written = report.reference(reg, root=tmp_path)
    assert {p.name for p in written} == {"alerts.md", "index.md", "p.md"} and not local.exists()
    assert [v.verdict for v in latest] == [verdicts.PARTLY] and latest[0].machine == "box"
    assert "s.Claim.track_speedup" in (tmp_path / "reports" / "alerts.md").read_text()
    assert any(a.kind == "regression" for a in found)
    (tmp_path / "reports" / "results" / "box" / "0000000c-broken.json").write_text("{")
    with pytest.raises(ValueError, match="0000000c-broken.json"):
        report.reference(reg, root=tmp_path)
    assert cli.main(["report", "--reference", "--out", str(tmp_path)]) == 2
    assert "leave out --db and --out" in capsys.readouterr().err
