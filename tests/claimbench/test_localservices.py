"""Child processes serving on 127.0.0.1: the start wait names what failed and shows its output; stop
kills what ignores SIGTERM."""
import subprocess
import sys

import pytest

from claimbench import localservices


def test_a_process_that_exits_before_answering_is_reported_with_its_output():
    process = subprocess.Popen([sys.executable, "-c", "print('port already taken')"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{localservices.free_port()}/"
    with pytest.raises(RuntimeError, match="the toy server did not start:\nport already taken"):
        localservices.wait_until_up(process, url, "the toy server", timeout_s=30)


def test_a_process_that_never_answers_times_out():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(RuntimeError, match="the toy server did not start$"):
            localservices.wait_until_up(process, f"http://127.0.0.1:{localservices.free_port()}/", "the toy server",
                                        timeout_s=0.3)
    finally:
        localservices.stop(process)
    assert process.returncode is not None


def test_stop_kills_a_process_that_ignores_sigterm():
    process = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                                "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True)\n"
                                "time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "ready"
    localservices.stop(process, grace_s=0.3)
    assert process.returncode == -9
