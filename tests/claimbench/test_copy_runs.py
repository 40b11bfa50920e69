"""`claimbench publish FOLDER`: a machine's runs copied into a results folder (the reference results),
merged where the folder holds that commit already, as a second asv run at one commit is."""
import json
import shutil

import pytest

from claimbench import asvfiles, cli, environment, evidence, ingest, intervals, store

COMMIT = "ab" * 20


def _run(root, benchmark, value, inputs, speed):
    """A results folder with one run at COMMIT holding one benchmark, its evidence and its run record."""
    path = asvfiles.write_run(root, "box", COMMIT, 1_000 * int(value), {benchmark: (["size"], [["1"]], [value], "x")})
    evidence.record(benchmark, {"size": "1"}, intervals.median_of([value - 1, value, value + 1]),
                    path.parent / f"{COMMIT[:8]}{evidence.SUFFIX}")
    environment.write_run_record(path.parent, COMMIT, "full", inputs, speed)
    return root


def _rows(root, db):
    assert ingest.ingest([root], db=db).ok
    with store.connect(db, read_only=True) as con:
        return con.execute("SELECT benchmark, value, low, high FROM results ORDER BY benchmark").fetchall()


def test_a_copied_real_asv_run_ingests_as_the_original(asv_results, tmp_path):
    target = tmp_path / "reference"
    assert asvfiles.copy_runs(asv_results, target) == [f"testbox/{f.name[:8]}" for f in
                                                       (asv_results / "testbox").glob("*-*.json")]
    assert {p.name for p in (target / "testbox").iterdir()} == {p.name for p in (asv_results / "testbox").iterdir()}
    assert _rows(target, tmp_path / "copy.duckdb") == _rows(asv_results, tmp_path / "original.duckdb")


def test_a_second_run_at_one_commit_joins_the_first_and_a_rerun_replaces_its_own(tmp_path):
    first = _run(tmp_path / "first", "suite_a.A.track_x", 10.0, {"suite_a": {"corpus": "1"}}, {"suite_a": {"n": 1}})
    second = _run(tmp_path / "second", "suite_b.B.track_y", 20.0, {"suite_b": {"corpus": "1"}}, {"suite_b": {"n": 2}})
    target = tmp_path / "reference"
    asvfiles.write_run(target, "box", "cd" * 20, 5, {"older.O.track_z": (["size"], [["1"]], [1.0], "x")})
    asvfiles.copy_runs(first, target)
    assert asvfiles.copy_runs(second, target, machine="box", commit=COMMIT) == ["box/abababab"]
    rows = _rows(target, tmp_path / "merged.duckdb")
    assert rows == [("older.O.track_z", 1.0, None, None), ("suite_a.A.track_x", 10.0, 9.0, 11.0),
                    ("suite_b.B.track_y", 20.0, 19.0, 21.0)]
    record = json.loads((target / "box" / f"{COMMIT[:8]}{environment.RECORD_SUFFIX}").read_text())
    assert set(record["inputs"]) == set(record["machine_speed"]) == {"suite_a", "suite_b"}
    meta = json.loads((target / "benchmarks.json").read_text())
    assert {"older.O.track_z", "suite_a.A.track_x", "suite_b.B.track_y"} <= set(meta)

    rerun = _run(tmp_path / "rerun", "suite_a.A.track_x", 12.0, {"suite_a": {"corpus": "1"}}, {"suite_a": {"n": 3}})
    asvfiles.copy_runs(rerun, target)
    written = {path: path.read_bytes() for path in target.rglob("*") if path.is_file()}
    asvfiles.copy_runs(rerun, target)  # the same run twice leaves every byte as it was
    assert {path: path.read_bytes() for path in target.rglob("*") if path.is_file()} == written
    assert _rows(target, tmp_path / "rerun.duckdb")[1] == ("suite_a.A.track_x", 12.0, 11.0, 13.0)
    assert len((target / "box" / f"{COMMIT[:8]}{evidence.SUFFIX}").read_text().splitlines()) == 2


def test_a_kernels_only_run_needs_no_benchmarks_json(tmp_path):
    source = tmp_path / "source" / "box"
    source.mkdir(parents=True)
    (source / f"{COMMIT[:8]}-kernels.json").write_text('{"benchmarks": []}')
    assert asvfiles.copy_runs(tmp_path / "source", tmp_path / "reference") == ["box/abababab"]
    assert (tmp_path / "reference" / "box" / f"{COMMIT[:8]}-kernels.json").exists()
    assert not (tmp_path / "reference" / "benchmarks.json").exists()


def test_nothing_to_copy_is_named(tmp_path):
    source = _run(tmp_path / "source", "suite_a.A.track_x", 10.0, {}, None)
    with pytest.raises(FileNotFoundError, match="no results to copy for nobody under"):
        asvfiles.copy_runs(source, tmp_path / "reference", machine="nobody")
    with pytest.raises(FileNotFoundError, match="for box at 00000000"):
        asvfiles.copy_runs(source, tmp_path / "reference", machine="box", commit="00000000")


def test_the_command_line_copies_into_a_folder(tmp_path, capsys):
    source = _run(tmp_path / "source", "suite_a.A.track_x", 10.0, {}, None)
    assert cli.main(["publish", str(tmp_path / "reference"), "--results", str(source), "--commit", "abababa"]) == 0
    assert capsys.readouterr().out == f"copied 1 run(s) into {tmp_path / 'reference'}\n  box/abababab\n"
    shutil.rmtree(source / "box")
    assert cli.main(["publish", str(tmp_path / "reference"), "--results", str(source)]) != 0
