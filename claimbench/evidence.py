"""The samples and interval behind a benchmark's number, beside asv's results.

asv stores one number per benchmark and parameter combination. A `track_*` that measures a claim
returns an `intervals.Estimate` and is decorated with `@evidence.estimate`: asv gets the value,
and the interval with its samples is appended as one JSON line to the run's evidence file
(`CLAIMBENCH_EVIDENCE`, set by `claimbench run` to `<results>/<machine>/<commit>.evidence.jsonl`).
Ingest reads it beside asv's file; the last line for a (benchmark, params) wins, so a rerun of
one benchmark at the same commit replaces its interval as asv replaces its value. Outside a
`claimbench run` (tests, a direct call) nothing is written.
"""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from .intervals import Estimate

ENV = "CLAIMBENCH_EVIDENCE"
SUFFIX = ".evidence.jsonl"


def params_key(params: dict) -> str:
    """The params text ingest stores for asv's results (sorted JSON)."""
    return json.dumps(params, sort_keys=True, default=str)


def record(benchmark: str, params: dict, estimate: Estimate, path: str | os.PathLike | None = None) -> None:
    target = path or os.environ.get(ENV)
    if not target:
        return
    line = json.dumps({"benchmark": benchmark, "params": params_key(params), **estimate.to_json()})
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    with open(target, "a") as f:
        f.write(line + "\n")


def estimate(track):
    """Decorator for a track_ method returning an Estimate: asv sees the value, the evidence file
    the interval. The benchmark's name and params are asv's: module.Class.track_name (the class of the
    instance, so a track inherited from a base class is named as asv names it), and the param_names
    zipped with the arguments after setup_cache's result."""
    module = track.__module__.rsplit(".", 1)[-1]

    @functools.wraps(track)
    def tracked(self, *args):
        result = track(self, *args)
        values = args[1:] if hasattr(self, "setup_cache") else args
        record(f"{module}.{type(self).__name__}.{track.__name__}", dict(zip(getattr(self, "param_names", ()), values)), result)
        return result.value
    return tracked


def read(path: Path) -> dict[tuple[str, str], dict]:
    """(benchmark, params) -> the last record for it in an evidence file ({} if none)."""
    out = {}
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return out
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
            out[rec["benchmark"], rec["params"]] = rec
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{path}:{n}: malformed evidence line ({e})") from None
    return out
