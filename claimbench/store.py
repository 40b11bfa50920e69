"""The DuckDB result store: schema, versioning and short-lived connections that retry on the lock.

DuckDB lets one process write at a time, and a read-only opener conflicts with a writer too, so
every caller opens a connection for one unit of work and closes it (`with connect(...) as con`).
"""
from __future__ import annotations

import os
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import duckdb

SCHEMA_VERSION = 4  # 2: runs carry mode and input digests, results their interval; 3: runs their measurement
# time; 4: runs their machine-speed probes
ENV_DB = "CLAIMBENCH_DB"
DEFAULT_DB = Path(".claimbench") / "claimbench.duckdb"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS machines (
    machine TEXT PRIMARY KEY, os TEXT, arch TEXT, cpu TEXT, num_cpu INTEGER, ram TEXT,
    gpu TEXT, gpu_count INTEGER, driver TEXT, cuda TEXT, libraries JSON, info JSON,
    updated_at TIMESTAMP);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, machine TEXT, commit_hash TEXT, commit_date TIMESTAMP,
    env_name TEXT, python TEXT, source TEXT, source_path TEXT, content_sha TEXT,
    ingested_at TIMESTAMP, mode TEXT, inputs JSON, measured_at TIMESTAMP, machine_speed JSON);
CREATE TABLE IF NOT EXISTS results (
    run_id TEXT, benchmark TEXT, params TEXT, value DOUBLE, status TEXT, unit TEXT,
    direction TEXT, stats JSON, samples DOUBLE[], low DOUBLE, high DOUBLE, interval JSON);
CREATE TABLE IF NOT EXISTS papers (
    paper_id TEXT PRIMARY KEY, title TEXT, tier TEXT, task TEXT, suite TEXT, method TEXT,
    baselines TEXT);
CREATE TABLE IF NOT EXISTS claims (
    claim_key TEXT PRIMARY KEY, paper_id TEXT, claim_id TEXT, metric TEXT, unit TEXT,
    direction TEXT, claimed_low DOUBLE, claimed_high DOUBLE, claimed_text TEXT,
    conditions TEXT, baseline TEXT, benchmark TEXT, gate TEXT, requires TEXT,
    not_testable TEXT, substitution TEXT);
CREATE TABLE IF NOT EXISTS verdicts (
    claim_key TEXT, machine TEXT, commit_hash TEXT, commit_date TIMESTAMP, verdict TEXT,
    measured DOUBLE, gate TEXT, reason TEXT, detail JSON, computed_at TIMESTAMP,
    mode TEXT, inputs TEXT, low DOUBLE, high DOUBLE,
    PRIMARY KEY (claim_key, machine, commit_hash, mode, inputs));
CREATE TABLE IF NOT EXISTS alerts (
    alert_id TEXT PRIMARY KEY, kind TEXT, benchmark TEXT, params TEXT, machine TEXT,
    commit_hash TEXT, commit_date TIMESTAMP, before_value DOUBLE, after_value DOUBLE,
    change DOUBLE, detail TEXT, status TEXT, created_at TIMESTAMP, mode TEXT, inputs TEXT);
CREATE INDEX IF NOT EXISTS results_run ON results (run_id);
CREATE INDEX IF NOT EXISTS results_benchmark ON results (benchmark);
"""


class StoreError(RuntimeError):
    """The store cannot be used: wrong schema version, or another process holds it."""


def db_path(path: str | os.PathLike | None = None) -> Path:
    """The DB file: the explicit path, else $CLAIMBENCH_DB, else .claimbench/claimbench.duckdb."""
    return Path(path or os.environ.get(ENV_DB) or DEFAULT_DB)


_HOLDER = re.compile(r"Conflicting lock is held in (.*?) \(PID (\d+)\)")


def _open(path: Path, read_only: bool, wait_s: float) -> duckdb.DuckDBPyConnection:
    deadline = time.monotonic() + wait_s
    delay = 0.05
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as e:
            held = _HOLDER.search(str(e))
            if not held:
                raise
            if time.monotonic() >= deadline:
                raise StoreError(
                    f"{path} is locked by another process: {held.group(1)} (PID {held.group(2)}); "
                    f"waited {wait_s:g}s. Let it finish, or stop it, then try again.") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


@contextmanager
def connect(path: str | os.PathLike | None = None, *, read_only: bool = False, wait_s: float = 30.0):
    """Open the store for one unit of work, creating or checking its schema, and close it after.

    A read-only open of a DB that does not exist yet yields None: there is nothing to read.
    """
    path = db_path(path)
    if read_only and not path.exists():
        yield None
        return
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    con = _open(path, read_only, wait_s)
    try:
        if read_only:
            _check_version(con, path)
        else:
            _migrate(con, path)
        yield con
    finally:
        con.close()


def _check_version(con, path: Path) -> None:
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except duckdb.CatalogException:
        raise StoreError(f"{path} is not a claimbench store (no meta table)") from None
    if row is None or int(row[0]) != SCHEMA_VERSION:
        found = row[0] if row else "none"
        raise StoreError(f"{path} has schema version {found}; this claimbench needs {SCHEMA_VERSION}. "
                         f"Move the file aside and re-ingest the asv results.")


def _migrate(con, path: Path) -> None:
    has_meta = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'meta'").fetchone()[0]
    if has_meta:
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is not None and int(row[0]) == 1:  # everything in it came from result files: rebuild
            print(f"claimbench: {path} has schema version 1 (no intervals, modes or input digests); "
                  f"emptied for version {SCHEMA_VERSION}: run claimbench ingest again", file=sys.stderr)
            con.execute("BEGIN")
            for table in ("meta", "machines", "runs", "results", "papers", "claims", "verdicts", "alerts"):
                con.execute(f"DROP TABLE IF EXISTS {table}")
            con.execute("COMMIT")
        elif row is not None and int(row[0]) in (2, 3):  # columns added since: stored runs have none to fill
            con.execute("BEGIN")
            if int(row[0]) == 2:  # when each run was measured: which of two copies is newer
                con.execute("ALTER TABLE runs ADD COLUMN measured_at TIMESTAMP")
            con.execute("ALTER TABLE runs ADD COLUMN machine_speed JSON")  # claimbench.machinespeed's probes
            con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])
            con.execute("COMMIT")
            return
        else:
            _check_version(con, path)
            return
    con.execute("BEGIN")
    con.execute(SCHEMA)
    con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
    con.execute("COMMIT")
