import subprocess

import pytest

from claimbench import alerts, asvfiles, codepath, ingest, store

SOURCES = {
    "suites/__init__.py": "",
    "suites/common.py": "from claimbench.datasets import text\n",
    "suites/s.py": "import torch\nfrom . import common\nfrom claimbench.impl import fast\n",
    "impl/__init__.py": "",
    "impl/fast.py": "from claimbench import intervals\n",
    "claimbench/__init__.py": "",
    "claimbench/intervals.py": "from .llm import evaluate as evaluate_llm\n",
    "claimbench/llm/__init__.py": "",
    "claimbench/llm/evaluate.py": "",
    "claimbench/unrelated.py": "",
    "datasets/__init__.py": "",
    "datasets/text.py": "",
    "datasets/data/MANIFEST.json": "{}",
    "kernels/test_fast.py": "from claimbench.impl.fast import *\n",
    "README.md": "",
    "pyproject.toml": '[tool.setuptools.package-dir]\n"claimbench.suites" = "suites"\n"claimbench.impl" = "impl"\n'
                      '"claimbench.datasets" = "datasets"\n',
}


def git(repo, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def commit(repo, changed: str) -> str:
    path = repo / changed
    path.parent.mkdir(parents=True, exist_ok=True)
    added = "\nprint()\n" if changed.endswith(".py") else "\n"  # a statement that runs at import
    path.write_text((path.read_text() if path.exists() else SOURCES.get(changed, "")) + added)
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", changed)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
    root = tmp_path / "repo"
    for name, text in SOURCES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    git(root, "init", "-q")
    return root


def test_the_code_path_follows_relative_and_absolute_imports_and_takes_the_data(repo):
    assert codepath.files("s", repo) == (
        "claimbench/__init__.py", "claimbench/intervals.py", "claimbench/llm/__init__.py",
        "claimbench/llm/evaluate.py", "datasets/__init__.py", "datasets/data", "datasets/text.py",
        "impl/__init__.py", "impl/fast.py", "suites/__init__.py", "suites/common.py", "suites/s.py")
    assert "kernels/test_fast.py" in codepath.files("kernels/test_fast", repo)
    assert codepath.files("missing", repo) == ()


def test_unchanged_tells_a_change_off_the_path_from_one_on_it(repo):
    first = commit(repo, "README.md")
    off_path = commit(repo, "claimbench/unrelated.py")
    on_path = commit(repo, "claimbench/llm/evaluate.py")
    data = commit(repo, "datasets/data/MANIFEST.json")
    assert codepath.unchanged("s", first, off_path, repo) is True
    assert codepath.unchanged("s", off_path, on_path, repo) is False
    assert codepath.unchanged("s", on_path, data, repo) is False
    assert codepath.unchanged("s", first, "0" * 40, repo) is None  # a commit this clone lacks
    assert codepath.unchanged("missing", first, off_path, repo) is None


FAST = '''"""Fast."""
from claimbench import intervals

LIMIT = 3
SEED = intervals.seed(0)


def helper():
    return 1


def used():
    """Used."""
    return helper()


def unused():
    return 2


def by_string():
    return 3


@register
def plugin():
    return 4
'''


def write(repo, changes: dict[str, str]) -> str:
    for name, text in changes.items():
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "change")
    return git(repo, "rev-parse", "HEAD")


@pytest.mark.parametrize("path, old, new, same", [
    ("impl/fast.py", '"""Used."""', '"""Used, said otherwise."""  # and a comment', True),
    ("impl/fast.py", "return 2", "return 20", True),  # nothing on the path names unused
    ("impl/fast.py", "def unused():\n    return 2\n", "", True),
    ("impl/fast.py", "LIMIT = 3", "LIMIT = 4", True),
    ("impl/fast.py", "return helper()", "return helper() + 1", False),  # the suite calls used
    ("impl/fast.py", "return 1", "return 10", False),  # used calls helper
    ("impl/fast.py", "return 3", "return 30", False),  # a string on the path names by_string (getattr)
    ("impl/fast.py", "return 4", "return 40", False),  # a decorator may register plugin
    ("impl/fast.py", "intervals.seed(0)", "intervals.seed(1)", False),  # a call at import
    ("impl/fast.py", "from claimbench import intervals", "from claimbench import intervals, codepath", False),
    ("suites/s.py", '"""Suite."""', '"""The suite."""', True),
    ("suites/s.py", "def unused_here():\n    return 0", "def unused_here():\n    return 1", False),  # asv reads it
])
def test_unchanged_reads_which_definitions_changed_and_whether_the_path_names_them(repo, path, old, new, same):
    base = {"impl/fast.py": FAST,
            "suites/s.py": '"""Suite."""\nfrom claimbench.impl import fast\n\n\ndef time_it():\n    fast.used()\n'
                           "\n\ndef unused_here():\n    return 0\n",
            "claimbench/intervals.py": 'METHOD = getattr(object, "by_string", None)\n'}
    before = write(repo, base)
    assert old in base[path]
    after = write(repo, {path: base[path].replace(old, new)})
    assert codepath.unchanged("s", before, after, repo) is same


def test_changes_names_what_changed_that_the_suite_runs(repo):
    calls = "from . import common\nfrom claimbench.impl import fast\n\nfast.used()\n"
    first = write(repo, {"impl/fast.py": FAST, "suites/s.py": calls})
    both = write(repo, {"impl/fast.py": FAST.replace("return 1", "return 10").replace("return 2", "return 20")})
    suite = write(repo, {"suites/s.py": calls.replace("used()", "used(1)")})
    data = commit(repo, "datasets/data/MANIFEST.json")
    assert codepath.changes("s", first, both, repo) == ("impl/fast.py: helper",)  # not unused
    assert codepath.changes("s", both, suite, repo) == ("suites/s.py",)
    assert codepath.changes("s", suite, data, repo) == ("datasets/data",)
    assert codepath.changes("s", data, data, repo) == ()


def test_a_version_that_does_not_parse_is_a_change(repo):
    before = write(repo, {"impl/fast.py": FAST.replace("def unused():", "def unused(:")})
    after = write(repo, {"impl/fast.py": FAST})
    assert codepath.unchanged("s", before, after, repo) is False


def test_an_import_star_on_the_path_names_everything(repo):
    before = write(repo, {"impl/fast.py": FAST, "claimbench/intervals.py": "from claimbench.impl.fast import *\n"})
    after = write(repo, {"impl/fast.py": FAST.replace("return 2", "return 20")})
    assert codepath.unchanged("s", before, after, repo) is False


@pytest.mark.parametrize("step_change, noted", [("claimbench/unrelated.py", True), ("impl/fast.py", False)])
def test_a_step_with_no_change_on_its_code_path_says_so(repo, tmp_path, step_change, noted):
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    values = [3.0] * 8 + [1.5] * 3
    commits = [commit(repo, step_change if i == 8 else "README.md") for i in range(len(values))]
    for i, (sha, value) in enumerate(zip(commits, values)):
        asvfiles.write_run(results, "box", sha, 1_700_000_000_000 + i * 86_400_000,
                           {"s.Claim.track_speedup": (["dataset"], [["d"]], [value], "x")})
    assert ingest.ingest([results], db=db).ok
    with store.connect(db, read_only=True) as con:
        found, = alerts.regressions(con, alerts.Thresholds(), root=repo)
    assert found.commit_hash == commits[8]
    assert ("nothing its code path runs changed" in found.detail) is noted
    assert ("1 of them are steps with no change on their code path" in alerts.markdown([found])) is noted
    if noted:
        assert f"from {commits[7][:8]} to {commits[8][:8]}" in found.detail and "12 files" in found.detail


def test_two_runs_of_one_commit_say_the_code_did_not_change():
    same = "0123abcd" * 5
    assert "both values were measured at 0123abcd" in alerts._code_path_note("s.x", same, same, None)
    assert alerts._code_path_note("pytest:kernels/test_x.py::t", None, None, None) == ""  # results without a commit
