"""The tiered prefix-cache simulator and the write policies on hand-built traces with known hits,
evictions and bytes (claimbench/kvoffload.py, baselines/kv_offload.py, impl/gandalf.py)."""
import pytest

from claimbench import kvoffload
from claimbench.baselines.kv_offload import AdmitAfterReads, SizeGated, WriteAll
from claimbench.datasets.agent_trajectories import GeneratorParams, Trajectory, Turn, generate
from claimbench.impl.gandalf import LayerTypeGating, LayerTypeGatingMerged

BLOCK = 4  # tokens per block in these traces
HYBRID = kvoffload.ModelProfile("hybrid", 4, 1, 3, 2, kv_bytes_per_token=10, state_bytes=100, source="test")
PURE = kvoffload.ModelProfile("pure", 4, 4, 0, 2, kv_bytes_per_token=10, state_bytes=0, source="test")
KV = 10 * BLOCK  # one block's KV: 40 bytes


def tiers(hbm, dram, ssd=10_000):
    return kvoffload.Tiers(hbm_bytes=hbm, dram_bytes=dram, ssd_bytes=ssd, block_tokens=BLOCK,
                           prefill_tokens_per_s=100.0, ssd_read_bytes_per_s=1000.0)


def request(t, blocks, tokens=None):
    return kvoffload.Request(t, tokens or BLOCK * len(blocks), 1, tuple(blocks))


def test_a_repeated_prefix_hits_and_a_new_one_misses():
    trace = [request(0, [1, 2]), request(1, [1, 2, 3]), request(2, [7])]
    r = kvoffload.replay(trace, PURE, WriteAll(), tiers(1000, 1000))
    assert (r.hit_tokens, r.input_tokens, r.requests_hit) == (2 * BLOCK, 6 * BLOCK, 1)
    assert r.hit_tokens_by_tier == {"hbm": 2 * BLOCK, "dram": 0, "ssd": 0} and r.ssd_bytes_written == 0


def test_evictions_cascade_and_write_all_writes_what_dram_evicts():
    """HBM holds 1 block, DRAM 1: block 1 ends on SSD after blocks 2 and 3 arrive, and is read from there."""
    trace = [request(0, [1]), request(1, [2]), request(2, [3]), request(3, [1])]
    r = kvoffload.replay(trace, PURE, WriteAll(), tiers(KV, KV))
    assert r.ssd_bytes_written == 2 * KV  # blocks 1 and 2 left DRAM
    assert r.hit_tokens_by_tier["ssd"] == BLOCK and r.ssd_read_bytes == KV
    assert r.ssd_bytes_admitted == r.ssd_bytes_written  # conservation
    assert r.ttft_s == pytest.approx(3 * BLOCK / 100.0 + KV / 1000.0)


def test_admission_after_reads_writes_only_reread_blocks():
    trace = [request(0, [1]), request(1, [1]), request(2, [2]), request(3, [3]), request(4, [4])]
    r = kvoffload.replay(trace, PURE, AdmitAfterReads(reads=1), tiers(KV, KV))
    assert r.write_sizes == {KV: 1}  # block 1 (read once) is written; 2 was never read
    assert kvoffload.replay(trace, PURE, WriteAll(), tiers(KV, KV)).write_sizes == {KV: 2}  # 1 and 2 left DRAM


def test_size_gate_keeps_small_objects_off_the_ssd():
    trace = [request(0, [1]), request(1, [2]), request(2, [3])]
    assert kvoffload.replay(trace, PURE, SizeGated(min_bytes=KV + 1), tiers(KV, KV)).ssd_bytes_written == 0


def test_a_hybrid_hit_needs_the_state_checkpoint_or_recomputes():
    """With states only at turn ends, a request that continues a prefix past its last checkpoint can
    use only the KV up to a checkpoint and recomputes the rest."""
    trace = [request(0, [1, 2, 3]), request(1, [1, 2, 9])]
    turn = kvoffload.replay(trace, HYBRID, WriteAll(), tiers(10_000, 10_000), checkpoint="turn")
    assert (turn.hit_tokens, turn.recompute_tokens) == (0, 2 * BLOCK)  # no state at block 2's end
    block = kvoffload.replay(trace, HYBRID, WriteAll(), tiers(10_000, 10_000), checkpoint="block")
    assert (block.hit_tokens, block.recompute_tokens) == (2 * BLOCK, 0)


def test_layer_type_gating_keeps_states_off_the_ssd():
    trace = [request(t, [t + 1]) for t in range(4)] + [request(4, [1])]
    room = tiers(KV + 100, KV + 100)
    write_all = kvoffload.replay(trace, HYBRID, WriteAll(), room)
    gated = kvoffload.replay(trace, HYBRID, LayerTypeGating(), room)
    assert write_all.write_sizes == {KV: 3, 100: 3} and gated.write_sizes == {KV: 3}
    assert write_all.hit_tokens == BLOCK and gated.hit_tokens == 0  # the state was on SSD only
    assert gated.recompute_tokens == BLOCK


def test_pure_attention_has_nothing_to_gate():
    trace = kvoffload.agent_trace([generate(GeneratorParams(calls_mean=20, calls_sd=0), s) for s in range(3)],
                                  block_tokens=BLOCK * 128)
    room = kvoffload.Tiers(hbm_bytes=2e4, dram_bytes=4e4, block_tokens=BLOCK * 128)
    a, b = kvoffload.replay(trace, PURE, WriteAll(), room), kvoffload.replay(trace, PURE, LayerTypeGating(), room)
    assert a.ssd_bytes_written > 0 and a == b


def test_merged_writes_change_write_amplification_not_bytes():
    trace = [request(t, [t + 1]) for t in range(6)]
    drive = kvoffload.Drive("d", tbw=1e15, capacity_bytes=1e12, spare_fraction=0.07, erase_unit_bytes=4096, source="t")
    room = tiers(KV + 100, KV + 100)
    plain, merged = kvoffload.replay(trace, HYBRID, LayerTypeGating(), room), kvoffload.replay(trace, HYBRID,
                                                                              LayerTypeGatingMerged(), room)
    assert plain.ssd_bytes_written == merged.ssd_bytes_written > 0
    assert merged.write_amplification(drive) == 1.0 < plain.write_amplification(drive)
    assert drive.write_amplification(1) == pytest.approx(1.07 / 0.14, rel=1e-3)


def test_replay_is_deterministic():
    trace = kvoffload.agent_trace([generate(GeneratorParams(calls_mean=10, calls_sd=0), s) for s in range(2)])
    profile = kvoffload.load_data()[0]["qwen3-next-80b-a3b"]
    room = kvoffload.Tiers(hbm_bytes=1e9, dram_bytes=2e9)
    assert kvoffload.replay(trace, profile, WriteAll(), room) == kvoffload.replay(trace, profile, WriteAll(), room)


def test_agent_sessions_share_the_previous_calls_full_blocks():
    traj = Trajectory("t", (Turn("system", 10), Turn("tool_call", 3), Turn("tool_output", 5),
                                Turn("tool_call", 3)))
    first, second = kvoffload.agent_trace([traj], block_tokens=4)
    assert first.input_length == 10 and second.input_length == 18
    assert second.hash_ids[:2] == first.hash_ids[:2] and second.hash_ids[2] != first.hash_ids[2]


@pytest.mark.parametrize("row, message", [
    ({"timestamp": 0, "input_length": 5, "output_length": 1}, "line 2: missing"),
    ({"timestamp": 0, "input_length": -4, "output_length": 1, "hash_ids": []}, "line 2: negative"),
    ({"timestamp": -1, "input_length": 4, "output_length": 1, "hash_ids": [1]}, "line 2: timestamp"),
    ({"timestamp": 5, "input_length": 9, "output_length": 1, "hash_ids": [1]}, "line 2: 1 blocks for 9 tokens"),
])
def test_bad_trace_lines_are_refused_by_line_number(row, message):
    good = {"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}
    with pytest.raises(kvoffload.SimulatorError, match=message):
        kvoffload.read_trace([good, row], block_tokens=4)


def test_bad_profiles_and_caches_are_refused():
    with pytest.raises(kvoffload.SimulatorError, match="3 full-attention \\+ 3 linear layers != 4 layers"):
        kvoffload.ModelProfile("x", 4, 3, 3, 2, 10, 100, "t")
    with pytest.raises(kvoffload.SimulatorError, match="cannot hold one block"):
        kvoffload.replay([request(0, [1])], HYBRID, WriteAll(), tiers(KV, 10))
    with pytest.raises(kvoffload.SimulatorError, match="checkpoint"):
        kvoffload.replay([request(0, [1])], HYBRID, WriteAll(), tiers(1000, 1000), checkpoint="never")


def test_the_shipped_profiles_add_up():
    profiles, drives = kvoffload.load_data()
    assert {"qwen3-next-80b-a3b", "llama-3.1-8b"} <= set(profiles) and "990-pro-2tb" in drives
    qwen = profiles["qwen3-next-80b-a3b"]
    assert qwen.kv_bytes_per_token == 12 * 2 * 2 * 256 * 2 and qwen.hybrid and not profiles["llama-3.1-8b"].hybrid
