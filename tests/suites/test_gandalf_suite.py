"""The Gandalf suite's claim arithmetic (the suite module itself, as asv imports it)."""
import pytest

from claimbench import kvoffload
from claimbench.suites import gandalf as suite


def replay(written, hit, sizes):
    return kvoffload.Replay(requests=10, input_tokens=1000, hit_tokens=hit, ssd_bytes_written=written,
                            write_sizes=sizes, duration_s=3600.0)


def test_the_lifetime_ratio_is_the_bytes_share_times_the_write_amplification_share():
    state, kv = 40_000_000, 12_000_000
    r = {("t", suite.CLAIM_PROFILE, "write-all", "block"): replay(2 * kv + 2 * state, 500, {kv: 2, state: 2}),
         ("t", suite.CLAIM_PROFILE, "layer-type-gating", "block"): replay(2 * kv, 490, {kv: 2})}
    c = suite.claim(r, "t", "layer-type-gating", "block")
    assert c["write_change"] == pytest.approx(100 * (2 * kv / (2 * kv + 2 * state) - 1))
    assert c["hit_change"] == pytest.approx(-1.0)
    assert c["lifetime_ratio"] == pytest.approx(c["from_bytes"] * c["from_wa"])
    assert c["from_wa"] < 1  # smaller objects than the states amplify more: visible, not assumed away


def test_a_cache_that_never_spills_is_a_clear_error():
    r = {("t", suite.CLAIM_PROFILE, p, "block"): replay(0, 500, {}) for p in ("write-all", "layer-type-gating")}
    with pytest.raises(ValueError, match="wrote nothing"):
        suite.claim(r, "t", "layer-type-gating", "block")


def test_a_claim_row_is_the_median_of_the_replicate_session_sets_and_the_fixed_trace_is_exact():
    rows = suite.replicated([3.0, 1.0, 2.0, 5.0, 4.0, 7.0, 6.0, 9.0, 8.0, 10.0])
    assert rows.value == 5.5 and rows.low <= 5.5 <= rows.high and rows.n == 10 and rows.enough
    exact = suite.replicated([4.2])
    assert (exact.value, exact.low, exact.high, exact.n) == (4.2, 4.2, 4.2, 1) and exact.enough
    assert "deterministic" in exact.method


def test_replicates_draw_disjoint_generated_sessions_and_the_mooncake_trace_has_none():
    assert suite.trace("generated-agent", 1) != suite.trace("generated-agent", 0)
    with pytest.raises(ValueError, match="one fixed trace"):
        suite.trace("mooncake-conversation", 1)
