"""`claimbench ingest`: asv result files (read with asv's own reader) and pytest-benchmark JSON
into the DuckDB store.

Idempotent: a run is identified by (source, machine, commit, environment, mode); a file whose
content is unchanged (with its run record and evidence beside it) adds nothing, a changed one
replaces that run's rows. Two different copies of one run (two files in a batch, or a file and what
the store holds from elsewhere) are a conflict: the one measured later is kept and the conflict
reported. Atomic per batch: every good file lands in one transaction or none does. A bad file is
named and skipped; the others land. An s3:// URL is read through claimbench.objectstore.

Beside an asv results file, `claimbench run` leaves the run record (`<commit>.claimbench.json`:
mode, each suite's input digests) and the evidence (`<commit>.evidence.jsonl`: each claim's
interval and samples). A file without them (older runs, other tools) is ingested all the same: mode
and inputs 'unrecorded', no intervals. asv's own timing statistics give time_ benchmarks a 99%
interval (ci_99_a, ci_99_b).
"""
from __future__ import annotations

import ast
import hashlib
import itertools
import json
import math
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import asv.results
import pyarrow as pa

from . import environment, evidence, inputs, intervals, metrics, objectstore, store

SUITE_SECONDS = "claimbench-suite-seconds.json"  # beside a machine's results: each suite's last wall time
NOT_RESULTS = {"machine.json", "benchmarks.json", environment.SIDECAR, SUITE_SECONDS}


def _is_results(path: Path) -> bool:
    return path.name not in NOT_RESULTS and not path.name.endswith(environment.RECORD_SUFFIX)


@dataclass
class ParsedRun:
    path: Path
    sha: str
    run: dict
    machine: dict
    rows: list[tuple]  # (benchmark, params, value, status, unit, direction, stats, samples, low, high, interval)
    measured_at: datetime | None = None  # when its last benchmark ran: of two copies of a run, the newer is kept


@dataclass
class IngestReport:
    files: int = 0
    added: int = 0
    replaced: int = 0
    unchanged: int = 0
    rows: int = 0
    errors: list[tuple[Path, str]] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors

    def summary(self) -> str:
        text = (f"{self.files} file(s): {self.added} run(s) added, {self.replaced} replaced, "
                f"{self.unchanged} unchanged; {self.rows} result row(s) written")
        if not self.files:
            text += ("\n  no result files there: asv saves them as <machine>/<commit>-<env>.json under .asv/results "
                     "(full runs) and .asv/results-quick; the shipped reference results are in reports/results")
        for msg in self.conflicts:
            text += f"\n  conflict: {msg}"
        for path, msg in self.errors:
            text += f"\n  error: {path}: {msg}"
        return text


def find_files(paths) -> list[Path]:
    found = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or directory")
        if p.is_dir():
            found += sorted(f for f in p.rglob("*.json") if _is_results(f))
        elif _is_results(p):  # asv's metadata files and claimbench's run records are read beside the results
            found.append(p)
    return found


def ingest(paths, db=None, wait_s: float = 30.0, endpoint_url: str | None = None) -> IngestReport:
    """Local files and folders, and s3:// prefixes (fetched whole before anything is written)."""
    report = IngestReport()
    parsed = []
    with tempfile.TemporaryDirectory(prefix="claimbench-fetch-") as scratch:
        for path, shown in _sources(paths, Path(scratch), endpoint_url):
            report.files += 1
            try:
                run = parse(path)
                run.path = shown
                parsed.append(run)
            except Exception as e:  # noqa: BLE001 - any failure names the file and skips it
                report.errors.append((shown, _reason(e)))
    parsed = _newest_copies(parsed, report)
    if not parsed:
        return report
    with store.connect(db, wait_s=wait_s) as con:
        con.execute("BEGIN")
        try:
            for run in parsed:
                _write(con, run, report)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return report


def _sources(paths, scratch: Path, endpoint_url: str | None) -> list[tuple[Path, str | Path]]:
    """(local file, the name to report and store) of every results file under the paths."""
    local = [p for p in paths if not objectstore.is_url(p)]
    found = [(f, f) for f in find_files(local)]
    for i, url in enumerate(p for p in paths if objectstore.is_url(p)):
        mirror = scratch / str(i)
        objectstore.fetch(url, mirror, endpoint_url=endpoint_url)
        found += [(f, f"{url.rstrip('/')}/{f.relative_to(mirror).as_posix()}") for f in find_files([mirror])]
    return found


def _newest_copies(parsed: list[ParsedRun], report: IngestReport) -> list[ParsedRun]:
    """One copy per run: of two that differ, the one measured later (the other reported as a conflict)."""
    kept: dict[str, ParsedRun] = {}
    for run in parsed:
        rid = run_id(run.run)
        other = kept.get(rid)
        if other is None or other.sha == run.sha:
            kept.setdefault(rid, run)
            continue
        newer, older = (run, other) if _later(run.measured_at, other.measured_at) else (other, run)
        kept[rid] = newer
        report.conflicts.append(f"{_describe(run.run)}: {newer.path} and {older.path} differ; kept {newer.path} "
                                f"(measured {_when(newer.measured_at)}, the other {_when(older.measured_at)})")
    return list(kept.values())


def _later(a: datetime | None, b: datetime | None) -> bool:
    """a is at least as new as b (an unknown time counts as oldest)."""
    return b is None or (a is not None and a >= b)


def _naive_utc(moment: datetime | None) -> datetime | None:
    """The store's TIMESTAMP columns hold UTC without a zone."""
    return moment.astimezone(timezone.utc).replace(tzinfo=None) if moment else None


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC") if moment else "at an unrecorded time"


def _describe(run: dict) -> str:
    return f"{run['machine']} at {str(run['commit_hash'])[:8]} ({run['mode']})"


def _reason(e: Exception) -> str:
    msg = str(e).strip() or type(e).__name__
    return msg.splitlines()[0] if len(msg) < 400 else msg[:400] + "..."


def parse(path: Path) -> ParsedRun:
    raw = path.read_bytes()
    sha = hashlib.sha256(raw).hexdigest()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON (truncated?): {e}") from None
    if not isinstance(data, dict):
        raise ValueError("not an asv results file or pytest-benchmark JSON")
    if "benchmarks" in data and "machine_info" in data:
        return _parse_pytest_benchmark(path, sha, data)
    if "result_columns" in data or "version" in data and "commit_hash" in data:
        return _parse_asv(path, sha, data)
    raise ValueError("not an asv results file or pytest-benchmark JSON")


def _benchmarks_meta(path: Path) -> dict:
    """asv's benchmarks.json (units, parameter names), in the results root above the machine dir."""
    for parent in path.parents[:3]:
        meta = parent / "benchmarks.json"
        if meta.exists():
            try:
                return json.loads(meta.read_text())
            except json.JSONDecodeError:
                return {}
    return {}


def _param_value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _asv_interval(benchmark: str, stat: dict | None) -> tuple[float | None, float | None, str | None]:
    """asv's own 99% interval of a timing it measured (time_, mem_, peakmem_), where it is finite
    (asv also computes stats for a track_'s single value: those say nothing)."""
    if not benchmark.rsplit(".", 1)[-1].startswith(("time_", "mem_", "peakmem_")) or not stat:
        return None, None, None
    low, high = stat.get("ci_99_a"), stat.get("ci_99_b")
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return None, None, None
    return float(low), float(high), json.dumps({"method": "asv ci_99", "confidence": 0.99, "n": stat.get("repeat")})


def _interval(record: dict | None) -> tuple[float | None, float | None, str | None, list | None]:
    if not record:
        return None, None, None, None
    meta = {k: record.get(k) for k in ("method", "n", "min_n", "confidence")}
    return record.get("low"), record.get("high"), json.dumps(meta), record.get("samples") or None


def _started(data: dict) -> datetime | None:
    """When the last benchmark of an asv results file (its JSON) started (asv's started_at column, ms)."""
    try:
        column = data["result_columns"].index("started_at")
        stamps = [row[column] for row in data["results"].values() if len(row) > column and row[column]]
    except (KeyError, ValueError, TypeError, AttributeError):
        return None
    return datetime.fromtimestamp(max(stamps) / 1000, timezone.utc) if stamps else None


def _parse_asv(path: Path, sha: str, data: dict) -> ParsedRun:
    res = asv.results.Results.load(str(path))  # asv's own reader; raises on wrong api version
    machine_name = res.params.get("machine")
    if not machine_name or not res.commit_hash:
        raise ValueError("asv results without machine name or commit hash")
    meta = _benchmarks_meta(path)
    record_path = path.parent / f"{res.commit_hash[:8]}{environment.RECORD_SUFFIX}"
    evidence_path = path.parent / f"{res.commit_hash[:8]}{evidence.SUFFIX}"
    record = environment.read_run_record(record_path)
    found = evidence.read(evidence_path)
    sha = hashlib.sha256(b"".join(f.read_bytes() for f in (path, record_path, evidence_path) if f.exists())).hexdigest()
    rows = []
    for key in sorted(res.get_all_result_keys()):
        params = res.get_result_params(key) or []
        decoded = list(itertools.product(*[[_param_value(v) for v in values] for values in params]))
        values = res.get_result_value(key, params)
        stats = res.get_result_stats(key, params) or [None] * len(decoded)
        samples = res.get_result_samples(key, params) or [None] * len(decoded)
        if not isinstance(values, list) or len(values) != len(decoded):
            raise ValueError(f"benchmark {key}: {len(decoded)} parameter combinations but values {values!r}")
        bmeta = meta.get(key, {})
        names = bmeta.get("param_names") or [f"param{i}" for i in range(len(params))]
        unit = bmeta.get("unit") or ("seconds" if key.rsplit(".", 1)[-1].startswith("time_") else None)
        direction = metrics.direction(key, unit)
        for combo, value, stat, sample in zip(decoded, values, stats, samples):
            pdict = json.dumps(dict(zip(names, combo)), sort_keys=True, default=str)
            if value is None:
                status, value = "failed", None
            elif isinstance(value, float) and math.isnan(value):
                status, value = "skipped", None
            else:
                status, value = "ok", float(value)
            low, high, interval, own_samples = _interval(found.get((key, pdict)) if status == "ok" else None)
            if interval is None and status == "ok":
                low, high, interval = _asv_interval(key, stat)
            samples_ = own_samples or ([float(s) for s in sample] if sample else None)
            rows.append((key, pdict, value, status, unit, direction, json.dumps(stat) if stat else None,
                         samples_, low, high, interval))
    machine_dir = path.parent
    machine = _read_json(machine_dir / "machine.json") or {"machine": machine_name}
    env = _read_json(machine_dir / environment.SIDECAR) or {}
    date = datetime.fromtimestamp(res.date / 1000, timezone.utc) if res.date else None
    run = dict(machine=machine_name, commit_hash=res.commit_hash, commit_date=date,
               env_name=res.env_name, python=res.params.get("python"), source="asv",
               mode=record.get("mode", inputs.UNRECORDED), inputs=json.dumps(record.get("inputs") or {}),
               machine_speed=json.dumps(record["machine_speed"]) if record.get("machine_speed") else None)
    return ParsedRun(path, sha, run, _machine_record(machine_name, machine, env), rows, _started(data))


def _parse_pytest_benchmark(path: Path, sha: str, data: dict) -> ParsedRun:
    """pytest-benchmark JSON: one row per benchmark (its median, seconds, lower is better; with the
    rounds' times saved, their order-statistic interval). `claimbench kernels` adds a "claimbench"
    field with the run's mode and input digests; other files are ingested as unrecorded."""
    mi = data.get("machine_info") or {}
    ci = data.get("commit_info") or {}
    record = data.get("claimbench") or {}
    machine_name = mi.get("node") or "unknown"
    benches = data["benchmarks"]
    if not isinstance(benches, list):
        raise ValueError("pytest-benchmark JSON: 'benchmarks' is not a list")
    rows = []
    for i, b in enumerate(benches):
        try:
            name, st = "pytest:" + b["fullname"], b["stats"]
            params = json.dumps(b.get("params") or {}, sort_keys=True, default=str)
            stats = {k: st[k] for k in ("min", "max", "mean", "stddev", "q1", "q3", "rounds") if k in st}
            samples = [float(x) for x in st["data"]] if st.get("data") else None
            interval = intervals.median_of(samples) if samples else None
            rows.append((name, params, float(st["median"]), "ok", metrics.SECONDS.unit, "lower", json.dumps(stats),
                         samples, *((interval.low, interval.high, json.dumps(
                             {"method": interval.method, "n": interval.n, "min_n": interval.min_n,
                              "confidence": interval.confidence})) if interval else (None, None, None))))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"pytest-benchmark JSON: benchmarks[{i}] malformed ({e!r})") from None
    when = ci.get("time") or data.get("datetime")
    date = datetime.fromisoformat(when) if when else None
    if date is not None and date.tzinfo is None:
        date = date.replace(tzinfo=timezone.utc)
    cpu = mi.get("cpu") or {}
    machine = {"machine": machine_name, "os": f"{mi.get('system', '')} {mi.get('release', '')}".strip(),
               "arch": mi.get("machine"), "cpu": cpu.get("brand_raw"), "num_cpu": cpu.get("count")}
    run = dict(machine=machine_name, commit_hash=ci.get("id") or "unknown", commit_date=date,
               env_name=f"pytest-benchmark-{mi.get('python_version', '')}",
               python=mi.get("python_version"), source="pytest-benchmark",
               mode=record.get("mode", inputs.UNRECORDED), inputs=json.dumps(record.get("inputs") or {}))
    measured = datetime.fromisoformat(data["datetime"]) if data.get("datetime") else None
    if measured is not None and measured.tzinfo is None:
        measured = measured.replace(tzinfo=timezone.utc)
    return ParsedRun(path, sha, run, _machine_record(machine_name, machine, {}), rows, measured)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _machine_record(name: str, machine: dict, env: dict) -> dict:
    def as_int(v):
        try:
            return int(v)
        except (TypeError, ValueError):
            return None
    return dict(machine=name, os=machine.get("os"), arch=machine.get("arch"), cpu=machine.get("cpu"),
                num_cpu=as_int(machine.get("num_cpu")), ram=str(machine.get("ram") or ""),
                gpu=env.get("gpu"), gpu_count=as_int(env.get("gpu_count")) or 0,
                driver=env.get("driver"), cuda=env.get("cuda"),
                libraries=json.dumps(env.get("libraries") or {}), info=json.dumps({**machine, **env}))


def run_id(run: dict) -> str:
    ident = "|".join(str(run[k]) for k in ("source", "machine", "commit_hash", "env_name", "mode"))
    return hashlib.sha1(ident.encode()).hexdigest()[:16]


RESULT_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("benchmark", pa.string()), ("params", pa.string()), ("value", pa.float64()),
    ("status", pa.string()), ("unit", pa.string()), ("direction", pa.string()), ("stats", pa.string()),
    ("samples", pa.list_(pa.float64())), ("low", pa.float64()), ("high", pa.float64()), ("interval", pa.string()),
])


def _write(con, parsed: ParsedRun, report: IngestReport) -> None:
    rid = run_id(parsed.run)
    old = con.execute("SELECT content_sha, source_path, measured_at FROM runs WHERE run_id = ?", [rid]).fetchone()
    if old and old[0] == parsed.sha:
        report.unchanged += 1
        return
    if old and old[1] != str(parsed.path):  # another copy of this run: the one measured later stays
        stored = old[2].replace(tzinfo=timezone.utc) if old[2] is not None else None
        keep_stored = not _later(parsed.measured_at, stored)
        kept, dropped = (old[1], parsed.path) if keep_stored else (parsed.path, old[1])
        report.conflicts.append(f"{_describe(parsed.run)}: {parsed.path} differs from the stored copy from {old[1]}; "
                                f"kept {kept} (the newer), not {dropped}")
        if keep_stored:
            report.unchanged += 1
            return
    m = parsed.machine
    known = con.execute("SELECT gpu, libraries FROM machines WHERE machine = ?", [m["machine"]]).fetchone()
    if known and m["libraries"] == "{}" and m["gpu"] is None:  # keep what a richer record said
        m = {**m, "gpu": known[0], "libraries": known[1]}
    con.execute("INSERT OR REPLACE INTO machines VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, now())",
                [m["machine"], m["os"], m["arch"], m["cpu"], m["num_cpu"], m["ram"], m["gpu"],
                 m["gpu_count"], m["driver"], m["cuda"], m["libraries"], m["info"]])
    con.execute("DELETE FROM results WHERE run_id = ?", [rid])
    r = parsed.run
    con.execute("INSERT OR REPLACE INTO runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, now(), ?, ?, ?, ?)",
                [rid, r["machine"], r["commit_hash"], r["commit_date"], r["env_name"], r["python"],
                 r["source"], str(parsed.path), parsed.sha, r["mode"], r["inputs"], _naive_utc(parsed.measured_at),
                 r.get("machine_speed")])
    if parsed.rows:
        cols = list(zip(*parsed.rows))
        batch = pa.Table.from_arrays([pa.array([rid] * len(parsed.rows))] + [pa.array(c) for c in cols],
                                     schema=RESULT_SCHEMA)
        con.register("incoming_batch", batch)
        con.execute("INSERT INTO results SELECT * FROM incoming_batch")
        con.unregister("incoming_batch")
    report.rows += len(parsed.rows)
    if old:
        report.replaced += 1
    else:
        report.added += 1
