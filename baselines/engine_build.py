"""Engine backends for the tuner: ONNX Runtime on CPU here, TensorRT where it imports.

The baseline of the tuner claim is the default build: ONNX Runtime's defaults (all graph
optimizations, its own thread count, sequential execution, no quantization), i.e. the default
route of OrtBackend's knobs.
ORT knobs: graph optimization level; individually disabled optimizers; int8 dynamic quantization
of MatMul weights, placed three ways: everywhere, excluding the MatMuls whose weights have the worst
outlier ratio max|w|/std, or only on the least sensitive share of MatMuls (each MatMul quantized
alone, ranked by the error it causes on the gate inputs: the paper's quantization placement,
reconstructed); 4-bit MatMulNBits weights; intra-op threads; thread spinning; execution mode;
memory-pattern planning.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from claimbench.impl.tuner import Backend, Knob


class OrtBackend(Backend):
    name = "onnxruntime-cpu"
    module = "onnxruntime"

    def knobs(self, workload) -> list[Knob]:
        return [
            Knob("opt_level", ("all", "extended", "basic", "disabled"), "all"),
            Knob("disabled_optimizers", ("none", "attention+gelu fusions", "matmul-add fusion"), "none"),
            Knob("quantization", ("none", "int8-dynamic", "int8-dynamic-excluding-outliers",
                                  *(f"int8-least-sensitive-{p}%" for p in PLACEMENT_SHARES), "int4-matmulnbits"), "none"),
            Knob("threads", (0, 1, 2), 0),
            Knob("spinning", (True, False), True),
            Knob("execution_mode", ("sequential", "parallel"), "sequential"),
            Knob("mem_pattern", (True, False), True),
        ]

    def _quantized(self, workload, mode: str, workdir: Path) -> Path:
        src = Path(workload.onnx_path)
        if mode == "none":
            return src
        tag = hashlib.sha1(f"{src}|{src.stat().st_mtime_ns}|{mode}".encode()).hexdigest()[:12]
        out = workdir / f"{src.stem}-{mode}-{tag}.onnx"
        if out.exists():
            return out
        import onnx
        if mode.startswith("int8-dynamic"):
            exclude = outlier_matmuls(onnx.load(str(src)), 0.25) if mode.endswith("outliers") else []
            _int8(src, out, exclude=exclude)
        elif mode.startswith("int8-least-sensitive-"):
            ranking = sensitivity_ranking(workload, workdir)
            share = int(mode.removeprefix("int8-least-sensitive-").rstrip("%")) / 100
            _int8(src, out, only=ranking[: max(1, round(len(ranking) * share))])
        else:
            from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer
            q = MatMulNBitsQuantizer(onnx.load(str(src)), block_size=32, is_symmetric=True)
            q.process()
            q.model.save_model_to_file(str(out), use_external_data_format=False)
        return out

    def build(self, workload, route: dict, workdir: Path):
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.graph_optimization_level = {"all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                                       "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                       "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                       "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL}[route["opt_level"]]
        so.intra_op_num_threads = int(route["threads"])
        so.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if route["execution_mode"] == "parallel"
                             else ort.ExecutionMode.ORT_SEQUENTIAL)
        so.enable_mem_pattern = bool(route["mem_pattern"])
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if route.get("spinning", True) else "0")
        disabled = {"none": [], "attention+gelu fusions": ["AttentionFusion", "GeluFusion", "BiasGeluFusion"],
                    "matmul-add fusion": ["MatMulAddFusion"]}[route["disabled_optimizers"]]
        model = self._quantized(workload, route["quantization"], workdir)
        return ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=disabled)

    def run(self, engine, feeds: dict) -> list[np.ndarray]:
        return engine.run(None, feeds)


PLACEMENT_SHARES = (75, 50, 25)  # share of MatMuls (least sensitive first) that int8 placement quantizes


def _int8(src: Path, out: Path, exclude: list[str] = (), only: list[str] | None = None) -> None:
    """int8 dynamic quantization (per-channel weights) of MatMuls: all but `exclude`, or `only` these."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                     per_channel=True, nodes_to_exclude=list(exclude), nodes_to_quantize=list(only or []))


def sensitivity_ranking(workload, workdir: Path) -> list[str]:
    """Names of the MatMuls with a constant weight, least sensitive first: each quantized alone to
    int8, scored by the gate's cosine loss plus its out-of-tolerance fraction on the gate inputs.
    Cached per model file."""
    import onnx
    import onnxruntime as ort

    from claimbench.impl.tuner import gate
    src = Path(workload.onnx_path)
    cache = workdir / f"{src.stem}-sensitivity-{hashlib.sha1(src.read_bytes()).hexdigest()[:12]}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    reference, _ = workload.reference()
    model = onnx.load(str(src))
    constants = {init.name for init in model.graph.initializer}
    # MatMuls with a constant weight: the ones dynamic quantization turns into int8 kernels
    names = [n.name for n in model.graph.node if n.op_type == "MatMul" and any(i in constants for i in n.input)]
    scored = []
    for name in names:
        single = workdir / f"{src.stem}-only-{hashlib.sha1(name.encode()).hexdigest()[:8]}.onnx"
        _int8(src, single, only=[name])
        session = ort.InferenceSession(str(single), providers=["CPUExecutionProvider"])
        g = gate([session.run(None, f) for f in workload.gate_feeds()], reference, workload.gate_spec)
        scored.append((1 - g.cosine + g.outside, name))
        single.unlink()
    ranking = [name for _, name in sorted(scored)]
    cache.write_text(json.dumps(ranking))
    return ranking


def outlier_matmuls(model, fraction: float) -> list[str]:
    """Names of the MatMul nodes whose constant weight has the largest max|w| / std: the ones
    int8 hurts most. A cheap, data-free sensitivity ranking (ours)."""
    from onnx import numpy_helper
    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    scored = []
    for node in model.graph.node:
        if node.op_type == "MatMul":
            w = next((weights[i] for i in node.input if i in weights), None)
            if w is not None and w.size and w.std() > 0:
                scored.append((float(np.abs(w).max() / w.std()), node.name))
    scored.sort(reverse=True)
    return [name for _, name in scored[: max(1, int(len(scored) * fraction))]] if scored else []


class TensorRTBackend(Backend):
    """TensorRT engines (builder flags and precision per route) where `tensorrt` imports and a GPU
    exists; not installable on these machines, so never run here."""
    name = "tensorrt"
    module = "tensorrt"

    def knobs(self, workload) -> list[Knob]:
        return [Knob("precision", ("fp32", "fp16", "int8"), "fp32"),
                Knob("builder_optimization_level", (3, 5), 3),
                Knob("sparse_weights", (False, True), False)]

    def build(self, workload, route, workdir):
        raise RuntimeError("TensorRT is not available on this machine")

    def run(self, engine, feeds):
        raise RuntimeError("TensorRT is not available on this machine")
