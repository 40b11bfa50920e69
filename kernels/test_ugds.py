"""The storage paths' submission kernels (PAPERS.md A4): one batch of random 4 KiB O_DIRECT reads
through per-request synchronous preads (the baseline's control path), a thread pool and batched
io_uring submission. The file holds the pinned Mooncake trace's bytes; every read must return them."""
import os
import random

import pytest

from claimbench import inputs
from claimbench.baselines.storage_io import SyncPread, ThreadPoolPread
from claimbench.datasets import vectors
from claimbench.impl.ugds import IoUringBatched, io_uring_available
from claimbench.interfaces import ALIGN, AlignedArena, ReadRequest

INPUTS = ("mooncake-conversation",)
FILE_BLOCKS, BATCH = 4096, 256  # a 16 MiB file, 256 reads per batch


@pytest.fixture(scope="module")
def blocks():
    content = inputs.path("mooncake-conversation").read_bytes()
    content = (content * (FILE_BLOCKS * ALIGN // len(content) + 1))[:FILE_BLOCKS * ALIGN]
    path = vectors.cache_dir() / "kernels-ugds.bin"  # a real filesystem (O_DIRECT), not tmpfs
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_bytes() != content:
        path.write_bytes(content)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    offsets = random.Random(0).sample(range(FILE_BLOCKS), BATCH)
    yield content, [ReadRequest(fd, block * ALIGN, ALIGN) for block in offsets]
    os.close(fd)


def paths():
    out = {"sync-pread": SyncPread, "thread-pool-32": lambda: ThreadPoolPread(threads=32)}
    if io_uring_available():
        out["io-uring-batched-32"] = lambda: IoUringBatched(queue_depth=32)
    return out


@pytest.mark.parametrize("path", list(paths()))
def test_random_4k_read_batch(benchmark, blocks, path):
    content, requests = blocks
    reader, arena = paths()[path](), AlignedArena(ALIGN, BATCH)
    try:
        assert benchmark(reader.read_batch, requests, arena) == [ALIGN] * BATCH
        assert all(bytes(arena.slot(i)) == content[r.offset:r.offset + ALIGN] for i, r in enumerate(requests))
    finally:
        reader.close()
