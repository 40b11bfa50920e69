"""papers.toml: every paper, its method, baselines and headline claims, as validated data."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
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
    quick_cannot_decide: str | None = None  # why the suite's quick mode runs the claim's code but cannot test it

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
class Board:
    """A task's leaderboard: methods ranked at one operating point (`where`), per machine and
    `group`. Methods are named benchmarks (`methods`: label -> benchmark) or the values of one
    benchmark's parameter (`benchmark` + `method_param`); `gated`: method (or "*") -> its gate."""
    task: str
    tab: str
    title: str
    group: str
    unit: str
    where: dict = field(default_factory=dict)
    methods: dict = field(default_factory=dict)
    benchmark: str | None = None
    method_param: str | None = None
    gated: dict = field(default_factory=dict)
    log: bool = False
    lower_is_better: bool = False

    @property
    def suite(self) -> str:
        return (self.benchmark or next(iter(self.methods.values()))).split(".")[0]


@dataclass(frozen=True)
class Tradeoff:
    """A paper's quality-vs-speed plot: one point per `point` value, faceted by `group`. With
    `method_param`, the methods are that parameter's values, each with its own quality rows."""
    quality: str
    quality_label: str
    group: str
    point: str
    speed_label: str
    methods: dict
    gated: dict = field(default_factory=dict)
    method_param: str | None = None


@dataclass(frozen=True)
class Sweep:
    """A paper's parameter sweep: each metric (benchmark prefix + name -> label) over `x`, a line per `series`."""
    title: str
    prefix: str
    x: str
    series: str
    metrics: dict
    x_order: tuple = ()


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
    tradeoff: Tradeoff | None = None
    sweep: Sweep | None = None


@dataclass(frozen=True)
class Registry:
    papers: tuple[Paper, ...]
    path: Path = field(default=DEFAULT_PAPERS)
    boards: tuple[Board, ...] = ()

    def board(self, task: str) -> Board | None:
        return next((b for b in self.boards if b.task == task), None)

    def paper(self, paper_id: str) -> Paper:
        for p in self.papers:
            if p.id == paper_id:
                return p
        known = ", ".join(p.id for p in self.papers)
        raise RegistryError(f"{self.path}: no paper with id {paper_id!r} (known: {known})")

    @property
    def claims(self) -> list[Claim]:
        return [c for p in self.papers for c in p.claims]

    def gate_of(self, benchmark: str) -> Gate:
        """The gate of the claim that `benchmark` measures (suites read their thresholds here)."""
        gates = {c.gate for c in self.claims if c.benchmark == benchmark and c.gate is not None}
        if len(gates) != 1:
            raise RegistryError(f"{self.path}: {len(gates)} gates for claims measured by {benchmark!r}; expected one")
        return gates.pop()


def load(path: str | Path | None = None) -> Registry:
    path = Path(path) if path else DEFAULT_PAPERS
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise RegistryError(f"{path}: papers file not found") from None
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
    claims = {c.key: c for p in papers for c in p.claims}
    papers = [_with_plots(paper, raw, claims, f"{path}: paper[{i}] ({paper.id})") for i, (paper, raw)
              in enumerate(zip(papers, papers_raw))]
    tasks_raw = data.get("task", [])
    if not isinstance(tasks_raw, list):
        raise RegistryError(f"{path}: task must be a list of [[task]] tables")
    boards = tuple(_board(raw, claims, f"{path}: task[{i}]") for i, raw in enumerate(tasks_raw))
    known_tasks = {p.task for p in papers}
    for board in boards:
        if board.task not in known_tasks:
            raise RegistryError(f"{path}: task {board.task!r} has a board but no paper has that task")
    return Registry(tuple(papers), path, boards)


def _gates(raw: dict, claims: dict, where: str) -> dict:
    """method -> Gate, each given as a claim key (that claim's gate) or {claim, benchmark} (the claim's
    bounds applied to another benchmark with the same parameters, e.g. a sweep's own rows)."""
    out = {}
    for method, spec in raw.items():
        at = f"{where}.gated.{method}"
        key, benchmark = (spec, None) if isinstance(spec, str) else (
            _get(spec, "claim", at, str), _get(spec, "benchmark", at, str)) if isinstance(spec, dict) else (None, None)
        if key is None:
            raise RegistryError(f"{at}: expected a claim key or {{claim, benchmark}}; got {spec!r}")
        claim = claims.get(key)
        if claim is None or claim.gate is None:
            raise RegistryError(f"{at}: {key!r} is not a claim with a gate (known: {', '.join(sorted(claims))})")
        out[method] = Gate(benchmark or claim.gate.benchmark, claim.gate.min, claim.gate.max)
    return out


def _strings(raw: dict, key: str, where: str) -> dict:
    value = _get(raw, key, where, dict, False, {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise RegistryError(f"{where}.{key}: expected a table of strings; got {value!r}")
    return dict(value)


def _board(raw, claims: dict, where: str) -> Board:
    if not isinstance(raw, dict):
        raise RegistryError(f"{where}: expected a table")
    task = _get(raw, "id", where, str)
    where = f"{where} ({task})"
    _no_unknown(raw, {"id", "tab", "title", "group", "unit", "where", "methods", "benchmark", "method_param",
                      "gated", "log", "lower_is_better"}, where)
    methods, benchmark = _strings(raw, "methods", where), _get(raw, "benchmark", where, str, False)
    method_param = _get(raw, "method_param", where, str, False)
    if bool(methods) == bool(benchmark) or bool(benchmark) != bool(method_param):
        raise RegistryError(f"{where}: name the methods' benchmarks (methods) or one benchmark and the parameter "
                            "whose values are the methods (benchmark + method_param)")
    return Board(task=task, tab=_get(raw, "tab", where, str, False, task.replace("-", " ").capitalize()),
                 title=_get(raw, "title", where, str), group=_get(raw, "group", where, str),
                 unit=_get(raw, "unit", where, str), where=_strings(raw, "where", where), methods=methods,
                 benchmark=benchmark, method_param=method_param,
                 gated=_gates(_get(raw, "gated", where, dict, False, {}), claims, where),
                 log=_get(raw, "log", where, bool, False, False),
                 lower_is_better=_get(raw, "lower_is_better", where, bool, False, False))


def _with_plots(paper: Paper, raw: dict, claims: dict, where: str) -> Paper:
    """The paper with its trade-off and sweep specs ([paper.tradeoff], [paper.sweep]) parsed."""
    tradeoff = sweep = None
    if "tradeoff" in raw:
        t, at = _get(raw, "tradeoff", where, dict), f"{where}.tradeoff"
        _no_unknown(t, {"quality", "quality_label", "group", "point", "speed_label", "methods", "gated",
                        "method_param"}, at)
        tradeoff = Tradeoff(**{k: _get(t, k, at, str) for k in ("quality", "quality_label", "group", "point",
                                                                 "speed_label")},
                            methods=_strings(t, "methods", at), gated=_gates(_get(t, "gated", at, dict, False, {}),
                                                                             claims, at),
                            method_param=_get(t, "method_param", at, str, False, None))
    if "sweep" in raw:
        w, at = _get(raw, "sweep", where, dict), f"{where}.sweep"
        _no_unknown(w, {"title", "prefix", "x", "series", "metrics", "x_order"}, at)
        sweep = Sweep(**{k: _get(w, k, at, str) for k in ("title", "prefix", "x", "series")},
                      metrics=_strings(w, "metrics", at), x_order=tuple(_get(w, "x_order", at, list, False, [])))
    return replace(paper, tradeoff=tradeoff, sweep=sweep)


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
    known = {"id", "title", "tier", "task", "baselines", "claims", "source", "suite", "method", "tradeoff", "sweep"}
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
             "substitution", "explain", "quick_cannot_decide"}
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
        quick_cannot_decide=_get(raw, "quick_cannot_decide", where, str, False),
    )


def _no_unknown(raw: dict, known: set[str], where: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RegistryError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


def unresolved(reg: Registry) -> list[str]:
    """Every name papers.toml gives that the code does not have: suites, benchmarks (claims, gates,
    explain, boards, trade-offs, sweeps), the parameters boards and plots read, and method import
    paths. Empty when everything resolves (a test holds the repository to that)."""
    import importlib

    problems = []

    def suite_class(benchmark: str, where: str):
        parts = benchmark.split(".")
        if len(parts) != 3:
            problems.append(f"{where}: {benchmark!r} is not suite.Class.method")
            return None
        try:
            module = importlib.import_module(f"claimbench.suites.{parts[0]}")
        except ImportError as e:
            problems.append(f"{where}: suite {parts[0]!r} does not import ({e})")
            return None
        cls = getattr(module, parts[1], None)
        if not isinstance(cls, type) or not callable(getattr(cls, parts[2], None)):
            problems.append(f"{where}: {benchmark!r} is not a benchmark in suites/{parts[0]}.py")
            return None
        return cls

    def params(benchmark: str, names, where: str):
        cls = suite_class(benchmark, where)
        missing = [n for n in names if cls is not None and n not in getattr(cls, "param_names", [])]
        if missing:
            problems.append(f"{where}: {benchmark!r} has no parameter(s) {', '.join(missing)}")

    for paper in reg.papers:
        where = f"paper {paper.id}"
        if paper.suite:
            try:
                importlib.import_module(f"claimbench.suites.{paper.suite}")
            except ImportError as e:
                problems.append(f"{where}: suite {paper.suite!r} does not import ({e})")
        if paper.method:
            module, _, name = paper.method.rpartition(".")
            try:
                if not hasattr(importlib.import_module(module), name):
                    problems.append(f"{where}: method {paper.method!r}: {module} has no {name}")
            except ImportError as e:
                problems.append(f"{where}: method {paper.method!r} does not import ({e})")
        for claim in paper.claims:
            named = [claim.benchmark, claim.gate.benchmark if claim.gate else None, *claim.explain]
            for benchmark in filter(None, named):
                suite_class(benchmark, f"claim {claim.key}")
        if paper.tradeoff:
            t = paper.tradeoff
            for benchmark in [t.quality, *t.methods.values(), *(g.benchmark for g in t.gated.values())]:
                params(benchmark, [t.group, t.point] + [t.method_param] * bool(t.method_param), f"{where}.tradeoff")
        if paper.sweep:
            for name in paper.sweep.metrics:
                params(paper.sweep.prefix + name, [paper.sweep.x, paper.sweep.series], f"{where}.sweep")
    for board in reg.boards:
        where = f"task {board.task}"
        names = [board.group, *board.where] + [board.method_param] * bool(board.method_param)
        for benchmark in [*board.methods.values()] + [board.benchmark] * bool(board.benchmark):
            params(benchmark, names, where)
        for gate in board.gated.values():
            suite_class(gate.benchmark, f"{where}.gated")
    return problems
