"""Object stores (a real S3 API server on 127.0.0.1, and a folder), range coalescing, and the network
model's proxy (its delays checked on a fake clock: real sleeps would make a flaky test)."""
import http.client
import itertools
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given
from hypothesis import strategies as st

from claimbench import localservices
from claimbench.blobstore import LocalStore, RemoteLayout, S3Store, coalesce
from claimbench.interfaces import StorageError
from claimbench.netmodel import NetworkModel, RateLimiter, ShapingProxy, shaped

pytest.importorskip("moto")


@pytest.fixture(scope="module")
def s3():
    with localservices.s3_server() as endpoint:
        localservices.make_bucket(endpoint, "vectors")
        yield endpoint


@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 500)), min_size=1, max_size=30),
       st.integers(0, 2_000))
def test_coalescing_covers_every_range_reads_nothing_outside_them_and_respects_the_gap(spans, gap):
    ranges = [(start, start + length) for start, length in spans]
    merged = coalesce(ranges, gap)
    assert all(any(a <= s and e <= b for a, b in merged) for s, e in ranges)  # every byte asked is read
    starts, ends = {s for s, _ in ranges}, {e for _, e in ranges}
    assert all(a in starts and b in ends for a, b in merged)  # each read starts and ends at an asked byte
    assert all(b1 + gap < a2 for (_, b1), (a2, _) in itertools.pairwise(merged))  # what could merge did
    covered = set().union(*(range(s, e) for s, e in ranges))
    for a, b in merged:  # inside a merged read, holes are never wider than the gap
        holes = [x for x in range(a, b) if x not in covered]
        for _, run in itertools.groupby(enumerate(holes), lambda t: t[1] - t[0]):
            assert len(list(run)) <= gap


def test_coalescing_merges_adjacent_and_nearby_ranges():
    assert coalesce([(10, 20), (0, 10), (25, 30), (100, 110)], gap=5) == [(0, 30), (100, 110)]
    assert coalesce([(0, 10), (11, 20)], gap=0) == [(0, 10), (11, 20)]


@pytest.mark.parametrize("kind", ["s3", "local"])
def test_round_trip_ranges_and_counters(kind, s3, tmp_path):
    store = S3Store(s3, "vectors") if kind == "s3" else LocalStore(tmp_path)
    store.put("a/b", bytes(range(200)))
    assert store.get("a/b") == bytes(range(200))
    assert store.get("a/b", 10, 15) == bytes(range(10, 15))
    assert (store.counters.gets, store.counters.bytes_read) == (2, 205)
    store.reset_counters()
    assert store.counters.gets == 0
    with pytest.raises(StorageError, match="a/missing.*no such object"):
        store.get("a/missing")


def test_errors_name_the_endpoint_the_object_and_the_refusal(s3):
    with pytest.raises(StorageError, match=r"cannot reach the S3 API at http://127.0.0.1:9"):
        S3Store("http://127.0.0.1:9", "vectors").get("x")
    with pytest.raises(StorageError, match="no such bucket"):
        S3Store(s3, "absent").get("x")
    with localservices.s3_server(check_credentials=True) as strict:
        with pytest.raises(StorageError, match="refused the credentials"):
            S3Store(strict, "vectors").get("x")


def test_a_truncated_or_foreign_object_fails_with_its_key(s3):
    store = S3Store(s3, "vectors")
    layout = RemoteLayout(store, "index-1")
    digest = layout.write("toy", {"blob": b"x" * 100}, {})
    assert layout.open("toy", digest)["sizes"] == {"blob": 100}
    store.put("index-1/blob", b"x" * 60)
    with pytest.raises(StorageError, match="index-1/blob.*60 bytes, the manifest says 100"):
        layout.read("blob")
    with pytest.raises(StorageError, match=r"index-1/blob.*asked for bytes \[50, 70\), got 10"):
        layout.read("blob", 50, 70)
    with pytest.raises(StorageError, match="holds another index"):
        RemoteLayout(store, "index-1").open("toy", "0" * 64)
    with pytest.raises(StorageError, match="holds a 'toy' index, not 'remoteann'"):
        RemoteLayout(store, "index-1").open("remoteann")


@pytest.mark.parametrize("where", ["folder", "s3"])
def test_a_large_object_is_stored_as_parts_and_a_range_gets_only_the_parts_it_spans(where, s3, tmp_path):
    store = LocalStore(tmp_path) if where == "folder" else S3Store(s3, "vectors")
    data = bytes(range(256)) + bytes(44)  # 300 bytes: parts of 64, the last one 44
    layout = RemoteLayout(store, f"parted-{where}", part_bytes=64)
    digest = layout.write("toy", {"big": data, "small": b"s" * 64}, {})
    reader = RemoteLayout(store, f"parted-{where}")  # the part size comes from the manifest
    assert reader.open("toy", digest)["sizes"] == {"big": 300, "small": 64}
    for start, end, gets in ((0, 300, 5), (10, 20, 1), (60, 70, 2), (63, 257, 5), (256, 300, 1)):
        store.reset_counters()
        assert reader.read("big", start, end) == data[start:end]
        assert (store.counters.gets, store.counters.bytes_read) == (gets, end - start)
    assert reader.read("big") == data and reader.read("small") == b"s" * 64
    with pytest.raises(StorageError, match=r"big.part00004.*asked for bytes \[0, 44\), got 4"):
        store.put(f"parted-{where}/big.part00004", b"x" * 4)
        reader.read("big", 250, 300)


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    body = b"y" * 8800

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_the_proxy_holds_each_answer_for_latency_plus_size_over_bandwidth_on_a_fake_clock():
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    slept = []
    model = NetworkModel(first_byte_s=0.03, bandwidth_bytes_per_s=88e6, requests_per_s=1e6)
    proxy = ShapingProxy(f"http://127.0.0.1:{upstream.server_address[1]}", model, clock=lambda: 100.0,
                         sleep=slept.append)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", proxy.server_address[1], timeout=10)
        for _ in range(3):
            connection.request("GET", "/bucket/key")
            answer = connection.getresponse()
            assert answer.status == 200 and answer.read() == _Upstream.body
        assert slept == [pytest.approx(0.03 + 8800 / 88e6)] * 3
    finally:
        proxy.shutdown()
        upstream.shutdown()


def test_the_rate_cap_makes_requests_wait_for_tokens_on_a_fake_clock():
    now, slept = [0.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds
    limiter = RateLimiter(10.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(10):
        limiter.acquire()
    assert slept == []  # a full second's bucket
    limiter.acquire()
    assert slept == [pytest.approx(0.1)]


def test_the_proxy_process_serves_s3_reads(s3):
    with shaped(s3, NetworkModel(first_byte_s=0.0)) as url:
        assert url.startswith("http://127.0.0.1:")
        store = S3Store(s3, "vectors", read_endpoint=url)
        store.put("through-proxy", b"abc" * 10)
        assert store.get("through-proxy", 3, 9) == b"abcabc"
        with pytest.raises(StorageError, match="no such object"):
            store.get("not-there")
