"""One task interface per family, declared once; methods and baselines implement the same one,
and suites run them side by side through it (never probing with hasattr). Knobs are dataclass
fields of the implementations.

- VectorIndex (ann-benchmarks style): build-time knobs are fields, query-time knobs go through
  `set_query_params`; numpy in, numpy out, shapes checked first (faiss contrib style).
- DecodeAttention and TokenSelector: what the LLM substrate's hook points take
  (`model.attention_method`, `model.select_tokens`; claimbench/llm/model.py).
- PromptPrefill: a prompt into a cache, pruning tokens on the way or not (TokenGate and its baselines).
- BatchIO: a storage path reading and writing batches of aligned requests (KV store I/O).
- ContextPolicy: what an agent's prompt holds before each model call (billed by agentcost).
- EngineBackend: route -> engine -> run, for the accuracy-gated engine tuner.
- KVOffloadPolicy: what a tiered prefix cache writes to SSD (trace replay, claimbench.kvoffload).
- HeadDimCompression: narrower keys in the model's attention and cache (RACE and its baselines).
- AdoptionPolicy: which learned calibrations of a sweep to adopt over RTN (the dose gate and its
  baselines), each run a CalibrationRun.
- RecipeProposer: the next training recipe to try (ATTUNE's tuner; every proposal goes through its
  correctness gate, which no proposer sees).
- WeightFormat: how a model's linear weights are stored (pruned, quantized or both): its storage bits
  per weight and the dequantized weights it stores (2:4 sparsity vs quantization).
"""
from __future__ import annotations

import importlib
import mmap
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from claimbench.datasets.agent_trajectories import Trajectory


class InputError(ValueError):
    """Bad input to a task interface; the message names the problem."""


MISSING_ID = -1  # faiss's result for a slot no neighbour fills (a probed list holds fewer than k)
MISSING_DISTANCE = float(np.finfo(np.float32).max)  # and its distance there (FLT_MAX, not inf)


@dataclass
class SearchCounters:
    """Work done by the last `search` call, summed over its queries."""
    queries: int = 0
    lists_probed: int = 0
    lists_skipped: int = 0
    vectors_in_probed_lists: int = 0
    vectors_read_full: int = 0

    @property
    def read_fraction(self) -> float:
        return self.vectors_read_full / max(self.vectors_in_probed_lists, 1)


def check_vectors(x: np.ndarray, what: str, d: int | None = None) -> np.ndarray:
    """float32, C-contiguous, 2-D, finite; dimension d if given."""
    x = np.asarray(x)
    if x.ndim != 2:
        raise InputError(f"{what}: expected a 2-D array (n, d), got shape {x.shape}")
    if x.shape[0] == 0:
        raise InputError(f"{what}: empty (0 vectors)")
    if d is not None and x.shape[1] != d:
        raise InputError(f"{what}: dimension mismatch: got d={x.shape[1]}, the index has d={d}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
        raise InputError(f"{what}: contains NaN or inf (first at row {bad})")
    return x


class VectorIndex(ABC):
    """build(xb) / set_query_params(**p) / search(xq, k) -> (distances (nq, k), ids (nq, k))."""

    name: str = "index"
    counters: SearchCounters

    @abstractmethod
    def build(self, xb: np.ndarray) -> None: ...

    def set_query_params(self, **params) -> None:
        if params:
            raise InputError(f"{self.name} takes no query parameters, got {sorted(params)}")

    @abstractmethod
    def search(self, xq: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]: ...

    @property
    @abstractmethod
    def ntotal(self) -> int: ...

    @property
    @abstractmethod
    def d(self) -> int: ...

    def _check_query(self, xq: np.ndarray, k: int) -> np.ndarray:
        if self.ntotal == 0:
            raise InputError(f"{self.name}: search before build")
        if not isinstance(k, (int, np.integer)) or k < 1:
            raise InputError(f"{self.name}: k must be a positive integer, got {k!r}")
        if k > self.ntotal:
            raise InputError(f"{self.name}: k={k} is larger than the database ({self.ntotal} vectors)")
        return check_vectors(xq, "queries", self.d)


class DecodeAttention(ABC):
    """Decode attention over the cache: q (B, H, 1, d), k and v (B, Hkv, n, d) -> (B, H, 1, d)."""
    name: str = "attention"

    @abstractmethod
    def attend(self, layer: int, q, k, v): ...


class TokenSelector(ABC):
    """During prefill, after each layer: the rows of x (B, T, dim) at positions (T,) to keep, or None
    for all of them."""

    @abstractmethod
    def select(self, layer: int, x, positions): ...


class PromptPrefill(ABC):
    """Prefill a prompt (token ids) into a fresh cache with room for `room` more entries: returns the
    cache later decode steps attend to and the logits (vocab,) after the prompt's last token (the
    first generated token is their argmax). Raises InputError for a prompt longer than the model's
    window."""
    name: str = "prefill"

    @abstractmethod
    def prefill(self, model, ids, room: int = 64): ...


class Drafter(ABC):
    """Proposes the next tokens of a greedy or sampled generation for the target model to verify
    (claimbench/llm/speculative.py). `propose(context, k)`: context is a speculative.DraftContext (the
    tokens so far, the last one not yet verified into the target's cache; the target's last hidden
    state; the model and its cache); returns at most k token ids, fewer or none when it has no guess.
    A drafter that writes into the cache truncates what it wrote before returning. `start(model, prompt)`
    is called once per generation."""
    name: str = "drafter"

    def start(self, model, prompt) -> None:
        """Per-generation state (none by default)."""

    @abstractmethod
    def propose(self, context, k: int) -> list[int]: ...


ALIGN = 4096


class StorageError(OSError):
    """A store or read-path failure with the file and the reason."""


def align_up(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class ReadRequest:
    fd: int
    offset: int
    length: int


class AlignedArena:
    """Page-aligned memory cut into slots, one per request in flight. A private anonymous mapping,
    so io_uring can pin it as a registered buffer (a shared mapping is shmem and is refused)."""

    def __init__(self, slot_bytes: int, slots: int):
        self.slot_bytes = align_up(slot_bytes)
        self.slots = slots
        self.mem = mmap.mmap(-1, self.slot_bytes * slots, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.view = memoryview(self.mem)

    def slot(self, i: int, length: int | None = None) -> memoryview:
        start = i * self.slot_bytes
        return self.view[start:start + (length or self.slot_bytes)]

    def __del__(self):
        """Give the pages back even where the mapping outlives the arena: liburing's Iovec (2026.3.30) never
        releases a buffer it was given, so every arena the io_uring path had touched stayed mapped and
        resident (1 GiB per 16 MiB x 64 read point: the read-path sweep in rounds ran out of memory)."""
        try:
            self.mem.madvise(mmap.MADV_DONTNEED)
        except (AttributeError, ValueError, OSError):  # never mapped, already closed, or no madvise here
            pass


@dataclass
class IOStats:
    """What the last batch cost: wall time and time inside submission calls."""
    requests: int = 0
    bytes: int = 0
    wall_s: float = 0.0
    submit_s: float = 0.0

    @property
    def submit_share(self) -> float:
        return self.submit_s / self.wall_s if self.wall_s else 0.0


class BatchIO(ABC):
    """read_batch(requests, arena) fills arena slot i with request i; write_batch(requests, arena)
    writes slot i to request i's place. Both return per-request byte counts."""
    name = "path"
    stats: IOStats

    @abstractmethod
    def read_batch(self, requests: list[ReadRequest], arena: AlignedArena) -> list[int]: ...

    @abstractmethod
    def write_batch(self, requests: list[ReadRequest], arena: AlignedArena) -> list[int]: ...

    def close(self) -> None:
        pass

    @staticmethod
    def check(requests: list[ReadRequest], arena: AlignedArena) -> None:
        if len(requests) > arena.slots:
            raise StorageError(f"{len(requests)} requests but the arena has {arena.slots} slots")
        for r in requests:
            if r.length > arena.slot_bytes:
                raise StorageError(f"request of {r.length} bytes exceeds the {arena.slot_bytes}-byte slot")


@dataclass(frozen=True)
class Segment:
    key: object  # the turn index, or ("summary", n)
    tokens: int
    version: int = 0
    visible: bool = True


@dataclass
class CallBill:
    read: int = 0
    written: int = 0
    uncached: int = 0
    output: int = 0
    context: int = 0  # tokens the model attends to
    kind: str = "agent"  # "agent" or "summary"


class ContextPolicy(ABC):
    """What the prompt holds before each model call. Knobs are dataclass fields of subclasses."""
    name: str = "policy"

    @abstractmethod
    def prompt(self, traj: Trajectory, upto: int, state: dict) -> list[Segment]:
        """The prompt for the model call that produces turn `upto` (turns [0, upto) are history)."""

    def before_call(self, traj: Trajectory, upto: int, state: dict, prompt: list[Segment], window: int,
                    min_cacheable: int, previous: list[Segment]) -> tuple[list[Segment], list[Segment], list[CallBill]]:
        """Hook for extra calls (e.g. a summary) before the agent's call; default: none."""
        return prompt, previous, []


@dataclass(frozen=True)
class Knob:
    name: str
    values: tuple
    default: object

    def __post_init__(self):
        if self.default not in self.values:
            raise ValueError(f"knob {self.name}: default {self.default!r} not among {self.values!r}")


class EngineBackend(ABC):
    """route -> engine -> run. Engines are built in the child process that times them."""
    name = "backend"
    module = ""  # the package the backend needs

    @classmethod
    def available(cls) -> bool:
        try:
            importlib.import_module(cls.module)
        except ImportError:
            return False
        return True

    @abstractmethod
    def knobs(self, workload) -> list[Knob]: ...

    @abstractmethod
    def build(self, workload, route: dict, workdir: Path): ...

    @abstractmethod
    def run(self, engine, feeds: dict) -> list[np.ndarray]: ...


class KVOffloadPolicy(ABC):
    """When DRAM evicts an object (kind "kv": a block's full-attention KV, or "state": a linear-state
    checkpoint; its bytes; how often it was read), whether it is written to SSD (else dropped).
    `merge_bytes` > 0: admitted objects reach the drive merged into sequential segments of that size."""
    name = "policy"
    merge_bytes = 0

    @abstractmethod
    def admit(self, kind: str, size: int, reads: int) -> bool: ...


@dataclass(frozen=True)
class KeyShape:
    """Numbers per head in a compressed attention's query and key projections, in its q.k scores,
    in the cache per key, and the rank each cached key is rebuilt from at every decode step (0: none)."""
    query_projection: int
    key_projection: int
    score: int
    cached: int
    reconstruct_rank: int = 0


class HeadDimCompression(ABC):
    """Narrower keys on the LLM substrate (claimbench/llm/headdim.py): `fit(model, statistics)` once
    from calibration statistics, then under `with method.apply(model):` the model prefills, decodes
    and caches compressed. `retention`: the share of each key's numbers the cache keeps."""
    name = "compression"
    retention: float

    @abstractmethod
    def fit(self, model, statistics) -> None: ...

    @abstractmethod
    def apply(self, model):
        """A context manager."""

    @abstractmethod
    def key_shape(self, config) -> KeyShape: ...


@dataclass
class CalibrationRun:
    """One learned calibration of a quantized model and what it did to retrieval: NDCG@10 per query
    of each split (calibration, gate, test), as numpy arrays in the split's query order."""
    lr: float
    steps: int
    seed: int
    final_loss: float
    diverged: bool
    dose: float  # 1 - mean cosine to the fp32 embeddings on held-out text
    weight_change: float
    ndcg: dict[str, np.ndarray]


class AdoptionPolicy(ABC):
    """Which calibrations of a sweep to adopt in place of RTN: `decide(runs, rtn)` with rtn the RTN
    model's NDCG@10 per query by split, one bool per run. Judged on the test split, which no policy reads."""
    name = "policy"

    @abstractmethod
    def decide(self, runs: list[CalibrationRun], rtn: dict[str, np.ndarray]) -> list[bool]: ...


class ProposerFailed(RuntimeError):
    """A proposer crashed, hung or returned an invalid recipe; `kind` says which."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class RecipeProposer(ABC):
    """`propose(start, best, history)`: the next recipe to try (a flat dict, claimbench.datasets.recipes),
    or None when out of ideas. start and best are copies of flat recipes; history is the tuner's trials
    so far as plain dicts (changes, status, reasons, tokens_per_s, and the profile of each timed one)."""
    name = "proposer"

    @abstractmethod
    def propose(self, start: dict, best: dict, history: list[dict]) -> dict | None: ...


class WeightFormat(ABC):
    """A storage format for linear-layer weights (claimbench/impl/sparsity24.py): `bits_per_weight()`,
    every stored bit counted (values, scales, sparsity metadata) per original weight, and
    `compress(weight, statistics)`: weight (out, in) -> the dequantized weight the format stores, from
    the layer's calibration statistics where `needs_calibration` (else statistics may be None)."""
    name = "format"
    needs_calibration = False

    @abstractmethod
    def bits_per_weight(self) -> float: ...

    @abstractmethod
    def compress(self, weight, statistics): ...
