import importlib.util

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from claimbench.baselines.engine_build import OrtBackend, TensorRTBackend, sensitivity_ranking
from claimbench.impl.tuner import GateSpec, default_route


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


def test_backends_say_whether_their_package_imports():
    assert OrtBackend.available()
    assert TensorRTBackend.available() == (importlib.util.find_spec("tensorrt") is not None)
