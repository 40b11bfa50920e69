"""uGDS's central idea on this machine (PAPERS.md A4): the control path of storage I/O moves to
user space and submits requests in batches, with no ordering between independent requests.

Reconstructed: the paper's own code needs a kernel module, a dedicated NVMe and GPU P2P; here the
same control-path change is measured as io_uring batched submission (PyPI `liburing`) with O_DIRECT
into page-aligned host memory, up to `queue_depth` requests in flight, refilled in batches as
completions arrive. With `registered=True` the arena is registered once as a fixed buffer and the
files as fixed files (READV_FIXED/WRITEV_FIXED, kernel 6.15+); where the kernel refuses, the path
falls back to plain readv/writev and says why in `registration`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from claimbench import environment
from claimbench.interfaces import AlignedArena, BatchIO, IOStats, ReadRequest, StorageError


def io_uring_available() -> bool:
    """liburing imports here and opens a ring in a child process (claimbench.environment.io_uring_problem: its
    compiled module can kill the process that tries)."""
    try:
        import liburing  # noqa: F401
    except ImportError:
        return False
    return not environment.io_uring_problem()


@dataclass
class IoUringBatched(BatchIO):
    queue_depth: int = 32
    registered: bool = True
    name = "io-uring-batched"
    stats: IOStats = field(default_factory=IOStats)
    registration: str = field(default="not yet used", init=False)

    def __post_init__(self):
        try:
            import liburing
        except ImportError:
            raise StorageError("io_uring path needs PyPI liburing: pip install liburing") from None
        if problem := environment.io_uring_problem():  # (a child process, once per process: before any timing)
            raise StorageError(f"io_uring is not usable here: {problem}")
        self._L = liburing
        self._ring, self._cqe = liburing.Ring(), liburing.Cqe()
        try:
            liburing.io_uring_queue_init(max(self.queue_depth, 2), self._ring)
        except OSError as e:
            raise StorageError(f"io_uring is not available on this kernel: {e}") from None
        self._iov = {}
        self._arena_buffer = None  # (arena id, Iovec, arena) registered as fixed buffer 0
        self._files = None  # (fds, FileIndex) registered as fixed files

    def _iovec(self, arena: AlignedArena, i: int, length: int):
        key = (id(arena), i, length)
        if key not in self._iov:  # one Iovec per (slot, length); the binding keeps raw pointers, so the
            self._iov[key] = (self._L.Iovec([arena.slot(i, length)]), arena)  # arena is held with it
        return self._iov[key][0]

    def _register(self, arena: AlignedArena, fds: tuple[int, ...]) -> bool:
        """Register the arena and the batch's files once; False (with the reason kept) if refused."""
        if not self.registered:
            self.registration = "off"
            return False
        L, ring = self._L, self._ring
        try:
            if self._arena_buffer is None or self._arena_buffer[0] != id(arena):
                if self._arena_buffer is not None:
                    L.io_uring_unregister_buffers(ring)
                    self._arena_buffer = None
                buffer = L.Iovec([arena.view])
                L.io_uring_register_buffers(ring, buffer)
                self._arena_buffer = (id(arena), buffer, arena)
            if self._files is None or self._files[0] != fds:
                if self._files is not None:
                    L.io_uring_unregister_files(ring)
                    self._files = None
                index = L.FileIndex(list(fds))
                L.io_uring_register_files(ring, index)
                self._files = (fds, index)
        except OSError as e:
            self.registered = False
            self.registration = f"refused by the kernel ({e}); plain readv/writev"
            return False
        self.registration = "fixed buffer + fixed files"
        return True

    def _batch(self, write: bool, requests: list[ReadRequest], arena: AlignedArena) -> list[int]:
        self.check(requests, arena)
        L, ring, cqe = self._L, self._ring, self._cqe
        fds = tuple(sorted({r.fd for r in requests}))
        fixed = self._register(arena, fds) if requests else False
        slot_of_fd = {fd: i for i, fd in enumerate(fds)}
        prep = (L.io_uring_prep_writev_fixed if write else L.io_uring_prep_readv_fixed) if fixed else \
            (L.io_uring_prep_writev if write else L.io_uring_prep_readv)
        out = [0] * len(requests)
        start, submit = time.perf_counter(), 0.0
        nxt, inflight, done = 0, 0, 0
        while done < len(requests):
            queued = 0
            while nxt < len(requests) and inflight < self.queue_depth:
                r = requests[nxt]
                sqe = L.io_uring_get_sqe(ring)
                if fixed:
                    prep(sqe, slot_of_fd[r.fd], self._iovec(arena, nxt, r.length), 0, r.offset)
                    sqe.flags |= L.IOSQE_FIXED_FILE
                else:
                    prep(sqe, r.fd, self._iovec(arena, nxt, r.length), r.offset)
                sqe.user_data = nxt
                nxt, inflight, queued = nxt + 1, inflight + 1, queued + 1
            if queued:
                t = time.perf_counter()
                L.io_uring_submit(ring)  # one call for the whole batch
                submit += time.perf_counter() - t
            L.io_uring_wait_cqe(ring, cqe)
            ready = 0
            for _ in L.CqeIter(ring, cqe):  # the iterator follows the ring's wrap; cqe[j] would run past it
                c = cqe[0]
                if c.res < 0:
                    raise StorageError(f"io_uring {'write' if write else 'read'} of request {c.user_data} "
                                       f"failed: errno {-c.res}")
                out[c.user_data] = c.res
                ready += 1
            L.io_uring_cq_advance(ring, ready)
            inflight, done = inflight - ready, done + ready
        self.stats = IOStats(len(requests), sum(out), time.perf_counter() - start, submit)
        return out

    def read_batch(self, requests: list[ReadRequest], arena: AlignedArena) -> list[int]:
        return self._batch(False, requests, arena)

    def write_batch(self, requests: list[ReadRequest], arena: AlignedArena) -> list[int]:
        return self._batch(True, requests, arena)

    def close(self):
        self._L.io_uring_queue_exit(self._ring)
