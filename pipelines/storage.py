"""All stage I/O goes through fsspec: local paths and any URI fsspec knows (s3://, gs://, ...).

Shards are written atomically: to a temporary local file first, then renamed (local) or
uploaded under the final key in one piece (object stores), so a reader never sees half a
shard. The sha256 of every file written is returned for the manifest.

Local paths are held to where they belong (bertcore/paths.py): `inside` resolves symbolic
links and refuses a path that leads out of its folder, `remove(..., within=folder)` never
follows a link, hashing refuses anything but a regular file, and `list_files` walks an
input folder without following links out of it or into folders (no loops) and without
opening FIFOs, sockets or devices, listing each such entry with the reason. Object stores
have no links.

An object store that stops answering for a while (an outage of up to about a minute) costs
a wait, not a failed stage: each request is retried (`S3_ATTEMPTS`, botocore's standard
retry mode), an answer cut off mid-body as much as a refused connection (`_whole_answers`),
and one line says when the store stopped answering and one when it answers again and after
how long (`_Outage`). A longer outage fails the request; the flow retries the stage
(flows/pipeline.py).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import fsspec
from fsspec.core import split_protocol

from bertcore.config import StorageConfig
from bertcore.errors import InputDataError
from bertcore.paths import first_link, inside, not_regular, remove_within, walk, walk_files

log = logging.getLogger(__name__)

S3_ATTEMPTS = 12
"""Attempts of one object-store request that gets no whole answer (connection refused or
reset, a timeout, an answer cut off mid-body) or a 5xx, before it fails: botocore waits a
random 0-1, 0-2, 0-4, 0-8, 0-16, then 0-20 s between them, about 75 s in all (at least 30 s
with a chance of 99.9 %)."""
S3_RETRY_WINDOW = "about 75 s"


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


@dataclass
class Found:
    """What a pattern or folder holds: its files (full URIs, sorted) and the entries left
    out, (URI, reason): links out of the folder or to folders, FIFOs, sockets, devices."""

    files: list[str]
    skipped: list[tuple[str, str]]


@dataclass(frozen=True)
class WrittenFile:
    uri: str
    bytes: int
    sha256: str
    stamp: str = ""
    """What changes whenever the file is written again: its mtime (local) or ETag (object store)."""


_WRITE_CHECKS: list[tuple[str, Callable[[str], None]]] = []
"""(root, check) pairs this process holds: each write or delete under `root` calls `check(uri)`
first (pipelines/lease.py: a run whose lease was taken over writes nothing more)."""


def add_write_check(root: str, check: Callable[[str], None]) -> None:
    _WRITE_CHECKS.append((root.rstrip("/"), check))


def remove_write_check(root: str, check: Callable[[str], None]) -> None:
    with contextlib.suppress(ValueError):
        _WRITE_CHECKS.remove((root.rstrip("/"), check))


def _before_write(uri: str) -> None:
    for root, check in list(_WRITE_CHECKS):
        if uri == root or uri.startswith(root + "/"):
            check(uri)


class _Outage:
    """Watches every attempt of this process's object-store requests (botocore's
    `needs-retry` event) and says in one line when a store stops answering (at the second
    failed attempt in a row: a single dropped connection is retried silently) and in one
    more, at the first answer after that, how long it did not."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: dict[str, tuple[float, int]] = {}  # endpoint -> (first failure, failed attempts)

    def __call__(self, caught_exception: BaseException | None = None, endpoint: Any = None, **_: Any) -> None:
        url, now = str(getattr(endpoint, "host", "the object store")), time.monotonic()
        with self._lock:
            since, failed = self._since.pop(url, (now, 0))
            if caught_exception is not None:
                self._since[url] = since, failed + 1
        if caught_exception is not None and failed == 1:
            cause = " ".join(str(caught_exception).split())
            log.warning(
                "object store unreachable at %s (%s); retrying each request for %s", url, cause, S3_RETRY_WINDOW
            )
        elif caught_exception is None and failed >= 2:
            log.warning(
                "object store unreachable for %.0f s at %s; retried %d times until it answered again",
                now - since,
                url,
                failed,
            )
        return None  # the decision is the retry handler's


WHOLE_ANSWER_BYTES = 50 * 2**20
"""Answers up to this size are read whole within the attempt that asked for them
(`_whole_answers`). It is s3fs's block size: s3fs asks for a block or a part of at most that
at a time, and a download's first, whole-object request for a larger object is closed
unread (s3fs then asks for its parts), so nothing is read twice and memory stays bounded."""


@functools.cache
def _whole_answers() -> type:
    """aiobotocore's HTTP session, reading an answer's body whole within the attempt that
    asked for it when it is at most `WHOLE_ANSWER_BYTES`. aiobotocore reads a body there
    only when the operation's output is not streamed; a GetObject body is read later, by
    s3fs, where a cut (aiohttp's ClientPayloadError) escapes botocore's retries and gets
    only s3fs's own: 5 tries within about 2 s, with nothing logged. Read here, a cut becomes
    what aiobotocore makes of any broken answer (ConnectionClosedError; ReadTimeoutError for
    a stall), and botocore retries it like a refused connection, which `_Outage` sees.
    A larger answer streams as before. Made when the first S3 filesystem is: aiohttp and
    aiobotocore take 0.2 s to import, which a local run and the CLI never need."""
    import aiohttp
    from aiobotocore.httpsession import AIOHTTPSession
    from botocore.exceptions import ConnectionClosedError, ReadTimeoutError

    class WholeAnswers(AIOHTTPSession):
        async def send(self, request):
            response = await super().send(request)
            size = int(response.headers.get("content-length", WHOLE_ANSWER_BYTES + 1))
            if not request.stream_output or size > WHOLE_ANSWER_BYTES:
                return response
            try:
                body = await response.content
            except (TimeoutError, aiohttp.ServerTimeoutError) as e:
                raise ReadTimeoutError(endpoint_url=request.url, error=e) from e
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as e:
                raise ConnectionClosedError(error=e, request=request, endpoint_url=request.url) from e
            response.raw = _Read(response.url, body)
            return response

    return WholeAnswers


class _Read:
    """An answer already read whole, in the place of aiohttp's response for the streamed
    body aiobotocore makes of it, which reads `content.read(n)`, `content.at_eof()`, `url`
    and calls `close()`."""

    def __init__(self, url: str, body: bytes):
        self.url, self.content = url, self  # the response and its body's stream in one
        self._body, self._size = io.BytesIO(body), len(body)

    async def read(self, n: int = -1) -> bytes:
        return self._body.read(n)

    def at_eof(self) -> bool:
        return self._body.tell() >= self._size

    def close(self) -> None:
        self._body.close()


S3_RETRIES = {"retries": {"mode": "standard", "total_max_attempts": S3_ATTEMPTS}}
"""botocore's retry settings of every S3 filesystem (`config_kwargs`, with `_whole_answers`)."""


def _observed(fs: fsspec.AbstractFileSystem) -> fsspec.AbstractFileSystem:
    """`fs`, whose S3 clients report outages (`_Outage`): a filesystem fsspec has just made
    has no aiobotocore session yet, and gets one with the watcher registered (one session
    per filesystem, as s3fs would make it, so credentials are looked up as before)."""
    if getattr(fs, "session", False) is None:
        from aiobotocore.session import AioSession

        session = AioSession()
        session.register("needs-retry.s3", _Outage())
        fs.session = session
    return fs


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
            options = self.cfg.fsspec_options(protocol)
            if protocol in ("s3", "s3a"):
                options["config_kwargs"] = {**S3_RETRIES, "http_session_cls": _whole_answers()}
            self._fs[protocol] = _observed(fsspec.filesystem(protocol, **options))
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
        """The files of `list_files`, without the entries it left out."""
        return self.list_files(pattern, include_hidden).files

    def list_files(self, pattern: str, include_hidden: bool = False) -> Found:
        """Matching files, sorted, as full URIs (a plain path matches itself if it is a file;
        a folder matches the files under it, except, unless `include_hidden`, those with a
        name below it that starts with `.` or `_`: .git/, _SUCCESS, .crc files). On local
        disk, what a folder walk meets that is not a regular file inside it is left out with
        the reason (see the module docstring); a file named explicitly may be a link."""
        fs, path = self.fs(pattern)
        protocol, _ = split_protocol(pattern)
        skipped: list[tuple[str, str]] = []
        if is_local(pattern):
            found, skipped = _local_matches(path)
        elif any(ch in path for ch in "*?["):
            found = [p for p in fs.glob(path) if fs.isfile(p)]
        elif fs.isdir(path):
            found = fs.find(path)
        elif fs.isfile(path):
            found = [path]
        else:
            found = []
        if not any(ch in path for ch in "*?[") and not include_hidden:
            found = [p for p in found if not is_hidden(p, path)]

        def full(p: str) -> str:  # some filesystems (http) keep the protocol in their paths
            return f"{protocol}://{p}" if protocol and "://" not in p else p

        return Found(sorted(full(p) for p in found), [(full(p), reason) for p, reason in skipped])

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
            _before_write(uri)
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

    def regular(self, uri: str) -> str:
        """`uri`, if it is a regular file (always, remote); InputDataError naming what it is
        otherwise, before anything opens it (opening a FIFO waits for a writer forever)."""
        local = self.local_path(uri)
        if local is not None and (problem := not_regular(local)):
            raise InputDataError(f"{uri}: {problem}; bertpipe reads regular files only")
        return uri

    def inside(self, uri: str, folder: str) -> str:
        """`uri`, if it stays inside `folder` once symbolic links are followed (local; remote
        URIs have no links); PathEscape otherwise."""
        local, base = self.local_path(uri), self.local_path(folder)
        if local is not None and base is not None:
            inside(local, base)
        return uri

    def link_below(self, uri: str, folder: str) -> str | None:
        """The first symbolic link on the way from `folder` down to `uri` (local), or None."""
        local, base = self.local_path(uri), self.local_path(folder)
        return first_link(local, base) if local is not None and base is not None else None

    def sha256(self, uri: str) -> str:
        self.regular(uri)
        digest = hashlib.sha256()
        with self.open(uri, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        return digest.hexdigest()

    def signature(self, uri: str) -> str:
        """What identifies a file's content, for fingerprints: its sha256 when local, the
        object store's ETag (or size and modification time) when remote."""
        if is_local(uri):
            return self.sha256(uri)[:20]  # a regular file only
        info = self.info(uri)
        tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("crc32c")
        return str(
            tag or f"{info.get('size')}-{info.get('LastModified') or info.get('mtime') or info.get('updated')}"
        ).strip('"')

    def remove(self, uri: str, recursive: bool = False, within: str | None = None) -> None:
        """Delete a file (or a folder, `recursive`). Locally a symbolic link is never
        followed: a link on the way below `within` (or the path itself) is removed, not
        what it points to."""
        _before_write(uri)
        local = self.local_path(uri)
        if local is not None:
            base = self.local_path(within) if within is not None else os.path.dirname(local)
            remove_within(local, base, recursive=recursive)
            return
        fs, path = self.fs(uri)
        if fs.exists(path):
            fs.rm(path, recursive=recursive)

    def stamps(self, folder: str) -> dict[str, tuple[int, str]]:
        """{path relative to `folder`: (size, stamp)} of every file below a remote folder, from
        one listing (an object store answers a thousand keys per request): what checking
        many shards' stamps costs instead of a request per shard."""
        fs, path = self._fresh(folder)
        base = path.rstrip("/") + "/"
        out = {}
        for name, info in fs.find(path, detail=True).items():
            tag = info.get("ETag") or info.get("etag") or info.get("md5Hash") or info.get("generation") or ""
            relative = name[len(base) :] if name.startswith(base) else name
            out[relative] = (int(info.get("size") or 0), str(tag).strip('"'))
        return out

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


def _local_matches(path: str) -> tuple[list[str], list[tuple[str, str]]]:
    """(files, skipped) of a local path, folder or glob pattern (`**` crosses folders, `*`
    does not, as in fsspec), found by walking without following links (bertcore/paths.py)."""
    from fsspec.utils import glob_translate

    if any(ch in path for ch in "*?["):
        fixed = path[: min(path.index(ch) for ch in "*?[" if ch in path)]
        folder = fixed.rsplit("/", 1)[0] or "/"
        if not os.path.isdir(folder):
            return [], []
        pattern = re.compile(glob_translate(path))
        files, folders, skipped = walk(folder)
        files = [p for p in files if pattern.match(p)]
        # a folder the pattern names (`*.jsonl` meeting `x.jsonl/`) and none of whose files it matches
        holding = {parent for f in files for parent in _parents(f, folder)}
        skipped += [
            (p, "a folder (a glob matches files; name the folder itself to read what it holds)")
            for p in folders
            if p not in holding
        ]
        return files, sorted((p, r) for p, r in skipped if pattern.match(p))
    if os.path.isdir(path):  # a folder named explicitly may be a link to one
        return walk_files(path)
    if os.path.lexists(path):  # so may a file
        problem = not_regular(path)
        return ([path], []) if problem is None else ([], [(path, problem)])
    return [], []


def _parents(path: str, top: str) -> Iterator[str]:
    """The folders between `top` (excluded) and `path`."""
    parent = os.path.dirname(path)
    while len(parent) > len(top):
        yield parent
        parent = os.path.dirname(parent)
