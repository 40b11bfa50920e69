"""RemoteANN and the object-store IVF on a real S3 API server on 127.0.0.1 (reads through the
network-model proxy with no delay), against the same layouts in a local folder and faiss IVF-Flat."""
import gc

import numpy as np
import pytest

from claimbench import localservices
from claimbench.baselines.ivf_flat import IVFFlat
from claimbench.baselines.object_store_ivf import ObjectStoreIVF
from claimbench.blobstore import S3Store
from claimbench.impl.remoteann import ListCache, RemoteANN
from claimbench.interfaces import StorageError
from claimbench.netmodel import NetworkModel, shaped

pytest.importorskip("moto")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return rng.standard_normal((3000, 16)).astype(np.float32), rng.standard_normal((20, 16)).astype(np.float32)


@pytest.fixture(scope="module")
def s3():
    with localservices.s3_server() as endpoint:
        localservices.make_bucket(endpoint, "ann")
        with shaped(endpoint, NetworkModel(first_byte_s=0.0, bandwidth_bytes_per_s=1e12)) as proxy:
            yield endpoint, proxy


@pytest.mark.parametrize("cls", [ObjectStoreIVF, RemoteANN])
def test_build_upload_search_equals_the_local_index(cls, data, s3):
    xb, xq = data
    endpoint, proxy = s3
    local = cls(nlist=32)
    local.build(xb)
    remote = cls(nlist=32, store=S3Store(endpoint, "ann", read_endpoint=proxy), prefix=f"round-trip/{cls.__name__}")
    remote.build(xb)
    assert remote.digest == local.digest
    reader = cls(store=S3Store(endpoint, "ann", read_endpoint=proxy), prefix=f"round-trip/{cls.__name__}")
    reader.open(local.digest)
    for nprobe in (1, 4):
        local.set_query_params(nprobe=nprobe)
        reader.set_query_params(nprobe=nprobe)
        expected, got = local.search(xq, 10), reader.search(xq, 10)
        assert np.array_equal(expected[1], got[1]) and np.allclose(expected[0], got[0])
    assert reader.store.counters.gets > 0


def test_search_over_parted_objects_equals_the_unparted_index(data, s3):
    """Coalesced ranges that cross part boundaries are read part by part, with the same results."""
    xb, xq = data
    endpoint, proxy = s3
    local = RemoteANN(nlist=32)
    local.build(xb)
    writer = RemoteANN(nlist=32, store=S3Store(endpoint, "ann"), prefix="parted")
    writer.layout.part_bytes = 4096
    writer.build(xb)
    reader = RemoteANN(store=S3Store(endpoint, "ann", read_endpoint=proxy), prefix="parted")
    reader.open(local.digest)
    assert reader.layout.part_bytes == 4096 and reader.layout.sizes["vectors"] > 40 * 4096
    for index in (local, reader):
        index.set_query_params(nprobe=4, rerank=200)
    expected, got = local.search(xq, 10), reader.search(xq, 10)
    assert np.array_equal(expected[1], got[1]) and np.allclose(expected[0], got[0])


def test_the_baseline_returns_faiss_ivf_flat_results(data):
    xb, xq = data
    ivf, baseline = IVFFlat(nlist=32), ObjectStoreIVF(nlist=32)
    ivf.build(xb)
    baseline.build(xb)
    for nprobe in (1, 3, 32):
        ivf.set_query_params(nprobe=nprobe)
        baseline.set_query_params(nprobe=nprobe)
        assert np.array_equal(ivf.search(xq, 5)[1], baseline.search(xq, 5)[1])


def test_an_index_without_a_store_keeps_its_objects_in_a_folder_that_goes_with_it(data):
    index = ObjectStoreIVF(nlist=8)
    index.build(data[0][:500])
    folder = index.store.root
    assert (folder / "ivf-flat" / "manifest.json").exists()
    del index
    gc.collect()
    assert not folder.exists()


def test_remoteann_reads_fewer_bytes_than_the_baseline_at_equal_nprobe(data):
    """Codes instead of vectors, and only the re-ranked vectors in full (no coalescing gap: on a toy
    index, a gap of a few KiB spans most of the vectors object)."""
    xb, xq = data
    baseline, remote = ObjectStoreIVF(nlist=32), RemoteANN(nlist=32, cache_bytes=0, coalesce_gap=0)
    for index in (baseline, remote):
        index.build(xb)
        index.set_query_params(nprobe=4)
        index.store.reset_counters()
        index.search(xq, 10)
    assert remote.store.counters.bytes_read < baseline.store.counters.bytes_read


def test_the_cache_evicts_by_its_bound_and_serves_hits():
    cache = ListCache(capacity=100)
    for key in range(5):
        cache.put(key, bytes(30))
    assert cache.size <= 100 and list(cache.blocks) == [2, 3, 4]
    assert cache.get(4) is not None and cache.get(0) is None
    assert cache.hit_rate == 0.5
    cache.put(9, bytes(101))  # larger than the whole cache: never kept
    assert 9 not in cache.blocks


def test_a_warm_cache_saves_code_reads(data):
    xb, xq = data
    index = RemoteANN(nlist=32, cache_bytes=10 ** 6)
    index.build(xb)
    index.set_query_params(nprobe=8)
    index.search(xq, 10)
    cold = index.store.counters.bytes_read
    index.store.reset_counters()
    index.search(xq, 10)
    assert index.store.counters.bytes_read < cold and index.cache.hit_rate > 0


def test_a_truncated_object_fails_the_query_with_its_key_and_the_cache_keeps_nothing_of_it(data, s3):
    xb, xq = data
    endpoint, proxy = s3
    store = S3Store(endpoint, "ann", read_endpoint=proxy)
    index = RemoteANN(nlist=32, store=store, prefix="truncated")
    index.build(xb)
    codes = store.get("truncated/codes")
    store.put("truncated/codes", codes[:len(codes) // 2])
    index.open(index.digest)
    index.set_query_params(nprobe=32)
    with pytest.raises(StorageError, match="truncated/codes"):
        index.search(xq[:1], 10)
    assert not index.cache.blocks
    store.put("truncated/codes", codes)
    index.search(xq[:1], 10)  # intact again: it answers


def test_another_index_or_a_missing_object_is_refused(data, s3):
    xb, _ = data
    endpoint, proxy = s3
    store = S3Store(endpoint, "ann", read_endpoint=proxy)
    baseline = ObjectStoreIVF(nlist=8, store=store, prefix="shared-prefix")
    baseline.build(xb)
    with pytest.raises(StorageError, match="holds a 'ivf-flat-objects' index, not 'remoteann'"):
        RemoteANN(store=store, prefix="shared-prefix").open()
    with pytest.raises(StorageError, match="holds another index"):
        ObjectStoreIVF(store=store, prefix="shared-prefix").open("f" * 64)
    with pytest.raises(StorageError, match="no-index-here/manifest.json.*no such object"):
        RemoteANN(store=store, prefix="no-index-here").open()
