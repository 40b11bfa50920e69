"""The harness itself: ingest speed of asv result files into the DuckDB store (goal >= 10k rows/s).

Quality beside speed: every row written to the files is found in the store, and ingesting the
same files again adds nothing.
"""
import itertools
import os
import tempfile
import time
from pathlib import Path

from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import asvfiles, ingest, metrics, store

QUICK = os.environ.get("CLAIMBENCH_QUICK") == "1"
INPUTS = ()  # generated rows and result files only


def write_results(root: Path, n_files: int, rows_per_file: int) -> int:
    """asv result files from asv's own writer: one parameterized benchmark per file."""
    side = int(rows_per_file ** 0.5)
    for f in range(n_files):
        values = [float(i * side + j) for i, j in itertools.product(range(side), range(side))]
        asvfiles.write_run(root, "bench-machine", f"{f + 1:08x}" + "0" * 32, 1_700_000_000_000 + f,
                           {"suite.Bench.track_value": (["i", "j"], [list(range(side))] * 2, values, "rows/s")})
    return n_files * side * side


class Ingest:
    timeout = 600
    number = 1
    repeat = 1

    def setup_cache(self):
        with tempfile.TemporaryDirectory(prefix="claimbench-ingest-") as tmp:
            root = Path(tmp)
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


class ClaimsFirstPaint:
    """First paint of the leaderboard's Claims page with 100k result rows in the store (goal <= 2 s):
    from navigation until the claims table is on screen, in headless chromium."""
    timeout = 600
    number = 1
    repeat = 1

    def setup_cache(self):
        from claimbench.appserver import CHROMIUM
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            raise SkipNotImplemented("playwright is not installed") from None
        if not Path(CHROMIUM).exists():
            raise SkipNotImplemented("Debian's chromium is not installed")
        with tempfile.TemporaryDirectory(prefix="claimbench-paint-") as tmp:
            return self._paint(Path(tmp))

    @staticmethod
    def _paint(root: Path) -> dict:
        from playwright.sync_api import sync_playwright

        from claimbench.appserver import CHROMIUM, CHROMIUM_ARGS, serve
        n_rows = write_results(root / "results", 10, 10_000)
        db = root / "paint.duckdb"
        ingest.ingest([root / "results"], db=db)
        with serve(db) as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)

            def paint(page) -> float:
                start = time.perf_counter()
                page.goto(url + "/")
                page.locator("[data-testid='stDataFrame']").first.wait_for(timeout=60_000)
                return time.perf_counter() - start

            first = paint(browser.new_page())  # cold server, cold browser cache
            fresh = paint(browser.new_context().new_page())  # warm server, a new visitor
            page = browser.new_page()
            warm = sorted(paint(page) for _ in range(3))[1]  # a refresh
            browser.close()
        with store.connect(db, read_only=True) as con:
            stored = con.execute("SELECT count(*) FROM results").fetchone()[0]
        return {"first": first, "fresh": fresh, "warm": warm, "rows": stored / n_rows}

    def track_first_paint_cold_server(self, r):
        return r["first"]
    track_first_paint_cold_server.unit = metrics.SECONDS.unit

    def track_first_paint_new_visitor(self, r):
        return r["fresh"]
    track_first_paint_new_visitor.unit = metrics.SECONDS.unit

    def track_first_paint_refresh(self, r):
        return r["warm"]
    track_first_paint_refresh.unit = metrics.SECONDS.unit

    def track_rows_stored(self, r):
        return r["rows"]
    track_rows_stored.unit = metrics.STORED.unit
