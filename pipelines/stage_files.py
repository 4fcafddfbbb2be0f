"""The pretrain stage directory as bertcore.train.checkpoint.StageFiles: the folder itself when
it is local (or on a shared filesystem), else a local mirror per process of an
object-store prefix, written locally and uploaded one object at a time. The training
workers, the export task and the driver each get their own mirror.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile

from bertcore.train.checkpoint import LocalStageFiles
from pipelines.storage import Storage, join


class StorageStageFiles:
    """bertcore.train.checkpoint.StageFiles for a remote stage directory: files are written to a
    local mirror and uploaded one object at a time (an object appears whole or not at all)."""

    def __init__(self, storage: Storage, uri: str, mirror: str):
        self.storage, self.uri, self.mirror = storage, uri.rstrip("/"), mirror

    def _remote(self, relative: str) -> str:
        return join(self.uri, relative)

    def local_path(self, relative: str) -> str:
        return os.path.join(self.mirror, relative)

    def upload(self, relative: str) -> None:
        local = self.local_path(relative)
        fs, path = self.storage.fs(self._remote(relative))
        if os.path.isdir(local):
            for name in sorted(os.listdir(local)):
                self.upload(f"{relative}/{name}")
        else:
            fs.put_file(local, path)

    def download(self, relative: str) -> None:
        fs, path = self.storage.fs(self._remote(relative))
        local = self.local_path(relative)
        if fs.isdir(path):
            for name in self.storage.listdir(self._remote(relative)):
                self.download(f"{relative}/{name}")
        else:
            os.makedirs(os.path.dirname(local), exist_ok=True)
            fs.get_file(path, local)

    def drop_local(self, relative: str) -> None:
        local = self.local_path(relative)
        if os.path.isdir(local):
            shutil.rmtree(local, ignore_errors=True)
        elif os.path.exists(local):
            os.unlink(local)

    def exists(self, relative: str) -> bool:
        return self.storage.exists(self._remote(relative))

    def listdir(self, relative: str) -> list[str]:
        return self.storage.listdir(self._remote(relative))

    def read_text(self, relative: str) -> str:
        return self.storage.read_text(self._remote(relative))

    def write_text(self, relative: str, text: str) -> None:
        self.storage.write_bytes(self._remote(relative), text.encode())

    def remove(self, relative: str) -> None:
        self.storage.remove(self._remote(relative), recursive=True)
        self.drop_local(relative)


def _scratch(uri: str, who: str) -> str:
    """A local folder for one process's copies of a remote URI's files."""
    key = hashlib.sha256(uri.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), "bertpipe-pretrain", key, who)
    os.makedirs(path, exist_ok=True)
    return path


def stage_files(storage: Storage, stage_uri: str, who: str):
    """The stage directory as StageFiles: the folder itself when local (or a shared
    filesystem), else a local mirror per process `who` ('rank-0', 'driver', ...)."""
    local = storage.local_path(stage_uri)
    if local is not None:
        os.makedirs(local, exist_ok=True)
        return LocalStageFiles(local)
    return StorageStageFiles(storage, stage_uri, _scratch(stage_uri, who))
