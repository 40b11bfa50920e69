"""Shared fixtures: a real asv run on a tiny suite in a temporary git repository."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TINY_SUITE = '''
class Tiny:
    params = ([1, 2], ["a", "b"])
    param_names = ["size", "kind"]

    def track_value(self, size, kind):
        return size * (10 if kind == "a" else 20)
    track_value.unit = "queries/s"

    def time_sum(self, size, kind):
        sum(range(100 * size))


def track_crashes():
    raise RuntimeError("planted crash")
'''


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def asv_repo(repo: Path, module: str, source: str) -> str:
    """A git repository at `repo` holding one asv suite (benchmarks/<module>.py) and its asv.conf.json;
    returns its commit."""
    (repo / "benchmarks").mkdir(parents=True)
    (repo / "benchmarks" / "__init__.py").write_text("")
    (repo / "benchmarks" / f"{module}.py").write_text(textwrap.dedent(source))
    (repo / "asv.conf.json").write_text(json.dumps({
        "version": 1, "project": "tiny", "repo": ".", "branches": ["HEAD"], "environment_type": "existing",
        "benchmark_dir": "benchmarks", "results_dir": "results", "env_dir": "env", "html_dir": "html"}))
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "tiny")
    return _git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture(scope="session")
def asv_results(tmp_path_factory) -> Path:
    """results dir of a real `asv run --python=same --set-commit-hash` over TINY_SUITE."""
    repo = tmp_path_factory.mktemp("asvrepo")
    commit = asv_repo(repo, "tiny", TINY_SUITE)
    home = repo / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home)}
    subprocess.run([sys.executable, "-m", "asv", "machine", "--yes", "--machine", "testbox"], cwd=repo, env=env,
                   check=True, capture_output=True)
    subprocess.run([sys.executable, "-m", "asv", "run", "--python=same", "--set-commit-hash", commit,
                    "--machine", "testbox", "-a", "repeat=1", "-a", "rounds=1"], cwd=repo, env=env,
                   capture_output=True)  # exits non-zero: one benchmark crashes on purpose
    files = list((repo / "results" / "testbox").glob("*.json"))
    assert any(f.name != "machine.json" for f in files), "asv saved no results"
    return repo / "results"
