"""The engine tuner's timed call (PAPERS.md A5): one inference of the MiniLM-L6 workload (the pinned
corpus's sentences) through ONNX Runtime's default build and with its attention and GELU fusions
disabled (what a tuned route changes), each gated against the unoptimized fp32 reference as the
tuner gates every route. (int8-dynamic fails that gate on MiniLM: 79% of elements out of tolerance.)"""
import pytest

from claimbench.baselines.engine_build import OrtBackend
from claimbench.datasets import onnx_workloads
from claimbench.impl.tuner import default_route, gate

INPUTS = ("corpus", "all-minilm-l6-v2")
ROUTES = {"default": {}, "no-attention-gelu-fusion": {"disabled_optimizers": "attention+gelu fusions"}}


@pytest.fixture(scope="module")
def workload():
    work = onnx_workloads.load("minilm-l6")
    return work, work.reference()[0]


@pytest.mark.parametrize("route", list(ROUTES))
def test_engine_run(benchmark, workload, route, tmp_path):
    work, reference = workload
    backend = OrtBackend()
    engine = backend.build(work, {**default_route(backend.knobs(work)), **ROUTES[route]}, tmp_path)
    outputs = benchmark(backend.run, engine, work.gate_feeds()[0])
    assert gate(outputs, reference[0], work.gate_spec).passed
