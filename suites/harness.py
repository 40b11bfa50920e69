"""The harness itself: ingest speed of asv result files into the DuckDB store (goal >= 10k rows/s);
the Claims page's first paint; and the regression alerts measured on planted histories.

Quality beside speed: every row written to the files is found in the store, and ingesting the
same files again adds nothing.
Alerts (AlertRecall, AlertSummary, AlertSeparation): recall of planted drops of 5-50% per history
shape (datasets/alert_histories.py) and direction, false alarms where nothing regressed, the
smallest drop flagged at >= 95% recall per shape (target: <= 20% on every shape, no false alarm on
flat noisy histories), and, through a real store, that a quick run or a run on other inputs beside
a full history is never compared with it.
"""
import itertools
import json
import tempfile
import time
from pathlib import Path

from asv_runner.benchmarks.mark import SkipNotImplemented

from claimbench import alerts, asvfiles, environment, evidence, ingest, intervals, metrics, store
from claimbench.datasets import alert_histories

from . import common

QUICK = common.QUICK
QUICK_BUDGET_S = 165  # seconds in quick mode on 2 cores (135 s in a fresh clone's make run)
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
        """The timings, or {"missing": what to install}: asv prints a traceback for a setup_cache that
        raises, so a missing browser is one skip line per row instead."""
        from claimbench.appserver import CHROMIUM
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            return {"missing": "needs playwright: pip install 'claimbench[test]'"}
        if not Path(CHROMIUM).exists():
            return {"missing": "needs Debian's chromium: apt-get install chromium"}
        with tempfile.TemporaryDirectory(prefix="claimbench-paint-") as tmp:
            return self._paint(Path(tmp))

    @staticmethod
    def _measured(r, key):
        if "missing" in r:
            raise SkipNotImplemented(r["missing"])
        return r[key]

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
        return self._measured(r, "first")
    track_first_paint_cold_server.unit = metrics.SECONDS.unit

    def track_first_paint_new_visitor(self, r):
        return self._measured(r, "fresh")
    track_first_paint_new_visitor.unit = metrics.SECONDS.unit

    def track_first_paint_refresh(self, r):
        return self._measured(r, "warm")
    track_first_paint_refresh.unit = metrics.SECONDS.unit

    def track_rows_stored(self, r):
        return self._measured(r, "rows")
    track_rows_stored.unit = metrics.STORED.unit


DROPS = [0.0, 0.05, 0.1, 0.2, 0.3, 0.5]
DIRECTIONS = ["higher", "lower"]
ALERT_TRIALS = 40 if QUICK else 200
ALERT_THRESHOLD = 0.05  # the default threshold of [tool.claimbench.alerts]


def planted_outcomes(shape: str, drop: float, direction: str, trials: int = ALERT_TRIALS) -> dict:
    """Per trial: whether an alert fell on the planted commit (or the next), and whether any fell
    elsewhere (a false alarm; every alert is one for an improvement or no drop)."""
    hits, false = [], []
    for seed in range(trials):
        values, start = alert_histories.planted(shape, drop, direction, seed)
        found = {after for _, after, _, _, _ in alerts.detect(values, direction, ALERT_THRESHOLD)}
        planted_here = {start, start + 1} if drop > 0 and shape != "improvement" else set()
        hits.append(bool(found & planted_here))
        false.append(bool(found - planted_here))
    return {"recall": intervals.rate(hits), "false": intervals.rate(false)}


class AlertRecall:
    params = (list(alert_histories.SHAPES), DROPS, DIRECTIONS)
    param_names = ["shape", "drop", "direction"]
    timeout = 1200

    def setup_cache(self):
        return {(s, d, x): planted_outcomes(s, d, x) for s in alert_histories.SHAPES for d in DROPS for x in DIRECTIONS}

    @evidence.estimate
    def track_recall(self, r, shape, drop, direction):
        if drop == 0 or shape == "improvement":
            raise SkipNotImplemented("nothing was dropped")
        return r[shape, drop, direction]["recall"]
    track_recall.unit = metrics.ALERT_RECALL.unit

    @evidence.estimate
    def track_false_alarm_rate(self, r, shape, drop, direction):
        return r[shape, drop, direction]["false"]
    track_false_alarm_rate.unit = metrics.FALSE_ALARMS.unit


class AlertSummary:
    params = ([s for s in alert_histories.SHAPES if s != "improvement"], DIRECTIONS)
    param_names = ["shape", "direction"]
    timeout = 1200

    def setup_cache(self):
        return {(s, x): {d: planted_outcomes(s, d, x)["recall"].value for d in DROPS if d > 0}
                for s in alert_histories.SHAPES if s != "improvement" for x in DIRECTIONS}

    def track_smallest_drop_at_95_recall(self, r, shape, direction):
        caught = [d for d, recall in sorted(r[shape, direction].items()) if recall >= 0.95]
        if not caught:
            raise AssertionError(f"{shape}: no planted drop up to 50% reached 95% recall")
        return caught[0]
    track_smallest_drop_at_95_recall.unit = metrics.DROP_SIZE.unit


def store_alerts(kind: str, trials: int) -> list[bool]:
    """Per trial, through asv files, run records and a real store: a flat full-mode history, then a
    point 50% worse that is a quick run ('quick'), a run on other inputs ('inputs'), or the full
    series' own next commit ('full', the positive control). True where a regression was raised."""
    raised = []
    for seed in range(trials):
        values, _ = alert_histories.planted("flat", 0.0, "higher", seed)
        with tempfile.TemporaryDirectory(prefix="claimbench-alerts-") as tmp:
            root = Path(tmp)
            for i, v in enumerate(values + [values[-1] * 0.5]):
                last = i == len(values)
                mode = "quick" if last and kind == "quick" else "full"
                corpus = "other" if last and kind == "inputs" else "pinned"
                results = root / mode
                commit = f"{i + 1:08x}" + "0" * 32
                asvfiles.write_run(results, "box", commit, 1_700_000_000_000 + i * 86_400_000,
                                   {"s.C.track_speed": ([], [], [v], metrics.QPS.unit)})
                record = {"commit": commit, "mode": mode, "inputs": {"s": {"corpus": corpus}}}
                (results / "box" / f"{commit[:8]}{environment.RECORD_SUFFIX}").write_text(json.dumps(record))
            db = root / "s.duckdb"
            ingest.ingest([root / m for m in ("full", "quick") if (root / m).exists()], db=db)
            with store.connect(db) as con:
                raised.append(bool(alerts.regressions(con, alerts.Thresholds(ALERT_THRESHOLD))))
    return raised


class AlertSeparation:
    params = (["quick", "inputs", "full"],)
    param_names = ["newest_point_is"]
    timeout = 1200

    def setup_cache(self):
        trials = 5 if QUICK else 20
        return {kind: intervals.rate(store_alerts(kind, trials)) for kind in self.params[0]}

    @evidence.estimate
    def track_alert_rate(self, r, newest_point_is):
        """Share of histories alerted: 0 for a quick run or other inputs (never compared), 1 for the
        full series' own drop."""
        return r[newest_point_is]
    track_alert_rate.unit = metrics.FALSE_ALARMS.unit
