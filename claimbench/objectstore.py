"""Result files through object storage: `claimbench publish s3://BUCKET/PREFIX` and
`claimbench ingest s3://BUCKET/PREFIX`, for machines that share no filesystem (a fleet's nodes).

One run's files travel together under a per-machine, per-commit key:
`PREFIX/<machine>/<commit8>-<mode>/` holds asv's result file (and the kernels' JSON), the run record
and evidence, the machine's `machine.json` and environment record, and the results root's
`benchmarks.json`. Ingest mirrors a prefix into a temporary folder of the same layout and reads it as
it reads local files, so a round trip equals a local ingest.

The client is s3fs (fsspec), with botocore's usual credentials (environment, profile, instance role);
the endpoint comes from `--endpoint-url`, else $AWS_ENDPOINT_URL_S3 or $AWS_ENDPOINT_URL (any S3 API
server: MinIO, Ceph, moto's).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from . import evidence
from .asvfiles import SHARED_FILES, no_runs, selected_runs

SCHEME = "s3://"
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


class AccessDenied(RuntimeError):
    """The object store refused the credentials or the bucket's policy refused the request."""


def is_url(path) -> bool:
    return str(path).startswith(SCHEME)


def split(url: str) -> tuple[str, str]:
    """s3://bucket/some/prefix -> ("bucket", "some/prefix")."""
    if not is_url(url):
        raise ValueError(f"{url!r} is not an s3:// URL")
    bucket, _, prefix = url[len(SCHEME):].partition("/")
    if not bucket:
        raise ValueError(f"{url!r} names no bucket")
    return bucket, prefix.strip("/")


def endpoint_from_environment() -> str | None:
    return next((os.environ[v] for v in ENDPOINT_VARIABLES if os.environ.get(v)), None)


def filesystem(endpoint_url: str | None = None):
    """An s3fs filesystem on the given endpoint (else the environment's), credentials as botocore finds them."""
    try:
        import s3fs
    except ImportError:
        raise RuntimeError("object storage needs s3fs: pip install 'claimbench[fleet]'") from None
    endpoint = endpoint_url or endpoint_from_environment()
    client = {"endpoint_url": endpoint} if endpoint else {}
    return s3fs.S3FileSystem(client_kwargs=client, skip_instance_cache=True)


def _calling(url: str, what: str, action):
    """Run one store operation; its refusals and missing buckets as errors that name the URL."""
    try:
        return action()
    except PermissionError as e:
        raise AccessDenied(f"{url}: the object store refused to {what} ({e}). Check the credentials "
                           "(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE) and the bucket's policy.") from None
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{url}: {e}") from None
    except OSError as e:
        raise RuntimeError(f"{url}: could not {what}: {e}") from None
    except Exception as e:  # botocore's own: the endpoint unreachable, a malformed answer
        if type(e).__module__.startswith("botocore"):
            raise RuntimeError(f"{url}: could not {what}: {e}") from None
        raise


@dataclass
class PublishReport:
    url: str
    runs: list[str] = field(default_factory=list)  # "<machine>/<commit8>-<mode>"
    files: int = 0

    def summary(self) -> str:
        listed = "".join(f"\n  {r}" for r in self.runs)
        return f"published {len(self.runs)} run(s), {self.files} file(s) to {self.url}{listed}"


def publish(url: str, results_roots: dict[str, Path], machine: str | None = None, commit: str | None = None,
            endpoint_url: str | None = None, fs=None) -> PublishReport:
    """Upload every run under the results roots ({mode: asv results folder}), or only one machine's and
    one commit's, each under PREFIX/<machine>/<commit8>-<mode>/. Re-publishing writes the same keys."""
    bucket, prefix = split(url)
    fs = fs or filesystem(endpoint_url)
    _calling(url, "read the bucket", lambda: fs.ls(bucket))
    report = PublishReport(url)
    for mode, root in results_roots.items():
        meta = root / "benchmarks.json"
        for machine_dir, commit8, files in selected_runs(root, machine, commit):
            key = "/".join(part for part in (bucket, prefix, machine_dir.name, f"{commit8}-{mode}") if part)
            uploads = files + [machine_dir / name for name in SHARED_FILES if (machine_dir / name).exists()]
            uploads += [meta] if meta.exists() else []
            for path in uploads:
                _calling(url, f"write {key}/{path.name}", lambda p=path: fs.pipe(f"{key}/{p.name}", p.read_bytes()))
            report.runs.append(f"{machine_dir.name}/{commit8}-{mode}")
            report.files += len(uploads)
    if not report.runs:
        raise no_runs("publish", ", ".join(map(str, results_roots.values())), machine, commit)
    return report


RESULT_SUFFIXES = (".json", evidence.SUFFIX)


def fetch(url: str, dest: Path, endpoint_url: str | None = None, fs=None) -> list[Path]:
    """Mirror every run under the URL's prefix into dest (<machine>/<commit8>-<mode>/<file>); returns the
    folders written. Raises when the bucket is missing, the credentials are refused or nothing is there."""
    bucket, prefix = split(url)
    fs = fs or filesystem(endpoint_url)
    base = "/".join(part for part in (bucket, prefix) if part)
    keys = _calling(url, "list the bucket", lambda: fs.find(base))
    keys = [k for k in keys if k.endswith(RESULT_SUFFIXES)]
    if not keys:
        raise FileNotFoundError(f"{url}: no published results there")
    folders = set()
    for key in keys:
        relative = key[len(base):].lstrip("/")
        target = dest / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_calling(url, f"read {key}", lambda k=key: fs.cat_file(k)))
        folders.add(target.parent)
    return sorted(folders)
