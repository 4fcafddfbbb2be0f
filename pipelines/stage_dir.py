"""A stage's directory under the run root, as the stage contract (pipelines/stage.py) keeps
it: `_manifest.json` (the `Manifest`, written last: the stage is complete when, and only
when, it exists), the shards (`ShardInfo`: rows, bytes, sha256 and the stamp taken when it
was published), `_progress/<unit>.json` unit markers (`Unit`), and the checks that find a
damaged shard or manifest. `StageDir` is picklable: Ray tasks get one and write their
shards through it. Every path is contained in the directory (`StageDir.path`).
"""

from __future__ import annotations

import copy
import logging
import platform
import posixpath
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from bertcore.errors import InputDataError
from bertcore.paths import PathEscape
from bertcore.redact import mask_text, masked
from pipelines.storage import Storage, join

log = logging.getLogger(__name__)

MANIFEST = "_manifest.json"
PROGRESS = "_progress"
RESOLVED_CONFIG = "_config.yaml"


class DamagedManifest(InputDataError):
    """A `_manifest.json` that cannot be read back (truncated, edited, not JSON)."""


class DamagedShards(InputDataError):
    """Shards of stage `stage` (relative `paths`) whose bytes no longer match their manifest."""

    def __init__(self, message: str, stage: str = "", paths: tuple[str, ...] | list[str] = ()):
        super().__init__(message)
        self.stage, self.paths = stage, list(paths)


def package_version() -> str:
    try:
        return version("bertpipe")
    except PackageNotFoundError:  # running from a source tree that is not installed
        return "0+unknown"


# -- what a stage writes ------------------------------------------------------------------------


@dataclass
class ShardInfo:
    path: str
    """Relative to the stage directory, e.g. train/part-00003.arrow."""
    rows: int
    bytes: int
    sha256: str
    extra: dict[str, Any] = field(default_factory=dict)
    stamp: str = ""
    """The file's mtime (ns) or ETag when it was published; unchanged size and stamp skip re-hashing."""


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
    headline: dict[str, Any] = field(default_factory=dict)
    """A few key figures (label -> value) for the stage's end line and the run summary."""
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
class Unit:
    """A finished unit of work: the shards it wrote and its result (JSON)."""

    shards: list[ShardInfo]
    result: Any = None


# -- a stage's directory ------------------------------------------------------------------------


class StageDir:
    """One stage's directory under the run root: its manifest, shards and unit markers.
    Picklable (Ray tasks get one and write their shards through it)."""

    def __init__(self, storage: Storage, root: str, directory: str, *, verify: bool = False):
        self.storage = storage
        self.root = root
        self.directory = directory
        self.uri = join(root, directory)
        self.verify = verify
        """Re-hash every shard a check looks at, not only those whose size or stamp changed."""

    def verifying(self) -> StageDir:
        """This directory with checks that re-hash every shard."""
        twin = copy.copy(self)
        twin.verify = True
        return twin

    def _join(self, relative: str) -> str:
        """The URI of `relative` inside this directory by its text; PathEscape for one that
        would leave it ('..', an absolute path)."""
        clean = posixpath.normpath(relative)
        if relative.startswith("/") or clean == ".." or clean.startswith("../"):
            raise PathEscape(
                f"{relative!r} would leave {self.uri}; names of phases, tasks and files must not contain '/' or '..'"
            )
        return join(self.uri, clean)

    def path(self, relative: str) -> str:
        """The URI of `relative` inside this directory; a path that would leave it, by its
        text or through a symbolic link, is refused (PathEscape)."""
        return self.storage.inside(self._join(relative), self.uri)

    def remove(self, relative: str, recursive: bool = False) -> None:
        """Delete a file or folder of this directory; a symbolic link on the way is removed
        itself, never followed."""
        self.storage.remove(self._join(relative), recursive=recursive, within=self.uri)

    # -- manifest -------------------------------------------------------------------------
    def manifest(self) -> Manifest | None:
        """The manifest, None when there is none; DamagedManifest when it cannot be read."""
        uri = self.path(MANIFEST)
        if not self.storage.exists(uri):
            return None
        try:
            return Manifest.from_json(self.storage.read_json(uri))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:  # JSONDecodeError is a ValueError
            reason = " ".join(str(exc).split())[:200]
            raise DamagedManifest(
                f"{uri} is damaged ({type(exc).__name__}: {reason}); `bertpipe run` recomputes the stage"
            ) from None

    def check(self, shard: ShardInfo) -> str:
        """ok | missing | damaged: the shard's file against its recorded size and sha256 (the
        bytes are hashed when the stamp changed, or always with `verify`). A shard reached
        through a symbolic link is damaged: it is not read, not hashed."""
        try:
            uri = self.path(shard.path)
        except PathEscape:
            return "damaged"
        if self.storage.link_below(uri, self.uri) is not None:
            return "damaged"
        size = self.storage.size(uri)
        if size is None:
            return "missing"
        if size != shard.bytes:
            return "damaged"
        if not self.verify and shard.stamp and self.storage.stamp(uri) == shard.stamp:
            return "ok"
        return "ok" if self.storage.sha256(uri) == shard.sha256 else "damaged"

    def problems(self, manifest: Manifest) -> dict[str, str]:
        """The manifest's shards that are missing or damaged: {path: state}. In an object
        store, without `verify`, one listing of the directory gives every shard's size and
        stamp; only a shard whose stamp changed is read and hashed."""
        if self.verify or self.storage.local_path(self.uri) is not None:
            found = {s.path: self.check(s) for s in manifest.shards}
        else:
            listed = self.storage.stamps(self.uri)
            found = {s.path: self._check_listed(s, listed.get(s.path)) for s in manifest.shards}
        return {path: state for path, state in found.items() if state != "ok"}

    def _check_listed(self, shard: ShardInfo, listed: tuple[int, str] | None) -> str:
        if listed is None:
            return "missing"
        size, stamp = listed
        if size != shard.bytes:
            return "damaged"
        if shard.stamp and stamp == shard.stamp:
            return "ok"
        return self.check(shard)

    def state(self, expected_fingerprint: str | None) -> str:
        """complete | stale (other fingerprint) | incomplete (shards gone) | damaged (bytes
        changed, or an unreadable manifest) | missing."""
        try:
            manifest = self.manifest()
        except DamagedManifest:
            return "damaged"
        if manifest is None:
            return "missing"
        if expected_fingerprint is not None and manifest.fingerprint != expected_fingerprint:
            return "stale"
        problems = set(self.problems(manifest).values())
        return "damaged" if "damaged" in problems else "incomplete" if problems else "complete"

    def reuse_or_reset(self, fingerprint: str, *, force: bool = False, keep_progress: bool = True) -> Manifest | None:
        """A stage's first step: its manifest when the output is complete and intact for
        `fingerprint` (and not `force`d), else None once the directory is marked incomplete.
        The manifest goes, damaged shards go; the unit markers go too when forced or when
        the stage cannot resume unit by unit (`keep_progress=False`), so a rerun redoes only
        the units still missing."""
        try:
            manifest = None if force else self.manifest()
        except DamagedManifest as exc:
            log.warning("%s", exc)
            manifest = None
        if manifest is not None and manifest.fingerprint == fingerprint:
            problems = self.problems(manifest)
            if not problems:
                return manifest
            for path, state in sorted(problems.items()):
                log.warning("%s: %s; it is recomputed", self._join(path), state)
                if state == "damaged":
                    self.remove(path)
        if force or not keep_progress:
            self.invalidate()
        else:
            self.remove(MANIFEST)
        return None

    def invalidate(self) -> None:
        """Remove the manifest first (the directory stops being complete), then the unit markers."""
        self.remove(MANIFEST)
        self.remove(PROGRESS, recursive=True)

    def write_manifest(self, manifest: Manifest, resolved_config: str) -> None:
        """The last write of a stage: the resolved config, then the manifest (passwords
        inside URIs masked in both)."""
        self.storage.write_bytes(self.path(RESOLVED_CONFIG), mask_text(resolved_config).encode())
        manifest.created_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.storage.write_json(self.path(MANIFEST), masked(manifest.to_json()))

    # -- units of work --------------------------------------------------------------------
    def _marker(self, unit: str) -> str:
        return self.path(f"{PROGRESS}/{unit.replace('/', '__')}.json")

    def done(self, unit: str, fp: str) -> Unit | None:
        """The unit as an earlier attempt with this fingerprint finished it, if every shard it
        wrote is intact (`check`); None when it must be (re)computed."""
        marker = self._marker(unit)
        if not self.storage.exists(marker):
            return None
        try:
            data = self.storage.read_json(marker)
            shards = [ShardInfo(**s) for s in data.get("shards", [])]
        except (ValueError, TypeError, AttributeError):  # a damaged marker: the unit is redone
            return None
        if data.get("fingerprint") != fp or not all(self.check(s) == "ok" for s in shards):
            return None
        return Unit(shards, data.get("result"))

    def complete(self, unit: str, fp: str, shards: list[ShardInfo], result: Any = None) -> Unit:
        """Record a finished unit (after its shards are published)."""
        self.storage.write_json(
            self._marker(unit), masked({"fingerprint": fp, "shards": [asdict(s) for s in shards], "result": result})
        )
        return Unit(shards, result)

    def publish(self, relative: str, write: Callable[[str], Any], rows: int, extra: dict | None = None) -> ShardInfo:
        """Publish a shard atomically (`write(local_tmp_path)` produces it)."""
        written = self.storage.write_file(self.path(relative), write)
        return ShardInfo(
            path=relative, rows=rows, bytes=written.bytes, sha256=written.sha256, extra=extra or {}, stamp=written.stamp
        )

    def publish_copy(self, relative: str, local: str, rows: int, extra: dict | None = None) -> ShardInfo:
        """Publish a finished local file as a shard."""
        return self.publish(relative, lambda path: shutil.copyfile(local, path), rows, extra)

    def write_shard(
        self, relative: str, fp: str, write: Callable[[str], Any], rows: int, extra: dict | None = None
    ) -> ShardInfo:
        """A unit of one shard, named after it: publish, then record."""
        info = self.publish(relative, write, rows, extra)
        self.complete(relative, fp, [info])
        return info

    def remove_scratch(self, folders: tuple[str, ...] | list[str]) -> None:
        """Delete the scratch folders of a finished stage (`Stage.scratch`) with everything in
        them, then the markers of the units that wrote there (named after their files: a unit
        `_work/unit-00001.arrow` leaves `_progress/_work__unit-00001.arrow.json`), which
        would only say that their work is gone."""
        if not folders:
            return
        for folder in folders:
            if self.storage.exists(self._join(folder)):
                self.remove(folder, recursive=True)
        prefixes = tuple(f"{folder}__" for folder in folders)
        for name in self.storage.listdir(self.path(PROGRESS)):
            if name.startswith(prefixes):
                self.remove(f"{PROGRESS}/{name}")

    def remove_except(self, folders: list[str], keep: set[str]) -> None:
        """Delete files under `folders` that are not in `keep` (relative paths): what an
        earlier run with other settings left behind."""
        for folder in folders:
            for name in self.storage.listdir(self.path(folder)):
                if f"{folder}/{name}" not in keep:
                    self.remove(f"{folder}/{name}")
