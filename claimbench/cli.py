"""claimbench command line: run, kernels, ingest, claims, alerts, report, device-run, app."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import alerts as A
from . import ingest as I
from . import registry as R
from . import report, runner, store
from . import verdicts as V


def _add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", help=f"DuckDB file (default: ${store.ENV_DB} or {store.DEFAULT_DB})")
    p.add_argument("--papers", help="papers.toml to read (default: the repository's)")


def cmd_run(args) -> int:
    reg = R.load(args.papers)
    if args.serve:
        if args.paper or args.bench:
            raise ValueError("--serve runs every suite, one at a time; leave out --paper and --bench")
        from . import progressive
        return progressive.serve_and_run(reg, quick=args.quick, machine=args.machine, db=args.db, host=args.host,
                                         port=args.port)
    return runner.run(reg, args.paper, quick=args.quick, machine=args.machine, bench=args.bench)


def cmd_ingest(args) -> int:
    rep = I.ingest(args.paths, db=args.db, wait_s=args.wait)
    print(rep.summary())
    return 0 if rep.ok else 1


def _verdicts(args, con) -> list[V.Verdict]:
    reg = R.load(args.papers)
    V.sync_registry(con, reg)
    return V.compute(con, reg)


def cmd_claims(args) -> int:
    with store.connect(args.db) as con:
        latest = _verdicts(args, con)
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
    thresholds = A.Thresholds.from_pyproject(overrides=overrides)
    with store.connect(args.db) as con:
        found = A.evaluate(con, R.load(args.papers), thresholds, A.acknowledgements())
    from tabulate import tabulate
    if found:
        print(tabulate([[a.kind, a.status, a.benchmark, a.params, a.machine, (a.commit_hash or "")[:8],
                         f"{a.change:+.1%}" if a.change is not None else "", a.detail] for a in found],
                       ["kind", "status", "benchmark / claim", "params", "machine", "commit", "change", "detail"]))
    if not any(a.status == "open" for a in found):
        print("No open regressions, gate failures or verdict flips.")
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text(A.markdown(found))
        print(f"wrote {args.markdown}")
    fail_kinds = set(A.KINDS) if "any" in (args.fail_on or []) else set(args.fail_on or [])
    failing = [a for a in found if a.kind in fail_kinds and a.status == "open"]
    if failing:
        print(f"claimbench alerts: {len(failing)} alert(s) of kind {', '.join(sorted(fail_kinds))}: failing",
              file=sys.stderr)
        return 1
    return 0


def cmd_report(args) -> int:
    reg = R.load(args.papers)
    with store.connect(args.db) as con:
        V.sync_registry(con, reg)
        latest = V.compute(con, reg)
    for path in report.write(reg, latest, Path(args.out)):
        print(f"wrote {path}")
    return 0


def cmd_app(args) -> int:
    app = Path(__file__).resolve().parent.parent / "app" / "main.py"
    os.environ[store.ENV_DB] = str(store.db_path(args.db).resolve())
    # Streamlit runs the pages in this process: importing what they need now means the first
    # visitor does not wait for altair, pandas and the store to import (about 2 s here).
    import altair  # noqa: F401
    from streamlit.web import cli as streamlit_cli

    from claimbench.app import queries, views  # noqa: F401
    sys.argv = ["streamlit", "run", str(app), "--server.address", args.host, "--server.port", str(args.port),
                "--server.headless", "true", "--browser.gatherUsageStats", "false"]
    print(f"claimbench leaderboard: http://{args.host}:{args.port}", flush=True)
    return streamlit_cli.main()


def cmd_kernels(args) -> int:
    rc, path = runner.run_kernels(args.machine, pattern=args.k)
    if args.no_ingest or not path.exists():
        return rc
    rep = I.ingest([path], db=args.db)
    print(rep.summary())
    return rc or (0 if rep.ok else 1)


def cmd_device_run(args) -> int:
    from . import device
    argv = ["--out", args.out] + (["--dry-run"] if args.dry_run else [])
    argv += ["--machine", args.machine] if args.machine else []
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
    p.add_argument("--serve", action="store_true", help="serve the leaderboard first, then run every suite one at a "
                                                         "time, ingesting each as it finishes (what make run does)")
    p.add_argument("--db", help="with --serve: the store")
    p.add_argument("--host", default="127.0.0.1", help="with --serve: the leaderboard's address")
    p.add_argument("--port", type=int, default=8501, help="with --serve: the leaderboard's port")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("ingest", help="load asv results (dirs or files) and pytest-benchmark JSON into the store")
    p.add_argument("paths", nargs="+")
    p.add_argument("--db")
    p.add_argument("--wait", type=float, default=30.0, help="seconds to wait while another process holds the DB")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("claims", help="print every claim with its verdict per machine")
    _add_db(p)
    p.add_argument("--paper", action="append")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_claims)

    p = sub.add_parser("alerts", help="regressions (asv step detection), gate failures, verdict flips")
    _add_db(p)
    p.add_argument("--markdown", help="also write the alerts as markdown (for a PR comment)")
    p.add_argument("--fail-on", action="append", choices=[*A.KINDS, "any"],
                   help="exit 1 when an alert of this kind is open (repeatable)")
    p.add_argument("--threshold", action="append", metavar="PATTERN=VALUE",
                   help="relative step threshold for benchmarks matching PATTERN ('*' = default)")
    p.set_defaults(func=cmd_alerts)

    p = sub.add_parser("report", help="write reports/index.md and one page per paper")
    _add_db(p)
    p.add_argument("--out", default=str(R.REPO_ROOT / "reports"))
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
    p.add_argument("--out", required=True, help="folder for the results, to bring back and ingest")
    p.add_argument("--dry-run", action="store_true", help="toy sizes on the CPU: check the format, spend no GPU time")
    p.add_argument("--machine", help="machine name (default: gpu-<GPU name>)")
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
    except (R.RegistryError, store.StoreError, ValueError, RuntimeError, FileNotFoundError) as e:
        print(f"claimbench {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
