import shutil

import numpy as np
import pytest

pytest.importorskip("olive")

from claimbench.baselines import olive_search  # noqa: E402
from claimbench.impl.tuner import Tuner  # noqa: E402

from .test_engine_build import ChainWorkload  # noqa: E402


def test_candidates_are_routes_the_tuner_gates_and_times(tmp_path):
    workload = ChainWorkload(tmp_path / "chain.onnx")
    copy = tmp_path / "candidate.onnx"
    shutil.copy(workload.onnx_path, copy)
    candidates = [{"model_path": str(copy), "quantized": False, "olive_latency_ms": 0.1,
                   "inference_settings": {"session_options": {"intra_op_num_threads": 1}}}]
    backend = olive_search.OliveCandidates(candidates)
    assert backend.knobs(workload)[0].values == (-1, 0)
    for index in (-1, 0):
        out = backend.run(backend.build(workload, {"olive_candidate": index}, tmp_path), workload.timing_feeds())
        assert np.array_equal(out[0], workload.reference()[0][0][0])
    result = Tuner(backend, workload, mode="fast", budget_s=60, repeats=3, workdir=tmp_path).run(progress=lambda m: None)
    assert len(result["tried"]) == 2 and all(r.passed for r in result["tried"])
    assert result["winner"] is not None and result["interleaved"] is not None


def test_olive_runs_offline_on_a_real_workload(tmp_path):
    from claimbench.datasets import onnx_workloads
    workload = onnx_workloads.load("cnn-small")
    candidates = olive_search.search(workload, tmp_path, budget_s=5)
    assert candidates, "Olive evaluated no model"
    order = [(c["quantized"], c["olive_latency_ms"]) for c in candidates]
    assert order == sorted(order)
    assert {c["quantized"] for c in candidates} == {False, True}  # the fp32 workflow and the quantizing one
