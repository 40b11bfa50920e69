import json
import multiprocessing
import shutil
import time

import pytest

from claimbench import ingest, store


def count(db, table="results"):
    with store.connect(db, read_only=True) as con:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_ingest_real_asv_results(asv_results, tmp_path):
    db = tmp_path / "s.duckdb"
    report = ingest.ingest([asv_results], db=db)
    assert report.ok, report.summary()
    assert report.added == 1
    with store.connect(db, read_only=True) as con:
        rows = con.execute("SELECT benchmark, params, value, status, unit, direction FROM results "
                           "ORDER BY benchmark, params").fetchall()
        machine = con.execute("SELECT machine, num_cpu FROM machines").fetchone()
    by_name = {}
    for bench, params, value, status, unit, direction in rows:
        by_name.setdefault(bench, []).append((json.loads(params), value, status, unit, direction))
    track = by_name["tiny.Tiny.track_value"]
    assert len(track) == 4
    assert ({"size": 2, "kind": "b"}, 40.0, "ok", "queries/s", "higher") in track
    assert all(d == "lower" and u == "seconds" for _, _, _, u, d in by_name["tiny.Tiny.time_sum"])
    assert by_name["tiny.track_crashes"] == [({}, None, "failed", "unit", "none")]
    assert machine[0] == "testbox"


def test_ingest_twice_adds_nothing(asv_results, tmp_path):
    db = tmp_path / "s.duckdb"
    ingest.ingest([asv_results], db=db)
    before = count(db)
    again = ingest.ingest([asv_results], db=db)
    assert again.unchanged == 1 and again.rows == 0
    assert count(db) == before and count(db, "runs") == 1


def test_bad_files_are_named_and_good_ones_still_land(asv_results, tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(asv_results, mixed)
    good = next(f for f in (mixed / "testbox").glob("*.json") if f.name != "machine.json")
    text = good.read_text()
    (mixed / "testbox" / "truncated.json").write_text(text[: len(text) // 2])
    (mixed / "testbox" / "wrongversion.json").write_text(text.replace('"version": 2', '"version": 99'))
    (mixed / "testbox" / "garbage.json").write_text('{"hello": 1}')
    db = tmp_path / "s.duckdb"
    report = ingest.ingest([mixed], db=db)
    assert not report.ok
    named = {p.name for p, _ in report.errors}
    assert named == {"truncated.json", "wrongversion.json", "garbage.json"}
    assert report.added == 1 and count(db) > 0


def test_changed_file_replaces_its_run(asv_results, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(asv_results, copy)
    db = tmp_path / "s.duckdb"
    ingest.ingest([copy], db=db)
    before = count(db)
    f = next(f for f in (copy / "testbox").glob("*.json") if f.name != "machine.json")
    data = json.loads(f.read_text())
    data["results"].pop("tiny.Tiny.time_sum")
    f.write_text(json.dumps(data))
    report = ingest.ingest([copy], db=db)
    assert report.replaced == 1
    assert count(db) == before - 4


def _hold_lock(db, ready, release):
    with store.connect(db) as con:
        con.execute("SELECT 1")
        ready.set()
        release.wait(30)


def test_locked_store_names_the_holder_and_loses_nothing(asv_results, tmp_path):
    db = tmp_path / "s.duckdb"
    ingest.ingest([asv_results], db=db)
    before = count(db)
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(db, ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        start = time.monotonic()
        with pytest.raises(store.StoreError, match=rf"PID {holder.pid}"):
            ingest.ingest([asv_results], db=db, wait_s=0.5)
        assert time.monotonic() - start >= 0.5
    finally:
        release.set()
        holder.join(30)
    assert count(db) == before


def test_retry_succeeds_once_the_holder_lets_go(asv_results, tmp_path):
    db = tmp_path / "s.duckdb"
    ctx = multiprocessing.get_context("spawn")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(db, ready, release))
    holder.start()
    assert ready.wait(30)
    ctx.Process(target=_release_later, args=(release,)).start()
    report = ingest.ingest([asv_results], db=db, wait_s=20)
    holder.join(30)
    assert report.ok and report.added == 1


def _release_later(release):
    time.sleep(1.0)
    release.set()


def test_pytest_benchmark_json(tmp_path):
    data = {
        "machine_info": {"node": "bench-box", "machine": "x86_64", "python_version": "3.11.7",
                         "cpu": {"brand_raw": "CPU", "count": 2}},
        "commit_info": {"id": "abc123", "time": "2026-11-01T10:00:00+00:00"},
        "benchmarks": [{"name": "test_k", "fullname": "tests/test_k.py::test_k", "params": {"n": 4},
                        "stats": {"min": 1e-3, "max": 2e-3, "mean": 1.5e-3, "median": 1.4e-3,
                                  "rounds": 5, "data": [1e-3, 2e-3]}}],
        "datetime": "2026-11-01T10:00:00", "version": "5.1.0"}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    db = tmp_path / "s.duckdb"
    report = ingest.ingest([path], db=db)
    assert report.ok and report.rows == 1
    with store.connect(db, read_only=True) as con:
        row = con.execute("SELECT benchmark, value, unit, direction, samples FROM results").fetchone()
    assert row == ("pytest:tests/test_k.py::test_k", 1.4e-3, "seconds", "lower", [1e-3, 2e-3])


def test_schema_version_is_checked(tmp_path):
    db = tmp_path / "s.duckdb"
    with store.connect(db) as con:
        con.execute("UPDATE meta SET value = '999' WHERE key = 'schema_version'")
    with pytest.raises(store.StoreError, match="schema version 999"):
        with store.connect(db):
            pass


def test_a_version_3_store_gains_a_machine_speed_column_and_keeps_its_runs(tmp_path):
    db = tmp_path / "s.duckdb"
    with store.connect(db) as con:  # as version 3 left it
        con.execute("INSERT INTO runs (run_id, machine) VALUES ('r', 'box')")
        con.execute("ALTER TABLE runs DROP COLUMN machine_speed")
        con.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    with store.connect(db) as con:
        assert con.execute("SELECT run_id, machine_speed FROM runs").fetchall() == [("r", None)]
    with store.connect(db, read_only=True) as con:
        assert con.execute("SELECT value FROM meta").fetchone()[0] == str(store.SCHEMA_VERSION)


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope"):
        ingest.ingest([tmp_path / "nope"], db=tmp_path / "s.duckdb")


def _two_copies(tmp_path):
    """One run (testbox at one commit) in two folders, measured an hour apart, with different values."""
    from claimbench import asvfiles
    commit = "ab" * 20
    for name, hour, value in (("older", 10, 1.0), ("newer", 11, 2.0)):
        asvfiles.write_run(tmp_path / name, "testbox", commit, date_ms=1_700_000_000_000 + hour * 3_600_000,
                           benchmarks={"tiny.track_x": ([], [], [value], "unit")})
    return tmp_path / "older", tmp_path / "newer"


def _values(db):
    with store.connect(db, read_only=True) as con:
        return con.execute("SELECT value FROM results").fetchall()


def test_two_copies_of_a_run_in_one_batch_keep_the_newer_and_report_the_conflict(tmp_path):
    older, newer = _two_copies(tmp_path)
    db = tmp_path / "s.duckdb"
    report = ingest.ingest([newer, older], db=db)
    assert report.added == 1 and len(report.conflicts) == 1
    assert "testbox at abababab" in report.conflicts[0] and f"kept {newer}" in report.conflicts[0]
    assert "conflict:" in report.summary()
    assert _values(db) == [(2.0,)]


def test_an_older_copy_after_the_newer_leaves_the_store_as_it_was(tmp_path):
    older, newer = _two_copies(tmp_path)
    db = tmp_path / "s.duckdb"
    ingest.ingest([newer], db=db)
    report = ingest.ingest([older], db=db)
    assert (report.added, report.replaced, report.unchanged) == (0, 0, 1)
    assert "(the newer), not" in report.conflicts[0] and _values(db) == [(2.0,)]
    report = ingest.ingest([tmp_path / "older"], db=tmp_path / "t.duckdb")  # and the other way round:
    report = ingest.ingest([newer], db=tmp_path / "t.duckdb")
    assert report.replaced == 1 and len(report.conflicts) == 1 and _values(tmp_path / "t.duckdb") == [(2.0,)]


def test_a_version_2_store_gains_measurement_times_and_keeps_its_runs(asv_results, tmp_path):
    db = tmp_path / "s.duckdb"
    ingest.ingest([asv_results], db=db)
    with store.connect(db) as con:  # as version 2 left it
        con.execute("ALTER TABLE runs DROP COLUMN measured_at")
        con.execute("ALTER TABLE runs DROP COLUMN machine_speed")
        con.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    with store.connect(db, read_only=False) as con:
        assert con.execute("SELECT count(*), count(measured_at) FROM runs").fetchone() == (1, 0)
    report = ingest.ingest([asv_results], db=db)
    assert report.replaced == 0 and report.unchanged == 1


def test_a_folder_without_results_says_where_they_are(tmp_path):
    report = ingest.ingest([tmp_path], db=tmp_path / "s.duckdb")
    assert report.ok and report.files == 0
    assert "no result files there" in report.summary() and "reports/results" in report.summary()


def test_a_machine_whose_record_says_io_uring_fails_cannot_test_ugds_claims(tmp_path):
    """Its environment record says why (liburing dying of SIGILL on a CPU without AVX-512); a record from before
    io_uring was probed counts as having it."""
    from claimbench import asvfiles, environment, registry, verdicts
    results = tmp_path / "results"
    for machine, env in (("broken", {"io_uring": "it dies"}), ("older", {})):
        asvfiles.write_run(results, machine, "a" * 40, 1_700_000_000_000,
                           {"ugds.Claim.track_batch_read_speedup_4k": ([], [], [5.0], "x")})
        (results / machine / environment.SIDECAR).write_text(json.dumps({"gpu_count": 0, **env}))
    db = tmp_path / "s.duckdb"
    assert ingest.ingest([results], db=db).ok
    with store.connect(db) as con:
        found = {v.machine: v for v in verdicts.compute(con, registry.load(), store_history=False)
                 if v.claim.key == "ugds/batch-read-speedup"}
    assert found["broken"].verdict == verdicts.NOT_TESTABLE
    assert found["broken"].reason.startswith("needs io_uring through a PyPI liburing that runs here")
    assert found["older"].verdict != verdicts.NOT_TESTABLE
