"""`claimbench run`: asv on the existing environment, saved under HEAD's commit hash.

asv only saves results for `--python=same` runs given `--set-commit-hash`, and `--quick` never
saves; claimbench's quick mode is therefore the suites' own small inputs (CLAIMBENCH_QUICK=1)
with one round per benchmark, run and saved normally, but into results of its own
(`asv.quick.conf.json`: `.asv/results-quick/`), so a quick run never overwrites or joins a full
run's series. Beside asv's file the run leaves, per machine and commit, `<commit>.claimbench.json`
(the mode, every suite's input digests, the environment, and the machine-speed probes timed before
and after asv, claimbench.machinespeed, under each suite that ran) and `<commit>.evidence.jsonl` (the
intervals and samples behind the claims' numbers, claimbench.evidence), which ingest reads.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from asv.machine import Machine, MachineCollection

from . import environment, evidence, inputs, machinespeed, suitelog
from .registry import REPO_ROOT, Registry

QUICK_ENV = "CLAIMBENCH_QUICK"
CONFIGS = {"full": "asv.conf.json", "quick": "asv.quick.conf.json"}
REFERENCE_RESULTS = Path("reports") / "results"  # the shipped reference results, one folder per machine
HARDWARE = ("arch", "cpu", "num_cpu")  # what asv's machine file says of the hardware (its OS and RAM vary by boot)


def asv_config(root: Path = REPO_ROOT, mode: str = "full") -> dict:
    return json.loads((root / CONFIGS[mode]).read_text())


def results_dir(root: Path = REPO_ROOT, mode: str = "full") -> Path:
    return root / asv_config(root, mode)["results_dir"]


def head_commit(root: Path = REPO_ROOT) -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"{root} is not a git checkout with a commit; asv needs one to save results") from e


def write_machine_file(name: str) -> dict:
    """asv's ~/.asv-machine.json entry for this machine (for asv commands run by hand), written without
    prompting; under a lock, since several runs on one host (a local fleet's nodes) would otherwise
    lose each other's entries, and through a renamed copy, since asv reads the file unlocked (an
    in-place write read half-way is empty JSON to asv). claimbench's own asv runs read a private copy
    (claimbench.asv_run), as asv rewrites the file it reads in place."""
    info = {**Machine.get_defaults(), "machine": name}
    path = Path(MachineCollection.get_machine_file_path())
    with Path(f"{path}.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        staged = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        if path.is_file():
            shutil.copyfile(path, staged)
        MachineCollection.save(name, info, _path=str(staged))
        os.replace(staged, path)
    return info


def other_hardware(machine: str, root: Path = REPO_ROOT) -> str | None:
    """Why this machine must not save results under `machine`'s name: the reference results recorded
    under that name (REFERENCE_RESULTS/<machine>/: asv's machine.json, and whether the runs' environment
    records had AVX-512) describe other hardware, and asv would file this machine's numbers in that machine's
    series. None where the name is free or the hardware matches."""
    path = root / REFERENCE_RESULTS / machine / "machine.json"
    if not path.is_file():
        return None
    recorded, here = json.loads(path.read_text()), Machine.get_defaults()
    differ = [key for key in HARDWARE if str(recorded.get(key)) != str(here.get(key))]
    records = map(environment.read_run_record, path.parent.glob(f"*{environment.RECORD_SUFFIX}"))
    had = {environment.recorded_avx512(record.get("environment") or {}) for record in records} - {None}
    if len(had) == 1 and environment.avx512() not in had:  # all its runs had AVX-512 (or none had), this CPU not
        recorded, here = {**recorded, "AVX-512": had.pop()}, {**here, "AVX-512": environment.avx512()}
        differ.append("AVX-512")
    if not differ:
        return None
    def describe(info: dict) -> str:
        return ", ".join(f"{key} {info.get(key)!r}" if key != "AVX-512" else "AVX-512" if info[key] else "no AVX-512"
                         for key in differ)
    return (f"{machine}'s reference results ({path.parent.relative_to(root)}) were measured on {describe(recorded)}; "
            f"this machine has {describe(here)}. Run it on {machine} itself; here, leave out --machine (results go "
            "under this machine's hostname) or pass a name of this machine's own")


def bench_patterns(registry: Registry, paper_ids: list[str]) -> list[str]:
    patterns = []
    for pid in paper_ids:
        paper = registry.paper(pid)
        if not paper.suite:
            raise ValueError(f"paper {pid!r} has no asv suite yet (papers.toml: suite is not set)")
        patterns.append(rf"^{re.escape(paper.suite)}\.")
    return patterns


def unrunnable(suites: list[str], root: Path = REPO_ROOT, registry: Registry | None = None) -> dict[str, str]:
    """suite -> why, for the suites that need what this machine lacks: asv would take minutes to start such a
    suite only to skip its every row (or, for ugds without a working liburing, to see its setup die). A suite
    needs its module's REQUIRES (`("gpu",)` in suites/gpu.py) and, with the registry, what every claim of its
    paper requires (papers.toml: ugds's claims all need io_uring)."""
    requires = {suite: tuple(found[0] or ()) for suite in suites
                if (found := inputs.module_literal(root / "suites" / f"{suite}.py", "REQUIRES"))}
    for paper in (registry.papers if registry else []):
        if paper.suite in suites and paper.claims:
            shared = set.intersection(*(set(c.requires) for c in paper.claims))
            requires[paper.suite] = tuple(requires.get(paper.suite, ())) + tuple(sorted(shared))
    requires = {suite: needs for suite, needs in requires.items() if needs}
    if not requires:  # (describing the machine asks nvidia-smi and every library's version)
        return {}
    env = environment.describe()
    caps = environment.capabilities(env)
    return {suite: why for suite, needs in requires.items() if (why := environment.unmet(needs, caps, env))}


def skipped_line(suite: str, why: str) -> str:
    return f"claimbench: {suite} skipped: it {why}, which this machine lacks"


_FAILED = re.compile(r"\s(failed|timeout)\s*$")


CODE_FOLDERS = ("suites", "impl", "baselines", "datasets", "claimbench")


def _say(line: str) -> None:
    """A suite's progress line (claimbench.suitelog), between asv's own."""
    print(f"claimbench: {line}", flush=True)


def code_stamp(root: Path = REPO_ROOT) -> str:
    """Hash of everything a benchmark imports from this checkout. asv discovers the benchmarks
    (their parameter lists) once, then imports them again per benchmark: an edit in between
    saves values under the wrong parameter labels."""
    digest = hashlib.sha1()
    for folder in CODE_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()


def uncommitted(root: Path = REPO_ROOT) -> str:
    """`git status --porcelain` of the code folders: what a run would measure that its commit does not hold."""
    return subprocess.run(["git", "status", "--porcelain", "--", *CODE_FOLDERS], cwd=root, capture_output=True,
                          text=True).stdout.strip()


def _descendants(pid: int) -> list[int]:
    """Every process below pid (Linux: /proc/<pid>/task/<tid>/children), deepest last."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


def stop_tree(pid: int, grace_s: float = 10.0) -> None:
    """Stop a process and everything under it. asv runs each benchmark in a session of its own, so
    Ctrl-C at the terminal reaches asv but not the benchmark, and asv waits for it."""
    victims = [pid, *_descendants(pid)]
    for p in reversed(victims):
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    def alive(p: int) -> bool:
        try:
            return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone
        except (OSError, IndexError):
            return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(map(alive, victims)):
        time.sleep(0.1)
        try:
            os.waitpid(pid, os.WNOHANG)  # reap asv itself (a zombie keeps its /proc entry)
        except ChildProcessError:
            pass
    for p in victims:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run(registry: Registry, paper_ids: list[str] | None = None, quick: bool = False, machine: str | None = None,
        bench: list[str] | None = None, root: Path = REPO_ROOT, dry_run: bool = False,
        commit: str | None = None) -> int:
    """Run the suites with asv, streaming its progress; with dry_run, say what would run and run nothing.
    Without papers or bench patterns, every suite but those this machine cannot run (unrunnable), each
    named in one line. Results are saved under `commit` (default: HEAD now).

    Returns 0 when every benchmark ran, 1 when some failed (they are saved as failed and the
    others as measured), and asv's own code when asv itself could not run. Refuses a machine name
    whose reference results describe other hardware (other_hardware).
    """
    machine = machine or socket.gethostname()
    mode = "quick" if quick else "full"
    patterns = bench_patterns(registry, paper_ids or []) + (bench or [])
    suites = [] if patterns else list(inputs.declared(root / "suites"))
    skipped = unrunnable(suites, root, registry)
    for suite, why in skipped.items():
        print(skipped_line(suite, why), flush=True)
    if skipped:  # every suite but those: asv selects a benchmark that any --bench matches
        patterns = [rf"^{suite}\." for suite in suites if suite not in skipped]
    mismatch = other_hardware(machine, root)
    if dry_run:
        print(f"claimbench: would run asv on {machine} ({mode} mode), "
              + (f"every suite but {', '.join(skipped)}" if skipped else
                 f"benchmarks matching {' or '.join(patterns)}" if patterns else "every suite"), flush=True)
        if mismatch:
            print(f"claimbench: and would refuse: {mismatch}", flush=True)
        return 0
    if mismatch:
        raise ValueError(mismatch)
    info = write_machine_file(machine)
    commit = commit or head_commit(root)
    machine_dir = results_dir(root, mode) / machine
    private = tempfile.TemporaryDirectory(prefix="claimbench-asv-")
    machine_file = Path(private.name) / "asv-machine.json"  # this run's own: see claimbench.asv_run
    MachineCollection.save(machine, info, _path=str(machine_file))
    cmd = [sys.executable, "-m", "claimbench.asv_run", str(machine_file), "--config", str(root / CONFIGS[mode]),
           "--python=same", "--set-commit-hash", commit, "--machine", machine, "--show-stderr"]
    if quick:
        cmd += ["-a", "rounds=1", "-a", "repeat=(1, 5, 5.0)"]
    for pattern in patterns:
        cmd += ["--bench", pattern]
    suite_log = Path(private.name) / "suites.log"  # the suites' progress lines (claimbench.suitelog)
    env = {**os.environ, QUICK_ENV: "1" if quick else "0",
           evidence.ENV: str(machine_dir / f"{commit[:8]}{evidence.SUFFIX}"), suitelog.ENV: str(suite_log)}
    print(f"claimbench: asv run on {machine} at {commit[:8]} ({mode} mode, results in {machine_dir})", flush=True)
    if dirty := uncommitted(root):
        print(f"claimbench: uncommitted changes; results are saved under {commit[:8]} but measure the working "
              f"tree:\n{dirty}", file=sys.stderr, flush=True)
    failed, stamp = [], code_stamp(root)
    print("claimbench: timing the machine-speed probes before the suites", flush=True)
    started, speed_before = time.time(), machinespeed.measure()
    with private, suitelog.followed(suite_log, _say), subprocess.Popen(
            cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as proc:
        try:
            for line in proc.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                if _FAILED.search(line) and "···" in line:
                    failed.append(line.split("···")[-1].strip())
        except KeyboardInterrupt:  # Ctrl-C: stop asv too (what it saved before stays), then pass it on
            stop_tree(proc.pid)
            raise
    print("claimbench: timing the machine-speed probes after the suites", flush=True)
    speed = {"before": speed_before, "after": machinespeed.measure(), "unit": machinespeed.UNIT,
             "started": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds")}
    environment.write_sidecar(machine_dir)
    environment.write_run_record(machine_dir, commit, mode,
                                 inputs.recorded(root / asv_config(root, mode)["benchmark_dir"]),
                                 {suite: speed for suite in suites_started(machine_dir, commit, started)})
    if code_stamp(root) != stamp:
        print("claimbench: the code under suites/, impl/, baselines/, datasets/ or claimbench/ changed while asv "
              f"ran; results saved for {commit[:8]} may carry the wrong parameter labels. Commit, then run again.",
              file=sys.stderr)
        return 1
    if failed:
        print(f"claimbench: {len(failed)} benchmark(s) failed and were recorded as failed:", *failed, sep="\n  ")
        return 1
    return proc.returncode


def suites_started(machine_dir: Path, commit: str, since: float) -> list[str]:
    """The suites with a benchmark that asv started at or after `since` (seconds since the epoch), by
    the started_at column of asv's results files for this commit."""
    found = set()
    for path in machine_dir.glob(f"{commit[:8]}-*.json"):
        try:
            data = json.loads(path.read_text())
            column = data["result_columns"].index("started_at")
            rows = data["results"].items()
        except (OSError, json.JSONDecodeError, KeyError, ValueError, AttributeError):
            continue
        found |= {inputs.suite_of(name) for name, row in rows
                  if len(row) > column and row[column] and row[column] >= since * 1000}
    return sorted(found)


KERNELS_DIR = "kernels"
KERNELS_SUFFIX = "-kernels.json"


def run_kernels(machine: str | None = None, root: Path = REPO_ROOT, pattern: str | None = None) -> tuple[int, Path]:
    """The kernel micro-benchmarks (kernels/, pytest-benchmark) into this machine's full-mode results
    folder as `<commit>-kernels.json`, under the same machine name and commit as asv's runs.
    Returns pytest's exit code and the JSON's path (written only when some kernel ran)."""
    machine = machine or socket.gethostname()
    mismatch = other_hardware(machine, root)
    if mismatch:
        raise ValueError(mismatch)
    write_machine_file(machine)
    commit = head_commit(root)
    out = results_dir(root, "full") / machine / f"{commit[:8]}{KERNELS_SUFFIX}"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", str(root / KERNELS_DIR), "-q", "-p", "no:cacheprovider",
           f"--benchmark-json={out}", "--benchmark-save-data", "--benchmark-max-time=0.5",
           "--benchmark-min-rounds=7"] + (["-k", pattern] if pattern else [])
    print(f"claimbench: kernels on {machine} at {commit[:8]} into {out}", flush=True)
    rc = subprocess.run(cmd, cwd=root, env={**os.environ, "CLAIMBENCH_MACHINE": machine}).returncode
    return rc, out
