import pytest
import torch

from claimbench.model import HookError, KVCache, Llama, LlamaConfig, dense_attention, generate


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny()).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def tokens(n, seed=0):
    return torch.randint(0, 256, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
def test_cached_decode_equals_full_recompute(tiny, dtype, tol):
    model = tiny.to(dtype)
    ids = tokens(40)
    full = model(ids)
    cache = model.new_cache(capacity=8)  # forces growth
    parts = [model(ids[:, :17], cache), model(ids[:, 17:30], cache)]  # chunked prefill
    parts += [model(ids[:, t:t + 1], cache) for t in range(30, 40)]  # decode
    stepped = torch.cat(parts, dim=1)
    assert torch.allclose(stepped.float(), full.float(), atol=tol, rtol=tol)
    assert cache.length == 40 and cache.positions[:40].tolist() == list(range(40))
    tiny.to(torch.float32)


class MaskedDense:
    """Dense decode attention that ignores entries at some positions: the reference for drops."""

    def __init__(self, cache, hidden_positions):
        self.cache, self.hidden = cache, set(hidden_positions)

    def attend(self, layer, q, k, v):
        visible = torch.tensor([int(p) not in self.hidden for p in self.cache.valid_positions()])
        return dense_attention(q, k[:, :, visible], v[:, :, visible])


def test_drop_keeps_positions_and_equals_masking(tiny):
    ids = tokens(30, seed=1)
    dropped = list(range(5, 12)) + [20]
    cache = tiny.new_cache()
    tiny(ids[:, :25], cache)
    cache.drop(torch.tensor(dropped))
    assert cache.length == 25 - len(dropped)
    assert cache.valid_positions().tolist() == [p for p in range(25) if p not in dropped]
    assert cache.k.shape[3] >= cache.length and cache.next_position == 25
    after_drop = [tiny(ids[:, t:t + 1], cache) for t in range(25, 30)]
    assert cache.valid_positions()[-5:].tolist() == list(range(25, 30))

    reference = tiny.new_cache()
    tiny(ids[:, :25], reference)
    with tiny.attention_method(MaskedDense(reference, dropped)):
        masked = [tiny(ids[:, t:t + 1], reference) for t in range(25, 30)]
    for a, b in zip(after_drop, masked):
        assert torch.allclose(a, b, atol=1e-5)


def test_keep_validates_indices(tiny):
    cache = tiny.new_cache()
    tiny(tokens(6), cache)
    with pytest.raises(IndexError):
        cache.keep(torch.tensor([0, 6]))
    cache.keep(torch.tensor([4, 1]))
    assert cache.valid_positions().tolist() == [1, 4]


def test_dense_attention_hook_matches_sdpa(tiny):
    ids = tokens(20, seed=2)
    cache = tiny.new_cache()
    tiny(ids[:, :19], cache)

    class Dense:
        def attend(self, layer, q, k, v):
            return dense_attention(q, k, v)

    reference = tiny(ids[:, 19:], _prefilled(tiny, ids[:, :19]))
    with tiny.attention_method(Dense()):
        hooked = tiny(ids[:, 19:], cache)
    assert torch.allclose(hooked, reference, atol=1e-5)


def _prefilled(model, ids):
    cache = model.new_cache()
    model(ids, cache)
    return cache


def test_hooks_compose_or_refuse(tiny):
    class A:
        def attend(self, layer, q, k, v):
            return dense_attention(q, k, v)

    with tiny.attention_method(A()):
        with pytest.raises(HookError, match="already replaced"):
            with tiny.attention_method(A()):
                pass
        with tiny.capture_qk() as captured:  # capture composes with an attention method
            tiny(tokens(5))
    assert [layer for layer, _, _ in captured] == [0, 1]
    _, q, k = captured[0]
    assert q.shape == (1, 4, 5, 16) and k.shape == (1, 2, 5, 16)
    assert tiny.hooks.attention is None and tiny.hooks.captured is None


def test_swap_weights_restores(tiny):
    ids = tokens(8, seed=3)
    before = tiny(ids)
    name = "layers.0.attention.wq.weight"
    with tiny.swap_weights({name: torch.zeros_like(dict(tiny.named_parameters())[name])}):
        assert not torch.allclose(tiny(ids), before)
    assert torch.allclose(tiny(ids), before)
    with pytest.raises(KeyError, match="no such parameter"):
        with tiny.swap_weights({"nope.weight": torch.zeros(1)}):
            pass


def test_generate_stops_at_eos(tiny):
    out = generate(tiny, tokens(5)[0], 10)
    assert out.shape == (10,)
    first = int(out[0])
    assert generate(tiny, tokens(5)[0], 10, eos_id=first).tolist() == [first]


def test_cache_dtype_follows_the_model(tiny):
    assert isinstance(tiny.new_cache(), KVCache) and tiny.new_cache().k.dtype == torch.float32


def test_onnx_export_of_grouped_query_attention_matches_torch(tiny, tmp_path):
    """The legacy exporter has no grouped-query SDPA: under export the KV heads are repeated."""
    ort = pytest.importorskip("onnxruntime")
    ids = tokens(16)
    path = tmp_path / "tiny.onnx"
    with torch.no_grad():
        torch.onnx.export(tiny, (ids,), str(path), input_names=["ids"], output_names=["logits"], dynamo=False,
                          opset_version=17)
        expected = tiny(ids).numpy()
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"ids": ids.numpy()})[0]
    assert abs(got - expected).max() < 1e-4
