"""One writer per run root: a lease file, `<run.root>/_lease.json`.

A run that writes (the flow, `bertpipe export`) takes the lease before it touches any stage
directory and keeps it fresh with a heartbeat; a second writer on the same root is refused
at once with one line naming the holder. The file holds who holds it (a label such as the
flow run's name, the host, the pid, a random token), when it was taken, its last heartbeat
and when it expires.

Taking it is atomic: an exclusive create on local disk (`O_CREAT | O_EXCL`), a conditional
write on an object store (`If-None-Match: *`). A lease whose heartbeat stopped (its holder
died) expires after `ttl_s` and is taken over, with a warning naming the old holder: on an
object store by a write conditional on the stale version's ETag, on local disk by moving
the stale file aside under a unique name and checking that it was the one read. Renewals
are conditional the same way, so a holder that was taken over notices (`lost`) instead of
overwriting the new holder's lease.

A lease on this host whose holder process is gone (no such pid, or the pid now belongs to a
process started after the lease was taken) is stale at once: the rerun after a killed run
does not wait for the ttl. A lease on another host cannot be checked that way and waits.

An object store that is unreachable for a while (an outage shorter than the ttl) costs
nothing: the heartbeat warns and keeps trying. When the lease file is found gone and no one
else holds the root, this writer takes it again and goes on. Only when another writer holds
it is the lease lost: from then on every write under the root through this process's
`Storage` is refused (`LeaseLost`), and the run stops before its next write.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import psutil

from bertcore.errors import BertpipeError
from pipelines import storage as storage_module
from pipelines.storage import Storage, join

log = logging.getLogger(__name__)

LEASE = "_lease.json"
DEFAULT_TTL_S = 120.0
"""A lease not renewed for this long is stale; its holder renews it four times as often."""


class LeaseHeld(BertpipeError):
    """Another writer holds the run root."""


class LeaseLost(BertpipeError):
    """This writer's lease was taken over (its heartbeat stopped for longer than the ttl)."""


@dataclass
class LeaseRecord:
    holder: str
    host: str
    pid: int
    token: str
    acquired_at: float
    heartbeat_at: float
    expires_at: float

    def holder_gone(self) -> bool:
        """Whether the holder is known to be dead: it ran on this host and its pid is free,
        or taken by a process that started after the lease was (pid reuse)."""
        if not self.token or self.host != socket.gethostname() or self.pid <= 0:
            return False
        try:
            started = psutil.Process(self.pid).create_time()
        except psutil.NoSuchProcess:
            return True
        except psutil.Error:  # not ours to inspect: alive
            return False
        return started > self.acquired_at + 1.0

    def describe(self) -> str:
        if not self.token:  # a damaged lease file (`_parse`)
            return self.holder
        age = time.time() - self.heartbeat_at
        return (
            f"{self.holder} (host {self.host}, pid {self.pid}) since "
            f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(self.acquired_at))}, last heartbeat {age:.0f} s ago"
        )


_HELD: set[RootLease] = set()
"""The leases this process holds (`release_all` gives them back when it is interrupted)."""


def release_all() -> None:
    """Give back every lease this process holds (a run stopped by Ctrl-C or SIGTERM), so the
    next run on the root does not wait for them to expire."""
    for lease in list(_HELD):
        try:
            lease.release()
        except Exception as exc:  # noqa: BLE001 - the process is ending: say so, go on
            log.warning("run.root %s: the lease could not be given back (%s)", lease.root, exc)


class RootLease:
    """The lease of one run root; use as a context manager around everything that writes."""

    def __init__(self, storage: Storage, root: str, holder: str, *, ttl_s: float = DEFAULT_TTL_S):
        self.storage, self.root, self.uri = storage, root, join(root, LEASE)
        self.ttl_s = ttl_s
        self.record = LeaseRecord(holder, socket.gethostname(), os.getpid(), uuid.uuid4().hex, 0.0, 0.0, 0.0)
        self.local = storage.local_path(self.uri)
        self._etag: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost = False
        self.taken_by = ""

    # -- the file, on local disk or an object store ---------------------------------------
    def _payload(self) -> bytes:
        now = time.time()
        self.record.heartbeat_at, self.record.expires_at = now, now + self.ttl_s
        return (json.dumps(asdict(self.record), indent=2) + "\n").encode()

    def _read(self) -> tuple[LeaseRecord | None, str | None]:
        """The current lease and its version (ETag remotely, the token locally); (None, None) if free."""
        if self.local is not None:
            try:
                with open(self.local, encoding="utf-8") as handle:
                    record = _parse(handle.read())
            except FileNotFoundError:
                return None, None
            return record, record.token if record else None
        fs, path = self.storage.fs(self.uri)
        fs.invalidate_cache(path)
        try:
            etag = str(fs.info(path).get("ETag", ""))
            record = _parse(fs.cat_file(path).decode("utf-8"))
        except FileNotFoundError:
            return None, None
        return record, etag

    def _create(self) -> bool:
        """Write the lease only if there is none; False when someone holds it."""
        payload = self._payload()
        if self.local is not None:
            os.makedirs(os.path.dirname(self.local), exist_ok=True)
            try:
                fd = os.open(self.local, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as handle:
                handle.write(payload)
            return True
        return self._put(payload, IfNoneMatch="*")

    def _replace(self, version: str) -> bool:
        """Write the lease only if the current one is still `version`."""
        payload = self._payload()
        if self.local is not None:
            aside = f"{self.local}.{uuid.uuid4().hex}"
            try:
                os.rename(self.local, aside)  # atomic: from here no one else sees a lease
            except FileNotFoundError:
                return self._create()
            with open(aside, encoding="utf-8") as handle:
                moved = _parse(handle.read())
            if moved is None or moved.token != version:  # not the lease we decided about
                try:
                    os.link(aside, self.local)
                except FileExistsError:
                    pass
                os.unlink(aside)
                return False
            os.unlink(aside)
            return self._create()
        return self._put(payload, IfMatch=version)

    def _put(self, payload: bytes, **condition: str) -> bool:
        fs, path = self.storage.fs(self.uri)
        bucket, key = path.split("/", 1)
        try:
            response = fs.call_s3("put_object", Bucket=bucket, Key=key, Body=payload, **condition)
        except FileExistsError:
            return False
        except OSError as exc:
            if "pre-condition" in str(exc) or "Precondition" in str(exc):
                return False
            raise
        fs.invalidate_cache(path)
        self._etag = response.get("ETag")
        return True

    # -- taking, keeping and giving it back -------------------------------------------------
    def acquire(self) -> RootLease:
        self.record.acquired_at = time.time()
        for _ in range(3):
            if self._create():
                break
            current, version = self._read()
            if current is None:
                continue  # released between our two looks
            if current.token == self.record.token:
                break  # our own create: its answer was lost, and its retry found the lease there
            gone = current.holder_gone()
            if current.expires_at > time.time() and not gone:
                raise self._held(current)
            if self._replace(version):
                why = "its process is gone" if gone else "its heartbeat stopped"
                log.warning(
                    "run.root %s: took over the stale lease of %s: %s (%s)",
                    self.root,
                    current.describe(),
                    why,
                    self.uri,
                )
                break
        else:
            raise LeaseHeld(
                f"run.root {self.root}: could not take the lease (another writer keeps taking it); try again"
            )
        self._thread = threading.Thread(target=self._heartbeat, name="bertpipe-lease", daemon=True)
        self._thread.start()
        _HELD.add(self)
        storage_module.add_write_check(self.root, self._check_write)
        return self

    def _held(self, current: LeaseRecord) -> LeaseHeld:
        left = max(0, current.expires_at - time.time())
        return LeaseHeld(
            f"run.root {self.root} is in use by {current.describe()}; wait for it to finish "
            f"(if it died, its lease expires in {left:.0f} s and the next run takes the root over), or use "
            "another run.root"
        )

    def _check_write(self, uri: str) -> None:
        if uri != self.uri:
            self.check()

    def refuse_if_held(self) -> None:
        """Raise `LeaseHeld` now if another writer holds the root, without taking the lease: a
        look before a run starts Prefect and Ray (the lease itself is taken by `acquire`)."""
        current, _ = self._read()
        if current is not None and current.expires_at > time.time() and not current.holder_gone():
            raise self._held(current)

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                self.renew()
            except Exception as exc:  # noqa: BLE001 - keep trying: a transient error must not end the run
                log.warning("run.root %s: lease heartbeat failed (%s)", self.root, exc)

    def renew(self) -> None:
        """Push the expiry forward, if this writer still holds the lease; take it again when
        its file is gone and no one else took the root (a store that lost it, a person who
        deleted it)."""
        if self.lost:
            return
        current, version = self._read()
        if current is None:
            if self._create():
                log.warning(
                    "run.root %s: the lease file %s was gone and no one else held the root; took it again",
                    self.root,
                    self.uri,
                )
                return
            current, version = self._read()  # another writer created it in between
        if current is None or current.token != self.record.token:
            self._mark_lost(current)
            return
        if self.local is not None:
            tmp = f"{self.local}.{self.record.token}.tmp"
            with open(tmp, "wb") as handle:
                handle.write(self._payload())
            os.replace(tmp, self.local)
        elif not self._put(self._payload(), IfMatch=version):
            current, _ = self._read()  # the version moved: by our own write whose answer was lost, or by another writer
            if current is None or current.token != self.record.token:
                self._mark_lost(current)

    def _mark_lost(self, current: LeaseRecord | None) -> None:
        if not self.lost:
            self.lost = True
            self.taken_by = current.describe() if current else "another writer"
            log.error(
                "run.root %s: another writer took over this run's lease (%s); this run writes nothing more",
                self.root,
                self.taken_by,
            )

    def check(self) -> None:
        """Raise LeaseLost when another writer took the root over."""
        if self.lost:
            raise LeaseLost(
                f"run.root {self.root}: {self.taken_by} took over this run's lease (its heartbeat could not reach "
                f"{self.uri} for over {self.ttl_s:.0f} s); this run stopped before writing more. Check what that "
                "writer is doing before you run again: two writers on one root would overwrite each other"
            )

    def release(self) -> None:
        storage_module.remove_write_check(self.root, self._check_write)
        _HELD.discard(self)
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        current, _ = self._read()
        if current is not None and current.token == self.record.token:
            self.storage.remove(self.uri)

    def __enter__(self) -> RootLease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


_FIELD_TYPES = {
    "holder": str,
    "host": str,
    "pid": int,
    "token": str,
    "acquired_at": float,
    "heartbeat_at": float,
    "expires_at": float,
}


def _parse(text: str) -> LeaseRecord:
    """The lease record in `text`. A file that is not one (not JSON, a missing key, a value
    of the wrong type such as `"expires_at": "later"`) is a damaged lease: a record that has
    already expired, whose holder names the damage, so the next writer takes it over with a
    warning instead of failing on it or waiting forever."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, not an object")
        for key, kind in _FIELD_TYPES.items():
            value = data.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
                raise ValueError(f"{key} is {value!r:.40}, not {'a number' if kind is not str else 'a string'}")
        return LeaseRecord(**{key: data[key] for key in _FIELD_TYPES})
    except ValueError as exc:  # JSONDecodeError is a ValueError
        return LeaseRecord(f"a damaged lease file ({' '.join(str(exc).split())[:120]})", "?", 0, "", 0.0, 0.0, 0.0)
