"""Every name papers.toml gives resolves against the suites and modules; a typo fails by name."""
from claimbench import registry


def test_every_name_in_papers_toml_resolves():
    assert registry.unresolved(registry.load()) == []


def test_a_typo_is_named(tmp_path):
    text = registry.DEFAULT_PAPERS.read_text()
    typo = text.replace('benchmark = "lychee.ClaimSpeedup.track_speedup"', 'benchmark = "lychee.ClaimSpeedup.track_sppedup"')
    typo = typo.replace('method_param = "path"', 'method_param = "paths"')
    typo = typo.replace('method = "claimbench.impl.ssa.SSA"', 'method = "claimbench.impl.ssa.SSAA"')
    (tmp_path / "papers.toml").write_text(typo)
    problems = registry.unresolved(registry.load(tmp_path / "papers.toml"))
    assert any("track_sppedup" in p and "claim lychee/speedup-at-equal-recall" in p for p in problems)
    assert any("task storage-io" in p and "paths" in p for p in problems)
    assert any("SSAA" in p for p in problems)
    assert len(problems) == 3, problems
