import os
import random

import pytest

from claimbench import environment
from claimbench.baselines.storage_io import KVChunkStore, SyncPread, ThreadPoolPread
from claimbench.impl import ugds
from claimbench.impl.ugds import IoUringBatched, io_uring_available
from claimbench.interfaces import AlignedArena, ReadRequest, StorageError

NO_IO_URING = f"io_uring unavailable: {environment.io_uring_problem() or 'liburing does not import'}"


def readers():
    out = [SyncPread(), ThreadPoolPread(threads=4)]
    if io_uring_available():
        out += [IoUringBatched(queue_depth=8), IoUringBatched(queue_depth=8, registered=False)]
    return out


@pytest.fixture
def store(tmp_path):
    rng = random.Random(0)
    s = KVChunkStore(tmp_path / "kv")
    payloads = {}
    for block in range(6):
        for layer in range(3):
            size = rng.choice([4096, 5000, 12288, 65536, 100_000])
            payloads[block, layer] = rng.randbytes(size)
            s.write(block, layer, payloads[block, layer])
    s.save_index()
    return s, payloads


@pytest.mark.parametrize("direct", [True, False])
def test_every_path_returns_identical_bytes(store, direct):
    s, payloads = store
    s.direct = direct
    keys = list(payloads)
    random.Random(1).shuffle(keys)
    arena = AlignedArena(100_000, len(keys))
    for reader in readers():
        assert s.read(keys, reader, arena) == [payloads[k] for k in keys], reader.name
        reader.close()


def test_index_survives_reopen(store):
    s, payloads = store
    again = KVChunkStore(s.root)
    assert again.read([(2, 1)], SyncPread(), AlignedArena(100_000, 1)) == [payloads[2, 1]]


def test_checksum_catches_corruption(store):
    s, _ = store
    offset = s.index[s.key(3, 2)][0]
    with open(s.data, "r+b") as f:
        f.seek(offset + 10)
        f.write(b"\xff\xfe")
    with pytest.raises(StorageError, match="chunk 3/2 fails its checksum"):
        s.read([(3, 2)], SyncPread(), AlignedArena(100_000, 1))


def test_truncated_and_missing_files(store):
    s, _ = store
    last = max(s.index.values())
    os.truncate(s.data, last[0] + 100)
    key = next(k for k, v in s.index.items() if v == last)
    block, layer = map(int, key.split("/"))
    s.direct = False
    with pytest.raises(StorageError, match="truncated"):
        s.read([(block, layer)], SyncPread(), AlignedArena(100_000, 1))
    with pytest.raises(StorageError, match="no chunk for block 99"):
        s.read([(99, 0)], SyncPread(), AlignedArena(100_000, 1))
    os.remove(s.data)
    with pytest.raises(StorageError, match="missing chunk file"):
        s.read([(0, 0)], SyncPread(), AlignedArena(100_000, 1))


def test_unaligned_direct_read_is_refused(store):
    s, _ = store
    s.index[s.key(0, 0)][0] = 100  # an offset O_DIRECT cannot read
    with pytest.raises(StorageError, match="alignment: offset 100"):
        s.read([(0, 0)], SyncPread(), AlignedArena(100_000, 1))


def test_full_disk_is_a_clear_error(tmp_path):
    s = KVChunkStore(tmp_path / "full")
    s.data.symlink_to("/dev/full")
    with pytest.raises(StorageError, match="write of 4096 bytes failed: No space left"):
        s.write(0, 0, b"x" * 10)


def test_batch_larger_than_arena(store):
    s, _ = store
    with pytest.raises(StorageError, match="slots"):
        SyncPread().read_batch([ReadRequest(0, 0, 4096)] * 3, AlignedArena(4096, 2))


def test_fallback_when_io_uring_is_missing(monkeypatch):
    import builtins
    real_import = builtins.__import__

    def no_liburing(name, *args, **kwargs):
        if name == "liburing":
            raise ImportError("no liburing")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(builtins, "__import__", no_liburing)
    assert not ugds.io_uring_available()
    with pytest.raises(StorageError, match="pip install liburing"):
        IoUringBatched()


def test_a_liburing_that_would_kill_the_process_is_refused_before_it_loads(monkeypatch):
    """Where the probe's child died (liburing's AVX-512 build on a CPU without AVX-512), the path says why
    instead of opening a ring."""
    monkeypatch.setattr(environment, "io_uring_problem", lambda: "its compiled module uses instructions this CPU "
                                                                 "lacks: SIGILL")
    assert not ugds.io_uring_available()
    with pytest.raises(StorageError, match="io_uring is not usable here: .* this CPU lacks: SIGILL"):
        IoUringBatched()


@pytest.mark.skipif(not io_uring_available(), reason=NO_IO_URING)
def test_io_uring_counts_submission_time(store):
    s, payloads = store
    reader = IoUringBatched(queue_depth=4)
    s.read(list(payloads), reader, AlignedArena(100_000, len(payloads)))
    assert reader.stats.requests == len(payloads) and 0 < reader.stats.submit_share < 1


@pytest.mark.parametrize("direct", [True, False])
def test_batched_writes_through_every_path_read_back_identical(tmp_path, direct):
    rng = random.Random(2)
    for n, path in enumerate(readers()):
        s = KVChunkStore(tmp_path / f"w{n}", direct=direct)
        chunks = {(b, layer): rng.randbytes(rng.choice([4096, 5000, 20_000])) for b in range(5) for layer in range(4)}
        s.write_batch(chunks, path, AlignedArena(20_480, len(chunks)))
        s.save_index()
        again = KVChunkStore(s.root, direct=direct)
        assert again.read(list(chunks), SyncPread(), AlignedArena(20_480, len(chunks))) == list(chunks.values()), path.name
        path.close()


def test_batched_write_larger_than_arena(tmp_path):
    with pytest.raises(StorageError, match="do not fit the arena"):
        KVChunkStore(tmp_path / "kv").write_batch({(0, 0): b"x" * 9000}, SyncPread(), AlignedArena(4096, 4))


@pytest.mark.skipif(not io_uring_available(), reason=NO_IO_URING)
def test_io_uring_many_requests_wrap_the_completion_ring(tmp_path):
    """Far more requests than ring entries: completions wrap the ring many times."""
    data = random.Random(5).randbytes(1 << 20)
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    rng = random.Random(6)
    requests = [ReadRequest(fd, rng.randrange(256) * 4096, 4096) for _ in range(600)]
    for registered in (True, False):
        path, arena = IoUringBatched(queue_depth=4, registered=registered), AlignedArena(4096, len(requests))
        assert path.read_batch(requests, arena) == [4096] * len(requests)
        assert all(bytes(arena.slot(i)) == data[r.offset:r.offset + 4096] for i, r in enumerate(requests))
        assert path.registration == ("fixed buffer + fixed files" if registered else "off")
        path.close()
    os.close(fd)


def test_an_arena_gives_its_pages_back_even_where_a_binding_keeps_its_mapping():
    arena = AlignedArena(4096, 2)
    kept = arena.slot(1)  # as liburing's Iovec keeps every buffer it is given
    kept[:4] = b"data"
    del arena
    assert bytes(kept[:4]) == bytes(4)  # the pages were dropped: a private mapping reads back zeros


@pytest.mark.skipif(not io_uring_available(), reason=NO_IO_URING)
@pytest.mark.parametrize("registered", [True, False])
def test_the_io_uring_path_does_not_keep_what_it_read_resident(store, registered):
    s, payloads = store
    before = _resident_bytes()
    for _ in range(4):  # 4 arenas of 64 MiB, every page touched: 256 MiB resident if they stayed
        arena = AlignedArena(1 << 20, 64)
        arena.view[:] = bytes(len(arena.view))
        reader = IoUringBatched(queue_depth=8, registered=registered)
        assert s.read(list(payloads), reader, arena) == list(payloads.values())
        reader.close()
        del arena
    assert _resident_bytes() - before < 128 << 20


def _resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
