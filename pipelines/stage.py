"""The stage contract, in one place.

A stage is a small declared object (`Stage`): its name, its directory under the run root,
its config section, the stages whose outputs it reads, and a `run(StageRun) -> Output`
function. The runner (pipelines/runner.py) does everything else the same way for every
stage: looks up the upstream manifests, computes the fingerprint, keeps or resets the
directory, calls `run`, and writes the manifest.

- A stage's directory is complete when, and only when, `_manifest.json` exists there; it
  is written last, next to the resolved config (`_config.yaml`).
- fingerprint = hash(stage name + code version + its config section + the fingerprints of
  the stages it reads + the run seed (seeded stages) + the content identity of the files it
  reads from outside the run root).
- Work is done in units (a shard, a Ray task's batch of shards, an evaluation job). A
  finished unit leaves `_progress/<unit>.json` with the fingerprint it was computed for,
  the shards it wrote (rows, bytes, sha256) and a small JSON result, so a stage that
  crashed, re-run, keeps the units whose shards still match and computes only the rest.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from bertcore.errors import BertpipeError
from pipelines.storage import Storage, join

MANIFEST = "_manifest.json"
PROGRESS = "_progress"
RESOLVED_CONFIG = "_config.yaml"


class UpstreamMissing(BertpipeError):
    """A stage this one reads has no complete output."""


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


# -- what a stage writes ------------------------------------------------------------------------


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
    report: str | None = None
    """A markdown report among the shards (relative path), shown by the flow as an artifact."""
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Small tables (artifact key -> rows) the flow shows beside the statistics."""
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

    def shards_under(self, prefix: str) -> list[ShardInfo]:
        """The shards whose path starts with `prefix` (e.g. "train/", "seq128/validation/")."""
        return [s for s in self.shards if s.path.startswith(prefix)]


@dataclass
class Output:
    """What a stage's `run` returns; the runner turns it into the manifest."""

    shards: list[ShardInfo]
    stats: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    """Inputs left out, each {"file": ..., "reason": ...}."""
    inputs: dict[str, Any] = field(default_factory=dict)
    """Lineage beyond the upstream fingerprints (e.g. the raw files read), recorded as is."""
    report: str | None = None
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


@dataclass
class Unit:
    """A finished unit of work: the shards it wrote and its result (JSON)."""

    shards: list[ShardInfo]
    result: Any = None


# -- a stage's directory ------------------------------------------------------------------------


class StageDir:
    """One stage's directory under the run root: its manifest, shards and unit markers.
    Picklable (Ray tasks get one and write their shards through it)."""

    def __init__(self, storage: Storage, root: str, directory: str):
        self.storage = storage
        self.directory = directory
        self.uri = join(root, directory)

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
        goes; the unit markers go too when forced or when the stage cannot resume unit by
        unit (`keep_progress=False`), so a rerun redoes only the units still missing."""
        manifest = None if force else self.manifest()
        if manifest is not None and manifest.fingerprint == fingerprint and not self.missing_shards(manifest):
            return manifest
        if force or not keep_progress:
            self.invalidate()
        else:
            self.storage.remove(self.path(MANIFEST))
        return None

    def invalidate(self) -> None:
        """Remove the manifest first (the directory stops being complete), then the unit markers."""
        self.storage.remove(self.path(MANIFEST))
        self.storage.remove(self.path(PROGRESS), recursive=True)

    def write_manifest(self, manifest: Manifest, resolved_config: str) -> None:
        """The last write of a stage: the resolved config, then the manifest."""
        self.storage.write_bytes(self.path(RESOLVED_CONFIG), resolved_config.encode())
        manifest.created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.storage.write_json(self.path(MANIFEST), manifest.to_json())

    # -- units of work --------------------------------------------------------------------
    def _marker(self, unit: str) -> str:
        return self.path(f"{PROGRESS}/{unit.replace('/', '__')}.json")

    def _intact(self, shard: ShardInfo) -> bool:
        uri = self.path(shard.path)
        return self.storage.size(uri) == shard.bytes and self.storage.sha256(uri) == shard.sha256

    def done(self, unit: str, fp: str) -> Unit | None:
        """The unit as an earlier attempt with this fingerprint finished it, if every shard it
        wrote still has the recorded size and sha256; None when it must be (re)computed."""
        marker = self._marker(unit)
        if not self.storage.exists(marker):
            return None
        data = self.storage.read_json(marker)
        if data.get("fingerprint") != fp:
            return None
        shards = [ShardInfo(**s) for s in data.get("shards", [])]
        if not all(self._intact(s) for s in shards):
            return None
        return Unit(shards, data.get("result"))

    def complete(self, unit: str, fp: str, shards: list[ShardInfo], result: Any = None) -> Unit:
        """Record a finished unit (after its shards are published)."""
        self.storage.write_json(self._marker(unit), {"fingerprint": fp, "shards": [asdict(s) for s in shards], "result": result})
        return Unit(shards, result)

    def publish(self, relative: str, write: Callable[[str], Any], rows: int, extra: dict | None = None) -> ShardInfo:
        """Publish a shard atomically (`write(local_tmp_path)` produces it)."""
        written = self.storage.write_file(self.path(relative), write)
        return ShardInfo(path=relative, rows=rows, bytes=written.bytes, sha256=written.sha256, extra=extra or {})

    def publish_copy(self, relative: str, local: str, rows: int, extra: dict | None = None) -> ShardInfo:
        """Publish a finished local file as a shard."""
        return self.publish(relative, lambda path: shutil.copyfile(local, path), rows, extra)

    def write_shard(self, relative: str, fp: str, write: Callable[[str], Any], rows: int, extra: dict | None = None) -> ShardInfo:
        """A unit of one shard, named after it: publish, then record."""
        info = self.publish(relative, write, rows, extra)
        self.complete(relative, fp, [info])
        return info

    def remove_except(self, folders: list[str], keep: set[str]) -> None:
        """Delete files under `folders` that are not in `keep` (relative paths): what an
        earlier run with other settings left behind."""
        for folder in folders:
            for name in self.storage.listdir(self.path(folder)):
                if f"{folder}/{name}" not in keep:
                    self.storage.remove(self.path(f"{folder}/{name}"))


# -- declaring a stage --------------------------------------------------------------------------


@dataclass
class External:
    """Files a stage reads from outside the run root: `identity` goes into the fingerprint
    (content identity, never a path or a modification time alone), `value` (e.g. the
    expanded list of input files) is handed to `run`, so nothing is listed twice."""

    identity: dict[str, Any]
    value: Any = None


@dataclass
class Upstream:
    """The complete output of a stage this one reads."""

    dir: StageDir
    manifest: Manifest

    def path(self, relative: str) -> str:
        return self.dir.path(relative)

    @property
    def fingerprint(self) -> str:
        return self.manifest.fingerprint


@dataclass
class StageRun:
    """Everything a stage's `run` receives: its own config section, the outputs it reads,
    its directory, and the fingerprint that the units it completes are recorded under."""

    section: Any
    seed: int
    storage: Storage
    dir: StageDir
    fingerprint: str
    inputs: dict[str, Upstream]
    external: Any = None
    """The `value` of the stage's External, when it declares `identify`."""
    parallelism: int | None = None
    """Most Ray tasks in flight (None: as many as the cluster runs)."""


@dataclass(frozen=True)
class Stage:
    name: str
    """Also the name of its config section."""
    section: type
    """The pydantic model of its config section."""
    run: Callable[[StageRun], Output]
    reads: tuple[str, ...] = ()
    """Stages whose outputs it reads; their fingerprints are part of its own."""
    writes: str = ""
    """What the directory holds, in a few words (for the docs' stage table)."""
    code_version: str = "1"
    directory: str = ""
    """Directory under run.root (default: the name)."""
    identify: Callable[[Any, Storage], External] | None = None
    """Content identity of the files it reads from outside the run root."""
    check: Callable[[Any, dict[str, Any]], None] | None = None
    """Cross-section check run when the config loads: (own section, {read stage: section}); raises ValueError naming the key."""
    seeded: bool | Callable[[Any], bool] = True
    """Whether run.seed is part of its fingerprint (or a function of its section that says so)."""
    resumable: bool = True
    """Whether an unfinished attempt's unit markers are kept for the next one."""
    fingerprint_config: Callable[[dict], dict] | None = None
    """The part of its section's JSON that decides its output (default: all of it); the
    corpus leaves out where its inputs are, whose content `identify` stands for."""

    def __post_init__(self) -> None:
        if not self.directory:
            object.__setattr__(self, "directory", self.name)

    def config_identity(self, config: dict) -> dict:
        """What of a section's JSON (as dumped, or as a manifest recorded it) goes into the fingerprint."""
        return self.fingerprint_config(config) if self.fingerprint_config is not None else config

    def fingerprint_inputs(self, section: Any, seed: int, upstream: dict[str, str], external: External | None) -> dict[str, Any]:
        """Everything but the section that goes into the fingerprint (recorded in the manifest)."""
        inputs: dict[str, Any] = dict(upstream)
        if self.seeded(section) if callable(self.seeded) else self.seeded:
            inputs["seed"] = seed
        if external is not None:
            inputs["external"] = external.identity
        return inputs

    def fingerprint(self, section: Any, seed: int, upstream: dict[str, str], external: External | None) -> str:
        config = self.config_identity(section.model_dump(mode="json"))
        return fingerprint(self.name, self.code_version, config, self.fingerprint_inputs(section, seed, upstream, external))
