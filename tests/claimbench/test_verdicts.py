import json

import pytest

from claimbench import verdicts
from claimbench.registry import Claim, Gate


def claim(**kw):
    base = dict(paper_id="p", id="c", metric="m", unit="x", direction="higher", claimed_text="2-4x",
                conditions="", baseline="b", claimed=(2.0, 4.0), benchmark="s.C.track_speedup", neutral=1.0)
    return Claim(**{**base, **kw})


def P(**params):
    return json.dumps(params, sort_keys=True)


def test_reproduced_partly_not_reproduced():
    assert verdicts.judge(claim(), {P(d="a"): 2.5}).verdict == verdicts.REPRODUCED
    # within 10% of the claimed gain (1.0)
    assert verdicts.judge(claim(), {P(d="a"): 1.92}).verdict == verdicts.REPRODUCED
    assert verdicts.judge(claim(), {P(d="a"): 1.85}).verdict == verdicts.PARTLY
    assert verdicts.judge(claim(claimed=(1.14, 1.63)), {P(): 1.04}).verdict == verdicts.PARTLY
    assert verdicts.judge(claim(), {P(d="a"): 1.5}).verdict == verdicts.PARTLY
    assert verdicts.judge(claim(), {P(d="a"): 0.9}).verdict == verdicts.NOT_REPRODUCED


def test_fold_over_parameters_uses_the_claims_aggregate():
    measured = {P(d="a"): 0.5, P(d="b"): 3.0}
    assert verdicts.judge(claim(), measured).measured == 3.0
    assert verdicts.judge(claim(aggregate="min"), measured).verdict == verdicts.NOT_REPRODUCED
    assert "; 1 of 2 reach it" in verdicts.judge(claim(aggregate="min"), measured).reason


def test_explaining_benchmarks_sit_beside_every_combination_and_in_the_reason():
    c = claim(explain=("s.C.track_pruned_fraction", "s.C.track_ceiling"))
    explain = {"s.C.track_pruned_fraction": {P(d="a"): 0.65, P(d="b"): 0.98}, "s.C.track_ceiling": {P(d="b"): 20.0}}
    v = verdicts.judge(c, {P(d="a"): 0.5, P(d="b"): 3.0}, explain_values=explain)
    assert v.reason.endswith("; at d=b: pruned fraction 0.98, ceiling 20")
    assert [e["explain"] for e in v.detail] == [{"pruned fraction": 0.65, "ceiling": None},
                                                {"pruned fraction": 0.98, "ceiling": 20.0}]
    assert "explain" not in verdicts.judge(claim(), {P(d="a"): 0.5}).detail[0]


def test_explaining_values_carry_their_intervals_where_recorded():
    c = claim(explain=("s.C.track_ratio_on_a", "s.C.track_ratio_on_b"))
    explain = {"s.C.track_ratio_on_a": {P(d="a"): 1.085}, "s.C.track_ratio_on_b": {P(d="a"): 0.926}}
    bounds = {"s.C.track_ratio_on_a": {P(d="a"): {"low": 1.012, "high": 1.17, "n": 48}}}
    v = verdicts.judge(c, {P(d="a"): 3.0}, explain_values=explain, explain_intervals=bounds)
    assert v.reason.endswith("; at d=a: ratio on a 1.08 [1.01, 1.17], ratio on b 0.926")
    assert v.detail[0]["explain_interval"] == {"ratio on a": [1.012, 1.17]}
    assert verdicts.explained(v.detail[0], "ratio on a", digits=4) == "1.085 [1.012, 1.17]"
    assert verdicts.explained(v.detail[0], "ratio on c") is None
    without_target = verdicts.judge(claim(claimed=None, explain=c.explain), {P(d="a"): 3.0}, explain_values=explain,
                                    explain_intervals=bounds)
    assert without_target.reason.endswith("; at d=a: ratio on a 1.08 [1.01, 1.17], ratio on b 0.926")
    no_params = verdicts.judge(claim(claimed=None, explain=c.explain), {P(): 3.0},
                               explain_values={"s.C.track_ratio_on_a": {P(): 1.085}})
    assert no_params.reason.endswith(" (1); ratio on a 1.08")  # no "at :" without parameters


def test_lower_is_better_claims():
    c = claim(direction="lower", claimed=(-27.7, -27.7), neutral=0.0, unit="%")
    assert verdicts.judge(c, {P(): -30.0}).verdict == verdicts.REPRODUCED
    assert verdicts.judge(c, {P(): -10.0}).verdict == verdicts.PARTLY
    assert verdicts.judge(c, {P(): 5.0}).verdict == verdicts.NOT_REPRODUCED


def test_direction_only_claim():
    c = claim(claimed=None)
    assert verdicts.judge(c, {P(): 1.2}).verdict == verdicts.REPRODUCED
    assert verdicts.judge(c, {P(): 0.8}).verdict == verdicts.NOT_REPRODUCED


def test_gate_failed_partly_and_passed():
    c = claim(gate=Gate("s.C.track_identical", min=1.0))
    measured = {P(d="a"): 5.0, P(d="b"): 3.0}
    failed = verdicts.judge(c, measured, {P(d="a"): 0.98, P(d="b"): 0.5})
    assert failed.verdict == verdicts.GATE_FAILED and failed.gate == "failed" and failed.measured is None
    assert failed.reason.endswith("failed on every combination; the closest read 0.98 at d=a")  # how far, and where
    partly = verdicts.judge(c, measured, {P(d="a"): 0.98, P(d="b"): 1.0})
    assert partly.gate == "partly" and partly.measured == 3.0 and partly.verdict == verdicts.REPRODUCED
    assert "excluded" in partly.reason
    assert verdicts.judge(c, measured, {P(d="a"): 1.0, P(d="b"): 1.0}).gate == "passed"
    unmeasured = verdicts.judge(c, measured, None)
    assert unmeasured.verdict == verdicts.GATE_FAILED  # an unmeasured gate never passes
    assert unmeasured.reason.endswith("; no combination has a gate value")
    both = verdicts.judge(claim(gate=Gate("s.C.track_loss", min=0.0, max=1.0)), {P(): 2.0}, {P(): 1.5})
    assert both.reason.endswith("failed on every combination; the closest read 1.5")  # no "at" without parameters
    crashed = verdicts.judge(c, {P(d="a"): None}, {P(d="a"): None})  # neither ran: no gate was judged
    assert crashed.verdict == verdicts.NOT_MEASURED and crashed.gate == "not measured" and "failed" in crashed.reason


def test_a_gate_that_passes_on_its_value_with_the_bound_inside_its_interval_says_so():
    c = claim(gate=Gate("s.C.track_accuracy_ratio", min=0.9))
    measured = {P(d="a"): 5.0, P(d="b"): 3.0}
    unsure = verdicts.judge(c, measured, {P(d="a"): 1.25, P(d="b"): 1.1},
                            gate_intervals={P(d="a"): {"low": 0.6, "high": 3.0}, P(d="b"): {"low": 1.0, "high": 1.2}})
    assert unsure.verdict == verdicts.REPRODUCED and unsure.gate == "passed"  # a gate passes on its value
    assert unsure.reason.endswith("; the gate passed on its value, but its interval spans the bound on 1 of 2 "
                                  "combination(s), e.g. 1.25 [0.6, 3] at d=a")
    assert [d.get("gate_interval") for d in unsure.detail] == [[0.6, 3.0], [1.0, 1.2]]
    no_interval = verdicts.judge(c, measured, {P(d="a"): 1.25, P(d="b"): 1.1})
    assert "interval spans the bound" not in no_interval.reason  # nothing recorded: nothing to say
    identical = claim(gate=Gate("s.C.track_identical", min=1.0))
    exact = verdicts.judge(identical, measured, {P(d="a"): 1.0, P(d="b"): 1.0},
                           gate_intervals={P(d="a"): {"low": 0.996, "high": 1.0}, P(d="b"): {"low": 0.99, "high": 1.0}})
    assert "interval spans the bound" not in exact.reason  # every query identical: the bound is the interval's end


def test_a_failed_gate_shows_its_closest_interval_and_says_when_the_data_cannot_tell():
    c = claim(gate=Gate("s.C.track_loss_vs_tolerance", max=1.0))
    unsure = verdicts.judge(c, {P(d="a"): 5.0}, {P(d="a"): 1.3}, gate_intervals={P(d="a"): {"low": 0.7, "high": 2.0}})
    assert unsure.verdict == verdicts.GATE_FAILED  # a gate fails on its value, as it passes
    assert unsure.reason.endswith("the closest read 1.3 [0.7, 2] at d=a; its interval spans the bound: the data "
                                  "cannot tell")
    clear = verdicts.judge(c, {P(d="a"): 5.0}, {P(d="a"): 18.4}, gate_intervals={P(d="a"): {"low": 17.0, "high": 20.0}})
    assert clear.reason.endswith("the closest read 18.4 [17, 20] at d=a")


def test_not_testable_and_not_measured():
    assert verdicts.judge(claim(requires=("gpu",)), None).verdict == verdicts.NOT_TESTABLE
    assert "GPU" in verdicts.judge(claim(requires=("gpu",)), None).reason
    assert verdicts.judge(claim(requires=("gpu",)), None, caps={"gpu"}).verdict == verdicts.NOT_MEASURED
    assert verdicts.judge(claim(requires=("gpu",)), {P(): 1.0}).reason == "needs a GPU; the rows here come from a " \
                                                                          "stand-in run"  # a CPU dry run's
    assert verdicts.judge(claim(requires=("gpu",)), {P(): None}).reason == "needs a GPU"  # it failed: no stand-in
    assert verdicts.judge(claim(not_testable="needs AIME"), None).reason == "needs AIME"
    assert verdicts.judge(claim(benchmark=None), None).reason == "no benchmark yet"
    failed = verdicts.judge(claim(), {P(): None})
    assert failed.verdict == verdicts.NOT_MEASURED and "failed" in failed.reason


@pytest.mark.parametrize("verdict", verdicts.VERDICTS)
def test_every_verdict_has_a_badge(verdict):
    from claimbench.report import BADGE
    assert verdict in BADGE


# Every cell of the table in claimbench/verdicts.py's docstring. Claim: 2-4x (reach 1.9x after the
# 10% tolerance on the claimed gain), neutral 1x; "lower" claims mirror it (-27.7%, reach -24.9%).
def interval(low, high, n=7, min_n=6):
    return {P(): {"low": low, "high": high, "n": n, "min_n": min_n, "method": "test"}}


@pytest.mark.parametrize("value, low, high, n, expected", [
    (3.0, 2.0, 5.0, 5, verdicts.INCONCLUSIVE),      # fewer samples than the method needs
    (1.5, 1.2, 1.8, 7, verdicts.PARTLY),            # all short of the claim, clear of neutral
    (1.5, 0.9, 1.8, 7, verdicts.NOT_REPRODUCED),    # all short of the claim, reaching neutral
    (0.8, 0.7, 0.9, 7, verdicts.NOT_REPRODUCED),    # all below neutral
    (2.5, 1.5, 3.0, 7, verdicts.REPRODUCED),        # reaches the claim, clear of neutral, value reaches it
    (1.8, 1.5, 2.2, 7, verdicts.PARTLY),            # reaches the claim, clear of neutral, value short of it
    (2.5, 0.8, 3.0, 7, verdicts.INCONCLUSIVE),      # spans both neutral and the claim
    (1.2, 0.8, 3.0, 7, verdicts.INCONCLUSIVE),      # spans both, value short of the claim
])
def test_verdict_table_higher_is_better(value, low, high, n, expected):
    v = verdicts.judge(claim(), {P(): value}, intervals=interval(low, high, n))
    assert v.verdict == expected, v.reason
    assert (v.low, v.high, v.samples) == (low, high, n)


@pytest.mark.parametrize("value, low, high, expected", [
    (-10.0, -15.0, -5.0, verdicts.PARTLY),          # all short of -24.9%, clear of 0
    (-10.0, -15.0, 2.0, verdicts.NOT_REPRODUCED),   # short of the claim, reaching neutral
    (-30.0, -40.0, -20.0, verdicts.REPRODUCED),
    (-20.0, -30.0, -10.0, verdicts.PARTLY),
    (-30.0, -40.0, 5.0, verdicts.INCONCLUSIVE),
])
def test_verdict_table_lower_is_better(value, low, high, expected):
    c = claim(direction="lower", claimed=(-27.7, -27.7), neutral=0.0)
    assert verdicts.judge(c, {P(): value}, intervals=interval(low, high)).verdict == expected


@pytest.mark.parametrize("value, low, high, expected", [
    (1.3, 1.1, 1.5, verdicts.REPRODUCED),           # no target: clear of neutral
    (0.8, 0.7, 0.95, verdicts.NOT_REPRODUCED),      # at or below neutral
    (1.1, 0.9, 1.3, verdicts.INCONCLUSIVE),         # spans neutral
])
def test_verdict_table_without_a_target(value, low, high, expected):
    assert verdicts.judge(claim(claimed=None), {P(): value}, intervals=interval(low, high)).verdict == expected


def test_a_lower_is_better_miss_reads_above_neutral():
    lower = claim(claimed=None, direction="lower")
    v = verdicts.judge(lower, {P(): 19.0}, intervals=interval(12.8, 28.2))
    assert v.verdict == verdicts.NOT_REPRODUCED and "interval at or above neutral (1)" in v.reason


def test_a_result_without_an_interval_is_judged_by_its_point_and_marked():
    v = verdicts.judge(claim(), {P(): 2.5})
    assert v.verdict == verdicts.REPRODUCED and "no interval" in v.reason and v.low is None
    assert v.interval_text == "2.5x"
    with_interval = verdicts.judge(claim(), {P(): 2.5}, intervals=interval(1.5, 3.0))
    assert with_interval.interval_text == "2.5x [1.5, 3]"


@pytest.mark.parametrize("unit, text", [("x the default build", "2.5x the default build"), ("%", "2.5%"),
                                        ("% caught", "2.5% caught"), ("points", "2.5 points")])
def test_a_unit_of_x_or_percent_sits_against_the_number(unit, text):
    assert verdicts.judge(claim(unit=unit), {P(): 2.5}).interval_text == text


def test_a_folded_claim_takes_the_deciding_combinations_interval():
    measured = {P(d="a"): 3.0, P(d="b"): 1.2}
    found = {P(d="a"): {"low": 2.5, "high": 3.5, "n": 7, "min_n": 6}, P(d="b"): {"low": 0.5, "high": 2.0, "n": 7,
                                                                               "min_n": 6}}
    v = verdicts.judge(claim(), measured, intervals=found)
    assert (v.measured, v.low, v.high, v.verdict) == (3.0, 2.5, 3.5, verdicts.REPRODUCED)
    assert [(d["low"], d["high"]) for d in v.detail] == [(2.5, 3.5), (0.5, 2.0)]


def test_a_mean_over_combinations_takes_the_mean_of_their_bounds_and_none_where_one_lacks_an_interval():
    measured = {P(d="a"): 3.0, P(d="b"): 2.0, P(d="c"): 0.5}
    found = {P(d="a"): {"low": 2.5, "high": 3.5, "n": 7, "min_n": 6}, P(d="b"): {"low": 2.0, "high": 2.0, "n": 1,
                                                                               "min_n": 1}}
    gate = {P(d="a"): 0.0, P(d="b"): 0.0, P(d="c"): -5.0}  # c fails the gate: out of the mean and its bounds
    c = claim(aggregate="mean", gate=Gate(benchmark="s.C.track_gate", min=-1.0))
    v = verdicts.judge(c, measured, gate_values=gate, intervals=found)
    assert (v.measured, v.low, v.high, v.samples, v.verdict) == (2.5, 2.25, 2.75, 7, verdicts.REPRODUCED)  # b is exact
    few = {**found, P(d="a"): {**found[P(d="a")], "n": 5}}
    assert verdicts.judge(c, measured, gate_values=gate, intervals=few).verdict == verdicts.INCONCLUSIVE
    lacking = verdicts.judge(c, measured, gate_values=gate, intervals={P(d="a"): found[P(d="a")]})
    assert lacking.low is None and "no interval" in lacking.reason
    even = verdicts.judge(claim(aggregate="median"), {P(d="a"): 3.0, P(d="b"): 2.0}, intervals=found)
    assert (even.measured, even.low, even.high) == (2.5, 2.25, 2.75)  # no one row decides a median of two


def test_a_rounding_error_short_of_the_claim_reaches_it():
    from claimbench import verdicts
    from claimbench.registry import Claim
    claim = Claim("p", "c", "m", "% caught", "higher", "all", "", "none", claimed=(100.0, 100.0), neutral=0.0,
                  tolerance=0.0)
    assert verdicts.classify(claim, 100.0, 81.6, 100.0 - 1e-13)[0] == verdicts.REPRODUCED
    assert verdicts.classify(claim, 100.0, 81.6, 99.9)[0] != verdicts.REPRODUCED


def machine_verdict(machine, verdict, value=None, low=None, high=None, commit="a" * 40, mode="full", inputs="d"):
    return verdicts.Verdict(claim(), machine, verdict, measured=value, low=low, high=high, commit_hash=commit,
                            mode=mode, inputs=inputs, inputs_status=verdicts.CURRENT)


def test_across_machines_says_they_agree_or_what_sets_them_apart(monkeypatch):
    epyc = machine_verdict("epyc", verdicts.REPRODUCED, 2.5, 2.1, 2.9)
    assert verdicts.across_machines([epyc, verdicts.Verdict(claim(), "gpu", verdicts.NOT_TESTABLE)]) == ""
    assert verdicts.across_machines([epyc, machine_verdict("xeon", verdicts.REPRODUCED, 3.0, 2.6, 3.3)]) == \
        "the 2 machines agree: reproduced"
    older = machine_verdict("xeon", verdicts.REPRODUCED, 3.0, mode="unrecorded", inputs="")
    older.inputs_status = verdicts.INPUTS_UNRECORDED
    assert verdicts.across_machines([epyc, older]) == (
        "the 2 machines agree: reproduced (from runs on different modes or "
        "inputs: epyc: full, current inputs; xeon: unrecorded, inputs not recorded)")
    near = verdicts.across_machines([epyc, machine_verdict("xeon", verdicts.PARTLY, 1.9, 1.5, 2.2)])
    assert near.startswith("epyc reproduced, xeon partly: their intervals overlap")
    apart = verdicts.across_machines([epyc, machine_verdict("xeon", verdicts.PARTLY, 1.5, 1.3, 1.7)])
    assert "do not overlap (2.5x [2.1, 2.9] vs 1.5x [1.3, 1.7]): not noise; the machines measure differently" in apart
    elsewhere = verdicts.across_machines([epyc, machine_verdict("xeon", verdicts.PARTLY, 1.5, 1.3, 1.7, commit="b" * 40,
                                                                mode="quick", inputs="e")])
    assert "different run modes (full, quick), different inputs" in elsewhere
    assert "measured at different commits between aaaaaaaa and bbbbbbbb" in elsewhere  # not in this clone
    assert "the machines or that code differ" in elsewhere
    monkeypatch.setattr(verdicts.codepath, "unchanged", lambda *args: False)
    failed = verdicts.across_machines([epyc, machine_verdict("xeon", verdicts.GATE_FAILED, commit="b" * 40)])
    assert failed == ("epyc reproduced, xeon gate failed: the code it runs differs between aaaaaaaa and "
                      "bbbbbbbb, no interval on xeon (gate failed)")
    epyc.commit_date, older_xeon = 2, machine_verdict("xeon", verdicts.PARTLY, 1.5, 1.3, 1.7, commit="b" * 40)
    older_xeon.commit_date = 1
    assert verdicts.across_machines([epyc, older_xeon]).endswith(
        "the machines or that code differ, `claimbench run --stale --machine xeon` runs the newer code there")


def test_the_terminal_table_clips_the_long_texts_and_keeps_the_interval():
    from claimbench import report
    long = claim(claimed_text="a claim whose text runs on well past what a terminal column can hold")
    found = verdicts.Verdict(long, "epyc", verdicts.PARTLY, measured=2.5, low=2.1, high=2.9, reason="why " * 40,
                             mode="full", inputs="d", inputs_status=verdicts.CURRENT)
    row = report.claims_table([found]).splitlines()[2]
    assert "a claim whose text runs on well past what a…" in row and "2.5x [2.1, 2.9]" in row
    assert row.endswith("…")  # the why, clipped
