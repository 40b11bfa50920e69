"""Start the leaderboard on a free loopback port for as long as a block runs (tests, benchmarks)."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(db: Path, start_timeout_s: float = 60.0):
    """Yield the base URL of `claimbench app` serving db; stop it afterwards."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "claimbench.cli", "app", "--port", str(port), "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                urllib.request.urlopen(url + "/_stcore/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the leaderboard did not start:\n" + (proc.stdout.read() if proc.poll() is not None else ""))
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
