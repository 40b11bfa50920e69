"""claimbench command line: run, fleet run, kernels, ingest, publish, claims, alerts, report, device-run, app."""
from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path

from . import alerts, ingest, registry, report, runner, runplan, store, verdicts


def _add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help=f"DuckDB file (default: ${store.ENV_DB} or {store.DEFAULT_DB})")
    p.add_argument("--papers", help="papers.toml to read (default: the repository's)")


def _add_endpoint(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint-url", help="S3 API endpoint, for MinIO, Ceph and other S3 servers (default: "
                                          "$AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS)")


def cmd_run(args) -> int:
    reg = registry.load(args.papers)
    if args.serve:
        if args.paper or args.bench or args.stale or args.dry_run or args.publish:
            raise ValueError("--serve runs every suite, one at a time; leave out --paper, --bench, --stale, "
                             "--dry-run and --publish")
        from . import progressive
        return progressive.serve_and_run(reg, quick=args.quick, machine=args.machine, db=args.db, host=args.host,
                                         port=args.port)
    if args.budget is not None and not args.stale:
        raise ValueError("--budget goes with --stale: it chooses which stale papers to run")
    if args.publish and args.quick:
        raise ValueError("--publish files full runs as reference results; leave out --quick")
    if args.publish and not args.dry_run and (dirty := runner.uncommitted()):
        raise ValueError("--publish files reference results, which must measure their commit: commit or stash "
                         f"these changes first:\n{dirty}")
    # every run of this command is saved under the commit it starts at: committing one paper's published reports
    # while the next runs moves HEAD, not what is measured (runner.run fails a run whose code changed meanwhile)
    commit = None if args.dry_run else runner.head_commit()
    if args.stale:
        if args.paper or args.quick:
            raise ValueError("--stale chooses the papers itself, in full mode; leave out --paper and --quick")
        return _run_stale(reg, args, commit)
    code = runner.run(reg, args.paper, quick=args.quick, machine=args.machine, bench=args.bench, dry_run=args.dry_run,
                      commit=commit)
    if args.publish and not args.dry_run:
        _publish(args.machine or socket.gethostname(), commit)
        _reference_reports(reg)
    return code


def _publish(machine: str, commit: str) -> None:
    """--publish, after each run: this checkout's full runs of `machine` at `commit` into the reference results
    (reports/results/<machine>), merged into what is there at that commit."""
    from . import asvfiles
    target = registry.REPO_ROOT / runner.REFERENCE_RESULTS
    try:
        copied = asvfiles.copy_runs(runner.results_dir(mode="full"), target, machine=machine,
                                    commit=commit)
    except FileNotFoundError as e:  # asv saved nothing (it could not start): nothing to publish
        print(f"claimbench: nothing published: {e}", file=sys.stderr, flush=True)
        return
    print(f"claimbench: published {', '.join(copied)} into {target}", flush=True)


def _reference_reports(reg: registry.Registry) -> None:
    """--publish, at the end: reports/ and reports/alerts.md rewritten from the reference results alone."""
    _, found, written = report.reference(reg)
    opened = sum(a.status == "open" for a in found)
    print(f"claimbench: {opened} open alert(s); wrote {len(written)} report file(s) from the reference results "
          f"(reports/): `git add reports` and commit them with the results", flush=True)


def _run_stale(reg: registry.Registry, args, commit: str | None) -> int:
    """The stale papers (or those of them that fit --budget minutes), one asv run each, longest first; then
    any --bench expressions in a run of their own."""
    machine = args.machine or socket.gethostname()
    roots = [runner.results_dir(mode="full"), registry.REPO_ROOT / runner.REFERENCE_RESULTS]
    papers = _stale_papers(reg, machine, args.db, roots)
    if papers == []:
        print(f"claimbench: nothing stale on {machine}: every claim it can measure has a current full result")
        return 0
    papers = papers if papers is not None else [p.id for p in reg.papers if p.suite]
    found = runplan.estimates(reg, papers, [r for r in roots if r.exists()])
    budget_s = None if args.budget is None else args.budget * 60
    if budget_s is None:
        chosen, left = sorted(papers, key=lambda pid: -(found[pid].seconds or 0)), {}
    else:
        chosen, left = runplan.within(budget_s, found)
    print(f"claimbench: {'would run' if args.dry_run else 'runs'} {len(chosen)} paper(s), longest first"
          + (f", within {runplan.minutes(budget_s)}" if budget_s is not None else "") + ":"
          + "".join(f"\n  {pid}: {found[pid].describe()}" for pid in chosen))
    if left:
        print(f"claimbench: left for a later run ({len(left)}):" + "".join(f"\n  {pid}: {why}"
                                                                        for pid, why in left.items()))
    if not chosen and not args.bench:
        return 0  # (runner.run with no paper and no expression would run every suite)
    if args.dry_run:
        if args.publish:
            print(f"claimbench: and would publish each paper's results into {runner.REFERENCE_RESULTS / machine}, "
                  "then rewrite reports/ from the reference results")
        return runner.run(reg, chosen, machine=machine, bench=args.bench, dry_run=True)
    after = (lambda paper: _publish(machine, commit)) if args.publish else None
    worst = runplan.run_each(reg, chosen, found, machine, budget_s, after=after, commit=commit)
    if args.bench:
        worst = max(worst, runner.run(reg, [], machine=machine, bench=args.bench, commit=commit))
        if args.publish:
            _publish(machine, commit)
    if args.publish:
        _reference_reports(reg)
    return worst


def _stale_papers(reg: registry.Registry, machine: str, db, results: list[Path]) -> list[str] | None:
    """The papers `run --stale` runs on `machine` (verdicts.stale), judged on the results folders given (the
    reference results, this checkout's full runs), ingested into the store first; None (every paper) where it
    holds none of that machine's."""
    ingest.ingest([p for p in results if p.exists()], db=db)
    with store.connect(store.db_path(db)) as con:
        latest = verdicts.compute(con, reg, store_history=False)
    if not any(v.machine == machine for v in latest):
        print(f"claimbench: no results from {machine} in the store: every paper is stale there")
        return None
    papers = verdicts.stale(latest, machine)
    if papers:
        print(f"claimbench: {len(papers)} paper(s) stale on {machine}:" + "".join(
            f"\n  {paper}: {', '.join(why)}" for paper, why in papers.items()))
    return list(papers)


def cmd_ingest(args) -> int:
    rep = ingest.ingest(args.paths, db=args.db, wait_s=args.wait, endpoint_url=args.endpoint_url)
    print(rep.summary())
    return 0 if rep.ok else 1


def cmd_publish(args) -> int:
    from . import asvfiles, objectstore
    mode = "quick" if args.quick else "full"
    if not objectstore.is_url(args.url):  # a results folder: this checkout's full runs unless --quick
        source = Path(args.results) if args.results else runner.results_dir(mode=mode)
        copied = asvfiles.copy_runs(source, Path(args.url), machine=args.machine, commit=args.commit)
        print(f"copied {len(copied)} run(s) into {args.url}" + "".join(f"\n  {run}" for run in copied))
        return 0
    roots = {m: runner.results_dir(mode=m) for m in runner.CONFIGS}
    if args.results:
        roots = {mode: Path(args.results)}
    print(objectstore.publish(args.url, roots, machine=args.machine, commit=args.commit,
                              endpoint_url=args.endpoint_url).summary())
    return 0


def cmd_fleet_run(args) -> int:
    from . import fleet, objectstore
    if not args.on:
        raise ValueError("name at least one machine kind: --on NAME[:RESOURCE=AMOUNT,...] (repeatable)")
    if not args.paper and not args.bench:
        raise ValueError("choose what to run: --paper ID or --bench REGEX (repeatable)")
    reg = registry.load(args.papers)
    for pid in args.paper or []:
        runner.bench_patterns(reg, [pid])  # an unknown paper or one without a suite fails here, not on a node
    spec = fleet.FleetRun(kinds=[fleet.Kind.parse(k) for k in args.on], papers=args.paper or [],
                          bench=args.bench or [], quick=args.quick, bucket=args.bucket,
                          endpoint_url=args.endpoint_url or objectstore.endpoint_from_environment(),
                          checkout=args.checkout, papers_file=args.papers,
                          force=args.force)
    outcomes = fleet.run(spec, address=args.address, db=args.db)
    from tabulate import tabulate
    print(tabulate([[o.machine, o.status, (o.node or "")[:8], o.detail] for o in outcomes],
                   ["machine", "status", "node", "detail"]))
    return 0 if all(o.status != "failed" for o in outcomes) else 1


def _results_store(args, required: bool = True) -> Path | None:
    """The store the results are read from. Where it holds none: an error when required (a mistyped --db would
    read as 'nothing measured', and `report` would write that into reports/), else a note and None."""
    path = store.db_path(args.db)
    with store.connect(path, read_only=True) as con:
        if con is not None and con.execute("SELECT count(*) FROM results").fetchone()[0]:
            return path
    empty = (f"{path} holds no results: `claimbench ingest reports/results` loads the shipped reference results, "
             "`make run` this machine's quick runs as well")
    if required:
        raise FileNotFoundError(empty)
    print(f"claimbench {args.command}: {empty}", file=sys.stderr)
    return None


def cmd_claims(args) -> int:
    reg = registry.load(args.papers)
    for paper_id in args.paper or []:
        reg.paper(paper_id)  # an unknown id is an error naming the known ones
    path = _results_store(args, required=False)
    if path is None:  # the claims alone, every one not measured; no store is created
        latest = verdicts.compute(None, reg, store_history=False)
    else:
        with store.connect(path) as con:
            verdicts.sync_registry(con, reg)
            latest = verdicts.compute(con, reg)
    if args.paper:
        latest = [v for v in latest if v.claim.paper_id in args.paper]
    print(report.verdicts_json(latest) if args.json else report.claims_table(latest))
    return 0


def cmd_alerts(args) -> int:
    overrides = {}
    for item in args.threshold or []:
        pattern, _, value = item.rpartition("=")
        if not pattern:
            raise SystemExit(f"--threshold wants PATTERN=VALUE, got {item!r}")
        overrides[pattern] = float(value)
    with store.connect(_results_store(args)) as con:
        found = alerts.evaluate_as_configured(con, registry.load(args.papers), overrides=overrides)
    from tabulate import tabulate
    if found:
        print(tabulate([[a.kind, a.status, a.benchmark, a.params, a.machine, (a.commit_hash or "")[:8],
                         f"{a.change:+.1%}" if a.change is not None else "", a.detail] for a in found],
                       ["kind", "status", "benchmark / claim", "params", "machine", "commit", "change", "detail"]))
    if not any(a.status == "open" for a in found):
        print("No open regressions, gate failures or verdict flips.")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(alerts.markdown(found))
        print(f"wrote {args.markdown}")
    fail_kinds = set(alerts.KINDS) if "any" in (args.fail_on or []) else set(args.fail_on or [])
    failing = [a for a in found if a.kind in fail_kinds and a.status == "open"]
    if failing:
        print(f"claimbench alerts: {len(failing)} alert(s) of kind {', '.join(sorted(fail_kinds))}: failing",
              file=sys.stderr)
        return 1
    return 0


def cmd_report(args) -> int:
    reg = registry.load(args.papers)
    if args.reference:
        if args.db or args.out:
            raise ValueError("--reference writes reports/ from the reference results, in a store of its own; "
                             "leave out --db and --out")
        written = report.reference(reg)[2]
    else:
        with store.connect(_results_store(args)) as con:
            verdicts.sync_registry(con, reg)
            latest, history = verdicts.compute_with_history(con, reg)
        written = report.write(reg, latest, Path(args.out or registry.REPO_ROOT / "reports"), history)
    for path in written:
        print(f"wrote {path}")
    return 0


def preload_pages() -> None:
    """Import what the leaderboard's pages need before Streamlit starts, so that the first visitor does not wait
    for altair, pandas and the store to import (about 2 s here): Streamlit runs the pages in this process.
    Quietly: st.cache_data checks its arguments as each page function is decorated, and outside Streamlit's
    runtime each check logs "No runtime found, using MemoryCacheStorageManager" (13 lines at every start); the
    caches themselves are made at their first call, inside the runtime."""
    import altair  # noqa: F401
    import streamlit  # noqa: F401

    cache_log = logging.getLogger("streamlit.runtime.caching.cache_data_api")
    level = cache_log.level
    cache_log.setLevel(logging.ERROR)
    try:
        from claimbench.app import queries, views  # noqa: F401
    finally:
        cache_log.setLevel(level)


def cmd_app(args) -> int:
    app = Path(__file__).resolve().parent.parent / "app" / "main.py"
    os.environ[store.ENV_DB] = str(store.db_path(args.db).resolve())
    preload_pages()
    from streamlit.web import cli as streamlit_cli

    sys.argv = ["streamlit", "run", str(app), "--server.address", args.host, "--server.port", str(args.port),
                "--server.headless", "true", "--browser.gatherUsageStats", "false",
                "--client.toolbarMode", "viewer"]  # no Deploy button: the leaderboard is served where it runs
    print(f"claimbench leaderboard: http://{args.host}:{args.port}", flush=True)
    return streamlit_cli.main()


def cmd_kernels(args) -> int:
    rc, path = runner.run_kernels(args.machine, pattern=args.k)
    if args.no_ingest or not path.exists():
        return rc
    rep = ingest.ingest([path], db=args.db)
    print(rep.summary())
    return rc or (0 if rep.ok else 1)


def cmd_device_run(args) -> int:
    from . import device
    argv = (["--out", args.out] if args.out else []) + (["--dry-run"] if args.dry_run else [])
    argv += ["--compile-only", "--arch", str(args.arch)] if args.compile_only else []
    argv += ["--machine", args.machine] if args.machine else []
    argv += ["--commit", args.commit] if args.commit else []
    return device.main(argv)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="claimbench", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run the asv suites on this machine and save the results")
    p.add_argument("--paper", action="append", help="paper id from papers.toml (repeatable; default: all)")
    p.add_argument("--bench", action="append", help="extra asv --bench regular expression")
    p.add_argument("--quick", action="store_true", help="small inputs, one round: minutes, not hours")
    p.add_argument("--machine", help="machine name for asv (default: hostname)")
    p.add_argument("--papers", help="papers.toml to read")
    p.add_argument("--stale", action="store_true",
                   help="only the papers this machine has no current full result for: a claim not measured, quick "
                        "runs only, other inputs, no interval, or older code than another machine's whose verdict "
                        "differs (the reference results and this checkout's runs decide; --db: the store they are "
                        "ingested into)")
    p.add_argument("--budget", type=float, metavar="MINUTES",
                   help="with --stale: run only the stale papers that fit this many minutes (each estimated from "
                        "its latest full run on any machine), longest first; a paper that no longer fits is not "
                        "started. The rest, and how to split a paper longer than the budget, are listed")
    p.add_argument("--dry-run", action="store_true", help="say what would run (with --stale: which papers, why, and "
                                                           "about how long) and run nothing")
    p.add_argument("--serve", action="store_true", help="serve the leaderboard first, then run every suite one at a "
                                                         "time, ingesting each as it finishes (what make run does)")
    p.add_argument("--publish", action="store_true",
                   help="file the full runs as this machine's reference results: after each run (with --stale: "
                        "each paper) copy them into reports/results/MACHINE, then rewrite reports/ and "
                        "reports/alerts.md from the reference results alone, ready to commit")
    p.add_argument("--db", help="with --serve or --stale: the store")
    p.add_argument("--host", default="127.0.0.1", help="with --serve: the leaderboard's address")
    p.add_argument("--port", type=int, default=8501, help="with --serve: the leaderboard's port")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("ingest", help="load asv results (dirs, files or s3:// prefixes) and pytest-benchmark JSON "
                                      "into the store")
    p.add_argument("paths", nargs="+", help="results folders or files, or s3://BUCKET/PREFIX")
    p.add_argument("--db")
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait while another process holds the DB")
    _add_endpoint(p)
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("publish", help="upload this machine's result files to s3://BUCKET/PREFIX (per machine and "
                                       "commit), for claimbench ingest s3://... elsewhere; or copy them into a "
                                       "results folder (reports/results: the reference results)")
    p.add_argument("url", help="s3://BUCKET/PREFIX, or a folder of asv results (runs at a commit it holds already "
                               "are merged into its files)")
    p.add_argument("--machine", help="only this machine's results (default: every machine under the results)")
    p.add_argument("--commit", help="only this commit's (a prefix of its hash)")
    p.add_argument("--results", help="an asv results folder (default: this checkout's; both modes to s3://, the "
                                     "full-mode one to a folder)")
    p.add_argument("--quick", action="store_true", help="the results are quick-mode ones (with --results, or to a "
                                                        "folder: this checkout's quick-mode results)")
    _add_endpoint(p)
    p.set_defaults(func=cmd_publish)

    p = sub.add_parser("fleet", help="run suites on the machines of a Ray cluster (pip install 'claimbench[fleet]')")
    fleet_sub = p.add_subparsers(dest="fleet_command", required=True)
    p = fleet_sub.add_parser("run", help="one task per machine kind, each on a node with the kind's resources; "
                                         "results gathered (or published to --bucket) and ingested")
    p.add_argument("--on", action="append", metavar="NAME[:RESOURCE=AMOUNT,...]",
                   help="a machine kind: the name its results are saved under and what its node must advertise, "
                        "e.g. gpu-h200:GPU=1,H200=1 or nvme-box:nvme=1 (repeatable)")
    p.add_argument("--paper", action="append", help="paper id from papers.toml (repeatable)")
    p.add_argument("--bench", action="append", help="asv --bench regular expression (repeatable)")
    p.add_argument("--quick", action="store_true", help="the suites' quick mode")
    p.add_argument("--address", help="the Ray cluster (default: $RAY_ADDRESS, else a new local one-node cluster)")
    p.add_argument("--bucket", help="s3://BUCKET/PREFIX: nodes publish there and the driver ingests from there")
    _add_endpoint(p)
    p.add_argument("--checkout", help="the claimbench checkout on every node (default: where it is installed there)")
    p.add_argument("--force", action="store_true", help="run kinds already done at this commit again")
    p.add_argument("--papers", help="papers.toml to read")
    p.add_argument("--db")
    p.set_defaults(func=cmd_fleet_run)

    p = sub.add_parser("claims", help="print every claim with its verdict per machine")
    _add_db(p)
    p.add_argument("--paper", action="append")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_claims)

    p = sub.add_parser("alerts", help="regressions (asv step detection), gate failures, verdict flips")
    _add_db(p)
    p.add_argument("--markdown", help="also write the alerts as markdown (for a PR comment)")
    p.add_argument("--fail-on", action="append", choices=[*alerts.KINDS, "any"],
                   help="exit 1 when an alert of this kind is open (repeatable)")
    p.add_argument("--threshold", action="append", metavar="PATTERN=VALUE",
                   help="relative step threshold for benchmarks matching PATTERN ('*' = default)")
    p.set_defaults(func=cmd_alerts)

    p = sub.add_parser("report", help="write reports/index.md and one page per paper")
    _add_db(p)
    p.add_argument("--out", help="folder (default: the repository's reports/)")
    p.add_argument("--reference", action="store_true",
                   help="the repository's reports/ as it ships: its pages and alerts.md written from the reference "
                        "results alone (reports/results, reports/results-quick), not from a store")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("kernels", help="the kernel micro-benchmarks (pytest-benchmark, kernels/) on this machine, "
                                       "saved beside asv's results and ingested")
    p.add_argument("--machine", help="machine name, as for run (default: hostname)")
    p.add_argument("-k", help="only the kernels pytest -k selects")
    p.add_argument("--no-ingest", action="store_true", help="write the JSON only")
    p.add_argument("--db")
    p.set_defaults(func=cmd_kernels)

    p = sub.add_parser("device-run", help="every GPU benchmark, on a lent GPU machine (python -m claimbench.device "
                                          "where claimbench is not installed)")
    p.add_argument("--out", help="folder for the results, to bring back and ingest (required unless --compile-only)")
    p.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU: check the format, spend no GPU time")
    p.add_argument("--compile-only", action="store_true", help="compile every kernel for the GPU (--arch) here, on "
                                                                "the CPU: launch nothing, write nothing")
    p.add_argument("--arch", type=int, default=90, help="compute capability to compile for (default 90: H100, H200)")
    p.add_argument("--machine", help="machine name (default: gpu-<GPU name>)")
    p.add_argument("--commit", help="commit the results are filed under (default: git HEAD)")
    p.set_defaults(func=cmd_device_run)

    p = sub.add_parser("app", help="serve the Streamlit leaderboard")
    p.add_argument("--db")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8501)
    p.set_defaults(func=cmd_app)
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (registry.RegistryError, store.StoreError, ValueError, RuntimeError, FileNotFoundError,
            PermissionError) as e:
        print(f"claimbench {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
