"""Every implementation of every interface in claimbench/interfaces.py, found by walking impl/ and
baselines/, meets its interface's contract on a small input. A new implementation is picked up
here without editing this file (unless its constructor needs arguments: then it gets a factory)."""
import importlib
import inspect
import os
import pkgutil

import numpy as np
import pytest
import torch

from claimbench import agentcost, interfaces
from claimbench.datasets import agent_trajectories
from claimbench.llm.model import dense_attention


def implementations(interface) -> list[type]:
    for package in ("claimbench.impl", "claimbench.baselines"):
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__):
            importlib.import_module(f"{package}.{info.name}")
    found, todo = [], [interface]
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if not inspect.isabstract(sub) and sub.__module__.startswith(("claimbench.impl", "claimbench.baselines")):
                found.append(sub)
    return sorted(found, key=lambda c: c.__qualname__)


def make(cls, **kwargs):
    """An instance with small knobs where it has them, or a skip naming what is missing here."""
    try:
        return cls(**{k: v for k, v in kwargs.items() if k in inspect.signature(cls).parameters})
    except (interfaces.StorageError, ImportError, RuntimeError) as e:
        pytest.skip(f"{cls.__name__}: {e}")


def test_every_family_has_an_implementation():
    for interface in (interfaces.VectorIndex, interfaces.DecodeAttention, interfaces.BatchIO,
                      interfaces.ContextPolicy, interfaces.EngineBackend, interfaces.KVOffloadPolicy,
                      interfaces.HeadDimCompression, interfaces.AdoptionPolicy, interfaces.RecipeProposer,
                      interfaces.WeightFormat, interfaces.Drafter):
        assert implementations(interface), interface


@pytest.mark.parametrize("cls", implementations(interfaces.VectorIndex), ids=lambda c: c.__name__)
def test_vector_index_contract(cls):
    rng = np.random.default_rng(0)
    xb, xq = rng.standard_normal((2000, 16)).astype(np.float32), rng.standard_normal((7, 16)).astype(np.float32)
    index = make(cls, nlist=16)
    with pytest.raises(interfaces.InputError):
        index.search(xq, 5)
    index.build(xb)
    if hasattr(index, "nprobe"):
        index.set_query_params(nprobe=16)  # every list: exact
    distances, ids = index.search(xq, 5)
    assert distances.shape == ids.shape == (7, 5) and index.ntotal == 2000 and index.d == 16
    exact = ((xq[:, None, :] - xb[None]) ** 2).sum(-1).argsort(1)[:, :5]
    assert (ids == exact).mean() > 0.99 and (np.diff(distances, axis=1) >= -1e-5).all()
    with pytest.raises(interfaces.InputError, match="dimension"):
        index.search(xq[:, :8], 5)


@pytest.mark.parametrize("cls", implementations(interfaces.DecodeAttention), ids=lambda c: c.__name__)
def test_decode_attention_contract(cls):
    """Shapes in and out; with the whole cache inside the budget, exactly dense attention."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 1, 16, generator=gen), torch.randn(1, 2, 400, 16, generator=gen),
               torch.randn(1, 2, 400, 16, generator=gen))
    method = make(cls, sparsity=10.0)
    out = method.attend(0, q, k, v)
    assert out.shape == (1, 4, 1, 16) and torch.isfinite(out).all()
    small = make(cls, sparsity=1.0)
    assert torch.allclose(small.attend(0, q, k[:, :, :30], v[:, :, :30]), dense_attention(q, k[:, :, :30], v[:, :, :30]),
                          atol=1e-5)


@pytest.mark.parametrize("cls", implementations(interfaces.BatchIO), ids=lambda c: c.__name__)
def test_batch_io_contract(cls, tmp_path):
    """Bytes written through the path read back identically through it, in request order."""
    path = make(cls, queue_depth=8, threads=4)
    arena = interfaces.AlignedArena(interfaces.ALIGN, 8)
    file = tmp_path / "blocks"
    file.write_bytes(b"\0" * 16 * interfaces.ALIGN)
    try:
        fd = os.open(file, os.O_RDWR | os.O_DIRECT)
    except OSError as e:
        pytest.skip(f"O_DIRECT on {tmp_path}: {e}")
    try:
        requests = [interfaces.ReadRequest(fd, offset * interfaces.ALIGN, interfaces.ALIGN) for offset in (9, 2, 5)]
        for i in range(3):
            arena.slot(i)[:] = bytes([i + 1]) * interfaces.ALIGN
        assert path.write_batch(requests, arena) == [interfaces.ALIGN] * 3
        for i in range(3):
            arena.slot(i)[:] = b"\0" * interfaces.ALIGN
        assert path.read_batch(requests[::-1], arena) == [interfaces.ALIGN] * 3
        assert [bytes(arena.slot(i))[0] for i in range(3)] == [3, 2, 1]
        with pytest.raises(interfaces.StorageError, match="slots"):
            path.read_batch(requests * 3, arena)
    finally:
        os.close(fd)
        path.close()


@pytest.mark.parametrize("cls", implementations(interfaces.ContextPolicy), ids=lambda c: c.__name__)
def test_context_policy_contract(cls):
    """One agent bill per call; tokens add up; no call attends to more than full history's does."""
    from claimbench.baselines.agent_context import FullHistory
    traj = agent_trajectories.generate(agent_trajectories.GeneratorParams(calls_mean=30, calls_sd=0), seed=3)
    bills = agentcost.replay(cls(), traj, window=128_000, min_cacheable=1024)
    agent = [b for b in bills if b.kind == "agent"]
    full = agentcost.replay(FullHistory(), traj, window=128_000, min_cacheable=1024)
    assert len(agent) == len(traj.calls) == len(full)
    assert all(min(b.read, b.written, b.uncached, b.output) >= 0 for b in bills)
    assert all(b.read + b.written + b.uncached == b.context for b in bills)
    assert all(a.context <= f.context for a, f in zip(agent, full))


# Backends whose constructor takes what an earlier step found (Olive: its candidates; none here).
BACKEND_FACTORIES = {"OliveCandidates": lambda cls: cls([])}


@pytest.mark.parametrize("cls", implementations(interfaces.EngineBackend), ids=lambda c: c.__name__)
def test_engine_backend_contract(cls, tmp_path):
    """Valid knobs, and the default route runs the workload as the unoptimized reference does."""
    from claimbench.impl.tuner import default_route
    from tests.baselines.test_engine_build import ChainWorkload
    if not cls.available():
        pytest.skip(f"{cls.__name__}: needs the {cls.module} package (not installed here)")
    backend = BACKEND_FACTORIES.get(cls.__name__, lambda c: c())(cls)
    workload = ChainWorkload(tmp_path / "chain.onnx")
    reference, _ = workload.reference()
    knobs = backend.knobs(workload)
    assert knobs and all(isinstance(k, interfaces.Knob) for k in knobs)
    engine = backend.build(workload, default_route(knobs), tmp_path)
    assert np.allclose(backend.run(engine, workload.gate_feeds()[0])[0], reference[0][0], atol=1e-4)


@pytest.mark.parametrize("cls", implementations(interfaces.KVOffloadPolicy), ids=lambda c: c.__name__)
def test_kv_offload_policy_contract(cls):
    """A yes/no admission for either kind of object, a non-negative merge size, and a replay where
    every byte admitted to SSD is written once and no policy beats write-all's hit rate."""
    from claimbench import kvoffload
    from claimbench.baselines.kv_offload import WriteAll
    policy = cls()
    assert all(isinstance(policy.admit(kind, 1 << 20, reads), bool) for kind in ("kv", "state") for reads in (0, 3))
    assert policy.merge_bytes >= 0
    trace = kvoffload.agent_trace([agent_trajectories.generate(agent_trajectories.GeneratorParams(calls_mean=15,
                                                                                                calls_sd=0), s)
                                   for s in range(4)])
    profile = kvoffload.load_data()[0]["qwen3-next-80b-a3b"]
    room = kvoffload.Tiers(hbm_bytes=2e9, dram_bytes=4e9)
    r, base = kvoffload.replay(trace, profile, policy, room), kvoffload.replay(trace, profile, WriteAll(), room)
    assert r.ssd_bytes_written == r.ssd_bytes_admitted == sum(size * n for size, n in r.write_sizes.items())
    assert r.token_hit_rate <= base.token_hit_rate and r.ssd_bytes_written <= base.ssd_bytes_written


@pytest.fixture(scope="module")
def tiny_llama():
    from claimbench.llm import headdim
    from claimbench.llm.model import Llama, LlamaConfig
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny()).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    ids = torch.randint(0, 256, (400,), generator=torch.Generator().manual_seed(0)).tolist()
    return model, headdim.calibrate(model, ids, window=200)


@pytest.mark.parametrize("cls", implementations(interfaces.HeadDimCompression), ids=lambda c: c.__name__)
def test_head_dim_compression_contract(cls, tiny_llama):
    """Fitted on calibration statistics and applied: a cache at the declared key width, finite
    logits, the model restored on exit; at full retention, exactly the full model."""
    model, statistics = tiny_llama
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    full = model(ids)
    for retention in (0.5, 1.0):
        method = make(cls, retention=retention)
        method.fit(model, statistics)
        shape = method.key_shape(model.config)
        assert isinstance(shape, interfaces.KeyShape) and shape.cached <= model.config.head_dim
        with method.apply(model):
            cache = model.new_cache()
            out = torch.cat([model(ids[:, :20], cache)] + [model(ids[:, t:t + 1], cache) for t in range(20, 24)], 1)
        assert all(k.shape[-1] == shape.cached for k in cache.k) and torch.isfinite(out).all()
        if method.retention == 1.0:
            assert torch.allclose(out, full, atol=1e-4)
    assert torch.equal(model(ids), full)


@pytest.mark.parametrize("cls", implementations(interfaces.AdoptionPolicy), ids=lambda c: c.__name__)
def test_adoption_policy_contract(cls):
    """One bool per run; a diverged run is never adopted; the test split is never read."""
    rng = np.random.default_rng(0)
    rtn = {split: rng.uniform(0, 1, 40) for split in ("calibration", "gate", "test")}

    def run(i, diverged=False):
        scores = {split: np.clip(rtn[split] + 0.02 * (i - 2) + rng.normal(0, 0.01, 40), 0, 1) for split in rtn}
        scores["test"] = np.full(40, np.nan)  # a policy that read it would compare NaN
        return interfaces.CalibrationRun(10.0 ** -i, 20, 0, 0.1 * i, diverged, 0.01 * i, 0.0, scores)

    runs = [run(i, diverged=(i == 4)) for i in range(5)]
    decided = make(cls, permutations=500).decide(runs, rtn)
    assert len(decided) == 5 and all(isinstance(d, bool) for d in decided) and not decided[4]


@pytest.mark.parametrize("cls", implementations(interfaces.RecipeProposer), ids=lambda c: c.__name__)
def test_recipe_proposer_contract(cls):
    """Proposals are valid recipes that differ from the best so far, every one new, until None."""
    import sys

    from claimbench.datasets import recipes
    start = recipes.load("moe-lm")
    timing = {"phases": {"data": 0.1, "forward": 1.0, "backward": 2.0, "optimizer": 0.5}, "padding_share": 0.1,
              "profile": {"top": [{"name": "aten::nonzero", "share": 0.3, "calls": 9}]}}
    history = [{"proposer": "start", "changes": {}, "status": "accepted", "profile": timing}]
    proposer = make(cls, cores=2, command=[sys.executable, "-m", "claimbench.impl.attune_scripted_proposer", "{dir}"])
    seen = []
    for _ in range(40):
        proposal = proposer.propose(dict(start), dict(start), history)
        if proposal is None:
            break
        flat = recipes.validate(recipes.nest(proposal))
        assert flat != start and flat not in seen
        seen.append(flat)
        history.append({"proposer": proposer.name, "changes": {k: v for k, v in flat.items() if start[k] != v},
                        "status": "rejected", "profile": None})
    assert seen


@pytest.mark.parametrize("cls", implementations(interfaces.WeightFormat), ids=lambda c: c.__name__)
@pytest.mark.parametrize("bits", [16, 8, 4])
def test_weight_format_contract(cls, bits):
    """A format stores a weight of the same shape, no better than it (no more bits, no less error than
    zero) and counts its bits; a width it cannot store (groups, or 2:4) is refused; plain fp16 stores any."""
    from claimbench.baselines.weight_compression import LayerStatistics
    torch.manual_seed(0)
    weight, x = torch.randn(32, 128), torch.randn(256, 128)
    fmt = make(cls, bits=bits)
    stats = LayerStatistics((x.T @ x).double(), 256) if fmt.needs_calibration else None
    stored = fmt.compress(weight, stats)
    assert stored.shape == weight.shape and stored.dtype == weight.dtype
    assert 0 < fmt.bits_per_weight() <= 16 and isinstance(fmt.name, str) and fmt.name
    assert float((stored - weight).norm()) <= float(weight.norm())
    if fmt.bits_per_weight() < 16:
        with pytest.raises(interfaces.InputError):
            fmt.compress(torch.randn(32, 66), stats if stats is None else LayerStatistics(torch.eye(66).double(), 66))


@pytest.mark.parametrize("cls", implementations(interfaces.Drafter), ids=lambda c: c.__name__)
def test_drafter_contract(cls):
    """Whatever a drafter proposes (untrained heads included), greedy speculative output is plain
    greedy decoding's, and the drafter never proposes more than k tokens."""
    from claimbench.llm import evaluate, speculative
    from claimbench.llm.model import Llama, LlamaConfig
    torch.manual_seed(0)
    model = Llama(LlamaConfig.tiny()).eval()
    drafter = make(cls, dim=64, heads=3, block=3, width=32, steps=2)
    ids = torch.randint(0, 256, (24,), generator=torch.Generator().manual_seed(1)).tolist()
    generation = speculative.generate(model, ids, drafter, 20, k=3)
    assert generation.tokens == evaluate.generate(model, ids, 20)
    assert all(0 <= a <= 3 for a in generation.accepted_per_pass) and isinstance(drafter.name, str)
