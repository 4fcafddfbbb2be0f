"""All stage I/O goes through fsspec: local paths and any URI fsspec knows (s3://, gs://, ...).

Shards are written atomically: to a temporary local file first, then renamed (local) or
uploaded under the final key in one piece (object stores), so a reader never sees half a
shard. The sha256 of every file written is returned for the manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import fsspec
from fsspec.core import split_protocol

from bertcore.config import StorageConfig


def join(base: str, *parts: str) -> str:
    """Join URI parts with '/' (fsspec paths use '/' everywhere)."""
    out = base.rstrip("/")
    for part in parts:
        out = posixpath.join(out, part.strip("/"))
    return out


def is_local(uri: str) -> bool:
    protocol, _ = split_protocol(uri)
    return protocol in (None, "file", "local")


def sha256_file(path: str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def is_hidden(path: str, folder: str) -> bool:
    """Whether a file under `folder` has a name on its way there that starts with . or _."""
    relative = path[len(folder.rstrip("/")) :].strip("/")
    return any(part.startswith((".", "_")) for part in relative.split("/"))


@dataclass(frozen=True)
class WrittenFile:
    uri: str
    bytes: int
    sha256: str
    stamp: str = ""
    """What changes whenever the file is written again: its mtime (local) or ETag (object store)."""


class Storage:
    """fsspec filesystems built from the storage section; picklable, so Ray tasks get one."""

    def __init__(self, cfg: StorageConfig):
        self.cfg = cfg
        self._fs: dict[str, fsspec.AbstractFileSystem] = {}

    def __getstate__(self) -> dict:
        return {"cfg": self.cfg}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["cfg"])

    def fs(self, uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """The filesystem for a URI and the path inside it."""
        protocol, _ = split_protocol(uri)
        protocol = protocol or "file"
        if protocol not in self._fs:
            self._fs[protocol] = fsspec.filesystem(protocol, **self.cfg.fsspec_options(protocol))
        fs = self._fs[protocol]
        return fs, fs._strip_protocol(uri)

    def _fresh(self, uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
        """`fs(uri)` with no cached listing of it: other processes (Ray workers) write the
        same objects, and a stale cached ETag makes an object store refuse the read."""
        fs, path = self.fs(uri)
        if not is_local(uri):
            fs.invalidate_cache(path)
        return fs, path

    def exists(self, uri: str) -> bool:
        fs, path = self._fresh(uri)
        return fs.exists(path)

    def size(self, uri: str) -> int | None:
        fs, path = self._fresh(uri)
        try:
            return int(fs.size(path))
        except FileNotFoundError:
            return None

    def info(self, uri: str) -> dict[str, Any]:
        fs, path = self._fresh(uri)
        return fs.info(path)

    def stamp(self, uri: str) -> str | None:
        """A value that changes whenever the file is written again: the modification time in
        nanoseconds of a local file, the object store's ETag of a remote one; None when the
        file is gone. Equal stamps and sizes let a check skip re-hashing the bytes."""
        local = self.local_path(uri)
        try:
            if local is not None:
                return str(os.stat(local).st_mtime_ns)
            info = self.info(uri)
        except FileNotFoundError:
            return None
        tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("generation") or ""
        return str(tag).strip('"')

    def glob(self, pattern: str, include_hidden: bool = False) -> list[str]:
        """Matching files, sorted, as full URIs (a plain path matches itself if it is a file;
        a folder matches the files under it, except, unless `include_hidden`, those with a
        name below it that starts with `.` or `_`: .git/, _SUCCESS, .crc files)."""
        fs, path = self.fs(pattern)
        protocol, _ = split_protocol(pattern)
        if any(ch in path for ch in "*?["):
            found = [p for p in fs.glob(path) if fs.isfile(p)]
        elif fs.isdir(path):
            found = [p for p in fs.find(path) if include_hidden or not is_hidden(p, path)]
        elif fs.isfile(path):
            found = [path]
        else:
            found = []
        return sorted(f"{protocol}://{p}" if protocol else p for p in found)

    def open(self, uri: str, mode: str = "rb", compression: str | None = None) -> IO:
        fs, path = self._fresh(uri)
        return fs.open(path, mode, compression=compression)

    def read_text(self, uri: str) -> str:
        with self.open(uri, "rb") as handle:
            return handle.read().decode("utf-8")

    def read_json(self, uri: str) -> Any:
        return json.loads(self.read_text(uri))

    def local_path(self, uri: str) -> str | None:
        """The local filesystem path of a URI, or None for remote storage."""
        return self.fs(uri)[1] if is_local(uri) else None

    @contextlib.contextmanager
    def atomic_local_file(self, uri: str, suffix: str = "") -> Iterator[str]:
        """Yield a local temporary path; on success it becomes `uri` in one step."""
        local = self.local_path(uri)
        if local is not None:
            os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
            tmp = os.path.join(os.path.dirname(local), f".tmp-{uuid.uuid4().hex}-{os.path.basename(local)}")
        else:
            handle, tmp = tempfile.mkstemp(suffix=suffix, prefix="bertpipe-")
            os.close(handle)
        try:
            yield tmp
            if local is not None:
                os.replace(tmp, local)
            else:
                fs, path = self.fs(uri)
                fs.put_file(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def write_file(self, uri: str, write) -> WrittenFile:
        """Call `write(local_tmp_path)`, then publish the file at `uri` atomically."""
        with self.atomic_local_file(uri) as tmp:
            write(tmp)
            size, digest = os.path.getsize(tmp), sha256_file(tmp)
        return WrittenFile(uri=uri, bytes=size, sha256=digest, stamp=self.stamp(uri) or "")

    def write_bytes(self, uri: str, data: bytes) -> WrittenFile:
        def write(path: str) -> None:
            with open(path, "wb") as handle:
                handle.write(data)

        return self.write_file(uri, write)

    def write_json(self, uri: str, obj: Any) -> WrittenFile:
        return self.write_bytes(uri, (json.dumps(obj, indent=2, sort_keys=False, ensure_ascii=False) + "\n").encode())

    def sha256(self, uri: str) -> str:
        digest = hashlib.sha256()
        with self.open(uri, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        return digest.hexdigest()

    def signature(self, uri: str) -> str:
        """What identifies a file's content, for fingerprints: its sha256 when local, the
        object store's ETag (or size and modification time) when remote."""
        if is_local(uri):
            return self.sha256(uri)[:20]
        info = self.info(uri)
        tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("crc32c")
        return str(tag or f"{info.get('size')}-{info.get('LastModified') or info.get('mtime') or info.get('updated')}").strip('"')

    def remove(self, uri: str, recursive: bool = False) -> None:
        fs, path = self.fs(uri)
        if fs.exists(path):
            fs.rm(path, recursive=recursive)

    def listdir(self, uri: str) -> list[str]:
        fs, path = self._fresh(uri)
        try:
            return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False))
        except FileNotFoundError:
            return []

    def get(self, uri: str, local_dir: str) -> None:
        """Copy a file or folder to a local directory."""
        fs, path = self.fs(uri)
        fs.get(path, local_dir, recursive=True)
