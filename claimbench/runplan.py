"""How long each suite takes, from the durations asv records, and which stale papers fit a time budget:
what `claimbench run --stale --budget MINUTES` runs, one asv run per paper (asv saves a run's results when
it ends, so a paper that finished stays saved when a later one is cut off).

A suite's smallest piece that runs alone is a part: the benchmark classes that share one `setup_cache`
(asv computes it once for all of them). A part's duration is its setup_cache's plus its benchmarks', from
its latest full run on any machine (the newest code; machines differ less than code does), with the part's
classes read from the suite's source at that run's commit.
"""
from __future__ import annotations

import ast
import functools
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import asv.results

from . import asvfiles, runner
from .registry import REPO_ROOT, Registry

SETUP_CACHE = re.compile(r"<setup_cache (\w+):(\d+)>")  # asv's key: the suite module and the def's line
BENCHMARK_PREFIXES = ("time_", "timeraw_", "track_", "mem_", "peakmem_")


@dataclass(frozen=True)
class Part:
    """The classes of a suite that share one setup_cache, named by the class that defines it."""
    suite: str
    owner: str
    classes: tuple[str, ...]

    @property
    def pattern(self) -> str:
        """The asv --bench expression that runs this part alone."""
        return rf"^{re.escape(self.suite)}\.({'|'.join(re.escape(c) for c in self.classes)})\."


@dataclass(frozen=True)
class Measured:
    """A part's latest full run: wall seconds (setup_cache and benchmarks), where and at which commit."""
    seconds: float
    machine: str
    commit: str
    started_ms: int


def parts(source: str, suite: str) -> list[Part]:
    """The parts of a suite, from its source: each benchmark class (public, with a benchmark method of its own
    or from a class of the same module it derives from) under the nearest class of its own or its bases that
    defines setup_cache, else alone."""
    classes = {node.name: node for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}

    def lineage(name: str) -> list[ast.ClassDef]:
        node = classes[name]
        bases = [b.id for b in node.bases if isinstance(b, ast.Name) and b.id in classes and b.id != name]
        return [node] + [ancestor for base in bases for ancestor in lineage(base)]

    def methods(node: ast.ClassDef) -> set[str]:
        return {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}

    grouped: dict[str, list[str]] = {}
    for name in classes:
        line = lineage(name)
        if name.startswith("_") or not any(m.startswith(BENCHMARK_PREFIXES) for n in line for m in methods(n)):
            continue
        owner = next((n.name for n in line if "setup_cache" in methods(n)), name)
        grouped.setdefault(owner, []).append(name)
    return [Part(suite, owner, tuple(names)) for owner, names in grouped.items()]


def setup_cache_owners(source: str) -> dict[int, str]:
    """The line of each class's setup_cache def -> the class (what asv's setup_cache key names)."""
    return {f.lineno: node.name for node in ast.parse(source).body if isinstance(node, ast.ClassDef)
            for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "setup_cache"}


def suite_file(suite: str, root: Path = REPO_ROOT) -> Path:
    """A suite's module, relative to the checkout (asv's benchmark_dir)."""
    return Path(runner.asv_config(root)["benchmark_dir"]) / f"{suite}.py"


@functools.lru_cache(maxsize=None)
def _owners_at(commit: str, suite: str, root: Path) -> dict[str | int, str]:
    """At a commit, each benchmark class and each setup_cache def's line -> its part's owner; empty where git
    cannot show the suite there."""
    done = subprocess.run(["git", "show", f"{commit}:{suite_file(suite, root).as_posix()}"], cwd=root,
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {}
    return {**{c: p.owner for p in parts(done.stdout, suite) for c in p.classes}, **setup_cache_owners(done.stdout)}


def measured_parts(results_roots: list[Path], root: Path = REPO_ROOT) -> dict[tuple[str, str], Measured]:
    """(suite, owner) -> its latest full run in the asv results folders given (every machine's). Runs at a
    commit whose source git cannot show are left out: their setup_cache lines name no known class."""
    latest: dict[tuple[str, str], Measured] = {}
    for results_root in results_roots:
        for machine_dir, _, files in asvfiles.selected_runs(results_root):
            for path in files:
                if asvfiles.asv_result(path) is None:
                    continue
                run = asv.results.Results.load(str(path))
                for key, measured in _run_parts(run, machine_dir.name, root).items():
                    if key not in latest or measured.started_ms > latest[key].started_ms:
                        latest[key] = measured
    return latest


def _run_parts(run: asv.results.Results, machine: str, root: Path) -> dict[tuple[str, str], Measured]:
    seconds: dict[tuple[str, str], float] = {}
    started: dict[tuple[str, str], int] = {}
    for name, duration in run.duration.items():
        if found := SETUP_CACHE.fullmatch(name):
            suite, where = found.group(1), int(found.group(2))
        elif name.count(".") >= 2:  # suite.Class.method
            suite, where, _ = name.split(".", 2)
        else:
            continue  # <build>, and module-level benchmarks (no suite here has them)
        owner = _owners_at(run.commit_hash, suite, root).get(where)
        if owner is None or duration is None:
            continue
        seconds[suite, owner] = seconds.get((suite, owner), 0.0) + duration
        if not found:
            started[suite, owner] = max(started.get((suite, owner), 0), run.started_at.get(name) or 0)
    return {key: Measured(total, machine, run.commit_hash, started[key]) for key, total in seconds.items()
            if key in started}


@dataclass
class Estimate:
    """A paper's suite: its parts now, each part's latest full run (None where it has none)."""
    paper: str
    parts: list[tuple[Part, Measured | None]]

    @property
    def seconds(self) -> float | None:
        if not self.parts or any(m is None for _, m in self.parts):
            return None
        return sum(m.seconds for _, m in self.parts)

    def describe(self) -> str:
        if self.seconds is not None:
            commits: dict[str, list[str]] = {}
            for _, m in self.parts:
                commits.setdefault(m.machine, []).append(m.commit[:8])
            return f"about {minutes(self.seconds)} (as its latest full runs took: " + "; ".join(
                f"{machine} at {', '.join(sorted(set(found)))}" for machine, found in commits.items()) + ")"
        never = [f"{p.suite}.{p.owner}" for p, m in self.parts if m is None]
        return f"no full run of {', '.join(never) or 'any part'} recorded: no estimate"

    def split(self) -> str:
        """Its parts, each with the asv expression that runs it alone."""
        return ", ".join(f"{p.suite}.{p.owner} {minutes(m.seconds) if m else 'never run'} (--bench '{p.pattern}')"
                         for p, m in self.parts)


def estimates(registry: Registry, paper_ids: list[str], results_roots: list[Path],
              root: Path = REPO_ROOT) -> dict[str, Estimate]:
    """paper id -> its suite's estimate, from the results folders given."""
    measured = measured_parts(results_roots, root)
    out = {}
    for pid in paper_ids:
        suite = registry.paper(pid).suite
        path = root / suite_file(suite, root)
        found = parts(path.read_text(), suite) if path.exists() else []
        out[pid] = Estimate(pid, [(p, measured.get((suite, p.owner))) for p in found])
    return out


def within(budget_s: float, papers: dict[str, Estimate]) -> tuple[list[str], dict[str, str]]:
    """(the papers to run, longest first, each fitting what the earlier ones leave of the budget;
    paper -> why it is left). A paper without an estimate is left: its length is unknown."""
    chosen, left, remaining = [], {}, budget_s
    known = sorted((e for e in papers.values() if e.seconds is not None), key=lambda e: -e.seconds)
    for e in known:
        if e.seconds <= remaining:
            chosen.append(e.paper)
            remaining -= e.seconds
        else:
            left[e.paper] = (f"{e.describe()}; longer than the whole budget: its parts run alone: {e.split()}"
                             if e.seconds > budget_s else f"{e.describe()}; {minutes(remaining)} of the budget "
                                                          "left for it")
    for e in papers.values():
        if e.seconds is None:
            left[e.paper] = e.describe()
    return chosen, left


def minutes(seconds: float) -> str:
    total = round(seconds / 60)
    return f"{total // 60} h {total % 60} min" if total >= 60 else f"{total} min"


def run_each(registry: Registry, papers: list[str], found: dict[str, Estimate], machine: str,
             budget_s: float | None = None, clock=time.monotonic, after=None, commit: str | None = None) -> int:
    """One asv run per paper (claimbench.runner), longest first as chosen, each saved under `commit` (default:
    HEAD as it starts); with a budget, a paper whose estimate no longer fits what the earlier ones left is not
    started; `after(paper)`, if given, follows each paper's run. Returns the worst return code."""
    start, worst = clock(), 0
    for i, pid in enumerate(papers, 1):
        estimate = found[pid].seconds
        spent = clock() - start
        if budget_s is not None and estimate is not None and spent + estimate > budget_s:
            print(f"claimbench: not starting {pid}: {found[pid].describe()}, and {minutes(spent)} of the "
                  f"{minutes(budget_s)} budget are spent", flush=True)
            worst = max(worst, 1)
            continue
        print(f"claimbench: paper {i} of {len(papers)}: {pid}, {found[pid].describe()}", flush=True)
        worst = max(worst, runner.run(registry, [pid], machine=machine, commit=commit))
        if after:
            after(pid)
    return worst
