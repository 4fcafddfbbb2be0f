"""The stage contract: a stage's directory is complete when, and only when,
`_manifest.json` exists there; it is written last.

fingerprint = hash(stage code version + resolved config section + input fingerprints).
Finished shards leave a small marker in `_progress/` with their rows, bytes and sha256, so a
stage that crashed, re-run, keeps the shards whose file still matches and computes only the
rest. A stage whose manifest carries the expected fingerprint and whose shards are all
present is skipped.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from bertcore.config import PipelineConfig, resolved_yaml
from pipelines.storage import Storage, WrittenFile, join

MANIFEST = "_manifest.json"
PROGRESS = "_progress"
RESOLVED_CONFIG = "_config.yaml"


def package_version() -> str:
    try:
        return version("bertpipe")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


def fingerprint(stage: str, code_version: str, section: dict, inputs: dict[str, Any]) -> str:
    payload = json.dumps(
        {"stage": stage, "code_version": code_version, "config": section, "inputs": inputs},
        sort_keys=True,
        ensure_ascii=False,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:20]


@dataclass
class ShardInfo:
    path: str
    """Relative to the stage directory, e.g. train/part-00003.arrow."""
    rows: int
    bytes: int
    sha256: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Manifest:
    stage: str
    code_version: str
    fingerprint: str
    inputs: dict[str, Any]
    config: dict[str, Any]
    shards: list[ShardInfo]
    stats: dict[str, Any]
    timings: dict[str, float]
    skipped: list[dict[str, Any]] = field(default_factory=list)
    package_version: str = field(default_factory=package_version)
    created_at: str = ""
    python: str = field(default_factory=platform.python_version)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> Manifest:
        data = dict(data)
        data["shards"] = [ShardInfo(**s) for s in data.get("shards", [])]
        return cls(**data)

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


class StageDir:
    """One stage's directory under the run root, with its manifest and shard markers."""

    def __init__(self, storage: Storage, root: str, stage: str):
        self.storage = storage
        self.stage = stage
        self.uri = join(root, stage)

    def path(self, relative: str) -> str:
        return join(self.uri, relative)

    # -- manifest -------------------------------------------------------------------------
    def manifest(self) -> Manifest | None:
        uri = self.path(MANIFEST)
        if not self.storage.exists(uri):
            return None
        return Manifest.from_json(self.storage.read_json(uri))

    def missing_shards(self, manifest: Manifest) -> list[str]:
        """Shards listed in the manifest that are gone or have another size."""
        return [s.path for s in manifest.shards if self.storage.size(self.path(s.path)) != s.bytes]

    def state(self, expected_fingerprint: str | None) -> str:
        """complete | stale (other fingerprint) | incomplete (shards gone) | missing."""
        manifest = self.manifest()
        if manifest is None:
            return "missing"
        if expected_fingerprint is not None and manifest.fingerprint != expected_fingerprint:
            return "stale"
        return "incomplete" if self.missing_shards(manifest) else "complete"

    def reuse_or_reset(self, fingerprint: str, *, force: bool = False, keep_progress: bool = True) -> Manifest | None:
        """A stage's first step: its manifest when the output is complete for `fingerprint`
        (and not `force`d), else None once the directory is marked incomplete. The manifest
        goes; the progress markers go too when forced or when the stage cannot resume shard
        by shard (`keep_progress=False`), so a rerun redoes only the shards still missing."""
        manifest = None if force else self.manifest()
        if manifest is not None and manifest.fingerprint == fingerprint and not self.missing_shards(manifest):
            return manifest
        if force or not keep_progress:
            self.invalidate()
        else:
            self.storage.remove(self.path(MANIFEST))
        return None

    def invalidate(self) -> None:
        """Remove the manifest first (the directory stops being complete), then progress markers."""
        self.storage.remove(self.path(MANIFEST))
        self.storage.remove(self.path(PROGRESS), recursive=True)

    def write_manifest(self, manifest: Manifest, cfg: PipelineConfig) -> None:
        self.storage.write_bytes(self.path(RESOLVED_CONFIG), resolved_yaml(cfg).encode())
        manifest.created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.storage.write_json(self.path(MANIFEST), manifest.to_json())

    # -- shards ---------------------------------------------------------------------------
    def _marker(self, relative: str) -> str:
        return self.path(f"{PROGRESS}/{relative.replace('/', '__')}.json")

    def finished(self, relative: str, fp: str) -> ShardInfo | None:
        """The shard's info if an earlier attempt with this fingerprint finished it and the
        file still has the recorded size and sha256; None when it must be (re)computed."""
        marker = self._marker(relative)
        if not self.storage.exists(marker):
            return None
        data = self.storage.read_json(marker)
        if data.get("fingerprint") != fp:
            return None
        info = ShardInfo(**data["shard"])
        uri = self.path(relative)
        if self.storage.size(uri) != info.bytes or self.storage.sha256(uri) != info.sha256:
            return None
        return info

    def write_shard(self, relative: str, fp: str, write: Callable[[str], Any], rows: int, extra: dict | None = None) -> ShardInfo:
        """Publish a shard atomically (`write(local_tmp_path)` produces it), then its marker."""
        written: WrittenFile = self.storage.write_file(self.path(relative), write)
        info = ShardInfo(path=relative, rows=rows, bytes=written.bytes, sha256=written.sha256, extra=extra or {})
        self.storage.write_json(self._marker(relative), {"fingerprint": fp, "shard": asdict(info)})
        return info
