"""Every read the leaderboard makes, in one place, cached per version of the store.

Connections are read-only and short; a writer holding the lock makes a read wait and retry,
never the other way round. The cache key includes the DB file's size and mtime (and its WAL's),
so a browser refresh after an ingest shows the new data.
"""
from __future__ import annotations

import json
import os

import pandas as pd
import streamlit as st

from claimbench import alerts, inputs, machinespeed, registry, store, verdicts
from claimbench.report import BADGE

READ_WAIT_S = 10.0

def db_version() -> tuple:
    """Changes whenever the store's files change: the cache key of every query."""
    path = store.db_path()
    stamp = []
    for p in (path, path.with_name(path.name + ".wal")):
        try:
            s = os.stat(p)
            stamp.append((s.st_size, s.st_mtime_ns))
        except FileNotFoundError:
            stamp.append(None)
    return (str(path.resolve()), *stamp)


def _read(fn):
    with store.connect(read_only=True, wait_s=READ_WAIT_S) as con:
        return fn(con)


@st.cache_data(show_spinner=False)
def has_results(version) -> bool:
    return bool(_read(lambda con: con is not None and con.execute("SELECT count(*) FROM results").fetchone()[0]))


@st.cache_data(show_spinner=False)
def papers() -> pd.DataFrame:
    reg = registry.load()
    return pd.DataFrame([dict(paper=p.id, title=p.title, tier=p.tier, task=p.task, suite=p.suite or "",
                              method=p.method or "", baselines=", ".join(p.baselines), claims=len(p.claims))
                         for p in reg.papers])


@st.cache_data(show_spinner=False)
def latest_verdicts(version) -> list[verdicts.Verdict]:
    """The latest verdict per claim and machine, computed live from the results: the claims table and the
    out-of-date table read one computation."""
    return _read(lambda con: verdicts.compute(con, registry.load(), store_history=False))


@st.cache_data(show_spinner=False)
def claims(version) -> pd.DataFrame:
    """One row per claim and machine: the latest verdict."""
    latest = latest_verdicts(version)
    reg = registry.load()
    tiers = {p.id: p.tier for p in reg.papers}
    rows = []
    by_claim = {}
    for v in latest:
        by_claim.setdefault(v.claim.key, []).append(v)
    across = {key: verdicts.across_machines(claim_verdicts) for key, claim_verdicts in by_claim.items()}
    for v in latest:
        c = v.claim
        rows.append(dict(paper=c.paper_id, tier=tiers[c.paper_id], claim=c.id, claimed=c.claimed_text,
                         measured=v.measured, low=v.low, high=v.high, interval=v.interval_text, mode=v.mode or "",
                         inputs=v.inputs_status or "", unit=c.unit, machine=v.machine or "(none)",
                         verdict=v.verdict, badge=BADGE[v.verdict], gate=v.gate, why=v.reason,
                         conditions=c.conditions, baseline=c.baseline, substitution=c.substitution or "",
                         benchmark=c.benchmark or "", commit=(v.commit_hash or "")[:8], across=across[c.key],
                         detail=json.dumps(v.detail, default=str)))
    return pd.DataFrame(rows)


def measured_papers(claims_df: pd.DataFrame) -> list[str]:
    """Papers with a verdict that rests on a measurement on some machine, in table order: a failed gate counts
    (its value is withheld, not missing); 'not testable here' and 'not measured yet' do not."""
    measured = claims_df[~claims_df["verdict"].isin([verdicts.NOT_TESTABLE, verdicts.NOT_MEASURED])]
    return list(dict.fromkeys(measured["paper"]))


def by_machine(claims_df: pd.DataFrame) -> pd.DataFrame:
    """One row per claim, one column group per machine: its verdict (or 'not measured on MACHINE' where it has
    no result for the claim), the measured value with its interval, and the commit the verdict comes from;
    then whether the machines agree, or what sets them apart (verdicts.across_machines)."""
    machines = sorted(m for m in claims_df["machine"].unique() if m != "(none)")
    keys = ["paper", "claim"]
    out = claims_df.drop_duplicates(keys)[["paper", "tier", "claim", "claimed"]].set_index(keys)
    for machine in machines:
        part = claims_df[claims_df["machine"] == machine].set_index(keys)
        unmeasured = (part["verdict"] == verdicts.NOT_MEASURED) & (part["commit"] == "")
        out[machine] = part["badge"].where(~unmeasured, f"not measured on {machine}")
        out[f"{machine} · measured"] = part["interval"].where(~unmeasured, "")
        out[f"{machine} · commit"] = part["commit"]
    out["across machines"] = claims_df.drop_duplicates(keys).set_index(keys)["across"]
    return out.reset_index()


@st.cache_data(show_spinner=False)
def results(version, prefix: str) -> pd.DataFrame:
    """Every result of benchmarks whose name starts with prefix, with run context."""
    def query(con):
        if con is None:
            return pd.DataFrame(columns=["benchmark", "params", "value", "low", "high", "status", "unit", "direction",
                                         "machine", "mode", "commit", "commit_date"])
        return con.execute(
            """SELECT x.benchmark, x.params, x.value, x.low, x.high, x.status, x.unit, x.direction, r.machine, r.mode,
                      r.commit_hash AS commit, r.commit_date
               FROM results x JOIN runs r USING (run_id) WHERE starts_with(x.benchmark, ?)
               ORDER BY r.commit_date, x.benchmark, x.params""", [prefix]).df()
    df = _read(query)
    params = df["params"].map(json.loads) if len(df) else pd.Series(dtype=object)
    for key in sorted({k for p in params for k in p}):
        df[key] = params.map(lambda p, k=key: str(p.get(k, "")))
    return df


@st.cache_data(show_spinner=False)
def kernels(version, suite: str) -> pd.DataFrame:
    """The kernel micro-benchmarks of a suite's paper (kernels/test_<suite>.py), in milliseconds per call."""
    df = results(version, f"pytest:kernels/test_{suite}.py::")
    df["kernel"] = df["benchmark"].str.split("::").str[-1]
    df["commit"] = df["commit"].str[:8]
    for column in ("value", "low", "high"):
        df[column] = df[column] * 1e3
    return df


def latest_per_machine(df: pd.DataFrame) -> pd.DataFrame:
    """Keep each benchmark's newest commit per machine in its preferred mode (full runs over older
    unrecorded ones over quick ones, as verdicts choose; a run of part of a suite hides nothing else)."""
    if df.empty:
        return df
    rank = df["mode"].fillna(inputs.UNRECORDED).map(
        {m: i for i, m in enumerate(verdicts.MODE_PREFERENCE)}).fillna(len(verdicts.MODE_PREFERENCE))
    df = df[rank == rank.groupby([df["machine"], df["benchmark"]]).transform("min")]
    newest = df.groupby(["machine", "benchmark"])["commit_date"].transform("max")
    return df[df["commit_date"] == newest]


def _match(df: pd.DataFrame, where: dict) -> pd.DataFrame:
    for key, value in where.items():
        if key in df:
            df = df[df[key] == value]
    return df


def _board_methods(spec: registry.Board, df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """method -> its rows, from named benchmarks or from the values of one benchmark's parameter."""
    if spec.methods:
        return {m: df[df["benchmark"] == bench] for m, bench in spec.methods.items()}
    part = df[df["benchmark"] == spec.benchmark]
    return {m: part[part[spec.method_param] == m] for m in part.get(spec.method_param, pd.Series(dtype=str)).unique()}


def _gate(spec: registry.Board, df: pd.DataFrame, method: str, row) -> str:
    """passed / failed / none: the method's gate on the same machine, at every parameter the gate's rows
    share with the row (a gate without that parameter applies to every value of it)."""
    rule = spec.gated.get(method) or spec.gated.get("*")
    if rule is None:
        return "none"
    g = df[(df["benchmark"] == rule.benchmark) & (df["machine"] == row["machine"])]
    for key, value in json.loads(row["params"]).items():
        if key in g and (g[key] != "").any():
            g = g[g[key] == str(value)]
    values = g["value"].dropna()
    return "passed" if len(values) and all(rule.passes(v) for v in values) else "failed"


@st.cache_data(show_spinner=False)
def board(version, task: str) -> pd.DataFrame:
    """Methods ranked per machine and group; a method that failed its gate is listed, unranked."""
    spec = registry.load().board(task)
    everything = latest_per_machine(results(version, spec.suite + "."))
    df = _match(everything, spec.where)
    rows = [dict(machine=r["machine"] + (" · quick" if r["mode"] == "quick" else ""), group=r[spec.group],
                 method=method, value=r["value"], gate=_gate(spec, everything, method, r))
            for method, part in _board_methods(spec, df).items() for _, r in part.iterrows()
            if pd.notna(r["value"])]  # skipped rows (not applicable) are not methods at that point
    out = pd.DataFrame(rows, columns=["machine", "group", "method", "value", "gate"])
    if out.empty:
        return out.assign(rank=pd.Series(dtype="Int64"))
    ranked = out[(out["gate"] != "failed") & out["value"].notna()].copy()
    ranked["rank"] = ranked.groupby(["machine", "group"])["value"].rank(
        ascending=spec.lower_is_better, method="min").astype("Int64")
    out = out.merge(ranked[["machine", "group", "method", "rank"]], how="left", on=["machine", "group", "method"])
    return out.sort_values(["machine", "group", "rank"], key=_natural, na_position="last")


def _natural(column: pd.Series) -> pd.Series:
    """Sort key: numbers as numbers (queue depth 8 before 32), everything else as text."""
    numbers = pd.to_numeric(column, errors="coerce")
    return numbers if column.name == "group" and numbers.notna().all() else column


@st.cache_data(show_spinner=False)
def tradeoff(version, paper: str) -> pd.DataFrame:
    """(machine, group, method, quality, speed with its 95% interval, gate) per operating point of the
    paper's trade-off, newest commit per machine."""
    spec = registry.load().paper(paper).tradeoff
    df = latest_per_machine(results(version, spec.quality.split(".")[0] + "."))
    keys = ["machine", spec.group, spec.point]
    columns = ["machine", "group", "point", "method", "quality", "speed", "speed_low", "speed_high", "gate"]
    if not set(keys) <= set(df.columns):  # no results of the suite yet
        return pd.DataFrame(columns=columns)
    rows = []
    for method, bench in spec.methods.items():
        part = df[df[spec.method_param] == method] if spec.method_param in df else df
        quality = part[part["benchmark"] == spec.quality].set_index(keys)["value"]
        speed = part[part["benchmark"] == bench].set_index(keys)[["value", "low", "high"]]
        gate = None
        if method in spec.gated:
            rule = spec.gated[method]
            gate = part[part["benchmark"] == rule.benchmark].set_index(keys)["value"].map(rule.passes)
        for key, row in speed.iterrows():
            rows.append(dict(machine=key[0], group=key[1], point=key[2], method=method,
                             quality=quality.get(key), speed=row["value"], speed_low=row["low"], speed_high=row["high"],
                             gate="none" if gate is None else ("passed" if gate.get(key, False) else "failed")))
    return pd.DataFrame(rows, columns=columns)


@st.cache_data(show_spinner=False)
def sweep(version, paper: str) -> pd.DataFrame:
    """(machine, x, series, metric, value, low, high) of the paper's sweep, newest commit per machine; low
    and high are the value's 95% interval where the suite recorded one."""
    spec = registry.load().paper(paper).sweep
    df = latest_per_machine(results(version, spec.prefix))
    rows = [dict(machine=r["machine"], x=r[spec.x], series=r[spec.series], metric=label, value=r["value"],
                 low=r["low"], high=r["high"])
            for name, label in spec.metrics.items()
            for _, r in df[df["benchmark"] == spec.prefix + name].iterrows() if pd.notna(r["value"])]
    return pd.DataFrame(rows, columns=["machine", "x", "series", "metric", "value", "low", "high"])


def pareto(df: pd.DataFrame) -> pd.Series:
    """True for points no other point of the same (machine, group) beats on both quality and speed."""
    front = pd.Series(False, index=df.index)
    for _, part in df[df["gate"] != "failed"].groupby(["machine", "group"]):
        for i, r in part.iterrows():
            dominated = ((part["quality"] >= r["quality"]) & (part["speed"] >= r["speed"]) &
                         ((part["quality"] > r["quality"]) | (part["speed"] > r["speed"]))).any()
            front[i] = not dominated
    return front


@st.cache_data(show_spinner=False)
def alert_table(version) -> pd.DataFrame:
    """Regressions, gate failures and verdict flips, computed live, open ones first, newest first."""
    def query(con):
        if con is None:
            return []
        latest, history = verdicts.compute_with_history(con, registry.load(), store_history=False)
        found = (alerts.regressions(con, alerts.Thresholds.from_pyproject())
                 + alerts.gate_and_flip_alerts(latest, history) + alerts.budget_alerts(con))
        return alerts.reviewed(found, alerts.acknowledgements(), alerts.rechecks())
    found = _read(query)
    df = pd.DataFrame([dict(kind=a.kind, status=a.status, benchmark=a.benchmark, params=a.params, machine=a.machine,
                            commit=(a.commit_hash or "")[:8], commit_date=a.commit_date, before=a.before,
                            after=a.after, change=a.change, detail=a.detail) for a in found],
                      columns=["kind", "status", "benchmark", "params", "machine", "commit", "commit_date", "before",
                               "after", "change", "detail"])
    df = df.sort_values("commit_date", ascending=False, na_position="last")
    return df.sort_values("status", key=lambda status: status != "open", kind="stable")  # open ones first


def gib(ram: str | None) -> str:
    """asv's memory (bytes, as text) in GiB; anything else as it was written."""
    try:
        return f"{int(ram) / 2 ** 30:.1f} GiB"
    except (TypeError, ValueError):
        return ram or ""


@st.cache_data(show_spinner=False)
def machines(version) -> pd.DataFrame:
    def query(con):
        if con is None:
            return pd.DataFrame()
        return con.execute("""SELECT m.machine, m.cpu, m.num_cpu, m.ram, m.os, m.arch, m.gpu, m.gpu_count,
                                     m.driver, m.cuda, m.info ->> '$.numba_vectors' AS numba_vectors,
                                     m.info ->> '$.io_uring' AS io_uring, m.libraries,
                                     count(DISTINCT r.run_id) AS runs,
                                     max(r.ingested_at) AS last_ingest
                              FROM machines m LEFT JOIN runs r USING (machine)
                              GROUP BY ALL ORDER BY m.machine""").df()
    df = _read(query)
    if not df.empty:
        df["ram"] = df["ram"].map(gib)
        libs = df.pop("libraries").map(lambda s: json.loads(s or "{}"))
        df["libraries"] = libs.map(lambda d: ", ".join(f"{k} {v}" for k, v in sorted(d.items())))
    return df


@st.cache_data(show_spinner=False)
def stale(version) -> pd.DataFrame:
    """One row per machine and reason: the papers `claimbench run --stale` would run there for it (verdicts.stale)."""
    return pd.DataFrame([dict(machine=machine, why=why, papers=", ".join(papers))
                         for machine, why, papers in verdicts.stale_by_reason(latest_verdicts(version))],
                        columns=["machine", "why", "papers"])


@st.cache_data(show_spinner=False)
def machine_speed(version) -> pd.DataFrame:
    """The machine-speed probes of every run that timed them (claimbench.machinespeed), one row per
    run, end (before or after its suites) and probe: median milliseconds of CPU per round, with its
    interval (a VM that changed state during a run shows as two ends apart)."""
    def query(con):
        if con is None:
            return []
        return con.execute("""SELECT machine, commit_hash, mode, machine_speed FROM runs
                              WHERE machine_speed IS NOT NULL ORDER BY machine""").fetchall()
    runs: dict[tuple, dict] = {}  # the suites of one `claimbench run` share one record
    for machine, commit, mode, speed in _read(query):
        for suite, record in json.loads(speed).items():
            run = runs.setdefault((machine, record.get("started"), commit, mode), {"record": record, "suites": []})
            run["suites"].append(suite)
    rows = [dict(machine=machine, started=pd.to_datetime(started), commit=commit[:8], mode=mode,
                 suites=", ".join(sorted(run["suites"])), end=end, probe=probe, ms=1000 * e.value,
                 low_ms=1000 * e.low, high_ms=1000 * e.high)
            for (machine, started, commit, mode), run in runs.items() for end in ("before", "after")
            for probe, e in machinespeed.summary(run["record"], end).items()]
    return pd.DataFrame(rows, columns=["machine", "started", "commit", "mode", "suites", "end", "probe", "ms",
                                       "low_ms", "high_ms"])
