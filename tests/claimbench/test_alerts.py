import json

import numpy as np
import pytest

from claimbench import alerts, asvfiles, cli, ingest, registry, store, verdicts
from claimbench.datasets import alert_histories


def series(values, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    return [v * (1 + noise * rng.standard_normal()) for v in values]


@pytest.mark.parametrize("direction, before, after", [("lower", 1.0, 1.5), ("higher", 100.0, 60.0)])
def test_planted_step_is_found_in_either_direction(direction, before, after):
    values = series([before] * 10 + [after] * 5, noise=0.01)
    found = alerts.find_regressions(values, direction, threshold=0.05)
    assert len(found) == 1
    i_before, i_after, v_before, v_after = found[0]
    assert i_after == 10 and v_before == pytest.approx(before, rel=0.05) and v_after == pytest.approx(after, rel=0.05)


def test_a_lucky_run_after_the_step_does_not_turn_the_change_around():
    """IVF-Flat's QPS on this VM: 181, then 155, one lucky 235, then 149 and 148: a drop, reported as one."""
    values = [181.0, 155.0, 235.0, 149.0, 148.0]
    (i_before, i_after, v_before, v_after), = alerts.find_regressions(values, "higher", 0.05)
    assert (i_before, i_after, v_before, v_after) == (0, 1, 181.0, 148.0)


@pytest.mark.parametrize("direction, before, after", [("lower", 1.5, 1.0), ("higher", 60.0, 100.0)])
def test_improvements_are_not_alerts(direction, before, after):
    assert alerts.find_regressions(series([before] * 10 + [after] * 5, 0.01), direction, 0.05) == []


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("direction", ["lower", "higher"])
def test_flat_noisy_series_raises_no_alarm(seed, direction):
    assert alerts.find_regressions(series([10.0] * 30, noise=0.02, seed=seed), direction, 0.05) == []


@pytest.mark.parametrize("before, after, change", [(4.0, 3.0, -0.25), (-8.0, -24.0, -2.0), (-8.0, -4.0, 0.5),
                                                   (0.0, 1.0, None)])
def test_a_change_is_signed_as_the_value_moved(before, after, change):
    alert = alerts.Alert("regression", "s.B.track_x", "{}", "box", "c", None, before, after, "")
    assert alert.change == change


def test_thresholds_by_pattern():
    t = alerts.Thresholds(0.05, {"lychee.*": 0.1, "lychee.Sweep.*": 0.2})
    assert t.for_benchmark("lychee.Sweep.track_qps") == 0.2
    assert t.for_benchmark("lychee.Claim.track_speedup") == 0.1
    assert t.for_benchmark("other.x") == 0.05
    assert alerts.Thresholds.from_pyproject(overrides={"*": 0.3}).default == 0.3


def test_thresholds_read_from_their_own_table(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.claimbench.alerts]\ndefault_threshold = 0.07\n'
                         '[tool.claimbench.alerts.thresholds]\n"disk.Reads.*" = 0.25\n')
    t = alerts.Thresholds.from_pyproject(pyproject)
    assert t.for_benchmark("disk.Reads.track_iops") == 0.25 and t.for_benchmark("disk.Claim.track_x") == 0.07


def write_history(results, values, bench="s.Claim.track_speedup", gate=None):
    for i, v in enumerate(values):
        benches = {bench: (["dataset"], [["d"]], [v], "x")}
        if gate is not None:
            benches["s.Claim.track_identical"] = (["dataset"], [["d"]], [gate[i]], "fraction identical")
        asvfiles.write_run(results, "box", f"{i + 1:08x}" + "0" * 32, 1_700_000_000_000 + i * 86_400_000, benches)


PAPERS = '''
[[paper]]
id = "p"
title = "P"
tier = "A"
task = "t"
suite = "s"
baselines = ["b"]

[[paper.claims]]
id = "speed"
metric = "m"
unit = "x"
direction = "higher"
claimed = 2.0
claimed_text = "2x"
conditions = ""
baseline = "b"
benchmark = "s.Claim.track_speedup"
gate = { benchmark = "s.Claim.track_identical", min = 1.0 }
'''


def planted(tmp_path, speeds, gate):
    """(store, papers.toml) of PAPERS' claim with the speed and gate histories written and ingested."""
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    papers = tmp_path / "papers.toml"
    papers.write_text(PAPERS)
    write_history(results, speeds, gate=gate)
    assert ingest.ingest([results], db=db).ok
    return db, papers


def test_cli_alerts_flags_planted_regression_flip_and_gate(tmp_path, capsys):
    db, papers = planted(tmp_path, series([3.0] * 8 + [1.5] * 3, 0.01), [1.0] * 10 + [0.9])
    md = tmp_path / "alerts.md"
    code = cli.main(["alerts", "--db", str(db), "--papers", str(papers), "--markdown", str(md),
                     "--fail-on", "regression"])
    out = capsys.readouterr().out
    assert code == 1
    assert "regression" in out and "s.Claim.track_speedup" in out
    kinds = {line.split("|")[1].strip() for line in md.read_text().splitlines() if line.startswith("| ")}
    assert {"regression", "flip", "gate"} <= kinds
    with store.connect(db, read_only=True) as con:
        stored = con.execute("SELECT kind, count(*) FROM alerts GROUP BY kind").fetchall()
    assert dict(stored)["regression"] >= 1


def test_claims_sharing_a_failed_gate_raise_one_gate_alert(tmp_path):
    db, papers = planted(tmp_path, series([3.0] * 11, 0.01), [0.9] * 11)
    papers.write_text(PAPERS + PAPERS[PAPERS.index("[[paper.claims]]"):].replace('id = "speed"', 'id = "speed-2"'))
    with store.connect(db, read_only=True) as con:
        latest, history = verdicts.compute_with_history(con, registry.load(papers), store_history=False)
    gates = [a for a in alerts.gate_and_flip_alerts(latest, history) if a.kind == "gate"]
    assert len(gates) == 1 and gates[0].benchmark == "s.Claim.track_identical"
    assert gates[0].detail.startswith("p/speed, p/speed-2: gate s.Claim.track_identical >= 1")


def test_a_flip_is_found_from_the_results_alone_as_the_read_only_leaderboard_reads_them(tmp_path):
    db, papers = planted(tmp_path, series([3.0] * 8 + [1.5] * 3, 0.01), [1.0] * 11)
    with store.connect(db, read_only=True) as con:  # no verdict stored yet: nothing ran `claims` or `alerts`
        assert con.execute("SELECT count(*) FROM verdicts").fetchone()[0] == 0
        latest, history = verdicts.compute_with_history(con, registry.load(papers), store_history=False)
    flips = [a for a in alerts.gate_and_flip_alerts(latest, history) if a.kind == "flip"]
    assert [a.benchmark for a in flips] == ["p/speed"] and "reproduced at" in flips[0].detail


def test_a_step_says_the_memory_bandwidth_its_class_timed_in_both_runs(tmp_path):
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    speeds, bandwidths = [3.0] * 8 + [2.0], [22.0] * 8 + [33.0]
    for i, (speed, gbps) in enumerate(zip(speeds, bandwidths)):
        asvfiles.write_run(results, "box", f"{i + 1:08x}" + "0" * 32, 1_700_000_000_000 + i * 86_400_000,
                           {"s.Claim.track_speedup": (["dataset"], [["d"]], [speed], "x"),
                            "s.Claim.track_memory_bandwidth": (["dataset"], [["d"]], [gbps], "GB/s")})
    assert ingest.ingest([results], db=db).ok
    with store.connect(db, read_only=True) as con:
        found = alerts.regressions(con, alerts.Thresholds())
    assert [a.benchmark for a in found] == ["s.Claim.track_speedup"]  # the bandwidth itself is context
    assert "memory bandwidth in the same rounds went from 22 to 33 GB/s (1.50x)" in found[0].detail


def test_cli_alerts_quiet_on_flat_history(tmp_path, capsys):
    db, papers = planted(tmp_path, series([3.0] * 12, 0.02), [1.0] * 12)
    assert cli.main(["alerts", "--db", str(db), "--papers", str(papers), "--fail-on", "any"]) == 0
    assert "No open regressions" in capsys.readouterr().out


def test_cli_claims_lists_every_paper(tmp_path, capsys):
    assert cli.main(["claims", "--db", str(tmp_path / "s.duckdb"), "--json"]) == 0
    said = capsys.readouterr()
    rows = json.loads(said.out)
    assert {r["claim"].split("/")[0] for r in rows} == {p.id for p in registry.load().papers}
    assert {r["verdict"] for r in rows} <= {"not measured yet", "not testable here"}
    assert "s.duckdb holds no results: `claimbench ingest reports/results`" in said.err
    assert not (tmp_path / "s.duckdb").exists()  # a mistyped --db does not leave an empty store behind


@pytest.mark.parametrize("command", ["report", "alerts"])
def test_cli_report_and_alerts_refuse_a_store_without_results(tmp_path, capsys, command):
    """An empty report would overwrite reports/ with 'not measured', and CI's alerts would pass on nothing."""
    out = tmp_path / "reports"
    extra = ["--out", str(out)] if command == "report" else ["--fail-on", "any"]
    assert cli.main([command, "--db", str(tmp_path / "typo.duckdb"), *extra]) == 2
    assert "typo.duckdb holds no results" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "typo.duckdb").exists()


def test_cli_claims_names_the_known_papers_for_an_unknown_id(tmp_path, capsys):
    assert cli.main(["claims", "--db", str(tmp_path / "s.duckdb"), "--paper", "no-such-paper"]) == 2
    assert "no paper with id 'no-such-paper' (known: lychee" in capsys.readouterr().err


def test_acknowledged_step_is_listed_with_its_reason_but_not_open(tmp_path):
    db, papers = planted(tmp_path, series([3.0] * 8 + [1.5] * 3, 0.01), [1.0] * 11)
    step_commit = f"{9:08x}"  # the ninth run is the first at 1.5
    with store.connect(db) as con:
        found = alerts.evaluate(con, registry.load(papers), alerts.Thresholds(),
                                {f"s.Claim.track_*@{step_commit}": "a deliberate trade", "other.*@0": "unrelated"})
        stored = dict(con.execute("SELECT status, count(*) FROM alerts GROUP BY status").fetchall())
    regressions = [a for a in found if a.kind == "regression"]
    assert regressions and all(a.status == "acknowledged" for a in regressions)
    assert "acknowledged: a deliberate trade" in regressions[0].detail
    assert stored["acknowledged"] == len(regressions)  # the claim's verdict flip stays open
    assert all(a.kind != "regression" for a in found if a.status == "open")
    md = alerts.markdown(found)
    assert "### Acknowledged (1)" in md and "a deliberate trade" in md
    assert alerts.acknowledgements(tmp_path / "missing.toml") == {}


def test_a_rechecked_step_is_listed_as_not_the_code_with_what_was_measured(tmp_path):
    """Read through evaluate_as_configured, as `claimbench alerts` and the end of `claimbench run` read it (the
    run once left the rechecks out and counted 84 open alerts where the CLI counted 23)."""
    db, papers = planted(tmp_path, series([3.0] * 8 + [1.5] * 3, 0.01), [1.0] * 11)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.claimbench.alerts.rechecked]\n'
                         f'"s.Claim.track_*@{9:08x}" = "the older commit timed beside it today: as slow"\n')
    with store.connect(db) as con:
        found = alerts.evaluate_as_configured(con, registry.load(papers), pyproject)
    regressions = [a for a in found if a.kind == "regression"]
    assert regressions and all(a.status == alerts.NOT_THE_CODE for a in regressions)
    assert "not the code: the older commit timed beside it today" in regressions[0].detail
    md = alerts.markdown(found)
    assert "### Not the code (1)" in md and "### Acknowledged" not in md
    assert alerts.rechecks(tmp_path / "missing.toml") == {}


DROP_SHAPES = [s for s in alert_histories.SHAPES if s != "improvement"]


@pytest.mark.parametrize("direction", ["higher", "lower"])
@pytest.mark.parametrize("shape", DROP_SHAPES)
def test_a_planted_30_percent_drop_is_flagged_where_it_entered(shape, direction):
    for seed in range(5):
        values, start = alert_histories.planted(shape, 0.3, direction, seed)
        found = alerts.detect(values, direction, 0.05)
        assert {after for _, after, _, _, _ in found} & {start, start + 1}, (seed, found)


@pytest.mark.parametrize("direction", ["higher", "lower"])
@pytest.mark.parametrize("shape, drop", [("flat", 0.0), ("climbing", 0.0), ("improvement", 0.3),
                                         ("improvement", 0.05)])
def test_no_alert_where_nothing_regressed(shape, drop, direction):
    for seed in range(10):
        values, _ = alert_histories.planted(shape, drop, direction, seed)
        assert alerts.detect(values, direction, 0.05) == [], seed


def test_the_newest_point_rule_catches_a_drop_after_a_climb_that_asv_calls_noise():
    values, _ = alert_histories.planted("climbing", 0.5, "higher", 0)
    assert alerts.find_regressions(values, "higher", 0.05) == []  # asv: a single trailing point is noise
    (before, after, v_before, v_after, rule), = alerts.detect(values, "higher", 0.05)
    assert rule == "newest point" and after == len(values) - 1 and v_after == values[-1]
    assert v_before == pytest.approx(max(values[-2], sorted(values[-4:-1])[1]))


def test_a_step_asv_reports_is_not_raised_again_by_the_runs_that_stay_at_its_level():
    level = [10.0, 10.2, 9.9, 10.1, 10.0, 10.1, 9.8, 10.0]
    (before, after, v_before, v_after, rule), = alerts.detect(level + [6.0, 6.0], "higher", 0.05)
    assert rule == "asv step" and after == len(level) and v_after == 6.0  # (once also "newest point", 9.8 -> 6)
    further = alerts.detect(level + [6.0, 6.0, 3.0], "higher", 0.05)
    assert len(level) + 2 in {after for _, after, *_ in further}  # a drop below that level is raised


def test_cli_fails_on_a_halved_newest_commit_after_a_climb_until_acknowledged(tmp_path, capsys):
    results, db = tmp_path / "results", tmp_path / "s.duckdb"
    results.mkdir()
    papers = tmp_path / "papers.toml"
    papers.write_text(PAPERS)
    values, _ = alert_histories.planted("climbing", 0.5, "higher", 1)
    write_history(results, values)
    assert ingest.ingest([results], db=db).ok
    args = ["alerts", "--db", str(db), "--papers", str(papers), "--fail-on", "regression"]
    assert cli.main(args) == 1
    assert "newest point" in capsys.readouterr().out
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.claimbench.alerts.acknowledged]\n"s.Claim.*@0000000d" = "a planned trade"\n')
    with store.connect(db) as con:
        found = alerts.evaluate(con, registry.load(papers), alerts.Thresholds(), alerts.acknowledgements(pyproject))
    regression, = [a for a in found if a.kind == "regression"]
    assert regression.status == "acknowledged" and "a planned trade" in regression.detail
