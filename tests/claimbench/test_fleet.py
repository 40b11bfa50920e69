"""claimbench fleet run on a real Ray cluster of several nodes on 127.0.0.1 (ray.cluster_utils: a GCS and
one raylet per node, each with its own custom resources), running a tiny real asv suite in a temporary
repository, with results through a real S3 API server."""
import json
import os
import tempfile
import textwrap
import threading
import time

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray keeps every node on 127.0.0.1
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from claimbench import fleet, localservices, store  # noqa: E402
from tests.conftest import _git  # noqa: E402

ray = pytest.importorskip("ray", reason="fleet runs need Ray (pip install 'claimbench[fleet]')")
pytest.importorskip("moto", reason="the local S3 API server needs moto (pip install 'claimbench[fleet]')")

FLEET_SUITE = '''
import time
from pathlib import Path

MARKERS = Path(__file__).resolve().parent.parent / "markers"


def track_answer():
    return 42.0
track_answer.unit = "answers"


def track_held():
    """Waits while markers/hold exists, after saying it started: a node can be killed mid-run."""
    MARKERS.mkdir(exist_ok=True)
    (MARKERS / f"started-{time.time_ns()}").touch()
    deadline = time.time() + 60
    while (MARKERS / "hold").exists() and time.time() < deadline:
        time.sleep(0.1)
    return 1.0
'''


@pytest.fixture(scope="module")
def fleet_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("fleetrepo")
    (repo / "benchmarks").mkdir()
    (repo / "benchmarks" / "__init__.py").write_text("")
    (repo / "benchmarks" / "tinyfleet.py").write_text(textwrap.dedent(FLEET_SUITE))
    for name, results in (("asv.conf.json", "results"), ("asv.quick.conf.json", "results-quick")):
        (repo / name).write_text(json.dumps({
            "version": 1, "project": "tiny", "repo": ".", "branches": ["HEAD"], "environment_type": "existing",
            "benchmark_dir": "benchmarks", "results_dir": results, "env_dir": "env", "html_dir": "html"}))
    (repo / ".gitignore").write_text("results*/\nmarkers/\n.claimbench/\nenv/\nhome/\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "tiny fleet")
    return repo


@pytest.fixture(scope="module")
def cluster(fleet_repo):
    """A head node advertising box_a and a worker advertising fake_gpu_kind; asv's machine file in a
    temporary HOME (the nodes inherit this process's environment); an S3 API server with a bucket. The nodes'
    temporary files (Ray's session folder, runner.run's and asv's) go to one folder removed at the end, so a
    node killed mid-run leaves nothing behind; a short one, for Ray's socket paths."""
    from ray.cluster_utils import Cluster
    with (tempfile.TemporaryDirectory(prefix="claimbench-ray-", ignore_cleanup_errors=True) as scratch,
          pytest.MonkeyPatch.context() as patch):
        (fleet_repo / "home").mkdir(exist_ok=True)
        patch.setenv("HOME", str(fleet_repo / "home"))
        patch.setenv("TMPDIR", scratch)
        patch.setenv("RAY_TMPDIR", scratch)
        for name, value in localservices.TEST_CREDENTIALS.items():
            patch.setenv(name, value)
        with localservices.s3_server() as endpoint:
            localservices.make_bucket(endpoint, "fleet")
            nodes = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 1, "resources": {"box_a": 1}, "include_dashboard": False})
            nodes.add_node(num_cpus=1, resources={"fake_gpu_kind": 1})
            nodes.wait_for_nodes()
            try:
                yield nodes, endpoint
            finally:
                if ray.is_initialized():
                    ray.shutdown()
                nodes.shutdown()


def _spec(repo, kinds, **knobs):
    return fleet.FleetRun(kinds=[fleet.Kind.parse(k) for k in kinds], bench=["^tinyfleet\\.track_answer$"],
                          quick=True, checkout=str(repo), root=repo, **knobs)


def _machines(db):
    with store.connect(db, read_only=True) as con:
        return sorted(con.execute("SELECT DISTINCT r.machine FROM results JOIN runs r USING (run_id) "
                                  "WHERE status = 'ok'").fetchall())


def test_kinds_parse_and_spread_over_the_nodes_that_meet_them():
    gpu = fleet.Kind.parse("gpu-h200:GPU=1,H200=1")
    assert gpu.machine == "gpu-h200" and gpu.options() == {"num_cpus": 1, "num_gpus": 1.0, "resources": {"H200": 1.0}}
    assert fleet.Kind.parse("cpu-box").needs == () and fleet.Kind.parse("io:nvme").needs == (("nvme", 1.0),)
    with pytest.raises(ValueError, match="machine name first"):
        fleet.Kind.parse(":GPU=1")
    with pytest.raises(ValueError, match="RESOURCE=AMOUNT"):
        fleet.Kind.parse("x:GPU=one")
    nodes = [{"NodeID": "a", "Resources": {"CPU": 2.0, "GPU": 1.0, "H200": 1.0}},
             {"NodeID": "b", "Resources": {"CPU": 2.0}}]
    plan = fleet.place([fleet.Kind.parse("one"), gpu, fleet.Kind.parse("two")], nodes)
    assert [k.machine for k in plan["a"]][0] == "gpu-h200" and len(plan["a"]) + len(plan["b"]) == 3
    assert len(plan["b"]) >= 1  # spread: the CPU kinds do not all queue behind the GPU one
    with pytest.raises(fleet.FleetError, match=r"gpu-b200 needs B200=1 .*advertise CPU, GPU, H200"):
        fleet.place([fleet.Kind.parse("gpu-b200:GPU=1,B200=1")], nodes)


def test_each_kind_runs_on_the_node_with_its_resource_publishes_and_is_ingested(cluster, fleet_repo, tmp_path):
    nodes, endpoint = cluster
    db = tmp_path / "fleet.duckdb"
    spec = _spec(fleet_repo, ["box-a:box_a=1", "box-b:fake_gpu_kind=1"], bucket="s3://fleet/ci",
                 endpoint_url=endpoint)
    outcomes = {o.machine: o for o in fleet.run(spec, address=nodes.address, db=db)}
    assert {m: o.status for m, o in outcomes.items()} == {"box-a": "done", "box-b": "done"}
    worker = next(n for n in nodes.list_all_nodes() if n is not nodes.head_node)
    assert outcomes["box-a"].node == nodes.head_node.node_id  # the head advertises box_a
    assert outcomes["box-b"].node == worker.node_id  # the worker fake_gpu_kind
    assert _machines(db) == [("box-a",), ("box-b",)]

    from claimbench import ingest
    local = ingest.ingest([fleet_repo / "results-quick"], db=tmp_path / "local.duckdb")
    assert local.ok and _machines(tmp_path / "local.duckdb") == _machines(db)

    said = []
    again = fleet.run(spec, address="127.0.0.1:1", db=db, say=said.append)  # nothing to do: no cluster needed
    assert [o.status for o in again] == ["done before", "done before"] and "every kind is done" in said[-1]


def test_a_requirement_no_node_meets_is_refused_before_anything_runs(cluster, fleet_repo, tmp_path):
    nodes, _ = cluster
    spec = _spec(fleet_repo, ["box-a:box_a=1", "gpu-h200:GPU=1,H200=1"], force=True)
    with pytest.raises(fleet.FleetError, match=r"gpu-h200 needs GPU=1, H200=1 \(the 2 live node\(s\) advertise"):
        fleet.run(spec, address=nodes.address, db=tmp_path / "db.duckdb")
    assert not (tmp_path / "db.duckdb").exists()


def test_an_unreachable_cluster_is_said_at_once(fleet_repo, tmp_path):
    started = time.monotonic()
    with pytest.raises(fleet.FleetError, match="cannot reach the Ray cluster at 127.0.0.1:"):
        fleet.run(_spec(fleet_repo, ["x"], force=True), address=f"127.0.0.1:{localservices.free_port()}")
    assert time.monotonic() - started < 30


def test_a_node_killed_mid_run_fails_its_task_only_and_a_rerun_retries_just_that(cluster, fleet_repo, tmp_path):
    nodes, _ = cluster
    doomed = nodes.add_node(num_cpus=1, resources={"doomed_kind": 1})
    nodes.wait_for_nodes()
    markers = fleet_repo / "markers"
    markers.mkdir(exist_ok=True)
    (markers / "hold").touch()
    spec = fleet.FleetRun(kinds=[fleet.Kind.parse("steady:box_a=1"), fleet.Kind.parse("doomed:doomed_kind=1")],
                          bench=["^tinyfleet\\."], quick=True, checkout=str(fleet_repo), root=fleet_repo)
    db = tmp_path / "db.duckdb"
    found = {}
    runner_thread = threading.Thread(target=lambda: found.update(
        {o.machine: o for o in fleet.run(spec, address=nodes.address, db=db)}))
    runner_thread.start()
    deadline = time.monotonic() + 120
    while len(list(markers.glob("started-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(list(markers.glob("started-*"))) == 2, "the held benchmark did not start on both nodes"
    nodes.remove_node(doomed, allow_graceful=False)
    record_path = spec.record_path(fleet.runner.head_commit(fleet_repo))
    while "doomed" not in (json.loads(record_path.read_text()) if record_path.exists() else {}):
        assert time.monotonic() < deadline + 60, "the killed node's task was never reported"
        time.sleep(0.2)
    (markers / "hold").unlink()  # only now may the surviving node's benchmark finish
    runner_thread.join(timeout=180)
    assert not runner_thread.is_alive()
    assert found["steady"].status == "done" and found["doomed"].status == "failed"
    assert found["doomed"].detail  # what Ray said, recorded
    assert _machines(db) == [("steady",)]
    assert json.loads(record_path.read_text())["doomed"]["status"] == "failed"

    nodes.add_node(num_cpus=1, resources={"doomed_kind": 1})  # the node comes back
    nodes.wait_for_nodes()
    said = []
    rerun = {o.machine: o for o in fleet.run(spec, address=nodes.address, db=db, say=said.append)}
    assert rerun["steady"].status == "done before" and rerun["doomed"].status == "done"
    assert not any("steady on node" in line for line in said)
    assert _machines(db) == [("doomed",), ("steady",)]


def test_the_command_line_names_what_is_missing_before_connecting(capsys):
    from claimbench import cli
    assert cli.main(["fleet", "run", "--paper", "gandalf"]) == 2
    assert "--on NAME" in capsys.readouterr().err
    assert cli.main(["fleet", "run", "--on", "cpu-box"]) == 2
    assert "--paper ID or --bench REGEX" in capsys.readouterr().err
    assert cli.main(["fleet", "run", "--on", "cpu-box", "--paper", "no-such-paper"]) == 2
    assert "no-such-paper" in capsys.readouterr().err
