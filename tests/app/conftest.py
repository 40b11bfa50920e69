"""A fixture store with measured, failed-gate, not-testable and not-measured claims; the __main__ module
kept across Streamlit's AppTest."""
import itertools
import json
import sys

import pytest

from claimbench import asvfiles, environment, evidence, ingest, intervals

DATASETS = ["glove-50-angular", "spectrum-256-decay1.5"]
TARGETS = ["0.999", "0.9999"]
NPROBES = [4, 16, 64]


@pytest.fixture(autouse=True)
def main_module_kept():
    """Streamlit's AppTest runs a page as __main__ and leaves it there. Every process the later tests
    spawn (measure.in_child) would run that page again first, seconds each: put the real __main__ back."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


def lychee_run(results, machine, i, speedups, identical, machine_info=None):
    claim = {"dataset": DATASETS, "target_recall": TARGETS}

    def grid(values):
        return (list(claim), list(claim.values()), values, None)

    n = len(DATASETS) * len(TARGETS)
    benches = {
        "lychee.ClaimSpeedup.track_speedup": (*grid(speedups)[:3], "x"),
        "lychee.ClaimSpeedup.track_identical_rate": (*grid([identical] * n)[:3], "fraction identical"),
        "lychee.ClaimSpeedup.track_qps_lychee": (*grid([1000.0 * s for s in speedups])[:3], "queries/s"),
        "lychee.ClaimSpeedup.track_qps_ivf_flat": (*grid([1000.0] * n)[:3], "queries/s"),
    }
    sweep = list(itertools.product(DATASETS, NPROBES))
    recall = [min(1.0, 0.9 + 0.03 * k) for k, _ in enumerate(sweep)]
    benches.update({
        "lychee.Sweep.track_recall": (["dataset", "nprobe"], [DATASETS, NPROBES], recall, "recall@10"),
        "lychee.Sweep.track_qps_ivf_flat": (["dataset", "nprobe"], [DATASETS, NPROBES],
                                            [4000.0 / (1 + k) for k in range(len(sweep))], "queries/s"),
        "lychee.Sweep.track_qps_lychee": (["dataset", "nprobe"], [DATASETS, NPROBES],
                                          [6000.0 / (1 + k) for k in range(len(sweep))], "queries/s"),
        "lychee.Sweep.track_identical_rate": (["dataset", "nprobe"], [DATASETS, NPROBES], [identical] * len(sweep),
                                              "fraction identical"),
    })
    benches.update({  # boards whose methods are a parameter's values; lower-is-better cost
        "ugds.ReadPaths.track_iops": (["path", "block_bytes", "queue_depth"],
                                      [["sync-pread", "io-uring-batched"], [4096], [1, 32]],
                                      [10_000.0, None, 11_000.0, 80_000.0], "IOPS"),
        "ugds.Claim.track_identical_bytes": ([], [], [identical], "fraction identical"),
        "agent_cache.Cost.track_cost_per_task": (["policy", "provider"], [["full-history", "kv-drop"], ["anthropic"]],
                                                 [2.0, 1.5], "USD"),
        "agent_cache.Claim.track_recent_accuracy_vs_full": (["provider"], [["anthropic"]], [1.0], "accuracy ratio"),
    })
    proxies = (["proxy", "method"], [["pq-2x6", "exact"], ["ssa", "top-k"]])
    shares = [33.0, 33.0, 100.0, 130.0]
    benches.update({
        "ssa.ProxySweep.track_share_of_dense": (*proxies, shares, "%"),
        "ssa.ProxySweep.track_attention_relative_error": (*proxies, [0.34, 0.29, 0.13, 0.18], "relative error"),
    })
    commit = f"{i + 1:08x}" + "0" * 32
    asvfiles.write_run(results, machine, commit, 1_700_000_000_000 + i * 86_400_000, benches)
    for (proxy, method), share in zip(itertools.product(*proxies[1]), shares):  # the share's interval, as a run keeps it
        evidence.record("ssa.ProxySweep.track_share_of_dense", {"proxy": proxy, "method": method},
                        intervals.Estimate(share, share - 20, share + 20, 12, "paired bootstrap over items"),
                        results / machine / f"{commit[:8]}{evidence.SUFFIX}")
    if machine_info:
        (results / machine / environment.SIDECAR).write_text(json.dumps(machine_info))


@pytest.fixture(scope="session")
def fixture_db(tmp_path_factory):
    root = tmp_path_factory.mktemp("appdb")
    results = root / "results"
    results.mkdir()
    for i in range(6):  # cpu-box: reproduced, then a regression at the last commit
        drop = 0.5 if i == 5 else 1.0
        lychee_run(results, "cpu-box", i, [0.4 * drop, 0.4 * drop, 12.0 * drop, 11.0 * drop], 1.0)
    lychee_run(results, "gpu-box", 0, [0.5, 0.5, 15.0, 14.0], 0.9,  # every gate fails here
               machine_info={"gpu": "NVIDIA H200", "gpu_count": 1, "driver": "570", "cuda": "12.8",
                             "libraries": {"torch": "2.13.0", "faiss-gpu-cu12": "1.15"},
                             "numba_vectors": "full width (AVX-512)",
                             "io_uring": "liburing 2026.3.30's compiled module uses instructions this CPU lacks: SIGILL"})
    db = root / "fixture.duckdb"
    assert ingest.ingest([results], db=db).ok
    return db


@pytest.fixture
def use_db(fixture_db, monkeypatch):
    monkeypatch.setenv("CLAIMBENCH_DB", str(fixture_db))
    return fixture_db


@pytest.fixture
def empty_db(tmp_path, monkeypatch):
    path = tmp_path / "empty.duckdb"
    monkeypatch.setenv("CLAIMBENCH_DB", str(path))
    return path
