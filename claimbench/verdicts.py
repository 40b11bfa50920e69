"""Verdicts: each claim of papers.toml against what each machine measured.

reproduced      the measured value reaches the claim (the weaker end of a range), within `tolerance`
                of the claimed gain over `neutral` (10%: a claimed 1.14x needs 1.126x, -27.7% needs -24.9%)
partly          better than the baseline (past `neutral`), short of the claim
not reproduced  no better than the baseline
gate failed     the method did not pass its quality gate, so its ratio does not count
not testable    the machine lacks what the claim needs (a GPU, TensorRT), or nothing offline can
                measure it (the reason says which)
not measured    no benchmark yet, or no result from this machine
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field

from .environment import capabilities
from .registry import Claim, Registry

REPRODUCED = "reproduced"
PARTLY = "partly"
NOT_REPRODUCED = "not reproduced"
GATE_FAILED = "gate failed"
NOT_TESTABLE = "not testable here"
NOT_MEASURED = "not measured yet"
VERDICTS = (REPRODUCED, PARTLY, NOT_REPRODUCED, GATE_FAILED, NOT_TESTABLE, NOT_MEASURED)

REQUIREMENT_TEXT = {"gpu": "needs a GPU", "tensorrt": "needs TensorRT (not installable here)"}
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


def judge(claim: Claim, measured: dict[str, float | None] | None, gate_values: dict[str, float | None] | None = None,
          caps: set[str] | frozenset = frozenset(), machine: str | None = None,
          explain_values: dict[str, dict[str, float | None]] | None = None) -> Verdict:
    """The verdict for one claim on one machine and commit.

    measured: params (JSON text) -> value (None = the benchmark failed for that combination),
    or None when the machine has no result for the claim's benchmark.
    gate_values: the gate benchmark's values by the same params.
    explain_values: per benchmark of claim.explain, its values by the same params: shown beside
    every combination, and those of the combination that decides the verdict in its reason.
    """
    missing = [r for r in claim.requires if r not in caps]
    if not measured:
        if missing:
            return Verdict(claim, machine, NOT_TESTABLE, reason="; ".join(REQUIREMENT_TEXT.get(r, f"needs {r}") for r in missing))
        if claim.not_testable:
            return Verdict(claim, machine, NOT_TESTABLE, reason=claim.not_testable)
        reason = "no benchmark yet" if not claim.benchmark else "no result from this machine yet"
        return Verdict(claim, machine, NOT_MEASURED, reason=reason)

    detail, passing = [], []
    for params, value in sorted(measured.items()):
        entry = {"params": json.loads(params), "value": value}
        if claim.explain:
            entry["explain"] = {explain_label(b): (explain_values or {}).get(b, {}).get(params) for b in claim.explain}
        if claim.gate is not None:
            gv = (gate_values or {}).get(params)
            entry["gate_value"] = gv
            entry["gate_passed"] = claim.gate.passes(gv)
            if not entry["gate_passed"]:
                detail.append(entry)
                continue
        if value is not None:
            passing.append(value)
        detail.append(entry)

    if not any(e["value"] is not None or e.get("gate_value") is not None for e in detail):
        return Verdict(claim, machine, NOT_MEASURED, gate="not measured" if claim.gate else "none", detail=detail,
                       reason="the benchmark failed on this machine (see the asv log)")
    gate = "none"
    if claim.gate is not None:
        passed = sum(e["gate_passed"] for e in detail)
        gate = "passed" if passed == len(detail) else "failed" if passed == 0 else "partly"
        if passed == 0:
            return Verdict(claim, machine, GATE_FAILED, gate=gate, detail=detail,
                           reason=f"gate {claim.gate.describe()} failed on every combination")
    if not passing:
        return Verdict(claim, machine, NOT_MEASURED, gate=gate, detail=detail,
                       reason="the benchmark failed on this machine (see the asv log)")

    value = _FOLD[claim.fold](passing)
    better = value > claim.neutral if claim.direction == "higher" else value < claim.neutral
    target = claim.target
    if target is None:
        verdict = REPRODUCED if better else NOT_REPRODUCED
        reason = f"{'better' if better else 'no better'} than the baseline ({claim.neutral:g})"
    else:
        slack = claim.tolerance * abs(target - claim.neutral)  # slack on the claimed gain, not the raw value
        def reaches(v):
            return v >= target - slack if claim.direction == "higher" else v <= target + slack
        verdict = REPRODUCED if reaches(value) else PARTLY if better else NOT_REPRODUCED
        reason = f"{claim.fold} over {len(passing)} combination(s) = {value:.4g} {claim.unit} vs claimed {claim.claimed_text}"
        if len(passing) > 1:
            reason += f"; {sum(map(reaches, passing))} of {len(passing)} reach it"
        reason += _explained(claim, detail, value)
    if gate == "partly":
        reason += f"; {sum(not e['gate_passed'] for e in detail)} combination(s) failed the gate and were excluded"
    return Verdict(claim, machine, verdict, value, gate, reason, detail=detail)


def explain_label(benchmark: str) -> str:
    """'lychee.ClaimSpeedup.track_pruned_fraction' -> 'pruned fraction'."""
    return benchmark.rsplit(".", 1)[-1].removeprefix("track_").replace("_", " ")


def _explained(claim: Claim, detail: list[dict], value: float) -> str:
    """'; at dataset=glove: pruned fraction 0.65, ...' for the combination whose value decided."""
    deciding = next((e for e in detail if e["value"] == value and e.get("gate_passed", True)), None)
    if deciding is None or not deciding.get("explain"):
        return ""
    where = ", ".join(f"{k}={x}" for k, x in deciding["params"].items())
    values = ", ".join(f"{k} {x:.3g}" for k, x in deciding["explain"].items() if x is not None)
    return f"; at {where}: {values}" if values else ""


def _series(con, benchmark: str) -> dict[tuple[str, str], dict]:
    """(machine, commit) -> {'date': ..., 'values': {params: value}} for one benchmark."""
    rows = con.execute(
        """SELECT r.machine, r.commit_hash, r.commit_date, x.params, x.value
           FROM results x JOIN runs r USING (run_id) WHERE x.benchmark = ? AND x.status != 'skipped'
           ORDER BY r.commit_date NULLS FIRST, r.ingested_at""", [benchmark]).fetchall()
    out: dict[tuple[str, str], dict] = {}
    for machine, commit, date, params, value in rows:
        entry = out.setdefault((machine, commit), {"date": date, "values": {}})
        entry["values"][params] = value
    return out


def machines(con) -> dict[str, set[str]]:
    rows = con.execute("SELECT machine, gpu_count, libraries FROM machines ORDER BY machine").fetchall()
    return {m: capabilities({"gpu_count": g, "libraries": json.loads(libs or "{}")}) for m, g, libs in rows}


def compute(con, registry: Registry, store_history: bool = True) -> list[Verdict]:
    """Latest verdict per (claim, machine); with store_history, every commit's verdict is upserted."""
    known = machines(con) if con is not None else {}
    latest: list[Verdict] = []
    history: list[Verdict] = []
    for claim in registry.claims:
        series = _series(con, claim.benchmark) if (con is not None and claim.benchmark) else {}
        gates = _series(con, claim.gate.benchmark) if (series and claim.gate) else {}
        explains = {b: _series(con, b) for b in claim.explain} if series else {}
        for machine, caps in (known.items() or [(None, set())]):
            commits = [(c, e) for (m, c), e in series.items() if m == machine]
            if not commits:
                latest.append(judge(claim, None, caps=caps, machine=machine))
                continue
            for commit, entry in commits:
                gate_entry = gates.get((machine, commit), {}).get("values")
                explain = {b: e.get((machine, commit), {}).get("values", {}) for b, e in explains.items()}
                v = judge(claim, entry["values"], gate_entry, caps, machine, explain)
                v.commit_hash, v.commit_date = commit, entry["date"]
                history.append(v)
            latest.append(history[-1])
    if store_history and history and not _read_only(con):
        _store(con, history)
    return latest


def _read_only(con) -> bool:
    try:
        return con.execute("SELECT current_setting('access_mode')").fetchone()[0] == "read_only"
    except Exception:  # noqa: BLE001
        return False


def _store(con, history: list[Verdict]) -> None:
    if not history:
        return
    con.executemany(
        "INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, now())",
        [[v.claim.key, v.machine, v.commit_hash, v.commit_date, v.verdict, v.measured, v.gate, v.reason,
          json.dumps(v.detail, default=str)] for v in history])


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


def flips(con) -> list[dict]:
    """Claims reproduced at an earlier commit on a machine and not at its latest commit."""
    rows = con.execute(
        """SELECT claim_key, machine, commit_hash, commit_date, verdict FROM verdicts
           ORDER BY claim_key, machine, commit_date NULLS FIRST, computed_at""").fetchall()
    history: dict[tuple, list] = {}
    for claim_key, machine, commit, date, verdict in rows:
        history.setdefault((claim_key, machine), []).append((commit, date, verdict))
    out = []
    for (claim_key, machine), seq in history.items():
        commit, date, verdict = seq[-1]
        last_good = [c for c, _, v in seq[:-1] if v == REPRODUCED]
        if verdict != REPRODUCED and last_good:
            out.append(dict(claim_key=claim_key, machine=machine, commit_hash=commit, commit_date=date,
                            before=REPRODUCED, after=verdict, before_commit=last_good[-1]))
    return out
