"""Storage read/write paths behind one interface, and a KV-chunk store on local disk (PAPERS.md A4).

Every path reads and writes batches of (file, offset, length) requests from page-aligned memory,
so the same requests can go through O_DIRECT on every path:
- SyncPread: one synchronous pread/pwrite at a time, in order (the control path of GDS compat
  mode, the paper's baseline: per-request submission, totally ordered).
- ThreadPoolPread: the same calls from a pool of threads (queue depth = threads).
- IoUringBatched (claimbench.impl.ugds): batched asynchronous submission (the paper's idea).
- Kvikio (cuFile) when a GPU and kvikio exist; skipped cleanly otherwise.
KVChunkStore lays chunks of 4 KiB..16 MiB into files at 4 KiB-aligned offsets with an index and a
CRC32 per chunk; a read whose bytes do not match its checksum raises, never returns wrong bytes.
"""
from __future__ import annotations

import json
import os
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from claimbench.interfaces import ALIGN, AlignedArena, BatchIO, IOStats, ReadRequest, StorageError, align_up

def _direct_aligned(r: ReadRequest) -> None:
    if r.offset % ALIGN or r.length % ALIGN:
        raise StorageError(f"O_DIRECT needs {ALIGN}-byte alignment: offset {r.offset}, length {r.length}")


@dataclass
class SyncPread(BatchIO):
    name = "sync-pread"
    stats: IOStats = field(default_factory=IOStats)

    def _one_at_a_time(self, call, requests, arena):
        self.check(requests, arena)
        start, submit, out = time.perf_counter(), 0.0, []
        for i, r in enumerate(requests):
            t = time.perf_counter()
            out.append(call(r.fd, [arena.slot(i, r.length)], r.offset))
            submit += time.perf_counter() - t  # the call blocks: submission and completion in one
        self.stats = IOStats(len(requests), sum(out), time.perf_counter() - start, submit)
        return out

    def read_batch(self, requests, arena):
        return self._one_at_a_time(os.preadv, requests, arena)

    def write_batch(self, requests, arena):
        return self._one_at_a_time(os.pwritev, requests, arena)


@dataclass
class ThreadPoolPread(BatchIO):
    threads: int = 8
    name = "thread-pool"
    stats: IOStats = field(default_factory=IOStats)

    def __post_init__(self):
        self._pool = ThreadPoolExecutor(self.threads)

    def _pooled(self, call, requests, arena):
        self.check(requests, arena)
        start = time.perf_counter()
        out = list(self._pool.map(lambda ir: call(ir[1].fd, [arena.slot(ir[0], ir[1].length)], ir[1].offset),
                                  enumerate(requests)))
        wall = time.perf_counter() - start
        self.stats = IOStats(len(requests), sum(out), wall, wall)
        return out

    def read_batch(self, requests, arena):
        return self._pooled(os.preadv, requests, arena)

    def write_batch(self, requests, arena):
        return self._pooled(os.pwritev, requests, arena)

    def close(self):
        self._pool.shutdown()


def kvikio_available() -> bool:
    try:
        import cupy  # noqa: F401
        import kvikio  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class Kvikio(BatchIO):
    """cuFile reads straight into GPU memory (GDS), where kvikio and a GPU exist (not run here: no GPU)."""
    name = "kvikio-cufile"
    stats: IOStats = field(default_factory=IOStats)

    def __post_init__(self):
        if not kvikio_available():
            raise StorageError("kvikio (cuFile) needs a GPU with kvikio and cupy installed: pip install 'claimbench[gpu]'")

    def _cufile(self, write: bool, requests, arena):
        import cupy
        import kvikio
        start = time.perf_counter()
        futures, out = [], []
        for i, r in enumerate(requests):
            f = kvikio.CuFile(f"/proc/self/fd/{r.fd}", "r+" if write else "r")
            if write:
                buf = cupy.asarray(memoryview(arena.slot(i, r.length)).cast("B"))
                futures.append((f, f.pwrite(buf, r.length, r.offset), None))
            else:
                buf = cupy.empty(r.length, dtype=cupy.uint8)
                futures.append((f, f.pread(buf, r.length, r.offset), (i, buf)))
        for f, fut, target in futures:
            out.append(fut.get())
            f.close()
            if target:  # bytes land in GPU memory; copy back so every path fills the same arena
                arena.slot(target[0], target[1].size)[:] = target[1].get().tobytes()
        wall = time.perf_counter() - start
        self.stats = IOStats(len(requests), sum(out), wall, wall)
        return out

    def read_batch(self, requests, arena):
        return self._cufile(False, requests, arena)

    def write_batch(self, requests, arena):
        return self._cufile(True, requests, arena)


@dataclass
class KVChunkStore:
    """KV chunks by (prefix block, layer) in one data file, 4 KiB-aligned, indexed, checksummed."""
    root: Path
    direct: bool = True

    def __post_init__(self):
        self.root = Path(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.data = self.root / "chunks.bin"
        self.index_path = self.root / "index.json"
        self.index: dict[str, list[int]] = {}  # "block/layer" -> [offset, length, crc32]
        if self.index_path.exists():
            try:
                self.index = json.loads(self.index_path.read_text())
            except json.JSONDecodeError as e:
                raise StorageError(f"{self.index_path}: corrupt index ({e})") from None
        self._lock = threading.Lock()

    @staticmethod
    def key(block: int, layer: int) -> str:
        return f"{block}/{layer}"

    def open_read(self) -> int:
        flags = os.O_RDONLY | (os.O_DIRECT if self.direct else 0)
        try:
            return os.open(self.data, flags)
        except FileNotFoundError:
            raise StorageError(f"{self.data}: missing chunk file") from None

    def write(self, block: int, layer: int, payload: bytes) -> None:
        """Append one chunk (padded to 4 KiB) and record it; the index is saved after every write batch."""
        length = len(payload)
        padded = payload + b"\0" * (align_up(length) - length)
        with self._lock:
            offset = self.data.stat().st_size if self.data.exists() else 0
            try:
                with open(self.data, "ab") as f:
                    f.write(padded)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                raise StorageError(f"{self.data}: write of {len(padded)} bytes failed: {e.strerror}") from None
            self.index[self.key(block, layer)] = [offset, length, zlib.crc32(payload)]

    def write_batch(self, chunks: dict[tuple[int, int], bytes], path: BatchIO, arena: AlignedArena) -> None:
        """Append many chunks through a write path (one batch, one fsync), then record them."""
        longest = max((align_up(len(p)) for p in chunks.values()), default=0)
        if len(chunks) > arena.slots or longest > arena.slot_bytes:
            raise StorageError(f"{len(chunks)} chunks of up to {longest} bytes do not fit the arena "
                               f"({arena.slots} slots of {arena.slot_bytes} bytes)")
        with self._lock:
            offset = self.data.stat().st_size if self.data.exists() else 0
            fd = os.open(self.data, os.O_WRONLY | os.O_CREAT | (os.O_DIRECT if self.direct else 0), 0o644)
            requests, entries = [], {}
            for i, ((block, layer), payload) in enumerate(chunks.items()):
                length = align_up(len(payload))
                slot = arena.slot(i, length)
                slot[:len(payload)] = payload
                slot[len(payload):] = bytes(length - len(payload))
                requests.append(ReadRequest(fd, offset, length))
                entries[self.key(block, layer)] = [offset, len(payload), zlib.crc32(payload)]
                offset += length
            try:
                written = path.write_batch(requests, arena)
                os.fsync(fd)
            except OSError as e:
                raise StorageError(f"{self.data}: batched write through {path.name} failed: {e.strerror or e}") from None
            finally:
                os.close(fd)
            if written != [r.length for r in requests]:
                raise StorageError(f"{self.data}: short batched write ({sum(written)} of "
                                   f"{sum(r.length for r in requests)} bytes)")
            self.index.update(entries)

    def save_index(self) -> None:
        tmp = self.index_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.index))
        os.replace(tmp, self.index_path)

    def requests(self, fd: int, keys: list[tuple[int, int]]) -> list[ReadRequest]:
        out = []
        for block, layer in keys:
            entry = self.index.get(self.key(block, layer))
            if entry is None:
                raise StorageError(f"no chunk for block {block}, layer {layer} in {self.index_path}")
            offset, length, _ = entry
            out.append(ReadRequest(fd, offset, align_up(length)))
        if self.direct:
            for r in out:
                _direct_aligned(r)
        return out

    def read(self, keys: list[tuple[int, int]], reader: BatchIO, arena: AlignedArena) -> list[bytes]:
        """Chunks by key through a read path; every chunk's length and CRC32 are verified."""
        fd = self.open_read()
        try:
            got = reader.read_batch(self.requests(fd, keys), arena)
        finally:
            os.close(fd)
        out = []
        for i, ((block, layer), n) in enumerate(zip(keys, got)):
            offset, length, crc = self.index[self.key(block, layer)]
            if n < length:
                raise StorageError(f"{self.data}: chunk {block}/{layer} truncated ({n} of {length} bytes)")
            data = bytes(arena.slot(i, length))
            if zlib.crc32(data) != crc:
                raise StorageError(f"{self.data}: chunk {block}/{layer} fails its checksum")
            out.append(data)
        return out
