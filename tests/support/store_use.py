"""What a stage leaves in the store and what it reads from it, for the tests of issue 46:
the bytes of a stage directory outside its published shards and manifest (`scratch_left`),
and the requests the session's moto server answers (`s3_requests`; tests/conftest.py
starts it in this process, so its request handler can be watched here)."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import unquote

from pipelines.stage_dir import MANIFEST, RESOLVED_CONFIG, Manifest
from pipelines.storage import Storage


def scratch_left(storage: Storage, stage_uri: str, manifest: Manifest) -> tuple[int, Counter]:
    """(bytes of the manifest's shards, bytes of every other file under `stage_uri` by its
    top folder or name), the manifest and the resolved config left out."""
    fs, base = storage.fs(stage_uri)
    base = base.rstrip("/")
    shards = {s.path for s in manifest.shards}
    other: Counter = Counter()
    for path, info in fs.find(base, detail=True).items():
        relative = path[len(base) + 1 :]
        if relative not in shards and relative not in (MANIFEST, RESOLVED_CONFIG):
            other[relative.split("/")[0]] += int(info["size"])
    return sum(s.bytes for s in manifest.shards), other


@dataclass(frozen=True)
class S3Request:
    method: str
    path: str
    """/bucket/key, decoded."""
    length: int | None
    """Content-Length of what was sent (PUT)."""


@contextlib.contextmanager
def s3_requests() -> Iterator[list[S3Request]]:
    """Every request the moto server answers while the block runs, in order of arrival."""
    from moto.moto_api import recorder

    seen: list[S3Request] = []
    original = recorder._record_request

    def record(request, body=None):
        length = request.headers.get("Content-Length")
        seen.append(S3Request(request.method, unquote(request.path), int(length) if length else None))
        original(request, body)

    recorder._record_request = record
    try:
        yield seen
    finally:
        del recorder._record_request  # the class's method again
