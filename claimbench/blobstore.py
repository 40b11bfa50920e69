"""Objects by key for indexes that live in object storage: an S3 bucket through boto3 (a real S3 API
client; reads may go through claimbench.netmodel's proxy, writes go to the server directly) or a
local folder, behind one small interface: put an object, get it whole or one byte range, count GETs
and bytes. S3 serves one byte range per GET (a multi-range request returns the whole object), so
`coalesce` merges nearby ranges into one ranged GET instead.

`RemoteLayout` is what the object-store vector indexes share: a manifest (layout name, the index's
digest, every object's size) written last at build, read and checked when an index is opened; an
object shorter or longer than the manifest says fails the read with its key. An object larger than
`PART_BYTES` is stored as consecutive parts and a ranged read GETs only the parts it spans (one GET
each, counted): S3 serves a ranged GET at a cost that does not depend on the object's size, but
moto's server, the S3 API on loopback here, reads the whole object for every ranged GET (a 4 KiB
range of a 128 MiB object took 200 ms, of a 1 MiB one 16 ms), which would time the server, not the
network model, for a layout of a few large objects.
"""
from __future__ import annotations

import hashlib
import json
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from .interfaces import StorageError


@dataclass
class ReadCounters:
    gets: int = 0
    bytes_read: int = 0


class BlobStore(ABC):
    """put(key, data); get(key, start, end) -> bytes [start, end) (the whole object without a range);
    `counters` of the GETs since reset_counters()."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counters = ReadCounters()

    def reset_counters(self) -> None:
        with self._lock:
            self.counters = ReadCounters()

    def _count(self, nbytes: int) -> None:
        with self._lock:
            self.counters.gets += 1
            self.counters.bytes_read += nbytes

    def get(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        data = self._get(key, start, end)
        self._count(len(data))
        if start is not None and len(data) != end - start:
            raise StorageError(f"{self.where(key)}: asked for bytes [{start}, {end}), got {len(data)} bytes "
                               "(a truncated object?)")
        return data

    @abstractmethod
    def _get(self, key: str, start: int | None, end: int | None) -> bytes: ...

    @abstractmethod
    def put(self, key: str, data: bytes) -> None: ...

    @abstractmethod
    def where(self, key: str) -> str:
        """The object's full name, for errors."""


class LocalStore(BlobStore):
    """A folder: each key a file below root."""

    def __init__(self, root: str | Path):
        super().__init__()
        self.root = Path(root)

    def where(self, key: str) -> str:
        return str(self.root / key)

    def put(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def _get(self, key, start, end):
        try:
            with open(self.root / key, "rb") as f:
                if start is None:
                    return f.read()
                f.seek(start)
                return f.read(end - start)
        except FileNotFoundError:
            raise StorageError(f"{self.where(key)}: no such object") from None


class S3Store(BlobStore):
    """A bucket on an S3 API server: reads through read_endpoint (a network-model proxy, or the
    server itself), writes to endpoint; `connections` is the client's connection pool size."""

    def __init__(self, endpoint: str, bucket: str, read_endpoint: str | None = None, connections: int = 16,
                 credentials: dict | None = None):
        super().__init__()
        import boto3
        from botocore.config import Config
        self.endpoint, self.bucket = endpoint, bucket
        self.read_endpoint = read_endpoint or endpoint
        keys = {"aws_access_key_id": "claimbench", "aws_secret_access_key": "claimbench", "region_name": "us-east-1",
                **(credentials or {})}
        config = Config(max_pool_connections=connections, retries={"max_attempts": 1},
                        connect_timeout=5, read_timeout=60)
        self._writer = boto3.client("s3", endpoint_url=endpoint, config=config, **keys)
        self._reader = boto3.client("s3", endpoint_url=self.read_endpoint, config=config, **keys)

    def where(self, key: str) -> str:
        return f"s3://{self.bucket}/{key} (at {self.read_endpoint})"

    def _call(self, key: str, fn, **kwargs):
        from botocore.exceptions import ClientError, EndpointConnectionError
        try:
            return fn(Bucket=self.bucket, Key=key, **kwargs)
        except EndpointConnectionError:
            raise StorageError(f"cannot reach the S3 API at {self.read_endpoint} (for {self.where(key)})") from None
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404"):
                raise StorageError(f"{self.where(key)}: no such object") from None
            if code == "NoSuchBucket":
                raise StorageError(f"{self.where(key)}: no such bucket") from None
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"):
                raise StorageError(f"{self.where(key)}: the server refused the credentials ({code})") from None
            raise StorageError(f"{self.where(key)}: {code or e}") from None

    def put(self, key: str, data: bytes) -> None:
        self._call(key, self._writer.put_object, Body=data)

    def _get(self, key, start, end):
        extra = {} if start is None else {"Range": f"bytes={start}-{end - 1}"}
        return self._call(key, self._reader.get_object, **extra)["Body"].read()


def coalesce(ranges: list[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """Sorted, merged byte ranges [start, end): ranges that overlap or lie at most `gap` bytes apart
    become one (the bytes between them are read too; nothing outside the span of the merged ones)."""
    merged: list[list[int]] = []
    for start, end in sorted(ranges):
        if merged and start - merged[-1][1] <= gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


PART_BYTES = 8 * 2 ** 20


class RemoteLayout:
    """An index's objects under a prefix of a store: `write` puts them (those over `part_bytes` as
    parts `name.partNNNNN`) and then the manifest; `open` reads the manifest and checks its layout and,
    when given, the index digest."""
    MANIFEST = "manifest.json"

    def __init__(self, store: BlobStore, prefix: str, part_bytes: int = PART_BYTES):
        if part_bytes < 1:
            raise ValueError(f"part_bytes must be at least 1; got {part_bytes}")
        self.store, self.prefix, self.part_bytes = store, prefix.strip("/"), part_bytes

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _part_key(self, name: str, part: int) -> str:
        return self.key(f"{name}.part{part:05d}")

    def _parts(self, name: str, start: int, end: int) -> list[tuple[str, int, int]]:
        """(key, start, end) within each part that bytes [start, end) of a parted object span."""
        size = self.part_bytes
        return [(self._part_key(name, part), max(start, part * size) - part * size,
                 min(end, (part + 1) * size) - part * size) for part in range(start // size, (end - 1) // size + 1)]

    def write(self, layout: str, objects: dict[str, bytes], meta: dict) -> str:
        """Upload every object, then the manifest; the index digest (of every object) is returned."""
        digest = hashlib.sha256()
        for name in sorted(objects):
            digest.update(name.encode() + b"\0" + hashlib.sha256(objects[name]).digest())
        for name, data in objects.items():
            if len(data) <= self.part_bytes:
                self.store.put(self.key(name), data)
                continue
            for part, offset in enumerate(range(0, len(data), self.part_bytes)):
                self.store.put(self._part_key(name, part), data[offset:offset + self.part_bytes])
        manifest = {"layout": layout, "digest": digest.hexdigest(), "sizes": {n: len(d) for n, d in objects.items()},
                    "part_bytes": self.part_bytes, **meta}
        self.store.put(self.key(self.MANIFEST), json.dumps(manifest).encode())
        return manifest["digest"]

    def open(self, layout: str, digest: str | None = None) -> dict:
        manifest = json.loads(self.store.get(self.key(self.MANIFEST)))
        if manifest.get("layout") != layout:
            raise StorageError(f"{self.store.where(self.key(self.MANIFEST))}: holds a {manifest.get('layout')!r} "
                               f"index, not {layout!r}")
        if digest is not None and manifest["digest"] != digest:
            raise StorageError(f"{self.store.where(self.key(self.MANIFEST))}: holds another index (digest "
                               f"{manifest['digest'][:12]}, expected {digest[:12]})")
        self.sizes = manifest["sizes"]
        self.part_bytes = manifest["part_bytes"]
        return manifest

    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes:
        """An object (or a range of it), checked against the manifest's size."""
        size = self.sizes[name]
        if end is not None and end > size:
            raise StorageError(f"{self.store.where(self.key(name))}: range end {end} past the object's {size} bytes")
        if size > self.part_bytes:
            spans = self._parts(name, start or 0, size if end is None else end)
            return b"".join(self.store.get(key, a, b) for key, a, b in spans)
        data = self.store.get(self.key(name), start, end)
        if start is None and len(data) != size:
            raise StorageError(f"{self.store.where(self.key(name))}: {len(data)} bytes, the manifest says {size} "
                               "(a truncated or replaced object)")
        return data
