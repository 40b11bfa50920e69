"""Olive's search (microsoft/Olive, `olive-ai`) as the tuner's second baseline (PAPERS.md A5 asks
to compare with it where feasible).

Olive runs two workflows, each within a stated time budget, with average latency on the timing
input as the objective: ORT session-parameter tuning of the fp32 model, and a joint random search
over ONNX quantization (dynamic or static, over its own space of activation/weight types,
calibration methods and formats; static calibration on the gate inputs) followed by session tuning
(Olive's search always applies every configured pass, so without the first workflow each candidate
would be quantized). Every model it evaluated (read from its footprint) is then judged by our
tuner exactly as it judges its own routes (`OliveCandidates`: one knob whose values are Olive's
candidates; each built and timed in a child, gated with the tensor gate and the held-out check,
the fastest passing ones re-timed interleaved with the default build), so the two ratios are
measured the same way. Our gate filters Olive's candidates instead of being its accuracy
goal because olive-ai 0.13.0 cannot serialize a custom metric (its `Metric.backend` validator
returns None for custom metrics and the serializer then fails). Runs offline: the model is our ONNX
file and the data our workload's inputs.

This file is also the user script Olive loads: it registers the workload's inputs as an Olive dataset.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("OLIVE_DISABLE_TELEMETRY", "1")  # no phoning home from a benchmark (nor a network here)

from olive.data.registry import Registry  # noqa: E402

from claimbench.baselines.engine_build import QUIET_BETWEEN_RUNS, OrtBackend  # noqa: E402
from claimbench.impl.tuner import default_route  # noqa: E402
from claimbench.interfaces import EngineBackend, Knob  # noqa: E402

THIS = str(Path(__file__).resolve())


@Registry.register_dataset()
def claimbench_workload_inputs(name: str, split: str = "gate"):
    """The workload's feed dicts (already batches), each with a dummy label."""
    from claimbench.datasets import onnx_workloads
    workload = onnx_workloads.load(name)
    feeds = workload.gate_feeds() if split == "gate" else [workload.timing_feeds()]
    return [(f, 0) for f in feeds]


def workflow(workload, workdir: Path, budget_s: int, quantize: bool) -> dict:
    """Olive's run config: joint random search over quantization (when `quantize`) and session
    parameters."""
    def name(split):  # Olive allows letters, digits and underscores in data config names
        return f"{workload.name}_{split}".replace("-", "_")

    def data(split):
        return {"name": name(split), "type": "DataContainer", "user_script": THIS,
                "load_dataset_config": {"type": "claimbench_workload_inputs",
                                        "params": {"name": workload.name, "split": split}},
                "dataloader_config": {"type": "no_auto_batch_dataloader"}}
    return {
        "input_model": {"type": "ONNXModel", "model_path": workload.onnx_path},
        "systems": {"local": {"type": "LocalSystem", "accelerators": [
            {"device": "cpu", "execution_providers": ["CPUExecutionProvider"]}]}},
        "data_configs": [data("gate"), data("timing")],
        "evaluators": {"latency": {"type": "OnnxEvaluator", "metrics": [
            {"name": "latency", "type": "latency", "data_config": name("timing"),
             "sub_types": [{"name": "avg", "priority": 1}]}]}},
        "passes": {**({"quantize": {"type": "OnnxQuantization", "data_config": name("gate")}} if quantize else {}),
                   "session": {"type": "OrtSessionParamsTuning", "data_config": name("timing")}},
        "search_strategy": {"execution_order": "joint", "sampler": "random", "max_time": budget_s},
        "evaluator": "latency", "host": "local", "target": "local",
        "cache_dir": str(workdir / "olive-cache"), "output_dir": str(workdir / "olive-output"),
        "log_severity_level": 3,
    }


def search(workload, workdir: Path, budget_s: int) -> list[dict]:
    """Every model Olive evaluated in two workflows (session parameters on the fp32 model; quantization
    then session parameters), each within `budget_s`, read from its footprints: the fp32 workflow's
    few first, then the quantized ones fastest first by Olive's latency (so a gating budget reaches
    both): [{"model_path", "inference_settings", "olive_latency_ms", "quantized"}]."""
    from olive.workflows import run as olive_run
    candidates = []
    for quantize in (False, True):
        out = Path(workdir) / ("int8" if quantize else "fp32")
        olive_run(workflow(workload, out, budget_s, quantize))
        nodes = json.loads((out / "olive-output" / "footprint.json").read_text()).values()
        candidates += [{"model_path": n["model_config_data"]["config"]["model_path"],
                        "inference_settings": n["model_config_data"]["config"].get("inference_settings") or {},
                        "olive_latency_ms": n["metrics"]["value"]["latency-avg"]["value"], "quantized": quantize}
                       for n in nodes if n["parent_model_id"] and n.get("metrics") and n.get("model_config_data")]
    return sorted(candidates, key=lambda c: (c["quantized"], c["olive_latency_ms"]))


class OliveCandidates(EngineBackend):
    """Olive's candidates as the values of one knob; -1, the default, is OrtBackend's default build, so
    the tuner's fast mode gates every candidate and re-times the fastest passing ones interleaved with
    the default. Every session is quiet between runs, as OrtBackend's are."""
    name = "olive"
    module = "olive"

    def __init__(self, candidates: list[dict]):
        self.candidates = candidates

    def knobs(self, workload) -> list[Knob]:
        return [Knob("olive_candidate", tuple(range(-1, len(self.candidates))), -1)]

    def build(self, workload, route: dict, workdir: Path):
        from olive.common.ort_inference import get_ort_inference_session
        index = route["olive_candidate"]
        if index < 0:
            default = OrtBackend()
            return default.build(workload, default_route(default.knobs(workload)), workdir)
        candidate = self.candidates[index]
        settings = {"execution_provider": ["CPUExecutionProvider"], **candidate["inference_settings"]}
        session_options = dict(settings.get("session_options") or {})
        session_options["extra_session_config"] = {**(session_options.get("extra_session_config") or {}),
                                                   **QUIET_BETWEEN_RUNS}
        settings["session_options"] = session_options
        return get_ort_inference_session(candidate["model_path"], "cpu", settings)

    def run(self, engine, feeds: dict) -> list:
        return engine.run(None, feeds)
