"""Child processes serving on 127.0.0.1: a free port, waiting until one answers, stopping it. And an S3
API server (moto's standalone server, a real HTTP server speaking the S3 API), for trying
`claimbench publish` / `ingest s3://...` without a bucket and for the tests and suites that need
object storage; it stops when the `with` block ends.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager

HOST = "127.0.0.1"
# moto accepts any key while it does not check credentials; these are what its clients send
TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "claimbench", "AWS_SECRET_ACCESS_KEY": "claimbench",
                    "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def wait_until_up(process: subprocess.Popen, url: str, what: str, timeout_s: float) -> None:
    """Return once `url` answers; raise naming `what` if the process exits first or `timeout_s` passes
    (with its output, when it exited and its stdout is a text pipe)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError:
            exited = process.poll() is not None
            if exited or time.monotonic() > deadline:
                said = process.stdout.read() if exited and process.stdout else ""
                said = said.decode(errors="replace") if isinstance(said, bytes) else said
                raise RuntimeError(f"{what} did not start" + (f":\n{said}" if said else "")) from None
            time.sleep(0.1)


def stop(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Terminate a child process, killing it if it has not exited within `grace_s`."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def s3_server(check_credentials: bool = False, start_timeout_s: float = 30.0):
    """Yield the endpoint URL of a fresh S3 API server. With check_credentials, every request must be
    signed with an access key the server issued (none are): what a store that refuses credentials does."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        raise RuntimeError("a local S3 API server needs moto: pip install 'claimbench[fleet]'") from None
    port = free_port()
    env = {**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if check_credentials else {})}
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://{HOST}:{port}"
    try:
        wait_until_up(server, url + "/moto-api/", f"the S3 API server on {url}", start_timeout_s)
        yield url
    finally:
        stop(server)


def make_bucket(endpoint_url: str, bucket: str) -> None:
    """Create a bucket on the server (publish never creates one: a team's bucket exists)."""
    import boto3
    boto3.client("s3", endpoint_url=endpoint_url, aws_access_key_id=TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                 aws_secret_access_key=TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                 region_name=TEST_CREDENTIALS["AWS_DEFAULT_REGION"]).create_bucket(Bucket=bucket)
