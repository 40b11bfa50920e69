"""Engine backends for the tuner: ONNX Runtime on CPU here, TensorRT where it imports.

The baseline of the tuner claim is the default build: ONNX Runtime's defaults (all graph
optimizations, its own thread count, sequential execution, no quantization), i.e. the default
route of OrtBackend's knobs.
ORT knobs: graph optimization level; individually disabled optimizers; int8 dynamic quantization
of MatMul weights, placed three ways: everywhere, excluding the MatMuls whose weights have the worst
outlier ratio max|w|/std, or only on a share of MatMuls ranked by least error per unit of work
(each MatMul quantized alone, its error on the gate inputs divided by its weight's size: the
paper's quantization placement, reconstructed), each placement also after SmoothQuant smoothing
(Xiao et al., ICML 2023: per input channel, activation range moved into the weight, alpha 0.5,
calibrated on the gate inputs); int8 static quantization (QDQ, calibrated on the gate inputs) of
Conv/MatMul/Gemm or of Convs only; 4-bit MatMulNBits weights; intra-op threads; thread spinning;
execution mode; memory-pattern planning. Every quantized route starts from quantizable(): the
exported graph with each linear layer as a MatMul on its own constant weight.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from claimbench.interfaces import EngineBackend, Knob


class OrtBackend(EngineBackend):
    name = "onnxruntime-cpu"
    module = "onnxruntime"

    def knobs(self, workload) -> list[Knob]:
        return [
            Knob("opt_level", ("all", "extended", "basic", "disabled"), "all"),
            Knob("disabled_optimizers", ("none", "attention+gelu fusions", "matmul-add fusion"), "none"),
            Knob("quantization", ("none", "int8-dynamic", "int8-dynamic-excluding-outliers",
                                  *(f"int8-least-sensitive-{p}%" for p in PLACEMENT_SHARES), "int8-smoothquant",
                                  *(f"int8-smoothquant-least-sensitive-{p}%" for p in PLACEMENT_SHARES),
                                  "int8-static", "int8-static-convs", "int4-matmulnbits"), "none"),
            Knob("threads", (0, 1, 2), 0),
            Knob("spinning", (True, False), True),
            Knob("execution_mode", ("sequential", "parallel"), "sequential"),
            Knob("mem_pattern", (True, False), True),
        ]

    def _quantized(self, workload, mode: str, workdir: Path) -> Path:
        if mode == "none":
            return Path(workload.onnx_path)
        exported, src = Path(workload.onnx_path), quantizable(workload, workdir)
        tag = hashlib.sha1(f"{src}|{src.stat().st_mtime_ns}|{mode}".encode()).hexdigest()[:12]
        out = workdir / f"{exported.stem}-{mode}-{tag}.onnx"
        if out.exists():
            return out
        import onnx
        if mode.startswith("int8-static"):
            _int8_static(src, out, workload, ["Conv"] if mode.endswith("convs") else ["Conv", "MatMul", "Gemm"])
        elif mode.startswith("int8-"):
            model = smoothed(workload, workdir) if mode.startswith("int8-smoothquant") else src
            if "least-sensitive-" in mode:
                ranking = sensitivity_ranking(workload, workdir, model)
                share = int(mode.rsplit("-", 1)[1].rstrip("%")) / 100
                _int8(model, out, only=ranking[: max(1, round(len(ranking) * share))])
            else:
                _int8(model, out, exclude=outlier_matmuls(onnx.load(str(model)), 0.25) if mode.endswith("outliers") else [])
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
        for key, value in QUIET_BETWEEN_RUNS.items():
            so.add_session_config_entry(key, value)
        disabled = {"none": [], "attention+gelu fusions": ["AttentionFusion", "GeluFusion", "BiasGeluFusion"],
                    "matmul-add fusion": ["MatMulAddFusion"]}[route["disabled_optimizers"]]
        model = self._quantized(workload, route["quantization"], workdir)
        return ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=disabled)

    def run(self, engine, feeds: dict) -> list[np.ndarray]:
        return engine.run(None, feeds)


# Every session, the default build's too, stops its threads spinning when a Run ends: routes are
# re-timed interleaved in one process, and idle sessions' spinning threads took the cores from the
# one being timed (measured on 2 cores: ViT-tiny 11.2 ms alone, 27 ms interleaved with three idle
# spinning sessions, 12.4 ms with this set; alone it changes nothing: 11.1 vs 11.2 ms). Spinning
# within a Run, the `spinning` knob, is untouched.
QUIET_BETWEEN_RUNS = {"session.force_spinning_stop": "1"}

PLACEMENT_SHARES = (75, 50, 25)  # share of weighted MatMuls (least error per unit of work first) int8 placement quantizes


# ORT's quantizers log this advice on the root logger for each model they quantize (dozens per
# sensitivity ranking); its shape-inference pre-processing fails on ViT-tiny's graph and the
# quantizers work without it, so the advice is muted.
logging.getLogger().addFilter(lambda record: "pre-processing before quantization" not in record.getMessage())


def _int8(src: Path, out: Path, exclude: list[str] = (), only: list[str] | None = None) -> None:
    """int8 dynamic quantization (per-channel weights) of MatMuls: all but `exclude`, or `only` these."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    quantize_dynamic(str(src), str(out), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"],
                     per_channel=True, nodes_to_exclude=list(exclude), nodes_to_quantize=list(only or []))


def _int8_static(src: Path, out: Path, workload, op_types: list[str]) -> None:
    """int8 static quantization (QDQ, per-channel weights, uint8 activations with MinMax ranges
    calibrated on the gate inputs) of `op_types`; every other node stays fp32."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class GateInputs(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(workload.gate_feeds())

        def get_next(self):
            return next(self.feeds, None)
    quantize_static(str(src), str(out), GateInputs(), quant_format=QuantFormat.QDQ, op_types_to_quantize=op_types,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)


def quantizable(workload, workdir: Path) -> Path:
    """The workload's graph rewritten, outputs unchanged, so every linear layer is a MatMul on a
    constant weight, the form ORT's quantizers reach: a weight forwarded through Identity (the
    exporter's dedup of equal weights) becomes its own initializer, and Gemm on a constant weight
    becomes MatMul (+ Add of its bias); ORT's dynamic int8 skips Gemm, and found only ViT-tiny's first
    block before this (its four blocks start as copies of one layer). Every quantized route starts
    here; the default build runs the exported graph. Cached per model file."""
    import onnx
    from onnx import helper, numpy_helper
    src = Path(workload.onnx_path)
    out = workdir / f"{src.stem}-quantizable-{hashlib.sha1(src.read_bytes()).hexdigest()[:12]}.onnx"
    if out.exists():
        return out
    model = onnx.load(str(src))
    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    outputs, ordered = {o.name for o in model.graph.output}, []
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "Identity" and node.input[0] in weights and node.output[0] not in outputs:
            weights[node.output[0]] = weights[node.input[0]]
        elif (node.op_type == "Gemm" and node.input[1] in weights and not attrs.get("transA", 0)
              and attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0):
            w = weights[node.input[1]]
            weights[f"{node.name}/weight"] = np.ascontiguousarray(w.T if attrs.get("transB", 0) else w)
            biased = len(node.input) > 2 and node.input[2] != ""
            product = f"{node.name}/product" if biased else node.output[0]
            ordered.append(helper.make_node("MatMul", [node.input[0], f"{node.name}/weight"], [product],
                                            name=f"{node.name}/MatMul"))
            if biased:
                ordered.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]],
                                                name=f"{node.name}/Add"))
        else:
            ordered.append(node)
    _save_rewritten(model, ordered, weights, out)
    return out


def _save_rewritten(model, nodes: list, weights: dict, out: Path) -> None:
    """Save `model` with `nodes` as its graph and, as initializers, the `weights` those nodes use."""
    import onnx
    from onnx import numpy_helper
    used = {name for node in nodes for name in node.input}
    del model.graph.node[:], model.graph.initializer[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in weights.items() if k in used)
    onnx.save(model, str(out))


SMOOTHQUANT_ALPHA = 0.5  # the SmoothQuant paper's default migration strength


def weighted_matmuls(model) -> list[int]:
    """Positions of the MatMul nodes whose second input is a constant 2-D weight: the ones int8
    turns into int8 kernels."""
    shapes = {init.name: tuple(init.dims) for init in model.graph.initializer}
    return [i for i, n in enumerate(model.graph.node) if n.op_type == "MatMul" and len(shapes.get(n.input[1], ())) == 2]


def smoothed(workload, workdir: Path, alpha: float = SMOOTHQUANT_ALPHA) -> Path:
    """The model with SmoothQuant's equivalent transform before every weighted MatMul: x W = (x / s)(s W)
    with s_j = max|x_j|^alpha / max|W_j|^(1 - alpha) per input channel j, max|x_j| over the gate
    inputs. Outputs equal the original's up to fp32 rounding; int8 activations then lose less
    to outlier channels. Cached per model file."""
    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper
    src = quantizable(workload, workdir)
    out = workdir / f"{src.stem}-smoothed-{alpha}-{hashlib.sha1(src.read_bytes()).hexdigest()[:12]}.onnx"
    if out.exists():
        return out
    model = onnx.load(str(src))
    smoothing = set(weighted_matmuls(model))
    probe = onnx.load(str(src))
    activations = sorted({model.graph.node[i].input[0] for i in smoothing})
    probe.graph.output.extend(helper.make_tensor_value_info(a, onnx.TensorProto.FLOAT, None) for a in activations)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    x_max = {}
    for feeds in workload.gate_feeds():
        for name, value in zip(activations, session.run(activations, feeds)):
            channel_max = np.abs(value).reshape(-1, value.shape[-1]).max(0)
            x_max[name] = np.maximum(x_max.get(name, 0), channel_max)
    weights = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    ordered = []
    for i, node in enumerate(onnx.NodeProto.FromString(n.SerializeToString()) for n in model.graph.node):
        if i in smoothing:
            w = weights[node.input[1]]
            scale = (np.maximum(x_max[node.input[0]], 1e-5) ** alpha
                     / np.maximum(np.abs(w).max(1), 1e-5) ** (1 - alpha)).astype(np.float32)
            prefix = f"{node.name}/smooth"
            weights[f"{prefix}/weight"], weights[f"{prefix}/inverse_scale"] = w * scale[:, None], 1 / scale
            ordered.append(helper.make_node("Mul", [node.input[0], f"{prefix}/inverse_scale"], [f"{prefix}/input"],
                                            name=prefix))
            node.input[0], node.input[1] = f"{prefix}/input", f"{prefix}/weight"
        ordered.append(node)
    _save_rewritten(model, ordered, weights, out)
    return out


def sensitivity_ranking(workload, workdir: Path, model: Path | None = None) -> list[str]:
    """Names of the weighted MatMuls of `model` (the workload's quantizable graph by default), least error per
    unit of work first: each quantized alone to int8, scored by the gate's cosine loss plus its
    out-of-tolerance fraction on the gate inputs, divided by its weight's size (the work int8 takes
    over, per token; so a big LM head that costs little accuracy goes early and a small projection
    whose int8 overhead outweighs its gain goes late). Cached per model file."""
    import onnx
    import onnxruntime as ort

    from claimbench.impl.tuner import gate
    src = Path(model or quantizable(workload, workdir))
    cache = workdir / f"{src.stem}-sensitivity-{hashlib.sha1(src.read_bytes()).hexdigest()[:12]}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    reference, _ = workload.reference()
    model = onnx.load(str(src))
    sizes = {init.name: int(np.prod(init.dims)) for init in model.graph.initializer}
    nodes = [model.graph.node[i] for i in weighted_matmuls(model)]
    scored = []
    for name, size in ((n.name, sizes[n.input[1]]) for n in nodes):
        single = workdir / f"{src.stem}-only-{hashlib.sha1(name.encode()).hexdigest()[:8]}.onnx"
        _int8(src, single, only=[name])
        session = ort.InferenceSession(str(single), providers=["CPUExecutionProvider"])
        g = gate([session.run(None, f) for f in workload.gate_feeds()], reference, workload.gate_spec)
        scored.append(((1 - g.cosine + g.outside) / size, name))
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


class TensorRTBackend(EngineBackend):
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
