"""The harness itself: ingest speed of asv result files into the DuckDB store (goal >= 10k rows/s).

Quality beside speed: every row written to the files is found in the store, and ingesting the
same files again adds nothing.
"""
import itertools
import os
import tempfile
import time
from pathlib import Path

from asv.results import Results

from claimbench import ingest, metrics, store

QUICK = os.environ.get("CLAIMBENCH_QUICK") == "1"


def write_results(root: Path, n_files: int, rows_per_file: int) -> int:
    """asv result files from asv's own writer: one parameterized benchmark per file."""
    side = int(rows_per_file ** 0.5)
    params = [[repr(i) for i in range(side)], [repr(j) for j in range(side)]]
    for f in range(n_files):
        res = Results({"machine": "bench-machine", "python": "3.11"}, {}, f"{f + 1:08x}" + "0" * 32, 1_700_000_000_000 + f,
                      "3.11", "existing-py", {})
        values = [float(i * side + j) for i, j in itertools.product(range(side), range(side))]
        res.add_result({"name": "suite.Bench.track_value", "version": "1", "params": params},
                       _Result(values), started_at=None, duration=1.0)
        res.save(str(root))
    return n_files * side * side


class _Result:
    """The shape asv's Results.add_result expects from a runner."""

    def __init__(self, values):
        self.result, self.samples, self.number = values, [[v] for v in values], [1] * len(values)
        self.errcode, self.stderr, self.profile = 0, "", None
        self.stats = [None] * len(values)


class Ingest:
    timeout = 600
    number = 1
    repeat = 1

    def setup_cache(self):
        root = Path(tempfile.mkdtemp(prefix="claimbench-ingest-"))
        n_rows = write_results(root / "results", 4 if QUICK else 20, 2_500 if QUICK else 10_000)
        db = root / "bench.duckdb"
        start = time.perf_counter()
        first = ingest.ingest([root / "results"], db=db)
        elapsed = time.perf_counter() - start
        again = ingest.ingest([root / "results"], db=db)
        with store.connect(db, read_only=True) as con:
            stored = con.execute("SELECT count(*) FROM results").fetchone()[0]
        return {"rows_per_s": first.rows / elapsed, "stored": stored / n_rows, "readded": again.rows}

    def track_rows_per_s(self, r):
        return r["rows_per_s"]
    track_rows_per_s.unit = metrics.ROWS_PER_S.unit

    def track_rows_stored(self, r):
        return r["stored"] if r["readded"] == 0 else 0.0
    track_rows_stored.unit = metrics.STORED.unit
