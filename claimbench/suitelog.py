"""Progress of a suite's long setup, shown while asv runs it.

asv runs each benchmark in a child process and shows what it printed only after it ends, and a
setup_cache can run for hours (SSA's full run: two), so `claimbench run` would say nothing for hours.
It sets CLAIMBENCH_LOG to a file and prints each line written there as it arrives (`followed`). In
the benchmark process, `configure` (suites.common calls it) sends the INFO records of the
`claimbench` loggers and of the suites package's (asv imports it as `suites`) to that file, so suites
and library code report progress the usual way: `logging.getLogger(__name__).info(...)`. Outside
`claimbench run` nothing is configured and nothing is written (INFO records are dropped, as Python's
logging does by default).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

ENV = "CLAIMBENCH_LOG"
LOGGER = "claimbench"


def configure(suites: str = "") -> None:
    """In a benchmark process under `claimbench run`: the INFO records of the `claimbench` loggers and of
    the suites package's (`suites` where asv imports it from its benchmark folder, outside the
    `claimbench` tree), one line each, appended to CLAIMBENCH_LOG (once per process)."""
    path = os.environ.get(ENV)
    if not path:
        return
    names = [LOGGER] + ([suites] if suites and not (suites + ".").startswith(LOGGER + ".") else [])
    handler = None
    for logger in map(logging.getLogger, names):
        if any(getattr(h, "baseFilename", None) == os.path.abspath(path) for h in logger.handlers):
            continue
        if handler is None:
            handler = logging.FileHandler(path)
            handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


@contextmanager
def followed(path: Path, write: Callable[[str], None], poll_s: float = 1.0):
    """While the block runs, pass each complete line appended to `path` to write(line), prefixed with
    the time since the block began; the lines still unread when it ends are passed too."""
    start, stop = time.monotonic(), threading.Event()

    def follow():
        offset, pending = 0, ""
        while True:
            stopping = stop.wait(poll_s)
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    f.seek(offset)
                    pending += f.read()
                    offset = f.tell()
            except FileNotFoundError:
                pass
            *lines, pending = pending.split("\n")
            elapsed = time.monotonic() - start
            for line in lines:
                write(f"{int(elapsed // 3600)}:{int(elapsed % 3600 // 60):02d}:{int(elapsed % 60):02d} {line}")
            if stopping:
                return
    thread = threading.Thread(target=follow, name="claimbench-suite-log", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
