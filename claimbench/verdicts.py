"""Verdicts: each claim of papers.toml against what each machine measured, with its interval.

The measured value comes with a 95% interval [lo, hi] from the samples it came from
(claimbench.intervals: rounds of an interleaved timing, items of an accuracy test). "The claim"
is its weaker end, less `tolerance` of the claimed gain over `neutral` (10%: a claimed 1.14x
needs 1.126x, -27.7% needs -24.9%). Read "above" as "better" (mirrored for lower-is-better):

| the interval                                         | value                | verdict         |
|------------------------------------------------------|----------------------|-----------------|
| fewer samples than its method needs (min_n)          | any                  | inconclusive    |
| all of it short of the claim, lo above neutral       | any                  | partly          |
| all of it short of the claim, lo at or below neutral | any                  | not reproduced  |
| reaches the claim, lo above neutral                  | reaches the claim    | reproduced      |
| reaches the claim, lo above neutral                  | short of the claim   | partly          |
| reaches the claim and neutral (spans both)           | any                  | inconclusive    |
| claim without a target: lo above neutral             | any                  | reproduced      |
| claim without a target: hi at or below neutral       | any                  | not reproduced  |
| claim without a target: spans neutral                | any                  | inconclusive    |
| none recorded (older results)                        | reaches the claim    | reproduced      |
| none recorded                                        | past neutral only    | partly          |
| none recorded                                        | neither              | not reproduced  |
| a quick run of a claim with `quick_cannot_decide`    | any                  | inconclusive    |
| apart from the run before's on the same code, whose  | any                  | inconclusive    |
| verdict (by the rows above) differs                  |                      |                 |
(a verdict without an interval says "no interval"; the second-last row: the quick mode runs the
claim's code on budgets too small to test it, e.g. 3 QAT steps where the claim is about 60, and says
so. The last: an interval holds one run's samples, and a shared VM can move between runs more than
within one (uGDS's sync-write latency, Lychee on a memory-bandwidth state), so a machine's latest
verdict is checked against its run before in the same mode and inputs where nothing the claim's
code path runs changed between them (claimbench.codepath): intervals apart with the same verdict add a
note, intervals apart with another verdict make it inconclusive, both runs named.)

A claim folded over parameter combinations (max or min over datasets) takes the interval of the
deciding combination; a mean, or a median that no one combination decides (of an even count),
takes the same fold of their bounds (conservative: exact when the combinations' errors move
together); each combination's own is in the detail. Other outcomes:
gate failed     the method did not pass its quality gate, so its ratio does not count
not testable    the machine lacks what the claim needs (a GPU, TensorRT), or nothing offline can
                measure it (the reason says which)
not measured    no benchmark yet, or no result from this machine

Results are grouped by run mode (full, quick, or unrecorded for older files) and by the digest of
the inputs their suite read: a history, a flip or a comparison never mixes two groups. A machine's
latest verdict comes from its full-mode results where it has them (then unrecorded, then quick),
and says whether its inputs are the checkout's own. Where machines' verdicts on a claim differ,
`across_machines` says what sets them apart: mode, inputs, code, or intervals apart or overlapping, and
`stale` what a machine must run again for its verdicts to be current (`claimbench run --stale`).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field

from . import codepath, inputs
from .environment import DEVICE_SUITE, capabilities, unmet
from .intervals import bracketed
from .registry import REPO_ROOT, Claim, Registry

REPRODUCED = "reproduced"
PARTLY = "partly"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
GATE_FAILED = "gate failed"
NOT_TESTABLE = "not testable here"
NOT_MEASURED = "not measured yet"
VERDICTS = (REPRODUCED, PARTLY, NOT_REPRODUCED, INCONCLUSIVE, GATE_FAILED, NOT_TESTABLE, NOT_MEASURED)
MODE_PREFERENCE = ("full", inputs.UNRECORDED, "quick")
CURRENT, OTHER_INPUTS, INPUTS_UNRECORDED = "current inputs", "other inputs", "inputs not recorded"

STALE_TEXT = ("Papers whose latest full result on a machine is missing, from quick runs only, on other inputs than "
              "this checkout's, without the interval another machine's has, or from older code than another "
              "machine's whose verdict differs: `claimbench run --stale --machine NAME` on that machine runs them "
              "(with `--budget MINUTES`, those that fit, longest first; with `--publish`, filed as that "
              "machine's reference results). "
              "A machine measured only by `claimbench device-run` (a lent GPU machine, without asv) is judged on "
              "the GPU suite's claims alone: device-run measures those.")
DEVICE_RUN_ONLY_TEXT = ("; this machine's results come from `claimbench device-run`, which runs the GPU suite only: "
                        "`claimbench run` on a GPU machine with asv measures this claim")
_FOLD = {"max": max, "min": min, "median": statistics.median, "mean": statistics.fmean}


@dataclass
class Verdict:
    claim: Claim
    machine: str | None
    verdict: str
    measured: float | None = None
    gate: str = "none"  # none / passed / partly / failed
    reason: str = ""
    commit_hash: str | None = None
    commit_date: object = None
    detail: list[dict] = field(default_factory=list)  # one entry per parameter combination
    low: float | None = None  # the deciding combination's 95% interval
    high: float | None = None
    samples: int | None = None  # how many samples the interval rests on
    mode: str | None = None  # full / quick / unrecorded
    inputs: str | None = None  # fingerprint of the suite's input digests (claimbench.inputs.key)
    inputs_status: str | None = None  # current inputs / other inputs / inputs not recorded

    @property
    def interval_text(self) -> str:
        """'7.6x [6.5, 8.4]', '21% [17, 26]', '0.2 points [-1, 1]', or the value alone where no interval was
        recorded."""
        if self.measured is None:
            return ""
        return bracketed(self.measured, self.low, self.high, digits=3, unit=unit_suffix(self.claim.unit))


def unit_suffix(unit: str) -> str:
    """A unit that starts with x or % sits against the number ('7.6x', '21%'), any other after a space."""
    return unit if unit.startswith(("x", "%")) else f" {unit}"


def reach(claim: Claim) -> float | None:
    """What a value must reach to count as the claim: its weaker end less `tolerance` of the gain."""
    if claim.target is None:
        return None
    sign = 1.0 if claim.direction == "higher" else -1.0
    return claim.target - sign * claim.tolerance * abs(claim.target - claim.neutral)


def reaches(claim: Claim, value: float) -> bool:
    """At or past `reach`; a float rounding error short of it (1e-9 relative) counts as at it."""
    target = reach(claim)
    return (1.0 if claim.direction == "higher" else -1.0) * (value - target) >= -1e-9 * max(1.0, abs(target))


def classify(claim: Claim, value: float, low: float | None, high: float | None, enough: bool = True) -> tuple[str, str]:
    """(verdict, why) by the table in the module docstring."""
    sign = 1.0 if claim.direction == "higher" else -1.0
    def past_neutral(v):
        return sign * (v - claim.neutral) > 0
    target = claim.target
    def reaches_claim(v):
        return reaches(claim, v)
    if low is None or high is None:
        if target is None:
            return (REPRODUCED if past_neutral(value) else NOT_REPRODUCED), "no interval"
        return (REPRODUCED if reaches_claim(value) else PARTLY if past_neutral(value) else NOT_REPRODUCED), "no interval"
    if not enough:
        return INCONCLUSIVE, "too few samples for a 95% interval"
    worst, best = (low, high) if sign > 0 else (high, low)
    if target is None:
        if past_neutral(worst):
            return REPRODUCED, "interval clear of neutral"
        if not past_neutral(best):
            return NOT_REPRODUCED, f"interval at or {'below' if sign > 0 else 'above'} neutral"
        return INCONCLUSIVE, "interval spans neutral"
    if not reaches_claim(best):
        return (PARTLY, "interval short of the claim, clear of neutral") if past_neutral(worst) else (
            NOT_REPRODUCED, "interval short of the claim")
    if past_neutral(worst):
        return (REPRODUCED, "interval clear of neutral") if reaches_claim(value) else (
            PARTLY, "value short of the claim, interval clear of neutral")
    return INCONCLUSIVE, "interval spans both neutral and the claim"


def judge(claim: Claim, measured: dict[str, float | None] | None, gate_values: dict[str, float | None] | None = None,
          caps: set[str] | frozenset = frozenset(), machine: str | None = None,
          explain_values: dict[str, dict[str, float | None]] | None = None,
          intervals: dict[str, dict] | None = None,
          explain_intervals: dict[str, dict[str, dict]] | None = None,
          gate_intervals: dict[str, dict] | None = None) -> Verdict:
    """The verdict for one claim on one machine, commit and mode.

    measured: params (JSON text) -> value (None = the benchmark failed for that combination),
    or None when the machine has no result for the claim's benchmark.
    gate_values: the gate benchmark's values by the same params.
    explain_values: per benchmark of claim.explain, its values by the same params: shown beside
    every combination, and those of the combination that decides the verdict in its reason.
    intervals: params -> {"low", "high", "n", "min_n", "method"} where one was recorded;
    explain_intervals: the same per benchmark of claim.explain, shown beside its values.
    gate_intervals: the gate benchmark's intervals by the same params, where recorded: a gate passes or fails on
    its value, and the reason says where its interval has the bound strictly inside (the data cannot tell).
    """
    # results from a machine without what the claim needs (a CPU dry run of the GPU rows) do not measure it
    if why := unmet(claim.requires, caps):
        stand_in = measured and any(value is not None for value in measured.values())
        return Verdict(claim, machine, NOT_TESTABLE, reason=why + ("; the rows here come from a stand-in run"
                                                                   if stand_in else ""))
    if not measured:
        if claim.not_testable:
            return Verdict(claim, machine, NOT_TESTABLE, reason=claim.not_testable)
        reason = "no benchmark yet" if not claim.benchmark else f"not measured on {machine or 'any machine'}"
        return Verdict(claim, machine, NOT_MEASURED, reason=reason)

    detail, passing = [], []
    for params, value in sorted(measured.items()):
        entry = {"params": json.loads(params), "value": value, **_interval_fields((intervals or {}).get(params))}
        if claim.explain:
            entry["explain"] = {explain_label(b): (explain_values or {}).get(b, {}).get(params) for b in claim.explain}
            explain_bounds = {explain_label(b): [found["low"], found["high"]] for b in claim.explain
                              if (found := (explain_intervals or {}).get(b, {}).get(params))
                              and found.get("low") is not None}
            if explain_bounds:
                entry["explain_interval"] = explain_bounds
        if claim.gate is not None:
            gv = (gate_values or {}).get(params)
            entry["gate_value"] = gv
            entry["gate_passed"] = claim.gate.passes(gv)
            if (found := (gate_intervals or {}).get(params)) and found.get("low") is not None:
                entry["gate_interval"] = [found["low"], found["high"]]
            if not entry["gate_passed"]:
                detail.append(entry)
                continue
        if value is not None:
            passing.append(entry)
        detail.append(entry)

    if not any(e["value"] is not None or e.get("gate_value") is not None for e in detail):
        return Verdict(claim, machine, NOT_MEASURED, gate="not measured" if claim.gate else "none", detail=detail,
                       reason="the benchmark failed on this machine (see the asv log)")
    gate = "none"
    if claim.gate is not None:
        passed = sum(e["gate_passed"] for e in detail)
        gate = "passed" if passed == len(detail) else "failed" if passed == 0 else "partly"
        if passed == 0:
            reason = f"gate {claim.gate.describe()} failed on every combination{_closest(claim.gate, detail)}"
            return Verdict(claim, machine, GATE_FAILED, gate=gate, detail=detail, reason=reason)
    if not passing:
        return Verdict(claim, machine, NOT_MEASURED, gate=gate, detail=detail,
                       reason="the benchmark failed on this machine (see the asv log)")

    value = _FOLD[claim.fold]([e["value"] for e in passing])
    deciding = {} if claim.fold == "mean" else next((e for e in passing if e["value"] == value), {})
    bounds = deciding or _folded_interval(claim.fold, passing)
    low, high = bounds.get("low"), bounds.get("high")
    enough = bounds.get("n") is None or bounds["n"] >= (bounds.get("min_n") or 1)
    verdict, why = classify(claim, value, low, high, enough)
    shown = bracketed(value, low, high, unit=unit_suffix(claim.unit))
    if claim.target is None:
        reason = f"{shown}, {why} ({claim.neutral:g})"
    else:
        reason = f"{claim.fold} over {len(passing)} combination(s) = {shown} vs claimed {claim.claimed_text}"
        if len(passing) > 1:
            reason += f"; {sum(reaches(claim, e['value']) for e in passing)} of {len(passing)} reach it"
        reason += f"; {why}"
        if not enough:
            reason += f" ({bounds['n']} samples, {bounds['min_n']} needed)"
    reason += _explained(claim, deciding)
    if gate == "partly":
        reason += f"; {sum(not e['gate_passed'] for e in detail)} combination(s) failed the gate and were excluded"
    if claim.gate is not None:
        reason += _gate_unsure(claim.gate, passing)
    return Verdict(claim, machine, verdict, value, gate, reason, detail=detail, low=low, high=high,
                   samples=bounds.get("n"))


def params_text(params: dict) -> str:
    """'dataset=glove, target_recall=0.999'; empty without parameters."""
    return ", ".join(f"{k}={x}" for k, x in params.items())


def _at(params: dict) -> str:
    return f" at {params_text(params)}" if params else ""


def _closest(gate, detail: list[dict]) -> str:
    """'; the closest read 1.43 [0.8, 2.1] at method=race, retention=75': how far the gate is from passing, at
    the combination nearest its bound, with its interval where recorded, and where that interval has the bound
    strictly inside, that the data cannot tell the gate failed there (it fails on its value, as it passes)."""
    def shortfall(value: float) -> float:
        return max(gate.min - value if gate.min is not None else 0.0, value - gate.max if gate.max is not None else 0.0)
    read = [e for e in detail if e.get("gate_value") is not None and e["gate_value"] == e["gate_value"]]
    if not read:
        return "; no combination has a gate value"
    nearest = min(read, key=lambda e: shortfall(e["gate_value"]))
    unsure = "gate_interval" in nearest and _straddles(gate, *nearest["gate_interval"])
    return (f"; the closest read {bracketed(nearest['gate_value'], *nearest.get('gate_interval', ()), digits=3)}"
            f"{_at(nearest['params'])}" + ("; its interval spans the bound: the data cannot tell" if unsure else ""))


def _straddles(gate, low: float, high: float) -> bool:
    """A bound of the gate strictly inside [low, high]."""
    return any(bound is not None and low < bound < high for bound in (gate.min, gate.max))


def _gate_unsure(gate, passing: list[dict]) -> str:
    """'; the gate passed on its value, but its interval spans the bound on 3 of 3 combination(s), e.g.
    1.25 [0.6, 3] at provider=anthropic': the passing combinations whose gate interval has the bound strictly
    inside (the data cannot tell that the gate passed there). An exactness gate (every query identical: a rate
    of 1 [0.996, 1] against >= 1) has its bound at the interval's end, so it says nothing there."""
    unsure = [e for e in passing if "gate_interval" in e and _straddles(gate, *e["gate_interval"])]
    if not unsure:
        return ""
    first = unsure[0]
    return (f"; the gate passed on its value, but its interval spans the bound on {len(unsure)} of {len(passing)} "
            f"combination(s), e.g. {bracketed(first['gate_value'], *first['gate_interval'], digits=3)}"
            f"{_at(first['params'])}")


def _folded_interval(fold: str, passing: list[dict]) -> dict:
    """A mean, or a median that no one combination decides: the same fold of their bounds, the fold's
    own interval where the combinations' errors move together (rows from the same samples), in practice
    wider where they do not; none unless every combination has one. It rests on the fewest samples
    among those whose interval has a width (an exact row, e.g. a deterministic replay of a fixed trace,
    adds none)."""
    if not passing or any(e.get("low") is None for e in passing):
        return {}
    sampled = [e for e in passing if e["high"] > e["low"]] or passing
    worst = min(sampled, key=lambda e: (e.get("n") or 0) - (e.get("min_n") or 1))
    return {"low": _FOLD[fold]([e["low"] for e in passing]), "high": _FOLD[fold]([e["high"] for e in passing]),
            "n": worst["n"], "min_n": worst.get("min_n")}


def _interval_fields(found: dict | None) -> dict:
    if not found or found.get("low") is None:
        return {}
    return {k: found.get(k) for k in ("low", "high", "n", "min_n", "method")}


def explain_label(benchmark: str) -> str:
    """'lychee.ClaimSpeedup.track_pruned_fraction' -> 'pruned fraction'."""
    return benchmark.rsplit(".", 1)[-1].removeprefix("track_").replace("_", " ")


def explained(entry: dict, label: str, digits: int = 3) -> str | None:
    """One explaining benchmark's value in a detail entry, with its interval where recorded."""
    value = entry.get("explain", {}).get(label)
    if value is None:
        return None
    return bracketed(value, *entry.get("explain_interval", {}).get(label, ()), digits=digits)


def _explained(claim: Claim, deciding: dict) -> str:
    """'; at dataset=glove: pruned fraction 0.65, ...' for the combination whose value decided
    ('; pruned fraction 0.65' for a benchmark without parameters)."""
    if not deciding.get("explain"):
        return ""
    where = params_text(deciding["params"])
    values = ", ".join(f"{k} {shown}" for k in deciding["explain"] if (shown := explained(deciding, k)) is not None)
    if not values:
        return ""
    return f"; at {where}: {values}" if where else f"; {values}"


def _series(con, benchmark: str) -> dict[tuple[str, str, str, str], dict]:
    """(machine, commit, mode, inputs fingerprint) -> {'date', 'values': {params: value},
    'intervals': {params: {...}}} for one benchmark, oldest commit first."""
    suite = inputs.suite_of(benchmark)
    rows = con.execute(
        """SELECT r.machine, r.commit_hash, r.commit_date, r.mode, r.inputs, x.params, x.value, x.low, x.high,
                  x.interval
           FROM results x JOIN runs r USING (run_id) WHERE x.benchmark = ? AND x.status != 'skipped'
           ORDER BY r.commit_date NULLS FIRST, r.ingested_at""", [benchmark]).fetchall()
    out: dict[tuple[str, str, str, str], dict] = {}
    for machine, commit, date, mode, recorded, params, value, low, high, interval in rows:
        key = (machine, commit, mode or inputs.UNRECORDED, inputs.key(json.loads(recorded or "{}").get(suite)))
        entry = out.setdefault(key, {"date": date, "values": {}, "intervals": {}})
        entry["values"][params] = value
        if low is not None:
            entry["intervals"][params] = {"low": low, "high": high, **json.loads(interval or "{}")}
    return out


def _skipped(con, benchmark: str) -> dict[str, str]:
    """machine -> the mode of its newest run that asv skipped benchmark in (SkipNotImplemented: a quick mode
    that leaves it out, a grid without that combination)."""
    rows = con.execute(
        """SELECT r.machine, r.mode FROM results x JOIN runs r USING (run_id)
           WHERE x.benchmark = ? AND x.status = 'skipped' ORDER BY r.commit_date NULLS FIRST, r.ingested_at""",
        [benchmark]).fetchall()
    return {machine: mode or inputs.UNRECORDED for machine, mode in rows}


def _skipped_text(claim: Claim, mode: str) -> str:
    hint = f"; `claimbench run --paper {claim.paper_id}` (full mode) measures it" if mode == "quick" else ""
    return f": its {mode} run skipped {claim.benchmark}{hint}"


def machines(con) -> dict[str, set[str]]:
    """machine -> its capabilities, from its environment record (the machines table's info holds it whole)."""
    rows = con.execute("SELECT machine, gpu_count, libraries, info FROM machines ORDER BY machine").fetchall()
    return {m: capabilities({**json.loads(info or "{}"), "gpu_count": g, "libraries": json.loads(libs or "{}")})
            for m, g, libs, info in rows}


def inputs_status(suite: str, fingerprint: str, current: dict[str, str]) -> str:
    if fingerprint == inputs.UNRECORDED:
        return INPUTS_UNRECORDED
    return CURRENT if current.get(suite) == fingerprint else OTHER_INPUTS


def current_inputs() -> dict[str, str]:
    """suite -> fingerprint of the inputs this checkout's suites read (what a run here would record)."""
    return {suite: inputs.key(d) for suite, d in inputs.recorded(REPO_ROOT / "suites").items()}


def across_machines(verdicts: list[Verdict]) -> str:
    """One claim's latest verdicts on several machines: that they agree, or what sets each machine whose
    verdict differs from the first one's apart: run mode, inputs, code on the suite's code path changed
    between their commits (claimbench.codepath), and whether their intervals overlap (within each
    other's noise) or not (the machines measure differently). '' with fewer than two measured."""
    measured = [v for v in verdicts if v.machine and v.verdict not in (NOT_TESTABLE, NOT_MEASURED)]
    if len(measured) < 2:
        return ""
    first = measured[0]
    if all(v.verdict == first.verdict for v in measured):
        runs = [f"{v.machine}: {v.mode}, {v.inputs_status}" for v in measured]
        apart = any((v.mode, v.inputs, v.inputs_status) != (first.mode, first.inputs, first.inputs_status)
                    for v in measured)
        return f"the {len(measured)} machines agree: {first.verdict}" + (
            f" (from runs on different modes or inputs: {'; '.join(runs)})" if apart else "")
    return "; ".join(f"{first.machine} {first.verdict}, {other.machine} {other.verdict}: "
                     + ", ".join(_differences(first, other)) for other in measured[1:] if other.verdict != first.verdict)


def stale(latest: list[Verdict], machine: str) -> dict[str, list[str]]:
    """paper id -> why its suite needs a full run on `machine` before that machine's verdicts count as
    current (what `claimbench run --stale` runs): a claim it could measure without a result, or whose
    latest is a quick run, or a full run on other inputs or on inputs not recorded, or a value without
    the interval another machine's result of the claim has (its suite recorded none yet), or a verdict
    that differs from another machine's measured later with code on the suite's code path changed in
    between (claimbench.codepath: the two did not run the same code). Claims the machine cannot test,
    or without a benchmark, never do; nor, on a machine whose only results are the GPU suite's (what
    `claimbench device-run` measures on a lent machine without asv), claims of other suites."""
    mine = [v for v in latest if v.machine == machine and v.claim.benchmark]
    device_only = measured_by_device_run_alone(latest, machine)
    out: dict[str, list[str]] = {}
    for v in mine:
        if v.verdict == NOT_TESTABLE or (device_only and inputs.suite_of(v.claim.benchmark) != DEVICE_SUITE):
            continue
        why = _why_stale(v, latest)
        if why and why not in out.setdefault(v.claim.paper_id, []):
            out[v.claim.paper_id].append(why)
    return out


def measured_by_device_run_alone(latest: list[Verdict], machine: str) -> bool:
    """True where the machine's only results are the GPU suite's: what `claimbench device-run` measures on a
    lent GPU machine, which has no asv to run the other suites."""
    return {inputs.suite_of(v.claim.benchmark) for v in latest
            if v.machine == machine and v.claim.benchmark and v.mode is not None} == {DEVICE_SUITE}


def stale_by_reason(latest: list[Verdict]) -> list[tuple[str, str, list[str]]]:
    """(machine, why, papers) for every machine with stale papers (`stale`), one row per reason."""
    rows: dict[tuple[str, str], list[str]] = {}
    for machine in dict.fromkeys(v.machine for v in latest if v.machine):
        for paper, reasons in stale(latest, machine).items():
            for why in reasons:
                rows.setdefault((machine, why), []).append(paper)
    return [(machine, why, papers) for (machine, why), papers in rows.items()]


def _why_stale(v: Verdict, latest: list[Verdict]) -> str | None:
    """The first reason of `stale`'s that v's machine needs a full run for v's claim, or None."""
    if v.mode is None:
        return "not measured"
    if v.mode == "quick":
        return "quick runs only"
    if v.inputs_status != CURRENT:
        return v.inputs_status
    if v.measured is not None and v.low is None and any(o.claim.key == v.claim.key and o.low is not None
                                                        for o in latest):
        return "no interval"
    return _newer_code_differs(v, latest)


def _newer_code_differs(v: Verdict, latest: list[Verdict]) -> str | None:
    """'older code than M's, whose verdict differs' where machine M measured the claim at a later commit
    with a different verdict and changed code on the suite's code path; else None."""
    for other in latest:
        if (other.claim.key == v.claim.key and other.machine != v.machine and other.verdict != v.verdict
                and other.verdict not in (NOT_TESTABLE, NOT_MEASURED) and other.commit_date is not None
                and v.commit_date is not None and other.commit_date > v.commit_date
                and _same_code(v, other) is False):
            return f"older code than {other.machine}'s, whose verdict differs"
    return None


def _same_code(a: Verdict, b: Verdict) -> bool | None:
    """True where two verdicts of a claim ran the same code from its suite's code path (one commit, or no
    change between theirs), False where one changed; None where git cannot tell (claimbench.codepath)."""
    return a.commit_hash == b.commit_hash or codepath.unchanged(
        inputs.suite_of(a.claim.benchmark or ""), a.commit_hash or "", b.commit_hash or "")


def _what_changed(a: Verdict, b: Verdict, shown: int = 3) -> str:
    """' (suites/x.py, impl/x.py: Method and 2 more)': what codepath.changes finds between the two verdicts'
    commits, the first few of it; '' where it finds nothing to name."""
    found = codepath.changes(inputs.suite_of(a.claim.benchmark or ""), a.commit_hash or "", b.commit_hash or "")
    if not found:
        return ""
    more = f" and {len(found) - shown} more" if len(found) > shown else ""
    return f" ({', '.join(found[:shown])}{more})"


def _apart(a: Verdict, b: Verdict) -> bool:
    """Whether two verdicts' intervals are both recorded and have no value in common."""
    return a.low is not None and b.low is not None and (a.high < b.low or b.high < a.low)


def _against_run_before(v: Verdict, mine: list[Verdict]) -> None:
    """The table's last row: v against the machine's previous run of its claim in v's mode and inputs, where
    both have intervals, the intervals lie apart and nothing the code path runs changed between them."""
    decided = (REPRODUCED, PARTLY, NOT_REPRODUCED)
    earlier = [o for o in mine if o.mode == v.mode and o.inputs == v.inputs and o.commit_date is not None
               and v.commit_date is not None and o.commit_date < v.commit_date]
    before = max(earlier, key=lambda o: o.commit_date, default=None)
    if (before is None or v.verdict not in decided or before.verdict not in decided or not _apart(before, v)
            or not _same_code(before, v)):
        return
    apart = (f"the run before on the same code ({before.commit_hash[:8]}: {before.interval_text}, {before.verdict}) "
             f"lies outside this interval: this machine's runs spread more than one run's interval shows")
    if before.verdict == v.verdict:
        v.reason += f"; {apart}"
    else:
        v.reason = f"two runs disagree: {apart}; this run alone reads {v.verdict}: {v.reason}"
        v.verdict = INCONCLUSIVE


BETWEEN_RUNS_TEXT = ("An interval holds one run's samples. Where two consecutive runs of a machine (one mode, one set "
                     "of inputs) ran the same code (nothing the claim's code path runs changed between them) and their "
                     "intervals lie apart, that machine's runs spread more than one run's interval shows: read its "
                     "verdicts with the pair furthest apart in mind. A latest verdict apart from its run before says "
                     "so, and reads inconclusive where the two verdicts differ.")


def apart_between_runs(history: list[Verdict]) -> list[tuple[str, str, int, int, str]]:
    """(claim, machine, consecutive same-code run pairs with intervals, how many of them lie apart, the pair
    furthest apart) for each claim and machine with at least one such pair apart, from every commit's verdict."""
    series: dict[tuple, list[Verdict]] = {}
    for v in sorted(history, key=lambda v: (v.commit_date is not None, v.commit_date or 0)):
        if v.low is not None and v.commit_date is not None:
            series.setdefault((v.claim.key, v.machine, v.mode, v.inputs), []).append(v)
    out = []
    for (claim_key, machine, _, _), runs in series.items():
        pairs = [(a, b) for a, b in zip(runs, runs[1:]) if _same_code(a, b)]
        apart = [(a, b) for a, b in pairs if _apart(a, b)]
        if apart:
            a, b = max(apart, key=lambda pair: max(pair[1].low - pair[0].high, pair[0].low - pair[1].high))
            out.append((claim_key, machine, len(pairs), len(apart),
                        f"{a.interval_text} at {a.commit_hash[:8]}, {b.interval_text} at {b.commit_hash[:8]}"))
    return out


def _differences(a: Verdict, b: Verdict) -> list[str]:
    out = []
    if a.mode != b.mode:
        out.append(f"different run modes ({a.mode}, {b.mode})")
    if a.inputs != b.inputs or a.inputs_status != b.inputs_status:
        out.append(f"different inputs ({a.inputs_status}, {b.inputs_status})")
    same_code = _same_code(a, b)
    if not same_code:
        out.append(f"{'the code it runs differs' if same_code is False else 'measured at different commits'} "
                   f"between {(a.commit_hash or '')[:8]} and {(b.commit_hash or '')[:8]}"
                   + (_what_changed(a, b) if same_code is False else ""))
    missing = [v for v in (a, b) if v.low is None]
    if missing:
        out += [f"no interval on {v.machine}" + (f" ({v.verdict})" if v.measured is None else "") for v in missing]
    elif not _apart(a, b):
        out.append("their intervals overlap (each within the other's noise: the verdicts part near a threshold)")
    else:
        out.append(f"their intervals do not overlap ({a.interval_text} vs {b.interval_text}): not noise; "
                   + ("the machines measure differently" if same_code else "the machines or that code differ"))
    if same_code is False and a.commit_date is not None and b.commit_date is not None:
        older = min((a, b), key=lambda v: v.commit_date)
        out.append(f"`claimbench run --stale --machine {older.machine}` runs the newer code there")
    return out


def compute(con, registry: Registry, store_history: bool = True) -> list[Verdict]:
    """Latest verdict per (claim, machine); with store_history, every commit's verdict is upserted."""
    return compute_with_history(con, registry, store_history)[0]


def compute_with_history(con, registry: Registry,
                         store_history: bool = True) -> tuple[list[Verdict], list[Verdict]]:
    """(the latest verdict per (claim, machine), every commit's verdict), the latter upserted into the
    store's verdicts table with store_history."""
    known = machines(con) if con is not None else {}
    current = current_inputs()
    latest: list[Verdict] = []
    history: list[Verdict] = []
    for claim in registry.claims:
        series = _series(con, claim.benchmark) if (con is not None and claim.benchmark) else {}
        gates = _series(con, claim.gate.benchmark) if (series and claim.gate) else {}
        explains = {b: _series(con, b) for b in claim.explain} if series else {}
        suite = inputs.suite_of(claim.benchmark) if claim.benchmark else ""
        skipped = _skipped(con, claim.benchmark) if (con is not None and claim.benchmark) else {}
        for machine, caps in (known.items() or [(None, set())]):
            runs = [(key, e) for key, e in series.items() if key[0] == machine]
            if not runs:
                unmeasured = judge(claim, None, caps=caps, machine=machine)
                if unmeasured.verdict == NOT_MEASURED and machine in skipped:
                    unmeasured.reason += _skipped_text(claim, skipped[machine])
                latest.append(unmeasured)
                continue
            mine = []
            for key, entry in runs:
                _, commit, mode, fingerprint = key
                gate_entry = gates.get(key, {}).get("values")
                explain = {b: e.get(key, {}).get("values", {}) for b, e in explains.items()}
                explain_intervals = {b: e.get(key, {}).get("intervals", {}) for b, e in explains.items()}
                v = judge(claim, entry["values"], gate_entry, caps, machine, explain, entry["intervals"],
                          explain_intervals, gates.get(key, {}).get("intervals"))
                v.commit_hash, v.commit_date, v.mode, v.inputs = commit, entry["date"], mode, fingerprint
                if mode == "quick" and claim.quick_cannot_decide and v.verdict in (REPRODUCED, PARTLY,
                                                                                   NOT_REPRODUCED):
                    v.verdict = INCONCLUSIVE
                    v.reason = f"quick mode {claim.quick_cannot_decide}: a full run decides; {v.reason}"
                v.inputs_status = inputs_status(suite, fingerprint, current)
                mine.append(v)
            history += mine
            latest.append(min(reversed(mine), key=lambda v: MODE_PREFERENCE.index(v.mode)
                              if v.mode in MODE_PREFERENCE else len(MODE_PREFERENCE)))
            _against_run_before(latest[-1], mine)
    for machine in [m for m in known if measured_by_device_run_alone(latest, m)]:
        for v in latest:
            if (v.machine == machine and v.verdict == NOT_MEASURED and v.mode is None and v.claim.benchmark
                    and inputs.suite_of(v.claim.benchmark) != DEVICE_SUITE):
                v.reason += DEVICE_RUN_ONLY_TEXT
    if store_history and history and not _read_only(con):
        _store(con, history)
    return latest, history


def _read_only(con) -> bool:
    try:
        return con.execute("SELECT current_setting('access_mode')").fetchone()[0] == "read_only"
    except Exception:  # noqa: BLE001
        return False


def _store(con, history: list[Verdict]) -> None:
    if not history:
        return
    con.executemany(
        "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, now(), ?, ?, ?, ?)",
        [[v.claim.key, v.machine, v.commit_hash, v.commit_date, v.verdict, v.measured, v.gate, v.reason,
          json.dumps(v.detail, default=str), v.mode, v.inputs, v.low, v.high] for v in history])


def sync_registry(con, registry: Registry) -> None:
    """Mirror papers.toml into the store, so the leaderboard reads one place."""
    con.execute("BEGIN")
    con.execute("DELETE FROM papers")
    con.execute("DELETE FROM claims")
    con.executemany("INSERT INTO papers VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [[p.id, p.title, p.tier, p.task, p.suite, p.method, json.dumps(p.baselines)]
                     for p in registry.papers])
    con.executemany("INSERT INTO claims VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [[c.key, c.paper_id, c.id, c.metric, c.unit, c.direction,
                      c.claimed[0] if c.claimed else None, c.claimed[1] if c.claimed else None,
                      c.claimed_text, c.conditions, c.baseline, c.benchmark,
                      c.gate.describe() if c.gate else None, json.dumps(c.requires), c.not_testable,
                      c.substitution] for c in registry.claims])
    con.execute("COMMIT")


def flips(history: list[Verdict]) -> list[dict]:
    """Claims reproduced at an earlier commit on a machine and not at its latest commit, within one
    mode and one set of inputs (a quick run or other inputs never flip a full run's verdict), from
    every commit's verdict (compute_with_history: the results as they are now, so the leaderboard,
    which stores nothing, and the CLI find the same flips)."""
    series: dict[tuple, list] = {}
    for v in sorted(history, key=lambda v: (v.commit_date is not None, v.commit_date or 0)):
        series.setdefault((v.claim.key, v.machine, v.mode, v.inputs), []).append(
            (v.commit_hash, v.commit_date, v.verdict))
    out = []
    for (claim_key, machine, mode, fingerprint), seq in series.items():
        commit, date, verdict = seq[-1]
        last_good = [c for c, _, v in seq[:-1] if v == REPRODUCED]
        if verdict != REPRODUCED and last_good:
            out.append(dict(claim_key=claim_key, machine=machine, commit_hash=commit, commit_date=date,
                            before=REPRODUCED, after=verdict, before_commit=last_good[-1], mode=mode,
                            inputs=fingerprint))
    return out
