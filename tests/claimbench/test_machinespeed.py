"""The machine-speed probes: what they time, how two runs' probes are compared, and where a run
records them."""
import json
import time

import pytest

from claimbench import environment, machinespeed, runner

from .test_comparable import probes


def test_every_probe_is_timed_each_round():
    seconds = machinespeed.measure(rounds=2)
    assert set(seconds) == {"python", "vector", "memory"}
    assert all(len(rounds) == 2 and all(s > 0 for s in rounds) for rounds in seconds.values())


def test_the_most_slowed_probe_decides_and_says_how_sure():
    older, newer = probes(1.0, 0), probes(1.0, 1)
    newer["after"]["memory"] = [2 * s for s in newer["after"]["memory"]]  # memory twice as slow at the run's end
    slowed = machinespeed.slowdown(older, newer)
    assert slowed.probe == "memory" and 1.2 < slowed.ratio < 2.1 and slowed.significant  # half its rounds doubled
    same = machinespeed.slowdown(older, probes(1.0, 2))
    assert 0.95 < same.ratio < 1.05
    assert not machinespeed.slowdown(older, probes(0.8, 3)).significant  # faster is not slower
    assert "memory probe took" in slowed.describe() and "p = " in slowed.describe()


def test_runs_without_shared_probes_are_not_compared():
    assert machinespeed.slowdown(None, probes(1.0, 0)) is None
    assert machinespeed.slowdown({"before": {"python": [0.03]}}, {"before": {"vector": [0.03]}}) is None


def test_pooled_holds_both_ends_of_a_run_and_summary_reads_one():
    record = {"before": {"python": [0.01, 0.02, 0.03]}, "after": {"python": [0.04, 0.05, 0.06, 0.07]}}
    assert sorted(machinespeed.pooled(record)["python"]) == [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07]
    estimate = machinespeed.summary(record, "after")["python"]
    assert estimate.value == pytest.approx(0.055) and estimate.low <= 0.055 <= estimate.high
    assert machinespeed.summary(record, "before")["python"].value == pytest.approx(0.02)
    assert machinespeed.summary(record, "after")["python"].n == 4
    assert machinespeed.summary({"before": record["before"]}, "after") == {}


def test_a_second_run_at_one_commit_adds_its_suites_probes(tmp_path):
    environment.write_run_record(tmp_path, "a" * 40, "full", {"s": {}}, {"s": probes(1.0, 0)})
    environment.write_run_record(tmp_path, "a" * 40, "full", {"t": {}}, {"t": probes(1.2, 1)})
    environment.write_run_record(tmp_path, "a" * 40, "full", {"u": {}})  # a run that timed none keeps the others'
    record = json.loads((tmp_path / f"{'a' * 8}{environment.RECORD_SUFFIX}").read_text())
    assert set(record["machine_speed"]) == {"s", "t"} and set(record["inputs"]) == {"s", "t", "u"}


def test_the_suites_a_run_started_are_read_from_asvs_results(asv_results):
    machine_dir = asv_results / "testbox"
    commit = next(p.name for p in machine_dir.glob("*-*.json"))[:8]
    assert runner.suites_started(machine_dir, commit, since=0) == ["tiny"]
    assert runner.suites_started(machine_dir, commit, since=time.time() + 3600) == []
