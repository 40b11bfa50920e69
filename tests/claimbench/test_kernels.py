"""`claimbench kernels`: a real pytest-benchmark run of a tiny kernel file in a temporary repository,
saved beside asv's results under the same machine and commit, ingested, shown, and alerted on."""
import functools
import importlib.metadata
import json
import shutil
import subprocess
import tomllib

import duckdb
import pytest

from claimbench import alerts, cli, inputs, ingest, registry, runner

TINY_KERNEL = '''
INPUTS = ()


def work(n):
    return sum(range(n))


def test_sum(benchmark):
    assert benchmark(work, N) == N * (N - 1) // 2
'''


def git(repo, *args):
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # asv's machine file goes here, not the user's
    (tmp_path / "home").mkdir()
    root = tmp_path / "repo"
    (root / "kernels").mkdir(parents=True)
    shutil.copy(registry.REPO_ROOT / "kernels" / "conftest.py", root / "kernels" / "conftest.py")
    (root / "asv.conf.json").write_text(json.dumps({"version": 1, "results_dir": ".asv/results",
                                                    "benchmark_dir": "suites"}))
    git(root, "init", "-q")
    return root


def commit_kernel(root, n: int, name: str = "tiny") -> str:
    (root / "kernels" / f"test_{name}.py").write_text(f"N = {n}\n" + TINY_KERNEL)
    git(root, "add", "-A")
    git(root, "commit", "-qm", f"n={n}")
    return git(root, "rev-parse", "HEAD")


def test_a_real_kernel_run_lands_beside_asv_results_and_in_the_store(repo, tmp_path):
    commit = commit_kernel(repo, 100_000)
    rc, path = runner.run_kernels("testbox", root=repo)
    assert rc == 0 and path == repo / ".asv" / "results" / "testbox" / f"{commit[:8]}{runner.KERNELS_SUFFIX}"
    data = json.loads(path.read_text())
    assert data["machine_info"]["node"] == "testbox" and data["commit_info"]["id"] == commit
    assert data["claimbench"] == {"mode": "full", "inputs": {"kernels/test_tiny": {}}}
    db = tmp_path / "s.duckdb"
    assert ingest.ingest([repo / ".asv" / "results"], db=db).ok  # the folder, as asv's results are ingested
    with duckdb.connect(str(db), read_only=True) as con:
        run = con.execute("SELECT machine, commit_hash, mode, source FROM runs").fetchall()
        rows = con.execute("SELECT benchmark, value, low, high, unit, direction FROM results").fetchall()
    assert run == [("testbox", commit, "full", "pytest-benchmark")]
    (bench, value, low, high, unit, direction), = rows
    assert bench == "pytest:kernels/test_tiny.py::test_sum" and low <= value <= high
    assert (unit, direction) == ("seconds", "lower") and inputs.suite_of(bench) == "kernels/test_tiny"


def test_a_slower_kernel_raises_a_regression_alert(repo, tmp_path, capsys):
    """The same rules as asv's series: 100x the work at the newest commit is flagged there."""
    db = tmp_path / "s.duckdb"
    for n in (100_000, 100_000, 100_000, 10_000_000):
        commit_kernel(repo, n)
        runner.run_kernels("testbox", root=repo)
    assert ingest.ingest([repo / ".asv" / "results"], db=db).ok
    with duckdb.connect(str(db)) as con:
        found = alerts.regressions(con, alerts.Thresholds.from_pyproject())
    # flagged at the newest commit (a loaded machine may add a step among the equal runs: not asserted)
    assert ("pytest:kernels/test_tiny.py::test_sum", git(repo, "rev-parse", "HEAD")) in {
        (a.benchmark, a.commit_hash) for a in found}


def test_cli_kernels_runs_and_ingests(repo, tmp_path, monkeypatch, capsys):
    commit_kernel(repo, 100_000)
    monkeypatch.setattr(runner, "run_kernels", functools.partial(runner.run_kernels, root=repo))
    assert cli.main(["kernels", "--machine", "testbox", "--db", str(tmp_path / "s.duckdb")]) == 0
    assert "1 run(s) added, 0 replaced, 0 unchanged; 1 result row(s) written" in capsys.readouterr().out


def test_the_repository_kernels_declare_their_inputs():
    declared = inputs.declared(registry.REPO_ROOT / "kernels")
    assert {"test_lychee", "test_ssa", "test_ugds", "test_tuner"} <= set(declared)
    known = set(inputs.manifest()) | set(inputs.GROUPS) | set(inputs.PACKAGES)
    assert all(set(names) <= known for names in declared.values()), declared
    assert "kernels" not in tomllib.loads((registry.REPO_ROOT / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]["testpaths"]  # timed, so never part of the default test run


def test_no_repository_folder_shadows_an_installed_package():
    """The tests and `claimbench kernels` run with the repository root first on sys.path, so a folder there
    that is a regular package hides an installed distribution's module of the same name (the kernels/
    folder once hid Hugging Face's `kernels`, which transformers 5.25 imports)."""
    installed = {name: dists for name, dists in importlib.metadata.packages_distributions().items()
                 if set(dists) != {"claimbench"}}
    shadowing = {path.parent.name for path in registry.REPO_ROOT.glob("*/__init__.py")} & set(installed)
    assert not shadowing, {name: installed[name] for name in shadowing}
