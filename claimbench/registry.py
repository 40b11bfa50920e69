"""papers.toml: every paper, its method, baselines and headline claims, as validated data."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PAPERS = REPO_ROOT / "papers.toml"

DIRECTIONS = ("higher", "lower")
AGGREGATES = ("max", "min", "median", "mean")
TIERS = ("A", "B", "C")


class RegistryError(ValueError):
    """papers.toml is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class Gate:
    benchmark: str
    min: float | None = None
    max: float | None = None

    def passes(self, value: float | None) -> bool:
        if value is None or value != value:  # missing or NaN never passes
            return False
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def describe(self) -> str:
        bounds = [f">= {self.min:g}" if self.min is not None else "", f"<= {self.max:g}" if self.max is not None else ""]
        return f"{self.benchmark} {' and '.join(b for b in bounds if b)}"


@dataclass(frozen=True)
class Claim:
    paper_id: str
    id: str
    metric: str
    unit: str
    direction: str
    claimed_text: str
    conditions: str
    baseline: str
    claimed: tuple[float, float] | None = None  # (low, high); a single value has low == high
    benchmark: str | None = None
    gate: Gate | None = None
    aggregate: str | None = None
    neutral: float = 1.0
    tolerance: float = 0.1
    requires: tuple[str, ...] = ()
    not_testable: str | None = None
    substitution: str | None = None
    explain: tuple[str, ...] = ()  # benchmarks (same params) whose values explain the measured one

    @property
    def key(self) -> str:
        return f"{self.paper_id}/{self.id}"

    @property
    def target(self) -> float | None:
        """The weaker end of the claimed range: what must be reached to call it reproduced."""
        if self.claimed is None:
            return None
        return self.claimed[0] if self.direction == "higher" else self.claimed[1]

    @property
    def fold(self) -> str:
        """How the benchmark's parameter combinations fold into one measured number."""
        return self.aggregate or ("max" if self.direction == "higher" else "min")


@dataclass(frozen=True)
class Paper:
    id: str
    title: str
    tier: str
    task: str
    baselines: tuple[str, ...]
    claims: tuple[Claim, ...]
    source: str = ""
    suite: str | None = None
    method: str | None = None


@dataclass(frozen=True)
class Registry:
    papers: tuple[Paper, ...]
    path: Path = field(default=DEFAULT_PAPERS)

    def paper(self, paper_id: str) -> Paper:
        for p in self.papers:
            if p.id == paper_id:
                return p
        known = ", ".join(p.id for p in self.papers)
        raise RegistryError(f"{self.path}: no paper with id {paper_id!r} (known: {known})")

    @property
    def claims(self) -> list[Claim]:
        return [c for p in self.papers for c in p.claims]


def load(path: str | Path | None = None) -> Registry:
    path = Path(path) if path else DEFAULT_PAPERS
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise RegistryError(f"{path}: file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise RegistryError(f"{path}: not valid TOML: {e}") from None
    papers_raw = data.get("paper")
    if not isinstance(papers_raw, list) or not papers_raw:
        raise RegistryError(f"{path}: needs at least one [[paper]] table")
    papers, seen = [], set()
    for i, raw in enumerate(papers_raw):
        paper = _paper(raw, f"{path}: paper[{i}]")
        if paper.id in seen:
            raise RegistryError(f"{path}: paper[{i}].id: duplicate id {paper.id!r}")
        seen.add(paper.id)
        papers.append(paper)
    return Registry(tuple(papers), path)


def _get(raw: dict, key: str, where: str, kind, required: bool = True, default=None):
    if key not in raw:
        if required:
            raise RegistryError(f"{where}.{key}: missing")
        return default
    value = raw[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise RegistryError(f"{where}.{key}: expected {name}, got {type(value).__name__} {value!r}")
    return value


def _choice(raw: dict, key: str, where: str, choices, required=True, default=None):
    value = _get(raw, key, where, str, required, default)
    if value is not None and value not in choices:
        raise RegistryError(f"{where}.{key}: must be one of {', '.join(choices)}; got {value!r}")
    return value


def _paper(raw, where: str) -> Paper:
    if not isinstance(raw, dict):
        raise RegistryError(f"{where}: expected a table")
    pid = _get(raw, "id", where, str)
    where = f"{where} ({pid})"
    known = {"id", "title", "tier", "task", "baselines", "claims", "source", "suite", "method"}
    _no_unknown(raw, known, where)
    claims_raw = _get(raw, "claims", where, list)
    if not claims_raw:
        raise RegistryError(f"{where}.claims: a paper needs at least one headline claim")
    claims, seen = [], set()
    for j, c in enumerate(claims_raw):
        claim = _claim(c, pid, f"{where}.claims[{j}]")
        if claim.id in seen:
            raise RegistryError(f"{where}.claims[{j}].id: duplicate id {claim.id!r}")
        seen.add(claim.id)
        claims.append(claim)
    baselines = _get(raw, "baselines", where, list)
    return Paper(
        id=pid,
        title=_get(raw, "title", where, str),
        tier=_choice(raw, "tier", where, TIERS),
        task=_get(raw, "task", where, str),
        baselines=tuple(str(b) for b in baselines),
        claims=tuple(claims),
        source=_get(raw, "source", where, str, False, ""),
        suite=_get(raw, "suite", where, str, False),
        method=_get(raw, "method", where, str, False),
    )


def _claim(raw, paper_id: str, where: str) -> Claim:
    if not isinstance(raw, dict):
        raise RegistryError(f"{where}: expected a table")
    known = {"id", "metric", "unit", "direction", "claimed", "claimed_text", "conditions", "baseline",
             "benchmark", "gate", "aggregate", "neutral", "tolerance", "requires", "not_testable",
             "substitution", "explain"}
    _no_unknown(raw, known, where)
    claimed = raw.get("claimed")
    if claimed is not None:
        if isinstance(claimed, (int, float)) and not isinstance(claimed, bool):
            claimed = (float(claimed), float(claimed))
        elif (isinstance(claimed, list) and len(claimed) == 2
              and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in claimed)):
            claimed = (float(min(claimed)), float(max(claimed)))
        else:
            raise RegistryError(f"{where}.claimed: expected a number or [low, high]; got {claimed!r}")
    gate = None
    if "gate" in raw:
        g = _get(raw, "gate", where, dict)
        _no_unknown(g, {"benchmark", "min", "max"}, f"{where}.gate")
        gate = Gate(_get(g, "benchmark", f"{where}.gate", str),
                    _get(g, "min", f"{where}.gate", float, False),
                    _get(g, "max", f"{where}.gate", float, False))
        if gate.min is None and gate.max is None:
            raise RegistryError(f"{where}.gate: needs min or max")
    tolerance = _get(raw, "tolerance", where, float, False, 0.1)
    if not 0 <= tolerance < 1:
        raise RegistryError(f"{where}.tolerance: must be in [0, 1); got {tolerance}")
    requires = _get(raw, "requires", where, list, False, [])
    explain = _get(raw, "explain", where, list, False, [])
    if not all(isinstance(b, str) for b in explain):
        raise RegistryError(f"{where}.explain: expected a list of benchmark names; got {explain!r}")
    return Claim(
        paper_id=paper_id,
        id=_get(raw, "id", where, str),
        metric=_get(raw, "metric", where, str),
        unit=_get(raw, "unit", where, str),
        direction=_choice(raw, "direction", where, DIRECTIONS),
        claimed_text=_get(raw, "claimed_text", where, str),
        conditions=_get(raw, "conditions", where, str),
        baseline=_get(raw, "baseline", where, str),
        claimed=claimed,
        benchmark=_get(raw, "benchmark", where, str, False),
        gate=gate,
        aggregate=_choice(raw, "aggregate", where, AGGREGATES, False),
        neutral=_get(raw, "neutral", where, float, False, 1.0),
        tolerance=tolerance,
        requires=tuple(str(r) for r in requires),
        not_testable=_get(raw, "not_testable", where, str, False),
        substitution=_get(raw, "substitution", where, str, False),
        explain=tuple(explain),
    )


def _no_unknown(raw: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RegistryError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
