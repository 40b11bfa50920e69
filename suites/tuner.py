"""Accuracy-gated global tuner vs the default engine build (PAPERS.md A5), on ONNX Runtime CPU.

Per workload: the default build's latency (ORT defaults), the tuned winner's latency (the fastest
route passing the tensor gate and the held-out check), their ratio (both re-timed interleaved in
one process after the search), the gate numbers of the winner and its held-out result. TensorRT
is not installable here: the TensorRT claim is not testable.
Each workload's search runs in `mixed` mode within a stated time budget; every route is built and
timed in its own child process.
Olive's search (the second baseline): two Olive workflows per workload within a stated budget
(session tuning of the fp32 model; its joint search over ONNX quantization then session tuning),
every model it evaluated then gated and re-timed interleaved with the default by the same tuner
machinery (baselines/olive_search.py).
CLAIMBENCH_QUICK=1: three workloads, `fast` mode, a smaller budget; Olive on one workload.
"""
import hashlib
import logging
import tempfile
from pathlib import Path

from claimbench import evidence, measure, metrics
from claimbench.baselines import engine_build
from claimbench.baselines.engine_build import OrtBackend
from claimbench.datasets import onnx_workloads, vectors
from claimbench.impl.tuner import Tuner

from . import common

QUICK = common.QUICK
log = logging.getLogger(__name__)
QUICK_BUDGET_S = 450  # seconds in quick mode on 2 cores (its first run, building its cached inputs, took 381 s)
INPUTS = ("corpus", "smollm2-135m", "all-minilm-l6-v2")  # MiniLM's and SmolLM2's feeds and held-out text
WORKLOADS = ["cnn-small", "vit-tiny", "minilm-l6"] if QUICK else list(onnx_workloads.WORKLOADS)
MODE = "fast" if QUICK else "mixed"
BUDGET_S = 120 if QUICK else 600  # per workload
OLIVE_WORKLOADS = ["cnn-small"] if QUICK else list(onnx_workloads.WORKLOADS)
OLIVE_BUDGET_S = 30 if QUICK else 60  # each of Olive's two workflows per workload
OLIVE_GATING_BUDGET_S = 60 if QUICK else 120  # then gating its candidates, in olive_search.search's order


def route_cache(name: str) -> Path:
    """Tried routes of a workload, kept across runs (a crashed run resumes) for this backend's code and
    ORT version; the reported ratio is always re-timed, interleaved, in the run itself."""
    import onnxruntime
    code = hashlib.sha1(Path(engine_build.__file__).read_bytes()).hexdigest()[:10]
    path = vectors.cache_dir() / "tuner" / f"{name}-{MODE}-ort{onnxruntime.__version__}-{code}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def workload_result(r: dict, workload: str) -> dict:
    """One workload's entry of a setup_cache result; a workload that failed raises its error."""
    point = r[workload]
    if "error" in point:
        raise RuntimeError(f"{workload}: {point['error']}")
    return point


def tune(name: str) -> dict:
    try:
        workload = onnx_workloads.load(name)
        with tempfile.TemporaryDirectory() as tmp:
            result = Tuner(OrtBackend(), workload, mode=MODE, budget_s=BUDGET_S, repeats=5 if QUICK else 20,
                           cache=route_cache(name), workdir=Path(tmp)).run(progress=log.info)
    except Exception as e:  # noqa: BLE001 - one workload failing must not lose the others
        return {"error": f"{type(e).__name__}: {e}"}
    default, winner, interleaved = result["default"], result["winner"], result["interleaved"]
    if interleaved:
        log.info(f"{name}: default {interleaved[0] * 1e3:.2f} ms, winner {interleaved[1] * 1e3:.2f} ms "
                 f"({interleaved[0] / interleaved[1]:.2f}x) with {winner.route}")
    return {"default": interleaved[0] if interleaved else None, "default_passed": bool(default and default.passed),
            "speedup": measure.ratio_estimate(*result["rounds"]) if result["rounds"] else None,
            "winner": interleaved[1] if interleaved else None, "route": winner.route if winner else None,
            "gate": winner.gate if winner else None, "held_out": winner.held_out if winner else None,
            "tried": len(result["tried"]), "crashed": sum(r.status != "ok" for r in result["tried"]),
            "gate_failed": sum(r.status == "ok" and not r.passed for r in result["tried"])}


class Tuned:
    params = (WORKLOADS,)
    param_names = ["workload"]
    timeout = 7200

    def setup_cache(self):
        return {name: tune(name) for name in WORKLOADS}

    def track_default_latency(self, r, workload):
        return workload_result(r, workload)["default"]
    track_default_latency.unit = metrics.SECONDS.unit

    def track_tuned_latency(self, r, workload):
        return workload_result(r, workload)["winner"]
    track_tuned_latency.unit = metrics.SECONDS.unit

    @evidence.estimate
    def track_speedup_over_default(self, r, workload):
        """Per interleaved round, the default's latency / the winner's (the winner is the fastest of
        the finalists on these same rounds, so the ratio leans a little towards it)."""
        point = workload_result(r, workload)
        if point["winner"] is None or not point["default_passed"]:
            raise AssertionError(f"{workload}: no route passed the gate and the held-out check")
        return point["speedup"]
    track_speedup_over_default.unit = metrics.SPEEDUP.unit

    def track_winner_cosine(self, r, workload):
        return workload_result(r, workload)["gate"]["cosine"]
    track_winner_cosine.unit = metrics.COSINE.unit

    def track_winner_held_out(self, r, workload):
        return workload_result(r, workload)["held_out"]
    track_winner_held_out.unit = metrics.HELD_OUT.unit

    def track_routes_rejected(self, r, workload):
        point = workload_result(r, workload)
        return point["gate_failed"] + point["crashed"]
    track_routes_rejected.unit = metrics.COUNT.unit


def olive(name: str) -> dict:
    try:
        from claimbench.baselines import olive_search
        workload = onnx_workloads.load(name)
        with tempfile.TemporaryDirectory() as tmp:
            candidates = olive_search.search(workload, Path(tmp), OLIVE_BUDGET_S)
            result = Tuner(olive_search.OliveCandidates(candidates), workload, mode="fast",
                           budget_s=OLIVE_GATING_BUDGET_S,
                           repeats=5 if QUICK else 20, workdir=Path(tmp)).run(progress=log.info)
    except Exception as e:  # noqa: BLE001 - one workload failing must not lose the others
        return {"error": f"{type(e).__name__}: {e}"}
    winner, interleaved = result["winner"], result["interleaved"]
    chosen = candidates[winner.route["olive_candidate"]] if winner and winner.route["olive_candidate"] >= 0 else None
    kind = "the default build" if chosen is None else f"Olive's {'int8' if chosen['quantized'] else 'fp32'} model"
    log.info(f"{name}: Olive evaluated {len(candidates)} models; winner after our gate: {kind}")
    return {"speedup": interleaved[0] / interleaved[1] if interleaved else None,
            "latency": interleaved[1] if interleaved else None, "candidates": len(candidates),
            "passed": sum(r.passed for r in result["tried"] if r.route["olive_candidate"] >= 0)}


class OliveSearch:
    """Olive's best candidate that passes our gate vs the default build (the default itself when
    none passes and beats it: speedup 1.0)."""
    params = (OLIVE_WORKLOADS,)
    param_names = ["workload"]
    timeout = 7200

    def setup_cache(self):
        import importlib.util
        if importlib.util.find_spec("olive") is None:
            raise NotImplementedError("olive-ai is not installed")
        return {name: olive(name) for name in OLIVE_WORKLOADS}

    def track_olive_speedup_over_default(self, r, workload):
        return workload_result(r, workload)["speedup"]
    track_olive_speedup_over_default.unit = metrics.SPEEDUP.unit

    def track_olive_latency(self, r, workload):
        return workload_result(r, workload)["latency"]
    track_olive_latency.unit = metrics.SECONDS.unit

    def track_olive_candidates(self, r, workload):
        return workload_result(r, workload)["candidates"]
    track_olive_candidates.unit = metrics.COUNT.unit

    def track_olive_candidates_passing_gate(self, r, workload):
        return workload_result(r, workload)["passed"]
    track_olive_candidates_passing_gate.unit = metrics.COUNT.unit
