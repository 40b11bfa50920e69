"""Run plans: a suite's parts (the classes sharing one setup_cache), their durations from a real asv run's
results, which stale papers fit a budget, the per-paper runs that stop starting papers past it, and --publish
filing each as reference results."""
import json
import os
import subprocess
import sys

import pytest

from claimbench import asvfiles, cli, registry, report, runner, runplan

from tests.conftest import asv_repo

SUITE = '''
import time


class _Shared:
    def setup_cache(self):
        time.sleep(0.2)
        return 1


class One(_Shared):
    def track_a(self, cache):
        return 1.0


class Two(_Shared):
    def track_b(self, cache):
        return 2.0


class Alone:
    def setup_cache(self):
        return 2

    def track_c(self, cache):
        return 3.0


class _Helper:
    def track_hidden(self):
        return 0.0


class NoBenchmarks:
    def helper(self):
        return 0.0
'''


def test_parts_group_the_classes_sharing_a_setup_cache():
    assert runplan.parts(SUITE, "s") == [runplan.Part("s", "_Shared", ("One", "Two")),
                                         runplan.Part("s", "Alone", ("Alone",))]
    shared = runplan.Part("s", "_Shared", ("One", "Two"))
    assert shared.pattern == r"^s\.(One|Two)\."
    assert runplan.setup_cache_owners(SUITE) == {6: "_Shared", 22: "Alone"}


def test_a_real_asv_runs_durations_land_on_its_parts(tmp_path):
    """asv's setup_cache key names a line: the part is the class that defines it at the run's commit."""
    repo, home = tmp_path / "repo", tmp_path / "home"
    commit = asv_repo(repo, "s", SUITE)
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    subprocess.run([sys.executable, "-m", "asv", "machine", "--yes", "--machine", "box"], cwd=repo, env=env,
                   check=True, capture_output=True)
    done = subprocess.run([sys.executable, "-m", "asv", "run", "--python=same", "--set-commit-hash", commit,
                           "--machine", "box", "-a", "repeat=1", "-a", "rounds=1"], cwd=repo, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    measured = runplan.measured_parts([repo / "results"], root=repo)
    assert set(measured) == {("s", "_Shared"), ("s", "Alone")}
    recorded = json.loads(next(p for p in (repo / "results" / "box").glob("*.json")
                               if p.name != "machine.json").read_text())
    durations = {**recorded["durations"], **{name: row[recorded["result_columns"].index("duration")]
                                             for name, row in recorded["results"].items()}}
    shared = sum(v for k, v in durations.items() if k.startswith(("<setup_cache s:6>", "s.One.", "s.Two.")))
    assert measured["s", "_Shared"].seconds == pytest.approx(shared)
    assert measured["s", "_Shared"].machine == "box" and measured["s", "_Shared"].commit == commit


def estimate(paper, *seconds):
    return runplan.Estimate(paper, [(runplan.Part(paper, f"Part{i}", (f"Part{i}",)),
                                     None if s is None else runplan.Measured(s, "box", "c" * 40, 0))
                                    for i, s in enumerate(seconds)])


def test_the_budget_takes_the_longest_papers_that_fit_and_says_why_it_left_the_rest():
    found = {p.paper: p for p in [estimate("short", 600), estimate("long", 3000, 1200), estimate("mid", 1800),
                                  estimate("huge", 7200, 3600), estimate("new", 60, None)]}
    chosen, left = runplan.within(80 * 60, found)
    assert chosen == ["long", "short"]  # 70 min, then mid no longer fits in the 10 left, short does
    assert set(left) == {"mid", "huge", "new"}
    assert "10 min of the budget left for it" in left["mid"]
    assert "longer than the whole budget: its parts run alone: huge.Part0 2 h 0 min (--bench '^huge\\.(Part0)\\.')" \
        in left["huge"]
    assert left["new"] == "no full run of new.Part1 recorded: no estimate"
    assert found["long"].describe() == "about 1 h 10 min (as its latest full runs took: box at cccccccc)"


def test_each_paper_runs_alone_and_none_starts_past_the_budget(monkeypatch, capsys):
    ran, now = [], [0.0]

    def fake_run(reg, papers, machine=None, **kw):
        ran.append(papers)
        now[0] += {"a": 50 * 60, "b": 40 * 60, "c": 60}[papers[0]]  # a takes longer than estimated
        return 0
    monkeypatch.setattr(runner, "run", fake_run)
    found = {"a": estimate("a", 30 * 60), "b": estimate("b", 20 * 60), "c": estimate("c", 5 * 60)}
    code = runplan.run_each(None, ["a", "b", "c"], found, "box", budget_s=60 * 60, clock=lambda: now[0])
    assert ran == [["a"], ["c"]] and code == 1
    assert "not starting b: about 20 min" in capsys.readouterr().out
    ran.clear()
    assert runplan.run_each(None, ["a", "b"], found, "box", clock=lambda: now[0]) == 0 and ran == [["a"], ["b"]]


def test_run_stale_with_a_budget_runs_the_papers_that_fit_one_at_a_time(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_stale_papers", lambda reg, machine, db, roots: ["ssa", "ugds", "lychee"])
    monkeypatch.setattr(runplan, "estimates", lambda reg, papers, roots: {
        "ssa": estimate("ssa", 3 * 3600), "ugds": estimate("ugds", 300), "lychee": estimate("lychee", 3000)})
    calls = []
    monkeypatch.setattr(runner, "run", lambda reg, papers, machine=None, bench=None, dry_run=False, **kw:
                        calls.append((papers, bench, dry_run)) or 0)
    assert cli.main(["run", "--stale", "--budget", "60", "--machine", "box", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "would run 2 paper(s), longest first, within 1 h 0 min:\n  lychee: about 50 min" in out
    assert "left for a later run (1):\n  ssa: about 3 h 0 min" in out
    assert calls == [(["lychee", "ugds"], None, True)]
    calls.clear()
    assert cli.main(["run", "--stale", "--budget", "60", "--machine", "box", "--bench", "^extra\\."]) == 0
    assert calls == [(["lychee"], None, False), (["ugds"], None, False), ([], ["^extra\\."], False)]
    assert cli.main(["run", "--budget", "60"]) == 2
    assert "--budget goes with --stale" in capsys.readouterr().err
    calls.clear()
    assert cli.main(["run", "--stale", "--budget", "10", "--machine", "box"]) == 0
    assert calls == [(["ugds"], None, False)]


def test_the_shipped_suites_split_into_parts_that_name_real_classes():
    reg = registry.load()
    for paper in (p for p in reg.papers if p.suite):
        path = registry.REPO_ROOT / runplan.suite_file(paper.suite)
        found = runplan.parts(path.read_text(), paper.suite)
        assert found, paper.id
        assert len({c for p in found for c in p.classes}) == sum(len(p.classes) for p in found)


def test_publish_files_each_papers_runs_as_reference_results_then_rewrites_the_reports(tmp_path, monkeypatch,
                                                                                      capsys):
    """Each paper is filed as it ends, under the commit the command started at: committing the first paper's
    reports while the second runs (HEAD moves, the code does not) files nothing under the new commit."""
    results, head = tmp_path / "asv-results", ["cd" * 20]
    monkeypatch.setattr(registry, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(runner, "results_dir", lambda root=None, mode="full": results)
    monkeypatch.setattr(runner, "head_commit", lambda root=None: head[0])
    monkeypatch.setattr(runner, "uncommitted", lambda root=None: "")
    monkeypatch.setattr(cli, "_stale_papers", lambda reg, machine, db, roots: ["ugds", "lychee"])
    monkeypatch.setattr(runplan, "estimates", lambda reg, papers, roots: {
        "ugds": estimate("ugds", 300), "lychee": estimate("lychee", 3000)})
    published, filed_before = [], []

    def fake_run(reg, papers, machine=None, bench=None, dry_run=False, commit=None):
        if not dry_run:  # each paper's asv run adds its benchmark to the one result file of that commit
            filed_before.append((tmp_path / "reports" / "results" / "box").exists())
            asvfiles.write_run(results, machine, commit, 1_700_000_000_000,
                               {f"{papers[0]}.Claim.track_x": (["size"], [["1"]], [1.0], "x")})
            head[0] = "ef" * 20  # its reports committed while the next paper runs
        return 0
    monkeypatch.setattr(runner, "run", fake_run)
    monkeypatch.setattr(report, "reference", lambda reg: published.append(sorted(
        json.loads(next((tmp_path / "reports" / "results" / "box").glob("cdcdcdcd-*.json")).read_text())["results"]))
        or ([], [], []))
    assert cli.main(["run", "--stale", "--machine", "box", "--publish", "--dry-run"]) == 0
    assert "would publish each paper's results into reports/results/box" in capsys.readouterr().out
    assert not (tmp_path / "reports").exists() and published == []
    assert cli.main(["run", "--stale", "--machine", "box", "--publish"]) == 0
    out = capsys.readouterr().out
    assert out.count("claimbench: published box/cdcdcdcd into") == 2
    assert filed_before == [False, True]  # the first paper was filed before the second began
    assert published == [["lychee.Claim.track_x", "ugds.Claim.track_x"]]  # then the reports, once
    assert cli.main(["run", "--publish", "--quick"]) == 2
    assert "--publish files full runs" in capsys.readouterr().err
    monkeypatch.setattr(runner, "uncommitted", lambda root=None: " M suites/ugds.py")
    assert cli.main(["run", "--stale", "--machine", "box", "--publish"]) == 2
    assert "commit or stash these changes first:\n M suites/ugds.py" in capsys.readouterr().err
