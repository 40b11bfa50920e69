"""Start the leaderboard on a free loopback port for as long as a block runs (tests, benchmarks)."""
from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from .localservices import free_port, stop, wait_until_up

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def serve(db: Path, start_timeout_s: float = 60.0):
    """Yield the base URL of `claimbench app` serving db; stop it afterwards."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "claimbench.cli", "app", "--port", str(port), "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_up(proc, url + "/_stcore/health", "the leaderboard", start_timeout_s)
        yield url
    finally:
        stop(proc)
