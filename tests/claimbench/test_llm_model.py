import pytest
import torch

import copy

from claimbench.llm.evaluate import decode, generate, prefill, teacher_forced_nll
from claimbench.llm.model import HookError, KVCache, Llama, LlamaConfig, dense_attention


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
    assert cache.length == 40 and cache.valid_positions().tolist() == list(range(40))
    tiny.to(torch.float32)


class MaskedDense:
    """Dense decode attention that ignores entries at some positions: the reference for drops."""

    def __init__(self, cache, hidden_positions):
        self.cache, self.hidden = cache, set(hidden_positions)

    def attend(self, layer, q, k, v):
        visible = torch.tensor([int(p) not in self.hidden for p in self.cache.valid_positions(layer)])
        return dense_attention(q, k[:, :, visible], v[:, :, visible])


def test_drop_keeps_positions_and_equals_masking(tiny):
    ids = tokens(30, seed=1)
    dropped = list(range(5, 12)) + [20]
    cache = tiny.new_cache()
    tiny(ids[:, :25], cache)
    cache.drop(torch.tensor(dropped))
    assert cache.length == 25 - len(dropped)
    assert cache.valid_positions().tolist() == [p for p in range(25) if p not in dropped]
    assert cache.k[0].shape[2] >= cache.length and cache.next_position == 25
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


def _prefilled(model, ids):
    cache = model.new_cache()
    model(ids, cache)
    return cache


def test_decode_attention_refuses_a_second_method_naming_both(tiny):
    class A:
        def attend(self, layer, q, k, v):
            return dense_attention(q, k, v)

        def __repr__(self):
            return "A()"

    class B(A):
        def __repr__(self):
            return "B()"

    with tiny.attention_method(A()):
        with pytest.raises(HookError, match=r"already replaced by A\(\); B\(\) cannot"):
            with tiny.attention_method(B()):
                pass
        with tiny.capture_qk() as captured:  # capture composes with an attention method
            tiny(tokens(5))
    assert [layer for layer, _, _ in captured] == [0, 1]
    _, q, k = captured[0]
    assert q.shape == (1, 4, 5, 16) and k.shape == (1, 2, 5, 16)
    assert tiny.hooks.attention is None and tiny.hooks.captures == []


# One "identity hook equals no hook" test per hook point: the logits are equal.

def test_identity_decode_attention_equals_no_hook(tiny):
    ids = tokens(20, seed=2)

    class Dense:
        def attend(self, layer, q, k, v):
            return dense_attention(q, k, v)

    reference = tiny(ids[:, 19:], _prefilled(tiny, ids[:, :19]))
    with tiny.attention_method(Dense()):
        hooked = tiny(ids[:, 19:], _prefilled(tiny, ids[:, :19]))
    assert torch.allclose(hooked, reference, atol=1e-5)


class KeepAll:
    def __init__(self):
        self.calls = []

    def select(self, layer, x, positions):
        self.calls.append(layer)
        return torch.arange(x.shape[1])


def test_identity_token_selection_equals_no_hook(tiny):
    ids = tokens(12, seed=4)
    with tiny.select_tokens(KeepAll()) as first, tiny.select_tokens(KeepAll()) as second:
        hooked = tiny(ids)
    assert torch.equal(hooked, tiny(ids))
    assert first.calls == second.calls == [0, 1]  # both, after every layer, in order
    assert tiny.hooks.selectors == []


def test_token_selection_drops_rows_in_later_layers_only(tiny):
    ids = tokens(12, seed=5)
    kept = [0, 3, 7, 11]

    class AfterFirst:
        def select(self, layer, x, positions):
            return torch.tensor(kept[::-1]) if layer == 0 else None  # any order; kept in position order

    cache = tiny.new_cache(capacity=20)
    with tiny.select_tokens(AfterFirst()):
        logits = tiny(ids, cache)
    assert logits.shape[1] == len(kept) and cache.lengths == [12, 4]
    # each layer's buffers hold its entries and the decode room the first entries left (20 - 12)
    assert [k.shape[2] for k in cache.k] == [20, 12] and [v.shape[2] for v in cache.v] == [20, 12]
    assert cache.valid_positions(1).tolist() == kept
    with pytest.raises(ValueError, match="lengths"):
        cache.length
    # the next token sees layer 0's 12 entries and layer 1's 4: the same as running layer 1 on those rows
    step = tiny(tokens(1, seed=6), cache)
    assert step.shape == (1, 1, 256) and cache.lengths == [13, 5] and torch.isfinite(step).all()


def test_a_cache_allocates_a_layer_at_its_first_entries_and_doubles_when_full(tiny):
    cache = tiny.new_cache(capacity=16)
    assert [k.shape[2] for k in cache.k] == [0, 0]  # nothing resident before the first entries
    tiny(tokens(10, seed=1), cache)
    assert [k.shape[2] for k in cache.k] == [16, 16] and cache.clone().k[1].shape[2] == 16
    tiny(tokens(8, seed=2), cache)  # 18 entries overflow 16: the buffers double
    assert [k.shape[2] for k in cache.k] == [32, 32] and cache.length == 18


def test_identity_module_swap_equals_no_hook_and_restores(tiny):
    ids = tokens(8, seed=3)
    before = tiny(ids)
    name = "layers.0.attention.wq"
    original = tiny.get_submodule(name)
    with tiny.swap_modules({name: copy.deepcopy(original)}):
        assert torch.equal(tiny(ids), before)
        zero = torch.nn.Linear(64, 64, bias=False)
        torch.nn.init.zeros_(zero.weight)
        with tiny.swap_modules({name: zero}):  # the same name again: nests
            assert not torch.allclose(tiny(ids), before)
        assert torch.equal(tiny(ids), before)
    assert tiny.get_submodule(name) is original
    with pytest.raises(KeyError, match="no such module"):
        with tiny.swap_modules({"layers.9.nope": zero}):
            pass


def test_trainable_swap_gets_gradients_and_nothing_else_does(tiny):
    name = "layers.1.feed_forward.w2"
    trained = copy.deepcopy(tiny.get_submodule(name))
    with tiny.swap_modules({name: trained}, trainable=True):
        tiny(tokens(6)).logsumexp(-1).sum().backward()
    assert trained.weight.grad is not None and trained.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in tiny.parameters())
    frozen = copy.deepcopy(tiny.get_submodule(name))
    with tiny.swap_modules({name: frozen}):
        assert not frozen.weight.requires_grad


def test_identity_qk_capture_equals_no_hook_and_captures_nest(tiny):
    ids = tokens(7, seed=7)
    with tiny.capture_qk() as outer, tiny.capture_qk() as inner:
        hooked = tiny(ids)
    assert torch.equal(hooked, tiny(ids)) and len(outer) == len(inner) == 2


def test_identity_qk_slice_equals_no_hook(tiny):
    """Every rotary pair kept, in a shuffled order: the dot products, and so the logits, are unchanged."""
    ids = tokens(10, seed=8)
    every = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    with tiny.slice_qk({0: every, 1: every}):
        hooked = tiny(ids)
    assert torch.allclose(hooked, tiny(ids), atol=1e-5)


def test_qk_slice_narrows_the_cache_of_that_layer(tiny):
    ids = tokens(10, seed=9)
    with tiny.slice_qk({1: torch.tensor([0, 2, 5])}):
        cache = tiny.new_cache()
        chunked = torch.cat([tiny(ids[:, :6], cache), tiny(ids[:, 6:], cache)], 1)
        full = tiny(ids)
        assert cache.k[0].shape[-1] == 16 and cache.k[1].shape[-1] == 6 and cache.v[1].shape[-1] == 16
    assert torch.allclose(chunked, full, atol=1e-5) and not torch.allclose(full, tiny(ids), atol=1e-3)
    assert tiny.layers[1].attention.qk_dim == 16 and tiny.layers[1].attention.rope_index is None
    with pytest.raises(ValueError, match="distinct pairs"):
        with tiny.slice_qk({0: [1, 1]}):
            pass


def test_identity_truncate_equals_no_hook_and_rewinds(tiny):
    """Truncating at the end changes nothing; truncating back and decoding again equals never having
    decoded past there (speculative verification rejecting a draft)."""
    ids = tokens(16, seed=10)
    cache, logits = prefill(tiny, ids[0, :10].tolist())
    cache.truncate(cache.next_position)
    reference = decode(tiny, cache.clone(), None, 4, logits=logits)
    draft = cache.clone()
    tiny(ids[:, 10:16], draft)  # six drafted tokens
    draft.truncate(10)
    assert draft.length == 10 and draft.next_position == 10
    assert decode(tiny, draft, None, 4, logits=logits) == reference
    with pytest.raises(IndexError):
        draft.truncate(draft.next_position + 1)


def test_teacher_forced_nll_equals_the_full_forward(tiny):
    ids = tokens(12, seed=11)[0].tolist()
    cache, _ = prefill(tiny, ids[:5])
    nll = teacher_forced_nll(tiny, cache, ids[5], ids[6:])
    logits = tiny(torch.tensor([ids]))[0, 5:-1]
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[6:]), reduction="none")
    assert torch.allclose(torch.tensor(nll), expected, atol=1e-5)


def test_generate_stops_at_eos(tiny):
    out = generate(tiny, tokens(5)[0].tolist(), 10)
    assert len(out) == 10
    assert generate(tiny, tokens(5)[0].tolist(), 10, eos=out[0]) == []
    cache, _ = prefill(tiny, tokens(5)[0].tolist())
    with pytest.raises(ValueError, match="exactly one"):
        decode(tiny, cache, None, 3)


def test_cache_dtype_follows_the_model(tiny):
    assert isinstance(tiny.new_cache(), KVCache) and tiny.new_cache().k[0].dtype == torch.float32


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
