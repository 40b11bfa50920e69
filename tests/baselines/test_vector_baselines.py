import numpy as np
import pytest

from claimbench.baselines.flat import FlatExact
from claimbench.baselines.ivf_flat import IVFFlat, gpu_available
from claimbench.quality import recall_at_k


def data(n=2000, d=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)).astype(np.float32)


def test_ivf_at_full_nprobe_is_exact(tmp_path):
    xb, xq = data(), data(50, seed=1)
    flat = FlatExact()
    flat.build(xb)
    _, truth = flat.search(xq, 10)
    ivf = IVFFlat(nlist=16)
    ivf.build(xb)
    ivf.set_query_params(nprobe=16)
    assert recall_at_k(ivf.search(xq, 10)[1], truth) == 1.0
    assert ivf.counters.vectors_read_full == 50 * 2000
    ivf.save(tmp_path / "i.faiss")
    loaded = IVFFlat.load(tmp_path / "i.faiss")
    loaded.set_query_params(nprobe=2)
    ivf.set_query_params(nprobe=2)
    np.testing.assert_array_equal(loaded.search(xq, 10)[1], ivf.search(xq, 10)[1])


def test_same_nprobe_probes_the_same_lists():
    xb = data()
    ivf = IVFFlat(nlist=16)
    ivf.build(xb)
    ids = np.concatenate([ivf.list_ids(i) for i in range(16)])
    assert sorted(ids.tolist()) == list(range(2000))
    assert ivf.centroids().shape == (16, 16)


@pytest.mark.skipif(not gpu_available(), reason="faiss-gpu and a GPU are needed")
def test_gpu_ivf_matches_cpu():
    xb, xq = data(), data(20, seed=2)
    cpu, gpu = IVFFlat(nlist=16), IVFFlat(nlist=16, use_gpu=True)
    cpu.build(xb)
    gpu.build(xb)
    for index in (cpu, gpu):
        index.set_query_params(nprobe=16)
    np.testing.assert_array_equal(cpu.search(xq, 5)[1], gpu.search(xq, 5)[1])
