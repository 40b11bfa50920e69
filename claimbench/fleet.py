"""`claimbench fleet run`: the suites on the machines of a Ray cluster, one task per machine kind.

A machine kind is a name (what its results are saved under) and the resources a node must advertise
(`gpu-h200:GPU=1,H200=1`, `nvme-box:nvme=1`, `cpu-box`). Every kind gets one Ray task, pinned to one
node that has those resources; on that node the task runs the suites exactly as `claimbench run` does
there (the node's checkout, which must be at the fleet run's commit, and the node's own machine
record) and returns asv's result files, or publishes them to a bucket when one is given, for nodes
that share no filesystem with the driver. Tasks on one node run one after another, never two timing
at once; nodes run in parallel. A requirement no node meets is refused before anything runs. A task
that fails or whose node dies is recorded as failed and the others go on; the record
(`.claimbench/fleet/<commit8>-<mode>.json`) makes a rerun retry only what is not done.
"""
from __future__ import annotations

import json
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import ingest as ingest_module
from . import asvfiles, objectstore, runner
from .registry import REPO_ROOT

RECORD_DIR = Path(".claimbench") / "fleet"
RAY_NAMES = {"GPU": "num_gpus", "CPU": "num_cpus"}  # Ray's built-in resources, asked for by keyword


class FleetError(RuntimeError):
    """The fleet run cannot start: no cluster, or a requirement no node meets."""


@dataclass(frozen=True)
class Kind:
    """One machine kind: the machine name its results are saved under, and what a node must advertise."""
    machine: str
    needs: tuple[tuple[str, float], ...] = ()

    @classmethod
    def parse(cls, text: str) -> "Kind":
        """NAME or NAME:RESOURCE=AMOUNT,... (GPU and CPU are Ray's own; any other is a custom resource)."""
        name, _, spec = text.partition(":")
        if not name.strip():
            raise ValueError(f"--on {text!r}: give the machine name first, e.g. gpu-h200:GPU=1,H200=1")
        needs = []
        for item in filter(None, (part.strip() for part in spec.split(","))):
            resource, _, amount = item.partition("=")
            try:
                needs.append((resource.strip(), float(amount) if amount else 1.0))
            except ValueError:
                raise ValueError(f"--on {text!r}: {item!r} is not RESOURCE=AMOUNT") from None
        return cls(name.strip(), tuple(needs))

    def missing(self, resources: dict[str, float]) -> list[str]:
        """The requirements a node advertising these resources does not meet."""
        return [f"{name}={amount:g}" for name, amount in self.needs if resources.get(name, 0.0) < amount]

    def options(self) -> dict:
        """Ray task options asking for the kind's resources (one CPU unless the kind says otherwise)."""
        asked = {"num_cpus": 1, "resources": {}}
        for name, amount in self.needs:
            if name in RAY_NAMES:
                asked[RAY_NAMES[name]] = amount
            else:
                asked["resources"][name] = amount
        return asked


@dataclass
class Outcome:
    machine: str
    status: str  # done / failed / done before
    node: str | None = None
    detail: str = ""
    files: list[str] = field(default_factory=list)


def run_on_node(machine: str, commit: str, papers: list[str], bench: list[str], quick: bool,
                checkout: str | None, papers_file: str | None, bucket: str | None,
                endpoint_url: str | None) -> dict:
    """The Ray task: `claimbench run` on this node, then its run's files (and, with a bucket, published)."""
    from . import registry
    root = Path(checkout) if checkout else REPO_ROOT
    here = runner.head_commit(root)
    if here != commit:
        raise FleetError(f"{socket.gethostname()}: the checkout {root} is at {here[:8]}, the fleet run at "
                         f"{commit[:8]}; check out {commit[:8]} there and run again")
    reg = registry.load(papers_file) if papers else None
    rc = runner.run(reg, papers, quick=quick, machine=machine, bench=bench, root=root)
    mode = "quick" if quick else "full"
    results = runner.results_dir(root, mode)
    mine = asvfiles.run_files(results / machine).get(commit[:8], []) if (results / machine).is_dir() else []
    if not any(p.suffix == ".json" and not p.name.endswith(".claimbench.json") for p in mine):
        raise FleetError(f"{socket.gethostname()}: asv saved no results for {machine} (exit code {rc})")
    files = {f"{machine}/{p.name}": p.read_bytes() for p in mine}
    files.update({f"{machine}/{name}": (results / machine / name).read_bytes()
                  for name in asvfiles.SHARED_FILES if (results / machine / name).exists()})
    if (results / "benchmarks.json").exists():
        files["benchmarks.json"] = (results / "benchmarks.json").read_bytes()
    if bucket:
        objectstore.publish(bucket, {mode: results}, machine=machine, commit=commit, endpoint_url=endpoint_url)
    return {"rc": rc, "host": socket.gethostname(), "files": files}


@dataclass
class FleetRun:
    """What to run where: the papers' suites (and extra benchmark regexes) on every machine kind."""
    kinds: list[Kind]
    papers: list[str] = field(default_factory=list)
    bench: list[str] = field(default_factory=list)
    quick: bool = False
    bucket: str | None = None  # s3://BUCKET/PREFIX: nodes publish there, the driver ingests from there
    endpoint_url: str | None = None
    checkout: str | None = None  # the checkout on every node (default: where claimbench is installed there)
    papers_file: str | None = None
    root: Path = REPO_ROOT  # the driver's checkout: its commit, its results folder, its record
    force: bool = False  # rerun kinds already done at this commit

    @property
    def mode(self) -> str:
        return "quick" if self.quick else "full"

    def record_path(self, commit: str) -> Path:
        return self.root / RECORD_DIR / f"{commit[:8]}-{self.mode}.json"


def _alive_nodes(ray) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def place(kinds: list[Kind], nodes: list[dict]) -> dict[str, list[Kind]]:
    """node id -> the kinds it runs, each kind on a node that meets it, spread over as many nodes as can
    be. Raises FleetError naming every requirement no node meets, before anything runs."""
    unmet = []
    for kind in kinds:
        if all(kind.missing(n["Resources"]) for n in nodes):
            closest = min((kind.missing(n["Resources"]) for n in nodes), key=len, default=kind.missing({}))
            unmet.append(f"{kind.machine} needs {', '.join(closest)}")
    if unmet:
        advertised = sorted({r for n in nodes for r in n["Resources"] if not r.startswith("node:")})
        raise FleetError("no node meets: " + "; ".join(unmet) + f" (the {len(nodes)} live node(s) advertise "
                         f"{', '.join(advertised) or 'nothing'})")
    plan: dict[str, list[Kind]] = {n["NodeID"]: [] for n in nodes}
    for kind in sorted(kinds, key=lambda k: sum(not k.missing(n["Resources"]) for n in nodes)):  # scarcest first
        fits = [n["NodeID"] for n in nodes if not kind.missing(n["Resources"])]
        plan[min(fits, key=lambda node: len(plan[node]))].append(kind)
    return {node: placed for node, placed in plan.items() if placed}


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """Ray retries an unreachable cluster for minutes: a TCP connect says at once that nothing is there."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and the like: Ray resolves them
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise FleetError(f"cannot reach the Ray cluster at {address}: {e.strerror or e} (is `ray start --head` "
                         "running there, and is the port right?)") from None


def _connect(address: str | None):
    try:
        import ray
    except ImportError:
        raise FleetError("fleet runs need Ray: pip install 'claimbench[fleet]'") from None
    if address:
        _reachable(address)
    try:
        ray.init(address=address, log_to_driver=True, configure_logging=False,
                 **({} if address else {"include_dashboard": False}))
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as e:
        raise FleetError(f"cannot reach the Ray cluster at {address or 'a new local one'}: "
                         f"{str(e).strip().splitlines()[0]}") from None
    return ray


def _read_record(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _save(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def _write_files(results: Path, files: dict[str, bytes]) -> list[Path]:
    """A node's files into the driver's results folder (benchmarks.json merged, not replaced)."""
    written = []
    for name, content in files.items():
        target = results / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if name == "benchmarks.json":
            merged = _read_record(target)
            merged.update(json.loads(content))
            target.write_text(json.dumps(merged, sort_keys=True))
        else:
            target.write_bytes(content)
            written.append(target)
    return written


def _first_line(error: BaseException, limit: int = 300) -> str:
    """What a failed task said, in one line: its exception's last line (a remote traceback's own error)."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[-1].strip() if lines else ''}".strip()
    return text if len(text) <= limit else text[:limit] + "..."


def run(fleet: FleetRun, address: str | None = None, db=None, say=print) -> list[Outcome]:
    """Run every kind not yet done at HEAD on its node; record, gather and ingest what came back."""
    commit = runner.head_commit(fleet.root)
    record_path = fleet.record_path(commit)
    record = {} if fleet.force else _read_record(record_path)
    outcomes = [Outcome(k.machine, "done before", record[k.machine].get("node"), record[k.machine].get("detail", ""))
                for k in fleet.kinds if record.get(k.machine, {}).get("status") == "done"]
    todo = [k for k in fleet.kinds if k.machine not in {o.machine for o in outcomes}]
    if not todo:
        say(f"claimbench fleet: every kind is done at {commit[:8]} ({fleet.mode}); --force runs them again")
        return outcomes
    ray = _connect(address)
    try:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
        plan = place(todo, _alive_nodes(ray))
        task = ray.remote(run_on_node)
        queues = {node: deque(kinds) for node, kinds in plan.items()}
        running = {}

        def submit(node: str) -> None:
            kind = queues[node].popleft()
            ref = task.options(**kind.options(), max_retries=0,
                               scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
                kind.machine, commit, fleet.papers, fleet.bench, fleet.quick, fleet.checkout, fleet.papers_file,
                fleet.bucket, fleet.endpoint_url)
            running[ref] = (node, kind, time.monotonic())
            say(f"claimbench fleet: {kind.machine} on node {node[:8]} ({fleet.mode}, {commit[:8]})")

        for node in queues:
            submit(node)
        written = []
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            node, kind, started = running.pop(ready[0])
            try:
                result = ray.get(ready[0])
            except Exception as e:  # noqa: BLE001 - a failed task or a dead node: record it, go on
                outcome = Outcome(kind.machine, "failed", node, _first_line(e))
            else:
                files = _write_files(runner.results_dir(fleet.root, fleet.mode), result["files"])
                written += files
                outcome = Outcome(kind.machine, "done", node,
                                  f"{result['host']}, asv exit code {result['rc']}, {time.monotonic() - started:.0f} s",
                                  [str(f) for f in files])
            outcomes.append(outcome)
            record[kind.machine] = {"status": outcome.status, "node": node, "detail": outcome.detail,
                                    "at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
            _save(record_path, record)
            say(f"claimbench fleet: {kind.machine}: {outcome.status} ({outcome.detail})")
            if queues[node]:
                submit(node)
    finally:
        ray.shutdown()
    sources = [fleet.bucket] if fleet.bucket else written
    if sources and any(o.status == "done" for o in outcomes):
        report = ingest_module.ingest(sources, db=db, endpoint_url=fleet.endpoint_url)
        say(report.summary())
    return outcomes
