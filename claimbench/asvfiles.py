"""Write asv result files (asv's results format, version 2) without asv: for results computed
outside `asv run` (the device run on a lent GPU machine, whose image has no asv) and for tests of
ingest and alerts. Ingest reads them with asv's own reader, so every test that writes one checks
the format too. And copy a machine's runs from one results folder into another (`claimbench
publish reports/results`), merging a run at a commit the destination already holds as asv merges a
second run at one commit into its file.
"""
from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

from . import environment, evidence

API_VERSION = 2
COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b", "stats_q_25",
           "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]


def write_run(results_dir: Path, machine: str, commit: str, date_ms: int,
              benchmarks: dict[str, tuple[list[str], list[list], list[float | None], str]],
              env_name: str = "existing-py", machine_info: dict | None = None, python: str = "3.11") -> Path:
    """One asv results file, replacing any at the same machine, commit and environment.
    benchmarks: name -> (param_names, param value lists, values, unit); values run over the
    product of the parameter lists, as asv stores them."""
    meta_path = results_dir / "benchmarks.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"version": 2}
    results = {}
    for name, (names, params, values, unit) in benchmarks.items():
        reprs = [[repr(v) for v in values_] for values_ in params]
        assert len(values) == len(list(itertools.product(*reprs))), name
        results[name] = [list(values), reprs, "1", date_ms, None]  # no duration: not timed by asv
        meta[name] = {"name": name, "unit": unit, "param_names": names, "params": reprs, "version": "1",
                      "type": "track"}
    machine_dir = results_dir / machine
    machine_dir.mkdir(parents=True, exist_ok=True)
    data = {"commit_hash": commit, "env_name": env_name, "date": date_ms,
            "params": {"machine": machine, "python": python}, "python": python, "requirements": {}, "env_vars": {}, "result_columns": COLUMNS, "results": results,
            "durations": {}, "version": API_VERSION}
    path = machine_dir / f"{commit[:8]}-{env_name}.json"
    path.write_text(json.dumps(data, separators=(",", ":")))
    info = {"machine": machine, "os": "Linux", "arch": "x86_64", "cpu": "test cpu", "num_cpu": "2",
            "ram": "1GB", "version": 1, **(machine_info or {})}
    (machine_dir / "machine.json").write_text(json.dumps(info))
    meta_path.write_text(json.dumps(meta))
    return path


RUN_FILE = re.compile(r"^([0-9a-f]{8})[-.]")  # <commit8>-<env>.json, <commit8>.claimbench.json, ...
SHARED_FILES = ("machine.json", environment.SIDECAR)


def run_files(machine_dir: Path) -> dict[str, list[Path]]:
    """commit8 -> the files of that commit's run in one machine's results folder."""
    runs: dict[str, list[Path]] = {}
    for path in sorted(machine_dir.iterdir()):
        found = RUN_FILE.match(path.name)
        if found and path.is_file():
            runs.setdefault(found.group(1), []).append(path)
    return runs


def selected_runs(results_root: Path, machine: str | None = None, commit: str | None = None):
    """(machine folder, commit8, files) for each run under an asv results folder, or only one machine's
    and those of a commit (any prefix of its hash, the first 8 hex digits compared)."""
    machine_dirs = sorted(p for p in results_root.iterdir() if p.is_dir()) if results_root.is_dir() else []
    for machine_dir in (d for d in machine_dirs if not machine or d.name == machine):
        for commit8, files in run_files(machine_dir).items():
            if not commit or commit8.startswith(commit[:8]):
                yield machine_dir, commit8, files


def no_runs(verb: str, where: str, machine: str | None = None, commit: str | None = None) -> FileNotFoundError:
    """The error for a selection that found no run: 'no results to <verb> for <machine> at <commit8> under ...'."""
    wanted = " at ".join(x for x in (machine, commit and commit[:8]) if x)
    return FileNotFoundError(f"no results to {verb}{' for ' + wanted if wanted else ''} under {where}")


def asv_result(path: Path) -> dict | None:
    """The file's JSON if it is an asv result file (not a run record, evidence or the kernels' file)."""
    if path.suffix != ".json" or path.name.endswith(environment.RECORD_SUFFIX):
        return None
    data = json.loads(path.read_text())
    return data if "result_columns" in data else None


def _merge_into(source: Path, target: Path) -> None:
    """One run file into the target's of the same name, as a second run at one commit adds to it (written
    in the format of the file's writer, and not at all when nothing changes, so the same run copied
    twice leaves the target's bytes as they were)."""
    if source.name.endswith(environment.RECORD_SUFFIX):  # each suite's inputs and probes, the source's winning
        new, old = json.loads(source.read_text()), json.loads(target.read_text())
        merged = {**old, **new, "inputs": {**old.get("inputs", {}), **new.get("inputs", {})}}
        if speed := {**old.get("machine_speed", {}), **new.get("machine_speed", {})}:
            merged["machine_speed"] = speed
        text = json.dumps(merged, indent=2, sort_keys=True) + "\n"
    elif source.name.endswith(evidence.SUFFIX):  # the last record per benchmark wins, as ingest reads it
        merged = {**evidence.read(target), **evidence.read(source)}
        text = "".join(json.dumps(record) + "\n" for record in merged.values())
    elif (new := asv_result(source)) and (old := asv_result(target)):  # the source's benchmarks replace or join
        if new["result_columns"] != old["result_columns"]:
            raise ValueError(f"{source} and {target}: different asv result columns, not merged")
        old["results"].update(new["results"])
        old["durations"] = {**old.get("durations", {}), **new.get("durations", {})}
        old["date"] = max(old["date"], new["date"])
        text = json.dumps(old)  # asv's own compact form
    else:  # the kernels' file: one per run
        text = source.read_text()
    if text != target.read_text():
        target.write_text(text)


def copy_runs(source_root: Path, target_root: Path, machine: str | None = None, commit: str | None = None) -> list[str]:
    """Copy the runs under an asv results folder (or one machine's, one commit's) into another; returns
    them as `<machine>/<commit8>`. Each run's files (asv's result file, run record, evidence, kernels)
    are merged into the target's where it holds that commit already; the machine's `machine.json` and
    environment record are copied; `benchmarks.json` takes the source's entries for the benchmarks
    the copied results hold."""
    copied, benchmarks, machine_dirs = [], set(), set()
    for machine_dir, commit8, files in selected_runs(source_root, machine, commit):
        target_dir = target_root / machine_dir.name
        target_dir.mkdir(parents=True, exist_ok=True)
        for path in files:
            if (target_dir / path.name).exists():
                _merge_into(path, target_dir / path.name)
            else:
                shutil.copyfile(path, target_dir / path.name)
            benchmarks.update((asv_result(path) or {}).get("results", {}))
        copied.append(f"{machine_dir.name}/{commit8}")
        machine_dirs.add(machine_dir)
    for machine_dir in sorted(machine_dirs):
        for name in SHARED_FILES:
            if (machine_dir / name).exists():
                shutil.copyfile(machine_dir / name, target_root / machine_dir.name / name)
    if not copied:
        raise no_runs("copy", str(source_root), machine, commit)
    if benchmarks:  # (a folder holding only the kernels' files has no benchmarks.json, and needs none)
        source_meta = json.loads((source_root / "benchmarks.json").read_text())
        meta_path = target_root / "benchmarks.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"version": source_meta.get("version", 2)}
        meta.update({name: source_meta[name] for name in sorted(benchmarks) if name in source_meta})
        meta_path.write_text(json.dumps(meta, separators=(",", ":")))
    return copied
