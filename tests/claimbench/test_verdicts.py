import json

import pytest

from claimbench import verdicts as V
from claimbench.registry import Claim, Gate


def claim(**kw):
    base = dict(paper_id="p", id="c", metric="m", unit="x", direction="higher", claimed_text="2-4x",
                conditions="", baseline="b", claimed=(2.0, 4.0), benchmark="s.C.track_speedup", neutral=1.0)
    return Claim(**{**base, **kw})


def P(**params):
    return json.dumps(params, sort_keys=True)


def test_reproduced_partly_not_reproduced():
    assert V.judge(claim(), {P(d="a"): 2.5}).verdict == V.REPRODUCED
    assert V.judge(claim(), {P(d="a"): 1.92}).verdict == V.REPRODUCED  # within 10% of the claimed gain (1.0)
    assert V.judge(claim(), {P(d="a"): 1.85}).verdict == V.PARTLY
    assert V.judge(claim(claimed=(1.14, 1.63)), {P(): 1.04}).verdict == V.PARTLY
    assert V.judge(claim(), {P(d="a"): 1.5}).verdict == V.PARTLY
    assert V.judge(claim(), {P(d="a"): 0.9}).verdict == V.NOT_REPRODUCED


def test_fold_over_parameters_uses_the_claims_aggregate():
    measured = {P(d="a"): 0.5, P(d="b"): 3.0}
    assert V.judge(claim(), measured).measured == 3.0
    assert V.judge(claim(aggregate="min"), measured).verdict == V.NOT_REPRODUCED
    assert V.judge(claim(aggregate="min"), measured).reason.endswith("; 1 of 2 reach it")


def test_explaining_benchmarks_sit_beside_every_combination_and_in_the_reason():
    c = claim(explain=("s.C.track_pruned_fraction", "s.C.track_ceiling"))
    explain = {"s.C.track_pruned_fraction": {P(d="a"): 0.65, P(d="b"): 0.98}, "s.C.track_ceiling": {P(d="b"): 20.0}}
    v = V.judge(c, {P(d="a"): 0.5, P(d="b"): 3.0}, explain_values=explain)
    assert v.reason.endswith("; at d=b: pruned fraction 0.98, ceiling 20")
    assert [e["explain"] for e in v.detail] == [{"pruned fraction": 0.65, "ceiling": None},
                                                {"pruned fraction": 0.98, "ceiling": 20.0}]
    assert "explain" not in V.judge(claim(), {P(d="a"): 0.5}).detail[0]


def test_lower_is_better_claims():
    c = claim(direction="lower", claimed=(-27.7, -27.7), neutral=0.0, unit="%")
    assert V.judge(c, {P(): -30.0}).verdict == V.REPRODUCED
    assert V.judge(c, {P(): -10.0}).verdict == V.PARTLY
    assert V.judge(c, {P(): 5.0}).verdict == V.NOT_REPRODUCED


def test_direction_only_claim():
    c = claim(claimed=None)
    assert V.judge(c, {P(): 1.2}).verdict == V.REPRODUCED
    assert V.judge(c, {P(): 0.8}).verdict == V.NOT_REPRODUCED


def test_gate_failed_partly_and_passed():
    c = claim(gate=Gate("s.C.track_identical", min=1.0))
    measured = {P(d="a"): 5.0, P(d="b"): 3.0}
    failed = V.judge(c, measured, {P(d="a"): 0.98, P(d="b"): 0.5})
    assert failed.verdict == V.GATE_FAILED and failed.gate == "failed" and failed.measured is None
    partly = V.judge(c, measured, {P(d="a"): 0.98, P(d="b"): 1.0})
    assert partly.gate == "partly" and partly.measured == 3.0 and partly.verdict == V.REPRODUCED
    assert "excluded" in partly.reason
    assert V.judge(c, measured, {P(d="a"): 1.0, P(d="b"): 1.0}).gate == "passed"
    assert V.judge(c, measured, None).verdict == V.GATE_FAILED  # an unmeasured gate never passes
    crashed = V.judge(c, {P(d="a"): None}, {P(d="a"): None})  # neither ran: no gate was judged
    assert crashed.verdict == V.NOT_MEASURED and crashed.gate == "not measured" and "failed" in crashed.reason


def test_not_testable_and_not_measured():
    assert V.judge(claim(requires=("gpu",)), None).verdict == V.NOT_TESTABLE
    assert "GPU" in V.judge(claim(requires=("gpu",)), None).reason
    assert V.judge(claim(requires=("gpu",)), None, caps={"gpu"}).verdict == V.NOT_MEASURED
    assert V.judge(claim(not_testable="needs AIME"), None).reason == "needs AIME"
    assert V.judge(claim(benchmark=None), None).reason == "no benchmark yet"
    failed = V.judge(claim(), {P(): None})
    assert failed.verdict == V.NOT_MEASURED and "failed" in failed.reason


@pytest.mark.parametrize("verdict", V.VERDICTS)
def test_every_verdict_has_a_badge(verdict):
    from claimbench.report import BADGE
    assert verdict in BADGE
