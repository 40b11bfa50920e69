"""Regression alerts over every (benchmark, params, machine, mode, inputs) series, plus gate
failures, verdict flips and suites over their quick-mode time budget. A quick run's results and
results on other inputs (another corpus, results from before inputs were recorded) are series of
their own: they never raise an alert against a full run's history.

Two rules, and each alert says which fired:
- `asv step`: asv's own step detection, for steps inside the history.
- `newest point`: the newest value against a reference, the better of the previous value and the
  median of the REFERENCE_POINTS values before it (after a climb, the level it climbed to; after a
  drop at the last two points, the level before them), over the values since asv's last step: a
  step asv reports is not raised again by each later run at its level (on harness.AlertRecall's
  planted series, recall and false alarms are the same either way). It is flagged when it is worse
  by more than SINGLE_POINT_MARGIN times the series' threshold (asv's steps average many points; a
  lone newest point carries its whole noise) and by more than NOISE_Z times the history's noise:
  the standard deviation of its successive relative changes about their median, the one farthest
  out left aside (so one earlier step does not widen it), times 1.08 for what leaving it aside takes
  off. A series that climbs steadily has little noise, however far it climbed. asv's step detection
  judges a single trailing point after a climb as noise; a CI job that runs on every change always
  sees its new commit as that trailing point. With fewer than MIN_HISTORY values before the newest,
  twice the threshold stands in for the noise. (The scale estimate, NOISE_Z and SINGLE_POINT_MARGIN
  were chosen on planted series: harness.AlertRecall.)

asv assumes lower is better. A higher-is-better series of positive values is inverted (1/y),
which keeps relative step sizes, so asv's relative threshold means the same in both directions;
a higher-is-better series that crosses zero is negated instead.

A step between two runs that both kept the samples their value came from (the rounds of a median,
the items of a rate, the queries of a tail latency: intervals' order-statistic, Wilson and percentile
estimates) is tested on them, one-sided, over the reference run's samples and the newest run's: rounds by a
rank-sum test (intervals.rank_sum_pvalue; a median), items by a permutation test of their means
(intervals.mean_difference_pvalue; a rate is a mean, and items averaged over draws would outrank
zeros whatever their mean), queries by a permutation test of their 99th percentiles
(intervals.percentile_difference_pvalue; one slow query moves the 99th percentile of 70). When
p >= NOISE_P the samples cannot tell the two runs apart: the alert is listed as within noise, with its
p-value, and is not open. A step with p below it says its p-value and stays open. Rounds show one run's
noise, not the spread between runs (another load on the machine); a step no change on the code path
explains still says so.

A step in a wall-clock series (a time, queries/s, tokens/s: metrics.wall_clock) between two runs
that both timed the machine-speed probes (claimbench.machinespeed) says whether the machine slowed
too: as much as the series (MACHINE_SLOWER: its most slowed probe's time ratio, significant by a
rank-sum test over the probes' rounds, times 1 + the threshold reaches the series' own), less, or
not measurably. It stays open either way: the probes show the machine at each run's two ends, and
a slower machine does not make slower code impossible. Where the series' class also timed the memory
probe in its own rounds (a `track_memory_bandwidth` at the same params, in both runs), the alert gives
that bandwidth in both: a memory-bound side moves with it, a ratio against such a side too.

A step a maintainer meant (a deliberate trade) is acknowledged in pyproject.toml,
[tool.claimbench.alerts.acknowledged], "benchmark pattern@commit prefix" = "why": it stays listed, with
its reason, but is no longer open (nor fails `--fail-on`). A regression whose step spans no change to the code
its suite's code path runs (claimbench.codepath), or two runs of one commit, says so: the machine, its
load or its libraries changed, not the code. It stays open: the change is real on that machine. A step a
maintainer re-measured and traced to the machine (the older commit's code timed beside the newer's today,
or a baseline whose time moved while the method's held) is listed in [tool.claimbench.alerts.rechecked]
the same way, with what the recheck measured: its status is "not the code", and it is no longer open.

A step in a series the machine no longer extends is superseded: the machine's later runs of the same
benchmark and parameters, in the same mode (a run without a record counts as a full one), are on other
inputs, or recorded where these were not, and so form a series of their own that began after this one's
last run. Nothing later can confirm or clear such a step, and no alert compares across the two series:
it is listed with the commit where its successor begins, and is not open (an acknowledged or rechecked
step keeps that status and its reason). A series the machine returned to after another is not superseded.
"""
from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import math
import statistics
import tomllib
from dataclasses import dataclass
from pathlib import Path

from asv import step_detect

from . import codepath, inputs, intervals, machinespeed, metrics, verdicts
from .registry import REPO_ROOT

KINDS = ("regression", "gate", "flip", "budget")
REFERENCE_POINTS = 3  # the newest value is compared with the median of this many before it
MIN_HISTORY = 4  # values before the newest needed to estimate the noise
NOISE_Z = 3.5  # a newest-point drop must exceed this many noise units
SINGLE_POINT_MARGIN = 1.5  # and this many times the series' threshold: one point carries its whole noise
CODE_UNCHANGED = "not this repository's code"  # in the detail of a step with no code change on its path
MACHINE_SLOWER = "the machine slowed as much"  # in the detail of a wall-clock step the machine's probes match
NOT_THE_CODE = "not the code"  # the status of a step a recheck traced to the machine ([...alerts.rechecked])
SUPERSEDED = "superseded"  # the status of a step in a series the machine no longer extends (module docstring)
BANDWIDTH_BENCHMARK = "track_memory_bandwidth"  # a class's copy bandwidth in its own rounds (machinespeed.memory_copy)
NOISE_P = 0.05  # a step whose two runs' samples give a p-value at or above this is within noise
MIN_SAMPLES = 5  # samples each run needs for the test
# estimates whose value is a median, a share or a 99th percentile of their samples (keyed by the start of their
# method: intervals.percentile_of names its "percentile 99 of ..."), each with its test. Not a paired bootstrap's:
# its items (spans' or tokens' NLLs) can differ far more among themselves than a real step moves each of
# them, and an unpaired test would call such a step noise.
NOISE_TESTS = {"order statistics": ("rank-sum test", intervals.rank_sum_pvalue),
               "Wilson": ("permutation test of the means", intervals.mean_difference_pvalue),
               "percentile 99 ": ("permutation test of the 99th percentiles",
                                  functools.partial(intervals.percentile_difference_pvalue, percent=99))}


def _alerts_config(path) -> dict:
    """[tool.claimbench.alerts] of a pyproject.toml ({} when there is none)."""
    if not path.exists():
        return {}
    return tomllib.loads(path.read_text()).get("tool", {}).get("claimbench", {}).get("alerts", {})


@dataclass
class Thresholds:
    default: float = 0.05
    patterns: dict[str, float] | None = None

    def for_benchmark(self, name: str) -> float:
        matches = [(len(p), t) for p, t in (self.patterns or {}).items() if fnmatch.fnmatchcase(name, p)]
        return max(matches)[1] if matches else self.default

    @classmethod
    def from_pyproject(cls, path=REPO_ROOT / "pyproject.toml", overrides: dict[str, float] | None = None):
        conf = _alerts_config(path)
        patterns = {**conf.get("thresholds", {}), **(overrides or {})}
        default = patterns.pop("*", conf.get("default_threshold", cls.default))
        return cls(float(default), {k: float(v) for k, v in patterns.items()})


@dataclass
class Alert:
    kind: str
    benchmark: str
    params: str
    machine: str
    commit_hash: str | None
    commit_date: object
    before: float | None
    after: float | None
    detail: str
    status: str = "open"  # or "acknowledged", NOT_THE_CODE, "within noise", SUPERSEDED
    mode: str | None = None  # the series' run mode and inputs fingerprint
    inputs: str | None = None
    superseded: str = ""  # where its series has a successor: why, for `reviewed` to retire a step still open

    @property
    def change(self) -> float | None:
        """(after - before) / |before|: negative when the value fell, whatever the sign of before."""
        if self.before in (None, 0) or self.after is None:
            return None
        return (self.after - self.before) / abs(self.before)

    @property
    def alert_id(self) -> str:
        ident = "|".join(map(str, (self.kind, self.benchmark, self.params, self.machine, self.commit_hash,
                                   self.mode, self.inputs)))
        return hashlib.sha1(ident.encode()).hexdigest()[:16]


def acknowledgements(path=REPO_ROOT / "pyproject.toml") -> dict[str, str]:
    """{"benchmark pattern@commit prefix": why} from [tool.claimbench.alerts.acknowledged]."""
    return dict(_alerts_config(path).get("acknowledged", {}))


def rechecks(path=REPO_ROOT / "pyproject.toml") -> dict[str, str]:
    """{"benchmark pattern@commit prefix": what the recheck measured} from [tool.claimbench.alerts.rechecked]."""
    return dict(_alerts_config(path).get("rechecked", {}))


def acknowledge(alerts: list[Alert], entries: dict[str, str], status: str = "acknowledged") -> list[Alert]:
    """Give the open regressions an entry names (benchmark by fnmatch pattern, commit by prefix) `status`,
    and the entry's reason in their detail; a step within noise stays so."""
    for a in alerts:
        for key, why in entries.items():
            pattern, _, commit = key.rpartition("@")
            if (a.kind == "regression" and a.status == "open" and commit and fnmatch.fnmatchcase(a.benchmark, pattern)
                    and (a.commit_hash or "").startswith(commit)):
                a.status, a.detail = status, f"{a.detail}; {status}: {why}"
                break
    return alerts


def reviewed(alerts: list[Alert], acknowledged: dict[str, str], rechecked: dict[str, str]) -> list[Alert]:
    """The acknowledged steps marked so, then the rechecked ones as NOT_THE_CODE, then the open steps of a
    superseded series as SUPERSEDED."""
    for a in acknowledge(acknowledge(alerts, acknowledged), rechecked, NOT_THE_CODE):
        if a.superseded and a.status == "open":
            a.status, a.detail = SUPERSEDED, f"{a.detail}; {SUPERSEDED}: {a.superseded}"
    return alerts


def _successors(series: dict[tuple, list]) -> dict[tuple, tuple[str, str]]:
    """Each series the machine no longer extends -> (the commit its successor begins at, what sets the two
    apart): the earliest series of the same benchmark, params and machine, in the same mode (unrecorded runs
    were full ones), on other inputs or recorded, whose first run is later than this series' last."""
    def family(mode):
        return "full" if mode == inputs.UNRECORDED else mode
    siblings: dict[tuple, list] = {}  # (benchmark, params, machine, direction, mode family) -> its series
    for key in series:
        siblings.setdefault((*key[:4], family(key[4])), []).append(key)
    found = {}
    for keys in siblings.values():
        for key in keys:
            last = series[key][-1][1]
            later = [(series[other][0][1], series[other][0][0]) for other in keys
                     if other != key and last is not None and series[other][0][1] is not None
                     and series[other][0][1] > last]
            if later:
                found[key] = (min(later)[1], "its runs recorded" if key[4] == inputs.UNRECORDED else "other inputs")
    return found


def _to_lower_better(values: list[float], direction: str) -> tuple[list[float], callable]:
    if direction == "lower":
        return values, lambda v: v
    if all(v > 0 for v in values):
        return [1.0 / v for v in values], lambda v: 1.0 / v
    return [-v for v in values], lambda v: -v


def find_regressions(values: list[float], direction: str, threshold: float) -> list[tuple[int, int, float, float]]:
    """asv's step detection: (index before, index after, value before, latest value) for each open
    regression. asv's own 'after' is the best value anywhere after the step, which a single lucky run
    can make better than the value before; the latest value is what the series stands at now."""
    if direction not in ("higher", "lower") or len(values) < 2:
        return []
    y, back = _to_lower_better(values, direction)
    steps = step_detect.detect_steps(y)
    _, _, positions = step_detect.detect_regressions(steps, threshold=threshold)
    return [(before, after, back(v_before), values[-1]) for before, after, v_before, _ in positions or []]


def newest_point(values: list[float], direction: str, threshold: float) -> tuple[float, float, float] | None:
    """(reference, newest value, how much worse in relative terms) when the newest value is a
    regression by the newest-point rule (module docstring), else None."""
    if direction not in ("higher", "lower") or len(values) < 2:
        return None
    history, newest = values[:-1], values[-1]
    sign = 1.0 if direction == "higher" else -1.0
    reference = max(history[-1], statistics.median(history[-REFERENCE_POINTS:]), key=lambda v: sign * v)
    if reference == 0:
        return None
    worse = sign * (reference - newest) / abs(reference)
    if len(history) >= MIN_HISTORY:
        changes = [(b - a) / abs(a) for a, b in zip(history, history[1:]) if a != 0]
        centre = statistics.median(changes)
        kept = sorted(abs(c - centre) for c in changes)[:-1]
        noise = 1.08 * (sum(d * d for d in kept) / max(len(kept) - 1, 1)) ** 0.5
    else:
        noise = 2 * threshold / NOISE_Z
    return (reference, newest, worse) if worse > max(SINGLE_POINT_MARGIN * threshold, NOISE_Z * noise) else None


def detect(values: list[float], direction: str, threshold: float) -> list[tuple[int, int, float, float, str]]:
    """Both rules over one series: (index before, index after, value before, latest value, rule).
    The newest-point rule judges the newest value against the level since asv's last step (the whole
    history where asv found none): a step asv already reports, acknowledged or not, is not raised
    again at each later run that stays at its level; a further drop after it is."""
    found = [(*f, "asv step") for f in find_regressions(values, direction, threshold)]
    since = max((after for _, after, _, _, _ in found), default=0)
    if since < len(values) - 1:
        newest = newest_point(values[since:], direction, threshold)
        if newest is not None:
            found.append((len(values) - 2, len(values) - 1, newest[0], newest[1], "newest point"))
    return found


def regressions(con, thresholds: Thresholds, root=REPO_ROOT) -> list[Alert]:
    """Both rules over every series; a step with no change on its suite's code path (git at root) says so,
    and one whose two runs kept their samples carries its test on them (module docstring)."""
    rows = con.execute(
        """SELECT x.benchmark, x.params, r.machine, x.direction, r.commit_hash, r.commit_date, x.value, r.mode,
                  r.inputs, x.samples, json_extract_string(x.interval, '$.method'), x.unit, r.machine_speed, r.run_id
           FROM results x JOIN runs r USING (run_id)
           WHERE x.value IS NOT NULL AND x.direction IN ('higher', 'lower')
           ORDER BY x.benchmark, x.params, r.machine, r.commit_date NULLS FIRST, r.ingested_at""").fetchall()
    series: dict[tuple, list] = {}
    for (bench, params, machine, direction, commit, date, value, mode, recorded, samples, method, unit, speed,
         run) in rows:
        suite = inputs.suite_of(bench)
        fingerprint = inputs.key(json.loads(recorded or "{}").get(suite))
        test = next((test for prefix, test in NOISE_TESTS.items() if method and method.startswith(prefix)), None)
        testable = (samples, test) if samples and test and _in_the_values_scale(value, samples, test) else None
        probes = json.loads(speed).get(suite) if speed and metrics.wall_clock(bench, unit) else None
        series.setdefault((bench, params, machine, direction, mode, fingerprint), []).append(
            (commit, date, value, testable, probes, run))
    bandwidths = _bandwidths(con)
    successors = _successors(series)
    alerts = []
    for (bench, params, machine, direction, mode, fingerprint), points in series.items():
        successor = successors.get((bench, params, machine, direction, mode, fingerprint))
        superseded = (f"{machine}'s runs of it from commit {successor[0][:8]} on are a series of their own "
                      f"({successor[1]}), so no later run of this series can confirm or clear this step"
                      if successor else "")
        threshold = thresholds.for_benchmark(bench)
        values = [p[2] for p in points]
        for before, after, v_before, v_after, rule in detect(values, direction, threshold):
            commit, date = points[after][:2]
            reference = _reference_point(values, before, v_before)
            noise, noise_note = _noise_test(points[reference][3], points[-1][3], direction)
            machine_note = _machine_note(points[reference][4], points[-1][4], v_before, v_after, direction, threshold)
            machine_note += _bandwidth_note(bandwidths, bench, params, points[reference][5], points[-1][5])
            alerts.append(Alert("regression", bench, params, machine, commit, date, v_before, v_after,
                                f"{rule}: {direction} is better; from {v_before:.4g} to {v_after:.4g} now, step "
                                f"at commit {commit[:8]} (threshold {threshold:.0%}; {mode} runs)"
                                f"{_code_path_note(bench, points[before][0], commit, root)}{noise_note}{machine_note}",
                                status="within noise" if noise else "open", mode=mode, inputs=fingerprint,
                                superseded=superseded))
    return alerts


def _machine_note(older: dict | None, newer: dict | None, v_before: float, v_after: float, direction: str,
                  threshold: float) -> str:
    """Whether the machine's speed probes (claimbench.machinespeed) slowed as much as a wall-clock series
    that went from v_before to v_after; '' unless both runs timed them."""
    slowed = machinespeed.slowdown(older, newer)
    if slowed is None or v_before <= 0 or v_after <= 0:
        return ""
    step = v_after / v_before if direction == "lower" else v_before / v_after  # in time: above 1 is slower
    series = f"this series {step:.2f}x (machine-speed probes before and after each run)"
    if not slowed.significant:
        return f"; the machine was not measurably slower: {slowed.describe()}; {series}"
    if slowed.ratio * (1 + threshold) >= step:
        return f"; {MACHINE_SLOWER}: {slowed.describe()}; {series}"
    return f"; the machine slowed less than this: {slowed.describe()}; {series}"


def _bandwidths(con) -> dict[tuple[str, str, str], float]:
    """(benchmark class, params, run) -> the copy bandwidth timed in that class's own rounds
    (BANDWIDTH_BENCHMARK, where a suite measures it)."""
    rows = con.execute("SELECT x.benchmark, x.params, x.run_id, x.value FROM results x "
                       "WHERE x.benchmark LIKE ? AND x.value IS NOT NULL", [f"%.{BANDWIDTH_BENCHMARK}"]).fetchall()
    return {(bench.rsplit(".", 1)[0], params, run): value for bench, params, run, value in rows}


def _bandwidth_note(bandwidths: dict, benchmark: str, params: str, older_run, newer_run) -> str:
    """The machine's memory bandwidth in both runs' own rounds, where the benchmark's class timed it in
    both; else ''."""
    owner = benchmark.rsplit(".", 1)[0]
    older, newer = bandwidths.get((owner, params, older_run)), bandwidths.get((owner, params, newer_run))
    if not older or not newer:
        return ""
    return (f"; the machine's memory bandwidth in the same rounds went from {older:.3g} to {newer:.3g} GB/s "
            f"({newer / older:.2f}x)")


def _reference_point(values: list[float], before: int, v_before: float) -> int:
    """The run the step is measured from: the newest-point rule's reference (one of the
    REFERENCE_POINTS values before the newest), else the last run before asv's step."""
    window = range(max(0, before + 1 - REFERENCE_POINTS), before + 1)
    return next((i for i in reversed(window) if values[i] == v_before), before)


def _in_the_values_scale(value: float, samples: list[float], test: tuple) -> bool:
    """Whether a run's samples are in its value's scale, as a test in the value's direction needs: a share is
    the mean of its items, a median lies within its rounds. Results recorded before intervals.Estimate.map
    mapped the samples are not: Lychee's queries/s kept each round's time (a rank-sum test over them reads a
    slowdown as a speed-up), ATTUNE's percentages their 0/1 items."""
    if test is NOISE_TESTS["Wilson"]:
        return math.isclose(statistics.fmean(samples), value, rel_tol=1e-6, abs_tol=1e-12)
    slack = 1e-9 * abs(value)
    return min(samples) - slack <= value <= max(samples) + slack


def _noise_test(reference: tuple | None, newest: tuple | None, direction: str) -> tuple[bool, str]:
    """(within noise?, a clause for the detail) from the two runs' (samples, NOISE_TESTS entry); (False, '')
    without them, or where the two runs' estimates are not of one kind."""
    if not reference or not newest or reference[1] != newest[1]:
        return False, ""
    (before, (name, pvalue)), (after, _) = reference, newest
    if min(len(before), len(after)) < MIN_SAMPLES:
        return False, ""
    better, worse = (before, after) if direction == "higher" else (after, before)
    p = pvalue(better, worse)
    if p >= NOISE_P:
        return True, (f"; within noise: the two runs' samples ({len(before)} and {len(after)}) do not tell them "
                      f"apart (one-sided {name}, p = {p:.2f})")
    return False, f"; {name} over the two runs' {len(before)} and {len(after)} samples: p = {p:.3f}"


def _code_path_note(benchmark: str, before: str, after: str, root) -> str:
    """Where git can tell that nothing the step's code path runs changed (claimbench.codepath), a clause
    that says so; else ''."""
    cause = f"so the machine, its load or its libraries changed, {CODE_UNCHANGED}"
    if not before or not after:
        return ""
    if before == after:
        return f"; both values were measured at {after[:8]}, {cause}"
    suite = inputs.suite_of(benchmark)
    if not codepath.unchanged(suite, before, after, root):
        return ""
    return (f"; nothing its code path runs changed from {before[:8]} to {after[:8]} (the suite, the modules it "
            f"imports and the shipped data: {len(codepath.files(suite, root))} files; docstrings, comments and "
            f"definitions nothing there names set aside), {cause}")


def gate_and_flip_alerts(latest: list[verdicts.Verdict], history: list[verdicts.Verdict]) -> list[Alert]:
    """A gate that failed (everywhere, or on some combinations) on a machine: one alert for the claims it
    gates whose verdicts read the same (RACE's four claims share one quality gate); each verdict flip."""
    failed: dict[tuple, list[str]] = {}
    for v in latest:
        if v.gate in ("failed", "partly") and v.claim.gate:
            failed.setdefault((v.claim.gate.benchmark, v.machine, v.commit_hash, v.commit_date, v.mode, v.inputs,
                               v.reason), []).append(v.claim.key)
    alerts = [Alert("gate", gate, "", machine, commit, date, None, None, f"{', '.join(claims)}: {reason}", mode=mode,
                    inputs=fingerprint)
              for (gate, machine, commit, date, mode, fingerprint, reason), claims in failed.items()]
    for f in verdicts.flips(history):
        alerts.append(Alert("flip", f["claim_key"], "", f["machine"], f["commit_hash"], f["commit_date"], None, None,
                            f"{f['claim_key']}: {f['before']} at {f['before_commit'][:8]} -> {f['after']} "
                            f"at {f['commit_hash'][:8]} ({f['mode']} runs)", mode=f["mode"], inputs=f["inputs"]))
    return alerts


def budget_alerts(con, root: Path = REPO_ROOT) -> list[Alert]:
    """A suite whose newest quick run took longer than its budget (progressive.quick_budget, read from the
    suites under `root`)."""
    from .progressive import TIME_BENCHMARK, quick_budget
    rows = con.execute(
        """SELECT x.params, r.machine, r.commit_hash, r.commit_date, x.value FROM results x JOIN runs r USING (run_id)
           WHERE x.benchmark = ? AND x.value IS NOT NULL AND r.mode = 'quick'
           QUALIFY row_number() OVER (PARTITION BY r.machine, x.params
                                      ORDER BY r.commit_date DESC, r.ingested_at DESC) = 1""",
        [TIME_BENCHMARK]).fetchall()
    found = []
    for params, machine, commit, date, value in rows:
        suite = json.loads(params).get("suite")
        budget = quick_budget(suite, root)
        if value > budget:
            found.append(Alert("budget", TIME_BENCHMARK, params, machine, commit, date, budget, value,
                               f"{suite}: {value:.0f} s in quick mode, over its {budget:.0f} s budget", mode="quick"))
    return found


def evaluate(con, registry, thresholds: Thresholds, acknowledged: dict[str, str] | None = None,
             rechecked: dict[str, str] | None = None, computed: tuple[list, list] | None = None) -> list[Alert]:
    """Every alert, open ones first, newest first; the alerts table is rewritten to hold exactly these. computed:
    verdicts.compute_with_history's (latest, history) of this store, where the caller has it already."""
    latest, history = computed or verdicts.compute_with_history(con, registry)
    found = reviewed(regressions(con, thresholds) + gate_and_flip_alerts(latest, history) + budget_alerts(con),
                     acknowledged or {}, rechecked or {})
    found.sort(key=lambda a: (a.status == "open", a.commit_date is not None, a.commit_date or 0), reverse=True)
    con.execute("BEGIN")
    con.execute("DELETE FROM alerts")
    if found:
        con.executemany("INSERT OR REPLACE INTO alerts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now(), ?, ?)",
                        [[a.alert_id, a.kind, a.benchmark, a.params, a.machine, a.commit_hash, a.commit_date,
                          a.before, a.after, a.change, a.detail, a.status, a.mode, a.inputs] for a in found])
    con.execute("COMMIT")
    return found


def evaluate_as_configured(con, registry, path=REPO_ROOT / "pyproject.toml",
                           overrides: dict[str, float] | None = None,
                           computed: tuple[list, list] | None = None) -> list[Alert]:
    """evaluate() with the thresholds, acknowledgements and rechecks of [tool.claimbench.alerts] in path: what
    `claimbench alerts` and the end of `claimbench run` report (one reading, so they cannot disagree)."""
    return evaluate(con, registry, Thresholds.from_pyproject(path, overrides), acknowledgements(path), rechecks(path),
                    computed)


def markdown(alerts: list[Alert]) -> str:
    open_ = [a for a in alerts if a.status == "open"]
    noise = [a for a in alerts if a.status == "within noise"]
    acknowledged = [a for a in alerts if a.status == "acknowledged"]
    machine = [a for a in alerts if a.status == NOT_THE_CODE]
    superseded = [a for a in alerts if a.status == SUPERSEDED]
    lines = ["## claimbench alerts", ""]
    lines.append(f"{len(open_)} open alert(s)." if open_ else "No open regressions, gate failures or verdict flips.")
    if drift := sum(CODE_UNCHANGED in a.detail for a in open_):
        lines[-1] += (f" {drift} of them are steps with no change on their code path: the machine, its load or its "
                      f"libraries changed, {CODE_UNCHANGED}.")
    if slower := sum(MACHINE_SLOWER in a.detail for a in open_):
        lines[-1] += (f" {slower} of them are wall-clock steps over which {MACHINE_SLOWER}, by its speed probes "
                      f"before and after each run.")
    lines.append("")
    lines += _table(open_)
    if noise:
        lines += ["", f"### Within noise ({len(noise)}): steps the two runs' own samples cannot tell apart "
                      f"(rank-sum test of rounds, permutation tests of items' means and of queries' 99th "
                      f"percentiles; p >= {NOISE_P})", ""]
        lines += _table(noise)
    if acknowledged:
        lines += ["", f"### Acknowledged ({len(acknowledged)}): intended changes, each with its reason", ""]
        lines += _table(acknowledged)
    if machine:
        lines += ["", f"### Not the code ({len(machine)}): steps a recheck traced to the machine, each with what it "
                      "measured", ""]
        lines += _table(machine)
    if superseded:
        lines += ["", f"### Superseded ({len(superseded)}): steps in a series the machine no longer extends (its "
                      "later runs of the benchmark are on other inputs, or recorded where these were not: a series "
                      "of their own), which no later run can confirm or clear", ""]
        lines += _table(superseded)
    return "\n".join(lines).rstrip("\n") + "\n"


def _table(alerts: list[Alert]) -> list[str]:
    if not alerts:
        return []
    lines = ["| kind | benchmark / claim | params | machine | commit | change | detail |",
             "|---|---|---|---|---|---|---|"]
    for a in alerts:
        params = verdicts.params_text(json.loads(a.params)) if a.params else ""
        change = f"{a.change:+.1%}" if a.change is not None else ""
        lines.append(f"| {a.kind} | `{a.benchmark}` | {params} | {a.machine} | {(a.commit_hash or '')[:8]} "
                     f"| {change} | {a.detail} |")
    return lines
