"""Every page under streamlit's AppTest, on the fixture store and on an empty one."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from claimbench import environment, ingest, registry
from claimbench.app import queries
from claimbench.report import BADGE
from tests.app.conftest import lychee_run
from tests.claimbench.test_comparable import probes
from tests.claimbench.test_kernels import repo  # noqa: F401 (a fixture)

APP = Path(__file__).resolve().parents[2] / "app"
PAGES = ["claims", "leaderboard", "paper", "alerts", "machines"]


def run(page: str, **query) -> AppTest:
    queries.st.cache_data.clear()
    at = AppTest.from_file(str(APP / "sections" / f"{page}.py"), default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def frames(at):
    """The dataframes a page shows (unwrapping styled ones)."""
    return [getattr(df.value, "data", df.value) for df in at.dataframe]


def text(at) -> str:
    parts = [m.value for m in at.markdown] + [c.value for c in at.caption] + [i.value for i in at.info]
    parts += [s.value for s in at.success] + [t.value for t in at.title]
    return "\n".join(str(p) for p in parts)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders_on_an_empty_store(empty_db, page):
    at = run(page)
    if page != "machines" or at.info:
        assert "No results in the store yet" in text(at)


def test_claims_page_shows_each_state(use_db):
    at = run("claims")
    df = frames(at)[0]
    assert set(df["paper"]) >= {"lychee", "ssa", "trt-tuner"} and df["paper"].nunique() == len(registry.load().papers)
    lychee = df[(df["paper"] == "lychee") & (df["claim"] == "speedup-at-equal-recall")].set_index("machine")
    assert lychee.loc["cpu-box", "badge"] == BADGE["partly"]  # 6.0 after the regression, claimed >= 9.7
    assert lychee.loc["gpu-box", "badge"] == BADGE["gate failed"]
    decode = df[(df["paper"] == "ssa") & (df["claim"] == "decode-speedup-1m")].set_index("machine")
    assert decode.loc["cpu-box", "badge"] == BADGE["not testable here"]
    assert decode.loc["gpu-box", "badge"] == BADGE["not measured yet"]
    assert len(at.get("vega_lite_chart")) == 1


def test_claims_side_by_side_gives_each_machine_a_column_group(use_db):
    at = run("claims")
    at.toggle[0].set_value(True).run()
    df = frames(at)[0]
    assert {"cpu-box", "cpu-box · measured", "cpu-box · commit", "gpu-box", "gpu-box · commit"} <= set(df.columns)
    assert len(df) == len(df.drop_duplicates(["paper", "claim"]))  # one row per claim
    lychee = df[(df["paper"] == "lychee") & (df["claim"] == "speedup-at-equal-recall")].iloc[0]
    assert lychee["cpu-box"] == BADGE["partly"] and lychee["gpu-box"] == BADGE["gate failed"]
    decode = df[(df["paper"] == "ssa") & (df["claim"] == "decode-speedup-1m")].iloc[0]
    assert decode["gpu-box"] == "not measured on gpu-box" and decode["gpu-box · measured"] == ""


def test_claims_filters(use_db):
    at = run("claims")
    at.multiselect[0].set_value(["lychee"]).run()
    at.multiselect[2].set_value(["gpu-box"]).run()
    df = frames(at)[0]
    assert set(df["paper"]) == {"lychee"} and set(df["machine"]) == {"gpu-box"}


def test_a_failed_gate_counts_as_measured(use_db):
    df = pd.DataFrame({"paper": ["race", "race", "e8-qat", "ssa"],
                       "verdict": ["gate failed", "not measured yet", "not testable here", "reproduced"]})
    assert queries.measured_papers(df) == ["race", "ssa"]  # race's values are withheld, not missing
    caption = next(c.value for c in run("claims").caption if c.value.startswith("Not measured yet on any machine"))
    assert "lychee" not in caption and "race" in caption  # the fixture measured lychee only


def test_leaderboard_ranks_only_gated_methods(use_db):
    df = frames(run("leaderboard"))[0]
    gpu = df[df["machine"] == "gpu-box"]
    assert gpu[gpu["method"] == "Lychee"]["rank"].isna().all()  # failed gate: shown, not ranked
    assert (gpu[gpu["method"] == "faiss IVF-Flat"]["rank"] == 1).all()
    cpu = df[(df["machine"] == "cpu-box") & (df["group"] == "spectrum-256-decay1.5")].set_index("method")
    assert cpu.loc["Lychee", "rank"] == 1


def test_boards_of_the_other_tasks(use_db):
    at = run("leaderboard")
    io = next(df for df in frames(at) if "io-uring-batched" in set(df["method"]))
    cpu = io[(io["machine"] == "cpu-box") & (io["group"] == "32")].set_index("method")
    assert cpu.loc["io-uring-batched", "rank"] == 1 and cpu.loc["io-uring-batched", "gate"] == "passed"
    assert io[io["machine"] == "gpu-box"]["rank"].isna().all()  # identical-bytes gate failed there
    cost = next(df for df in frames(at) if "kv-drop" in set(df["method"]))
    cost = cost[cost["machine"] == "cpu-box"].set_index("method")
    assert cost.loc["kv-drop", "rank"] == 1 and cost.loc["full-history", "rank"] == 2  # lower is better
    assert "No results for this task yet" in text(at)  # sparse attention and engine builds: none here


def test_paper_page_has_tradeoff_history_and_csv(use_db):
    at = run("paper", paper="lychee")
    assert "Lychee" in text(at)
    assert len(at.get("vega_lite_chart")) == 2  # trade-off and history
    assert len(at.get("download_button")) == 1


def test_a_paper_without_a_suite_lists_its_claims_as_not_measured(use_db, tmp_path, monkeypatch):
    papers = registry.DEFAULT_PAPERS.read_text() + textwrap.dedent('''
        [[paper]]
        id = "no-suite-yet"
        title = "A paper with no suite yet"
        tier = "C"
        task = "decoding"
        baselines = ["token-by-token AR"]
        source = "seeds/001"

        [[paper.claims]]
        id = "throughput"
        metric = "throughput vs token-by-token AR"
        unit = "x"
        direction = "higher"
        claimed = 2.0
        claimed_text = "2x"
        conditions = "none"
        baseline = "token-by-token AR"
        neutral = 1.0
        not_testable = "no suite yet"
        ''')
    (tmp_path / "papers.toml").write_text(papers)
    monkeypatch.setattr(registry, "DEFAULT_PAPERS", tmp_path / "papers.toml")
    at = run("paper", paper="no-suite-yet")
    assert "No suite for this paper yet" in text(at)


def test_paper_page_compares_methods_through_the_task_board(use_db):
    at = run("paper", paper="ugds")
    assert "Method vs baselines" in [s.value for s in at.subheader]
    assert len(at.get("vega_lite_chart")) == 1  # the task board (the fixture has no ugds claim history)


def test_paper_page_draws_the_suites_sweep(use_db):
    at = run("paper", paper="ssa")
    assert "Sweep" in [s.value for s in at.subheader]
    assert len(at.get("vega_lite_chart")) == 1
    sweep = queries.sweep(queries.db_version(), "ssa")
    exact = sweep[(sweep["machine"] == "cpu-box") & (sweep["x"] == "exact")]
    assert set(exact["metric"]) == {"task accuracy, % of dense", "attention-output relative error"}
    share = exact[(exact["metric"] == "task accuracy, % of dense") & (exact["series"] == "ssa")].iloc[0]
    assert (share["low"], share["value"], share["high"]) == (80.0, 100.0, 120.0)  # the interval, for the bars
    assert exact[exact["metric"] == "attention-output relative error"]["low"].isna().all()  # none recorded
    spec = json.loads(at.get("vega_lite_chart")[0].proto.spec)
    assert {"mark": {"type": "rule"}} in [{"mark": layer["mark"]} for layer in spec["spec"]["layer"]]


def test_alerts_page_lists_the_regression_and_gate(use_db):
    at = run("alerts")
    df = frames(at)[0]
    assert "regression" in set(df["kind"]) and "gate" in set(df["kind"])
    assert df["series"].str.startswith("paper?series=").all()
    assert set(df["status"]) <= {"open", "acknowledged"} and "open" in set(df["status"])
    counts = df["status"].value_counts()
    assert (f"{counts.get('open', 0)} open, {counts.get('acknowledged', 0)} acknowledged" in at.caption[0].value
            and "0 superseded" in at.caption[0].value)  # each status counted once
    assert list(df.columns[:3]) == ["benchmark", "machine", "change"]  # what moved, where, by how much


def test_alerts_page_filters_by_kind_and_status(use_db):
    at = run("alerts")
    assert at.multiselect[1].options[0] == "open"  # open first
    at.multiselect[0].set_value(["gate"]).run()
    at.multiselect[1].set_value(["open"]).run()
    df = frames(at)[0]
    assert set(df["kind"]) == {"gate"} and set(df["status"]) == {"open"}


def test_machines_page(use_db):
    df = frames(run("machines"))[0]
    row = df.set_index("machine").loc["gpu-box"]
    assert row["gpu"] == "NVIDIA H200" and "torch 2.13.0" in row["libraries"]
    assert row["numba_vectors"] == "full width (AVX-512)"  # which width the compiled kernels used
    assert row["io_uring"].endswith("this CPU lacks: SIGILL")  # why ugds's claims are not testable there


def test_machines_page_lists_what_run_stale_would_run_on_each(use_db):
    at = run("machines")
    assert "Out of date" in [s.value for s in at.subheader] and "claimbench run --stale --machine NAME" in text(at)
    stale = frames(at)[1].set_index(["machine", "why"])["papers"]
    assert stale["gpu-box", "inputs not recorded"] == "lychee"  # the fixture's files carry no run record
    assert stale["cpu-box", "not measured"].startswith("ssa, agent-cache")


def test_machines_page_charts_each_runs_speed_probes(tmp_path, monkeypatch):
    results = tmp_path / "results"
    results.mkdir()
    for i in range(2):
        lychee_run(results, "cpu-box", i, [1.0] * 4, 1.0)
        environment.write_run_record(results / "cpu-box", f"{i + 1:08x}" + "0" * 32, "full", {"lychee": {}},
                                     {"lychee": probes(1.0 + 0.3 * i, i)})
    db = tmp_path / "s.duckdb"
    assert ingest.ingest([results], db=db).ok
    monkeypatch.setenv("CLAIMBENCH_DB", str(db))
    at = run("machines")
    assert "Machine speed at each run" in [s.value for s in at.subheader] and len(at.get("vega_lite_chart")) == 1
    speed = queries.machine_speed(queries.db_version())
    assert len(speed) == 12 and set(speed["probe"]) == {"python", "vector", "memory"}  # 2 runs x 2 ends x 3
    assert set(speed["end"]) == {"before", "after"}
    slower = speed[speed["commit"] == "00000002"]["ms"].min()
    assert slower > speed[speed["commit"] == "00000001"]["ms"].max()  # the second run's probes, 1.3x as slow


def test_main_navigation_runs(use_db):
    at = AppTest.from_file(str(APP / "main.py"), default_timeout=60)
    at.run()
    assert not at.exception


def test_machines_page_shows_memory_in_gib(use_db):
    assert queries.gib("25276510208") == "23.5 GiB" and queries.gib("1GB") == "1GB" and queries.gib(None) == ""
    assert frames(run("machines"))[0].set_index("machine").loc["gpu-box", "ram"] == "1GB"  # the fixture's text


def test_paper_page_opens_on_a_paper_with_results(use_db):
    at = run("paper")
    assert at.selectbox[0].value == "lychee"  # the first registered paper with a measured claim


def test_quick_runs_are_marked_on_the_boards_and_the_vector_board_uses_a_log_axis(use_db, tmp_path, monkeypatch):
    import shutil

    from claimbench import environment, ingest
    from tests.app.conftest import lychee_run
    db = tmp_path / "copy.duckdb"
    shutil.copy(use_db, db)
    monkeypatch.setenv("CLAIMBENCH_DB", str(db))
    quick = tmp_path / "quick"
    quick.mkdir()
    lychee_run(quick, "laptop", 9, [0.4, 0.4, 12.0, 11.0], 1.0)  # a machine with quick results only
    (quick / "laptop" / f"{10:08x}{environment.RECORD_SUFFIX}").write_text('{"mode": "quick", "inputs": {}}')
    assert ingest.ingest([quick], db=db).ok
    at = run("leaderboard")
    assert "laptop · quick" in set(frames(at)[0]["machine"])
    assert registry.load().board("vector-search").log is True
    assert "log scale" in json.dumps(at.get("vega_lite_chart")[0].proto.spec)


def test_paper_page_shows_its_kernels(use_db, repo, tmp_path, monkeypatch):
    """A real pytest-benchmark run of a kernel file named for the paper's suite, ingested beside the
    fixture's results: the paper page lists it under its claims."""
    import shutil

    from claimbench import ingest, runner
    from tests.claimbench.test_kernels import commit_kernel
    db = tmp_path / "copy.duckdb"
    shutil.copy(use_db, db)
    monkeypatch.setenv("CLAIMBENCH_DB", str(db))
    commit_kernel(repo, 100_000, name="lychee")
    runner.run_kernels("cpu-box", root=repo)
    assert ingest.ingest([repo / ".asv" / "results"], db=db).ok
    at = run("paper", paper="lychee")
    assert "Kernels" in [s.value for s in at.subheader]
    kernels = next(f for f in frames(at) if "kernel" in f)
    assert list(kernels["kernel"]) == ["test_sum"] and list(kernels["machine"]) == ["cpu-box"]


def test_claims_page_shows_a_run_in_progress(use_db):
    import os
    from claimbench import progressive
    path = progressive.progress_path()
    path.write_text(json.dumps({"pid": os.getpid(), "machine": "cpu-box", "mode": "quick", "done": ["lychee"],
                                "running": "ssa", "total": 9, "since": 0, "eta_s": 0}))
    try:
        assert "1 of 9 suites measured (quick mode), running ssa" in text(run("claims"))
    finally:
        path.unlink()


def test_the_app_preloads_its_pages_without_a_warning_per_cached_query():
    """`claimbench app` imports the pages before Streamlit's runtime exists; st.cache_data's argument check
    would log a warning for each cached query there."""
    script = "import sys; from claimbench import cli; cli.preload_pages(); print('claimbench.app.views' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "True"
    assert "No runtime found" not in done.stderr, done.stderr
