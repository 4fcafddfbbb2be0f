"""What a raw input file holds, as a short string that does not change when the file is
moved, copied or touched: the object store's ETag for remote files, a content hash
(xxh3-128) for local ones.

Hashing a 22 GB dump takes a while, and `bertpipe status` asks for the identity of every
input each time it runs, so local hashes are kept in a small SQLite cache keyed by (real
path, size, modification time, inode): a file is hashed again only when one of those
changes, and a file that was only touched hashes to the same value. The trade-off (the one
make, rsync and DVC make): a file rewritten in place with the same size, modification time
and inode keeps its cached hash. Within `rehashing()` (`status --verify`, `run --verify`)
every local input is hashed again and the cache updated. The cache lives in
$BERTPIPE_CACHE_DIR, else $XDG_CACHE_HOME/bertpipe, else ~/.cache/bertpipe; when it cannot
be written the hash is simply computed every time. Only regular files are hashed.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import xxhash

from bertcore.errors import InputDataError
from bertcore.paths import not_regular
from pipelines.storage import Storage, is_local

_BLOCK = 4 << 20
_TAG_KEYS = ("ETag", "etag", "md5Hash", "crc32c", "checksum")
_REHASH = contextvars.ContextVar("bertpipe_rehash_inputs", default=False)


@contextlib.contextmanager
def rehashing() -> Iterator[None]:
    """Within this block local inputs are hashed again whatever the cache holds (`--verify`)."""
    token = _REHASH.set(True)
    try:
        yield
    finally:
        _REHASH.reset(token)


def cache_dir() -> Path:
    if explicit := os.environ.get("BERTPIPE_CACHE_DIR"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bertpipe"


class HashCache:
    """(path, size, mtime_ns, inode) -> content hash, in SQLite (safe for several processes)."""

    def __init__(self, directory: Path | None = None):
        self.path = (directory or cache_dir()) / "content-hashes.sqlite"
        self._db: sqlite3.Connection | None = None
        self._unavailable = False

    def __getstate__(self) -> dict:
        return {"path": self.path, "_db": None, "_unavailable": self._unavailable}

    def _connect(self) -> sqlite3.Connection | None:
        if self._db is None and not self._unavailable:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path, timeout=30)
                self._db.execute(
                    "CREATE TABLE IF NOT EXISTS hashes (path TEXT, size INTEGER, mtime_ns INTEGER, inode INTEGER, "
                    "digest TEXT, PRIMARY KEY (path, size, mtime_ns, inode))"
                )
            except (OSError, sqlite3.Error):
                self._db, self._unavailable = None, True
        return self._db

    def local(self, path: str) -> str:
        real = os.path.realpath(path)
        if problem := not_regular(real):
            raise InputDataError(f"{path}: {problem}; only regular files are read")
        st = os.stat(real)
        key = (real, st.st_size, st.st_mtime_ns, st.st_ino)
        db = self._connect()
        if db is not None and not _REHASH.get():
            row = db.execute(
                "SELECT digest FROM hashes WHERE path=? AND size=? AND mtime_ns=? AND inode=?", key
            ).fetchone()
            if row:
                return row[0]
        with open(real, "rb") as handle:
            digest = _hash_stream(handle)
        if db is not None:
            try:
                with db:
                    db.execute("DELETE FROM hashes WHERE path=?", (real,))
                    db.execute("INSERT INTO hashes VALUES (?, ?, ?, ?, ?)", (*key, digest))
            except sqlite3.Error:
                pass
        return digest


def _hash_stream(handle) -> str:
    h = xxhash.xxh3_128()
    while block := handle.read(_BLOCK):
        h.update(block)
    return "xxh3:" + h.hexdigest()


def content_id(storage: Storage, uri: str, info: dict[str, Any] | None = None, cache: HashCache | None = None) -> str:
    """The content identity of one file: `xxh3:<hex>` of its bytes (local files, through
    the cache; remote files without a tag), or `etag:<tag>` from the object store."""
    if is_local(uri):
        return (cache or HashCache()).local(storage.local_path(uri))
    info = info if info is not None else storage.info(uri)
    for key in _TAG_KEYS:
        if info.get(key):
            return f"etag:{str(info[key]).strip(chr(34))}"
    with storage.open(uri, "rb") as handle:
        return _hash_stream(handle)
