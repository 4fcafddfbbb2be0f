"""Examples shards as a training worker reads them: from the run root, through one bounded
local cache per machine.

A shard is named by a `ShardRef` (its URI and what its manifest recorded: rows, bytes,
sha256, stamp). `ShardCache.local(ref)` gives a local path the loader can memory-map:

- remote root (s3://...): the first rank of the machine that asks downloads the object
  into `<cache>/shards/`, hashing the bytes as they arrive, while the machine's other ranks
  wait on the shard's lock file and then use the same file: one download per machine;
- local root: the file itself, hashed once per machine (a marker under `<cache>/verified/`).

Either way the bytes are checked against the manifest's size and sha256 where they are
read, and a damaged shard is named in one line (`DamagedShard`); nothing reads every shard
before training starts.

Eviction: every reader publishes the shards it still needs (its window and the next one,
`need`) in `<cache>/needs/<owner>.json`; a cached shard that no reader of the machine
needs any more is deleted. A reader holds its window's files open (memory maps), so a
shard deleted under a reader that lags behind costs nothing. `prefetch` fetches the next
window in a background thread while the current one trains. The folder is removed when
the run ends (`remove`).

No Ray, no fsspec: the run root is reached through a `ShardSource` (pipelines' Storage is one).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import queue
import shutil
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Protocol

from bertcore.errors import InputDataError

log = logging.getLogger(__name__)

CHUNK = 8 << 20
"""Bytes read from the store per call while a shard downloads and hashes."""
FETCH_THREADS = 4
"""Shards of a window downloaded at once when a reader must wait for them (its first window)."""


@dataclass(frozen=True)
class ShardRef:
    """One examples shard as its manifest records it."""

    uri: str
    rows: int
    bytes: int = 0
    sha256: str = ""
    """Empty: the bytes are not checked (shards written by hand, in tests and benchmarks)."""
    stamp: str = ""

    @property
    def key(self) -> str:
        """The cache's name for the shard: its content hash, so a shard written again is a new file."""
        return self.sha256 or hashlib.sha256(self.uri.encode()).hexdigest()


class ShardSource(Protocol):
    """Where the shards live (pipelines.storage.Storage is one)."""

    def local_path(self, uri: str) -> str | None: ...

    def open(self, uri: str, mode: str = "rb") -> IO[bytes]: ...


class DamagedShard(InputDataError):
    """A shard (`uri`) whose bytes do not match its manifest."""

    def __init__(self, message: str, uri: str = ""):
        super().__init__(message)
        self.uri = uri

    def __reduce__(self):  # raised in a Ray worker, re-raised in the driver
        return type(self), (str(self), self.uri)


def damaged(ref: ShardRef, what: str) -> DamagedShard:
    return DamagedShard(
        f"{ref.uri}: {what}; the examples shard was changed or damaged after the examples stage wrote it: "
        "`bertpipe run` recomputes it first (`bertpipe verify examples` lists every damaged shard)",
        ref.uri,
    )


@dataclass(frozen=True)
class CacheSpec:
    """What a worker needs to open its machine's cache (picklable: sent to every worker)."""

    source: ShardSource
    directory: str
    """This run's folder on the machine, shared by its ranks (the same path on every machine)."""
    limit_bytes: int
    """Bytes of shards the folder may hold (checked against the windows when the loader plans)."""

    def open(self, owner: str) -> ShardCache:
        return ShardCache(self.source, self.directory, self.limit_bytes, owner=owner)


class ShardCache:
    """One reader's handle on the machine's cache folder (see the module docstring)."""

    def __init__(self, source: ShardSource, directory: str, limit_bytes: int, *, owner: str):
        self.source, self.directory, self.limit_bytes, self.owner = source, directory, limit_bytes, owner
        for sub in ("shards", "locks", "needs", "verified"):
            os.makedirs(os.path.join(directory, sub), exist_ok=True)
        self._verified: set[str] = set()  # keys this process already knows are good
        self._queue: queue.Queue[ShardRef | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._warned_over = False

    def __getstate__(self) -> dict:  # DataLoader worker processes get a handle of their own
        state = dict(self.__dict__)
        state.update(_queue=None, _thread=None, _failure=None, _verified=set())
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._queue = queue.Queue()

    # -- one shard -------------------------------------------------------------------------
    def local(self, ref: ShardRef) -> str:
        """A local path of `ref`'s verified bytes (blocks while it downloads)."""
        if self._failure is not None:  # the prefetch thread met a damaged shard first
            failure, self._failure = self._failure, None
            raise failure
        return self._local(ref)

    def local_many(self, refs: list[ShardRef], start: int = 0) -> list[str]:
        """`local` of each of `refs` (in their order), fetched FETCH_THREADS at a time,
        beginning at `start` (the ranks of a machine take different shards first)."""
        if len(refs) < 2 or all(self.source.local_path(ref.uri) is not None for ref in refs):
            return [self.local(ref) for ref in refs]
        from concurrent.futures import ThreadPoolExecutor

        start %= len(refs)
        turn = refs[start:] + refs[:start]
        with ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="shard-fetch") as pool:
            paths = dict(zip((ref.key for ref in turn), pool.map(self.local, turn)))
        return [paths[ref.key] for ref in refs]

    def _local(self, ref: ShardRef) -> str:
        path = self.source.local_path(ref.uri)
        if path is not None:
            self._verify_in_place(ref, path)
            return path
        target = os.path.join(self.directory, "shards", ref.key + ".arrow")
        if ref.key in self._verified and os.path.exists(target):
            return target
        with self._locked(ref.key):
            if not os.path.exists(target):
                self._download(ref, target)
        self._verified.add(ref.key)
        return target

    def _verify_in_place(self, ref: ShardRef, path: str) -> None:
        if ref.key in self._verified:
            return
        try:
            size = os.path.getsize(path)
        except FileNotFoundError:
            raise damaged(ref, "the file is gone") from None
        if ref.bytes and size != ref.bytes:
            raise damaged(ref, f"{size:,} bytes where the manifest records {ref.bytes:,}")
        marker = os.path.join(self.directory, "verified", ref.key)
        if ref.sha256 and not os.path.exists(marker):
            with self._locked(ref.key):
                if not os.path.exists(marker):
                    digest = hashlib.sha256()
                    with open(path, "rb") as handle:
                        while block := handle.read(CHUNK):
                            digest.update(block)
                    if digest.hexdigest() != ref.sha256:
                        raise damaged(ref, "its sha256 differs from the manifest's")
                    with open(marker, "w"):
                        pass
        self._verified.add(ref.key)

    def _download(self, ref: ShardRef, target: str) -> None:
        partial = f"{target}.{os.getpid()}.{threading.get_ident()}.part"
        digest, size = hashlib.sha256(), 0
        try:
            with self.source.open(ref.uri, "rb") as remote, open(partial, "wb") as out:
                while block := remote.read(CHUNK):
                    digest.update(block)
                    out.write(block)
                    size += len(block)
            if ref.bytes and size != ref.bytes:
                raise damaged(ref, f"{size:,} bytes where the manifest records {ref.bytes:,}")
            if ref.sha256 and digest.hexdigest() != ref.sha256:
                raise damaged(ref, "its sha256 differs from the manifest's")
            os.replace(partial, target)
        except FileNotFoundError:
            raise damaged(ref, "the object is gone") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)

    @contextlib.contextmanager
    def _locked(self, key: str) -> Iterator[None]:
        """The machine-wide lock of one shard (a lock file; released if the holder dies)."""
        with open(os.path.join(self.directory, "locks", key), "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    # -- the window ------------------------------------------------------------------------
    def need(self, refs: Iterable[ShardRef]) -> None:
        """Declare the shards this reader still needs (its window and the next), and delete
        the cached shards no reader of the machine needs any more."""
        keys = sorted({ref.key for ref in refs})
        own = os.path.join(self.directory, "needs", f"{self.owner}.json")
        with open(own + ".part", "w") as handle:
            json.dump(keys, handle)
        os.replace(own + ".part", own)
        self.evict()

    def needed(self) -> set[str]:
        """The union of every reader's declared needs on this machine."""
        folder = os.path.join(self.directory, "needs")
        keys: set[str] = set()
        for name in os.listdir(folder):
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(folder, name)) as handle:
                    keys.update(json.load(handle))
            except (FileNotFoundError, ValueError):  # being replaced, or its reader just left
                continue
        return keys

    def evict(self) -> None:
        """Delete cached shards that no reader needs (a reader that still maps one keeps its
        bytes until it lets go: deleting an open file frees nothing early, breaks nothing)."""
        folder = os.path.join(self.directory, "shards")
        keep = self.needed()
        held = 0
        for name in os.listdir(folder):
            key, _, suffix = name.partition(".")
            path = os.path.join(folder, name)
            if suffix != "arrow" or key in keep:
                with contextlib.suppress(FileNotFoundError):
                    held += os.path.getsize(path)
                continue
            with self._try_locked(key) as free:  # not while someone downloads it
                if free:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
        if held > self.limit_bytes and not self._warned_over:
            self._warned_over = True
            log.warning(
                "the local shard cache %s holds %s bytes, over its bound of %s: readers of this machine are far "
                "apart, or the bound is below the windows they read",
                self.directory,
                f"{held:,}",
                f"{self.limit_bytes:,}",
            )

    @contextlib.contextmanager
    def _try_locked(self, key: str) -> Iterator[bool]:
        path = os.path.join(self.directory, "locks", key)
        try:
            handle = open(path, "a")
        except FileNotFoundError:
            yield True
            return
        try:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        finally:
            handle.close()

    def held_bytes(self) -> int:
        """Bytes of shards in the folder now."""
        folder = os.path.join(self.directory, "shards")
        total = 0
        for name in os.listdir(folder):
            with contextlib.suppress(FileNotFoundError):
                total += os.path.getsize(os.path.join(folder, name))
        return total

    # -- prefetch --------------------------------------------------------------------------
    def prefetch(self, refs: Iterable[ShardRef], start: int = 0) -> None:
        """Fetch `refs` in the background (starting at `start`, so the ranks of a machine
        begin on different shards); a damaged shard is raised by the next `local`."""
        refs = list(refs)
        if not refs or all(self.source.local_path(ref.uri) is not None and ref.key in self._verified for ref in refs):
            return
        start %= len(refs)
        for ref in refs[start:] + refs[:start]:
            self._queue.put(ref)
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._fetch_queued, name=f"shard-prefetch-{self.owner}", daemon=True)
            self._thread.start()

    def _fetch_queued(self) -> None:
        while (ref := self._queue.get()) is not None:
            try:
                self._local(ref)
            except DamagedShard as exc:
                self._failure = exc
            except Exception as exc:  # noqa: BLE001 - a store blip: the reader fetches it again when it needs it
                log.debug("prefetch of %s failed: %s", ref.uri, exc)

    def close(self) -> None:
        """Stop prefetching and withdraw this reader's needs (its files stay for the others)."""
        if self._thread is not None and self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                while True:
                    self._queue.get_nowait()
            self._queue.put(None)
            self._thread.join(timeout=60)
        self._thread = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self.directory, "needs", f"{self.owner}.json"))

    def remove(self) -> None:
        """Remove the machine's cache folder (the run is over on this machine)."""
        self.close()
        shutil.rmtree(self.directory, ignore_errors=True)


class LocalFiles:
    """Shards that are local files given by path, read in place: no folder, no download, no
    check beyond the reader's (tests, benchmarks, the evaluate stage's local copies)."""

    def local(self, ref: ShardRef) -> str:
        return ref.uri

    def local_many(self, refs: list[ShardRef], start: int = 0) -> list[str]:
        return [ref.uri for ref in refs]

    def need(self, refs: Iterable[ShardRef]) -> None:
        pass

    def prefetch(self, refs: Iterable[ShardRef], start: int = 0) -> None:
        pass

    def close(self) -> None:
        pass
