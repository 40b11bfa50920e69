"""Write asv result files with asv's own writer: for results computed outside `asv run`
(e.g. on a device machine without asv's runner) and for tests of ingest and alerts."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

from asv.results import Results


class _RunnerResult:
    """The shape asv's Results.add_result expects from its runner: one sample per value."""

    def __init__(self, values: list[float | None]):
        self.result = values
        self.samples = [None if v is None else [v] for v in values]
        self.number = [1] * len(values)
        self.errcode, self.stderr, self.profile = 0, "", None


def write_run(results_dir: Path, machine: str, commit: str, date_ms: int,
              benchmarks: dict[str, tuple[list[str], list[list], list[float | None], str]],
              env_name: str = "existing-py", machine_info: dict | None = None) -> Path:
    """One asv results file. benchmarks: name -> (param_names, param value lists, values, unit);
    values run over the product of the parameter lists, as asv stores them."""
    res = Results({"machine": machine, "python": "3.11"}, {}, commit, date_ms, "3.11", env_name, {})
    meta_path = results_dir / "benchmarks.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"version": 2}
    for name, (names, params, values, unit) in benchmarks.items():
        reprs = [[repr(v) for v in values_] for values_ in params]
        assert len(values) == len(list(itertools.product(*reprs))), name
        res.add_result({"name": name, "version": "1", "params": reprs}, _RunnerResult(values), duration=1.0)
        meta[name] = {"name": name, "unit": unit, "param_names": names, "params": reprs, "version": "1",
                      "type": "track"}
    res.save(str(results_dir))
    machine_dir = results_dir / machine
    info = {"machine": machine, "os": "Linux", "arch": "x86_64", "cpu": "test cpu", "num_cpu": "2",
            "ram": "1GB", "version": 1, **(machine_info or {})}
    (machine_dir / "machine.json").write_text(json.dumps(info))
    meta_path.write_text(json.dumps(meta))
    return machine_dir / res._filename.split("/")[-1]
