"""publish / ingest s3:// against a real S3 API server on 127.0.0.1 (moto's standalone server)."""
import shutil

import pytest

from claimbench import ingest, localservices, objectstore, store

pytest.importorskip("s3fs", reason="object storage needs s3fs (pip install 'claimbench[fleet]')")
pytest.importorskip("moto", reason="the local S3 API server needs moto (pip install 'claimbench[fleet]')")

RUN_COLUMNS = "machine, commit_hash, commit_date, env_name, python, source, content_sha, mode, inputs, measured_at"
RESULT_COLUMNS = "benchmark, params, value, status, unit, direction, stats, samples, low, high, interval"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        for name, value in localservices.TEST_CREDENTIALS.items():
            patch.setenv(name, value)
        with localservices.s3_server() as endpoint:
            patch.setenv("AWS_ENDPOINT_URL", endpoint)
            localservices.make_bucket(endpoint, "results")
            yield endpoint


def _contents(db):
    with store.connect(db, read_only=True) as con:
        runs = con.execute(f"SELECT {RUN_COLUMNS} FROM runs ORDER BY machine, commit_hash").fetchall()
        results = con.execute(f"SELECT r.machine, {RESULT_COLUMNS} FROM results JOIN runs r USING (run_id) "
                              "ORDER BY ALL").fetchall()
    return runs, results


def test_publish_then_ingest_equals_a_local_ingest_and_a_second_ingest_adds_nothing(s3, asv_results, tmp_path):
    published = objectstore.publish("s3://results/team", {"full": asv_results})
    assert [r.split("/")[0] for r in published.runs] == ["testbox"]
    assert published.runs[0].endswith("-full")

    local = ingest.ingest([asv_results], db=tmp_path / "local.duckdb")
    remote = ingest.ingest(["s3://results/team"], db=tmp_path / "remote.duckdb")
    assert local.ok and remote.ok and remote.added == local.added == 1
    assert _contents(tmp_path / "remote.duckdb") == _contents(tmp_path / "local.duckdb")
    with store.connect(tmp_path / "remote.duckdb", read_only=True) as con:
        source = con.execute("SELECT source_path FROM runs").fetchone()[0]
    assert source.startswith("s3://results/team/testbox/")

    again = ingest.ingest(["s3://results/team"], db=tmp_path / "remote.duckdb")
    assert (again.added, again.replaced, again.unchanged, again.rows) == (0, 0, 1, 0)
    republished = objectstore.publish("s3://results/team", {"full": asv_results}, machine="testbox")
    assert republished.runs == published.runs  # the same keys, written again


def test_publish_of_nothing_and_a_missing_bucket_are_named(s3, asv_results, tmp_path):
    with pytest.raises(FileNotFoundError, match="no results to publish for nobody"):
        objectstore.publish("s3://results/team", {"full": asv_results}, machine="nobody")
    with pytest.raises(FileNotFoundError, match="s3://no-such-bucket"):
        objectstore.publish("s3://no-such-bucket/x", {"full": asv_results})
    with pytest.raises(FileNotFoundError, match="no published results"):
        ingest.ingest(["s3://results/empty-prefix"], db=tmp_path / "db.duckdb")
    with pytest.raises(ValueError, match="not an s3:// URL"):
        objectstore.split("/local/path")


def test_refused_credentials_are_a_clear_error_and_lose_nothing_stored(s3, asv_results, tmp_path):
    db = tmp_path / "db.duckdb"
    ingest.ingest([asv_results], db=db)
    before = _contents(db)
    with localservices.s3_server(check_credentials=True) as strict:
        with pytest.raises(objectstore.AccessDenied, match="refused.*AWS_ACCESS_KEY_ID"):
            objectstore.publish("s3://results/team", {"full": asv_results}, endpoint_url=strict)
        with pytest.raises(objectstore.AccessDenied, match="s3://results/team: the object store refused"):
            ingest.ingest(["s3://results/team", asv_results], db=db, endpoint_url=strict)
    assert _contents(db) == before


def test_the_command_line_publishes_and_ingests(s3, asv_results, tmp_path, capsys):
    from claimbench import cli
    copy = tmp_path / "results"
    shutil.copytree(asv_results, copy)
    assert cli.main(["publish", "s3://results/cli", "--results", str(copy), "--quick"]) == 0
    assert "-quick" in capsys.readouterr().out
    assert cli.main(["ingest", "s3://results/cli", "--db", str(tmp_path / "db.duckdb")]) == 0
    assert "1 run(s) added" in capsys.readouterr().out
    assert cli.main(["publish", "s3://results/cli", "--results", str(copy), "--endpoint-url",
                     "http://127.0.0.1:1"]) == 2
    assert "claimbench publish: s3://results/cli" in capsys.readouterr().err
