import importlib.util

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from claimbench.baselines.engine_build import (OrtBackend, TensorRTBackend, quantizable, sensitivity_ranking, smoothed,
                                              weighted_matmuls)
from claimbench.datasets.onnx_workloads import Workload
from claimbench.impl.tuner import GateSpec, default_route, gate


class ChainWorkload:
    """x -> MatMul(w0) -> MatMul(w1) -> MatMul(w2): w1 has one huge outlier weight, so int8 hurts the
    MatMuls that touch it (w1's own, and w2's whose input then has an outlier column) and not mm0."""
    name = "chain"
    gate_spec = GateSpec(atol=1e-3, rtol=1e-2, max_outside=0.05, min_cosine=0.999)

    def __init__(self, path):
        rng = np.random.default_rng(0)
        weights = [rng.standard_normal((32, 32)).astype(np.float32) for _ in range(3)]
        weights[1][0, 0] = 500.0
        nodes, inits, prev = [], [], "x"
        for i, w in enumerate(weights):
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"h{i}"], name=f"mm{i}"))
            prev = f"h{i}"
        graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
                                  [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [8, 32])], inits)
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        self.onnx_path = str(path)
        self.feeds = [{"x": rng.standard_normal((8, 32)).astype(np.float32)} for _ in range(3)]

    def timing_feeds(self):
        return self.feeds[0]

    def gate_feeds(self):
        return self.feeds[:2]

    def held_out_feeds(self):
        return self.feeds[2:]

    def held_out_check(self, outputs, reference):
        agree = float(np.mean([np.mean(o[0].argmax(-1) == r[0].argmax(-1)) for o, r in zip(outputs, reference)]))
        return agree, agree >= 0.9

    def reference(self):
        import onnxruntime as ort
        s = ort.InferenceSession(self.onnx_path, providers=["CPUExecutionProvider"])
        return [s.run(None, f) for f in self.gate_feeds()], [s.run(None, f) for f in self.held_out_feeds()]


def test_placement_quantizes_the_least_sensitive_matmuls(tmp_path):
    workload = ChainWorkload(tmp_path / "chain.onnx")
    ranking = sensitivity_ranking(workload, tmp_path)
    assert sorted(ranking) == ["mm0", "mm1", "mm2"] and ranking[0] == "mm0"
    assert sensitivity_ranking(workload, tmp_path) == ranking  # cached
    backend = OrtBackend()
    route = {**default_route(backend.knobs(workload)), "quantization": "int8-least-sensitive-25%"}
    engine = backend.build(workload, route, tmp_path)
    quantized = onnx.load(next(tmp_path.glob("chain-int8-least-sensitive-25%-*.onnx")))
    fp32 = {n.name for n in quantized.graph.node if n.op_type == "MatMul"}
    assert fp32 == {"mm1", "mm2"}  # only the least sensitive MatMul went to int8
    out = backend.run(engine, workload.timing_feeds())[0]
    assert out.shape == (8, 32) and np.isfinite(out).all()


def test_smoothing_is_an_equivalent_transform_and_helps_int8(tmp_path):
    workload = ChainWorkload(tmp_path / "chain.onnx")
    (reference, _), path = workload.reference(), smoothed(workload, tmp_path)
    import onnxruntime as ort
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    model = onnx.load(str(path))
    assert sum(n.op_type == "Mul" for n in model.graph.node) == 3  # one per weighted MatMul
    for feeds, ref in zip(workload.gate_feeds(), reference):
        np.testing.assert_allclose(session.run(None, feeds)[0], ref[0], rtol=1e-4, atol=1e-3)
    backend, results = OrtBackend(), {}
    for mode in ("int8-dynamic", "int8-smoothquant"):
        engine = backend.build(workload, {**default_route(backend.knobs(workload)), "quantization": mode}, tmp_path)
        results[mode] = gate([backend.run(engine, f) for f in workload.gate_feeds()], reference, workload.gate_spec)
    assert results["int8-smoothquant"].mean_abs < results["int8-dynamic"].mean_abs  # the outlier column is tamed


def test_static_quantization_calibrates_on_the_gate_inputs(tmp_path):
    workload = ChainWorkload(tmp_path / "chain.onnx")
    backend = OrtBackend()
    engine = backend.build(workload, {**default_route(backend.knobs(workload)), "quantization": "int8-static"}, tmp_path)
    quantized = onnx.load(next(tmp_path.glob("chain-int8-static-*.onnx")))
    assert any(n.op_type == "QuantizeLinear" for n in quantized.graph.node)
    out = backend.run(engine, workload.timing_feeds())[0]
    assert out.shape == (8, 32) and np.isfinite(out).all()


def test_quantizable_graph_exposes_shared_and_gemm_weights_to_int8(tmp_path):
    rng = np.random.default_rng(1)
    w, b, bias = (rng.standard_normal(s).astype(np.float32) for s in ((16, 16), (8, 16), (8,)))
    nodes = [helper.make_node("Identity", ["w"], ["w_copy"], name="dedup"),  # the exporter's dedup of equal weights
             helper.make_node("MatMul", ["x", "w"], ["h0"], name="mm0"),
             helper.make_node("MatMul", ["h0", "w_copy"], ["h1"], name="mm1"),
             helper.make_node("Gemm", ["h1", "b", "bias"], ["y"], name="head", transB=1)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
                              [numpy_helper.from_array(v, k) for k, v in (("w", w), ("b", b), ("bias", bias))])
    workload = ChainWorkload(tmp_path / "chain.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), workload.onnx_path)
    workload.feeds = [{"x": rng.standard_normal((4, 16)).astype(np.float32)} for _ in range(3)]
    assert len(weighted_matmuls(onnx.load(workload.onnx_path))) == 1
    path = quantizable(workload, tmp_path)
    model = onnx.load(str(path))
    assert len(weighted_matmuls(model)) == 3 and {n.op_type for n in model.graph.node} == {"MatMul", "Add"}
    import onnxruntime as ort
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for feeds, ref in zip(workload.gate_feeds(), workload.reference()[0]):
        np.testing.assert_allclose(session.run(None, feeds)[0], ref[0], rtol=1e-5, atol=1e-4)
    backend = OrtBackend()
    backend.build(workload, {**default_route(backend.knobs(workload)), "quantization": "int8-dynamic"}, tmp_path)
    quantized = onnx.load(next(tmp_path.glob("chain-int8-dynamic-*.onnx")))
    assert sum(n.op_type in ("MatMulInteger", "DynamicQuantizeMatMul") for n in quantized.graph.node) == 3


def test_perplexity_check_fails_a_change_either_way():
    rng = np.random.default_rng(0)
    labels = [rng.integers(0, 50, 64)]
    reference = [[rng.standard_normal((1, 64, 50)).astype(np.float32)]]
    workload = Workload("lm", "", {}, GateSpec(), "perplexity", 1.02, labels=labels)
    assert workload.held_out_check(reference, reference) == (1.0, True)
    sharper = reference[0][0].copy()
    sharper[0, np.arange(63), labels[0][1:]] += 3.0  # the true next tokens get likelier: perplexity drops
    ratio, passed = workload.held_out_check([[sharper]], reference)
    assert ratio < 0.98 and not passed


def test_backends_say_whether_their_package_imports():
    assert OrtBackend.available()
    assert TensorRTBackend.available() == (importlib.util.find_spec("tensorrt") is not None)
