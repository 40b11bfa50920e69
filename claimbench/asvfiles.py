"""Write asv result files (asv's results format, version 2) without asv: for results computed
outside `asv run` (the device run on a lent GPU machine, whose image has no asv) and for tests of
ingest and alerts. Ingest reads them with asv's own reader, so every test that writes one checks
the format too.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path

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
        results[name] = [list(values), reprs, "1", date_ms, 1.0]
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
