"""uGDS's central idea on this machine (PAPERS.md A4): the control path of storage reads moves to
user space and submits requests in batches, with no ordering between independent requests.

Reconstructed: the paper's own code needs a kernel module, a dedicated NVMe and GPU P2P; here the
same control-path change is measured as io_uring batched submission (PyPI `liburing`) with O_DIRECT
into page-aligned host memory, up to `queue_depth` requests in flight, refilled in batches as
completions arrive. The binding only takes aligned memory through its Iovec type, so reads are
readv of one aligned slot each. Registered buffers/files are not used: the binding's
io_uring_register_buffers returned EFAULT on aligned mmap memory here.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from claimbench.baselines.storage_io import AlignedArena, BatchReader, IOStats, ReadRequest, StorageError


def io_uring_available() -> bool:
    try:
        import liburing
        ring = liburing.Ring()
        liburing.io_uring_queue_init(2, ring)
        liburing.io_uring_queue_exit(ring)
        return True
    except Exception:  # noqa: BLE001 - missing package, old kernel or seccomp: all mean unavailable
        return False


@dataclass
class IoUringBatched(BatchReader):
    queue_depth: int = 32
    name = "io-uring-batched"
    stats: IOStats = field(default_factory=IOStats)

    def __post_init__(self):
        try:
            import liburing
        except ImportError:
            raise StorageError("io_uring path needs PyPI liburing: pip install liburing") from None
        self._L = liburing
        self._ring, self._cqe = liburing.Ring(), liburing.Cqe()
        try:
            liburing.io_uring_queue_init(max(self.queue_depth, 2), self._ring)
        except OSError as e:
            raise StorageError(f"io_uring is not available on this kernel: {e}") from None
        self._iov = {}

    def _iovec(self, arena: AlignedArena, i: int, length: int):
        key = (id(arena), i, length)
        if key not in self._iov:  # one Iovec per (slot, length), kept alive while in use
            self._iov[key] = self._L.Iovec([arena.slot(i, length)])
        return self._iov[key]

    def read_batch(self, requests: list[ReadRequest], arena: AlignedArena) -> list[int]:
        self._check(requests, arena)
        L, ring, cqe = self._L, self._ring, self._cqe
        out = [0] * len(requests)
        start, submit = time.perf_counter(), 0.0
        nxt, inflight, done = 0, 0, 0
        while done < len(requests):
            queued = 0
            while nxt < len(requests) and inflight < self.queue_depth:
                r = requests[nxt]
                sqe = L.io_uring_get_sqe(ring)
                L.io_uring_prep_readv(sqe, r.fd, self._iovec(arena, nxt, r.length), r.offset)
                sqe.user_data = nxt
                nxt, inflight, queued = nxt + 1, inflight + 1, queued + 1
            if queued:
                t = time.perf_counter()
                L.io_uring_submit(ring)  # one call for the whole batch
                submit += time.perf_counter() - t
            L.io_uring_wait_cqe(ring, cqe)
            ready = L.io_uring_cq_ready(ring)
            for j in range(ready):
                c = cqe[j]
                if c.res < 0:
                    raise StorageError(f"io_uring read of request {c.user_data} failed: errno {-c.res}")
                out[c.user_data] = c.res
            L.io_uring_cq_advance(ring, ready)
            inflight, done = inflight - ready, done + ready
        self.stats = IOStats(len(requests), sum(out), time.perf_counter() - start, submit)
        return out

    def close(self):
        self._L.io_uring_queue_exit(self._ring)
