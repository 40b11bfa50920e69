"""A network model between a client and an object store, applied by a small HTTP proxy on 127.0.0.1.

Every GET or HEAD that goes through the proxy is forwarded to the real S3 API server, and its answer
is held back until `first_byte_s + body bytes / bandwidth_bytes_per_s` after the request arrived
(bandwidth per connection: each client connection is one proxy thread); requests wait for a
token of a bucket filled at `requests_per_s` (all connections together). Defaults, from AWS's
published guidance for S3 in the same region: first-byte latency of tens of milliseconds for
small GETs (30 ms here); 85-90 MB/s per connection ("make one concurrent request for each 85-90
MB/s of desired throughput", 88 MB/s here); 5,500 GET/HEAD requests per second per partitioned
prefix (https://docs.aws.amazon.com/AmazonS3/latest/userguide/optimizing-performance.html).
What this is: a proxy that delays whole answers, not traffic shaping in the kernel: the body
arrives at once when its modelled last byte would have, and nothing models loss, TCP slow start
or an instance's total bandwidth. Writes (PUT) go to the server directly, outside the model.

`python -m claimbench.netmodel --upstream URL` runs the proxy in its own process (the suites do,
so that its sleeping threads never share a GIL with the timed client) and prints its URL.
"""
from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import localservices

HOST = "127.0.0.1"
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
              "transfer-encoding", "upgrade"}


@dataclass(frozen=True)
class NetworkModel:
    first_byte_s: float = 0.030
    bandwidth_bytes_per_s: float = 88e6  # per connection
    requests_per_s: float = 5500.0  # all connections together

    def transfer_s(self, body_bytes: int) -> float:
        """Time from a request's arrival to its answer's last byte."""
        return self.first_byte_s + body_bytes / self.bandwidth_bytes_per_s

    def describe(self) -> str:
        return (f"{self.first_byte_s * 1e3:g} ms to first byte, {self.bandwidth_bytes_per_s / 1e6:g} MB/s per "
                f"connection, at most {self.requests_per_s:g} requests/s")


class RateLimiter:
    """A token bucket of one second's requests: acquire() waits for a token."""

    def __init__(self, per_second: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.per_second, self.clock, self.sleep = per_second, clock, sleep
        self.tokens, self.updated = per_second, clock()
        self.lock = threading.Lock()

    def acquire(self) -> None:
        while True:
            with self.lock:
                now = self.clock()
                self.tokens = min(self.per_second, self.tokens + (now - self.updated) * self.per_second)
                self.updated = now
                if self.tokens >= 1:
                    self.tokens -= 1
                    return
                wait = (1 - self.tokens) / self.per_second
            self.sleep(wait)


class ShapingProxy(ThreadingHTTPServer):
    """The proxy (see the module docstring); `clock` and `sleep` are injectable for tests."""
    daemon_threads = True

    def __init__(self, upstream: str, model: NetworkModel, port: int = 0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        parsed = urllib.parse.urlsplit(upstream)
        self.upstream = (parsed.hostname, parsed.port)
        self.model, self.clock, self.sleep = model, clock, sleep
        self.limiter = RateLimiter(model.requests_per_s, clock, sleep)
        super().__init__((HOST, port), _Handler)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ShapingProxy

    def log_message(self, *args):  # quiet: a benchmark's proxy
        pass

    def _forward(self) -> None:
        arrived = self.server.clock()
        self.server.limiter.acquire()
        if not hasattr(self, "upstream_connection"):
            self.upstream_connection = http.client.HTTPConnection(*self.server.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            self.upstream_connection.request(self.command, self.path, headers=headers)
            answer = self.upstream_connection.getresponse()
            body = answer.read()
        except (OSError, http.client.HTTPException) as e:
            self.upstream_connection.close()
            del self.upstream_connection
            self.send_error(502, f"upstream {self.server.upstream[0]}:{self.server.upstream[1]}: {e}")
            return
        due = arrived + self.server.model.transfer_s(len(body))
        wait = due - self.server.clock()
        if wait > 0:
            self.server.sleep(wait)
        self.send_response(answer.status, answer.reason)
        for key, value in answer.getheaders():
            if key.lower() not in HOP_BY_HOP | {"content-length"}:
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(body) if self.command != "HEAD" else
                                               answer.getheader("Content-Length", "0")))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = _forward


@contextmanager
def shaped(upstream: str, model: NetworkModel = NetworkModel()):
    """Yield the URL of a shaping proxy to upstream, run in its own process; stopped after the block."""
    proxy = subprocess.Popen([sys.executable, "-m", "claimbench.netmodel", "--upstream", upstream,
                              "--model", json.dumps(asdict(model))], stdout=subprocess.PIPE, text=True)
    try:
        line = proxy.stdout.readline().strip()  # its URL, once it listens ("" if it died)
        if not line.startswith("http://"):
            raise RuntimeError(f"the network-model proxy to {upstream} did not start (it said {line!r})")
        yield line
    finally:
        localservices.stop(proxy)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m claimbench.netmodel", description=__doc__.split("\n\n")[0])
    ap.add_argument("--upstream", required=True, help="the S3 API server's URL")
    ap.add_argument("--model", default="{}", help="NetworkModel fields as JSON")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)
    proxy = ShapingProxy(args.upstream, NetworkModel(**json.loads(args.model)), args.port)
    print(proxy.url, flush=True)
    proxy.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
