"""`claimbench run --serve` (what `make run` does): the leaderboard first, then the suites one at a time.

1. Ingest what is already there (the shipped reference results, this machine's earlier runs) and
   start the leaderboard: its URL is printed within seconds of the install.
2. Run the suites one at a time (the papers' suites in papers.toml's order, then the others), each
   ingested as soon as it finishes: the app shows its rows after a refresh. A suite that declares
   what it needs of the machine (`REQUIRES = ("gpu",)` in suites/gpu.py) is skipped with one line
   where the machine lacks it (asv would take minutes to skip its every row). A progress file
   beside the store says which suite runs and about how long is left (from this machine's previous
   times, else each suite's quick budget); the Claims page and the terminal show it.
3. Each suite's wall time is recorded as a result (`harness.QuickRun.track_suite_seconds`, quick
   mode) so that a suite growing past its budget shows in the alerts, and a line says so at once.
   A suite that wrote to the dataset cache while it ran (a fresh machine's first run builds the
   datasets, indexes and trained parts the later runs read) is timed under COLD_TIME_BENCHMARK
   instead, which no budget applies to; a line says so.
4. Ctrl-C stops the run and the app; every suite ingested so far stays in the store.
The app stays idle while no page is open (Streamlit reruns only for a visitor), so it does not
disturb the timings.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from . import asvfiles, ingest, inputs, localservices, metrics, report, runner, store
from .registry import REPO_ROOT, Registry

PROGRESS = "progress.json"  # beside the store
QUICK_BUDGET_S = 90  # a suite's quick mode on 2 cores, datasets cached, where the suite states none
TIME_BENCHMARK = "harness.QuickRun.track_suite_seconds"
COLD_TIME_BENCHMARK = "harness.QuickRun.track_suite_seconds_cold_cache"  # the suite built cached inputs


def suites_in_order(registry: Registry, root: Path = REPO_ROOT) -> list[str]:
    """The suite modules (those that declare INPUTS; suites/common.py is a helper), the papers' first in
    papers.toml's order."""
    names = sorted(inputs.declared(root / "suites"))
    papers = list(dict.fromkeys(p.suite for p in registry.papers if p.suite in names))
    return papers + [n for n in names if n not in papers]


def quick_budget(suite: str, root: Path = REPO_ROOT) -> float:
    """The seconds `suite` should take in quick mode on 2 cores with its datasets cached: the number its
    module assigns to QUICK_BUDGET_S, else QUICK_BUDGET_S."""
    if (found := inputs.module_literal(root / "suites" / f"{suite}.py", "QUICK_BUDGET_S")) is None:
        return QUICK_BUDGET_S
    value, line = found
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{root / 'suites' / f'{suite}.py'}:{line}: QUICK_BUDGET_S must be a positive number of "
                         "seconds")
    return float(value)


def progress_path(db=None) -> Path:
    return store.db_path(db).parent / PROGRESS


def read_progress(db=None) -> dict | None:
    """The run in progress for this store, or None (no run, or its process is gone)."""
    try:
        state = json.loads(progress_path(db).read_text())
        os.kill(state["pid"], 0)
    except (OSError, ValueError, KeyError):
        return None
    return state


def progress_text(state: dict) -> str:
    """'this machine: 4 of 14 suites measured, running ssa, about 3 min left'."""
    left = max(0, state["eta_s"] - (time.time() - state["since"]))
    when = f"about {left / 60:.0f} min left" if left >= 90 else f"about {left:.0f} s left"
    return (f"{state['machine']}: {len(state['done'])} of {state['total']} suites measured ({state['mode']} mode), "
            f"running {state['running']}, {when}")


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _ingest(paths, db, progress) -> None:
    found = [p for p in paths if Path(p).exists()]
    if found:
        rep = ingest.ingest(found, db=db)
        progress(f"claimbench: ingested {rep.summary().splitlines()[0]}")
        for path, msg in rep.errors:
            progress(f"claimbench: could not ingest {path}: {msg}")


def _record_times(results: Path, machine: str, commit: str, seconds: dict[str, float],
                  date_ms: int | None = None, cold: set[str] = frozenset()) -> None:
    """Each suite's wall time as a result of this commit, beside asv's (a results file of its own);
    the suites in `cold` (they built cached inputs) under COLD_TIME_BENCHMARK."""
    benchmarks = {}
    for name, chosen in ((TIME_BENCHMARK, sorted(set(seconds) - set(cold))), (COLD_TIME_BENCHMARK, sorted(cold))):
        if chosen:
            benchmarks[name] = (["suite"], [chosen], [seconds[s] for s in chosen], metrics.SECONDS.unit)
    asvfiles.write_run(results, machine, commit, date_ms or int(time.time() * 1000), benchmarks,
                       env_name="claimbench-suite-times", machine_info=_asv_machine(results / machine))


def _cache_files() -> dict[str, int]:
    """Every file of the dataset cache with its modification time (ns)."""
    from claimbench.datasets import vectors  # numpy and faiss: only when suites run
    root = vectors.cache_dir()
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file()} \
        if root.is_dir() else {}


def _asv_machine(machine_dir: Path) -> dict:
    try:
        return json.loads((machine_dir / "machine.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def serve_and_run(registry: Registry, quick: bool = True, machine: str | None = None, root: Path = REPO_ROOT,
                  db=None, host: str = "127.0.0.1", port: int = 8501, wait: bool = True, progress=print) -> int:
    import socket
    machine = machine or socket.gethostname()
    mode = "quick" if quick else "full"
    results = runner.results_dir(root, mode)
    _ingest([runner.results_dir(root, "full"), runner.results_dir(root, "quick"), root / runner.REFERENCE_RESULTS], db,
            progress)
    app = subprocess.Popen([sys.executable, "-m", "claimbench.cli", "app", "--db", str(store.db_path(db)),
                            "--host", host, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    progress(f"claimbench leaderboard: http://{host}:{port} (the suites run now; refresh to see new rows)")
    suites = suites_in_order(registry, root)
    skipped = runner.unrunnable(suites, root, registry)
    for suite, why in skipped.items():  # its rows would all read n/a: one line instead
        progress(runner.skipped_line(suite, why))
    suites = [suite for suite in suites if suite not in skipped]
    seconds_path = results / machine / ingest.SUITE_SECONDS
    try:
        previous = json.loads(seconds_path.read_text())
    except (OSError, json.JSONDecodeError):
        previous = {}
    taken, cold, code = {}, set(), 0
    budgets = {suite: quick_budget(suite, root) for suite in suites}
    try:
        for i, suite in enumerate(suites):
            state = dict(pid=os.getpid(), machine=machine, mode=mode, done=suites[:i], running=suite, total=len(suites),
                         since=time.time(), eta_s=sum(previous.get(s, budgets[s]) for s in suites[i:]))
            _write_json(progress_path(db), state)
            progress(f"claimbench: {progress_text(state)}")
            start, cached = time.monotonic(), _cache_files()
            code = runner.run(registry, quick=quick, machine=machine, bench=[rf"^{suite}\."], root=root) or code
            taken[suite] = time.monotonic() - start
            built = [name for name, stamp in _cache_files().items() if cached.get(name) != stamp]
            if built:
                cold.add(suite)
                progress(f"claimbench: {suite} built {len(built)} cached input(s) ({taken[suite]:.0f} s; later runs "
                         "read them), so its time is not held against the budget")
            elif quick and taken[suite] > budgets[suite]:
                progress(f"claimbench: {suite} took {taken[suite]:.0f} s in quick mode, over its {budgets[suite]:.0f} s "
                         "budget")
            _write_json(seconds_path, {**previous, **taken})
            _ingest([results], db, progress)
        if quick:
            _record_times(results, machine, runner.head_commit(root), taken, cold=cold)
            _ingest([results], db, progress)
            total = sum(taken.values())
            over = " (over the budget)" if sum(taken[s] - budgets[s] for s in taken if s not in cold) > 0 else ""
            built = f"; {len(cold)} of them built cached inputs" if cold else ""
            progress(f"claimbench: all {len(suites)} suites in {total / 60:.1f} min{over}{built}")
        progress_path(db).unlink(missing_ok=True)
        with store.connect(db) as con:
            latest, found, written = report.refresh(con, registry, root / "reports")
        progress(report.claims_table(latest))
        opened = sum(a.status == "open" for a in found)
        progress(f"claimbench: {opened} open alert(s)" if opened else "claimbench: no open regressions, gate failures "
                 "or verdict flips")
        for path in written:
            progress(f"wrote {path}")
        if wait:
            progress(f"claimbench: done; the leaderboard is still at http://{host}:{port} (Ctrl-C to stop)")
            app.wait()
        return code
    except KeyboardInterrupt:
        progress("claimbench: stopped; every suite ingested so far stays in the store")
        return 130
    finally:
        progress_path(db).unlink(missing_ok=True)
        localservices.stop(app)
