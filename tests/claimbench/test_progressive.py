"""`claimbench run --serve` on a tiny real asv suite: the leaderboard answers while the suite runs, the
suite's rows land when it ends, and Ctrl-C mid-run stops everything with the store intact."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import pytest

from claimbench import asvfiles, environment, localservices, progressive, registry, runner, store

SLOW_SUITE = '''
import time

INPUTS = ()


class Slow:
    def track_value(self):
        time.sleep(8)
        return 1.0
    track_value.unit = "queries/s"
'''
STUCK_SUITE = '''
import time

INPUTS = ()


class Stuck:
    def setup_cache(self):  # asv runs this in a session of its own: Ctrl-C at the terminal never reaches it
        time.sleep(600)
        return 1.0

    def track_value(self, r):
        return r
    track_value.unit = "queries/s"
'''
BUILDS_SUITE = '''
from claimbench.datasets import vectors

INPUTS = ()


class Builds:
    def track_value(self):  # writes to the dataset cache, as a fresh machine's first run does
        path = vectors.cache_dir() / "tiny-input.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"built")
        return 1.0
    track_value.unit = "queries/s"
'''
GPU_SUITE = '''
INPUTS = ()
REQUIRES = ("gpu",)


class Gpu:
    def track_value(self):
        return 1.0
    track_value.unit = "queries/s"
'''
HELPER = '''
def shared():  # a module the suites import: it declares no INPUTS, so it is not a suite
    return 1.0
'''
PAPERS = '''
[[paper]]
id = "slow"
title = "Slow"
tier = "A"
task = "t"
suite = "slow"
baselines = ["b"]

[[paper.claims]]
id = "c"
metric = "m"
unit = "x"
direction = "higher"
claimed_text = "better"
conditions = ""
baseline = "b"
benchmark = "slow.Slow.track_value"
'''


def make_repo(tmp_path, suites: dict[str, str]):
    repo = tmp_path / "repo"
    (repo / "suites").mkdir(parents=True)
    (repo / "suites" / "__init__.py").write_text("")
    for name, source in suites.items():
        (repo / "suites" / f"{name}.py").write_text(textwrap.dedent(source))
    (repo / "papers.toml").write_text(PAPERS)
    base = {"version": 1, "project": "tiny", "repo": ".", "branches": ["HEAD"], "environment_type": "existing",
            "benchmark_dir": "suites", "env_dir": ".asv/env"}
    for name, results in (("asv.conf.json", ".asv/results"), ("asv.quick.conf.json", ".asv/results-quick")):
        (repo / name).write_text(json.dumps({**base, "results_dir": results, "html_dir": results + "-html"}))
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "tiny"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)
    return repo


@pytest.fixture
def tiny_repo(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # asv's machine file
    monkeypatch.setenv("CLAIMBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(environment, "gpu_info", lambda: {"gpu": None, "gpu_count": 0, "driver": None, "cuda": None})
    return make_repo(tmp_path, {"slow": SLOW_SUITE, "builds": BUILDS_SUITE, "needs_gpu": GPU_SUITE, "helper": HELPER})


@pytest.fixture
def stuck_repo(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    return make_repo(tmp_path, {"stuck": STUCK_SUITE})


def answers(url: str) -> bool:
    try:
        return urllib.request.urlopen(url + "/_stcore/health", timeout=2).status == 200
    except OSError:
        return False


def rows(db, benchmark: str) -> int:
    with store.connect(db, read_only=True) as con:
        return 0 if con is None else con.execute("SELECT count(*) FROM results WHERE benchmark = ?",
                                                 [benchmark]).fetchone()[0]


def test_the_leaderboard_answers_before_the_suite_ends_and_shows_its_rows_after(tiny_repo, tmp_path):
    db, port = tmp_path / "s.duckdb", localservices.free_port()
    url, done, messages = f"http://127.0.0.1:{port}", [], []
    reg = registry.load(tiny_repo / "papers.toml")
    run = threading.Thread(target=lambda: done.append(progressive.serve_and_run(
        reg, quick=True, machine="tinybox", root=tiny_repo, db=db, port=port, wait=False, progress=messages.append)))
    run.start()
    deadline, seen = time.monotonic() + 120, False
    while time.monotonic() < deadline and run.is_alive():
        state = progressive.read_progress(db)
        if state and state["running"] == "slow" and answers(url):
            seen = True
            assert progressive.progress_text(state).startswith(
                "tinybox: 0 of 2 suites measured (quick mode), running slow")
            assert rows(db, "slow.Slow.track_value") == 0  # not there yet
            break
        time.sleep(0.3)
    run.join(300)
    assert seen, "the leaderboard did not answer while the suite ran"
    assert done == [0] and rows(db, "slow.Slow.track_value") == 1
    assert rows(db, progressive.TIME_BENCHMARK) == 1  # the suite's own wall time, a result of the quick run
    assert rows(db, progressive.COLD_TIME_BENCHMARK) == 1  # the suite that built a cached input: no budget
    assert [m for m in messages if "builds built 1 cached input(s)" in m]
    assert "claimbench: needs_gpu skipped: it needs a GPU, which this machine lacks" in messages
    assert rows(db, "needs_gpu.Gpu.track_value") == 0  # skipped in one line, not started to skip every row
    assert progressive.read_progress(db) is None and not answers(url)  # the app stopped with the run
    assert (tiny_repo / "reports" / "alerts.md").exists()
    assert not [m for m in messages if "could not ingest" in m]  # the suites' wall-time file is not a result


def test_ctrl_c_mid_run_stops_the_run_and_the_app_and_keeps_the_store(stuck_repo, tmp_path):
    tiny_repo = stuck_repo
    db, port = tmp_path / "s.duckdb", localservices.free_port()
    shipped = tiny_repo / "reports" / "results"  # reference results: ingested before the suites run
    asvfiles.write_run(shipped, "ref-box", "a" * 40, 1_700_000_000_000, {"slow.Slow.track_value": ([], [], [2.0], "x")})
    script = textwrap.dedent(f"""
        import signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal: a test run started in the
        # background inherits SIGINT ignored, and so would the run and asv, which then never see the Ctrl-C
        from claimbench import progressive, registry
        reg = registry.load({str(tiny_repo / 'papers.toml')!r})
        sys.exit(progressive.serve_and_run(reg, machine="tinybox", root=__import__("pathlib").Path({str(tiny_repo)!r}),
                                           db={str(db)!r}, port={port}))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not ((progressive.read_progress(db) or {}).get("running") == "stuck"
                                                and answers(f"http://127.0.0.1:{port}")):
        time.sleep(0.3)
    time.sleep(5)  # asv is inside setup_cache now
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group, not asv's benchmark session
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:]
    assert "stopped" in out
    with store.connect(db, read_only=True) as con:  # consistent: opens, reads, no half-written run
        assert con.execute("SELECT count(*) FROM runs r LEFT JOIN results x USING (run_id) "
                           "WHERE x.run_id IS NULL").fetchone()[0] == 0
        assert con.execute("SELECT machine, value FROM results JOIN runs USING (run_id)").fetchall() == [("ref-box", 2.0)]
    assert not answers(f"http://127.0.0.1:{port}") and progressive.read_progress(db) is None
    left = subprocess.run(["pgrep", "-f", f"{tiny_repo}/suites"], capture_output=True, text=True).stdout.split()
    assert not left, f"benchmark processes left running: {left}"


def test_a_suite_over_its_quick_budget_is_an_alert(tiny_repo, tmp_path):
    """The newest quick run of each suite against its budget: the QUICK_BUDGET_S its module states ("slow":
    300 s), else 90 s; a suite that built cached inputs has none."""
    from claimbench import alerts, ingest
    (tiny_repo / "suites" / "slow.py").write_text("QUICK_BUDGET_S = 300  # seconds\n" + SLOW_SUITE)
    assert progressive.quick_budget("slow", tiny_repo) == 300 and progressive.quick_budget("fast", tiny_repo) == 90
    (tiny_repo / "suites" / "bad.py").write_text("QUICK_BUDGET_S = 5 * 60\n")
    with pytest.raises(ValueError, match=r"bad\.py:1: QUICK_BUDGET_S must be a positive number of seconds"):
        progressive.quick_budget("bad", tiny_repo)
    results = tmp_path / "quick"
    for i, (slow, fast) in enumerate(((400.0, 30.0), (200.0, 120.0))):  # newest: "fast" over 90 s, "slow" within 300
        commit = f"{i + 1:08x}" + "0" * 32
        progressive._record_times(results, "box", commit, {"slow": slow, "fast": fast, "cold": 900.0},
                                  1_700_000_000_000 + i * 86_400_000, cold={"cold"})
        environment.write_run_record(results / "box", commit, "quick", {"harness": {}})
    db = tmp_path / "s.duckdb"
    assert ingest.ingest([results], db=db).ok
    with store.connect(db) as con:
        found = alerts.budget_alerts(con, tiny_repo)
    assert [(a.kind, json.loads(a.params)["suite"], a.before, a.after) for a in found] == [("budget", "fast", 90, 120)]
    assert found[0].detail == "fast: 120 s in quick mode, over its 90 s budget"


def test_every_suites_quick_budget_and_requirements_read(monkeypatch):
    """Each suite's QUICK_BUDGET_S, where it states one, is a positive number the harness can read; the GPU
    suite says it needs a GPU, and only it; ugds's claims all need io_uring, so with the registry its suite
    does too; suites/common.py is a helper, not a suite."""
    reg = registry.load()
    suites = progressive.suites_in_order(reg)
    budgets = {suite: progressive.quick_budget(suite) for suite in suites}
    assert all(seconds > 0 for seconds in budgets.values()) and budgets["ugds"] == progressive.QUICK_BUDGET_S
    assert "common" not in suites and "gpu" in suites
    monkeypatch.setattr(environment, "io_uring_problem", lambda: "")
    for gpus, expected in ((0, {"gpu": "needs a GPU"}), (1, {})):
        monkeypatch.setattr(environment, "gpu_info", lambda: {"gpu": "x" if gpus else None, "gpu_count": gpus})
        assert runner.unrunnable(suites) == expected
        assert runner.unrunnable(suites, registry=reg) == expected
    monkeypatch.setattr(environment, "io_uring_problem", lambda: "it dies")
    assert runner.unrunnable(suites) == {}
    assert runner.unrunnable(suites, registry=reg) == {
        "ugds": "needs io_uring through a PyPI liburing that runs here (it dies)"}


def test_a_plain_run_of_every_suite_leaves_out_one_the_machine_cannot_run(tiny_repo, capsys):
    """`claimbench run` without --paper or --bench (asv over every suite) skips a suite that needs a GPU on a
    machine without one in one line, as make run does, and runs the others."""
    assert runner.run(registry.load(tiny_repo / "papers.toml"), machine="tinybox", root=tiny_repo,
                      dry_run=True) == 0
    assert capsys.readouterr().out.splitlines() == [
        "claimbench: needs_gpu skipped: it needs a GPU, which this machine lacks",
        "claimbench: would run asv on tinybox (full mode), every suite but needs_gpu"]
    assert runner.run(registry.load(tiny_repo / "papers.toml"), quick=True, machine="tinybox", root=tiny_repo) == 0
    ran = {name.split(".")[0] for path in (tiny_repo / ".asv" / "results-quick" / "tinybox").glob("*-existing-*.json")
           for name in json.loads(path.read_text())["results"]}
    assert ran == {"slow", "builds"}
